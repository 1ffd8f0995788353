"""The answer first: the winner against the baseline (cubic.codesign.answer) and winner.yaml."""

import pytest
import yaml

from cubic.cli.app import main
from cubic.codesign.answer import campaign_answer, default_point, fmt, read_baseline_point, write_answer
from cubic.codesign.campaign import Campaign
from cubic.codesign.importance import Importance, KnobImportance
from cubic.codesign.storage import load_meta
from cubic.core.config import Config, load_config
from cubic.core.spec import SpecError
from search.space import Space

SPACE = {"name": "toy", "objectives": [{"metric": "examples_per_s"}],
         "constraints": [{"metric": "ne", "max": 1.0}],
         "parameters": [{"name": "batch", "type": "categorical", "choices": [64, 128, 256, 512]},
                        {"name": "lr", "type": "float", "low": 0.001, "high": 0.1, "log": True}]}


def job(point):  # throughput grows with the batch; NE worsens past 256 (infeasible at 512)
    b = point["batch"]
    return {"examples_per_s": 1000.0 * b, "ne": 0.8 + b / 2000, "peak_mem_bytes": 1e9 + b * 1e6}


def finished(tmp_path, evaluate=job, baseline=None, budget=6, **kw):
    space = Space.model_validate(SPACE)
    c = Campaign(space, evaluate, name="toy", strategy="random", budget=budget, batch_size=budget,
                 storage=f"sqlite:///{tmp_path}/c.db", **kw)
    if baseline is not None:
        c.measure_baseline(baseline, "today's job")
    c.run()
    trials = c.study.get_trials()
    return space, load_meta(c.storage, "toy"), c.study, trials


@pytest.mark.parametrize("x,text", [(123456.7, "123,000"), (1.23456, "1.23"), (0.0012345, "0.00123"),
                                    (0, "0"), (-0.5, "-0.500"), (9.999e-7, "1.00e-06")])
def test_numbers_for_people_have_three_significant_digits(x, text):
    assert fmt(x) == text


def test_default_point_is_in_the_space():
    space = Space.model_validate(SPACE)
    point = default_point(space)
    assert point == {"batch": 64, "lr": 0.01} and space.validate_point(point) == point


def test_speedup_against_a_measured_baseline_single_sample(tmp_path):
    space, meta, study, trials = finished(tmp_path, baseline={"batch": 64, "lr": 0.01}, budget=8)
    ans = campaign_answer(space, meta, study, trials)
    best = max((t for t in trials if t.user_attrs["ok"] and t.user_attrs["violation"] == 0),
               key=lambda t: t.user_attrs["metrics"]["examples_per_s"])
    assert ans.winner["number"] == best.number and best.params["batch"] != 512  # 512 breaks the NE floor
    assert ans.ratio == pytest.approx(best.params["batch"] / 64)
    assert ans.interval is None and "single sample" in ans.headline()
    md = ans.markdown()
    assert "today's job" in md and "ne (lower is better)" in md and "peak memory (GiB" in md
    assert f"| batch | 64 | {best.params['batch']}" in md  # the knob, with the baseline's value
    imp = Importance(knobs={"batch": KnobImportance(0.9, 0.6, 1.0), "lr": KnobImportance(0.1, 0.0, 0.4)},
                     runs=8, draws=((0.9, 0.1),) * 90 + ((0.1, 0.9),) * 10)  # 100 resamples, batch first in 90
    with_imp = campaign_answer(space, meta, study, trials, importance=imp).markdown()
    assert "| batch | 64 |" in with_imp.split("| lr |")[0]  # most important first
    assert "| 0.90 [0.60–1.00] |" in with_imp  # the share with its interval over the runs
    assert "batch ranks first in 90% of them: which knob mattered most is not resolved at 8 runs" in with_imp
    why = campaign_answer(space, meta, study, trials, no_importance="3 completed runs (needs 4)").markdown()
    assert "which knobs mattered is not known: 3 completed runs (needs 4)" in why and "| importance" not in why


def test_interval_from_both_runs_and_none_when_the_baseline_failed(tmp_path):
    def with_ci(point):
        m = job(point)
        m.update(examples_per_s_ci_lo=0.9 * m["examples_per_s"], examples_per_s_ci_hi=1.1 * m["examples_per_s"])
        return m

    space, meta, study, trials = finished(tmp_path, evaluate=with_ci, baseline={"batch": 64, "lr": 0.01})
    ans = campaign_answer(space, meta, study, trials)
    lo, hi = ans.interval
    assert lo == pytest.approx(ans.ratio * 0.9 / 1.1) and hi == pytest.approx(ans.ratio * 1.1 / 0.9)
    assert "95% CI" in ans.headline()

    def failing_baseline(point):
        if point["batch"] == 64 and point["lr"] == 0.01:
            raise RuntimeError("CUDA out of memory")
        return job(point)

    (tmp_path / "c.db").unlink()
    space, meta, study, trials = finished(tmp_path, evaluate=failing_baseline, baseline={"batch": 64, "lr": 0.01})
    ans = campaign_answer(space, meta, study, trials)
    assert ans.ratio is None and "baseline run failed" in ans.markdown() and "×" not in ans.headline()


