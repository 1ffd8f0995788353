"""Analytical H100 time model for GEMMs and for a linear layer's full fwd+bwd block (modelled).

Nothing here is measured on this machine: every figure derived from it is *modelled*. The GEMM
efficiencies are fitted to public H100 measurements by ``experiments/h100_model_fit.py`` (data in
``cost_models/data/h100_measurements/``, fitted constants in ``cost_models/data/h100_gemm_fit.json``);
without that file the published/assumed constants below are used.

GEMM: a roofline, ``max(compute, memory) + fixed overhead``, where compute uses the device's dense
peak times an achievable fraction (per dtype) times a small-GEMM efficiency:

- tile quantization: the output is covered by ``tile_m x tile_n`` CTA tiles; partial tiles waste
  tensor-core work;
- wave quantization: tiles run in waves over the SMs; a last partial wave leaves SMs idle;
- pipeline fill along K: each tile's main loop pays a prologue of about ``k_fill`` elements, so
  short K is inefficient;
- the best of a few tile shapes (and split-K factors) is taken, as cuBLAS/CUTLASS heuristics would.

Linear block (one ``nn.Linear`` in training, M = rows, K = in, N = out features): the three GEMMs
(forward ``Y = X W^T``, grad-input ``dX = dY W``, grad-weight ``dW = dY^T X``), optionally a
LayerNorm before and an activation after (forward + backward), and for FP8 the kernels torchao's
float8 training (dynamic scaling) launches for each recipe, per tensor and per direction:

- forward: the input (e4m3) and the weight (e4m3); backward: the grad-output (e5m2 for tensorwise,
  e4m3 for the rowwise recipes) for grad-input and for grad-weight;
- each tensor is needed in the layouts its GEMMs want: ``dim0`` (row-major, scaled along K of
  the forward) and ``dim1`` (the transposed operand of the other GEMM);
- ``tensorwise``: a two-stage amax reduction (a full read, then a one-block kernel computing the
  scale) and one cast writing both fp8 layouts;
- ``rowwise``: per layout one kernel that reduces the amax along the scaled dim, computes the
  (power-of-two) scales and casts: two full reads per tensor;
- ``rowwise_with_gw_hp``: rowwise, but the grad-weight GEMM runs in bf16, so the input and the
  grad-output need no ``dim1`` fp8 copy;
- ``block128`` (1x128 activation / 128x128 weight blocks) and ``mx32`` (32-element power-of-two
  scales): Hopper has no native MX GEMM, so ``mx32`` is a dequantize + bf16 GEMM there.

Two execution modes, as separate options: ``compile`` (torch.compile/inductor: each cast is one
fused Triton kernel, and the first read of the input / grad-output is fused into the preceding
norm / activation-backward kernel) and ``eager`` (every aten op its own kernel: abs, amax, scale
arithmetic, upcast, multiply, clamp, downcast, contiguous transposes; no fusion with neighbours;
each launch costs at least the host dispatch time).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from cost_models.hardware import H100_SXM, DeviceSpec

Precision = Literal["fp32", "bf16", "fp8"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp8")
from cubic.core.recipes import FP8_RECIPES as RECIPES  # noqa: E402 - the one recipe table
MODES: tuple[str, ...] = ("compile", "eager")
ACTIVATIONS: tuple[str, ...] = ("sigmoid", "relu", "gelu", "silu")

BYTES = {"fp32": 4, "bf16": 2, "fp8": 1}
# devices whose tensor cores consume MX block scales natively (Blackwell); Hopper does not.
MX_NATIVE_DEVICES = frozenset({"b200", "gb200", "b300"})
FIT_PATH = Path(__file__).parent / "data" / "h100_gemm_fit.json"
# the constants the fit may change (experiments/h100_model_fit.py)
FITTED_FIELDS: tuple[str, ...] = ("achievable_gemm_frac", "fp8_gemm_frac", "k_fill_tiles", "gemm_overhead_s",
                                  "rowwise_gemm_factor", "cast_mem_frac", "dim1_cast_mem_frac", "compile_launch_floor_s")
# the block-level fields, fitted on fwd+bwd block speedups (the rest on GEMM-only rows)
BLOCK_FIELDS: tuple[str, ...] = ("cast_mem_frac", "dim1_cast_mem_frac", "compile_launch_floor_s")

TORCHAO_ROOFLINE = (
    "pytorch/ao torchao/testing/float8/roofline_utils.py (H100 entry): pct_achievable_gemm_tops=0.78 "
    "'based on experimental observation with sample large inputs'; pct_achievable_mem_bw=0.92 from "
    "pointwise Triton kernels; KERNEL_LAUNCH_OVERHEAD_SEC=2e-6 measured from a one-element Triton kernel"
)
TORCHAO_KERNELS = (
    "pytorch/ao torchao/float8 (float8_scaling_utils.hp_tensor_to_float8_dynamic, float8_linear.py "
    "matmul_with_hp_or_float8_args, config.py recipes tensorwise/rowwise/rowwise_with_gw_hp) and the "
    "kernel counts of torchao/testing/float8/roofline_utils.py get_tensor_memory_traffic_ovhd_s"
)
HOPPER_WHITEPAPER_SMS = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): H100 SXM5 has 132 SMs"
CUTLASS_TILES = ("CUTLASS 3.x Hopper GEMM examples / cuBLAS heuristics: 128x128 and 128x256 CTA tiles with "
                 "K-tiles of 64 (bf16) and 128 (fp8) elements are the common large-GEMM configurations")
TORCHAO_RESCALE = (
    "pytorch/ao issue #2184 and PR #1325 (text): with use_fast_accum=False (torchao's default for the two "
    "backward GEMMs) the CUTLASS rowwise GEMM was so slow that torchao runs the cuBLAS tensorwise GEMM and "
    "rescales the output by the row/column scales, which under torch.compile costs at least one extra Triton "
    "kernel per GEMM; the forward GEMM (use_fast_accum=True) runs the CUTLASS rowwise kernel"
)
DIM1_CAST = (
    "modelling assumption, fitted: a rowwise cast along dim1 reduces over rows and writes the fp8 tensor "
    "transposed (strided reads or writes), so it reaches a lower share of HBM bandwidth than the dim0 cast; "
    "torchao later added dedicated dim1 cast kernels for this reason (torchao/prototype/mx_formats)"
)
DEEPGEMM = ("deepseek-ai/DeepGEMM README: fine-grained (1x128 / 128x128) FP8 GEMM reaches up to ~1550 "
            "TFLOPS on H800, i.e. close to but below per-tensor FP8 because scales are applied in the "
            "main loop on CUDA cores")


@dataclass(frozen=True)
class GemmConstants:
    """The model's constants, each with its public source, a fit, or stated as a modelling assumption."""

    num_sms: int = 132
    achievable_gemm_frac: float = 0.78  # bf16: of the dense peak, large shapes
    fp8_gemm_frac: float = 0.78  # fp8 (tensorwise): of the dense peak, large shapes
    achievable_mem_frac: float = 0.92  # of HBM bandwidth, pointwise kernels
    cast_mem_frac: float = 0.92  # of HBM bandwidth, FP8 amax/scale/cast kernels
    dim1_cast_mem_frac: float = 0.5  # of HBM bandwidth, rowwise casts along dim1 (transposed), compile mode
    # compile mode: the GPU time of a kernel cannot be shorter than the host needs to launch it
    # (inductor's Python wrapper, no CUDA graphs); 0 = launches are always hidden
    compile_launch_floor_s: float = 0.0
    # torchao's rowwise recipes: backward GEMMs on cuBLAS tensorwise (fp32 out) + a rescale kernel
    rowwise_bwd_rescale: bool = True
    kernel_overhead_s: float = 2e-6  # per kernel launch (GPU-side), pointwise kernels
    gemm_overhead_s: float = 2e-6  # per GEMM launch (GPU-side: prologue, epilogue, scheduling)
    eager_op_overhead_s: float = 6e-6  # per eager aten op: host dispatch + launch, hides nothing
    fp32_gemm_frac: float = 0.80  # fp32 SIMT GEMM (no TF32) of the 67 TFLOPS fp32 peak
    rowwise_gemm_factor: float = 0.95  # rowwise-scaled (CUTLASS) FP8 GEMM throughput vs tensorwise
    # relative GEMM throughput of the other FP8 recipes against tensorwise
    recipe_gemm_factor: dict[str, float] = field(
        default_factory=lambda: {"tensorwise": 1.0, "block128": 0.90, "mx32": 1.0}
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
            "fp8_gemm_frac": TORCHAO_ROOFLINE,
            "achievable_mem_frac": TORCHAO_ROOFLINE,
            "cast_mem_frac": TORCHAO_ROOFLINE + " (prior: the pointwise figure)",
            "kernel_overhead_s": TORCHAO_ROOFLINE,
            "dim1_cast_mem_frac": DIM1_CAST,
            "compile_launch_floor_s": "modelling assumption, fitted: inductor launches each kernel from Python "
                                      "(a few us); kernels shorter than that leave the GPU idle",
            "rowwise_bwd_rescale": TORCHAO_RESCALE,
            "gemm_overhead_s": TORCHAO_ROOFLINE + " (same launch overhead assumed for GEMMs)",
            "eager_op_overhead_s": "modelling assumption: ~5-10 us host dispatch per eager PyTorch op",
            "fp32_gemm_frac": "modelling assumption: SIMT fp32 GEMMs reach ~80% of the fp32 peak",
            "rowwise_gemm_factor": "modelling assumption (scales applied in the epilogue)",
            "recipe_gemm_factor": "block128: " + DEEPGEMM + "; mx32 is not native on Hopper (dequantize + bf16 GEMM)",
            "tiles": CUTLASS_TILES,
            "k_tile": CUTLASS_TILES,
            "k_fill_tiles": "modelling assumption: a multistage (TMA) pipeline fills ~2 K-tiles before the MMAs run",
            "max_split_k": "cuBLAS/CUTLASS split-K (and stream-K) GEMMs for few output tiles; bounds are assumptions",
            "cast_kernels": TORCHAO_KERNELS,
            "peaks_and_bandwidth": "cost_models/hardware.py (device datasheet figures)",
        }
    )

    def recipe_factor(self, recipe: str) -> float:
        if recipe in ("rowwise", "rowwise_with_gw_hp"):
            return self.rowwise_gemm_factor
        return self.recipe_gemm_factor.get(recipe, 1.0)


