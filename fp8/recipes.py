"""FP8 arithmetic: quantization, the scaled GEMM of each recipe's GEMM roles, SQNR.

Which format and scaling each operand of a linear's three GEMMs gets is the table
:data:`cubic.core.recipes.RECIPES` (torchao 0.18's recipes, checked against torchao's own config
in ``tests/test_fp8_torchao.py``); this module does the arithmetic the table asks for, the way
torchao does it, so that the error the Probe measures is the error a torchao job runs:

- the scale is torchao's ``amax_to_scale``: ``fp8_max / max(amax, 1e-12)`` computed in float64,
  stored as float32, rounded down to a power of two when the recipe says so (the rowwise ones);
  the cast is ``(x * scale).clamp(-fp8_max, fp8_max).to(float8)``; the bits of every cast equal
  torchao's (tested);
- a GEMM with a rowwise-scaled operand outputs bf16 (``torch._scaled_mm``'s rowwise path on CUDA,
  and torchao on every device), a tensorwise one fp32; a tensorwise operand beside a rowwise one
  has its scale repeated per row (as torchao does), so the GEMM takes the rowwise kernel;
- ``block128`` (one fp32 scale per 128 elements along the reduction dim) and ``mx32`` (OCP MX v1.0
  power-of-two scale per 32 elements) are cubic's own, emulated by dequantizing and multiplying in
  fp32 (the arithmetic of an FP8 tensor core with fp32 accumulation, up to summation order).

:func:`role_matmul` computes one GEMM role of a recipe (``a @ b.T``, ``a`` [P, R], ``b`` [Q, R]);
it runs ``torch._scaled_mm`` where :func:`gemm_unsupported` allows, else emulates. ``bf16`` and
``fp32`` are reference "recipes" for error tables.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

from cubic.core.recipes import (  # noqa: F401 - re-exported: fp8's users read the table from here too
    ALL_RECIPES,
    FP8_RECIPES,
    HIGH_PRECISION,
    RECIPES,
    ROLES,
    TORCHAO_RECIPES,
    Cast,
    Format,
    Recipe,
    recipe as get_recipe,
)

GEMMS: tuple[str, ...] = ROLES
REAL_SCALINGS: frozenset[str] = frozenset({"tensorwise", "rowwise"})  # what torch._scaled_mm takes
# recipes all of whose FP8 GEMMs can run on torch._scaled_mm
REAL_SCALED_MM: frozenset[str] = frozenset(
    n for n, r in RECIPES.items()
    if all(c.hp or c.scaling in REAL_SCALINGS for role in ROLES for c in r.role(role)))
DTYPES: dict[str, torch.dtype] = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_MAX: dict[str, float] = {"e4m3": 448.0, "e5m2": 57344.0}
# exponent of the largest power of two in each element format (OCP MX spec, emax_elem)
MX_EMAX: dict[str, int] = {"e4m3": 8, "e5m2": 15}
BLOCK: dict[str, int] = {"block128": 128, "mx32": 32}
_EPS = 1e-12  # torchao.float8.float8_utils.EPS
_HP_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def check_recipe(recipe: str) -> str:
    if recipe not in ALL_RECIPES:
        raise ValueError(f"unknown recipe {recipe!r} (known: {', '.join(ALL_RECIPES)})")
    return recipe


def _pad_cols(x: torch.Tensor, block: int) -> torch.Tensor:
    r = x.shape[1] % block
    return x if r == 0 else torch.nn.functional.pad(x, (0, block - r))


def _pow2_default(scaling: str) -> bool:
    # a bare scaling name takes the rounding of the recipe of that name (rowwise: powers of 2)
    return RECIPES[scaling].pow2_scales if scaling in RECIPES else False


def _torchao_scale(amax: torch.Tensor, fmt: str, pow2: bool) -> torch.Tensor:
    # torchao.float8.float8_utils.amax_to_scale, op for op (float64 division, then float32)
    s = (FP8_MAX[fmt] / amax.to(torch.float64).clamp(min=_EPS)).to(torch.float32)
    return torch.exp2(torch.floor(torch.log2(s))) if pow2 else s


def quantize(x: torch.Tensor, fmt: Format, scaling: str, pow2: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ([P, R], reduced along R) -> (fp8 tensor, fp32 scales) with ``x ~= q * scale``.

    Scale shapes: tensorwise ``[]``; rowwise ``[P, 1]``; block recipes ``[P, ceil(R/block)]``
    (the fp8 tensor is then zero-padded to a multiple of the block along R). ``pow2``: round the
    scales to powers of two (default: as the recipe of that name does).
    """
    fmax = FP8_MAX[fmt]
    pow2 = _pow2_default(scaling) if pow2 is None else pow2
    if scaling in ("tensorwise", "rowwise"):
        a = x.abs()
        amax = a.amax() if scaling == "tensorwise" else a.amax(dim=1, keepdim=True)
        s = _torchao_scale(amax, fmt, pow2)
        q = (x.to(torch.float32) * s).clamp(-fmax, fmax).to(DTYPES[fmt])
        return q, s.reciprocal()
    x = x.float()
    if scaling in BLOCK:
        block = BLOCK[scaling]
        xp = _pad_cols(x, block)
        blocks = xp.view(xp.shape[0], -1, block)
        amax = blocks.abs().amax(dim=2, keepdim=True).clamp_min(_EPS)
        if scaling == "mx32":
            scale = torch.exp2(torch.floor(torch.log2(amax)) - MX_EMAX[fmt])
        else:
            scale = amax / fmax
        q = (blocks / scale).clamp(-fmax, fmax).to(DTYPES[fmt]).view_as(xp)
        return q, scale.squeeze(2)
    raise ValueError(f"not an FP8 scaling: {scaling!r}")


