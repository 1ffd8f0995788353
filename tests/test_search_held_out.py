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
    assert 1 <= row["cubic"][0] <= sec["budget"] + 1 and 1 <= row["tpe"][0] <= sec["budget"] + 1
    targets = held_out_targets(sec)
    assert len(targets) == 3 and all(k.startswith(PREFIX) for k in targets)
