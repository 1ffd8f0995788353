"""The search benchmark's merged parts: early stopping through the real CLI on a user script,
CubicSearcher through Tuner.fit, their targets, and a full run keeping them."""

from __future__ import annotations

import json

import pytest

from benchmark_convention import check_targets
from experiments import _search_early_stop as es
from experiments import _search_tune as st
from experiments._search_merged import MERGED
from search.space import Space


def test_user_script_space_is_the_problem_grid():
    space = Space.model_validate(es.space_doc())
    assert len(space.enumerate()) == 972 and space.primary.metric == "val_loss"
    assert space.primary.direction == "minimize"


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_early_stop_campaign_through_the_cli(tmp_path):
    (tmp_path / "space.yaml").write_text(json.dumps(es.space_doc()))
    c = es.campaign("median", 0, budget=5, epoch_s=0.01, work=tmp_path)
    f = es.first_runs(c, 5)
    assert c["runs"] == 5 and f["completed"] + f["pruned"] == 5 and f["other_failures"] == 0
    # every completed run ran its 9 epochs, a pruned one fewer
    assert f["completed"] >= 1 and f["completed"] * 9 <= f["epochs_run"] <= 5 * 9
    assert f["jobs_wall_s"] >= f["completed"] * 9 * 0.01 and 0.0 <= f["final_regret"] < 2.0
    # quality so far never gets worse, and is the final quality at the end
    got = [r for r in c["regret_so_far"] if r is not None]
    assert got == sorted(got, reverse=True) and got[-1] == f["final_regret"]


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_the_crossing_script_keeps_the_final_losses_and_hides_them_early(tmp_path):
    """The second look's script: mlp-tabular's final losses exactly, on paths whose early epochs say
    next to nothing of the final ranking among the best configurations (the ordered script's do)."""
    import itertools

    from experiments._public_problems import mlp_curve, mlp_curve_crossing

    params = es.space_doc()["parameters"]
    grid = [dict(zip([p["name"] for p in params], v)) for v in itertools.product(*(p["choices"] for p in params))]
    assert all(mlp_curve_crossing(g)[-1] == pytest.approx(mlp_curve(g)[-1], abs=1e-12) for g in grid[::7])
    ordered, crossing = es.curve_agreement("ordered"), es.curve_agreement("crossing")
    assert ordered["spearman_epoch_vs_final_best_100"][0] > 0.7 > 0.2 > crossing["spearman_epoch_vs_final_best_100"][0]
    # through the CLI, with the pruner held off to the last epoch: no run is stopped
    (tmp_path / "space.yaml").write_text(json.dumps(es.space_doc()))
    c = es.campaign("median", 0, budget=4, epoch_s=0.01, work=tmp_path, curves="crossing", warmup=10)
    assert c["kinds"] == ["ok"] * 4 and c["epochs_per_run"] == [9] * 4
    assert es.section_key("crossing", 10) == "early_stopping_crossing_warmup"
    assert es.target_prefix("crossing", 10).startswith(MERGED["early_stopping_crossing_warmup"])
    assert es.target_prefix("crossing").startswith(MERGED["early_stopping_crossing"])
    assert not es.target_prefix("crossing").startswith(MERGED["early_stopping"])


def _campaign(arm, seed, regrets, walls):
    return {"arm": arm, "seed": seed, "runs": len(regrets), "campaign_wall_s": sum(walls) + 1.0,
            "regret_so_far": regrets, "jobs_wall_s_per_run": walls, "kinds": ["ok"] * len(regrets),
            "epochs_per_run": [9] * len(regrets), "full_final_per_run": [1.0] * len(regrets)}


def test_time_to_quality_and_the_comparison_per_seed():
    # unpruned: 4 runs of 2 s, final regret 0.1; pruned: 1 s runs, reaches 0.1 at its 3rd run (3 s of 8: 62% saved)
    by = {"none": {0: _campaign("none", 0, [0.5, 0.3, 0.2, 0.1], [2.0] * 4), 1: _campaign("none", 1, [0.4] * 4, [2.0] * 4)},
          "median": {0: _campaign("median", 0, [0.5, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05], [1.0] * 8),
                     1: _campaign("median", 1, [None, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.5], [1.0] * 8)}}
    assert es.time_to_quality(by["median"][0], 0.1) == (3, 3.0) and es.time_to_quality(by["median"][1], 0.4) is None
    a = es.compare_arm(by, "median", [0, 1], budget=4)
    assert a["equal_quality"]["jobs_wall_saved_per_seed"] == [1 - 3.0 / 8.0, None]
    assert a["equal_quality"]["reached"] == 1 and a["equal_quality"]["runs_to_reach_per_seed"] == [3, None]
    assert a["equal_runs"]["jobs_wall_saved_per_seed"] == [0.5, 0.5]
    assert a["equal_runs"]["regret_cost_per_seed"] == pytest.approx([0.0, 0.1])
    assert es._median_or_none([None, None, 0.3]) is None and es._median_or_none([None, 0.2, 0.3]) == 0.2


