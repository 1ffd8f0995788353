"""The search benchmark's merged parts: early stopping through the real CLI on a user script,
CubicSearcher through Tuner.fit, their targets, and a full run keeping them."""

from __future__ import annotations

import json

import pytest

from benchmark_convention import check_targets
from experiments import _search_early_stop as es
from experiments import _search_tune as st
from search.space import Space


def test_user_script_space_is_the_problem_grid():
    space = Space.model_validate(es.space_doc())
    assert len(space.enumerate()) == 972 and space.primary.metric == "val_loss"
    assert space.primary.direction == "minimize"


def test_early_stop_campaign_through_the_cli(tmp_path):
    (tmp_path / "space.yaml").write_text(json.dumps(es.space_doc()))
    r = es.campaign("median", 0, budget=5, epoch_s=0.01, work=tmp_path)
    assert r["runs"] == 5 and r["completed"] + r["pruned"] + r["other_failures"] == 5 and r["other_failures"] == 0
    # every completed run ran its 9 epochs, a pruned one fewer: the epochs count is what the study holds
    assert r["completed"] >= 1 and r["completed"] * 9 <= r["epochs_run"] <= 5 * 9
    assert 0.0 <= r["final_regret"] < 2.0 and r["jobs_wall_s"] >= r["completed"] * 9 * 0.01


def _arms(saved, cost):
    return {"seeds": [0, 1, 2], "arms": {"median": {
        "jobs_wall_saved_median": saved, "campaign_wall_saved_median": saved / 2, "pruned_share": 0.4,
        "regret_cost_mean": sum(cost) / 2, "regret_cost_interval_95": list(cost), "regret_cost_per_seed": [0.0] * 3}}}


def test_early_stop_targets_follow_the_figures():
    ok = es.early_stop_targets(_arms(0.4, (-0.01, 0.02)))
    check_targets(ok)
    assert all(t["met"] for t in ok.values())
    worse = es.early_stop_targets(_arms(0.1, (0.06, 0.1)))
    check_targets(worse)
    assert not any(t["met"] for t in worse.values())
    assert any("end worse" in t["reason"] for t in worse.values())
    unresolved = es.early_stop_targets(_arms(0.4, (-0.2, 0.3)))
    assert any("not resolved" in t.get("reason", "") for t in unresolved.values())


def _pub(cubic, tpe):
    return {"branin": {"methods": {"cubic": {"median_regret": {"25": cubic}},
                                   "tpe-multivariate": {"median_regret": {"25": tpe}}}}}


def _tuned(v, s=0.1):
    return {"problems": {"branin": {"median_regret": {"25": v}, "searcher_s_per_trial_mean": s,
                                    "tune_wall_s_per_trial_mean": 0.5}}}


def test_tune_targets_match_the_sampler_and_compare_with_tpe():
    t = st.tune_targets(_tuned(0.10), _pub(0.11, 0.2))
    check_targets(t)
    assert all(x["met"] for x in t.values())
    t = st.tune_targets(_tuned(0.30, s=0.9), _pub(0.11, 0.2))
    check_targets(t)
    assert not any(x["met"] for x in t.values())


def test_distributions_are_the_problems_own():
    d = st.distributions("mlp-tabular")
    assert set(d) == {"lr", "batch", "width", "opt"}
    assert st.distributions("branin")["x1"].low == -5


def test_a_full_run_keeps_the_merged_sections(tmp_path, monkeypatch):
    import experiments.common as common
    from experiments._search_public import keep_public
    from experiments.search_benchmark import MERGED

    stored = {"public": {"problems": {}}, "tune": {"problems": {}}, "early_stopping": {"arms": {}},
              "targets": {"public: a": 1, "tune: b": 2, "early stop: c": 3, "real: d": 4}}
    (tmp_path / "search_benchmark.json").write_text(json.dumps(stored))
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    results = {"targets": {"real: d": 5}}
    keep_public(results, "search_benchmark", MERGED)
    assert {"public", "tune", "early_stopping"} <= set(results)
    assert results["targets"] == {"real: d": 5, "public: a": 1, "tune: b": 2, "early stop: c": 3}


@pytest.mark.slow  # a local Ray and a 25-trial Tuner.fit, ~30 s
def test_tuner_fit_runs_the_searcher_on_a_public_problem():
    doc = st.run_tune(["branin"], [0], budget=25, log=lambda *_: None)
    row = doc["problems"]["branin"]
    assert set(row["median_regret"]) == {"25"} and 0 <= row["median_regret"]["25"] < 1.0  # better than random's median
    assert row["per_seed"][0]["searcher_s_per_trial"] > 0 and doc["concurrency"] == 2
