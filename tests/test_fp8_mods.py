"""Each Mod with the case where it helps."""

import torch
from torch import nn

from fp8.kernels import Fp8Linear, swap_linears
from fp8.mods import (
    clamp_outliers,
    cuda_fp8_shape_problem,
    keep_first_last,
    normalize_rows,
    pad_dims,
    smooth_channels,
    suggest_mods,
)
from fp8.recipes import sqnr_db


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _fp8(model, names, kernel="scaled_mm_tensorwise"):
    return swap_linears(model, {n: kernel for n in names})


def _row_err(ref, y):
    return ((y - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)).mean().item()


def test_pad_dims_makes_odd_gemms_fp8_eligible_and_preserves_the_function():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(13, 30))  # DLRM's 13 dense features: not a multiple of 16
    x = torch.randn(64, 13)
    ref = model(x)
    assert cuda_fp8_shape_problem(13, 30)
    pad_dims(model, ["0"])
    inner = model[0].linear
    assert cuda_fp8_shape_problem(inner.in_features, inner.out_features) is None
    assert torch.allclose(model(x), ref, atol=1e-6)
    model(x).sum().backward()  # pads get zero gradients and stay zero
    assert inner.weight.grad[30:].abs().sum() == 0 and inner.weight.grad[:, 13:].abs().sum() == 0


def test_normalize_rows_rescues_tensorwise_when_rows_span_decades():
    torch.manual_seed(0)
    lin = nn.Linear(64, 32)
    x = torch.randn(256, 64, generator=_g(1)) * torch.logspace(-8, 0, 256)[:, None]
    ref = lin(x).detach()
    plain = _fp8(nn.Sequential(nn.Linear(64, 32)), ["0"])
    plain[0].load_state_dict(lin.state_dict())
    modded = nn.Sequential(nn.Linear(64, 32))
    modded[0].load_state_dict(lin.state_dict())
    normalize_rows(modded, ["0"])
    assert torch.allclose(modded(x), ref, atol=1e-5)  # function-preserving in fp32
    _fp8(modded, ["0.linear"])
    assert _row_err(ref - lin.bias, modded(x) - lin.bias) < 0.1 < _row_err(ref - lin.bias, plain(x) - lin.bias)


def test_smooth_channels_helps_rowwise_with_channel_outliers():
    torch.manual_seed(0)
    lin = nn.Linear(128, 32, bias=False)
    x = torch.randn(512, 128, generator=_g(2))
    x[:, :4] *= 1e6  # a few hot input channels with small weights (as in LLM/recsys activations)
    with torch.no_grad():
        lin.weight[:, :4] *= 1e-6
    ref = (x @ lin.weight.t()).detach()
    base = _fp8(nn.Sequential(nn.Linear(128, 32, bias=False)), ["0"], "scaled_mm_rowwise")
    base[0].weight.data.copy_(lin.weight)
    sm = nn.Sequential(nn.Linear(128, 32, bias=False))
    sm[0].weight.data.copy_(lin.weight)
    smooth_channels(sm, {"0": x.abs().amax(dim=0)})
    assert torch.allclose(sm(x), ref, rtol=1e-4, atol=1e-3)
    _fp8(sm, ["0.linear"], "scaled_mm_rowwise")
    assert sqnr_db(ref, sm(x).detach()) > sqnr_db(ref, base(x).detach()) + 6


def test_clamp_outliers_keeps_the_bulk_representable():
    torch.manual_seed(0)
    lin = nn.Linear(64, 16, bias=False)
    x = torch.randn(1024, 64, generator=_g(3))
    x.view(-1)[::5000] = 1e6  # rare, huge outliers: one tensor scale flushes the rest to zero
    ref = (x @ lin.weight.t()).detach()
    base = _fp8(nn.Sequential(nn.Linear(64, 16, bias=False)), ["0"])
    base[0].weight.data.copy_(lin.weight)
    cl = nn.Sequential(nn.Linear(64, 16, bias=False))
    cl[0].weight.data.copy_(lin.weight)
    clamp_outliers(cl, {"0": float(torch.quantile(x.abs().flatten()[:100000], 0.999))})
    _fp8(cl, ["0.linear"])
    assert _row_err(ref, cl(x).detach()) < 0.1 < _row_err(ref, base(x).detach())
    cl(x).pow(2).sum().backward()
    assert cl[0].alpha.grad is not None and cl[0].alpha.grad != 0  # the clamp is learned


def test_keep_first_last_reduces_output_error():
    torch.manual_seed(0)
    dims = [8, 64, 64, 64, 1]
    layers = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    ref_model = nn.Sequential(*layers[:-1])
    x = torch.randn(2048, 8, generator=_g(4)) * torch.logspace(-3, 1, 8)
    ref = ref_model(x).detach()

    def err(keep):
        m = nn.Sequential(*layers[:-1])
        names = [n for n, mod in m.named_modules() if isinstance(mod, nn.Linear)]
        m = _fp8(m, names)
        if keep:
            keep_first_last(m)
        return sqnr_db(ref, m(x).detach()), sum(isinstance(mod, Fp8Linear) for mod in m.modules())

    (s_all, n_all), (s_keep, n_keep) = err(False), err(True)
    assert n_all == 4 and n_keep == 2
    assert s_keep > s_all


def test_suggest_mods_reads_probe_statistics():
    stats = {"x": {"row_spread_log2": 9.0, "col_spread_log2": 1.0, "outlier_frac": 0.0, "dynamic_range_log2": 8.0}}
    assert suggest_mods({"k": 13, "n": 64, "stats": stats}) == ["pad_dims", "normalize_rows"]
    stats = {"x": {"row_spread_log2": 1.0, "col_spread_log2": 7.0, "outlier_frac": 1e-3, "dynamic_range_log2": 20.0}}
    assert suggest_mods({"k": 64, "n": 64, "stats": stats}) == ["smooth_channels", "clamp_outliers"]
