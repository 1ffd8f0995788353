"""Triton kernels for Dispatch: a fused row-wise amax + scale + cast to float8, and the FP8 GEMM on it.

Where the H100 model (``cubic fp8 model --recipe rowwise --explain``) says the cast overhead
dominates (small and medium M, K, N), the eager PyTorch path launches about ten kernels per
operand (abs, amax, scale arithmetic, upcast, multiply, clamp, downcast); this one reads each row
once for its amax and once to cast, in a single launch (what torch.compile generates for
torchao's rowwise recipe). Its modelled H100 time is the ``rowwise`` recipe in ``compile`` mode of
``cost_models.gpu_gemm`` (modelled, not measured: no GPU here).

Numerics: identical to :func:`fp8.recipes.quantize` with ``recipe="rowwise"`` (torchao's):
``s = fp8_max / max(amax, 1e-12)`` per row rounded down to a power of two, ``q = clamp(x * s)``
rounded to nearest-even on the float8 grid, and ``1 / s`` stored as the row's scale.
The rounding is done in fp32 inside the kernel (exponent from the bits, a power-of-two quantum,
round-half-even by the 1.5 * 2^23 trick), so the final store converts an exactly representable
value and the result does not depend on the backend's float8 conversion rounding (the CPU
interpreter's differs from the GPU's).

On a machine without CUDA the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, set
here before Triton is imported when CUDA is absent): correct but slow, so Dispatch never times it
for speed there. Importing this module without Triton installed raises ImportError.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # the interpreter is the only Triton backend on a CPU-only machine
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from fp8.recipes import DTYPES, FP8_MAX, RECIPES, Cast, dequantize, gemm_unsupported  # noqa: E402

# exponent of the smallest normal number and mantissa bits of each format (IEEE-like layout)
_EMIN = {"e4m3": -6, "e5m2": -14}
_MBITS = {"e4m3": 3, "e5m2": 2}
_BLOCK = 128
FMAX_F = {k: float(v) for k, v in FP8_MAX.items()}


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _max2(a, b):
    return tl.maximum(a, b)


@triton.jit
def _rowwise_quant_kernel(x_ptr, q_ptr, s_ptr, n_cols, stride_x, stride_q,
                          FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr, BLOCK: tl.constexpr,
                          POW2: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.full([BLOCK], 0.0, tl.float32)  # builtins only (see below)
    for start in range(0, n_cols, BLOCK):
        mask = start + offs < n_cols
        x = tl.load(x_ptr + row * stride_x + start + offs, mask=mask, other=0.0).to(tl.float32)
        acc = tl.maximum(acc, tl.abs(x))
    # builtins only (tl.full, tl.reduce with our own combine): tl.max and tl.zeros are library @jit
    # functions, which Triton's interpreter cannot call when Triton was imported (e.g. by
    # torch._inductor) before TRITON_INTERPRET was set
    # torchao's amax_to_scale: FMAX / amax (one correctly rounded fp32 division gives the same
    # float32 as torchao's float64 division rounded to float32), rounded down to a power of two
    inv = FMAX / tl.maximum(tl.reduce(acc, 0, _max2), 1e-12)
    if POW2:
        inv = tl.exp2(tl.floor(tl.log2(inv)))
    tl.store(s_ptr + row, 1.0 / inv)
    for start in range(0, n_cols, BLOCK):
        mask = start + offs < n_cols
        x = tl.load(x_ptr + row * stride_x + start + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.clamp(x * inv, -FMAX, FMAX)
        # round to nearest-even on the float8 grid, in fp32: quantum = 2^(max(exp, EMIN) - MBITS)
        bits = v.to(tl.int32, bitcast=True)
        e = ((bits >> 23) & 0xFF) - 127
        e = tl.maximum(e, EMIN) - MBITS
        quantum = ((e + 127) << 23).to(tl.float32, bitcast=True)
        t = v / quantum  # exact: a power-of-two divisor
        r = (t + 12582912.0) - 12582912.0  # 1.5 * 2^23: fp32 addition rounds half to even
        tl.store(q_ptr + row * stride_q + start + offs, (r * quantum).to(q_ptr.dtype.element_ty), mask=mask)


def rowwise_quantize(x: torch.Tensor, fmt: str = "e4m3") -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [P, R] -> (float8 [P, R], fp32 scales [P, 1]), the same as ``fp8.recipes.quantize(x, fmt, "rowwise")``."""
    if x.dim() != 2:
        raise ValueError(f"expected a 2-D tensor, got shape {tuple(x.shape)}")
    x = x.contiguous()
    p, r = x.shape
    q = torch.empty((p, r), dtype=DTYPES[fmt], device=x.device)
    s = torch.empty((p,), dtype=torch.float32, device=x.device)
    if p:
        _rowwise_quant_kernel[(p,)](x, q, s, r, x.stride(0), q.stride(0), FMAX=FMAX_F[fmt], EMIN=_EMIN[fmt],
                                    MBITS=_MBITS[fmt], BLOCK=_BLOCK, POW2=RECIPES["rowwise"].pow2_scales)
    return q, s.unsqueeze(1)


def scaled_matmul(a: torch.Tensor, b: torch.Tensor, recipe: str, fmt_a: str = "e4m3", fmt_b: str = "e4m3") -> torch.Tensor:
    """``a @ b.T`` in fp32 with both operands cast by the Triton kernel (row-wise scales along the
    reduction dim) and multiplied by ``torch._scaled_mm`` where it runs (else dequantize + fp32)."""
    from fp8.recipes import _real_scaled_mm

    if recipe in ("fp32", "bf16"):
        from fp8.recipes import scaled_matmul as torch_scaled_matmul

        return torch_scaled_matmul(a, b, recipe)
    if recipe != "rowwise":
        raise ValueError(f"the Triton kernel implements the rowwise recipe, not {recipe!r}")
    qa, sa = rowwise_quantize(a.float(), fmt_a)
    qb, sb = rowwise_quantize(b.float(), fmt_b)
    casts = (Cast(fmt_a, "rowwise"), Cast(fmt_b, "rowwise"))  # type: ignore[arg-type]
    if gemm_unsupported(a.device, casts, a.shape[0], a.shape[1], b.shape[0]) is None:
        return _real_scaled_mm(qa, sa, qb, sb, rowwise_out=True)
    out = dequantize(qa, sa, "rowwise", a.shape[1]) @ dequantize(qb, sb, "rowwise", b.shape[1]).t()
    return out.bfloat16().float()  # a rowwise GEMM outputs bf16 (fp8.recipes.cast_matmul)


__all__ = ["interpreted", "rowwise_quantize", "scaled_matmul", "triton"]
