"""Analytical H100 time model for GEMMs and for a linear layer's full fwd+bwd block (modelled).

Nothing here is measured on this machine: every figure derived from it is *modelled*.

GEMM: a roofline, ``max(compute, memory) + fixed overhead``, where compute uses the device's dense
peak times an achievable fraction times a small-GEMM efficiency:

- tile quantization: the output is covered by ``tile_m x tile_n`` CTA tiles; partial tiles waste
  tensor-core work;
- wave quantization: tiles run in waves over the SMs; a last partial wave leaves SMs idle;
- pipeline fill along K: each tile's main loop pays a prologue of about ``k_fill`` elements
  (loading the first stages before the tensor cores are busy), so short K is inefficient;
- the best of a few tile shapes is taken, as cuBLAS/CUTLASS heuristics would pick one.

Linear block (one ``nn.Linear`` in training, M = rows of the batch, K = in, N = out features):
the three GEMMs (forward ``Y = X W^T``, grad-input ``dX = dY W``, grad-weight ``dW = dY^T X``),
optionally a LayerNorm before (forward + backward) and an activation after (forward + backward),
and for FP8 the cast/scale kernels each recipe needs (amax reductions, casts to e4m3/e5m2 in the
row- and column-major layouts the GEMMs want). With ``fuse_casts`` (what ``torch.compile`` does)
the first read of the linear's input/grad-output is fused into the neighbouring norm/activation.
Each memory-bound kernel costs ``bytes / (bw * achievable fraction)`` plus the per-kernel overhead.

Recipes: ``tensorwise`` (one scale per tensor), ``rowwise`` (one per row; column-wise for the
transposed operand), ``block128`` (1x128 activation / 128x128 weight blocks, DeepSeek-V3 style),
``mx32`` (32-element blocks, power-of-two e8m0 scales, OCP MX). Hopper has no native MX GEMM, so
``mx32`` on an H100 is modelled as a dequantize to bf16 + a bf16 GEMM (slower than bf16 alone).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

from cost_models.hardware import H100_SXM, DeviceSpec

Precision = Literal["fp32", "bf16", "fp8"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp8")
RECIPES: tuple[str, ...] = ("tensorwise", "rowwise", "block128", "mx32")
ACTIVATIONS: tuple[str, ...] = ("sigmoid", "relu", "gelu", "silu")

BYTES = {"fp32": 4, "bf16": 2, "fp8": 1}
# devices whose tensor cores consume MX block scales natively (Blackwell); Hopper does not.
MX_NATIVE_DEVICES = frozenset({"b200", "gb200", "b300"})

TORCHAO_ROOFLINE = (
    "pytorch/ao torchao/testing/float8/roofline_utils.py (H100 entry): pct_achievable_gemm_tops=0.78 "
    "'based on experimental observation with sample large inputs'; pct_achievable_mem_bw=0.92 from "
    "pointwise Triton kernels; KERNEL_LAUNCH_OVERHEAD_SEC=2e-6 measured from a one-element Triton kernel"
)
HOPPER_WHITEPAPER_SMS = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): H100 SXM5 has 132 SMs"
CUTLASS_TILES = ("CUTLASS 3.x Hopper GEMM examples / cuBLAS heuristics: 128x128 and 128x256 CTA tiles with "
                 "K-tiles of 64 (bf16) and 128 (fp8) elements are the common large-GEMM configurations")
DEEPGEMM = ("deepseek-ai/DeepGEMM README: fine-grained (1x128 / 128x128) FP8 GEMM reaches up to ~1550 "
            "TFLOPS on H800, i.e. close to but below per-tensor FP8 because scales are applied in the "
            "main loop on CUDA cores")


@dataclass(frozen=True)
class GemmConstants:
    """The model's constants, each with its public source or stated as a modelling assumption."""

    num_sms: int = 132
    achievable_gemm_frac: float = 0.78  # of the dense peak, large shapes, bf16 and fp8 alike
    achievable_mem_frac: float = 0.92  # of HBM bandwidth, pointwise kernels
    kernel_overhead_s: float = 2e-6  # per kernel launch (GPU-side)
    fp32_gemm_frac: float = 0.80  # fp32 SIMT GEMM (no TF32) of the 67 TFLOPS fp32 peak
    # relative GEMM throughput of each FP8 recipe against tensorwise
    recipe_gemm_factor: dict[str, float] = field(
        default_factory=lambda: {"tensorwise": 1.0, "rowwise": 0.95, "block128": 0.90, "mx32": 1.0}
    )
    # (tile_m, tile_n, relative per-SM efficiency): smaller tiles reuse less data per MMA
    tiles: tuple[tuple[int, int, float], ...] = ((128, 256, 1.0), (128, 128, 0.92), (64, 128, 0.75))
    k_tile: dict[str, int] = field(default_factory=lambda: {"fp32": 32, "bf16": 64, "fp8": 128})
    k_fill_tiles: float = 2.0  # prologue ~ two K-tiles of pipeline fill before steady state
    max_split_k: int = 64  # split-K factors tried: 2, 4, ... up to this
    min_split_k_len: int = 256  # each split keeps at least this much K
    sources: dict[str, str] = field(
        default_factory=lambda: {
            "num_sms": HOPPER_WHITEPAPER_SMS,
            "achievable_gemm_frac": TORCHAO_ROOFLINE,
            "achievable_mem_frac": TORCHAO_ROOFLINE,
            "kernel_overhead_s": TORCHAO_ROOFLINE,
            "fp32_gemm_frac": "modelling assumption: SIMT fp32 GEMMs reach ~80% of the fp32 peak",
            "recipe_gemm_factor": (
                "rowwise: modelling assumption (scales applied in the epilogue, slightly lower "
                "throughput than tensorwise, as torchao's float8 README tables show); block128: " + DEEPGEMM
                + "; mx32 is not native on Hopper (dequantize + bf16 GEMM)"
            ),
            "tiles": CUTLASS_TILES,
            "k_tile": CUTLASS_TILES,
            "k_fill_tiles": "modelling assumption: a multistage (TMA) pipeline fills ~2 K-tiles before the MMAs run",
            "max_split_k": "cuBLAS/CUTLASS split-K (and stream-K) GEMMs for few output tiles; bounds are assumptions",
            "peaks_and_bandwidth": "cost_models/hardware.py (device datasheet figures)",
        }
    )


