import copy
import json

import pytest
import torch
from torch import nn

from cubic.core.config import Config, FP8Choice
from cubic.core.spec import SpecError
from cubic.core.workloads import load_workload
from fp8.dispatch import Dispatcher
from fp8.kernels import KERNELS, Fp8Linear
from fp8.placement import choose, parse_placement
from fp8.probe import Probe, Welford
from fp8.runtime import apply_fp8


class Toy(nn.Module):
    """LayerNorm -> Linear -> Sigmoid -> Linear, fed rows whose scales span 5 decades."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.a = nn.Linear(32, 64)
        self.act = nn.Sigmoid()
        self.b = nn.Linear(64, 8)

    def forward(self, x):
        return self.b(self.act(self.a(self.norm(x)))) + 0 * x[:, :8]


def _toy_probe(**kw):
    torch.manual_seed(0)
    model = Toy()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)

    def step(i):
        x = torch.randn(128, 32, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return Probe(model, ("bf16", "tensorwise", "rowwise"), **kw).run(step), model


def test_probe_learns_stats_errors_and_neighbours():
    probe, _ = _toy_probe(min_batches=3, max_batches=6, ci_halfwidth_db=50.0)
    s = probe.summary()
    assert set(s) == {"a", "b"}
    assert s["a"]["norm_before"] and s["a"]["act_after"] == "sigmoid"
    assert not s["b"]["norm_before"] and s["b"]["act_after"] is None
    assert s["a"]["batches"] == 3  # a very wide CI target: stops at min_batches
    for role in ("x", "w", "dy"):
        assert {"amax", "p99", "outlier_frac", "dynamic_range_log2", "row_spread_log2"} <= set(s["a"]["stats"][role])
    e = s["a"]["errors"]
    assert e["bf16"]["sqnr_db"] > e["rowwise"]["sqnr_db"] + 15
    assert e["rowwise"]["ci_low_db"] <= e["rowwise"]["sqnr_db"] <= e["rowwise"]["ci_high_db"]
    assert set(e["rowwise"]["per_gemm_sqnr_db"]) == {"fwd", "grad_input", "grad_weight"}


def test_probe_keeps_sampling_until_the_interval_is_narrow():
    probe, _ = _toy_probe(min_batches=3, max_batches=8, ci_halfwidth_db=1e-6)
    assert probe.steps == 8 and all(r.batches == 8 for r in probe.sites.values())
    assert not probe.summary()["a"]["converged_ci"]
    w = Welford()
    for v in (1.0, 2.0, 3.0, 4.0):
        w.add(v)
    lo, hi = w.interval(0.95)
    assert w.mean == 2.5 and lo < 2.5 < hi and (hi - lo) / 2 == pytest.approx(2.054, abs=1e-2)


def test_choose_gives_reasons():
    site = {"errors": {"tensorwise": {"sqnr_db": 24.0, "ci_low_db": 23.0, "ci_high_db": 25.0},
                       "rowwise": {"sqnr_db": 26.0, "ci_low_db": 25.0, "ci_high_db": 27.0}},
            "speedups": {"tensorwise": 1.3, "rowwise": 0.8}}
    assert choose(site, 20.0, require_fast=True)[0] == "tensorwise"
    assert choose(site, 20.0, require_fast=False)[0] == "tensorwise"  # the faster of the safe ones
    recipe, safe, fast, _, reason = choose(site, 24.0, require_fast=True)
    assert recipe is None and safe and not fast and "slow" in reason
    recipe, safe, _, _, reason = choose(site, 30.0, require_fast=False)
    assert recipe is None and not safe and "unsafe" in reason and "25.0" in reason


def _doc(**site_over):
    site = {"m": 512, "k": 64, "n": 16, "recipe": "rowwise", "kernel": "scaled_mm_rowwise", "safe": True}
    site.update(site_over)
    return {"version": 1, "workload": "dlrm-small", "sites": {"dense.bottom.fc.1": site},
            "module_filter": ["dense.bottom.fc.1"] if site.get("recipe") else []}


def test_placement_schema_errors_name_the_field():
    parse_placement(_doc())
    with pytest.raises(SpecError, match="does not implement"):
        parse_placement(_doc(kernel="emulated_mx32"))
    with pytest.raises(SpecError, match="needs a reason"):
        parse_placement(_doc(recipe=None, kernel=None))
    bad = _doc()
    bad["module_filter"] = []
    with pytest.raises(SpecError, match="module_filter"):
        parse_placement(bad)
    with pytest.raises(SpecError, match="version"):
        parse_placement({**_doc(), "version": 7})


def test_runtime_applies_placement_and_all_and_rejects_bad_sites():
    from cubic.core.models import build_model

    w = load_workload("dlrm-small")
    model = apply_fp8(build_model(w), FP8Choice(policy="placement", placement=_doc()), w)
    assert isinstance(model.dense.bottom.fc[1], Fp8Linear) and not isinstance(model.dense.bottom.fc[0], Fp8Linear)
    assert model.dense.bottom.fc[1].kernel.name == "scaled_mm_rowwise"
    every = apply_fp8(build_model(w), FP8Choice(policy="all", recipe="tensorwise"), w)
    linears = [m for m in every.modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(m, Fp8Linear) for m in linears)
    doc = _doc()
    doc["sites"]["dense.nope"] = doc["sites"].pop("dense.bottom.fc.1")
    doc["module_filter"] = ["dense.nope"]
    with pytest.raises(SpecError, match="sites.dense.nope"):
        apply_fp8(build_model(w), FP8Choice(policy="placement", placement=doc), w)
    with pytest.raises(SpecError, match="module_filter"):
        apply_fp8(build_model(w), FP8Choice(policy="placement", placement={"version": 1, "module_filter": ["x"]}), w)
    with pytest.raises(SpecError, match="shape mismatch"):
        apply_fp8(build_model(w), FP8Choice(policy="placement", placement=_doc(k=99)), w)


@pytest.mark.parametrize("policy", ["off", "all", "budget", "placement"])
def test_every_policy_accepts_rowwise_with_gw_hp(policy, tmp_path):
    """The recipe validates under every policy (and in a stored config), and ``all`` runs it: every site
    on the recipe's kernel, the grad-weight GEMM in bf16, a finite training step."""
    from cubic.core.config import load_config
    from cubic.core.models import build_model

    choice = FP8Choice(policy=policy, recipe="rowwise_with_gw_hp")
    cfg = Config(fp8=choice)
    assert cfg.fp8.recipe == "rowwise_with_gw_hp"
    assert cfg.content_hash() != Config(fp8=FP8Choice(policy=policy, recipe="rowwise")).content_hash()
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"fp8": {"policy": policy, "recipe": "rowwise_with_gw_hp"}}))
    assert load_config(str(path)).fp8 == choice
    with pytest.raises(Exception, match="recipe"):
        FP8Choice(policy=policy, recipe="rowwise_with_gw")
    if policy != "all":
        return
    w = load_workload("dlrm-small")
    model = apply_fp8(build_model(w), choice, w)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(m, Fp8Linear) and m.kernel.recipe == "rowwise_with_gw_hp" for m in linears)
    from cubic.core.data import SyntheticData

    batch = SyntheticData(w).batch(0)
    loss = nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels)
    loss.backward()
    assert torch.isfinite(loss) and all(m.weight.grad is not None for m in linears)