def dequantize(q: torch.Tensor, scale: torch.Tensor, scaling: str, cols: int) -> torch.Tensor:
    """Inverse of :func:`quantize` in fp32, cropped to the original ``cols``."""
    if scaling in BLOCK:
        block = BLOCK[scaling]
        out = (q.float().view(q.shape[0], -1, block) * scale.unsqueeze(2)).view(q.shape[0], -1)
        return out[:, :cols]
    return q.float() * scale


def fake_quantize(x: torch.Tensor, fmt: Format, recipe: str) -> torch.Tensor:
    """Quantize-dequantize ``x`` ([P, R]) in fp32: what the GEMM actually multiplies."""
    if recipe == "fp32":
        return x.float()
    if recipe == "bf16":
        return x.bfloat16().float()
    q, s = quantize(x, fmt, recipe)
    return dequantize(q, s, recipe, x.shape[1])


def gemm_unsupported(device: torch.device | str, casts: tuple[Cast, Cast], p: int, r: int, q: int) -> str | None:
    """Why ``torch._scaled_mm`` cannot run this GEMM (operands cast as ``casts``) here (None: it can).

    CPU (oneDNN path): any shape, e4m3/e5m2 in either operand, tensorwise or rowwise scales.
    CUDA (cuBLASLt / CUTLASS): compute capability >= 8.9, reduction and output dims multiples of
    16, no e5m2 x e5m2, and a rowwise-scaled GEMM only with e4m3 x e4m3 operands (bf16 output):
    so the rowwise recipes (e4m3 gradients, as torchao's) run their backward for real.
    """
    device = torch.device(device)
    a, b = casts
    if a.hp or b.hp:
        return "a high-precision GEMM (no FP8 cast)"
    if a.scaling not in REAL_SCALINGS or b.scaling not in REAL_SCALINGS:
        return f"{a.scaling if a.scaling not in REAL_SCALINGS else b.scaling}: no torch._scaled_mm path (emulated)"
    if not hasattr(torch, "_scaled_mm"):
        return "torch._scaled_mm is absent in this torch build"
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        if torch.cuda.get_device_capability(device) < (8, 9):
            return "FP8 tensor cores need compute capability >= 8.9"
        if r % 16 or q % 16:
            return f"reduction dim {r} and output dim {q} must be multiples of 16 (see fp8.mods.pad_dims)"
        if a.fmt == "e5m2" and b.fmt == "e5m2":
            return "e5m2 x e5m2 is not supported by cuBLASLt"
        if "rowwise" in (a.scaling, b.scaling) and (a.fmt, b.fmt) != ("e4m3", "e4m3"):
            return "rowwise _scaled_mm takes e4m3 operands only"
        return None
    return f"no FP8 GEMM on device type {device.type}"


