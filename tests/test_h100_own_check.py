"""The H100 model's second look (experiments/_h100_own_check.py) on synthetic runs: a floor fitted by
least squares is the floor that made the times, a verdict two runs disagree on is unresolved, and a
machine with no GPU run misses every target with why."""

import json

import pytest

from experiments import _h100_own_check as own
from experiments import _h100_site_steps as site_steps


def _run(path, speedups: dict, bf16_s: dict, device="NVIDIA H100 80GB HBM3"):
    blocks = [{"block": "LNLinearSigmoid", "recipe": r, "mode": "compile", "m": s[0], "k": s[1], "n": s[2],
               "bf16_s": bf16_s[s], "fp8_s": bf16_s[s] / x, "speedup": x} for (s, r), x in speedups.items()]
    gemms = [{"precision": "bf16", "recipe": None, "m": 1024, "k": 1024, "n": 1024, "time_s": 3e-5},
             {"precision": "fp8", "recipe": "tensorwise", "m": 1024, "k": 1024, "n": 1024, "time_s": 2e-5}]
    path.write_text(json.dumps({"device": device, "label": f"measured on {device}", "blocks": blocks, "gemms": gemms,
                                "sections": {"blocks": {"code_version": "abc"}}}))


def test_the_fitted_floor_is_the_floor_that_made_the_times():
    gpu = [1e-5, 1e-4, 5e-4, 3e-3, 1e-2]
    meas = [max(g, 1.2e-3) for g in gpu]
    assert own._fit_floor(gpu, meas) == pytest.approx(1.2e-3, rel=1e-3)


def test_a_verdict_the_runs_disagree_on_is_unresolved_and_host_bound_follows_the_floor(tmp_path, monkeypatch):
    monkeypatch.setattr(own, "RESULTS", tmp_path)
    small, large = (1024, 1024, 1024), (8192, 8192, 8192)
    times = {small: 1.0e-3, large: 5.0e-3}
    _run(tmp_path / "gpu_checks.json", {(small, "tensorwise"): 1.1, (small, "rowwise"): 0.8, (large, "rowwise"): 1.2}, times)
    _run(tmp_path / "gpu_checks_repeat.json", {(small, "tensorwise"): 0.9, (small, "rowwise"): 0.7, (large, "rowwise"): 1.25},
         times)
    runs = own.own_runs()
    assert [r["file"] for r in runs] == ["results/gpu_checks.json", "results/gpu_checks_repeat.json"]
    rep = own.repeatability(runs)
    verdicts = {(r["m"], r["recipe"], r["host_bound"]): r["verdict"] for r in rep["blocks"]["rows"]}
    assert verdicts == {(1024, "tensorwise", True): "unresolved", (1024, "rowwise", True): "slow",
                        (8192, "rowwise", False): "fast"}
    assert rep["blocks"]["host_bound"]["resolved"] == 1 and rep["blocks"]["compute_bound"]["resolved"] == 1
    assert rep["gemm_pairs"]["rows"][0]["verdict"] == "fast"


def test_a_repeat_on_another_device_is_not_a_repeat(tmp_path, monkeypatch):
    monkeypatch.setattr(own, "RESULTS", tmp_path)
    s = (1024, 1024, 1024)
    _run(tmp_path / "gpu_checks.json", {(s, "tensorwise"): 1.1}, {s: 1e-3})
    _run(tmp_path / "gpu_checks_repeat.json", {(s, "tensorwise"): 1.1}, {s: 1e-3}, device="NVIDIA H200")
    assert len(own.own_runs()) == 1


def test_without_a_gpu_run_every_target_is_missed_with_why(tmp_path, monkeypatch):
    monkeypatch.setattr(own, "RESULTS", tmp_path)
    out = own.own_measurement_check(None)
    assert out["label"] is None and len(out["targets"]) == 2 * len(own.CHECKS) + 2 * len(site_steps.CHECKS)
    for name, t in out["targets"].items():
        assert t["met"] is False and t["measured"] is None and "no GPU measurement" in t["reason"], name