def test_dispatch_picks_fastest_acceptable_and_caches(tmp_path):
    d = Dispatcher({k: KERNELS[k] for k in ("fp32", "bf16", "emulated_rowwise")}, repeats=3,
                   cache_path=tmp_path / "cache.json")
    low = {"bf16": 50.0, "rowwise": 24.0}
    strict = d.decide(256, 64, 32, low, budget_db=40.0)
    assert strict.kernel in ("fp32", "bf16") and "emulated_rowwise" not in strict.acceptable
    assert strict.time_ms == min(strict.times_ms[k] for k in strict.acceptable)
    n = d.measurements
    loose = d.decide(256, 64, 32, low, budget_db=20.0)
    assert d.measurements == n == 3  # timings are cached by (shape, dtypes, device)
    assert loose.time_ms == min(loose.times_ms.values())
    again = Dispatcher({k: KERNELS[k] for k in ("fp32", "bf16", "emulated_rowwise")}, cache_path=tmp_path / "cache.json")
    again.times(256, 64, 32)
    assert again.measurements == 0
    assert json.loads((tmp_path / "cache.json").read_text())["version"] == 1


def test_runner_body_accepts_a_placement():
    from cubic.runners.local import train_and_measure

    w = load_workload("dlrm-small")
    cfg = Config(batch_size=64, fp8=FP8Choice(policy="placement", placement=_doc(m=64)))
    r = train_and_measure(w, cfg, steps=2, warmup=1, device="cpu")
    assert r.ok, r.reason


