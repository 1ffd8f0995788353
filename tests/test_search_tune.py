"""CubicSearcher: save/restore without Ray, and a real Tuner.fit on a local Ray with ASHA
stopping trials that report intermediate results (the stopped ones reach the searcher as PRUNED)."""

from __future__ import annotations

import math

import optuna
import pytest

pytest.importorskip("ray")
from ray import tune  # noqa: E402

from search.tune import CubicSearcher  # noqa: E402

SPACE = {"lr": tune.loguniform(1e-4, 1e-1), "model": {"width": tune.choice([16, 64, 256])}}
MAX_T = 6


def curve(config, step):
    # the loss after `step` epochs: best near lr 1e-2, wider is better
    final = (math.log10(config["lr"]) + 2) ** 2 + 16 / config["model"]["width"]
    return final + 3.0 * math.exp(-0.7 * step)


def test_suggest_complete_save_restore(tmp_path):
    s = CubicSearcher(SPACE, metric="loss", mode="min", seed=0, batch_size=2, max_t=MAX_T)
    for i in range(6):
        cfg = s.suggest(f"t{i}")
        assert set(cfg) == {"lr", "model"} and cfg["model"]["width"] in (16, 64, 256)
        for step in range(1, 3):
            s.on_trial_result(f"t{i}", {"loss": curve(cfg, step), "training_iteration": step})
        done = i % 2 == 0
        s.on_trial_complete(f"t{i}", {"loss": curve(cfg, MAX_T if done else 2),
                                      "training_iteration": MAX_T if done else 2})
    states = [t.state for t in s.study.trials]
    assert states.count(optuna.trial.TrialState.PRUNED) == 3
    s.save(str(tmp_path / "ckpt"))
    r = CubicSearcher(seed=0)
    r.restore(str(tmp_path / "ckpt"))
    assert len(r.study.trials) == 6
    # the restored searcher proposes what the original one proposes next (state from the trials)
    assert r.suggest("n") == s.suggest("n")



def test_a_none_choice_in_a_tune_space():
    """``tune.choice([None, ...])`` (a Tune space converted to Optuna's): suggested and learned from."""
    s = CubicSearcher({"norm": tune.choice([None, "layer"]), "lr": tune.loguniform(1e-4, 1e-1)}, metric="loss",
                      mode="min", seed=0, batch_size=2)
    seen = []
    for i in range(6):
        cfg = s.suggest(f"t{i}")
        seen.append(cfg["norm"])
        s.on_trial_complete(f"t{i}", {"loss": (cfg["norm"] is not None) + abs(math.log10(cfg["lr"]) + 2)})
    assert set(seen) <= {None, "layer"} and None in seen[1:]
    assert {t.state for t in s.study.trials} == {optuna.trial.TrialState.COMPLETE}


def test_a_metric_that_is_not_a_number_fails_its_trial_not_the_tuner():
    """A trial that reports its metric as text stopped the whole Tuner (float("high") raised inside
    on_trial_result): now that trial is told FAIL, naming what it reported; a number sent as text counts."""
    s = CubicSearcher(SPACE, metric="loss", mode="min", seed=0, batch_size=2)
    for i, bad in enumerate(["high", float("nan"), None]):
        s.suggest(f"b{i}")
        s.on_trial_result(f"b{i}", {"loss": bad, "training_iteration": 1})
        s.on_trial_complete(f"b{i}", {"loss": bad, "training_iteration": 1})
    s.suggest("ok")
    s.on_trial_result("ok", {"loss": "0.5", "training_iteration": 1})
    s.on_trial_complete("ok", {"loss": "0.25", "training_iteration": 1})
    states = [t.state for t in s.study.trials]
    assert states == [optuna.trial.TrialState.FAIL] * 3 + [optuna.trial.TrialState.COMPLETE]
    assert "'high': not a finite number" in s.study.trials[0].user_attrs["fail_reason"]
    assert s.study.trials[3].value == 0.25 and s.study.trials[3].intermediate_values == {1: 0.5}


