"""Early stopping of --objective jobs: a script printing intermediate metric lines is stopped by
an Optuna pruner once its curve is worse than the median of earlier runs, recorded as 'pruned'
(with its last value, step and curve), and the search credits it the value its curve was heading
for, never above the worst completed run."""

from __future__ import annotations

import sys

import optuna
import pytest

from cubic.runners.command import CommandRunner

SCRIPT = """
import json, sys, time
lr = float(sys.argv[1])
loss = 1.0
for step in range(1, 11):
    loss = abs(lr - 0.1) + 1.0 / step
    print(json.dumps({"step": step, "loss": loss}), flush=True)
    time.sleep(0.15)
open(f"done-{lr}", "w").close()
print(json.dumps({"loss": loss}))
"""


def test_pruner_stops_a_bad_job(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    runner = CommandRunner(f"{sys.executable} train.py {{lr}}", ["lr"], metric="loss", cwd=tmp_path,
                           pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=2),
                           direction="minimize")
    good = [runner({"lr": lr}) for lr in (0.1, 0.12)]
    assert all(r.ok for r in good) and good[0].metrics["loss"] < 0.2
    bad = runner({"lr": 5.0})
    # ended before its 10 steps (the runner returns once the job is dead); no clock, which a loaded
    # machine stretches
    assert (tmp_path / "done-0.1").exists() and not (tmp_path / "done-5.0").exists()
    assert not bad.ok and bad.failure_kind == "pruned" and not bad.transient
    assert 2 <= bad.metrics["pruned_step"] < 10 and bad.metrics["loss"] > 4.0
    # each run keeps its curve, the completed ones to their end, the stopped one to where it stopped
    assert good[0].extra["curve"] == [[st, abs(0.1 - 0.1) + 1.0 / st] for st in range(1, 11)]
    assert bad.extra["curve"][-1] == [bad.metrics["pruned_step"], bad.metrics["loss"]]
    states = [t.state for t in runner.curves.study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 2 + [optuna.trial.TrialState.PRUNED]
    # a job without intermediate lines is never stopped
    (tmp_path / "plain.py").write_text("import json,sys; print(json.dumps({'loss': float(sys.argv[1])}))")
    plain = CommandRunner(f"{sys.executable} plain.py {{lr}}", ["lr"], metric="loss", cwd=tmp_path,
                          pruner=optuna.pruners.MedianPruner(n_startup_trials=0))
    assert all(plain({"lr": v}).ok for v in (0.1, 3.0, 9.0))


def test_a_completed_run_keeps_the_lines_printed_after_the_last_look(tmp_path):
    """A job that prints its last steps and exits between two looks of the watcher (here: all of
    them, at once) keeps its whole curve; those lines are no longer judged (the run is done)."""
    (tmp_path / "fast.py").write_text("import json\nfor s in range(1, 6):\n"
                                      "    print(json.dumps({'step': s, 'loss': 10.0 - s}))\n"
                                      "print(json.dumps({'loss': 5.0}))\n")
    runner = CommandRunner(f"{sys.executable} fast.py {{lr}}", ["lr"], metric="loss", cwd=tmp_path,
                           pruner=optuna.pruners.MedianPruner(n_startup_trials=0, n_warmup_steps=0),
                           direction="minimize")
    runs = [runner({"lr": v}) for v in (0.1, 0.2)]
    assert all(r.ok for r in runs)
    assert all(r.extra["curve"] == [[st, 10.0 - st] for st in range(1, 6)] for r in runs)


def test_search_learns_from_pruned_runs():
    from cubic.core.result import Result
    from search.space import Parameter, Space
    from search.curves import credit_pruned
    from search.strategies import Observation, ProxyGuided, SearchContext

    space = Space(parameters=[Parameter(name="x", type="int", low=0, high=19)],
                  objectives=[{"metric": "loss", "direction": "minimize", "scale": "linear"}])
    hist = [Observation({"x": x}, Result(status="ok", metrics={"loss": float(abs(x - 5))})) for x in (0, 3, 5, 8)]
    hist += [Observation({"x": x}, Result.failed("pruned", "stopped early", metrics={"loss": 9.0}))
             for x in (15, 16, 17, 18, 19)]
    for seen in (hist, credit_pruned(space, hist)):  # as failures, and as the campaign gives them (curves)
        s = ProxyGuided(n_inner=32, families=("xgboost", "ridge")).bind(SearchContext(space=space, seed=0))
        picks = [p.point["x"] for p in s.propose(seen, 4)]
        assert sum(x >= 14 for x in picks) <= 1  # the pruned region is avoided


def test_a_pruned_run_is_credited_its_last_value_never_above_the_worst_completed_run():
    from cubic.core.result import Result
    from search.space import Parameter, Space
    from search.curves import credit_pruned
    from search.strategies import Observation

    space = Space(parameters=[Parameter(name="x", type="int", low=0, high=19)],
                  objectives=[{"metric": "loss", "direction": "minimize", "scale": "linear"}])
    done = [Observation({"x": x}, Result(status="ok", metrics={"loss": v})) for x, v in ((0, 2.0), (1, 4.0))]
    pruned = [Observation({"x": 5}, Result.failed("pruned", "early", metrics={"loss": 3.0, "pruned_step": 2.0})),
              Observation({"x": 6}, Result.failed("pruned", "early", metrics={"loss": 7.0}), violation=0.5),
              Observation({"x": 7}, Result.failed("pruned", "before any line")),
              Observation({"x": 8}, Result.failed("error", "crash", metrics={"loss": 1.0}))]
    out = credit_pruned(space, done + pruned)
    assert [o.point for o in out] == [o.point for o in done + pruned]  # same runs, same order
    a, b, c, d = out[2:]
    # a curve at 3.0 is credited 4.0 (the worst completed): stopped for looking worse, never better
    assert a.ok and a.metrics["loss"] == 4.0 and a.result.extra["pruned"] and a.metrics["pruned_step"] == 2.0
    assert b.ok and b.metrics["loss"] == 7.0 and b.violation == 0.5 and not b.feasible
    assert not c.ok and not d.ok  # no value: still a failure; a crash is never credited
    # before any run completed, or with two objectives, nothing to rank against: unchanged
    assert credit_pruned(space, pruned) == pruned
    two = Space(parameters=space.parameters, objectives=[{"metric": "loss", "direction": "minimize"},
                                                          {"metric": "mem", "direction": "minimize"}])
    assert credit_pruned(two, done + pruned) == done + pruned


def test_a_pruned_run_is_credited_the_gain_the_completed_runs_made_after_its_step():
    from cubic.core.result import Result
    from search.space import Parameter, Space
    from search.curves import CURVE_POINTS, credit_pruned, thin_curve
    from search.strategies import Observation

    space = Space(parameters=[Parameter(name="x", type="int", low=0, high=19)],
                  objectives=[{"metric": "loss", "direction": "minimize", "scale": "linear"}])

    def done(x, curve):
        return Observation({"x": x}, Result(status="ok", metrics={"loss": curve[-1][1]}, extra={"curve": curve}))

    def stopped(x, curve):
        return Observation({"x": x}, Result.failed("pruned", "early", metrics={"loss": curve[-1][1]},
                                                   extra={"curve": curve}))

    hist = [done(0, [[1, 5.0], [2, 3.0], [5, 1.0]]), done(1, [[1, 6.0], [3, 4.0], [5, 3.0]]),
            Observation({"x": 2}, Result(status="ok", metrics={"loss": 2.0})),  # no curve: no gain from it
            stopped(3, [[1, 9.0], [2, 8.0]]), stopped(4, [[1, 5.0], [2, 4.5]]), stopped(5, [[0, 7.0]])]
    out = credit_pruned(space, hist)
    a, b, c = out[3:]
    # gains from step 2 to the end: 1.0 - 3.0 and 3.0 - 6.0 (its last report at or before 2): median -2.5
    assert a.ok and a.metrics["loss"] == 5.5 and a.result.extra["median_gain_after"] == -2.5
    assert a.result.extra["last_value"] == 8.0 and a.result.extra["gain_from_runs"] == 2
    assert b.metrics["loss"] == 3.0  # 4.5 - 2.5 = 2.0 would beat the worst completed run (3.0): capped
    assert c.metrics["loss"] == 7.0 and c.result.extra["gain_from_runs"] == 0  # no curve reaches step 0
    # a curve is kept to its last point, thinned evenly past CURVE_POINTS
    long = thin_curve([(st, 1.0 / st) for st in range(1, 5 * CURVE_POINTS)])
    assert len(long) == CURVE_POINTS and long[0][0] == 1 and long[-1][0] == 5 * CURVE_POINTS - 1


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_campaign_prune_flag_stops_a_bad_run_and_records_it_as_pruned(tmp_path, monkeypatch, capsys):
    """`cubic campaign run --objective ... --prune median`: the pruner reaches the job's runs through
    the CLI (kept in the campaign's context), a run worse than the earlier ones at a step is stopped
    and stored as pruned."""
    from cubic.cli.app import main
    from cubic.core.store import TrialStore

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "space.yaml").write_text("version: 1\nname: lr\nobjectives: [{metric: loss, direction: minimize}]\n"
                                         "parameters:\n  - {name: lr, type: categorical, choices: [0.1, 0.11, 0.12, 5.0, 6.0]}\n")
    rc = main(["campaign", "run", "--objective", f"{sys.executable} train.py {{lr}}", "--space", "space.yaml",
               "--name", "p", "--strategy", "random", "--budget", "5", "--batch", "1", "--prune", "median",
               "--no-baseline", "--confirm-repeats", "0", "--storage", f"sqlite:///{tmp_path}/c.db",
               "--store", f"sqlite:///{tmp_path}/t.db"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    # the user sees a stopped run as stopped, not as a failure
    assert "-> PRUNED: stopped early at step" in err and "-> FAILED" not in err
    assert "stopped early by the pruner)" in out
    runs = {t.config["values"]["lr"]: t for t in TrialStore(f"sqlite:///{tmp_path}/t.db").trials(campaign="p")}
    assert len(runs) == 5 and all(runs[lr].status == "ok" for lr in (0.1, 0.11, 0.12))  # good curves run out
    pruned = [lr for lr in (5.0, 6.0) if runs[lr].failure_kind == "pruned"]
    assert pruned and all(runs[lr].metrics["pruned_step"] < 10 for lr in pruned)  # (the seeded order runs one late)
    assert main(["campaign", "run", "--objective", "x {lr}", "--space", "space.yaml", "--prune", "asha"]) == 2


def test_the_campaign_search_sees_a_pruned_run_as_its_curve_not_as_a_failure(tmp_path):
    from cubic.codesign.campaign import Campaign
    from cubic.core.result import Result
    from search.space import Parameter, Space

    space = Space(parameters=[Parameter(name="x", type="int", low=0, high=19)],
                  objectives=[{"metric": "loss", "direction": "minimize", "scale": "linear"}])

    def evaluate(p):  # x >= 10 looks bad early and is stopped by the pruner; curves as the runner keeps them
        if p["x"] >= 10:
            return Result.failed("pruned", "stopped early", metrics={"loss": 50.0 + p["x"], "pruned_step": 2.0},
                                 extra={"curve": [[1, 52.0 + p["x"]], [2, 50.0 + p["x"]]]})
        final = float(abs(p["x"] - 5))
        return Result(status="ok", metrics={"loss": final}, extra={"curve": [[1, final + 4], [2, final + 2], [3, final]]})

    c = Campaign(space, evaluate, name="prune", strategy="random", budget=12, batch_size=4, seed=3,
                 storage=f"sqlite:///{tmp_path}/c.db")
    seen: list = []
    propose = c.strategy.propose
    c.strategy.propose = lambda history, k: seen.append(list(history)) or propose(history, k)
    c.run()
    last = seen[-1]
    stopped = [o for o in last if o.point["x"] >= 10]
    assert stopped and all(o.ok and o.result.extra.get("pruned") for o in stopped)
    # its last value plus the completed runs' gain after step 2 (-2), still worse than every completed run
    assert all(o.metrics["loss"] == 48.0 + o.point["x"] and o.result.extra["gain_from_runs"] > 0 for o in stopped)
    # the curves are the study's intermediate values (the dashboard plots them)
    assert all(len(t.intermediate_values) in (2, 3) for t in c.study.trials if t.state.is_finished())
    # the study keeps the run as it was: stopped early, not a completed run
    assert all(r.failure_kind == "pruned" for r in c.observations() if r.point["x"] >= 10)
    # ... in Optuna's own state for it (the dashboard shows "Pruned", not "Fail"), with its last
    # reported value, and counted as a run of the budget
    trials = c.study.trials
    stopped_trials = [t for t in trials if t.params["x"] >= 10]
    assert stopped_trials and all(t.state == optuna.trial.TrialState.PRUNED for t in stopped_trials)
    assert all(t.value == 50.0 + t.params["x"] for t in stopped_trials)
    assert not any(t.state == optuna.trial.TrialState.FAIL for t in trials)
    assert len(trials) == 12 and len(c.observations()) == 12


def test_prune_warmup_reaches_the_pruner_and_needs_a_pruner(tmp_path, monkeypatch, capsys):
    """--prune-warmup STEP: no run is stopped before STEP (MedianPruner's n_warmup_steps,
    SuccessiveHalvingPruner's min_resource), kept in the campaign's job context; alone it is a
    one-line error naming the flag."""
    from cubic.cli.app import main
    from cubic.cli.campaign_job import job_runner
    from search.space import load_space

    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text("version: 1\nname: lr\nobjectives: [{metric: loss, direction: minimize}]\n"
                                         "parameters:\n  - {name: lr, type: categorical, choices: [0.1, 5.0]}\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    space = load_space(str(tmp_path / "space.yaml"))
    job = {"objective": f"{sys.executable} train.py {{lr}}", "prune": "median", "prune_warmup": 5}
    assert job_runner(job, space, None, None).curves.pruner._n_warmup_steps == 5
    assert job_runner({**job, "prune": "halving"}, space, None, None).curves.pruner._min_resource == 5
    assert job_runner({**job, "prune_warmup": None}, space, None, None).curves.pruner._n_warmup_steps == 1
    rc = main(["campaign", "run", "--objective", f"{sys.executable} train.py {{lr}}", "--space", "space.yaml",
               "--name", "w", "--prune-warmup", "3",
               "--storage", f"sqlite:///{tmp_path}/c.db", "--store", f"sqlite:///{tmp_path}/t.db"])
    err = capsys.readouterr().err
    assert rc == 2 and "--prune-warmup" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "c.db").exists() and not (tmp_path / "t.db").exists()  # nothing recorded


def test_the_baseline_and_its_repeats_are_measured_not_judged(tmp_path):
    """An audit (stop 65): under --prune a job's baseline repeats (its noise floor) and the confirm step's pairs
    were stopped by the pruner like candidates, leaving the campaign with no noise floor and an unpaired speedup
    whose headline did not say so. Runs made while the evaluate is unjudged are never stopped; their curves
    still join the pruner's study."""
    from cubic.codesign.evaluate import JobEvaluate, KeptRepeats

    (tmp_path / "train.py").write_text(SCRIPT)
    command = f"{sys.executable} train.py {{lr}}"
    runner = CommandRunner(command, ["lr"], metric="loss", cwd=tmp_path,
                           pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=2),
                           direction="minimize")
    ev = KeptRepeats(JobEvaluate(runner, {"objective": command}))
    assert all(ev({"lr": lr}).ok for lr in (0.1, 0.12))
    assert ev.add_repeat({"lr": 5.0}).ok  # a repeat of a bad configuration: measured to its end
    assert runner.judging and not ev({"lr": 5.0}).ok  # a candidate is judged as before
    states = [t.state for t in runner.curves.study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 3 + [optuna.trial.TrialState.PRUNED]
