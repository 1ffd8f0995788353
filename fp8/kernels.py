"""The kernel registry (what can compute a linear site's GEMMs) and the drop-in FP8 linear module.

A kernel realises one recipe's numerics (fp32, bf16, or an FP8 recipe) with one implementation:
``torch._scaled_mm`` (real FP8 GEMM), dequantize-and-multiply emulation, or a Triton fused
row-wise amax + scale + cast (:mod:`fp8.triton_kernels`) feeding ``torch._scaled_mm``. Kernels with
the same recipe give the same numbers up to summation order, and differ only in speed, which is
what Dispatch measures. Triton kernels are registered when Triton is installed; on a CPU they run
in Triton's interpreter (same numerics) and Dispatch does not time them (:meth:`Kernel.untimed`).

:class:`Fp8Linear` is an ``nn.Linear`` (same parameters, same state dict) whose forward and both
backward GEMMs go through its kernel, each cast as its recipe says and accumulated in fp32. Optionally it logs each GEMM's SQNR against fp32 during
training (the "error measured in training" that the Probe's prediction is checked against).
Each GEMM's formats and scalings are the recipe table's (:data:`cubic.core.recipes.RECIPES`): the
rowwise recipes cast the gradient to e4m3, as torchao does.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from fp8.recipes import (ALL_RECIPES, GEMMS, HIGH_PRECISION, RECIPES, REAL_SCALED_MM, gemm_unsupported,
                          role_matmul, sqnr_db)


@dataclass(frozen=True)
class Kernel:
    name: str
    recipe: str
    real: bool  # torch._scaled_mm (True) or emulation / plain matmul (False)
    description: str
    backend: str = "torch"  # "torch" or "triton" (the operands are cast by fp8.triton_kernels)

    def unavailable(self, device: torch.device | str, m: int, k: int, n: int) -> str | None:
        """Why this kernel cannot run a [m, k] x [k, n] linear on ``device`` (None: it can)."""
        device = torch.device(device)
        if self.backend == "triton" and importlib.util.find_spec("triton") is None:
            return "Triton is not installed (pip install 'cubic[triton]')"
        if not self.real:
            return None
        if self.recipe in HIGH_PRECISION:
            return None
        # every one of the three GEMMs that runs in FP8 must be supported, with the table's casts
        spec = RECIPES[self.recipe]
        for gemm, (p, r, q) in zip(GEMMS, ((m, k, n), (m, n, k), (n, m, k))):
            casts = spec.role(gemm)
            if casts[0].hp:
                continue
            why = gemm_unsupported(device, casts, p, r, q)
            if why:
                return f"{gemm}: {why}"
        return None

    def gemm(self, a: torch.Tensor, b: torch.Tensor, *_formats: str, role: str = "fwd",
             hp: str = "bf16") -> torch.Tensor:
        """``a @ b.T`` in fp32 under this kernel's recipe, for the linear's GEMM ``role``
        (``fwd``, ``grad_input``, ``grad_weight``), cast as the recipe table says. ``_formats``:
        accepted for older callers that passed the formats, which the table now decides.
        ``hp``: the precision of a high-precision GEMM."""
        if self.backend == "triton" and self.recipe in RECIPES:
            ca, cb = RECIPES[self.recipe].role(role)
            if ca.scaling == cb.scaling == "rowwise":
                from fp8 import triton_kernels

                return triton_kernels.scaled_matmul(a, b, "rowwise", ca.fmt, cb.fmt)  # type: ignore[arg-type]
        return role_matmul(a, b, self.recipe, role, real=self.real, hp=hp)

    def untimed(self, device: torch.device | str) -> str | None:
        """Why Dispatch must not time this kernel for speed on ``device`` (None: it may)."""
        if self.backend == "triton" and (torch.device(device).type == "cpu" or os.environ.get("TRITON_INTERPRET") == "1"):
            return "Triton runs in its interpreter here: same numerics, but its speed means nothing"
        return None


KERNELS: dict[str, Kernel] = {
    k.name: k
    for k in (
        Kernel("fp32", "fp32", False, "torch.matmul in fp32 (the reference)"),
        Kernel("bf16", "bf16", False, "torch.matmul on bf16 operands, fp32 result"),
        Kernel("scaled_mm_tensorwise", "tensorwise", True, "torch._scaled_mm, one scale per tensor"),
        Kernel("scaled_mm_rowwise", "rowwise", True, "torch._scaled_mm, one scale per row / column"),
        Kernel("scaled_mm_rowwise_with_gw_hp", "rowwise_with_gw_hp", True,
               "torch._scaled_mm rowwise for fwd and grad-input, bf16 grad-weight (torchao rowwise_with_gw_hp)"),
        Kernel("emulated_rowwise_with_gw_hp", "rowwise_with_gw_hp", False,
               "rowwise quantize-dequantize for fwd and grad-input, bf16 grad-weight"),
        Kernel("triton_rowwise", "rowwise", True,
               "Triton fused row-wise amax + scale + cast to float8, then torch._scaled_mm", backend="triton"),
        Kernel("triton_rowwise_with_gw_hp", "rowwise_with_gw_hp", True,
               "Triton fused row-wise cast + torch._scaled_mm for fwd/grad-input, bf16 grad-weight", backend="triton"),
        Kernel("emulated_tensorwise", "tensorwise", False, "quantize-dequantize then fp32 matmul"),
        Kernel("emulated_rowwise", "rowwise", False, "quantize-dequantize then fp32 matmul"),
        Kernel("emulated_block128", "block128", False, "1x128 block scales, quantize-dequantize + fp32 matmul"),
        Kernel("emulated_mx32", "mx32", False, "32-element power-of-two (MX) scales, emulated"),
    )
}


def skipped_kernels() -> dict[str, str]:
    """Kernels of the design that cannot run on this machine, with the reason."""
    if importlib.util.find_spec("triton") is None:
        return {k.name: "Triton is not installed (pip install 'cubic[triton]')"
                for k in KERNELS.values() if k.backend == "triton"}
    return {}


# how cost_models.gpu_gemm models each implementation on an H100: the recipe, and the mode its casts
# run in (the torch kernels cast with eager PyTorch ops; the Triton ones are fused, like torch.compile)
H100_MODEL: dict[str, tuple[str, str]] = {
    "scaled_mm_tensorwise": ("tensorwise", "eager"), "scaled_mm_rowwise": ("rowwise", "eager"),
    "scaled_mm_rowwise_with_gw_hp": ("rowwise_with_gw_hp", "eager"),
    "triton_rowwise": ("rowwise", "compile"), "triton_rowwise_with_gw_hp": ("rowwise_with_gw_hp", "compile"),
}


def modelled_h100_ms(kernel: str, m: int, k: int, n: int) -> float | None:
    """Modelled (not measured) H100 fwd+bwd time of a linear on this kernel; None for emulations."""
    from cost_models.gpu_gemm import linear_block_time_s

    if kernel in ("fp32", "bf16"):
        return linear_block_time_s(m, k, n, kernel) * 1e3  # type: ignore[arg-type]
    if kernel not in H100_MODEL:
        return None
    recipe, mode = H100_MODEL[kernel]
    return linear_block_time_s(m, k, n, "fp8", recipe, mode=mode, fuse_casts=False) * 1e3


def kernels_for_recipe(recipe: str) -> list[Kernel]:
    return [k for k in KERNELS.values() if k.recipe == recipe]


def default_kernel(recipe: str, device: torch.device | str = "cpu", shape: tuple[int, int, int] = (16, 16, 16)) -> Kernel:
    """The real ``_scaled_mm`` kernel for a recipe where it can run, else its emulation."""
    if recipe not in ALL_RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}")
    if recipe in REAL_SCALED_MM:
        real = KERNELS[f"scaled_mm_{recipe}"]
        if real.unavailable(device, *shape) is None:
            return real
        return KERNELS[f"emulated_{recipe}"]
    return KERNELS[recipe] if recipe in KERNELS else KERNELS[f"emulated_{recipe}"]


class ErrorLog:
    """Per-GEMM SQNR (dB) of every training step, for comparison with the Probe's prediction."""

    def __init__(self) -> None:
        self.sqnr: dict[str, list[float]] = {"fwd": [], "grad_input": [], "grad_weight": []}

    def add(self, gemm: str, ref: torch.Tensor, approx: torch.Tensor) -> None:
        self.sqnr[gemm].append(min(sqnr_db(ref, approx), 200.0))