def test_restore_of_what_is_no_checkpoint_names_the_file_and_keeps_the_searcher(tmp_path):
    """A torn, foreign or other-version file was a bare JSONDecodeError, TypeError or KeyError: 'dists',
    and a half-loaded searcher; now one ValueError naming the file, the searcher as it was."""
    import json

    s = CubicSearcher(SPACE, metric="loss", mode="min", seed=0, batch_size=2)
    cfg = s.suggest("t0")
    s.on_trial_complete("t0", {"loss": curve(cfg, MAX_T)})
    good = tmp_path / "good"
    s.save(str(good))
    doc = json.loads(good.read_text())
    bad = {"torn": good.read_text()[:40], "a list": "[]", "version 1": json.dumps({**doc, "version": 1}),
           "no trials": json.dumps({k: v for k, v in doc.items() if k != "trials"}),
           "mode sideways": json.dumps({**doc, "mode": "sideways"})}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=f"^{tmp_path / name}: not a CubicSearcher checkpoint") as e:
            s.restore(str(tmp_path / name))
        assert "\n" not in str(e.value)
        assert s._mode == "min" and len(s.study.trials) == 1  # the searcher as it was
    s.restore(str(good))
    assert len(s.study.trials) == 1


def test_a_searcher_given_its_space_pickles_as_tune_does():
    """Tuner(...) pickles its TuneConfig with the searcher in it: a searcher built with its space and
    mode (its Optuna study already made, which holds locks) must pickle, before and after trials."""
    import pickle

    from ray import cloudpickle

    s = CubicSearcher(SPACE, metric="loss", mode="min", seed=0, batch_size=2, max_t=MAX_T)
    cloudpickle.dumps(s)  # what TunerInternal does; it raised "cannot pickle '_thread.lock' object"
    for i in range(3):
        cfg = s.suggest(f"t{i}")
        s.on_trial_complete(f"t{i}", {"loss": curve(cfg, MAX_T), "training_iteration": MAX_T})
    r = pickle.loads(pickle.dumps(s))
    assert len(r.study.trials) == 3 and r.suggest("n") == s.suggest("n")  # the same state, the same next point
    bare = pickle.loads(pickle.dumps(CubicSearcher(metric="loss", mode="min")))  # no space yet: Tune gives it
    assert bare.study is None and bare.set_search_properties("loss", "min", SPACE) and bare.suggest("a")


@pytest.mark.slow  # Ray Tune's Tuner end to end, ~25 s; the Searcher's suggest/save/restore has a fast test
def test_tuner_fit_with_asha(tmp_path):
    import ray
    from ray.tune.schedulers import ASHAScheduler

    starts = tmp_path / "starts"
    starts.mkdir()

    def trainable(config):
        # which trial this is, in start order: the lowest start file this trial creates first
        import os
        import zlib

        ordinal = 0
        while True:
            try:
                os.close(os.open(starts / str(ordinal), os.O_CREAT | os.O_EXCL))
                break
            except FileExistsError:
                ordinal += 1
        # the last two trials to start are far worse: with at most 2 trials live, each of them reaches
        # the first rung after at least 5 good trials recorded there, so ASHA must stop it whatever the
        # searcher proposed and whatever order the trials ran in (CI once saw a run where, by chance,
        # every trial beat the rung's median when it got there and none stopped). A small per-trial
        # offset (like seed noise) keeps the searcher's settled trials from tying at a rung.
        offset = 100.0 if ordinal >= 6 else 0.2 * (zlib.crc32(tune.get_context().get_trial_id().encode()) % 1000) / 1000
        for step in range(1, MAX_T + 1):
            tune.report({"loss": curve(config, step) + offset})

    searcher = CubicSearcher(metric="loss", mode="min", seed=1, batch_size=2, max_t=MAX_T)
    import os

    # the workers unpickle `trainable` by its module: this file's folder on their path
    path = os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}), param_space=SPACE,
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=8, max_concurrent_trials=2,
                                        scheduler=ASHAScheduler(max_t=MAX_T, grace_period=1, reduction_factor=2),
                                        metric="loss", mode="min"),
            run_config=tune.RunConfig(storage_path=str(tmp_path), name="cubic", verbose=0))
        grid = tuner.fit()
    finally:
        ray.shutdown()
    assert grid.num_errors == 0 and len(grid) == 8
    iters = [r.metrics["training_iteration"] for r in grid]
    assert sum(i < MAX_T for i in iters) >= 2 and max(iters) == MAX_T  # ASHA stopped the bad trials early ...
    states = [t.state for t in searcher.study.trials]
    assert states.count(optuna.trial.TrialState.PRUNED) == sum(i < MAX_T for i in iters)  # ... told as pruned
    # the searcher learned from the first six (offset < 0.2)
    assert grid.get_best_result().metrics["loss"] < curve({"lr": 1e-3, "model": {"width": 16}}, MAX_T)
