"""CubicSampler in real Optuna studies: study.optimize, ask/tell, constraints, failed and pruned
trials, several worker processes on one SQLite storage, and a restart that rebuilds the state
from the study's trials."""

from __future__ import annotations

import math
import multiprocessing as mp

import numpy as np
import optuna
import pytest

from search.optuna_sampler import CONSTRAINTS_KEY, STATE_KEY, CubicSampler
from search.space import Space
from search.strategies import ProxyGuided

optuna.logging.set_verbosity(optuna.logging.WARNING)


def fast_strategy():
    # cheap families keep the test fast; the algorithm is the campaign's ProxyGuided
    return ProxyGuided("tpe", n_inner=64, families=("ridge", "xgboost"))


def branin(trial) -> float:
    x = trial.suggest_float("x", -5, 10)
    y = trial.suggest_float("y", 0, 15)
    c = trial.suggest_categorical("c", ["a", "b"])
    return ((y - 5.1 / (4 * math.pi ** 2) * x * x + 5 / math.pi * x - 6) ** 2
            + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x) + 10 + (0 if c == "a" else 3))


def _constrained(trial):
    v = branin(trial)
    trial.set_user_attr("c0", trial.params["x"] - 5.0)  # feasible when x <= 5
    if trial.number in (5, 9):
        raise RuntimeError("a crashed run")
    if trial.number in (6, 10):
        trial.report(v + 50, step=1)
        raise optuna.TrialPruned()
    return v


def _feasible_best(sampler) -> float:
    study = optuna.create_study(sampler=sampler)
    study.optimize(_constrained, n_trials=20, catch=(RuntimeError,))
    return min(t.value for t in study.trials
               if t.state == optuna.trial.TrialState.COMPLETE and t.params["x"] <= 5)


def test_optimize_with_constraints_failures_and_pruning():
    sampler = CubicSampler(strategy=fast_strategy(), seed=1, constraints_func=lambda t: [t.user_attrs["c0"]])
    study = optuna.create_study(sampler=sampler)
    study.optimize(_constrained, n_trials=20, catch=(RuntimeError,))
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.FAIL) == 2 and states.count(optuna.trial.TrialState.PRUNED) == 2
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert all(CONSTRAINTS_KEY in t.system_attrs for t in done)
    # the strategy ran (not only the fallback): its state is in the trials, and it has fitted a proxy
    assert any(STATE_KEY in t.system_attrs for t in study.trials[8:])
    assert sampler.last_proposal_["fit"].get("family") in ("ridge", "xgboost")
    # the history it learns from: failed trials as failures, pruned as ok but never above the worst complete
    space = sampler.space_for(study, sampler.infer_relative_search_space(study, study.trials[-1]), study.trials)
    obs = sampler.observations(study, space, study.trials)
    assert sum(not o.ok for o in obs) == 2
    worst = max(t.value for t in done)
    pruned = [o for o in obs if o.result.extra.get("pruned")]
    assert len(pruned) == 2 and all(o.metrics["value"] >= worst for o in pruned)
    assert all(o.result.extra["curve"][-1][0] == 1 for o in pruned)  # its reported curve, for credit_pruned
    assert any(o.violation > 0 for o in obs) or all(t.params["x"] <= 5 for t in done)
    keys = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(set(keys)) == len(keys)  # nothing proposed twice


def test_a_pruned_trial_is_credited_the_gain_complete_trials_made_after_its_step():
    sampler = CubicSampler(strategy=fast_strategy(), seed=0)
    study = optuna.create_study(sampler=sampler)
    dist = {"x": optuna.distributions.FloatDistribution(0.0, 10.0)}
    for x, curve in ((1.0, (9.0, 6.0, 4.0)), (2.0, (8.0, 7.0, 6.0)), (3.0, (20.0,))):
        t = study.ask(dist)
        for step, v in enumerate(curve, 1):
            t.report(v, step)
        if len(curve) == 1:  # stopped after its first report
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(t, curve[-1])
    space = sampler.space_for(study, dist, study.trials)
    (pruned,) = [o for o in sampler.observations(study, space, study.trials) if o.result.extra.get("pruned")]
    # gains after step 1: 4 - 9 and 6 - 8, median -3.5: credited 16.5 (not above the worst complete, 6.0)
    assert pruned.ok and pruned.metrics["value"] == 16.5 and pruned.result.extra["last_value"] == 20.0


