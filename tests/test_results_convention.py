"""Every committed results file keeps the benchmark convention (README): a targets object whose
entries have measured, target and a boolean met, and a reason for each miss -- the rule
experiments.common.write_result enforces on new runs, checked on what is in the repository."""

import json
from pathlib import Path

import pytest

from experiments.common import target_defects

RESULTS = sorted((Path(__file__).resolve().parent.parent / "results").glob("*.json"))


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_results_file_keeps_the_convention(path):
    assert target_defects(json.loads(path.read_text()).get("targets")) == []


def test_write_result_refuses_a_target_that_breaks_it(tmp_path, monkeypatch):
    import numpy as np

    from experiments import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    for bad in ({"x": {"measured": 1, "target": 2, "met": np.bool_(False), "reason": "r"}},
                {"x": {"measured": 1, "target": 2, "met": False}}, {}):
        with pytest.raises(ValueError, match="results/bench.json"):
            common.write_result("bench", {"targets": bad})
    assert not list(tmp_path.iterdir())  # nothing written
    common.write_result("bench", {"targets": {"x": {"measured": 1, "target": 2, "met": False, "reason": "r"}}})
    assert (tmp_path / "bench.json").exists()


def test_write_result_names_a_file_of_the_checkout_by_its_path_in_the_repository(tmp_path, monkeypatch):
    """two_d.json and sharding_benchmark.json recorded /work/bench/cost_models/...: the benchmark
    worktree's path, which no reader has."""
    from experiments import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    inside, outside = str(common.REPO / "cost_models" / "data" / "c.json"), "/home/u/.cubic/c.json"
    common.write_result("bench", {"targets": {"x": {"measured": 1, "target": 1, "met": True}},
                                  "sources": {"a": f"gloo calibration {inside} (this machine: True)", "b": outside}})
    out = json.loads((tmp_path / "bench.json").read_text())
    assert out["sources"] == {"a": "gloo calibration cost_models/data/c.json (this machine: True)", "b": outside}
