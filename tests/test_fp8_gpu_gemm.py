import math

import pytest

from cost_models.gpu_gemm import (
    DEFAULT_CONSTANTS,
    block_speedup,
    gemm_time_s,
    linear_block_kernels,
    linear_block_time_s,
    small_gemm_efficiency,
)
from cost_models.hardware import H100_SXM, H200_SXM


def test_large_gemm_approaches_achievable_peak():
    s = 16384
    for prec, peak in (("bf16", H100_SXM.peak_flops_bf16), ("fp8", H100_SXM.peak_flops_fp8)):
        achieved = 2 * s**3 / gemm_time_s(s, s, s, prec)
        assert 0.65 * peak < achieved <= DEFAULT_CONSTANTS.achievable_gemm_frac * peak


def test_small_gemms_are_inefficient_and_overhead_bound():
    assert small_gemm_efficiency(128, 64, 128) < 0.2 < small_gemm_efficiency(8192, 8192, 8192)
    # a tiny GEMM costs at least the launch overhead, far above its FLOP time
    assert gemm_time_s(16, 16, 16, "fp8") >= DEFAULT_CONSTANTS.kernel_overhead_s


def test_fp8_block_slower_when_small_faster_when_large():
    small = block_speedup(1024, 1024, 1024, "tensorwise", norm_before=True, act_after="sigmoid")
    large = block_speedup(16384, 16384, 16384, "tensorwise", norm_before=True, act_after="sigmoid")
    assert small["speedup"] < 1.0 < large["speedup"] < 2.0
    # a pure GEMM speedup is bounded by the ratio of the achievable fp8/bf16 peaks
    c = DEFAULT_CONSTANTS
    ratio = gemm_time_s(16384, 16384, 16384, "bf16") / gemm_time_s(16384, 16384, 16384, "fp8")
    bound = H100_SXM.peak_flops_fp8 * c.fp8_gemm_frac / (H100_SXM.peak_flops_bf16 * c.achievable_gemm_frac)
    assert large["speedup"] < ratio <= bound * (1 + 1e-9)


def test_block_accounts_for_casts_norm_and_activation():
    plain = linear_block_kernels(4096, 1024, 1024, "fp8", "rowwise")
    full = linear_block_kernels(4096, 1024, 1024, "fp8", "rowwise", norm_before=True, act_after="sigmoid")
    kinds = {k.kind for k in full}
    assert kinds == {"gemm", "cast", "norm", "act"}
    assert sum(k.kind == "gemm" for k in full) == 3
    assert math.isclose(linear_block_time_s(4096, 1024, 1024, "fp8", "rowwise"), sum(k.time_s for k in plain))
    # fusion with the norm/activation removes the first read of the input and grad-output casts
    unfused = linear_block_time_s(4096, 1024, 1024, "fp8", "rowwise", norm_before=True, act_after="sigmoid",
                                  fuse_casts=False)
    assert sum(k.time_s for k in full) < unfused


def test_mx_not_native_on_hopper_and_bandwidth_matters():
    s = 8192
    assert gemm_time_s(s, s, s, "fp8", "mx32") > gemm_time_s(s, s, s, "bf16")
    # a memory-bound GEMM (a matrix-vector product) is faster on the higher-bandwidth H200
    assert gemm_time_s(1, 8192, 8192, "bf16", device=H200_SXM) < gemm_time_s(1, 8192, 8192, "bf16")


def test_bad_input_raises():
    with pytest.raises(ValueError, match="precision"):
        gemm_time_s(10, 10, 10, "fp16")
    with pytest.raises(ValueError, match="recipe"):
        gemm_time_s(10, 10, 10, "fp8", "blockwise")
    with pytest.raises(ValueError, match="k must be"):
        gemm_time_s(10, 0, 10)
    with pytest.raises(ValueError, match="act_after"):
        linear_block_time_s(10, 10, 10, act_after="tanhh")


def test_split_k_rescues_tiny_output_long_k_gemms():
    # a weight gradient of a skinny layer: 8x14 output, K = 16384 batch rows
    t = gemm_time_s(8, 16384, 14, "bf16")
    one_pass = 2 * 8 * 16384 * 14 / (H100_SXM.peak_flops_bf16 * small_gemm_efficiency(8, 16384, 14))
    assert t < 20e-6 < one_pass


def test_split_k_reads_the_operands_once():
    # a GEMV reads its whole weight whatever the split: no faster than the HBM roofline
    t = gemm_time_s(1, 5376, 12288, "bf16")
    roofline = 5376 * 12288 * 2 / (H100_SXM.hbm_bw * DEFAULT_CONSTANTS.achievable_mem_frac)
    assert t >= roofline