def _arms(saved, cost, at_quality=(0.5, 0.6, None)):
    return {"seeds": [0, 1, 2], "pruned_budget": 48, "arms": {"median": {
        "equal_quality": {"jobs_wall_saved_median": es._median_or_none(list(at_quality)),
                          "jobs_wall_saved_per_seed": list(at_quality),
                          "reached": sum(x is not None for x in at_quality)},
        "equal_runs": {"jobs_wall_saved_median": saved, "pruned_share": 0.4,
                       "regret_cost_mean": sum(cost) / 2, "regret_cost_interval_95": list(cost),
                       "regret_cost_per_seed": [0.0] * 3}}}}


def test_early_stop_targets_follow_the_figures():
    ok = es.early_stop_targets(_arms(0.4, (-0.01, 0.02)))
    check_targets(ok)
    assert all(t["met"] for t in ok.values())
    worse = es.early_stop_targets(_arms(0.1, (0.06, 0.1), at_quality=(None, None, 0.9)))
    check_targets(worse)
    assert not any(t["met"] for t in worse.values())
    assert any("end worse" in t["reason"] for t in worse.values())
    assert any("in 1 of 3 seeds" in t["reason"] and "never, never, +90%" in t["reason"] for t in worse.values())
    unresolved = es.early_stop_targets(_arms(0.4, (-0.2, 0.3)))
    assert any("not resolved" in t.get("reason", "") for t in unresolved.values())
    # a miss says whether the pruner stopped a would-be winner
    a = _arms(0.1, (0.06, 0.1), at_quality=(None, None, 0.9))
    a["curves"] = {"spearman_epoch_vs_final": [0.99, 1.0]}
    for part in ("equal_quality", "equal_runs"):
        a["arms"]["median"][part].update(pruned_runs=7, pruned_winners=0)
    reasons = [t["reason"] for t in es.early_stop_targets(a).values() if not t["met"]]
    assert all("none of the 7 pruned runs" in r and "Spearman 0.990" in r for r in reasons[:1] + reasons[2:])
    a["arms"]["median"]["equal_runs"]["pruned_winners"] = 1
    eq = [t.get("reason", "") for k, t in es.early_stop_targets(a).items() if "equal number" in k and not t["met"]]
    assert eq and not any("none of the" in r for r in eq)
    assert any("1 of the 7 pruned runs would have beaten" in r and "stopped would-be winners" in r for r in eq)


def test_a_pruned_run_that_would_have_won_is_counted():
    c = {"kinds": ["ok", "pruned", "pruned", "ok"], "full_final_per_run": [0.5, 0.4, 0.9, 0.6],
         "epochs_per_run": [9, 2, 2, 9], "jobs_wall_s_per_run": [1.0] * 4, "regret_so_far": [0.2] * 4}
    assert es.first_runs(c, 4)["pruned_winners"] == 1  # 0.4 beats the best completed 0.5; 0.9 does not
    assert es.first_runs(c, 1)["pruned_winners"] == 0
    agree = es.curve_agreement()
    assert agree["configurations"] == 972 and agree["spearman_epoch_vs_final"][-1] == 1.0


def test_the_registered_problem_and_the_user_script_are_one_table():
    """The script gets its learning rate as a float from its command line, the registered problem
    as a numpy float: both must draw the same cell noise (under numpy 2 the old key, ``repr`` of the
    configuration, differed, so their optima were 0.31912 and 0.31931), on any numpy version."""
    import itertools

    import numpy as np

    from experiments._public_problems import CURVES, MLP_BATCH, MLP_LR, MLP_OPT, MLP_WIDTH, _cell_key, problems

    assert _cell_key({"lr": np.float64(0.1), "batch": np.int64(16)}) == _cell_key({"lr": 0.1, "batch": 16})
    assert _cell_key({"lr": 0.1, "opt": "sgd"}) == "[('lr', 0.1), ('opt', 'sgd')]"  # the bare number, as numpy 1.x wrote it
    script = min(CURVES["ordered"]({"lr": float(str(float(a))), "batch": b, "width": c, "opt": d})[-1]
                 for a, b, c, d in itertools.product(MLP_LR, MLP_BATCH, MLP_WIDTH, MLP_OPT))
    assert problems()["mlp-tabular"].optimum == script


