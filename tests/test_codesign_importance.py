"""Which knobs mattered, with its evidence (cubic.codesign.importance): fANOVA's share of the
objective's variance with a bootstrap interval over the runs, and "mattered most" called resolved
only when one knob ranks first in RESOLVED_SHARE (97.5%) of the resamples."""

import numpy as np
import optuna

from cubic.codesign.importance import MIN_RUNS, RESOLVED_SHARE, knob_importance

optuna.logging.set_verbosity(optuna.logging.WARNING)


def study_of(n: int, objective, seed: int = 0) -> optuna.Study:
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=seed))
    study.optimize(objective, n_trials=n)
    return study


def strong_batch(noise: float, seed: int = 0):
    rng = np.random.default_rng(seed)

    def objective(t):
        b = t.suggest_categorical("batch", [256, 512, 1024, 2048, 4096])
        k = t.suggest_categorical("kernel", ["torch", "fbgemm"])
        return np.log2(b) * (1.05 if k == "fbgemm" else 1.0) * rng.lognormal(0.0, noise)
    return objective


def test_a_knob_that_dominates_is_resolved_with_intervals_around_each_share():
    study = study_of(40, strong_batch(noise=0.02))
    skipped = []
    imp = knob_importance(study, study.trials, skipped, resamples=40)
    assert not skipped and imp.runs == 40 and imp.resamples == 40
    assert imp.first == "batch" and imp.first_share >= RESOLVED_SHARE and imp.resolved
    for k in imp.knobs.values():
        assert 0.0 <= k.lo <= k.hi <= 1.0
    assert imp.knobs["batch"].lo > imp.knobs["kernel"].hi  # separated, not only first
    doc = imp.as_dict()
    assert doc["resolved"] is True and set(doc["knobs"]) == {"batch", "kernel"}
    assert "is resolved" in imp.note("examples_per_s")


def test_shares_from_a_dozen_noisy_runs_are_not_called_resolved():
    # two knobs of equal effect under 17% noise (this machine's between-repeat noise): fANOVA still
    # ranks one of them first over every run; the resamples do not agree on which
    def objective(t, rng=np.random.default_rng(3)):
        a = t.suggest_categorical("a", [0, 1])
        b = t.suggest_categorical("b", [0, 1])
        return (1.0 + 0.2 * a + 0.2 * b) * rng.lognormal(0.0, 0.17)

    study = study_of(12, objective, seed=3)
    imp = knob_importance(study, study.trials, [], resamples=40)
    assert imp is not None and not imp.resolved and imp.first_share < RESOLVED_SHARE
    assert all(k.hi - k.lo > 0.3 for k in imp.knobs.values())  # wide: which runs were measured moves it
    assert "not resolved at 12 runs" in imp.note("examples_per_s")


def test_too_few_runs_or_nothing_that_varies_gives_no_importance_and_says_why():
    study = study_of(MIN_RUNS - 1, strong_batch(noise=0.0))
    skipped = []
    assert knob_importance(study, study.trials, skipped) is None
    assert skipped == [f"parameter importance: {MIN_RUNS - 1} completed runs (needs {MIN_RUNS})"]

    flat = study_of(8, lambda t: t.suggest_float("x", 0, 1) * 0 + 1.0)
    skipped = []
    assert knob_importance(flat, flat.trials, skipped) is None
    assert len(skipped) == 1 and skipped[0].startswith("parameter importance unavailable")


def test_failed_runs_are_not_read():
    def objective(t, rng=np.random.default_rng(0)):
        b = t.suggest_categorical("batch", [256, 4096])
        if t.number % 3 == 0:
            raise RuntimeError("out of memory")
        return float(np.log2(b)) + rng.normal(0, 0.01)

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(objective, n_trials=12, catch=(RuntimeError,))
    imp = knob_importance(study, study.trials, [], resamples=10)
    assert imp.runs == sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) == 8


def test_without_resamples_the_interval_is_the_point_and_nothing_is_resolved():
    study = study_of(10, strong_batch(noise=0.02))
    imp = knob_importance(study, study.trials, [], resamples=0)
    assert imp.resamples == 0 and not imp.resolved
    assert all(k.lo == k.value == k.hi for k in imp.knobs.values())