PRIOR_CONSTANTS = GemmConstants()


def load_fitted_constants(path: Path = FIT_PATH, base: GemmConstants = PRIOR_CONSTANTS) -> GemmConstants:
    """``base`` with the fields fitted by experiments/h100_model_fit.py (``base`` when no fit exists)."""
    if not path.is_file():
        return base
    doc = json.loads(path.read_text())
    fitted = {k: float(v) for k, v in doc.get("constants", {}).items() if k in FITTED_FIELDS}
    sources = dict(base.sources)
    for k in fitted:
        sources[k] = f"fitted to public H100 measurements ({doc.get('source', path.name)})"
    return replace(base, **fitted, sources=sources)


DEFAULT_CONSTANTS = load_fitted_constants()


def model_check(path: Path = FIT_PATH) -> dict[str, Any] | None:
    """How the shipped constants' block speedups fared against timings they were not fitted to (written
    by experiments/h100_model_fit.py beside the constants): None when no check was recorded."""
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("checked")


def check_line(device_name: str, c: dict[str, Any] | None, *, recipes: tuple[str, ...] = (), mode: str | None = None,
               device: DeviceSpec | None = None) -> str:
    """One line for any output that shows a modelled FP8 speedup: how far to trust it, from
    :func:`model_check`'s record. The check is of the H100 model on the recipes and mode it timed;
    another device, recipe or mode was never checked against a measurement, and a device whose FP8
    rate is a modelling assumption (``device``'s sources) says so."""
    line = _check_text(device_name, c)
    timed_recipes, timed_modes = (c or {}).get("recipes"), (c or {}).get("modes")
    outside = [f"recipe {r}" for r in recipes if timed_recipes and r not in timed_recipes]
    outside += [f"mode {mode}"] if mode is not None and timed_modes and mode not in timed_modes else []
    if outside:
        line += (f"; {' and '.join(outside)} outside the check (it timed {', '.join(timed_recipes)} in "
                 f"{', '.join(timed_modes)} mode): those speedups are unchecked")
    fp8_rate = (device.sources.get("peak_flops_fp8", "") if device is not None else "")
    if fp8_rate.startswith("modelling assumption: "):
        line += f"; {fp8_rate.removeprefix('modelling assumption: ')} (a modelling assumption)"
    return line


