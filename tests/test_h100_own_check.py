"""The H100 model's second look (experiments/_h100_own_check.py) on synthetic runs: a floor fitted by
least squares is the floor that made the times, a verdict two runs disagree on is unresolved, and a
machine with no GPU run misses every target with why."""

import json

import pytest

from experiments import _h100_own_check as own


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
    assert out["label"] is None and len(out["targets"]) == 2 * len(own.CHECKS)
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
