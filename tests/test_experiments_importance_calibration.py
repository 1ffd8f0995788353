"""experiments/importance_calibration.py: the importance claims against a job of known truth."""

import json

import pytest

from experiments import importance_calibration as ic


def test_true_shares_are_the_additive_jobs_variance_decomposition():
    assert ic.true_shares((0.8, 0.4, 0.2)) == pytest.approx({"x1": 0.64 / 0.84, "x2": 0.16 / 0.84, "x3": 0.04 / 0.84})
    tie = ic.true_shares(ic.REGIMES["tie"])
    assert tie["x1"] == tie["x2"] > tie["x3"]


def test_a_resolved_claim_in_a_tie_is_wrong_and_a_missed_target_says_why():
    row = {"first": "x2", "resolved": True, "knobs": {"x1": [0.5, 0.2, 0.8], "x2": [0.45, 0.1, 0.45],
                                                      "x3": [0.05, 0.0, 0.2]},
           "narrow": {"x1": [0.3, 0.7], "x2": [0.2, 0.4], "x3": [0.1, 0.2]}}
    tie = ic.cell_figures("tie", [row])
    assert tie["wrong_resolved_claims"] == 1 and tie["ranked_first_wrongly_share"] == 1.0
    assert tie["held"] == 2 and tie["intervals"] == 3  # x2's [0.10, 0.45] misses its true 0.47
    assert tie["coverage_narrow"] == pytest.approx(1 / 3)  # the narrower range misses x2 and x3 (0.05)
    assert tie["held_out"] is False and ic.cell_figures("graded", [row])["held_out"] is True
    clear = ic.cell_figures("clear", [dict(row, first="x1")])
    assert clear["wrong_resolved_claims"] == 0 and clear["truly_first"] == "x1"
    t = ic.targets({"tie, 12 runs": tie, "clear, 12 runs": clear})
    cov = next(v for k, v in t.items() if k.startswith("tie, 12 runs"))
    assert cov["met"] is False and cov["narrow_range_measured"] == pytest.approx(1 / 3)
    assert cov["checked_on"] == "fresh seeds" and "x2 1" in cov["reason"]
    false_tie = next(v for k, v in t.items() if k.startswith("a tie"))
    assert false_tie["campaigns"] == 1 and false_tie["wrong"] == 1 and false_tie["met"] is False
    assert false_tie["reason"] == "1 of 1 campaigns"
    named = next(v for k, v in t.items() if k.startswith("one knob truly first"))
    assert named["claims"] == 1 and named["wrong"] == 0 and named["met"] is True


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_quick_run_writes_the_result_and_figure(tmp_path, monkeypatch):
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    assert ic.main(["--quick"]) == 0
    out = json.loads((tmp_path / "importance_calibration_quick.json").read_text())
    assert out["quick"] is True and len(out["cells"]) == 6 and (tmp_path / "importance_calibration_quick.png").exists()
    assert all(isinstance(v["met"], bool) for v in out["targets"].values())