@pytest.mark.slow
def test_local_runner_accepts_a_placement():
    from cubic.runners.local import LocalRunner

    w = load_workload("dlrm-small")
    cfg = Config(batch_size=64, fp8=FP8Choice(policy="placement", placement=_doc(m=64)))
    r = LocalRunner(timeout_s=300, threads=1).run(w, cfg, steps=3, warmup=1)
    assert r.ok, r.reason


def _sgd_steps(model):
    """A training step on random [64, 16] inputs (seeded), for Probe.run."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)

    def step(i):
        loss = model(torch.randn(64, 16, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def _three_layer_probe(max_batches=4, ci_halfwidth_db=50.0):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    step = _sgd_steps(model)
    return Probe(model, ("bf16", "rowwise"), min_batches=3, max_batches=max_batches,
                 ci_halfwidth_db=ci_halfwidth_db).run(step)


def test_probe_records_order_and_skips_the_grad_input_gemm_that_never_runs():
    s = _three_layer_probe().summary()
    assert [s[n]["order"] for n in ("0", "2", "4")] == [0, 1, 2]
    assert not s["0"]["grad_input_used"] and s["2"]["grad_input_used"]
    # the first layer's input needs no gradient: its grad-input GEMM is not part of its error
    assert "grad_input" not in s["0"]["errors"]["rowwise"]["per_gemm_sqnr_db"]
    assert "grad_input" in s["2"]["errors"]["rowwise"]["per_gemm_ci_low_db"]


def test_recommend_is_conservative_at_the_ends_and_where_the_probe_is_unsure():
    from fp8.recommend import recommend

    disp = Dispatcher({k: KERNELS[k] for k in ("fp32", "emulated_rowwise")}, repeats=1)
    probe = _three_layer_probe()
    p = recommend(None, 10.0, probe=probe, label="toy", require_fast=False, dispatcher=disp)
    assert p.module_filter == ["2"]  # 10 dB is easy, but the first and last layers stay high precision
    assert "first (input) layer" in p.sites["0"].reason and "last layer" in p.sites["4"].reason
    loose = recommend(None, 10.0, probe=probe, label="toy", require_fast=False, dispatcher=disp,
                      keep_first_last=False)
    assert loose.module_filter == ["0", "2", "4"]
    # an interval that never narrowed (3 batches, target +-0.001 dB) must clear the budget by 0.001 dB
    unsure = _three_layer_probe(max_batches=3, ci_halfwidth_db=1e-3)
    site = unsure.summary()["2"]
    assert not site["converged_ci"]
    budget = site["errors"]["rowwise"]["ci_low_db"] - 5e-4
    q = recommend(None, budget, probe=unsure, label="toy", require_fast=False, dispatcher=disp)
    assert q.sites["2"].recipe is None and "interval still wider" in q.sites["2"].reason
    off = recommend(None, budget, probe=unsure, label="toy", require_fast=False, dispatcher=disp, unsure_margin=False)
    assert off.sites["2"].recipe == "rowwise"


def test_dispatch_reports_ties_and_samples_contenders_further():
    from fp8.dispatch import slower
    from fp8.kernels import Kernel

    assert slower([2.0, 2.1, 2.2, 2.05, 2.15], [1.0, 1.1, 1.05, 0.95, 1.0])
    assert not slower([1.0, 1.1, 1.05, 0.95, 1.0], [1.02, 1.08, 1.0, 0.97, 1.03])
    # the same computation under two names: a statistical tie, so both get rounds beyond `repeats`
    twins = {"emulated_rowwise": KERNELS["emulated_rowwise"],
             "twin": Kernel("twin", "rowwise", False, "emulated rowwise under another name")}
    d = Dispatcher(twins, repeats=3, max_repeats=6, min_sample_ms=0.2)
    dec = d.decide(128, 64, 32, {"rowwise": 30.0}, 20.0)
    samples = d.samples[d.key(128, 64, 32)]
    assert all(3 <= len(v) <= 6 for v in samples.values())
    other = next(k for k in twins if k != dec.kernel)
    if slower(samples[other], samples[dec.kernel]):  # noise can separate twins; then no tie is claimed
        assert not dec.ties
    else:
        assert dec.ties == (other,) and "tied" in dec.reason and len(samples[other]) == 6


def test_probe_sees_functional_activations_and_norms():
    import torch.nn.functional as F

    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(16, 32)
            self.b = nn.Linear(32, 32)
            self.c = nn.Linear(32, 4)

        def forward(self, x):
            h = F.relu(self.a(x))
            h = torch.sigmoid(self.b(F.layer_norm(h, (32,))).view(-1, 32))
            return self.c(h)

    torch.manual_seed(0)
    model = Functional()
    step = _sgd_steps(model)
    s = Probe(model, ("rowwise",), min_batches=2, max_batches=2, ci_halfwidth_db=50.0).run(step).summary()
    assert s["a"]["act_after"] == "relu" and not s["a"]["norm_before"]
    assert s["b"]["act_after"] == "sigmoid" and s["b"]["norm_before"]  # through the view
    assert s["c"]["act_after"] is None and not s["c"]["norm_before"]


def test_probe_stride_spreads_the_batches_over_training():
    calls = []
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def step(i):
        calls.append(i)
        loss = model(torch.randn(32, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    p = Probe(model, ("rowwise",), min_batches=3, max_batches=3, ci_halfwidth_db=1e-9, stride=4).run(step, start_step=10)
    assert calls == list(range(10, 22)) and p.trained_steps == 12 and p.steps == 3
    s = p.summary()
    assert all(v["batches"] == 3 for v in s.values()) and s["0"]["act_after"] == "relu"


def test_dispatch_tie_goes_to_the_more_accurate_kernel():
    d = Dispatcher({k: KERNELS[k] for k in ("fp32", "bf16")}, repeats=6, max_repeats=6)
    key = d.key(64, 32, 16)
    # bf16's median is lower, but the samples overlap: a statistical tie
    d.samples[key] = {"fp32": [1.00, 1.02, 0.98, 1.01, 0.99, 1.03], "bf16": [0.99, 1.01, 0.97, 1.00, 1.02, 0.985]}
    d.timings[key] = {k: sorted(v)[3] for k, v in d.samples[key].items()}
    dec = d.decide(64, 32, 16, {"bf16": 50.0}, 24.0)
    assert dec.kernel == "fp32" and dec.ties == ("bf16",) and "more accurate" in dec.reason
    assert d.measurements == 0


def _fp8_site(low_db: float, speedup: float) -> dict:
    err = {"sqnr_db": low_db + 1.0, "ci_low_db": low_db, "ci_high_db": low_db + 2.0, "rel_error": 0.05, "batches": 8}
    return {"recipe": "rowwise", "kernel": "emulated_rowwise", "error": {"rowwise": err},
            "predicted_speedup": speedup, "applied_mods": [{"name": "pad_dims", "params": {}}],
            "mods_probe": None, "reason": None}


def test_model_budget_holds_the_fp8_sites_together_to_the_budget():
    from fp8.placement import combined_sqnr_db
    from fp8.recommend import apply_model_budget

    # 30 + 29 dB together: 26.5 dB; adding 25 dB would make 22.7 dB
    assert abs(combined_sqnr_db([30.0, 29.0]) - 26.46) < 0.01
    assert combined_sqnr_db([]) is None and abs(combined_sqnr_db([20.0, 20.0]) - 16.99) < 0.01
    sites = {"a": _fp8_site(25.0, 1.5), "b": _fp8_site(30.0, 1.1), "c": _fp8_site(29.0, 1.2)}
    dropped = apply_model_budget(sites, 26.0, require_fast=False)  # the quietest first
    assert dropped == ["a"] and sites["a"]["recipe"] is None and sites["a"]["kernel"] is None
    assert sites["a"]["applied_mods"] == [] and sites["a"]["reason"].startswith("model budget")
    assert sites["b"]["recipe"] == sites["c"]["recipe"] == "rowwise"
    fast = {"a": _fp8_site(25.0, 1.5), "b": _fp8_site(30.0, 1.1), "c": _fp8_site(29.0, 1.2)}
    # with require_fast the fastest goes first: a (25 dB) fits alone under 24 dB; b or c would not
    assert apply_model_budget(fast, 24.0, require_fast=True) == ["c", "b"]
    assert combined_sqnr_db([fast["a"]["error"]["rowwise"]["ci_low_db"]]) >= 24.0


def test_recommend_model_scope_keeps_fewer_sites_than_site_scope_and_records_the_combined_sqnr():
    from fp8.recommend import recommend

    disp = Dispatcher({k: KERNELS[k] for k in ("fp32", "emulated_rowwise")}, repeats=1)
    probe = _three_layer_probe()
    kw = dict(probe=probe, label="toy", require_fast=False, dispatcher=disp, keep_first_last=False)
    lows = sorted(probe.summary()[n]["errors"]["rowwise"]["ci_low_db"] for n in ("0", "2", "4"))
    budget = lows[0] - 0.5  # every site clears it alone; all three together do not
    per_site = recommend(None, budget, budget_scope="site", **kw)
    assert per_site.module_filter == ["0", "2", "4"] and per_site.budget_scope == "site"
    whole = recommend(None, budget, **kw)
    assert whole.budget_scope == "model" and 1 <= len(whole.module_filter) < 3
    assert whole.model_sqnr_db >= budget
    kept_out = [n for n, s in whole.sites.items() if s.recipe is None]
    assert all(whole.sites[n].reason.startswith("model budget") for n in kept_out)
    # the round trip keeps the new fields; old documents (no field) read as per-site budgets
    from fp8.placement import parse_placement

    doc = whole.model_dump(mode="json")
    assert parse_placement(doc).model_sqnr_db == whole.model_sqnr_db
    doc.pop("budget_scope"), doc.pop("model_sqnr_db")
    assert parse_placement(doc).budget_scope == "site"


def _held_out(model):
    """Per-example squared error of ``model`` on a fixed batch (the Probe's held-out losses)."""
    x = torch.randn(512, 16, generator=torch.Generator().manual_seed(7)) * torch.logspace(-2, 2, 16)
    with torch.no_grad():
        y = model(x)
        # 1 + the squared distance to the model's output in full precision (a copy taken at the first
        # call, which the Probe makes before any swap): FP8 noise always costs, and noises add
        ref = _CLEAN.setdefault(id(model), (model, copy.deepcopy(model)))[1](x)
        return 1.0 + (y - ref).pow(2).mean(dim=1)


_CLEAN: dict = {}


def test_ne_cost_pairs_examples_and_puts_the_model_back():
    from fp8.probe import ne_cost

    probe = _three_layer_probe()
    model = probe.model
    site = model[2]
    exact = ne_cost(model, _held_out, {"2": "fp32"})
    assert abs(exact["mean"]) < 1e-6 and exact["examples"] == 512
    coarse = ne_cost(model, _held_out, {"0": "emulated_tensorwise", "2": "emulated_tensorwise"})
    assert coarse["ci_low"] <= coarse["mean"] <= coarse["ci_high"] and coarse["mean"] != 0.0
    assert model[2] is site and type(model[0]) is nn.Linear  # swapped for the measurement only
    # measured per site and recipe by the Probe; recipes with the same forward rounding share it
    probe.measure_ne(_held_out)
    errs = probe.summary()["2"]["errors"]
    assert errs["rowwise"]["ne_rel_ci_low"] <= errs["rowwise"]["ne_rel"] <= errs["rowwise"]["ne_rel_ci_high"]
    assert errs["bf16"]["ne_rel"] != errs["rowwise"]["ne_rel"]


def test_choose_needs_the_held_out_ne_cost_within_its_budget():
    err = {"sqnr_db": 31.0, "ci_low_db": 30.0, "ci_high_db": 32.0, "rel_error": 0.03, "batches": 8}
    site = {"errors": {"rowwise": err | {"ne_rel": 0.001, "ne_rel_ci_low": 0.0005, "ne_rel_ci_high": 0.0015},
                       "tensorwise": err | {"ne_rel": 0.0001, "ne_rel_ci_low": -0.0001, "ne_rel_ci_high": 0.0003}},
            "speedups": {"rowwise": 1.5, "tensorwise": 1.2}}
    assert choose(site, 24.0, require_fast=False)[0] == "rowwise"  # no NE budget: the faster one
    assert choose(site, 24.0, require_fast=False, budget_ne_rel=0.0005)[0] == "tensorwise"
    recipe, safe, _, _, reason = choose(site, 24.0, require_fast=False, budget_ne_rel=0.0002)
    assert recipe is None and not safe and "held-out NE cost" in reason and "tensorwise" in reason
    # documents and probes without the measurement: the SQNR rule alone
    bare = {"errors": {"rowwise": err}, "speedups": {"rowwise": 1.5}}
    assert choose(bare, 24.0, require_fast=False, budget_ne_rel=1e-9)[0] == "rowwise"


def test_recommend_holds_the_fp8_sites_together_to_the_ne_budget():
    from fp8.probe import ne_cost
    from fp8.recommend import recommend

    disp = Dispatcher({k: KERNELS[k] for k in ("fp32", "emulated_rowwise")}, repeats=1)
    probe = _three_layer_probe().measure_ne(_held_out)
    kw = dict(probe=probe, label="toy", require_fast=False, dispatcher=disp, keep_first_last=False)
    free = recommend(None, 5.0, budget_ne_rel=None, **kw)
    assert free.module_filter == ["0", "2", "4"] and free.budget_ne_rel is None
    budget = max(s.error["rowwise"].ne_rel_ci_high for s in free.sites.values()) * 1.001  # each fits alone
    per_site = recommend(None, 5.0, budget_ne_rel=budget, budget_scope="site", **kw)
    assert per_site.module_filter == ["0", "2", "4"] and per_site.model_ne_rel is not None
    held = recommend(None, 5.0, budget_ne_rel=budget, budget_scope="model", **kw)
    assert held.model_ne_rel["ci_high"] <= budget and held.budget_ne_rel == budget
    dropped = [n for n, s in held.sites.items() if s.recipe is None]
    assert dropped and all(held.sites[n].reason.startswith("model NE budget") for n in dropped)
    # tried quietest first: the first site dropped breaks the budget together with the ones before it
    order = sorted(free.sites, key=lambda n: -free.sites[n].error["rowwise"].ci_low_db)
    before = [m for m in order[:order.index(dropped[0])] if m in held.module_filter]
    assert before, "the quietest site fits alone"
    with_it = ne_cost(probe.model, _held_out, {m: "emulated_rowwise" for m in [*before, dropped[0]]})
    assert with_it["ci_high"] > budget
    assert parse_placement(held.model_dump(mode="json")).model_ne_rel == held.model_ne_rel


def test_recommend_refuses_an_unknown_target_device_before_probing(monkeypatch):
    # the Probe can run for minutes: a misspelt --target-device must fail at once, not after it
    import fp8.recommend as rec

    def probed(*a, **k):
        raise AssertionError("probed before the target device was checked")

    monkeypatch.setattr(rec, "probe_workload", probed)
    with pytest.raises(SpecError, match="unknown device"):
        rec.recommend(load_workload("dlrm-small"), None, target_device="h1000")


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_a_safe_site_too_small_to_pay_says_from_which_batch_it_would_and_that_batch_bears_it_out():
    from cubic.cli.fp8 import slow_sites_line
    from fp8.recommend import recommend

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4))
    probe = Probe(model, ("bf16", "rowwise"), min_batches=3, max_batches=3, ci_halfwidth_db=50.0).run(_sgd_steps(model))
    disp = Dispatcher({k: KERNELS[k] for k in ("fp32", "emulated_rowwise")}, repeats=1)
    p = recommend(None, 10.0, probe=probe, label="toy", dispatcher=disp)  # h100, batch 64: every site slow
    assert p.module_filter == [] and all(s.safe and not s.fast for s in p.sites.values())
    assert all(s.safe_but_slow for s in p.sites.values())  # the one rule the table line and the batch use
    b = p.sites["2"].fast_from_batch  # 4096 x 4096: FP8 pays from some batch (MODELLED)
    assert b is not None and b > 64 and (b & (b - 1)) == 0
    # the first and last layers (K or N of 4 and 16) pay at no batch under the model
    assert p.sites["0"].fast_from_batch is None and p.sites["4"].fast_from_batch is None
    line = slow_sites_line(p, "h100", 64)
    assert line.startswith("safe but slow: 3 site(s) predicted slower in FP8 on h100 at batch 64")
    assert f"2 from {b:,}" in line and "2 at no batch up to 131,072" in line
    never = p.model_copy(update={"sites": {n: s.model_copy(update={"fast_from_batch": None}) for n, s in p.sites.items()}})
    assert "; none is predicted faster at any batch up to 131,072" in slow_sites_line(never, "h100", 64)
    # the second look: planned at that batch the site is fast and placed; at half of it, not
    at_b = recommend(None, 10.0, probe=probe, label="toy", dispatcher=disp, target_batch=b)
    below = recommend(None, 10.0, probe=probe, label="toy", dispatcher=disp, target_batch=b // 2)
    assert at_b.sites["2"].fast and at_b.module_filter == ["2"]
    assert not below.sites["2"].fast and below.module_filter == []
    assert not at_b.sites["2"].safe_but_slow and at_b.sites["2"].fast_from_batch is None
