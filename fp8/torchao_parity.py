"""cubic's FP8 Linear against torchao's ``Float8Linear``: the one parity check (tests, benchmark, GPU checks).

One ``nn.Linear`` is run forward and backward twice on the same inputs: converted by torchao
(``convert_to_float8_training`` with ``Float8LinearConfig.from_recipe_name(recipe)``) and wrapped by
cubic (:class:`fp8.kernels.Fp8Linear` with the recipe's real ``_scaled_mm`` kernel where it runs, or
its emulation). The outputs compared: ``y``, ``dx`` (input gradient), ``dw`` (weight gradient), ``db``.

Targets (:data:`TARGETS`): on a CPU, bit-identical wherever cubic calls the same ``torch._scaled_mm``
path as torchao (the casts are the same op for op, so any change of format, scaling or rounding shows);
where it does not (tensorwise on a CPU, which cubic runs through ``_scaled_mm``'s rowwise path because
the tensorwise one is a slow reference loop there; and the emulated kernels), the two paths sum the same
products in another order, which some CPUs round differently (seen on an AMX Xeon: 1 ulp in ``y``), so
there the target is :func:`summation_bound`. On CUDA a relative difference (``||a - b|| / ||a||``) of at
most 1e-2, since a GPU may sum in another order and torchao's rowwise backward rounds its bf16 output
once more (about one bf16 ulp, 2^-8). The casts themselves are compared bit for bit in the tests.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from cubic.core.recipes import TORCHAO_RECIPES

OUTPUTS: tuple[str, ...] = ("y", "dx", "dw", "db")
TARGETS: dict[str, dict[str, Any]] = {
    "cpu": {"kind": "bit-identical", "max_rel_diff": 0.0,
            "where_paths_differ": "within the summation-order bound: |a - b| <= eps(dtype) |a| + K eps(fp32) "
                                  "max|a| per element (K: the GEMM's longest dimension), far below one FP8 "
                                  "rounding step (eps 2^-4 for e4m3)"},
    "cuda": {"kind": "relative difference", "max_rel_diff": 1e-2,
             "why": "a GPU may sum in another order and round the bf16 output once more (torchao's rowwise "
                    "backward scales after a unit-scale GEMM): about one bf16 ulp (2^-8)"},
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def linear_grads(module: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    """``y``, ``dx``, ``dw``, ``db`` of one forward and backward (``module``: a Linear or Sequential(Linear))."""
    xi = x.clone().requires_grad_(True)
    y = module(xi)
    y.backward(dy)
    lin = module[0] if isinstance(module, nn.Sequential) else module
    return {"y": y.detach(), "dx": xi.grad, "dw": lin.weight.grad, "db": lin.bias.grad}


def linear_pair(recipe: str, dtype: str = "fp32", *, real: bool = True, device: str = "cpu",
                shape: tuple[int, int, int] = (96, 80, 48), seed: int = 1) -> tuple[dict, dict, str]:
    """torchao's and cubic's outputs for one Linear of ``shape`` (M, K, N): ``(theirs, ours, cubic's kernel)``.

    The input's columns span 4 orders of magnitude (rowwise and tensorwise scales then differ); the
    output gradient is small (1e-3), as a loss's is. ``real``: cubic's ``_scaled_mm`` kernel where it
    runs on ``device`` (else its emulation), or the emulation."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from fp8.kernels import Fp8Linear, default_kernel

    dev, dt = torch.device(device), DTYPES[dtype]
    g = torch.Generator().manual_seed(seed)
    m, k, n = shape
    x = (torch.randn(m, k, generator=g) * torch.logspace(-2, 2, k)).to(dev, dt)
    dy = (torch.randn(m, n, generator=g) * 1e-3).to(dev, dt)
    with torch.random.fork_rng(devices=[]):  # seeded weights, the caller's RNG untouched
        torch.manual_seed(seed)
        lin = nn.Linear(k, n).to(dev, dt)
    theirs = nn.Sequential(copy.deepcopy(lin))
    convert_to_float8_training(theirs, config=Float8LinearConfig.from_recipe_name(recipe))
    if type(theirs[0]).__name__ != "Float8Linear":
        raise RuntimeError(f"torchao did not convert the Linear for recipe {recipe!r}")
    kernel = default_kernel(recipe, dev, shape).name if real else f"emulated_{recipe}"
    # torchao's high precision is the layer's dtype
    ours = Fp8Linear.from_linear(copy.deepcopy(lin), kernel, hp=dtype)
    return linear_grads(theirs, x, dy), linear_grads(ours, x, dy), kernel


def same_path(recipe: str, real: bool, device: str | torch.device) -> bool:
    """Whether cubic's kernel calls the same ``torch._scaled_mm`` path as torchao (then the sums agree)."""
    return real and not (recipe == "tensorwise" and torch.device(device).type == "cpu")


def summation_bound(a: torch.Tensor, k: int) -> torch.Tensor:
    """Per element, how far two GEMMs over the same FP8 casts may differ when they sum the same ``k``
    products in another order: one rounding of the output (eps of its dtype, relative) plus ``k`` fp32
    roundings of the largest output. A change of cast is an FP8 step (2^-4 relative for e4m3): far above."""
    eps_out, eps32 = torch.finfo(a.dtype).eps, torch.finfo(torch.float32).eps
    a = a.float()
    return eps_out * a.abs() + k * eps32 * a.abs().max()


def compare(theirs: dict[str, torch.Tensor], ours: dict[str, torch.Tensor], k: int | None = None) -> dict[str, Any]:
    """Per output: max |difference| and relative difference (``||a - b|| / ||a||``); bit-identical or not;
    with ``k`` (the GEMM's longest dimension), whether every element lies within :func:`summation_bound`."""
    abs_, rel, within = {}, {}, True
    for t in OUTPUTS:
        a, b = theirs[t].float(), ours[t].float()
        diff = (a - b).abs()
        abs_[t] = float(diff.max())
        rel[t] = float((a - b).norm() / a.norm().clamp_min(1e-30))
        if k is not None:
            within &= theirs[t].dtype == ours[t].dtype and bool((diff <= summation_bound(theirs[t], k)).all())
    same = all(theirs[t].dtype == ours[t].dtype and torch.equal(theirs[t], ours[t]) for t in OUTPUTS)
    out = {"max_abs_diff": abs_, "rel_diff": rel, "bit_identical": same}
    if k is not None:
        out["within_summation_bound"] = within
    return out


def _case_met(case: dict[str, Any], target: dict[str, Any]) -> bool:
    if target["kind"] != "bit-identical":
        return max(case["rel_diff"].values()) <= target["max_rel_diff"]
    return case["bit_identical"] or (not case["same_path"] and case["within_summation_bound"])


def torchao_parity(recipes: tuple[str, ...] = TORCHAO_RECIPES, *, device: str = "cpu",
                   dtypes: tuple[str, ...] = ("fp32", "bf16"), real: tuple[bool, ...] = (True, False),
                   shape: tuple[int, int, int] = (96, 80, 48), seed: int = 1) -> dict[str, Any]:
    """Parity per recipe over ``dtypes`` x kernels (real, emulated) on ``device``: each recipe's worst
    max |difference| and relative difference per output, bit-identical or not, and ``met`` against the
    device's target (:data:`TARGETS`). Measured, never stored: each call runs torchao."""
    import torchao

    target = TARGETS["cuda" if torch.device(device).type == "cuda" else "cpu"]
    per: dict[str, Any] = {}
    for recipe in recipes:
        cases = []
        for dtype in dtypes:
            for r in real:
                theirs, ours, kernel = linear_pair(recipe, dtype, real=r, device=device, shape=shape, seed=seed)
                c = {"dtype": dtype, "kernel": kernel, "same_path": same_path(recipe, r, device),
                     **compare(theirs, ours, max(shape))}
                cases.append(c | {"met": _case_met(c, target)})
        worst_abs = {t: max(c["max_abs_diff"][t] for c in cases) for t in OUTPUTS}
        worst_rel = {t: max(c["rel_diff"][t] for c in cases) for t in OUTPUTS}
        same = all(c["bit_identical"] for c in cases)
        met = all(c["met"] for c in cases)
        per[recipe] = {"max_abs_diff": worst_abs, "rel_diff": worst_rel, "bit_identical": same, "met": met,
                       "cases": cases}
    return {"label": f"measured on {device}: cubic's Fp8Linear vs torchao's Float8Linear, one Linear forward "
                     "and backward on the same inputs",
            "device": str(device), "torchao_version": getattr(torchao, "__version__", "?"), "shape_mkn": list(shape),
            "dtypes": list(dtypes), "target": target, "per_recipe": per,
            "met": all(v["met"] for v in per.values())}