def test_rescore_recomputes_regrets_from_the_stored_runs_and_says_so():
    opt, med = es.regret_scale()
    finals = [opt + 0.5 * (med - opt), opt + 0.25 * (med - opt), opt + 0.1 * (med - opt)]
    runs = {"kinds": ["ok", "pruned", "ok"], "full_final_per_run": finals, "epochs_per_run": [9, 2, 9]}
    section = {"seeds": [0, 1], "budget": 3, "script_curves": "ordered",
               "campaigns": [{**_campaign(arm, seed, [9.0] * 3, [1.0] * 3), **runs}
                             for arm in es.ARMS for seed in (0, 1)]}
    got = es.rescore(section, "abc123", "the cell key")
    for c in got["campaigns"]:  # the stopped run is not counted: only completed runs set the quality
        assert c["regret_so_far"] == pytest.approx([0.5, 0.5, 0.1])
    assert got["arms"]["median"]["equal_runs"]["regret_cost_per_seed"] == pytest.approx([0.0, 0.0])
    assert got["rescored"]["code_version"] == "abc123" and got["rescored"]["why"] == "the cell key"
    assert section["campaigns"][0]["regret_so_far"] == [9.0] * 3  # the stored section is not changed in place


def _pub(cubic, tpe):
    return {"branin": {"methods": {"cubic": {"median_regret": {"25": cubic}},
                                   "tpe-multivariate": {"median_regret": {"25": tpe}}}}}


def _tuned(v, s=0.1):
    return {"seeds": [0, 1], "problems": {"branin": {"median_regret": {"25": v}, "searcher_s_per_trial_mean": s,
                                                     "tune_wall_s_per_trial_mean": 0.5}}}


def test_tune_targets_match_the_sampler_and_compare_with_tpe():
    t = st.tune_targets(_tuned(0.10), _pub(0.11, 0.2))
    check_targets(t)
    assert all(x["met"] for x in t.values())
    t = st.tune_targets(_tuned(0.30, s=0.9), _pub(0.11, 0.2))
    check_targets(t)
    assert not any(x["met"] for x in t.values())


def test_tune_match_reason_says_which_way_and_the_second_look_sits_beside_it():
    doc = {**_tuned(0.05), "early_25": {"seeds": list(range(20)), "problems": {"branin": {"median_regret": {"25": 0.12}}}}}
    early = {"problems": {"branin": {"cubic": {"median_regret": 0.10}}}}
    t = st.tune_targets(doc, _pub(0.30, 0.2), early)
    check_targets(t)
    match = next(v for k, v in t.items() if "matches" in k)
    assert not match["met"] and "ahead" in match["reason"] and "branin 0.050 vs 0.300" in match["reason"]
    assert match["over_20_seeds"] == {"searcher": 0.12, "sampler": 0.10, "gap": pytest.approx(0.02),
                                      "within_match": True, "problems": ["branin"]}
    behind = next(v for k, v in st.tune_targets(_tuned(0.5), _pub(0.30, 0.2)).items() if "matches" in k)
    assert "behind" in behind["reason"] and "over_20_seeds" not in behind


def test_distributions_are_the_problems_own():
    d = st.distributions("mlp-tabular")
    assert set(d) == {"lr", "batch", "width", "opt"}
    assert st.distributions("branin")["x1"].low == -5


def test_a_full_run_keeps_the_merged_sections(tmp_path, monkeypatch):
    import experiments.common as common
    from experiments._search_public import keep_merged

    stored = {"public": {"problems": {}}, "tune": {"problems": {}}, "early_stopping": {"arms": {}},
              "early_stopping_crossing": {"arms": {}},
              "targets": {"public: a": 1, "tune: b": 2, "early stop: c": 3, "real: d": 4,
                          "early stop, crossing curves: e": 6}}
    (tmp_path / "search_benchmark.json").write_text(json.dumps(stored))
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    results = {"targets": {"real: d": 5}}
    keep_merged(results, "search_benchmark", MERGED)
    assert {"public", "tune", "early_stopping", "early_stopping_crossing"} <= set(results)
    assert results["targets"] == {"real: d": 5, "public: a": 1, "tune: b": 2, "early stop: c": 3,
                                  "early stop, crossing curves: e": 6}