def _check_text(device_name: str, c: dict[str, Any] | None) -> str:
    if c is None:
        return "the speed model was not checked against a measurement: read its speedups as unverified"
    # a device measured on its own (by_device) is quoted with its own figures; another device with the
    # H100's, or (no H100 run on record) with the first device measured
    by_device = c.get("by_device", {})
    own = by_device.get(device_name.lower()) or c.get("own_measurement") or next(iter(by_device.values()))
    pub = c["published_leave_one_source_out"]
    line = (f"the block speed model, checked on timings it was not fitted to: on {own['n']} fwd+bwd blocks "
            f"{own['what']}, speedups off by {own['mape_pct']:.0f}% (mean absolute), FP8 faster or slower called "
            f"right in {own['fast_slow_pct']:.0f}% ({own['fast_slow_resolved_pct']:.0f}% of the "
            f"{own['fast_slow_resolved_n']} the repeat run resolves)"
            + "".join(f"; in another run pair (another machine start) {o['mape_pct']:.0f}% and "
                      f"{o['fast_slow_pct']:.0f}%" for o in own.get("other_leases", []))
            + f"; on {pub['n']} published blocks "
            f"(leave one source out) {pub['mape_pct']:.0f}% and {pub['fast_slow_pct']:.0f}%: a guide to where "
            f"FP8 pays, not a measured speedup")
    if device_name.lower() not in {d.lower() for d in c["devices"]}:
        line += f"; {device_name} itself was never checked"
    return line


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
    gradients of skinny layers: tiny output, K = batch rows): a split in ``s`` parts computes like an
    ``(s*m, k/s, n)`` GEMM (reading the operands once) plus a reduction of ``s`` fp32 partial
    outputs; the fastest is taken.
    """
    _check_dims(m, k, n)
    _check_precision(precision, recipe)
    c = constants
    best = _gemm_time_one_pass(m, k, n, precision, recipe, device, c)
    s = 2
    while s <= c.max_split_k and k // s >= c.min_split_k_len:
        reduce_s = (s * m * n * 4 + m * n * BYTES["bf16"]) / (device.hbm_bw * c.achievable_mem_frac) + c.kernel_overhead_s
        best = min(best, _gemm_time_one_pass(m, k, n, precision, recipe, device, c, split=s) + reduce_s)
        s *= 2
    return best


def _gemm_time_one_pass(m: int, k: int, n: int, precision: str, recipe: str | None, device: DeviceSpec,
                        c: GemmConstants, split: int = 1) -> float:
    """One GEMM launch; ``split`` > 1: split-K, the tiles of an ``(split*m, k/split, n)`` problem (more
    tiles to fill the SMs, shorter main loops) while the operands are still read once in full."""
    if precision == "fp8":
        recipe = recipe or "tensorwise"
        if recipe == "mx32" and device.name not in MX_NATIVE_DEVICES:
            # no MX tensor cores: dequantize both operands to bf16 (read fp8 + scales, write bf16), bf16 GEMM
            deq_bytes = (m * k + k * n) * (1 + 1 / 32 + 2)
            deq = deq_bytes / (device.hbm_bw * c.achievable_mem_frac) + 2 * c.kernel_overhead_s
            return deq + _gemm_time_one_pass(m, k, n, "bf16", None, device, c, split)
        k, n = _pad16(k), _pad16(n)
        peak = device.peak_flops_fp8 * c.fp8_gemm_frac * c.recipe_factor(recipe)
        in_bytes = (m * k + k * n) * BYTES["fp8"]
        if recipe == "block128":
            in_bytes += 4 * (m * k / 128 + k * n / (128 * 128))
        elif recipe == "mx32":
            in_bytes += (m * k + k * n) / 32
        elif recipe in ("rowwise", "rowwise_with_gw_hp"):
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
    compute = 2.0 * m * k * n / (peak * small_gemm_efficiency(m * split, max(k // split, 1), n, precision, c))
    memory = (in_bytes + out_bytes) / (device.hbm_bw * c.achievable_mem_frac)
    return max(compute, memory) + c.gemm_overhead_s


@dataclass(frozen=True)
class Kernel:
    """One kernel of a modelled block: what it is, which pass, its traffic/work, and its time."""

    name: str
    phase: Literal["fwd", "bwd"]
    kind: Literal["gemm", "cast", "norm", "act"]
    bytes: float
    flops: float
    time_s: float


class _Builder:
    """Collects a block's kernels; memory-bound ones cost ``bytes / (bw * frac) + launch`` and, in
    eager mode, at least the host dispatch time of one op."""

    def __init__(self, device: DeviceSpec, c: GemmConstants, mode: str):
        self.device, self.c, self.mode = device, c, mode
        self.kernels: list[Kernel] = []

    def _floor(self, t: float) -> float:
        return max(t, self.c.eager_op_overhead_s if self.mode == "eager" else self.c.compile_launch_floor_s)

    def mem(self, name: str, phase: str, kind: str, nbytes: float, frac: float | None = None) -> None:
        if frac is None:
            frac = self.c.cast_mem_frac if kind == "cast" else self.c.achievable_mem_frac
        t = nbytes / (self.device.hbm_bw * frac) + self.c.kernel_overhead_s
        self.kernels.append(Kernel(name, phase, kind, float(nbytes), 0.0, self._floor(t)))  # type: ignore[arg-type]

    def gemm(self, name: str, phase: str, gm: int, gk: int, gn: int, precision: str, recipe: str | None) -> None:
        rescale = (precision == "fp8" and phase == "bwd" and recipe in ("rowwise", "rowwise_with_gw_hp")
                   and self.c.rowwise_bwd_rescale)
        if rescale:  # cuBLAS tensorwise GEMM writing fp32, then a rescale kernel (TORCHAO_RESCALE)
            t = gemm_time_s(gm, gk, gn, precision, "tensorwise", self.device, constants=self.c)  # type: ignore[arg-type]
            t += gm * gn * (BYTES["fp32"] - BYTES["bf16"]) / (self.device.hbm_bw * self.c.achievable_mem_frac)
        else:
            t = gemm_time_s(gm, gk, gn, precision, recipe, self.device, constants=self.c)  # type: ignore[arg-type]
        eb = 4 if precision == "fp32" or rescale else 2
        nbytes = (gm * gk + gk * gn) * BYTES[precision] + gm * gn * eb
        self.kernels.append(Kernel(name, phase, "gemm", float(nbytes), 2.0 * gm * gk * gn, self._floor(t)))  # type: ignore[arg-type]
        if rescale:
            self.mem(f"{name}.rescale", phase, "cast", gm * gn * (BYTES["fp32"] + BYTES["bf16"]) + 4 * (gm + gn))


def _layouts(role: str, recipe: str) -> tuple[str, ...]:
    """The fp8 layouts of a tensor a recipe needs: dim0 for the first GEMM that uses it, dim1
    (transposed) for the second; rowwise_with_gw_hp runs grad-weight in bf16, so only the weight
    (used by the fwd and grad-input GEMMs) needs both."""
    if recipe == "rowwise_with_gw_hp" and role != "weight":
        return ("dim0",)
    return ("dim0", "dim1")


def _cast_kernels(b: _Builder, role: str, d0: int, d1: int, recipe: str, fused_read: bool, phase: str) -> None:
    """The kernels torchao's float8 training launches to turn a bf16 ``[d0, d1]`` tensor into the
    fp8 tensors (and scales) its GEMMs take; ``fused_read``: compile mode fuses the first read of
    the tensor into the preceding norm / activation-backward kernel (no launch, no extra read)."""
    numel = d0 * d1
    b16, b8 = BYTES["bf16"] * numel, BYTES["fp8"] * numel
    layouts = _layouts(role, recipe)
    if b.mode == "eager":
        # hp_tensor_to_float8_dynamic in eager: abs -> amax -> scale (clamp, reciprocal, multiply,
        # a power-of-two round for rowwise) -> upcast to fp32 -> multiply -> clamp -> downcast.
        # Tensorwise: one scale, so the dim1 copy is a contiguous transpose of the fp8 tensor;
        # the rowwise recipes scale the transposed view again, then make it contiguous.
        scaled = layouts[:1] if recipe == "tensorwise" else layouts
        for lay in scaled:
            p = f"{role}.{lay}"
            b.mem(f"{p}.abs", phase, "cast", 2 * b16)
            b.mem(f"{p}.amax", phase, "cast", b16)
            for op in ("clamp", "reciprocal", "mul") + (("pow2",) if recipe != "tensorwise" else ()):
                b.mem(f"{p}.scale_{op}", phase, "cast", 0)
            b.mem(f"{p}.to_fp32", phase, "cast", b16 + 4 * numel)
            b.mem(f"{p}.mul", phase, "cast", 8 * numel)
            b.mem(f"{p}.clamp", phase, "cast", 8 * numel)
            b.mem(f"{p}.to_fp8", phase, "cast", 4 * numel + b8)
        if "dim1" in layouts:
            b.mem(f"{role}.dim1.contiguous_t", phase, "cast", 2 * b8)
        return
    if recipe == "tensorwise":
        if not fused_read:
            b.mem(f"{role}.amax_stage1", phase, "cast", b16)
        b.mem(f"{role}.amax_stage2_scale", phase, "cast", 0)
        b.mem(f"{role}.cast_dim0_dim1", phase, "cast", b16 + len(layouts) * b8)
        return
    scale_div = {"rowwise": d1, "rowwise_with_gw_hp": d1, "block128": 128, "mx32": 32}[recipe]
    scale_bytes = 1 if recipe == "mx32" else 4
    for i, lay in enumerate(layouts):
        if recipe == "block128" and role == "weight" and lay == "dim1":
            # 128x128 weight blocks serve both orientations: a transposed fp8 copy suffices
            b.mem(f"{role}.transpose_dim1", phase, "cast", 2 * b8)
            continue
        read = 0 if (i == 0 and fused_read) else b16
        frac = b.c.dim1_cast_mem_frac if (lay == "dim1" and recipe in ("rowwise", "rowwise_with_gw_hp")) else None
        b.mem(f"{role}.amax_scale_cast_{lay}", phase, "cast", read + b8 + scale_bytes * numel / scale_div, frac)


def linear_block_kernels(m: int, k: int, n: int, precision: Precision = "bf16", recipe: str | None = None, *,
                         norm_before: bool = False, act_after: str | None = None,
                         device: DeviceSpec = H100_SXM, fuse_casts: bool = True, mode: str = "compile",
                         norm_affine: bool = True,
                         constants: GemmConstants = DEFAULT_CONSTANTS) -> list[Kernel]:
    """Every kernel of one linear layer's fwd+bwd, with its modelled time (see the module docstring).

    ``mode``: ``compile`` or ``eager``; ``fuse_casts`` (compile only): fuse the first read of the
    input / grad-output casts into the norm / activation kernels. ``norm_affine``: the norm has a
    weight and bias (their gradients cost a reduction kernel).
    """
    _check_dims(m, k, n)
    _check_precision(precision, recipe)
    if act_after is not None and act_after not in ACTIVATIONS:
        raise ValueError(f"act_after must be one of {', '.join(ACTIVATIONS)} or None, got {act_after!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    fuse = fuse_casts and mode == "compile"
    b = _Builder(device, constants, mode)
    eb = 4 if precision == "fp32" else 2
    if norm_before:
        # LayerNorm fwd: read x, write y (+ per-row mean/rstd)
        b.mem("norm.fwd", "fwd", "norm", 2 * m * k * eb)
    recipe = (recipe or "tensorwise") if precision == "fp8" else None
    if recipe is not None:
        _cast_kernels(b, "input", m, k, recipe, fuse and norm_before, "fwd")
        _cast_kernels(b, "weight", n, k, recipe, False, "fwd")
    b.gemm("gemm.fwd", "fwd", m, k, n, precision, recipe)
    if act_after:
        b.mem(f"{act_after}.fwd", "fwd", "act", 2 * m * n * eb)
        # activation backward: read y (or x) and dy, write dx
        b.mem(f"{act_after}.bwd", "bwd", "act", 3 * m * n * eb)
    if recipe is not None:
        _cast_kernels(b, "grad_output", m, n, recipe, fuse and bool(act_after), "bwd")
    b.gemm("gemm.grad_input", "bwd", m, n, k, precision, recipe)
    gw_prec, gw_recipe = (("bf16", None) if recipe == "rowwise_with_gw_hp" else (precision, recipe))
    b.gemm("gemm.grad_weight", "bwd", n, m, k, gw_prec, gw_recipe)
    if norm_before:
        b.mem("norm.bwd", "bwd", "norm", 3 * m * k * eb)
        if norm_affine:
            b.mem("norm.bwd_params", "bwd", "norm", 2 * m * k * eb)
    return b.kernels


def linear_block_time_s(m: int, k: int, n: int, precision: Precision = "bf16", recipe: str | None = None, *,
                        norm_before: bool = False, act_after: str | None = None,
                        device: DeviceSpec = H100_SXM, fuse_casts: bool = True, mode: str = "compile",
                        norm_affine: bool = True, constants: GemmConstants = DEFAULT_CONSTANTS) -> float:
    """Modelled fwd+bwd time (s) of [norm ->] linear [-> activation], with FP8 cast/scale kernels."""
    return sum(k_.time_s for k_ in linear_block_kernels(
        m, k, n, precision, recipe, norm_before=norm_before, act_after=act_after, device=device,
        fuse_casts=fuse_casts, mode=mode, norm_affine=norm_affine, constants=constants))


def block_speedup(m: int, k: int, n: int, recipe: str = "tensorwise", *, norm_before: bool = False,
                  act_after: str | None = None, device: DeviceSpec = H100_SXM, fuse_casts: bool = True,
                  mode: str = "compile", norm_affine: bool = True,
                  constants: GemmConstants = DEFAULT_CONSTANTS) -> dict[str, float]:
    """bf16 vs FP8 fwd+bwd block times (ms) and the speedup (> 1: FP8 faster). Modelled; the bf16
    block runs in the same mode."""
    kw = dict(norm_before=norm_before, act_after=act_after, device=device, fuse_casts=fuse_casts, mode=mode,
              norm_affine=norm_affine, constants=constants)
    bf16 = linear_block_time_s(m, k, n, "bf16", None, **kw)
    fp8 = linear_block_time_s(m, k, n, "fp8", recipe, **kw)
    return {"bf16_ms": bf16 * 1e3, "fp8_ms": fp8 * 1e3, "speedup": bf16 / fp8}


def constants_table(constants: GemmConstants = DEFAULT_CONSTANTS) -> dict:
    """The constants and their sources, for result files."""
    return asdict(constants)
