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


def _modded_doc(mods, k=13, n=32, recipe="tensorwise", kernel="emulated_tensorwise"):
    site = {"m": 64, "k": k, "n": n, "recipe": recipe, "kernel": kernel, "safe": True, "fast": True,
            "applied_mods": mods}
    return {"version": 1, "sites": {"0": site}, "module_filter": ["0"]}


def test_placement_carries_mods_and_the_runner_path_applies_them():
    import pytest

    from cubic.core.config import FP8Choice
    from cubic.core.spec import SpecError
    from fp8.mods import ClampedLinear, PaddedLinear, RowNormalizedLinear
    from fp8.placement import parse_placement
    from fp8.runtime import apply_fp8

    mods = [{"name": "pad_dims"}, {"name": "clamp_outliers", "params": {"alpha": 3.0}}, {"name": "normalize_rows"}]
    p = parse_placement(_modded_doc(mods))
    assert [m.name for m in p.sites["0"].applied_mods] == ["pad_dims", "clamp_outliers", "normalize_rows"]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Linear(32, 1))
    apply_fp8(model, FP8Choice(policy="placement", placement=_modded_doc(mods)))
    assert isinstance(model[0], PaddedLinear)
    assert isinstance(model[0].linear, ClampedLinear) and isinstance(model[0].linear.linear, RowNormalizedLinear)
    fp8 = model[0].linear.linear.linear
    assert isinstance(fp8, Fp8Linear) and (fp8.in_features, fp8.out_features) == (16, 32)
    x = torch.randn(64, 13) * 10
    model(x).sum().backward()
    assert model[0].linear.alpha.grad is not None  # the clamp is learned
    with pytest.raises(SpecError, match="alpha"):
        parse_placement(_modded_doc([{"name": "clamp_outliers"}]))
    with pytest.raises(SpecError, match="name"):
        parse_placement(_modded_doc([{"name": "sharpen"}]))


def test_probe_measures_sites_with_their_mods_on():
    from fp8.mods import probe_with_mods, site_mods
    from fp8.probe import Probe

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))

    scales = torch.logspace(-3, 3, 256)[:, None]  # rows spanning 6 decades: one tensor scale fits few

    def runner(model):
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)

        def step(i):
            x = torch.randn(256, 64, generator=_g(i)) * scales
            loss = model(x).pow(2).mean() * 1e-6
            opt.zero_grad()
            loss.backward()
            opt.step()
        return step

    kw = dict(recipes=("tensorwise",), min_batches=3, max_batches=3)
    plain_model = make()
    plain = Probe(plain_model, **kw).run(runner(plain_model)).summary()
    mods = {"0": [{"name": "clamp_outliers", "params": {"alpha": 2.0}}], "2": [{"name": "normalize_rows"}]}
    modded_model = make()
    modded = probe_with_mods(modded_model, mods, runner(modded_model), **kw).summary()
    assert {"0", "2"} <= set(modded) and "0.linear" not in modded  # reported under the sites' names
    # the Probe saw the Mods' inputs: the clamped one, and rows of unit RMS after the normalization
    assert plain["0"]["stats"]["x"]["amax"] > 100 and modded["0"]["stats"]["x"]["amax"] <= 2.0
    assert modded["2"]["stats"]["x"]["row_spread_log2"] < plain["2"]["stats"]["x"]["row_spread_log2"]
    assert modded["0"]["errors"]["tensorwise"]["sqnr_db"] != plain["0"]["errors"]["tensorwise"]["sqnr_db"]
    assert "normalize_rows" in [m["name"] for m in site_mods(plain["0"])]
    clamp = site_mods({"k": 64, "n": 64, "stats": {"x": {"outlier_frac": 1e-3, "dynamic_range_log2": 20.0,
                                                         "p999": 2.0}}})
    assert clamp == [{"name": "clamp_outliers", "params": {"alpha": 8.0}}]