DEFAULT_CONSTANTS = GemmConstants()


def _check_dims(m: int, k: int, n: int) -> None:
    for name, v in (("m", m), ("k", k), ("n", n)):
        if not isinstance(v, (int,)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def _check_precision(precision: str, recipe: str | None) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp8" and recipe is not None and recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")


def _pad16(x: int) -> int:
    # FP8 tensor-core GEMMs (cuBLASLt / _scaled_mm) need K and N multiples of 16
    return -(-x // 16) * 16


def small_gemm_efficiency(m: int, k: int, n: int, precision: str = "bf16",
                          constants: GemmConstants = DEFAULT_CONSTANTS) -> float:
    """Fraction of the achievable peak a GEMM of this shape reaches (best tile), in (0, 1]."""
    _check_dims(m, k, n)
    best = 0.0
    for tm, tn, tile_eff in constants.tiles:
        tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
        tile_util = (m * n) / (tiles_m * tm * tiles_n * tn)
        tiles = tiles_m * tiles_n
        waves = math.ceil(tiles / constants.num_sms)
        wave_util = tiles / (waves * constants.num_sms)
        k_fill = constants.k_fill_tiles * constants.k_tile[precision]
        k_util = k / (k + k_fill)
        best = max(best, tile_eff * tile_util * wave_util * k_util)
    return best


def gemm_time_s(m: int, k: int, n: int, precision: Precision = "bf16", recipe: str | None = None,
                device: DeviceSpec = H100_SXM, *, constants: GemmConstants = DEFAULT_CONSTANTS) -> float:
    """Modelled time of one ``[m, k] @ [k, n]`` GEMM on ``device``; fp8 reads fp8, writes bf16.

    Split-K is considered, as cuBLAS does when few output tiles cannot fill the SMs (weight
    gradients of skinny layers: tiny output, K = batch rows): a split in ``s`` parts runs like an
    ``(s*m, k/s, n)`` GEMM plus a reduction of ``s`` fp32 partial outputs; the fastest is taken.
    """
    _check_dims(m, k, n)
    _check_precision(precision, recipe)
    c = constants
    best = _gemm_time_one_pass(m, k, n, precision, recipe, device, c)
    s = 2
    while s <= c.max_split_k and k // s >= c.min_split_k_len:
        reduce_s = (s * m * n * 4 + m * n * BYTES["bf16"]) / (device.hbm_bw * c.achievable_mem_frac) + c.kernel_overhead_s
        best = min(best, _gemm_time_one_pass(m * s, k // s, n, precision, recipe, device, c) + reduce_s)
        s *= 2
    return best


def _gemm_time_one_pass(m: int, k: int, n: int, precision: str, recipe: str | None, device: DeviceSpec,
                        c: GemmConstants) -> float:
    if precision == "fp8":
        recipe = recipe or "tensorwise"
        if recipe == "mx32" and device.name not in MX_NATIVE_DEVICES:
            # no MX tensor cores: dequantize both operands to bf16 (read fp8 + scales, write bf16), bf16 GEMM
            deq_bytes = (m * k + k * n) * (1 + 1 / 32 + 2)
            deq = deq_bytes / (device.hbm_bw * c.achievable_mem_frac) + 2 * c.kernel_overhead_s
            return deq + _gemm_time_one_pass(m, k, n, "bf16", None, device, c)
        k, n = _pad16(k), _pad16(n)
        peak = device.peak_flops_fp8 * c.achievable_gemm_frac * c.recipe_gemm_factor[recipe]
        in_bytes = (m * k + k * n) * BYTES["fp8"]
        if recipe == "block128":
            in_bytes += 4 * (m * k / 128 + k * n / (128 * 128))
        elif recipe == "mx32":
            in_bytes += (m * k + k * n) / 32
        elif recipe == "rowwise":
            in_bytes += 4 * (m + n)
        out_bytes = m * n * BYTES["bf16"]
    elif precision == "bf16":
        peak = device.peak_flops_bf16 * c.achievable_gemm_frac
        in_bytes = (m * k + k * n) * BYTES["bf16"]
        out_bytes = m * n * BYTES["bf16"]
    else:
        peak = device.peak_flops_fp32 * c.fp32_gemm_frac
        in_bytes = (m * k + k * n) * BYTES["fp32"]
        out_bytes = m * n * BYTES["fp32"]
    compute = 2.0 * m * k * n / (peak * small_gemm_efficiency(m, k, n, precision, c))
    memory = (in_bytes + out_bytes) / (device.hbm_bw * c.achievable_mem_frac)
    return max(compute, memory) + c.kernel_overhead_s


@dataclass(frozen=True)
class Kernel:
    """One kernel of a modelled block: what it is, which pass, its traffic/work, and its time."""

    name: str
    phase: Literal["fwd", "bwd"]
    kind: Literal["gemm", "cast", "norm", "act"]
    bytes: float
    flops: float
    time_s: float


def _mem_kernel(name: str, phase: str, kind: str, nbytes: float, device: DeviceSpec, c: GemmConstants) -> Kernel:
    t = nbytes / (device.hbm_bw * c.achievable_mem_frac) + c.kernel_overhead_s
    return Kernel(name, phase, kind, float(nbytes), 0.0, t)  # type: ignore[arg-type]


def _cast_kernels(role: str, d0: int, d1: int, recipe: str, fused_read: bool, phase: str,
                  device: DeviceSpec, c: GemmConstants) -> list[Kernel]:
    """Kernels that turn a bf16 ``[d0, d1]`` operand into the fp8 layouts its two GEMMs need.

    Every operand of a linear is used twice (input: fwd and grad-weight; weight: fwd and
    grad-input; grad-output: grad-input and grad-weight), once row-major and once column-major,
    so each recipe writes two fp8 copies. ``fused_read``: the first bf16 read is fused into the
    preceding norm/activation kernel, which then also computes the amax / writes the first copy.
    """
    numel = d0 * d1
    b16, b8 = BYTES["bf16"] * numel, BYTES["fp8"] * numel
    ks: list[Kernel] = []
    if recipe == "tensorwise":
        # amax (two-stage reduction) then one cast writing both layouts (a transposed fp8 copy)
        if not fused_read:
            ks.append(_mem_kernel(f"{role}.amax", phase, "cast", b16, device, c))
        ks.append(_mem_kernel(f"{role}.amax_final", phase, "cast", 0, device, c))
        ks.append(_mem_kernel(f"{role}.cast", phase, "cast", b16 + 2 * b8, device, c))
    else:
        # row-scaled copy (amax per row and cast in one pass), then a column-scaled copy that needs
        # its own reduction over the other dimension: read bf16 again, write fp8 (+ scales)
        scale_div = {"rowwise": max(d1, 1), "block128": 128, "mx32": 32}[recipe]
        scale_bytes = 4 if recipe != "mx32" else 1
        first = (0 if fused_read else b16) + b8 + scale_bytes * numel / scale_div
        ks.append(_mem_kernel(f"{role}.cast_rows", phase, "cast", first, device, c))
        if recipe == "block128" and role == "weight":
            # 128x128 weight blocks serve both orientations: a transposed fp8 copy suffices
            ks.append(_mem_kernel(f"{role}.transpose", phase, "cast", 2 * b8, device, c))
        else:
            ks.append(_mem_kernel(f"{role}.cast_cols", phase, "cast",
                                  b16 + b8 + scale_bytes * numel / scale_div, device, c))
    return ks


def linear_block_kernels(m: int, k: int, n: int, precision: Precision = "bf16", recipe: str | None = None, *,
                         norm_before: bool = False, act_after: str | None = None,
                         device: DeviceSpec = H100_SXM, fuse_casts: bool = True,
                         constants: GemmConstants = DEFAULT_CONSTANTS) -> list[Kernel]:
    """Every kernel of one linear layer's fwd+bwd, with its modelled time (see the module docstring)."""
    _check_dims(m, k, n)
    _check_precision(precision, recipe)
    if act_after is not None and act_after not in ACTIVATIONS:
        raise ValueError(f"act_after must be one of {', '.join(ACTIVATIONS)} or None, got {act_after!r}")
    c = constants
    act_dtype = "fp32" if precision == "fp32" else "bf16"
    eb = BYTES[act_dtype]
    ks: list[Kernel] = []
    if norm_before:
        # LayerNorm fwd: read x, write y; bwd: read x and dy, write dx; then reduce dgamma/dbeta
        ks.append(_mem_kernel("norm.fwd", "fwd", "norm", 2 * m * k * eb, device, c))
    if precision == "fp8":
        recipe = recipe or "tensorwise"
        ks += _cast_kernels("input", m, k, recipe, fuse_casts and norm_before, "fwd", device, c)
        ks += _cast_kernels("weight", n, k, recipe, False, "fwd", device, c)

    def gemm(name: str, phase: str, gm: int, gk: int, gn: int) -> Kernel:
        t = gemm_time_s(gm, gk, gn, precision, recipe, device, constants=c)
        nbytes = (gm * gk + gk * gn) * BYTES[precision] + gm * gn * eb
        return Kernel(name, phase, "gemm", float(nbytes), 2.0 * gm * gk * gn, t)  # type: ignore[arg-type]

    ks.append(gemm("gemm.fwd", "fwd", m, k, n))
    if act_after:
        ks.append(_mem_kernel(f"{act_after}.fwd", "fwd", "act", 2 * m * n * eb, device, c))
        # activation backward: read y (or x) and dy, write dx
        ks.append(_mem_kernel(f"{act_after}.bwd", "bwd", "act", 3 * m * n * eb, device, c))
    if precision == "fp8":
        ks += _cast_kernels("grad_output", m, n, recipe, fuse_casts and bool(act_after), "bwd", device, c)
    ks.append(gemm("gemm.grad_input", "bwd", m, n, k))
    ks.append(gemm("gemm.grad_weight", "bwd", n, m, k))
    if norm_before:
        ks.append(_mem_kernel("norm.bwd", "bwd", "norm", 3 * m * k * eb, device, c))
        ks.append(_mem_kernel("norm.bwd_params", "bwd", "norm", 2 * m * k * eb, device, c))
    return ks


def linear_block_time_s(m: int, k: int, n: int, precision: Precision = "bf16", recipe: str | None = None, *,
                        norm_before: bool = False, act_after: str | None = None,
                        device: DeviceSpec = H100_SXM, fuse_casts: bool = True,
                        constants: GemmConstants = DEFAULT_CONSTANTS) -> float:
    """Modelled fwd+bwd time (s) of [norm ->] linear [-> activation], with FP8 cast/scale kernels."""
    return sum(k_.time_s for k_ in linear_block_kernels(
        m, k, n, precision, recipe, norm_before=norm_before, act_after=act_after, device=device,
        fuse_casts=fuse_casts, constants=constants))


def block_speedup(m: int, k: int, n: int, recipe: str = "tensorwise", *, norm_before: bool = False,
                  act_after: str | None = None, device: DeviceSpec = H100_SXM, fuse_casts: bool = True,
                  constants: GemmConstants = DEFAULT_CONSTANTS) -> dict[str, float]:
    """bf16 vs FP8 fwd+bwd block times (ms) and the speedup (> 1: FP8 faster). Modelled."""
    kw = dict(norm_before=norm_before, act_after=act_after, device=device, fuse_casts=fuse_casts,
              constants=constants)
    bf16 = linear_block_time_s(m, k, n, "bf16", None, **kw)
    fp8 = linear_block_time_s(m, k, n, "fp8", recipe, **kw)
    return {"bf16_ms": bf16 * 1e3, "fp8_ms": fp8 * 1e3, "speedup": bf16 / fp8}


def constants_table(constants: GemmConstants = DEFAULT_CONSTANTS) -> dict:
    """The constants and their sources, for result files."""
    return asdict(constants)
