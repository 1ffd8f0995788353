"""experiments/fp8_benchmark.py: the seed plan, the targets object (fast), and a --quick run (slow)."""

import json
import math
import sys

import pytest
import scipy.stats

from experiments import fp8_benchmark as fb
from tests.benchmark_convention import check_targets


def test_plan_seeds_asks_the_pilot_how_many_seeds_resolve_the_interval():
    pilot = fb.paired([0.002, -0.003, 0.004, -0.001])  # sd ~0.3%: dozens of seeds for +-0.1%
    plan = fb.plan_seeds(pilot, elapsed_s=40.0, per_seed_s=10.0, wall_budget_s=1e6, max_seeds=500)
    n = plan["seeds_needed"]
    assert plan["seeds_planned"] == n and 20 < n < 200
    t = scipy.stats.t.ppf(0.975, n - 1)  # independent of cubic.core.stats
    assert t * pilot["sd"] / math.sqrt(n) <= plan["planned_half_width"] < t * pilot["sd"] / math.sqrt(n - 1) * 1.2
    tight = fb.plan_seeds(pilot, elapsed_s=40.0, per_seed_s=10.0, wall_budget_s=100.0, max_seeds=500)
    assert tight["seeds_affordable"] == 4 + 6 and tight["seeds_planned"] == 10  # the budget caps it
    quiet = fb.plan_seeds(fb.paired([1e-5, -1e-5, 2e-5, 0.0]), 40.0, 10.0, 1e6, 500)
    assert quiet["seeds_planned"] == 4  # the pilot already resolves it: no extra seed


def test_second_look_replans_from_the_seeds_that_ran_and_says_so_when_missed():
    pilot = fb.paired([1e-3, -1e-3, 1.5e-3, -0.5e-3])  # sd ~0.1%: the pilot asks for a few seeds
    plan = fb.plan_seeds(pilot, 0.0, 10.0, 1e6, 500)
    ran = fb.paired([x * s for x in (5e-3, -5e-3, 4e-3, -4e-3, 6e-3) for s in (1, -1)])  # sd ~0.5%: far more
    assert not fb.decided(ran) and fb.last_stage(plan) is plan
    plan["second_look"] = fb.plan_seeds(ran, 0.0, 10.0, 100.0, 500, stage="second look")
    last = fb.last_stage(plan)
    assert last["from_seeds"] == 10 and last["seeds_needed"] > 5 * plan["seeds_needed"]
    reason = fb.quality_reason(ran, plan, {"median": 1.0})
    assert "second look's per-seed sd 0.512%" in reason and "over 10 seeds" in reason and "afforded 20" in reason
    assert fb.decided(fb.paired([5e-3, 5.1e-3, 4.9e-3, 5e-3]))  # wholly outside +-0.1%: no more seeds


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_plan_coverage_is_the_nominal_95_percent_when_the_plan_cannot_add_seeds():
    # caps at the pilot's 6 seeds: a fixed-n Student-t interval, whose coverage is exactly 95%
    fixed = {"from_seeds": 6, "seeds_affordable": 6, "max_seeds": 6}
    cov = fb.plan_coverage(2e-4, 3e-3, fixed, sims=600, seed=1)
    assert abs(cov["coverage"] - 0.95) < 0.03 and cov["median_seeds"] == 6 and cov["caps"] == [6, 6]
    grow = fb.plan_coverage(0.0, 3e-3, {"from_seeds": 4, "seeds_affordable": 60, "max_seeds": 500}, sims=100)
    assert grow["median_seeds"] > 20 and cov["label"].startswith("modelled")


def _quality(diffs, plan_budget=1e6, name="w"):
    st = fb.paired(diffs)
    plan = fb.plan_seeds(fb.paired(diffs[:4]), 0.0, 10.0, plan_budget, 500)
    return {"workload": name, "ne_rel_diff": {"recommended": st}, "seed_plan": plan, "recommended_sites": ["a"],
            "loadavg_1m_during_training": {"median": 1.0}}