def test_a_full_run_keeps_the_hard_space_measured_apart(tmp_path, monkeypatch):
    """The hard space has its own invocation (--hard, ~20 min of runs): a full run that rewrote the
    spaces had dropped it and its targets from results/search_benchmark.json."""
    import experiments.common as common
    from experiments._search_hard import keep_hard

    stored = {"spaces": {"hard:wukong-small": {"methods": {}}, "real:dlrm-small": {"old": True}}}
    (tmp_path / "search_benchmark.json").write_text(json.dumps(stored))
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    results = {"spaces": {"real:dlrm-small": {"new": True}}}
    keep_hard(results, "search_benchmark")
    assert results["spaces"] == {"real:dlrm-small": {"new": True}, "hard:wukong-small": {"methods": {}}}
    keep_hard(results, "search_benchmark_quick")  # no stored file: nothing to keep, nothing lost
    assert set(results["spaces"]) == {"real:dlrm-small", "hard:wukong-small"}


def test_a_merged_part_records_its_context_from_before_it_ran(tmp_path, monkeypatch):
    """started_at and loadavg_1m_at_start are the part's start, not the time it wrote its result
    (they were taken after the run: a 9-minute part said it started when it ended)."""
    import argparse
    import calendar
    import time

    import experiments._search_merged as sm
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    ran_at = []

    def fake_part(seeds, budget, epoch_s, log=print, curves="ordered", warmup=None):
        ran_at.append(time.time())
        time.sleep(2.1)  # past the context's one-second resolution
        return {"arms": {}}

    monkeypatch.setattr(es, "run_early_stop", fake_part)
    monkeypatch.setattr(sm, "merged_targets",
                        lambda stored, key: {"early stop: x": {"measured": 1.0, "target": 1.0, "met": True}})
    monkeypatch.setattr(sm, "plot_early_stop", lambda doc, path: None)
    args = argparse.Namespace(rescore=None, held_out=False, tune=False, tune_early_seeds=0, early_stop=True,
                              early_stop_curves="ordered", early_stop_warmup=None, seeds=1, early_stop_budget=2,
                              epoch_s=0.01)
    sm.run_merged(args, log=lambda *_: None)
    ctx = json.loads((tmp_path / "search_benchmark.json").read_text())["early_stopping"]["context"]
    started = calendar.timegm(time.strptime(ctx["started_at"], "%Y-%m-%dT%H:%M:%SZ"))
    assert started <= ran_at[0] and "loadavg_1m_at_start" in ctx


@pytest.mark.slow  # a local Ray and a 25-trial Tuner.fit, ~30 s
def test_tuner_fit_runs_the_searcher_on_a_public_problem():
    doc = st.run_tune(["branin"], [0], budget=25, log=lambda *_: None)
    row = doc["problems"]["branin"]
    assert set(row["median_regret"]) == {"25"} and 0 <= row["median_regret"]["25"] < 1.0  # better than random's median
    assert row["per_seed"][0]["searcher_s_per_trial"] > 0 and doc["concurrency"] == 2


def test_the_pruner_note_is_checked_against_the_would_be_winners():
    def row(arm, seed, note, full, kinds):
        return {**_campaign(arm, seed, [0.1] * len(kinds), [1.0] * len(kinds)), "kinds": kinds,
                "full_final_per_run": full, "pruning_note": note}

    warn, back = "the pruner stopped 2 runs ...: a stopped run may have been the winner", \
        "the pruner stopped 2 runs ...: the completed curves back its early judgement"
    es_doc = {"seeds": [0, 1], "pruned_budget": 4, "arms": {}, "campaigns": [
        row("none", 0, None, [1.0, 2.0], ["ok", "ok"]),
        row("median", 0, warn, [1.0, 0.5], ["ok", "pruned"]),  # a stopped run would have won: warned, right
        row("median", 1, back, [1.0, 2.0], ["ok", "pruned"]),  # none would have: backed, right
        row("halving", 0, back, [1.0, 0.5], ["ok", "pruned"]),  # would have won, backed: wrong
        row("halving", 1, None, [1.0, 2.0], ["ok", "pruned"])]}  # no note, nothing to warn of: right
    chk = es.note_check(es_doc)
    assert (chk["right"], chk["of"]) == (3, 4)
    (name, t), = [(k, v) for k, v in es.early_stop_targets(es_doc).items() if "note" in k]
    assert name.startswith("early stop: ") and t["measured"] == 0.75 and not t["met"]
    assert t["reason"] == "--prune halving seed 0: did not warn, 1 would-be winners stopped"
    check_targets({name: t})