class _KernelLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, kernel: Kernel, log: ErrorLog | None, hp: str):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.kernel, ctx.log, ctx.hp = kernel, log, hp
        y = kernel.gemm(x, weight, role="fwd", hp=ctx.hp)
        if log is not None:
            log.add("fwd", x.float() @ weight.float().t(), y)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        kernel, log = ctx.kernel, ctx.log
        dx = dw = None
        dy = dy.contiguous()
        if ctx.needs_input_grad[0]:
            wt = weight.t().contiguous()
            dx = kernel.gemm(dy, wt, role="grad_input", hp=ctx.hp)
            if log is not None:
                log.add("grad_input", dy.float() @ weight.float(), dx)
            dx = dx.to(x.dtype)
        if ctx.needs_input_grad[1]:
            dw = kernel.gemm(dy.t().contiguous(), x.t().contiguous(), role="grad_weight", hp=ctx.hp)
            if log is not None:
                log.add("grad_weight", dy.float().t() @ x.float(), dw)
            dw = dw.to(weight.dtype)
        return dx, dw, None, None, None


class Fp8Linear(nn.Linear):
    """Drop-in ``nn.Linear`` whose three GEMMs run on ``kernel`` (see the module docstring)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, kernel: str = "scaled_mm_rowwise",
                 track_error: bool = False, hp: str = "bf16", device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.hp = hp  # precision of a high-precision GEMM (rowwise_with_gw_hp's grad-weight)
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r} (known: {', '.join(KERNELS)})")
        self.kernel = KERNELS[kernel]
        self.error_log: ErrorLog | None = ErrorLog() if track_error else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernel: str, track_error: bool = False, hp: str = "bf16") -> "Fp8Linear":
        """Wrap an existing layer, sharing its Parameters (optimizers built before keep working)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r} (known: {', '.join(KERNELS)})")
        new.kernel = KERNELS[kernel]
        new.error_log = ErrorLog() if track_error else None
        new.hp = hp
        new.train(linear.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.dtype not in (torch.float32, torch.bfloat16):
            x2 = x2.float()
        y = _KernelLinearFn.apply(x2.contiguous(), self.weight, self.kernel, self.error_log, self.hp)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", kernel={self.kernel.name}"


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` where the dotted submodule ``name`` of ``model`` is (in place)."""
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def swap_linears(model: nn.Module, kernels: dict[str, str], track_error: bool = False) -> nn.Module:
    """Replace the named ``nn.Linear`` submodules of ``model`` (in place) by :class:`Fp8Linear`."""
    modules = dict(model.named_modules())
    for name, kernel in kernels.items():
        mod = modules.get(name)
        if not isinstance(mod, nn.Linear):
            raise KeyError(name)
        replace_module(model, name, Fp8Linear.from_linear(mod, kernel, track_error))
    return model


@contextmanager
def swapped(model: nn.Module, kernels: dict[str, str]):
    """``model`` with the named sites on :class:`Fp8Linear` for the duration (see :func:`swap_linears`);
    the original modules are put back on exit (their Parameters were shared, so nothing is copied)."""
    modules = dict(model.named_modules())
    saved = {name: modules[name] for name in kernels}
    swap_linears(model, kernels)
    try:
        yield model
    finally:
        for name, mod in saved.items():
            replace_module(model, name, mod)