def _payload(quality, tie_share=1.0, identical=(True, True)):
    sites = [{"site": f"s{i}", "all": {"tie_aware": tie_share == 1.0 or i > 0}} for i in range(2)]
    return {"quality": quality,
            "dispatch": {"share_tie_aware": tie_share, "share_agree": tie_share, "all": {"tie_aware": {"sites": 2}},
                         "sites": sites},
            "triton": {"available": True, "sites": [{"site": f"s{i}", "bit_identical_to_scaled_mm_rowwise": b}
                                                    for i, b in enumerate(identical)]}}


def test_targets_follow_the_convention_and_say_why_when_missed():
    resolved = _quality([2e-4, -1e-4, 1e-4, -2e-4, 0.0, 1e-4])
    wide = _quality([4e-3, -3e-3, 5e-3, -4e-3], plan_budget=0.0)  # the budget allows no seed beyond the pilot
    worse = _quality([5e-3, 5.1e-3, 4.9e-3, 5e-3], name="v")
    t = fb.targets(_payload([resolved]))
    check_targets(t)
    assert all(v["met"] and "reason" not in v for v in t.values())
    (q,) = [v for k, v in t.items() if k.startswith("w:")]
    assert q["measured"] == max(abs(x) for x in q["ci95"]) <= 1e-3
    t = fb.targets(_payload([wide, worse], tie_share=0.5, identical=(True, False)))
    assert not any(v["met"] for v in t.values()) and all(v["reason"] for v in t.values())
    reasons = [v["reason"] for k, v in t.items() if k.startswith(("w:", "v:"))]
    assert "not resolved in the time budget" in reasons[0] and "seeds" in reasons[0]
    assert reasons[1].startswith("measurably worse")
    json.dumps(t)  # what write_result stores


@pytest.mark.slow
def test_quick_run_writes_the_targets_object(tmp_path, monkeypatch):
    """`--quick` end to end (a few minutes): the JSON has the targets object and labelled sections."""
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["fp8_benchmark.py", "--quick", "--workers", "1"])
    fb.main()
    out = json.loads((tmp_path / "fp8_benchmark_quick.json").read_text())
    check_targets(out["targets"])
    assert out["context"]["code_version"] and "loadavg_1m_at_start" in out["context"]
    assert out["quality"][0]["seed_plan"]["seeds_planned"] >= out["quality"][0]["pilot_seeds"]
    assert (tmp_path / "fp8_benchmark_quick.png").is_file()
    # the torchao sections: parity measured per recipe; dlrm-wide's placement restricted to torchao's recipes
    assert out["torchao_parity"]["status"] == "run" and set(out["torchao_parity"]["per_recipe"]) == {
        "tensorwise", "rowwise", "rowwise_with_gw_hp"}
    ta = out["production"]["torchao"]
    assert set(ta["recipes"].values()) <= {"tensorwise", "rowwise", "rowwise_with_gw_hp"} and "speedup" in ta["step"]


def test_production_workload_is_wide_and_its_speed_is_modelled_at_the_production_batch():
    from cubic.core.workloads import PRODUCTION_BATCH, load_workload

    w = load_workload("dlrm-wide")
    assert max(w.dense_arch.top_mlp) >= 2048 and PRODUCTION_BATCH["dlrm-wide"] > 16 * w.batch_size
    site = {"m_target": PRODUCTION_BATCH["dlrm-wide"], "k": 2048, "n": 2048, "norm_before": False, "act_after": "relu"}
    tiny = dict(site, m_target=256, k=164, n=64)
    both = {"big": site, "tiny": tiny}
    none = fb.step_speedup(both, {})
    assert math.isclose(none["speedup"], 1.0) and "modelled" in none["label"]
    big = fb.step_speedup(both, {"big": "rowwise"})
    assert big["speedup"] > 1.0 > fb.step_speedup(both, {"tiny": "rowwise"})["speedup"]