def test_one_run_judges_the_shipped_model_and_says_the_candidate_needs_a_repeat(tmp_path, monkeypatch):
    from cost_models.gpu_gemm import DEFAULT_CONSTANTS

    monkeypatch.setattr(own, "RESULTS", tmp_path)
    s = (8192, 8192, 8192)
    _run(tmp_path / "gpu_checks.json", {(s, "tensorwise"): 1.4}, {s: 5e-3})
    out = own.own_measurement_check(DEFAULT_CONSTANTS)
    shipped = {k: t for k, t in out["targets"].items() if k.endswith(f"({own.SHIPPED})")}
    cand = {k: t for k, t in out["targets"].items() if k.endswith(f"({own.CANDIDATE})")}
    assert len(shipped) == len(cand) == len(own.CHECKS)
    assert all(t["measured"] is not None and t["n"] >= 1 for t in shipped.values())
    assert all(t["met"] is False and "one GPU run" in t["reason"] for t in cand.values())


def _step(tower, variant, site, ms, m=None, k=None, n=None, act=None):
    return {"tower": tower, "recipe": "tensorwise", "variant": variant, "site": site, "m": m, "k": k, "n": n,
            "act_after": act, "step_s": ms / 1e3}


def test_site_steps_resolve_against_the_steps_own_drift_and_price_the_host_floor():
    from cost_models.gpu_gemm import DEFAULT_CONSTANTS, block_speedup
    from cost_models.hardware import H100_SXM

    steps = [_step("small", "bf16", None, 1.00), _step("small", "site", "0", 1.30, 2048, 512, 512, "relu"),
             _step("small", "site", "2", 1.01, 2048, 512, 256), _step("small", "all", None, 1.45),
             _step("small", "bf16_again", None, 1.02)]
    run = {"file": "results/gpu_checks.json", "label": "measured on X", "device": "NVIDIA H100 80GB HBM3",
           "site_steps": steps}
    out = site_steps.site_step_check(run, {"bf16": 0.9, "tensorwise": 1.1}, DEFAULT_CONSTANTS)
    rows = {r["site"]: r for r in out["rows"]}
    # bf16 drifted 0.02 ms: site 0's +0.29 ms is resolved, site 2's -0.00 is not
    assert rows["0"]["resolved"] and not rows["2"]["resolved"]
    assert rows["0"]["measured_change_ms"] == pytest.approx(0.29)
    gpu = block_speedup(2048, 512, 512, "tensorwise", act_after="relu", mode="compile", device=H100_SXM)
    assert rows["0"]["shipped_change_ms"] == pytest.approx(gpu["fp8_ms"] - gpu["bf16_ms"], abs=1e-4)
    # a site far below both floors costs the step the difference of the floors
    assert rows["0"]["candidate_change_ms"] == pytest.approx(0.2)
    assert out["shipped"]["n"] == out["candidate_host_floor"]["n"] == 1
    assert out["candidate_host_floor"]["median_change_error_pct"] == pytest.approx(100 * 0.09 / 0.29)
    (both,) = out["all_sites"]
    assert both["measured_change_ms"] == pytest.approx(0.44) and both["sum_of_candidate_ms"] == pytest.approx(0.4)
    t = out["targets"][f"site_step_change_error_pct ({site_steps.CANDIDATE})"]
    assert t["met"] is False and "1 resolved sites (1 unresolved" in t["reason"]
    none = site_steps.site_step_check({**run, "site_steps": []}, {}, DEFAULT_CONSTANTS)["targets"]
    assert all(x["met"] is False and "no resolved site" in x["reason"] for x in none.values())


def test_another_devices_runs_are_judged_with_that_devices_spec(tmp_path, monkeypatch):
    # the lent H200's runs: the same checks, the H200 datasheet in the model (more HBM bandwidth than the H100's)
    from cost_models.gpu_gemm import DEFAULT_CONSTANTS
    from experiments._h100_model import predict_gemm

    monkeypatch.setattr(own, "RESULTS", tmp_path)
    small, large = (1024, 1024, 1024), (8192, 8192, 8192)
    speedups, times = {(small, "tensorwise"): 0.8, (large, "tensorwise"): 1.4}, {small: 1e-3, large: 5e-3}
    files = own.OTHER_DEVICE_RUNS["h200"][0]  # the newest lease: a run and its repeat
    for f in files:
        _run(tmp_path / f, speedups, times, device="NVIDIA H200")
    _run(tmp_path / "gpu_checks.json", speedups, times)  # an H100 run beside them
    h200 = own.own_measurement_check(DEFAULT_CONSTANTS, files)
    h100 = own.own_measurement_check(DEFAULT_CONSTANTS)
    assert h200["label"] == "modelled vs measured on NVIDIA H200 (not fitted)" and "repeatability" in h200
    assert h100["label"].endswith("H100 80GB HBM3 (not fitted)") and "repeatability" not in h100
    row = {"m": 16384, "k": 16, "n": 16384, "precision": "bf16", "recipe": None}  # bound by HBM
    assert predict_gemm({**row, "device": "NVIDIA H200"}, DEFAULT_CONSTANTS) < predict_gemm(
        {**row, "device": "NVIDIA H100 80GB HBM3"}, DEFAULT_CONSTANTS)


