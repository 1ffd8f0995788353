"""The plan's second look at its compute: the model's lookup ms against the same ranks measured here."""

import json

from cubic.cli.app import main
from sharding.estimate import SCALE_TOLERANCE, compute_check
from sharding.types import PlanCost, RankCost, load_plan


def cost(source, compute):
    ranks = [RankCost(rank=r, compute_ms=c, comm_ms=1.0, total_ms=c + 1.0, memory_bytes=0) for r, c in enumerate(compute)]
    return PlanCost.from_ranks(source, ranks)


def test_a_model_off_in_scale_warns_and_keeps_its_rank_order():
    check = compute_check(cost("modelled", [2.0, 4.0, 6.0, 8.0]), cost("measured", [1.0, 2.1, 2.9, 4.0]))
    assert abs(check.ratio - 20.0 / 10.0) < 1e-9 and not check.holds
    assert check.spearman == 1.0 and check.slowest_predicted == check.slowest_measured == 3
    assert "2.00x" in check.warning() and "cubic shard train" in check.warning()
    assert "per rank 1.90-2.07x" in check.line() and "the same" in check.line()


def test_a_model_within_tolerance_holds_and_says_where_ranks_disagree():
    check = compute_check(cost("modelled", [1.0, 1.2, 0.9]), cost("measured", [1.1, 1.0, 1.0]))
    assert check.holds and check.warning() is None
    assert check.slowest_predicted == 1 and check.slowest_measured == 0
    assert "1 by the model, 0 measured" in check.line()
    # a scale just past the tolerance, either way, does not hold
    assert not compute_check(cost("modelled", [SCALE_TOLERANCE * 1.01]), cost("measured", [1.0])).holds
    assert not compute_check(cost("modelled", [1.0]), cost("measured", [SCALE_TOLERANCE * 1.01])).holds


def test_empty_ranks_are_left_out_and_two_ranks_have_no_rank_order():
    check = compute_check(cost("modelled", [1.0, 0.3, 2.0]), cost("measured", [1.0, 0.0, 2.0]))
    assert check.rank_ratios == (1.0, 1.0) and check.spearman is None
    assert compute_check(cost("modelled", [1.0]), cost("measured", [0.0])) is None


def _csv(tmp_path):
    p = tmp_path / "tables.csv"
    p.write_text("name,rows,dim,pooling_factor,zipf_alpha\n"
                 + "".join(f"t{i},{2000 * (i + 1)},{8 * (1 + i % 4)},{1 + i},1.1\n" for i in range(8)))
    return p


def test_plan_on_cpu_measures_its_ranks_and_warns_exactly_when_the_scale_does_not_hold(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["shard", "plan", "--tables", str(_csv(tmp_path)), "--world-size", "4", "--memory-gb", "1",
                 "--batch-size", "64", "--time-budget", "0.3", "--device", "cpu", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    plan = load_plan(out)
    assert plan.predicted.source == "modelled" and plan.measured.source == "measured"
    assert plan.measured.details["repeats"] == 3
    check = compute_check(plan.predicted, plan.measured)
    assert f"the model predicts {check.ratio:.2f}x the measured lookup ms" in printed.out
    assert ("warning: the cost model's lookup ms are" in printed.err) == (not check.holds)
    # the table printed is the planner's (modelled) one; the measured figures are the check's
    assert "lookup ms (modelled" in printed.out


def test_no_check_leaves_the_plan_unmeasured_and_evaluate_prints_the_check(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["shard", "plan", "--tables", str(_csv(tmp_path)), "--world-size", "2", "--memory-gb", "1",
                 "--batch-size", "64", "--time-budget", "0.3", "--device", "cpu", "--no-check", "--out", str(out)]) == 0
    assert "compute check" not in capsys.readouterr().out
    assert json.loads(out.read_text())["measured"] is None
    assert main(["shard", "evaluate", str(out), "--repeats", "1"]) == 0
    assert "compute check (the plan's lookup MEASURED on this cpu against the model)" in capsys.readouterr().out


def test_rescale_re_plans_at_the_measured_scale_and_says_what_that_was_measured_to_buy(tmp_path, capsys, monkeypatch):
    """A model 10x off this machine: --rescale plans again with it scaled by the check's measured ratio,
    the plan's notes say so, and the check of the re-planned plan is near 1x."""
    import math

    import cubic.cli.shard as shard_cli
    from sharding.estimate import LearnedEstimator, ScaledEstimator

    monkeypatch.setattr(shard_cli, "_estimator", lambda path, device=None: ScaledEstimator(LearnedEstimator(), 10.0))
    out = tmp_path / "plan.json"
    assert main(["shard", "plan", "--tables", str(_csv(tmp_path)), "--world-size", "4", "--memory-gb", "1",
                 "--batch-size", "64", "--time-budget", "0.3", "--device", "cpu", "--rescale", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    plan = load_plan(out)
    assert "re-planned at the compute check's measured scale (--rescale: the model x" in plan.notes
    assert f"planned in {plan.planning_time_s:.2f} s" in printed  # the time printed is the one the plan keeps
    assert "re-planned at the compute check's measured scale" in printed and "results/sharding_rescale.json" in printed
    check = compute_check(plan.predicted, plan.measured)  # the re-planned plan's own check
    assert abs(math.log(check.ratio)) < math.log(2.0), check.ratio
    assert printed.index("re-planned") < printed.index(f"the model predicts {check.ratio:.2f}x")


def test_rescale_keeps_a_plan_whose_check_holds_and_needs_the_check(tmp_path, capsys, monkeypatch):
    from sharding.estimate import ComputeCheck

    monkeypatch.setattr(ComputeCheck, "holds", property(lambda self: True))
    out = tmp_path / "plan.json"
    args = ["shard", "plan", "--tables", str(_csv(tmp_path)), "--world-size", "2", "--memory-gb", "1",
            "--batch-size", "64", "--time-budget", "0.3", "--device", "cpu", "--rescale"]
    assert main(args + ["--out", str(out)]) == 0
    assert "--rescale: the check holds" in capsys.readouterr().out and "re-planned" not in load_plan(out).notes
    assert main(args + ["--no-check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--rescale" in err[0] and "--no-check" in err[0]


def test_the_learned_model_says_which_model_it_is_and_how_it_held(tmp_path):
    # an audit (stop 65): a user's 40-sample model and the packaged 5,000-sample one printed the same words
    import json
    import shutil

    from sharding.estimate import DEFAULT_MODEL_PATH, LearnedEstimator

    meta = json.loads(DEFAULT_MODEL_PATH.read_text())["meta"]
    packaged = LearnedEstimator(path=DEFAULT_MODEL_PATH).describe()
    assert f"the packaged model; {meta['samples']} samples, held-out MAPE" in packaged
    mine = tmp_path / "model.json"
    shutil.copy(DEFAULT_MODEL_PATH, mine)
    assert f"the model at {mine};" in LearnedEstimator(path=mine).describe()
