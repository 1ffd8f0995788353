"""search_benchmark --held-out: the held-out simulated clusters' section and its targets."""

from __future__ import annotations

import pytest

from experiments._search_held_out import PREFIX, held_out_targets, run_held_out


def _section(cubic: list[list[int]], orders: list[int], tpe=None, spent=0) -> dict:
    rows = [{"workload": "w", "instance": i, "cubic": c, "tpe": (tpe or [[60] * len(c)] * len(cubic))[i],
             "prior_order": o, "runs_without_prior_throughput": [spent] + [0] * (len(c) - 1)}
            for i, (c, o) in enumerate(zip(cubic, orders))]
    return {"rows": rows, "seeds": list(range(len(cubic[0]))), "budget": 60}


def _target(t: dict, words: str) -> dict:
    return next(v for k, v in t.items() if k.startswith(PREFIX) and words in k)


def test_the_prior_order_target_is_met_only_when_the_interval_is_below_zero():
    ahead = held_out_targets(_section([[3, 4], [5, 5], [2, 3]], [10, 12, 9]))
    assert _target(ahead, "prior's order")["met"] and _target(ahead, "prior's order")["ci95"][1] < 0
    mixed = held_out_targets(_section([[3, 4], [20, 22], [2, 3]], [10, 9, 9]))
    t = _target(mixed, "prior's order")
    assert not t["met"] and t["ci95"][0] < 0 < t["ci95"][1]
    assert "ahead on 2, behind on 1" in t["reason"]


def test_a_run_on_a_configuration_without_prior_throughput_misses_and_tpe_is_a_third():
    t = held_out_targets(_section([[3, 4], [5, 5]], [10, 12], spent=1))
    assert not _target(t, "no throughput")["met"] and _target(t, "no throughput")["measured"] == 2  # one each
    third = _target(t, "a third of TPE's")
    assert third["met"] and third["target"] == pytest.approx(20.0) and third["tpe_short_of_98pct"] == 0
    assert held_out_targets({"rows": [], "seeds": [0], "budget": 60}) == {}


def test_a_held_out_instance_is_searched_by_cubic_and_tpe_and_set_against_the_prior_order():
    # one hard instance of the generator (wukong-small on h100x16: a cluster with configurations the prior
    # marks invalid), one seed: the section's rows come from real campaigns over the simulated table
    sec = run_held_out([0], workloads=("wukong-small",), instances=(13,), log=lambda s: None)
    (row,) = sec["rows"]
    assert row["no_prior_throughput"] > 0 and row["prior_fraction"] < 0.98
    assert row["runs_without_prior_throughput"] == [0]
    assert all(1 <= row[m][0] <= sec["budget"] + 1 for m in ("cubic", "cubic-optuna", "tpe"))
    assert row["cubic-optuna_runs_without_prior_throughput"] == 0  # the sampler keeps to the prior's too
    targets = held_out_targets(sec)
    assert len(targets) == 4 and all(k.startswith(PREFIX) for k in targets)
    assert _target(targets, "CubicSampler")["sampler_runs_without_prior_throughput"] == 0


def test_the_sampler_target_follows_the_hard_sections_match_rule_and_is_absent_without_its_runs():
    sec = _section([[10, 10], [10, 10]], [12, 12])
    assert not any("CubicSampler" in k for k in held_out_targets(sec))
    for r, runs in zip(sec["rows"], ([12, 12], [13, 13])):
        r["cubic-optuna"], r["cubic-optuna_runs_without_prior_throughput"] = runs, 0
    assert _target(held_out_targets(sec), "CubicSampler")["met"]  # 12.5 against 10: within max(2, 25%)
    for r in sec["rows"]:
        r["cubic-optuna"] = [14, 14]
    assert not _target(held_out_targets(sec), "CubicSampler")["met"]  # 14 against 10: outside


def test_the_prior_order_a_user_runs_is_the_order_the_section_judges_against():
    # the prior-order strategy (a campaign's --baselines) through a real campaign reaches 98% at the run the
    # section's harness counts for walking the prior's order (all 25 hard instances agreed in stop 82)
    from cubic.codesign.campaign import Campaign
    from cubic.codesign.prior import cubic_featurizer
    from cubic.core.store import TrialStore
    from experiments import _search_tabular as tab
    from experiments._search_prior_dev import judged
    from experiments.search_benchmark import SIM_SPACE_PATH, TARGET
    from search.space import load_space

    space = load_space(SIM_SPACE_PATH)
    feat = cubic_featurizer(space)
    inst = judged(17, space, TrialStore("sqlite:///:memory:"), feat, "dmt-small", TARGET)
    table = inst["table"]
    c = Campaign(space, lambda p: table[space.key(p)], strategy="prior-order", budget=20, batch_size=4,
                 featurize=feat, context=inst["context"], name="order", target=inst["target"])
    n = tab.runs_to_target(c.run().best_so_far, inst["target"])
    assert inst["hard"] and n == inst["pick"]["runs_in_prior_order_to_target"] == 9