def test_a_target_one_lease_meets_and_another_misses_is_not_met(tmp_path, monkeypatch):
    # two machine starts of the same GPU kind: the newest is reported, the verdict must hold in both
    from cost_models.gpu_gemm import DEFAULT_CONSTANTS

    monkeypatch.setattr(own, "RESULTS", tmp_path)
    s, big, dev = (8192, 8192, 8192), (16384, 16384, 16384), "NVIDIA H200"
    new, old = ("new.json", "new_repeat.json"), ("old.json", "old_repeat.json")
    times = {s: 5e-3, big: 4e-2}
    for f in new:
        _run(tmp_path / f, {(s, "tensorwise"): 1.4, (big, "tensorwise"): 1.5}, times, device=dev)
    for f in old:
        _run(tmp_path / f, {(s, "tensorwise"): 0.7, (big, "tensorwise"): 0.8}, times, device=dev)
    one = own.own_measurement_check(DEFAULT_CONSTANTS, new)["targets"]
    out = own.leases_check(DEFAULT_CONSTANTS, (new, old))
    name = f"block_speedup_fast_slow_pct ({own.SHIPPED})"
    t = out["targets"][name]
    assert [e["met"] for e in t["every_lease"]] == [one[name]["met"], not one[name]["met"]]
    assert t["met"] is False and "not confirmed by a second machine start" in t["reason"]
    assert t["reason"].startswith("met on results/new.json, results/new_repeat.json, missed on results/old.json")
    assert t["measured"] == one[name]["measured"]  # the newest lease's figure
    assert out["across_leases"]["runs"] == [f"results/{f}" for f in new + old]
    assert out["earlier_leases"][0]["runs"] == [f"results/{f}" for f in old]


def test_a_site_is_settled_only_when_every_run_resolves_it_with_one_sign():
    from cost_models.gpu_gemm import DEFAULT_CONSTANTS

    def run(name, ms0, ms2):
        steps = [_step("t", "bf16", None, 1.00), _step("t", "site", "0", ms0, 8192, 8192, 8192),
                 _step("t", "site", "2", ms2, 8192, 8192, 8192), _step("t", "bf16_again", None, 1.01)]
        return {"file": name, "label": "measured on X", "device": "NVIDIA H200", "site_steps": steps}

    # site 0 faster in both runs (resolved: |change| > 0.01 drift); site 2 slower in one, faster in the other
    runs = [run("a", 0.80, 1.20), run("b", 0.85, 0.90), {"file": "c", "site_steps": []}]
    across = site_steps.across_runs(runs, DEFAULT_CONSTANTS)
    rows = {r["site"]: r for r in across["rows"]}
    assert rows["0"]["settled"] and not rows["2"]["settled"] and rows["2"]["shipped_right"] is None
    assert across["runs"] == ["a", "b"] and across["n_settled"] == 1 == across["n_settled_fp8_faster"]
    (t,) = site_steps.settled_target(across).values()
    assert t["n"] == 1 and t["measured"] == (100.0 if rows["0"]["shipped_right"] else 0.0)
    assert "every one of one kind" in t["note"]


def test_another_devices_check_is_kept_when_the_h100_run_is_absent():
    from experiments.h100_model_fit import _checked

    row = {"recipe": "tensorwise", "mode": "compile"}
    h200 = {"label": "modelled vs measured on NVIDIA H200 (not fitted)", "block_rows": [row],
            "block_speedup": {"n": 1, "mape_pct": 10.0, "agreement_pct": 100.0},
            "block_fast_slow_on_resolved_rows": {"n": 1, "agreement_pct": 100.0}}
    published = {"n": 9, "mape_pct": 15.0, "agreement_pct": 78.0}
    rec = _checked(published, {"label": None}, {"h200": h200})
    assert rec["own_measurement"] is None and rec["devices"] == ["h200"] and rec["recipes"] == ["tensorwise"]
    assert rec["by_device"]["h200"]["what"] == "measured on NVIDIA H200"
    assert _checked(published, {"label": None}, {}) is None