def test_no_winner_says_why_and_writes_no_winner(tmp_path):
    space, meta, study, trials = finished(tmp_path, evaluate=lambda p: {"examples_per_s": 1.0, "ne": 2.0})
    ans = campaign_answer(space, meta, study, trials)
    assert ans.winner is None and "no winner" in ans.headline() and "infeasible 6" in ans.markdown()
    (tmp_path / "winner.yaml").write_text("stale")
    write_answer(tmp_path, ans)
    assert not (tmp_path / "winner.yaml").exists() and (tmp_path / "answer.md").exists()


def test_a_users_winner_yaml_is_a_baseline_for_the_next_campaign(tmp_path):
    space, meta, study, trials = finished(tmp_path, baseline={"batch": 64, "lr": 0.01})
    ans = campaign_answer(space, meta, study, trials)
    write_answer(tmp_path, ans)
    assert read_baseline_point(str(tmp_path / "winner.yaml"), space) == ans.winner["point"]
    (tmp_path / "b.yaml").write_text("batch: 3\n")
    with pytest.raises(SpecError, match="b.yaml: batch"):
        read_baseline_point(str(tmp_path / "b.yaml"), space)


def test_cubic_winner_yaml_is_the_config_cubic_run_takes(tmp_path, monkeypatch, capsys):
    """A simulated campaign; its winner.yaml is exactly the winning Config, and `cubic run --config`
    accepts it unchanged (on the simulated cluster here: the local training run is the slow test)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({
        "name": "sim-local", "objectives": [{"metric": "examples_per_s"}],
        "parameters": [{"name": "batch_size", "type": "categorical", "choices": [256, 1024, 4096]},
                       {"name": "kernels.dense_dtype", "type": "categorical", "choices": ["fp32", "bf16"]}]}))
    db = ["--storage", f"sqlite:///{tmp_path}/c.db", "--store", f"sqlite:///{tmp_path}/t.db"]
    assert main(["campaign", "run", "--workload", "dlrm-small", "--space", "space.yaml", "--simulate", "h100x8",
                 "--name", "s", "--budget", "3", "--batch", "3", "--report", "rep", *db]) == 0
    out = capsys.readouterr().out
    assert out.index("## Answer") < out.index("Baseline: the workload's defaults")
    cfg = load_config("rep/winner.yaml")
    point = yaml.safe_load(open("rep/winner.json"))["point"]
    assert cfg.batch_size == point["batch_size"] and cfg.kernels.dense_dtype == point["kernels.dense_dtype"]
    assert cfg == Config(batch_size=point["batch_size"], kernels={"dense_dtype": point["kernels.dense_dtype"]})
    page = open("rep/index.html").read()
    assert page.index("Answer") < page.index('id="fig-best_so_far"')
    assert "Kendall" not in page.split("<h2>Campaign</h2>")[1].split("</table>")[0]  # 3 points: no tau
    # the command the answer prints works as printed (workload, run length, cluster included)
    import shlex

    printed = next(line for line in out.splitlines() if "cubic run --workload" in line).split("`")[3]
    argv = shlex.split(printed)
    assert argv[:2] == ["cubic", "run"] and "--simulate" in argv and "rep/winner.yaml" in argv
    assert main(argv[1:] + ["--store", f"sqlite:///{tmp_path}/t.db"]) == 0


@pytest.mark.slow  # a real local training run: ~10-30 s on a busy 2-core machine
def test_cubic_run_trains_the_winner_yaml_locally(tmp_path, monkeypatch):
    from cubic.codesign.answer import Answer

    monkeypatch.chdir(tmp_path)
    ans = Answer(campaign="c", metric="examples_per_s", direction="maximize", source="measured", runs=1,
                 winner={"number": 0, "point": {"batch_size": 256}, "metrics": {"examples_per_s": 1.0}},
                 config=Config(batch_size=256).model_dump(mode="json"))
    write_answer(tmp_path, ans)
    assert main(["run", "--workload", "dlrm-small", "--config", "winner.yaml", "--steps", "1", "--warmup", "0",
                 "--threads", "1", "--store", f"sqlite:///{tmp_path}/t.db"]) == 0


def test_a_runner_up_tied_with_the_winner_is_named_in_the_headline():
    from cubic.codesign.answer import Answer

    def side(batch, value):
        return {"point": {"batch": batch, "lr": 0.01}, "value": value, "lo": 0.8 * value, "hi": 1.2 * value,
                "repeats": 3}

    confirm = {"metric": "examples_per_s", "separated": False, "verdict": "tied within the repeat budget",
               "winner": side(4096, 229.0), "runner_up": side(2048, 209.0)}
    ans = Answer(campaign="c", metric="examples_per_s", direction="maximize", source="measured", runs=12,
                 winner={"number": 0, "point": confirm["winner"]["point"], "metrics": {}}, ratio=1.98,
                 interval=(1.23, 3.16), confirm=confirm)
    assert ans.headline() == ("The winner is 1.98× faster than the baseline (95% CI 1.23–3.16×) on examples_per_s, "
                              "measured; tied with the runner-up (batch 2048) within the repeat budget: the evidence "
                              "does not rank the two, winner.yaml holds the one the search ranked first.")
    ans.confirm = {**confirm, "separated": True}
    assert ans.headline().endswith("on examples_per_s, measured.")  # separated: the winner alone


def test_a_speed_winner_without_ne_says_its_quality_is_not_compared(tmp_path):
    # a user's job that prints only its throughput: the headline must not read as "faster at no cost"
    space, meta, study, trials = finished(tmp_path, evaluate=lambda p: {"examples_per_s": 1000.0 * p["batch"]},
                                          baseline={"batch": 64, "lr": 0.01})
    head = campaign_answer(space, meta, study, trials).headline()
    assert "faster" in head and head.endswith("; its quality is not compared: the runs report no NE, so a quality "
                                              "cost would not show.")
    (tmp_path / "c.db").unlink()
    space, meta, study, trials = finished(tmp_path, evaluate=lambda p: {"examples_per_s": 1000.0 * p["batch"],
                                                                        "ne": 0.8},
                                          baseline={"batch": 64, "lr": 0.01})
    assert "quality is not compared" not in campaign_answer(space, meta, study, trials).headline()


def test_a_speed_winner_without_ne_names_the_constraint_that_bounded_its_quality(tmp_path):
    doc = {**SPACE, "constraints": [{"metric": "loss", "max": 0.5}]}
    space = Space.model_validate(doc)
    c = Campaign(space, lambda p: {"examples_per_s": 1000.0 * p["batch"], "loss": 0.4}, name="toy",
                 strategy="random", budget=4, batch_size=4, storage=f"sqlite:///{tmp_path}/c.db")
    c.measure_baseline({"batch": 64, "lr": 0.01}, "today's job")
    c.run()
    head = campaign_answer(space, load_meta(c.storage, "toy"), c.study, c.study.get_trials()).headline()
    assert head.endswith("; its quality is not compared: the runs report no NE, only the constraint loss <= 0.500 "
                         "bounded it.")


def test_qps_is_a_throughput(tmp_path):
    # README's --objective example reports "qps": a speed, so "faster" and the quality clause apply
    doc = {**SPACE, "objectives": [{"metric": "qps"}], "constraints": []}
    space = Space.model_validate(doc)
    c = Campaign(space, lambda p: {"qps": 10.0 * p["batch"]}, name="toy", strategy="random", budget=4,
                 batch_size=4, storage=f"sqlite:///{tmp_path}/c.db")
    c.measure_baseline({"batch": 64, "lr": 0.01}, "today's job")
    c.run()
    head = campaign_answer(space, load_meta(c.storage, "toy"), c.study, c.study.get_trials()).headline()
    assert "× faster than the baseline" in head and "quality is not compared" in head


def test_a_jobs_ne_across_batch_sizes_is_not_called_an_equal_budget(tmp_path):
    # README's bundled job trains a fixed number of steps: batch 1024 against 256 saw 4x the examples
    space, meta, study, trials = finished(tmp_path, baseline={"batch": 64, "lr": 0.01}, budget=8)
    ans = campaign_answer(space, meta, study, trials)
    assert ans.winner["point"]["batch"] != 64
    md = ans.markdown()
    assert "with batch 64 -> " in md and "not an equal training budget" in md
    assert "(not an equal budget if the job runs fixed steps, below)" in md
    assert "its NE may not be an equal training budget (a batch knob differs; below)" in ans.headline()


def test_a_ratio_interval_that_excludes_1_never_prints_as_1():
    """An audit (stop 66): "separated ... 95% CI 1.00-1.07x" of a lower bound 1.0028."""
    from cubic.codesign.answer import ratio_ci

    assert ratio_ci(1.0028, 1.07, "-") == "1.003-1.070"
    assert ratio_ci(0.93, 0.9996) == "0.9300–0.9996"
    assert ratio_ci(1.2, 1.5) == "1.20–1.50"


def test_the_printed_command_of_a_distributed_campaign_runs_on_its_processes():
    """A campaign measured on W gloo processes prints `cubic run ... --world-size W`: without it the
    command would measure one process, another trial than the one the answer quotes."""
    import shlex

    from cubic.codesign.answer import run_command

    ctx = {"workload": "wukong-small", "runner": {"kind": "distributed", "world_size": 2, "steps": 16, "warmup": 2,
                                                  "threads": 1}}
    argv = shlex.split(run_command(ctx))
    assert argv[argv.index("--world-size") + 1] == "2" and argv[argv.index("--steps") + 1] == "16"
    local = shlex.split(run_command({"workload": "dlrm-small", "runner": {"kind": "local", "world_size": 1}}))
    assert "--world-size" not in local