def _relative_regression(model, teacher, scales):
    """A loss relative to each row's scale, so every row matters to the weight gradient equally: the
    input rows span 8 decades and the output gradients the inverse ones (beyond e4m3's range, so
    one FP8 scale per tensor or per channel loses rows; per-row normalization keeps them all)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(i):
        x = torch.randn(256, 32, generator=_g(i)) * scales
        r = x.pow(2).mean(dim=1, keepdim=True).sqrt()
        loss = ((model(x) - teacher(x)) / r).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def test_recommend_places_a_site_with_the_mod_that_makes_it_safe():
    from cubic.core.config import FP8Choice
    from fp8.dispatch import Dispatcher
    from fp8.kernels import KERNELS
    from fp8.mods import ClampedLinear, RowNormalizedLinear, probe_with_mods
    from fp8.probe import Probe
    from fp8.recommend import recommend, suggested_mods
    from fp8.runtime import apply_fp8

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 16, bias=False))

    torch.manual_seed(1)
    teacher = nn.Linear(32, 16, bias=False).requires_grad_(False)
    scales = torch.logspace(-4, 4, 256)[:, None]
    kw = dict(recipes=("tensorwise", "rowwise"), min_batches=4, max_batches=4)
    plain_model = make()
    plain = Probe(plain_model, **kw).run(_relative_regression(plain_model, teacher, scales))
    wanted = suggested_mods(plain)
    assert "normalize_rows" in [m["name"] for m in wanted["0"]]
    modded_model = make()
    modded = probe_with_mods(modded_model, wanted, _relative_regression(modded_model, teacher, scales), **kw)
    disp = Dispatcher({k: KERNELS[k] for k in ("fp32", "emulated_tensorwise", "emulated_rowwise")}, repeats=1)
    args = dict(probe=plain, label="toy", require_fast=False, keep_first_last=False, dispatcher=disp)
    budget = 15.0
    without = recommend(None, budget, mods=False, **args).sites["0"]
    assert without.recipe is None and without.reason.startswith("unsafe")  # no recipe is safe as is
    site = recommend(None, budget, mods_probe=modded, **args).sites["0"]
    assert site.recipe is not None and site.safe  # ... and safe with its Mods on
    assert [m.name for m in site.applied_mods] == [m["name"] for m in wanted["0"]]
    assert site.mods_probe.chosen and site.mods_probe.recipe_without_mods is None
    assert site.error[site.recipe].ci_low_db >= budget > max(e.ci_low_db for e in without.error.values())
    assert site.error == site.mods_probe.error_with_mods

    # the runner path applies the placement's Mods, and the FP8 weight gradient is then close to fp32's
    def grad(model):  # the weight gradient of one step (Mods wrap the site; the weight is the one Linear's)
        _relative_regression(model, teacher, scales)(99)
        return next(m for m in model.modules() if isinstance(m, nn.Linear)).weight.grad

    doc = recommend(None, budget, mods_probe=modded, **args).model_dump(mode="json")
    placed = apply_fp8(make(), FP8Choice(policy="placement", placement=doc))
    wrappers = [type(m) for m in placed.modules()]
    assert RowNormalizedLinear in wrappers and isinstance(placed[0], tuple({ClampedLinear, RowNormalizedLinear}))
    assert sum(isinstance(m, Fp8Linear) for m in placed.modules()) == 1
    forced = dict(doc, sites={"0": dict(doc["sites"]["0"], applied_mods=[])})  # same recipe, no Mod
    bare = apply_fp8(make(), FP8Choice(policy="placement", placement=forced))
    ref = grad(make())
    assert sqnr_db(ref, grad(placed)) >= budget > sqnr_db(ref, grad(bare))



def test_smooth_channels_must_wrap_the_linear_itself():
    import pytest

    from cubic.core.spec import SpecError
    from fp8.mods import apply_site_mods
    from fp8.placement import parse_placement

    bad = [{"name": "smooth_channels"}, {"name": "normalize_rows"}]
    with pytest.raises(SpecError, match="smooth_channels must be the last"):
        parse_placement(_modded_doc(bad))
    with pytest.raises(ValueError, match="smooth_channels must be the last"):
        apply_site_mods(nn.Sequential(nn.Linear(8, 8)), {"0": bad})
    # the order site_mods gives: the clamp sees the raw input its alpha comes from, smoothing wraps the GEMM
    stats = {"x": {"row_spread_log2": 9.0, "col_spread_log2": 7.0, "outlier_frac": 1e-3, "dynamic_range_log2": 20.0,
                   "p999": 1.0}}
    from fp8.mods import site_mods

    assert [m["name"] for m in site_mods({"k": 13, "n": 8, "stats": stats})] == [
        "pad_dims", "clamp_outliers", "normalize_rows", "smooth_channels"]


def test_split_outliers_is_exact_and_rescues_heavy_tailed_channels():
    import torch
    from torch import nn

    from fp8.mods import OutlierSplitLinear, apply_site_mods, site_mods, suggest_mods
    from fp8.recipes import scaled_matmul, sqnr_db

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 64, generator=g)
    x[:, 3] *= 1e4  # one heavy channel, like wukong's dense-feature slot at lcb.proj
    lin = nn.Linear(64, 32)
    ref = lin(x).detach()
    model = nn.Sequential(lin)
    where = apply_site_mods(model, {"0": [{"name": "split_outliers", "params": {"ratio": 16.0, "max_frac": 0.125}}]})
    assert where["0"] == "0.linear" and isinstance(model[0], OutlierSplitLinear)
    y = model(x)
    assert model[0].outlier.nonzero().flatten().tolist() == [3]
    assert torch.allclose(y, ref, rtol=1e-5, atol=1e-2)  # the same function (fp32)
    y.sum().backward()  # the split-off column trains through the high-precision path
    assert lin.weight.grad[:, 3].abs().sum() > 0
    # in FP8 (rowwise): the GEMM that is left no longer scales every row by the outlier channel
    w = lin.weight.detach()
    plain = scaled_matmul(x, w, "rowwise")
    keep = x.clone()
    keep[:, 3] = 0
    split = scaled_matmul(keep, w, "rowwise") + x[:, 3:4] @ w[:, 3:4].t()
    exact = x @ w.t()
    assert sqnr_db(exact, split) > sqnr_db(exact, plain) + 10
    # the Probe statistics of such a site call for it (and not for the Mods it replaces)
    site = {"k": 64, "n": 32, "stats": {"x": {"col_spread_log2": 11.6, "row_spread_log2": 9.7, "outlier_frac": 1e-3,
                                              "dynamic_range_log2": 22.0, "p999": 400.0}}}
    assert suggest_mods(site) == ["split_outliers"]
    assert site_mods(site) == [{"name": "split_outliers", "params": {"ratio": 16.0, "max_frac": 0.125}}]