def test_production_target():
    pr = {"workload": "dlrm-wide", "production_batch": 16384, "recommended_sites": ["a"],
          "sites_predicted_faster": {"a": 1.3}, "fast_sites_not_recommended": {},
          "step": {"speedup": 1.2}, "ne_rel_diff": fb.paired([2e-4, -1e-4, 1e-4, -2e-4, 0.0, 1e-4])}
    pr["target"] = fb.verdict(pr["ne_rel_diff"])
    payload = _payload([_quality([2e-4, -1e-4, 1e-4, -2e-4, 0.0, 1e-4])]) | {"production": pr}
    t = fb.targets(payload)
    check_targets(t)
    prod = [v for k, v in t.items() if k.startswith("dlrm-wide (production")]
    assert prod and prod[0]["met"] and prod[0]["predicted_dense_speedup_h100"] == 1.2
    assert [v for k, v in t.items() if "predicts faster" in k][0]["met"]
    # the torchao-restricted recommendation: its own NE target (here block128 -> rowwise at one site)
    ta = {"recommended_sites": ["a"], "recipes": {"a": "rowwise"}, "changed": {"a": ["block128", "rowwise"]},
          "step": {"speedup": 1.1}, "ne_rel_diff": fb.paired([4e-3, -3e-3, 5e-3, -4e-3])}
    ta["target"] = fb.verdict(ta["ne_rel_diff"])
    t = fb.targets(payload | {"production": pr | {"torchao": ta}})
    check_targets(t)
    (tt,) = [v for k, v in t.items() if "restricted to torchao" in k]
    assert not tt["met"] and "not resolved" in tt["reason"] and tt["changed"] == {"a": ["block128", "rowwise"]}
    # a recommended site the model does not predict faster fails the placement target
    t = fb.targets(payload | {"production": pr | {"sites_predicted_faster": {}}})
    assert not [v for k, v in t.items() if "predicts faster" in k][0]["met"]


def test_the_production_ne_target_is_judged_only_on_a_model_that_learns():
    """A paired NE difference on a model that has not learned is the spread of early trajectories, not
    FP8's cost: the target is not judged there, and says so with the full-precision NE it saw."""
    from experiments._fp8_quality import judged, learns
    from experiments.common import LEARNS_NE_BAR

    resolved = fb.verdict(fb.paired([2e-4, -1e-4, 1e-4, -2e-4, 0.0, 1e-4]))
    assert resolved["met"]
    fp = learns({0: 0.968, 1: 0.989, 2: 0.975}, steps=150)
    assert not fp["learns"] and fp["bar"] == LEARNS_NE_BAR and math.isclose(fp["mean"], (0.968 + 0.989 + 0.975) / 3)
    t = judged(resolved, fp)
    assert not t["met"] and t["not_judged"] and t["text"].startswith("NOT JUDGED: the full-precision model has not "
                                                                    "learned in 150 steps")
    assert t["text"].endswith(resolved["text"])  # the difference as measured, still shown
    assert "(mean end NE 0.977 over 3 seed(s) > 0.93)" in t["text"]
    assert judged(resolved, learns({0: 0.92, 1: 0.925}, steps=1000)) == resolved
    pr = {"workload": "dlrm-wide", "production_batch": 16384, "recommended_sites": ["a"],
          "sites_predicted_faster": {"a": 1.3}, "fast_sites_not_recommended": {}, "step": {"speedup": 1.2},
          "ne_rel_diff": fb.paired([2e-4, -1e-4, 1e-4, -2e-4, 0.0, 1e-4]), "target": t, "ne_full_precision": fp}
    tgt = fb.targets(_payload([_quality([2e-4, -1e-4, 1e-4, -2e-4, 0.0, 1e-4])]) | {"production": pr})
    check_targets(tgt)
    (prod,) = [v for k, v in tgt.items() if k.startswith("dlrm-wide (production")]
    assert not prod["met"] and prod["reason"].startswith("NOT JUDGED") and prod["full_precision_end_ne"] == fp["mean"]
    # the per-workload quality targets by the same rule, from the full-precision run the file keeps
    diffs = [2e-4, -1e-4, 1e-4, -2e-4, 0.0, 1e-4]
    learned, not_yet = _quality(diffs), _quality(diffs, name="v")
    learned |= {"steps": 150, "runs": {"full_precision": {"ne": 0.928}}}
    not_yet |= {"steps": 600, "runs": {"full_precision": {"ne": 0.941}}}
    tq = fb.targets(_payload([learned, not_yet]))
    check_targets(tq)
    w, v = (tq[f"{n}: recommended placement NE within +-0.1% of full precision, 95% CI over paired seeds (measured on "
               "this CPU)"] for n in ("w", "v"))
    assert w["met"] and w["full_precision_end_ne"] == 0.928 and "not_judged" not in w
    assert not v["met"] and v["not_judged"] and v["reason"].startswith("NOT JUDGED: the full-precision model has not "
                                                                       "learned in 600 steps (mean end NE 0.941 over 1")


