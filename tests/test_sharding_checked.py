"""The planner's edge as `cubic shard plan` prints it (sharding.checked): the packaged record is the one
the sharding benchmark derives from the committed results file, so the two cannot drift."""

import json
from pathlib import Path

from sharding.checked import check_line, planner_check

ROOT = Path(__file__).resolve().parents[1]


def test_the_packaged_check_is_the_committed_results_files():
    from experiments.sharding_benchmark import planner_check_record

    results = json.loads((ROOT / "results" / "sharding_benchmark.json").read_text())
    assert planner_check() == json.loads(json.dumps(planner_check_record(results)))


def test_the_line_quotes_the_record_and_says_when_nothing_was_checked(tmp_path):
    rec = {"machine": "AMD EPYC", "code": "f2853367bb59", "bar_met": 6, "cells": 12, "below_torchrec": 11,
           "worst_task_met": 1, "regimes": 3, "own_model": {"bar_met": 5, "below_torchrec": 11, "worst_task_met": 0}}
    line = check_line(rec, here="AMD EPYC")
    assert "on this machine (AMD EPYC, code f285336)" in line
    assert "in 6 of 12 task-family x interconnect cells" in line and "TorchRec's planner in 11 of 12" in line
    assert "in 1 of 3 interconnects" in line and "trained there: 5 of 12 cells" in line
    assert "never checked" in check_line(planner_check(tmp_path / "none.json"))


def test_the_line_leads_with_this_machines_look_and_names_the_others():
    """A check made on two machines: a plan made on either quotes its own machine's look first; a plan
    made on a third says it was never checked there (the edge is its compute model's, per machine)."""
    epyc = {"machine": "AMD EPYC", "code": "d2c9744ba1db", "bar_met": 10, "cells": 12, "below_torchrec": 12,
            "worst_task_met": 1, "regimes": 3, "own_model": None}
    rec = {"machine": "Intel Xeon", "code": "4eea703b41db", "bar_met": 4, "cells": 12, "below_torchrec": 12,
           "worst_task_met": 0, "regimes": 3, "own_model": {"bar_met": 12, "below_torchrec": 12, "worst_task_met": 2},
           "other_machines": [epyc]}
    xeon = check_line(rec, here="Intel Xeon")
    assert "on this machine (Intel Xeon, code 4eea703): its plans cost >= 10% less than the best heuristic in 4 of " \
           "12" in xeon and "; on AMD EPYC (code d2c9744): 10 of 12 cells at the 10% bar" in xeon
    on_epyc = check_line(rec, here="AMD EPYC")
    assert "on this machine (AMD EPYC, code d2c9744): its plans cost >= 10% less than the best heuristic in 10 of" \
           in on_epyc and "; on Intel Xeon (code 4eea703): 4 of 12 cells at the 10% bar (12 with a compute model " \
           "trained there)" in on_epyc
    elsewhere = check_line(rec, here="Ampere Altra")
    assert "never checked on this machine (Ampere Altra); on Intel Xeon (code 4eea703): its plans cost >= 10% less " \
           "than the best heuristic in 4 of 12" in elsewhere
    assert "on AMD EPYC (code d2c9744): 10 of 12 cells" in elsewhere


def test_the_record_keeps_the_newest_earlier_look_of_each_other_machine():
    from experiments.sharding_benchmark import planner_check_record

    results = json.loads((ROOT / "results" / "sharding_benchmark.json").read_text())
    regs = list(results["regimes"])
    fams = list(results["regimes"][regs[0]])
    key = f"{regs[0]}: mean cost >= 10% below the best heuristic ({fams[0]})"

    def look(machine, started, met):
        return {"machine": machine, "started_at": started, "code_version": f"{machine[:3].lower()}{started[-3:-1]}",
                "targets": {key: {"met": met}}}

    doc = {**results, "earlier_looks": [look("Old CPU", "2026-01-01T00:00:01Z", True),
                                        look("Old CPU", "2026-01-02T00:00:02Z", False),
                                        look(results["fingerprint"]["cpu_model"], "2026-01-03T00:00:03Z", True)]}
    rec = planner_check_record(doc)
    assert [r["machine"] for r in rec["other_machines"]] == ["Old CPU"]  # this machine's own older look left out
    assert rec["other_machines"][0]["code"] == "old02" and rec["other_machines"][0]["bar_met"] == 0  # the newest
