"""experiments/against_pick_calibration.py: the answer's line against the step model's pick, judged by a job
whose true medians are known."""

import json
from pathlib import Path

import pytest

from experiments import against_pick_calibration as ap
from experiments._noisy_job import true_qps
from experiments.common import rate_target

RESULT = Path(__file__).resolve().parent.parent / "results" / "against_pick_calibration.json"


def test_each_step_model_picks_what_its_docstring_says():
    picks = {k: max(t, key=t.get) for k, t in ap.PRIORS.items()}
    assert picks == {"right": 4, "near": 5, "off": 3, "wrong": 6}
    assert all(sorted(t) == [1, 2, 3, 4, 5, 6] for t in ap.PRIORS.values())


def test_one_campaign_sets_the_line_against_the_truth(tmp_path):
    row = ap.one_campaign("wrong", "clear", 1, tmp_path)
    assert row["pick"] == 6 and "error" not in row  # the step model's pick ran first, as the line says
    assert row["true_ratio"] == pytest.approx(true_qps(row["winner"], "clear") / 50.0)
    assert row["line"].startswith("against the step model alone")
    if "covered" in row:  # a winner other than the pick, with the line's interval
        assert row["covered"] == (row["lo"] <= row["true_ratio"] <= row["hi"])
        assert row["wrong"] == (row["separated"] and row["true_ratio"] <= 1.0)


def test_a_wrong_claim_and_a_missed_interval_are_counted_and_the_miss_says_why():
    rows = [{"covered": True, "separated": True, "wrong": False}] * 8 + [
        {"covered": False, "separated": True, "wrong": True}, {"covered": False, "separated": False, "wrong": False}]
    t = ap.targets(rows, quick=False)
    cov, wrong = t["against_pick_interval_covers_true_ratio"], t["wrong_separated_against_pick"]
    assert cov["measured"] == 0.8 and cov["met"] is False and "true ratio" in cov["reason"]
    assert wrong["measured"] == pytest.approx(1 / 9) and wrong["met"] is False and wrong["over"] == 9
    assert t["campaigns"] == {"measured": 10, "target": 10, "met": True}
    sides = ap.misses_by_side([{"missed": "above"}, {"missed": "above"}, {"missed": "below"}, {"covered": True}])
    assert (sides["above"], sides["below"]) == (2, 1)


def test_a_rate_target_is_resolved_only_when_its_exact_interval_lies_on_its_side():
    thin = rate_target(10, 10, 0.9, True, "campaigns", "why")
    assert thin["met"] is True and thin["resolved"] is False and "campaigns at the rate seen" in thin["to_resolve"]
    wide = rate_target(100, 100, 0.9, True, "campaigns", "why")
    assert wide["resolved"] is True and "to_resolve" not in wide and "reason" not in wide
    assert rate_target(1, 2, 0.9, True, "campaigns", "why")["reason"] == "why"


def test_the_committed_result_holds_what_its_campaigns_say():
    out = json.loads(RESULT.read_text())
    assert out["quick"] is False and len(out["cells"]) == len(ap.PRIORS) * len(ap.TABLES)
    assert all(isinstance(v["met"], bool) for v in out["targets"].values())
    judged = [r for r in out["campaigns"] if "covered" in r]
    assert all(r["covered"] == (r["lo"] <= r["true_ratio"] <= r["hi"]) for r in judged)
    cov = out["targets"]["against_pick_interval_covers_true_ratio"]
    assert cov["over"] == len(judged)
    assert cov["measured"] == pytest.approx(sum(r["covered"] for r in judged) / len(judged))


@pytest.mark.slow  # ~20 s: the slow suite (.ci/run runs it after make test)
def test_quick_run_writes_the_result_and_figure(tmp_path, monkeypatch):
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    assert ap.main(["--quick"]) == 0
    out = json.loads((tmp_path / "against_pick_calibration_quick.json").read_text())
    assert out["quick"] is True and len(out["campaigns"]) == 8
    assert (tmp_path / "against_pick_calibration_quick.png").exists()
