import math

import pytest
import torch

from fp8.kernels import KERNELS, Fp8Linear, default_kernel, swap_linears
from fp8.recipes import (
    FP8_MAX,
    dequantize,
    fake_quantize,
    linear_gemm_errors,
    quantize,
    scaled_matmul,
    scaled_mm_unsupported,
    sqnr_db,
)


def _x(m=256, k=96, seed=0):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "block128", "mx32"])
def test_quantize_round_trip_is_close_and_in_range(recipe):
    x = _x()
    q, s = quantize(x, "e4m3", recipe)
    assert q.dtype == torch.float8_e4m3fn
    back = dequantize(q, s, recipe, x.shape[1])
    assert back.shape == x.shape
    assert 25.0 < sqnr_db(x, back) < 45.0  # e4m3: 3 mantissa bits, ~30 dB
    assert q.float().abs().max() <= FP8_MAX["e4m3"]


def test_mx_scales_are_powers_of_two_and_blocks_pad():
    x = _x(8, 70)  # 70 is not a multiple of 32: padded
    q, s = quantize(x, "e4m3", "mx32")
    assert s.shape == (8, 3) and q.shape == (8, 96)
    assert torch.equal(torch.log2(s), torch.round(torch.log2(s)))


def test_e5m2_has_range_but_less_precision():
    x = _x() * 1e-4
    assert sqnr_db(x, fake_quantize(x, "e5m2", "tensorwise")) < sqnr_db(x, fake_quantize(x, "e4m3", "tensorwise"))


def test_real_scaled_mm_matches_emulation_and_fp32_within_fp8_error():
    a, b = _x(64, 48, 1), _x(40, 48, 2)
    ref = a @ b.t()
    for recipe in ("tensorwise", "rowwise"):
        assert scaled_mm_unsupported(torch.device("cpu"), recipe, 64, 48, 40, "e4m3", "e4m3") is None
        real = scaled_matmul(a, b, recipe, real=True)
        emu = scaled_matmul(a, b, recipe, real=False)
        assert sqnr_db(emu, real) > 60  # same arithmetic up to summation order
        assert 20 < sqnr_db(ref, real) < 40


def test_rowwise_beats_tensorwise_when_rows_differ_in_scale():
    # rows spanning 8 orders of magnitude: one tensor scale flushes the small rows to zero
    x = _x(128, 64) * torch.logspace(-8, 0, 128)[:, None]
    w = _x(32, 64, 3)
    ref = x @ w.t()
    rel = lambda r: ((scaled_matmul(x, w, r) - ref).norm(dim=1) / ref.norm(dim=1)).mean().item()
    assert rel("rowwise") < 0.1 < rel("tensorwise")


def test_linear_gemm_errors_gives_three_gemms():
    x, w, dy = _x(64, 32), _x(16, 32, 5), _x(64, 16, 6) * 1e-3
    e = linear_gemm_errors(x, w, dy, ["bf16", "rowwise"])
    assert set(e["rowwise"]) == {"fwd", "grad_input", "grad_weight"}
    assert all(e["bf16"][g][0] > e["rowwise"][g][0] + 15 for g in e["bf16"])
    assert all(0 < rel < 0.2 for _, rel in e["rowwise"].values())


@pytest.mark.parametrize("kernel", ["scaled_mm_tensorwise", "scaled_mm_rowwise", "emulated_block128", "emulated_mx32", "bf16"])
def test_fp8_linear_gradients_match_fp32(kernel):
    torch.manual_seed(0)
    ref = torch.nn.Linear(48, 24)
    x = torch.randn(4, 8, 48)  # leading dims are flattened and restored
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref = ref(x1)
    target = torch.randn_like(y_ref)
    ((y_ref - target) ** 2).mean().backward()
    gw_ref, gb_ref = ref.weight.grad.clone(), ref.bias.grad.clone()
    ref.zero_grad()
    f8 = Fp8Linear.from_linear(ref, kernel, track_error=True)
    y = f8(x2)
    assert y.shape == y_ref.shape
    ((y - target) ** 2).mean().backward()
    min_db = 40 if kernel == "bf16" else 18
    assert sqnr_db(y_ref, y) > min_db
    assert sqnr_db(x1.grad, x2.grad) > min_db
    assert sqnr_db(gw_ref, f8.weight.grad) > min_db
    assert sqnr_db(gb_ref, f8.bias.grad) > min_db
    assert all(len(v) == 1 for v in f8.error_log.sqnr.values())


def test_swap_shares_parameters_and_rejects_non_linear():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    w0 = model[0].weight
    swap_linears(model, {"0": "scaled_mm_rowwise"})
    assert isinstance(model[0], Fp8Linear) and model[0].weight is w0
    with pytest.raises(KeyError):
        swap_linears(model, {"1": "bf16"})
    assert default_kernel("rowwise").name == "scaled_mm_rowwise"
    assert default_kernel("block128").name == "emulated_block128"
    assert set(KERNELS) >= {"fp32", "bf16", "scaled_mm_tensorwise", "scaled_mm_rowwise"}
    assert math.isfinite(sqnr_db(torch.ones(3), torch.ones(3) * 1.01))


def test_rowwise_with_gw_hp_keeps_grad_weight_in_bf16():
    from fp8.kernels import KERNELS, Fp8Linear
    from fp8.recipes import RECIPES, linear_gemm_errors

    assert RECIPES["rowwise_with_gw_hp"].fp8_roles() == ("fwd", "grad_input")
    g = torch.Generator().manual_seed(0)
    x, w, dy = torch.randn(64, 48, generator=g), torch.randn(32, 48, generator=g), torch.randn(64, 32, generator=g)
    errs = linear_gemm_errors(x, w, dy, ["rowwise", "bf16", "rowwise_with_gw_hp"])
    hp = errs["rowwise_with_gw_hp"]
    # the same forward casts as rowwise; grad-input casts the weight tensorwise (torchao), not rowwise
    assert hp["fwd"] == errs["rowwise"]["fwd"]
    assert hp["grad_weight"] == errs["bf16"]["grad_weight"]
    assert hp["grad_weight"][0] > errs["rowwise"]["grad_weight"][0] + 10  # bf16 is far more accurate
    # the layer's weight gradient is the bf16 one, its forward the rowwise one
    for name in ("scaled_mm_rowwise_with_gw_hp", "emulated_rowwise_with_gw_hp"):
        assert KERNELS[name].unavailable("cpu", 64, 48, 32) is None
        lin = torch.nn.Linear(48, 32, bias=False)
        with torch.no_grad():
            lin.weight.copy_(w)
        f = Fp8Linear.from_linear(lin, name)
        xi = x.clone().requires_grad_(True)
        f(xi).backward(dy)
        ref_dw = (dy.bfloat16().t().float() @ x.bfloat16().float())
        assert torch.allclose(lin.weight.grad, (dy.t().bfloat16() @ x.bfloat16()).float(), rtol=1e-2, atol=1e-2)
        assert torch.allclose(lin.weight.grad, ref_dw, rtol=1e-2, atol=1e-2)