def scaled_mm_unsupported(device: torch.device, recipe: str, p: int, r: int, q: int,
                          fmt_a: Format, fmt_b: Format) -> str | None:
    """:func:`gemm_unsupported` for two operands of one scaling (``recipe``: a scaling name, or a
    recipe, whose forward scaling is taken)."""
    scaling = RECIPES[recipe].fwd[0].scaling if recipe in RECIPES else recipe
    if scaling is None or scaling in HIGH_PRECISION:
        return f"{recipe}: no torch._scaled_mm path (emulated)"
    return gemm_unsupported(device, (Cast(fmt_a, scaling), Cast(fmt_b, scaling)), p, r, q)


def _real_scaled_mm(qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor,
                    rowwise_out: bool) -> torch.Tensor:
    """``torch._scaled_mm`` on quantized operands (scales as :func:`quantize` returns them).
    ``rowwise_out``: a rowwise-scaled GEMM, whose output is bf16 (as on CUDA and in torchao)."""
    p, q = qa.shape[0], qb.shape[0]
    out_dtype = torch.bfloat16 if rowwise_out else torch.float32
    if rowwise_out or qa.device.type == "cpu":
        # a tensorwise scale beside a rowwise one is repeated per row (torchao's preprocess_addmm);
        # on a CPU the tensorwise path of _scaled_mm is a slow reference loop (seconds for
        # 512x256x256), and the rowwise path computes the same product with every row's scale equal
        sa = sa.reshape(-1, 1).expand(p, 1)
        sb = sb.reshape(1, -1).expand(1, q)
    # mat2 must be column-major: b is [Q, R] row-major, so b.t() is [R, Q] column-major
    out = torch._scaled_mm(qa, qb.t(), scale_a=sa.float().contiguous(), scale_b=sb.float().contiguous(),
                           out_dtype=out_dtype)
    return out.float()


def cast_matmul(a: torch.Tensor, b: torch.Tensor, casts: tuple[Cast, Cast], *, pow2: bool, real: bool = True,
                hp: str = "bf16") -> torch.Tensor:
    """``a @ b.T`` in fp32 with the operands cast as ``casts`` (high precision: in ``hp``)."""
    ca, cb = casts
    if ca.hp or cb.hp:
        if not (ca.hp and cb.hp):
            raise ValueError("a GEMM casts both operands to FP8 or neither")
        dt = _HP_DTYPES[hp]
        return (a.to(dt) @ b.to(dt).t()).float()
    qa, sa = quantize(a, ca.fmt, ca.scaling, pow2)  # type: ignore[arg-type]
    qb, sb = quantize(b, cb.fmt, cb.scaling, pow2)  # type: ignore[arg-type]
    rowwise_out = "rowwise" in (ca.scaling, cb.scaling)
    if real and gemm_unsupported(a.device, casts, a.shape[0], a.shape[1], b.shape[0]) is None:
        return _real_scaled_mm(qa.contiguous(), sa, qb.contiguous(), sb, rowwise_out)
    out = dequantize(qa, sa, ca.scaling, a.shape[1]) @ dequantize(qb, sb, cb.scaling, b.shape[1]).t()  # type: ignore[arg-type]
    return out.bfloat16().float() if rowwise_out else out


