"""experiments/answer_calibration.py: one small campaign of the known-noise job, re-measured, and
the committed result's convention (targets, label, load)."""

import json
from pathlib import Path

from tests.benchmark_convention import check_targets

ROOT = Path(__file__).resolve().parent.parent


def test_one_objective_campaign_is_confirmed_and_re_measured(tmp_path):
    from experiments.answer_calibration import one_campaign

    row = one_campaign("objective", 101, tmp_path, budget=4, steps=0, warmup=0)
    assert row["rc"] == 0, row.get("error")
    c = row["confirm"]
    assert c["winner"]["repeats"] >= 2 and c["runner_up"]["repeats"] >= 2
    re = row["remeasured"]
    assert len(re["winner"]["values"]) == 4 and re["winner"]["true"] in (100.0, 80.0, 75.0, 70.0)
    assert row["covered"] == (c["winner"]["lo"] <= re["winner"]["median"] <= c["winner"]["hi"])
    assert isinstance(row["flipped_and_apart"], bool) and row["confirm_wall_s"] >= 0
    # the headline speedup's second look: the baseline (the space's default point, a=1) re-measured, the
    # fresh ratio with its own interval, and the claimed interval against the job's true ratio
    sp, fresh = c["speedup"], row["speedup_remeasured"]
    assert re["baseline"]["point"] == {"a": 1} and len(re["baseline"]["values"]) == 4
    assert fresh["lo"] <= fresh["ratio"] <= fresh["hi"]
    assert row["speedup_covered"] == (sp["lo"] <= fresh["ratio"] <= sp["hi"])
    assert row["speedup_true"] == re["winner"]["true"] / 60.0
    assert row["speedup_covered_true"] == (sp["lo"] <= row["speedup_true"] <= sp["hi"])
    assert isinstance(row["speedup_contradicted"], bool)


def test_the_committed_result_follows_the_benchmark_convention():
    out = json.loads((ROOT / "results" / "answer_calibration.json").read_text())
    check_targets(out["targets"])
    rates = {"winner_interval_covers_remeasured_median", "wrong_separated_claims",
             "speedup_claims_contradicted_by_remeasurement", "speedup_interval_covers_true_ratio_known_noise_job"}
    assert rates <= set(out["targets"])
    for name in rates:  # a rate over a few campaigns carries its exact interval and whether it resolves
        t = out["targets"][name]
        lo, hi = t["ci95"]
        assert lo <= t["measured"] <= hi and isinstance(t["resolved"], bool) and t["over"] >= 1
        assert t["resolved"] or t["to_resolve"]
    assert out["label"].startswith("MEASURED") and "loadavg_1m_at_start" in out and out["code_version"]
    a = out["analysis"]
    assert a["campaigns_completed"] >= 10 or out["settings"]["quick"]
    assert a["confirm_wall_s_total"] > 0 and 0 < a["confirm_share_of_campaign_wall"] < 1