@pytest.mark.slow  # ~25 s, a quality comparison over 5 seeds; the fast suite has the constraint mechanics
# (test_optimize_with_constraints_failures_and_pruning)
def test_constrained_search_beats_random_search_over_seeds():
    # the median over seeds of the best feasible value on 20 trials, against random search's
    import statistics

    seeds = range(5)
    constraint = lambda t: [t.user_attrs["c0"]]  # noqa: E731
    cubic = [_feasible_best(CubicSampler(strategy=fast_strategy(), seed=s, constraints_func=constraint))
             for s in seeds]
    rand = [_feasible_best(optuna.samplers.RandomSampler(seed=s)) for s in seeds]
    assert statistics.median(cubic) < statistics.median(rand), (cubic, rand)


def test_ask_tell_and_independent_fallback():
    study = optuna.create_study(direction="maximize", sampler=CubicSampler(strategy=fast_strategy(), seed=0))
    for i in range(10):
        t = study.ask()
        x = t.suggest_int("n", 1, 64, log=True)
        extra = t.suggest_float(f"only_{i}", 0, 1)  # never in the intersection: the independent sampler
        study.tell(t, -abs(math.log2(x) - 3) + 0.01 * extra)
    assert len(study.trials) == 10 and study.best_value > -1.5


def _worker(url: str, n: int, seed: int) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="w", storage=url,
                              sampler=CubicSampler(strategy=fast_strategy(), seed=seed))
    study.optimize(branin, n_trials=n)


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_several_workers_on_one_sqlite_storage(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="w", storage=url)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(url, 8, 0)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    study = optuna.load_study(study_name="w", storage=url)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 16
    keys = {tuple(sorted(t.params.items())) for t in done}
    assert len(keys) == 16  # the two workers never ran the same point
    assert any(STATE_KEY in t.system_attrs for t in done)


def test_restart_rebuilds_state_from_the_trials(tmp_path):
    # one process, 12 trials straight ...
    straight = optuna.create_study(sampler=CubicSampler(strategy=fast_strategy(), seed=3))
    straight.optimize(branin, n_trials=12)
    # ... and the same study stopped after 7 (mid-round) and resumed by a fresh sampler
    url = f"sqlite:///{tmp_path / 'r.db'}"
    s1 = optuna.create_study(study_name="r", storage=url, sampler=CubicSampler(strategy=fast_strategy(), seed=3))
    s1.optimize(branin, n_trials=7)
    s2 = optuna.load_study(study_name="r", storage=url, sampler=CubicSampler(strategy=fast_strategy(), seed=3))
    s2.optimize(branin, n_trials=5)
    a = [t.params for t in straight.trials]
    b = [t.params for t in s2.trials]
    assert len(b) == 12
    for pa, pb in zip(a, b):
        assert pa.keys() == pb.keys()
        for k in pa:
            assert pa[k] == pytest.approx(pb[k]) if isinstance(pa[k], float) else pa[k] == pb[k]


def test_geometric_numeric_choices_are_modelled_on_a_log_scale():
    """Optuna's categorical carries no scale: learning rates or batch sizes given as a list span
    decades, and on a linear feature every choice but the largest would sit near 0."""
    from optuna.distributions import CategoricalDistribution

    from search.optuna_sampler import parameter_of

    lr = parameter_of("lr", CategoricalDistribution([1e-4, 1e-3, 1e-2, 1e-1]))
    assert lr.log
    feats = [float(Space(name="s", objectives=[{"metric": "v"}], parameters=[lr]).features({"lr": v})[0])
             for v in lr.choices]
    assert np.allclose(feats, [0, 1 / 3, 2 / 3, 1])
    assert not parameter_of("n", CategoricalDistribution([1, 2, 3])).log  # under a decade: linear
    assert not parameter_of("x", CategoricalDistribution([0, 10, 100])).log  # not all positive
    assert not parameter_of("opt", CategoricalDistribution(["sgd", "adam"])).log
    assert not parameter_of("b", CategoricalDistribution([True, False])).log


