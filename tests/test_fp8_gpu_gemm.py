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
    # a pure GEMM speedup is bounded by the fp8/bf16 peak ratio
    ratio = gemm_time_s(16384, 16384, 16384, "bf16") / gemm_time_s(16384, 16384, 16384, "fp8")
    assert large["speedup"] < ratio <= H100_SXM.peak_flops_fp8 / H100_SXM.peak_flops_bf16


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
    # a memory-bound GEMM (skinny) is faster on the higher-bandwidth H200
    assert gemm_time_s(65536, 64, 64, "bf16", device=H200_SXM) < gemm_time_s(65536, 64, 64, "bf16")


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
