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
    line = check_line(rec)
    assert "in 6 of 12 task-family x interconnect cells" in line and "TorchRec's planner in 11 of 12" in line
    assert "in 1 of 3 interconnects" in line and "trained there: 5 of 12 cells" in line and "f285336" in line
    assert "never checked" in check_line(planner_check(tmp_path / "none.json"))