def test_torchao_parity_section_reports_the_measured_differences_per_recipe(monkeypatch):
    pytest.importorskip("torchao.float8")
    import fp8.torchao_parity as tp

    small = tp.torchao_parity  # the real check, on one dtype and kernel per recipe (seconds)
    monkeypatch.setattr(tp, "torchao_parity", lambda: small(dtypes=("fp32",), real=(True,)))
    sec = fb.torchao_parity()
    assert sec["status"] == "run" and set(sec["per_recipe"]) == {"tensorwise", "rowwise", "rowwise_with_gw_hp"}
    t = fb.targets(_payload([_quality([2e-4, -1e-4, 1e-4, -2e-4, 0.0, 1e-4])]) | {"torchao_parity": sec})
    check_targets(t)
    p = t[fb.PARITY_KEY]
    assert p["met"] and p["target"].startswith("bit-identical where cubic runs torchao's _scaled_mm path")
    # the rowwise recipes run torchao's own path: bit-identical; tensorwise sums in another order on a CPU
    assert p["measured"]["rowwise"] == p["measured"]["rowwise_with_gw_hp"] == 0.0 and p["measured"]["tensorwise"] < 1e-4
    # a recipe that differs misses the target and is named, with the outputs that differ
    bad = dict(sec, met=False, per_recipe=dict(sec["per_recipe"], rowwise=dict(
        sec["per_recipe"]["rowwise"], met=False, max_abs_diff={"y": 0.0, "dx": 1e-6, "dw": 2e-6, "db": 0.0})))
    p = fb.targets(_payload([_quality([2e-4, -1e-4, 1e-4, -2e-4, 0.0, 1e-4])]) | {"torchao_parity": bad})[fb.PARITY_KEY]
    assert not p["met"] and p["measured"]["rowwise"] == 2e-6 and p["reason"] == "differs from torchao: rowwise: dx, dw"
    # torchao missing: not run, a missed target with why, never a figure
    monkeypatch.setattr(tp, "torchao_parity", lambda: (_ for _ in ()).throw(ImportError("no torchao")))
    p = fb.parity_target(fb.torchao_parity())
    assert p["met"] is False and p["measured"] is None and "no torchao" in p["reason"]


def test_mods_rescue_target_needs_unsafe_without_and_safe_with():
    base = _payload([_quality([2e-4, -1e-4, 1e-4, -2e-4, 0.0, 1e-4])])
    rs = {"workload": "wukong-small", "site": "l", "mods": ["split_outliers"], "recipe_without_mods": None,
          "recipe_with_mods": "rowwise", "best_without_mods": {}, "best_with_mods": {}, "reason": "r", "rescued": True}
    key = "a Mod widens the safe set: a real site unsafe without its Mods and safe with them (measured)"
    t = fb.targets(base | {"mods_rescue": rs})
    check_targets(t)
    assert t[key]["met"]
    t = fb.targets(base | {"mods_rescue": rs | {"recipe_without_mods": "rowwise", "rescued": False}})
    check_targets(t)
    assert not t[key]["met"] and "without Mods rowwise" in t[key]["reason"]