def role_matmul(a: torch.Tensor, b: torch.Tensor, recipe: str, role: str = "fwd", *, real: bool = True,
                hp: str = "bf16") -> torch.Tensor:
    """One GEMM role (``fwd``, ``grad_input``, ``grad_weight``; operands as in
    :mod:`cubic.core.recipes`) of ``recipe`` (an FP8 recipe, or ``fp32`` / ``bf16``).
    ``hp``: the precision of a high-precision GEMM (bf16: the dtype of the jobs torchao trains)."""
    check_recipe(recipe)
    if recipe in HIGH_PRECISION:
        return cast_matmul(a, b, (Cast(), Cast()), pow2=False, hp=recipe)
    r = RECIPES[recipe]
    return cast_matmul(a, b, r.role(role), pow2=r.pow2_scales, real=real, hp=hp)


def scaled_matmul(a: torch.Tensor, b: torch.Tensor, recipe: str, fmt_a: Format = "e4m3",
                  fmt_b: Format = "e4m3", *, real: bool = True) -> torch.Tensor:
    """``a @ b.T`` in fp32 with both operands in one scaling (``recipe``: a scaling, a recipe whose
    forward scaling is used, or fp32 / bf16) and the given formats; see :func:`role_matmul` for a
    recipe's GEMM roles."""
    check_recipe(recipe)
    if recipe in HIGH_PRECISION:
        return role_matmul(a, b, recipe)
    r = RECIPES[recipe]
    scaling = r.fwd[0].scaling
    return cast_matmul(a, b, (Cast(fmt_a, scaling), Cast(fmt_b, scaling)), pow2=r.pow2_scales, real=real)


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio, ``10 log10(|ref|^2 / |ref - approx|^2)`` in dB (inf if exact)."""
    return _sqnr_rel(ref, approx)[0]


def relative_error(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """``|ref - approx| / |ref|`` (Frobenius)."""
    return _sqnr_rel(ref, approx)[1]


def _sqnr_rel(ref: torch.Tensor, approx: torch.Tensor) -> tuple[float, float]:
    # fp32 tensors, sums accumulated by torch's pairwise reduction: accurate far beyond FP8 noise
    ref, approx = ref.float(), approx.float()
    noise = (ref - approx).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    if noise == 0.0:
        return math.inf, 0.0
    if signal == 0.0:
        return -math.inf, math.inf
    return 10.0 * math.log10(signal / noise), math.sqrt(noise / signal)


def linear_operands(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The (a, b) operands of a linear's three GEMM roles (``a @ b.T``): x [M, K], w [N, K], dy [M, N]."""
    return {"fwd": (x, w), "grad_input": (dy, w.t().contiguous()),
            "grad_weight": (dy.t().contiguous(), x.t().contiguous())}


def linear_gemm_errors(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, recipe: str | Iterable[str],
                       *, real: bool = True) -> dict:
    """SQNR (dB) and relative error of the three GEMMs of a linear layer under a recipe vs fp32.

    ``x`` [M, K] input, ``w`` [N, K] weight, ``dy`` [M, N] output gradient; each GEMM's operands
    cast as the recipe table says (:data:`cubic.core.recipes.RECIPES`, a high-precision GEMM in
    bf16). Returns ``{gemm: (sqnr_db, rel_error)}`` for one recipe, or ``{recipe: {gemm: ...}}``
    when given several (fp32 references and GEMMs cast alike are computed once).
    """
    ops = linear_operands(x.float(), w.float(), dy.float())
    refs = {name: a @ b.t() for name, (a, b) in ops.items()}
    recipes = [recipe] if isinstance(recipe, str) else list(recipe)
    out: dict = {}
    done: dict[tuple, tuple[float, float]] = {}  # (role, casts, pow2) -> errors, shared across recipes
    for r in recipes:
        check_recipe(r)
        out[r] = {}
        for name, (a, b) in ops.items():
            if r in HIGH_PRECISION:
                key: tuple = (name, r)
            else:
                spec = RECIPES[r]
                casts = spec.role(name)
                key = (name, casts, spec.pow2_scales) if not casts[0].hp else (name, "bf16")
            if key not in done:
                done[key] = _sqnr_rel(refs[name], role_matmul(a, b, r, name, real=real))
            out[r][name] = done[key]
    return out[recipe] if isinstance(recipe, str) else out