def test_a_none_choice_is_searched_like_any_other():
    """Optuna allows None among a categorical's choices (``suggest_categorical("act", [None, ...])``);
    the study crashed at its second trial with pydantic's four-error dump (a cubic space's values have
    no None). None is searched as a text of its own, distinct from a choice spelled "None"."""
    from optuna.distributions import CategoricalDistribution

    from search.optuna_sampler import none_token, parameter_of

    dist = CategoricalDistribution([None, "relu", "None"])
    assert none_token(dist) == "<None>" and parameter_of("act", dist).choices == ["<None>", "relu", "None"]
    assert none_token(CategoricalDistribution(["relu", "gelu"])) is None

    def objective(trial):
        act = trial.suggest_categorical("act", [None, "relu", "None"])
        x = trial.suggest_float("x", 0, 1)
        return (x - 0.3) ** 2 + {None: 0.0, "relu": 1.0, "None": 2.0}[act]

    study = optuna.create_study(sampler=CubicSampler(strategy=fast_strategy(), seed=0, batch_size=2))
    study.optimize(objective, n_trials=14)
    states = {t.state for t in study.trials}
    assert states == {optuna.trial.TrialState.COMPLETE}
    seen = [t.params["act"] for t in study.trials[1:]]  # after the first trial: the sampler's proposals
    assert None in seen and all(a in (None, "relu", "None") for a in seen)
    assert study.best_trial.params["act"] is None


def test_a_parameter_no_cubic_space_holds_is_sampled_independently(caplog):
    """Optuna takes an int range past 2**53 (a seed), a float step of 1e-16, any name; a cubic space
    does not, and each stopped the user's study at its second trial with pydantic's dump. Such a
    parameter goes to the independent sampler, as Optuna's relative samplers do, with one warning;
    the others are still cubic's."""
    def objective(trial):
        seed = trial.suggest_int("seed", 0, 2**62)
        x = trial.suggest_float("x", 0, 1, step=1e-16)
        y = trial.suggest_float("y" * 201, 0, 1)
        z = trial.suggest_float("z", 0, 1)
        return (seed % 7) / 7 + x + y + (z - 0.5) ** 2

    sampler = CubicSampler(strategy=fast_strategy(), seed=0)
    study = optuna.create_study(sampler=sampler)
    with caplog.at_level("WARNING", logger="search.optuna_sampler"):
        study.optimize(objective, n_trials=6)
    assert {t.state for t in study.trials} == {optuna.trial.TrialState.COMPLETE}
    assert set(sampler.infer_relative_search_space(study, study.trials[-1])) == {"z"}
    said = [r.getMessage() for r in caplog.records if "sampled independently" in r.getMessage()]
    assert len(said) == 3 and any("'seed'" in m and "2**53" in m for m in said), said


def test_rounds_start_at_one_point_and_grow_to_batch_size():
    s = CubicSampler(batch_size=4)
    rounds = sorted({s.round_of(n) for n in range(60)})
    sizes = [k for _, k in rounds]
    assert sizes[0] == 1 and sizes[-1] == 4 and sizes == sorted(sizes)
    assert all(a + k == b for (a, k), (b, _) in zip(rounds, rounds[1:]))  # rounds tile the trials
    assert all(a <= n < a + k for n in range(60) for a, k in [s.round_of(n)])
    assert CubicSampler(batch_size=1).round_of(37) == (37, 1)


def test_a_crash_is_not_proposed_again_a_hair_away():
    """Stop 65 noticed: CubicSampler proposed x = 5.0 again and again after a crash at x = 5.0 (an
    Optuna study's FAIL trials are its only signal of failure: no constraint metric to model)."""
    import optuna

    from search.optuna_sampler import CubicSampler

    def objective(t):
        x = t.suggest_float("x", -5.0, 5.0)
        if x > 4.5:
            raise RuntimeError("crash")
        return 100.0 - (x - 4.0) ** 2

    study = optuna.create_study(direction="maximize", sampler=CubicSampler(seed=0))
    study.optimize(objective, n_trials=24, catch=(RuntimeError,))
    failed = [t.params["x"] for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) <= 6, failed  # 13 of 24 before; TPE fails 6-7 of 24 on the 2-D version
    assert study.best_value > 99.9


def test_a_space_with_constraints_learns_failures_from_them_not_the_kernel():
    from cubic.core.result import Result
    from search.space import Constraint, Objective, Parameter, Space
    from search.strategies import Observation, Surrogate

    params = [Parameter(name="x", type="float", low=0.0, high=1.0)]
    obs = [Observation({"x": v}, Result(status="ok", metrics={"qps": 1.0 + v, "mem": v}) if v < 0.8
                       else Result.failed("error", "crash")) for v in (0.1, 0.3, 0.5, 0.7, 0.9)]
    free = Space(name="s", objectives=[Objective(metric="qps")], parameters=params)
    bound = free.model_copy(update={"constraints": [Constraint(metric="mem", max=0.75)]})
    assert Surrogate(free).fit(obs).feasibility_.local and not Surrogate(bound).fit(obs).feasibility_.local