def test_recipes_launch_torchao_kernels_per_tensor_and_direction():
    def names(recipe, mode="compile", **kw):
        return [k.name for k in linear_block_kernels(2048, 1024, 1024, "fp8", recipe, mode=mode, **kw) if k.kind == "cast"]

    tw = names("tensorwise")
    assert {"input.amax_stage1", "weight.amax_stage1", "grad_output.amax_stage1"} <= set(tw)
    rw = names("rowwise")
    for role in ("input", "weight", "grad_output"):
        assert f"{role}.amax_scale_cast_dim0" in rw and f"{role}.amax_scale_cast_dim1" in rw
    hp = names("rowwise_with_gw_hp")
    # grad-weight in bf16: only the weight needs its transposed fp8 copy
    assert "weight.amax_scale_cast_dim1" in hp and "input.amax_scale_cast_dim1" not in hp
    assert "grad_output.amax_scale_cast_dim1" not in hp
    gw = [k for k in linear_block_kernels(2048, 1024, 1024, "fp8", "rowwise_with_gw_hp") if k.name == "gemm.grad_weight"]
    assert gw[0].bytes == (1024 * 2048 + 2048 * 1024) * 2 + 1024 * 1024 * 2  # a bf16 GEMM
    # compile fuses the first read into the norm; eager launches many more, slower kernels
    assert "input.amax_stage1" not in names("tensorwise", norm_before=True)
    eager = linear_block_kernels(2048, 1024, 1024, "fp8", "rowwise", mode="eager")
    assert len([k for k in eager if k.kind == "cast"]) > 3 * len(rw)
    assert linear_block_time_s(2048, 1024, 1024, "fp8", "rowwise", mode="eager") > \
        linear_block_time_s(2048, 1024, 1024, "fp8", "rowwise")
    with pytest.raises(ValueError, match="mode"):
        linear_block_time_s(8, 8, 8, mode="jit")


def test_fitted_constants_are_loaded_with_their_source():
    from cost_models.gpu_gemm import FIT_PATH, PRIOR_CONSTANTS, load_fitted_constants

    c = load_fitted_constants()
    if FIT_PATH.is_file():
        assert "fitted" in c.sources["fp8_gemm_frac"]
    assert load_fitted_constants(FIT_PATH.with_name("absent.json")) == PRIOR_CONSTANTS


def test_rowwise_backward_gemms_pay_torchao_rescale_and_dim1_casts_cost_more():
    from dataclasses import replace

    ks = linear_block_kernels(4096, 4096, 1024, "fp8", "rowwise", norm_before=True, act_after="sigmoid")
    names = {k.name for k in ks}
    # torchao's rowwise backward GEMMs: cuBLAS tensorwise + one rescale kernel each; the forward has none
    assert {"gemm.grad_input.rescale", "gemm.grad_weight.rescale"} <= names and "gemm.fwd.rescale" not in names
    gw_hp = {k.name for k in linear_block_kernels(4096, 4096, 1024, "fp8", "rowwise_with_gw_hp")}
    assert "gemm.grad_input.rescale" in gw_hp and "gemm.grad_weight.rescale" not in gw_hp
    assert not any(k.name.endswith(".rescale") for k in linear_block_kernels(4096, 4096, 1024, "fp8", "tensorwise"))
    slow = replace(DEFAULT_CONSTANTS, dim1_cast_mem_frac=0.1)
    fast = replace(DEFAULT_CONSTANTS, dim1_cast_mem_frac=1.0)
    kw = dict(norm_before=True, act_after="sigmoid")
    assert block_speedup(4096, 4096, 1024, "rowwise", constants=slow, **kw)["speedup"] < \
        block_speedup(4096, 4096, 1024, "rowwise", constants=fast, **kw)["speedup"]
    # tensorwise has no dim1 rowwise cast: unaffected
    assert math.isclose(block_speedup(4096, 4096, 1024, "tensorwise", constants=slow, **kw)["speedup"],
                        block_speedup(4096, 4096, 1024, "tensorwise", constants=fast, **kw)["speedup"])
    # a compile-mode launch floor makes small blocks (many short FP8 kernels) slower relative to bf16
    floor = replace(DEFAULT_CONSTANTS, compile_launch_floor_s=10e-6)
    assert block_speedup(1024, 1024, 1024, "rowwise", constants=floor, **kw)["speedup"] < \
        block_speedup(1024, 1024, 1024, "rowwise", **kw)["speedup"]