def test_a_public_run_keeps_the_stored_20_seed_look(tmp_path, monkeypatch):
    """--public alone rebuilt the public section from its own run and dropped the stored
    --public-early-seeds look and its figures beside the @25 target."""
    import argparse

    import experiments._search_public as sp
    import experiments.common as common

    early = {"seeds": list(range(20)), "context": {"code_version": "old"},
             "problems": {"branin": {"cubic": {"median_regret": 0.1}, "tpe-multivariate": {"median_regret": 0.2}}}}
    (tmp_path / "search_benchmark.json").write_text(json.dumps({"public": {"problems": {}, "early_25": early}}))
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    row = {m: {"median_regret": {"25": 0.3, "50": 0.2, "100": 0.1}, "overhead_s_per_trial_mean": 0.1}
           for m in sp.METHODS}
    row["cubic"] = {**row["cubic"], "median_regret": {"25": 0.2, "50": 0.1, "100": 0.05}}  # (ahead: no reason text)
    monkeypatch.setattr(sp, "run", lambda names, seeds, budget, log=print, on_row=None: {"branin": {"methods": row}})
    monkeypatch.setattr(sp, "overhead_curve", lambda trials: {"trials": trials, "problem": "hartmann6",
                                                              "last_50_s_per_trial": 0.1, "mean_s_per_trial": 0.1,
                                                              "fit_s_last_50": 1.0})
    monkeypatch.setattr(sp, "plot_public", lambda stored, path: None)
    args = argparse.Namespace(public_early_seeds=0, seeds=2, public_problems=["branin"], public_budget=100)
    sp.run_public(args, log=lambda *_: None)
    doc = json.loads((tmp_path / "search_benchmark.json").read_text())
    kept = doc["public"]["early_25"]
    assert kept["context"] == {"code_version": "old"} and "own invocation" in kept["stale_sections_note"]
    at_25 = next(v for k, v in doc["targets"].items() if "@25" in k)
    check_targets(doc["targets"])
    assert at_25["over_20_seeds"]["cubic"] == 0.1 and at_25["over_20_seeds"]["cubic_below_tpe"]


def test_public_targets_wait_for_every_method_on_every_problem():
    """One rule for the public part's targets (--public, --public-early-seeds, --retarget): none while
    a problem misses a method (a partial run would be judged against arms it has not run), and the
    tune part's none without a public part to compare against."""
    from experiments._search_merged import merged_targets, replace_targets
    from experiments._search_public import METHODS

    row = {m: {"median_regret": {"25": 0.3, "50": 0.2, "100": 0.1}, "overhead_s_per_trial_mean": 0.1}
           for m in METHODS}
    row["cubic"] = {**row["cubic"], "median_regret": {"25": 0.2, "50": 0.1, "100": 0.05}}  # (ahead: no reason text)
    partial = {"public": {"budget": 100, "problems": {"branin": {"methods": row},
                                                      "hartmann6": {"methods": {"cubic": row["cubic"]}}}},
               "targets": {"public: stale": {"measured": 1, "target": 1, "met": True}, "other": {}}}
    replace_targets(partial, "public")
    assert set(partial["targets"]) == {"other"}  # the stale public target goes, none comes in its place
    complete = {"public": {"budget": 100, "problems": {"branin": {"methods": row}}}}
    got = merged_targets(complete, "public")
    assert got and all(k.startswith("public:") for k in got)
    check_targets(got)
    assert merged_targets({"tune": {"problems": {}}}, "tune") == {}


def test_the_closing_summary_prints_a_target_with_nothing_measured(capsys):
    # a stored early-stop target whose seeds never reached the quality has measured None: the full
    # run's last lines crashed on it after writing its JSON (stop 47)
    from experiments.search_benchmark import _print_summary

    # a kept hard space has no cubic/TPE ratio (its targets compare medians): the last lines crashed on
    # it after writing the JSON (stop 75, the first full run that kept it)
    hard = {"kind": "measured", "best_known": 10.0,
            "methods": {"cubic": {"mean_runs_to_target": 1.0, "reached": 5, "seeds": 5}}}
    _print_summary({"spaces": {"hard:w": hard}, "targets": {
        "never reached": {"measured": None, "target": 0.3, "met": False},
        "reached": {"measured": 0.442, "target": 0.3, "met": True}}})
    out = capsys.readouterr().out
    assert "target MISSED: never reached: measured none" in out and "target MET: reached: measured 0.442" in out
    assert "hard:w [measured]: best known 10 examples/s; runs to 98%: cubic 1.0 (reached 5/5)\n" in out