def test_the_rescue_file_gets_its_png_with_every_recipe_and_a_recipe_with_no_figures(tmp_path):
    from experiments._fp8_mods import plot_rescue

    row = {"sqnr_db": 25.0, "ci_low_db": 24.5, "ne_rel": -1e-4, "ne_rel_ci_low": -2e-4, "ne_rel_ci_high": 0.0}
    none = dict.fromkeys(row)  # a recipe the Probe could not judge: drawn as a gap, not a crash
    rs = {"workload": "wukong-small", "site": "l", "mods": ["pad_dims", "split_outliers"], "recipe_without_mods": None,
          "recipe_with_mods": "tensorwise", "budget_sqnr_db": 24.0, "budget_ne_rel": 2e-4, "rescued": True,
          "recipes_without_mods": {"tensorwise": row | {"ne_rel_ci_high": 3e-3}, "rowwise": none},
          "recipes_with_mods": {"tensorwise": row, "rowwise": row}}
    plot_rescue(rs, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_new_sections_leave_the_dispatch_target_alone():
    rs = {"workload": "w", "site": "l", "mods": [], "recipe_without_mods": None, "recipe_with_mods": None,
          "best_without_mods": {}, "best_with_mods": {}, "reason": "r", "rescued": False}
    t = fb.targets(_payload([_quality([2e-4, -1e-4, 1e-4, -2e-4, 0.0, 1e-4])], tie_share=0.5) | {"mods_rescue": rs})
    (d,) = [v for k, v in t.items() if k.startswith("Dispatch")]
    assert d["measured"] == 0.5 and "strict" in d


def test_production_only_merges_its_section_into_the_stored_run(tmp_path, monkeypatch):
    """--production-only re-runs the production section alone and merges it (with its own context) into
    the stored results; with no stored run it stops in one line naming the file."""
    import argparse

    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    args = argparse.Namespace(quick=True, workers=1, budget=24.0)
    with pytest.raises(SystemExit, match=r"results/fp8_benchmark_quick.json: no stored run"):
        fb._production_only(args)
    with pytest.raises(SystemExit, match=r"results/fp8_benchmark_quick.json: no stored run"):
        fb._retarget(args)
    stored = _payload([_quality([2e-4, -1e-4, 1e-4, -2e-4, 0.0, 1e-4])]) | {"context": {"code_version": "old"}}
    (tmp_path / "fp8_benchmark_quick.json").write_text(json.dumps(stored))
    pr = {"workload": "dlrm-wide", "production_batch": 16384, "recommended_sites": [],
          "sites_predicted_faster": {}, "fast_sites_not_recommended": {}, "step": {"speedup": 1.0},
          "ne_rel_diff": None, "target": {"met": False, "text": "not trained (quick run: no paired seeds)"}}
    monkeypatch.setattr(fb, "_production", lambda *a: dict(pr))
    monkeypatch.setattr(fb, "plot", lambda *a: None)
    fb._production_only(args)
    out = json.loads((tmp_path / "fp8_benchmark_quick.json").read_text())
    assert out["context"] == {"code_version": "old"} and out["quality"] == json.loads(json.dumps(stored["quality"]))
    assert out["production"]["workload"] == "dlrm-wide" and "--production-only" in out["production"]["context"]["what"]
    check_targets(out["targets"])
    assert any(k.startswith("dlrm-wide (production") for k in out["targets"])
    # --retarget: the section's verdicts recomputed with this code from its stored figures
    trained = dict(pr, recommended_sites=["a"], ne_rel_diff=fb.paired([2e-4, -1e-4, 1e-4, -2e-4, 0.0, 1e-4]),
                   ne_full_precision={"per_seed": [0.97], "mean": 0.97, "bar": 0.93, "learns": False, "steps": 150},
                   torchao={"recommended_sites": ["a"], "recipes": {"a": "rowwise"}, "changed": {},
                            "step": {"speedup": 1.0}, "ne_rel_diff": None, "target": {"met": False, "text": "old"}},
                   target={"met": True, "text": "met (resolved): old words"})
    (tmp_path / "fp8_benchmark_quick.json").write_text(json.dumps(dict(out, production=trained)))
    fb._retarget(args)
    again = json.loads((tmp_path / "fp8_benchmark_quick.json").read_text())
    assert again["production"]["target"]["text"].startswith("NOT JUDGED") and not again["production"]["target"]["met"]
    assert set(again["retargeted"]) == {"code_version", "at"} and again["context"] == out["context"]
    assert again["production"]["torchao"]["target"]["text"] == "old"  # nothing stored to judge it by: kept
    older = dict(trained)
    del older["torchao"]  # a section from before the torchao restriction: retargeted all the same
    (tmp_path / "fp8_benchmark_quick.json").write_text(json.dumps(dict(out, production=older)))
    fb._retarget(args)
    assert "torchao" not in json.loads((tmp_path / "fp8_benchmark_quick.json").read_text())["production"]
