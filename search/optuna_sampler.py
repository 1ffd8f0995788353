"""cubic's proxy-guided search as an Optuna sampler: ``optuna.create_study(sampler=CubicSampler())``.

The sampler is a thin adapter over :class:`search.strategies.ProxyGuided` (the same algorithm as
``cubic campaign``): the relative search space (the parameters every finished trial has, Optuna's
``IntersectionSearchSpace``, or a cubic :class:`~search.space.Space` given up front) becomes a
cubic space, the study's finished trials become the strategy's history, and each proposal round
of points (one at first, up to ``batch_size``: :meth:`CubicSampler.round_of`) is handed out one
trial at a time. Parameters the strategy does not model (conditional ones outside the
intersection, ones first seen in this trial, and ones a cubic space cannot hold: an integer range
past 2**53, a float step cutting the range into more than 1e15 values, a name empty or over 200
characters; one warning each) go to an ordinary Optuna sampler (``independent_sampler``,
RandomSampler by default), as Optuna's own relative samplers do.

What it learns from, as Optuna treats it:

- COMPLETE trials: their values (log-scaled when every value so far is positive: ratios matter).
- PRUNED trials: the last reported intermediate value, but never better than the worst complete
  trial (Optuna's TPE ranks pruned trials below every complete one); one without any report
  counts as a failure.
- FAIL trials: a failure (the feasibility classifier learns to avoid the region; without
  constraints, a kernel estimate marks the failure's neighbourhood from the first one on).
- constraints (``constraints_func``, stored by :meth:`after_trial` in the trial's system
  attributes under Optuna's own key): each constraint value is a metric the surrogate models
  (feasible when <= 0), and a trial violating one is infeasible.

State: everything is rebuilt from the study's trials (several workers on one storage, or a
process restarted), as Optuna's samplers do; the only state the strategy keeps between rounds
(which proxy family CV last chose) is written into the trial's system attributes and read back
from the latest trial holding it. Proposals of a round are cached per process; a round is the
history up to the round's first trial (:meth:`CubicSampler.round_of`), so every worker proposes the
same round from the same trials and takes a point that no trial (finished or running) has yet
(which one: the trial number modulo the free points, so that simultaneous asks differ). When a round is used up by other workers, the strategy proposes again from all finished
trials, with the running ones excluded.
"""

from __future__ import annotations

import logging
import threading
import zlib
from typing import Any, Callable, Sequence

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.search_space import IntersectionSearchSpace
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState
from pydantic import ValidationError

from cubic.core.result import Result
from search.space import Constraint, Objective, Parameter, Space, _is_number
from search.curves import credit_pruned, thin_curve
from search.strategies import Observation, ProxyGuided, SearchContext, Strategy, make_strategy

STATE_KEY = "cubic:strategy_state"
POINT_KEY = "cubic:point"  # the point's key, written at once: another worker's running trial may have no params yet
CONSTRAINTS_KEY = "constraints"  # optuna.study._constrained_optimization._CONSTRAINTS_KEY
_logger = logging.getLogger(__name__)


def none_token(dist: BaseDistribution) -> str | None:
    """The text that stands for Optuna's ``None`` choice in a cubic space (whose values are numbers,
    text and booleans, ``None`` meaning a parameter not set): ``"None"``, or ``"<None>"`` ... when a
    choice is that text already. None when ``dist`` has no ``None`` choice."""
    if not isinstance(dist, CategoricalDistribution) or None not in dist.choices:
        return None
    token = "None"
    while token in dist.choices:
        token = f"<{token}>"
    return token


def parameter_of(name: str, dist: BaseDistribution) -> Parameter:
    """A cubic space parameter for an Optuna distribution (the same values, the same scale; a
    ``None`` choice as :func:`none_token`)."""
    if isinstance(dist, CategoricalDistribution):
        # Optuna's choices carry no scale; positive numbers spanning a decade or more (learning
        # rates, batch sizes as lists) are geometric: the proxy sees them on a log scale, else
        # every choice but the largest sits near 0 of its feature
        token = none_token(dist)
        ch = [token if c is None else c for c in dist.choices]
        geometric = all(_is_number(c) and c > 0 for c in ch) and max(ch) >= 10 * min(ch)
        return Parameter(name=name, type="categorical", choices=ch, log=geometric)
    if isinstance(dist, IntDistribution):
        return Parameter(name=name, type="int", low=dist.low, high=dist.high, log=dist.log,
                         step=None if dist.log or dist.step == 1 else dist.step)
    if isinstance(dist, FloatDistribution):
        return Parameter(name=name, type="float", low=dist.low, high=dist.high, log=dist.log, step=dist.step)
    raise TypeError(f"{name}: unsupported distribution {type(dist).__name__}")


def _values_metric(i: int, n: int) -> str:
    return "value" if n == 1 else f"value_{i}"


class CubicSampler(BaseSampler):
    """Optuna sampler running cubic's proxy-guided search (:class:`~search.strategies.ProxyGuided`).

    Args:
        space: a cubic space to search (its parameter names are the trial's parameter names);
            default: the intersection of the finished trials' distributions.
        strategy: a strategy name (``cubic``, ``cubic-gp``, ...) or an unbound :class:`Strategy`.
        batch_size: points per proposal round (a campaign's ``--batch``) once the history has
            grown (rounds start at one point and grow by one every 10 trials): the surrogate is
            fit once per round, which is what keeps the per-trial overhead low.
        seed: seeds the strategy and the independent sampler.
        independent_sampler: for the parameters outside the relative search space.
        constraints_func: as for Optuna's samplers: ``trial -> sequence of floats``, feasible
            when every value is <= 0.
        featurize, warm, run_context: passed to the strategy's :class:`SearchContext`.
        log_objective: ``"auto"`` (log of the values when all are positive), True or False.
    """

    def __init__(self, *, space: Space | None = None, strategy: str | Strategy = "cubic", batch_size: int = 4,
                 seed: int | None = None, independent_sampler: BaseSampler | None = None,
                 constraints_func: Callable[[FrozenTrial], Sequence[float]] | None = None,
                 featurize=None, warm: Sequence[Observation] = (), run_context: dict[str, Any] | None = None,
                 log_objective: bool | str = "auto"):
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self._space = space
        self._strategy_arg = strategy
        self._batch_size = batch_size
        self._seed = int(np.random.SeedSequence(seed).generate_state(1)[0] % (2**31 - 1)) if seed is None else seed
        self._independent = independent_sampler  # None: random, seeded per (seed, trial, parameter)
        self._constraints_func = constraints_func
        self._featurize, self._warm, self._run_context = featurize, tuple(warm), dict(run_context or {})
        self._log_objective = log_objective
        self._intersection = IntersectionSearchSpace(include_pruned=True)
        self._lock = threading.Lock()
        self._cache: dict[tuple, list[dict[str, Any]]] = {}
        self._bound: tuple[str, Strategy] | None = None
        self._none_tokens: dict[str, str] = {}  # parameter -> the text its None choice is searched as
        self._unmodelled: set[str] = set()  # parameters a cubic space cannot hold (warned once each)
        self.last_proposal_: dict[str, Any] = {}

    # ---- Optuna's BaseSampler ----------------------------------------------------------------
    def reseed_rng(self) -> None:
        if self._independent is not None:
            self._independent.reseed_rng()

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if self._space is not None:
            return {p.name: p.distribution() for p in self._space.parameters}
        out = {}
        for name, d in self._intersection.calculate(study).items():
            if d.single():
                continue
            try:
                parameter_of(name, d)
            except ValueError as e:  # (pydantic's ValidationError is one) left to the independent sampler
                if name not in self._unmodelled:
                    self._unmodelled.add(name)
                    why = (e.errors()[0]["msg"].removeprefix("Value error, ") if isinstance(e, ValidationError)
                           else str(e))
                    _logger.warning(f"CubicSampler: parameter {name!r} is sampled independently, not by cubic's "
                                    f"search: {why}")
                continue
            out[name] = d
        return out

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        with self._lock:
            return self._sample(study, trial, search_space)

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if self._independent is not None:
            return self._independent.sample_independent(study, trial, param_name, param_distribution)
        # seeded by the trial, not by the process: workers started with one seed would otherwise
        # draw the same values for their first trials (before any history makes them relative)
        seed = np.random.SeedSequence([self._seed, trial.number, zlib.crc32(param_name.encode())])
        return RandomSampler(seed=int(seed.generate_state(1)[0] % (2**31 - 1))).sample_independent(
            study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        if self._independent is not None:
            self._independent.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        if self._constraints_func is not None:
            from optuna.samplers._base import _process_constraints_after_trial

            _process_constraints_after_trial(self._constraints_func, study, trial, state)
        if self._independent is not None:
            self._independent.after_trial(study, trial, state, values)

    # ---- the adapter -------------------------------------------------------------------------
    def space_for(self, study: Study, search_space: dict[str, BaseDistribution],
                  trials: Sequence[FrozenTrial]) -> Space:
        """The cubic space the strategy searches: parameters, objectives (the study's directions)
        and one constraint per ``constraints_func`` value (<= 0)."""
        n_obj = len(study.directions)
        scale = self._scale(study, trials)
        objectives = [Objective(metric=_values_metric(i, n_obj), scale=scale,
                                direction="maximize" if d == StudyDirection.MAXIMIZE else "minimize")
                      for i, d in enumerate(study.directions)]
        n_con = max((len(t.system_attrs.get(CONSTRAINTS_KEY) or ()) for t in trials), default=0)
        constraints = [Constraint(metric=f"constraint_{j}", name=f"constraint {j}", max=0.0) for j in range(n_con)]
        if self._space is not None:
            self._none_tokens = {}
            return self._space.model_copy(update={"objectives": objectives, "constraints": constraints})
        self._none_tokens = {n: t for n, d in search_space.items() if (t := none_token(d)) is not None}
        params = [parameter_of(n, search_space[n]) for n in sorted(search_space)]
        return Space(name=f"optuna:{study.study_name}", objectives=objectives, constraints=constraints,
                     parameters=params)

    def _scale(self, study: Study, trials: Sequence[FrozenTrial]) -> str:
        if self._log_objective != "auto":
            return "log" if self._log_objective else "linear"
        vals = [v for t in trials if t.state == TrialState.COMPLETE for v in (t.values or ())]
        return "log" if vals and min(vals) > 0 else "linear"

    def observations(self, study: Study, space: Space, trials: Sequence[FrozenTrial]) -> list[Observation]:
        """The finished trials (in trial-number order) as the strategy's history."""
        names = [o.metric for o in space.objectives]
        out = []
        for t in trials:
            if t.state not in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL):
                continue
            point = self._point_of(space, t.params)
            if any(p.name not in point for p in space.parameters if not p.when):
                continue  # a trial from before a parameter existed: not a point of this space
            cons = list(t.system_attrs.get(CONSTRAINTS_KEY) or ())
            metrics = {f"constraint_{j}": float(c) for j, c in enumerate(cons)}
            violation = float(sum(max(0.0, c) for c in cons))
            # the reported curve: what credit_pruned extrapolates a pruned trial's value with
            curve = {"curve": thin_curve(list(t.intermediate_values.items()))} if t.intermediate_values else {}
            if t.state == TrialState.COMPLETE:
                res = Result(status="ok", metrics={**metrics, **dict(zip(names, map(float, t.values)))}, extra=curve)
            elif t.state == TrialState.PRUNED and t.intermediate_values and len(names) == 1:
                last = float(t.intermediate_values[max(t.intermediate_values)])  # (credit_pruned below)
                res = Result.failed("pruned", "pruned", metrics={**metrics, names[0]: last},
                                    extra={"pruned": True, **curve})
            elif t.state == TrialState.PRUNED:
                res = Result.failed("killed", "pruned before any report", metrics=metrics, extra={"pruned": True})
            else:
                res = Result.failed("error", str(t.system_attrs.get("fail_reason", "trial failed")), metrics=metrics)
            out.append(Observation(point, res, violation=violation, context=dict(self._run_context)))
        # a pruned trial: its last report plus the complete ones' median gain after that step, never
        # credited above the worst complete one (as TPE ranks it)
        return credit_pruned(space, out)

    def _point_of(self, space: Space, params: dict[str, Any]) -> dict[str, Any]:
        """A trial's parameters as a point of ``space`` (a ``None`` choice as its text)."""
        return {p.name: self._none_tokens[p.name] if params[p.name] is None and p.name in self._none_tokens
                else params[p.name] for p in space.parameters if p.name in params}

    def _featurizer_for(self, space: Space):
        """The featurizer with its prior columns named by the study's objectives (``space_for``
        renames the given space's objectives to the study's values: a prior column keyed by the
        original metric would otherwise never be found, and the prior's first round never run)."""
        f, cols = self._featurize, getattr(self._featurize, "prior_columns", None) or {}
        if f is None or not cols or self._space is None:
            return f
        renamed = {new.metric: cols[old.metric] for old, new in zip(self._space.objectives, space.objectives)
                   if old.metric in cols}

        def featurize(point, context):
            return f(point, context)

        featurize.prior_columns = renamed
        return featurize

    def _strategy(self, space: Space, trials: Sequence[FrozenTrial]) -> Strategy:
        sig = space.model_dump_json()
        if self._bound is None or self._bound[0] != sig:
            s = self._strategy_arg
            strat = make_strategy(s) if isinstance(s, str) else s
            strat.bind(SearchContext(space=space, seed=self._seed, featurize=self._featurizer_for(space), warm=self._warm,
                                     run_context=self._run_context))
            # the state a restarted (or another) process left: the latest trial that holds one
            for t in sorted(trials, key=lambda t: t.number, reverse=True):
                if STATE_KEY in t.system_attrs:
                    strat.load_state_dict(t.system_attrs[STATE_KEY])
                    break
            self._bound = (sig, strat)
        return self._bound[1]

    def _sample(self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        trials = sorted(study._get_trials(deepcopy=False, use_cache=False), key=lambda t: t.number)
        finished_states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        space = self.space_for(study, search_space, trials)
        history = self.observations(study, space, [t for t in trials if t.state in finished_states])
        strategy = self._strategy(space, trials)
        taken = {space.key(o.point) for o in history}
        running = [t for t in trials if t.number != trial.number and t.state in (TrialState.RUNNING, TrialState.WAITING)]
        taken |= {t.system_attrs[POINT_KEY] for t in running if POINT_KEY in t.system_attrs}
        taken |= {space.key(self._point_of(space, t.params)) for t in running if t.params}
        m, k = self.round_of(len(history))
        for _ in range(8):
            point = self._pick(strategy, space, history[:m], k, taken, ("round", m, len(history[:m])), trial.number)
            if point is None:  # the round was used up by other workers: propose again from everything
                point = self._pick(strategy, space, history, k + len(running), taken,
                                   ("all", len(history), len(running)), trial.number)
            if point is None:
                return {}
            key = space.key(point)
            study._storage.set_trial_system_attr(trial._trial_id, POINT_KEY, key)
            # claim, then look: another worker that wrote the same point before our look keeps it, and
            # we pick again (both may yield, never both keep: each looks after writing its own claim)
            if not self._claimed_elsewhere(study, trial, key):
                break
            taken.add(key)
        study._storage.set_trial_system_attr(trial._trial_id, STATE_KEY, strategy.state_dict())
        back = self._none_tokens
        return {name: None if name in back and point[name] == back[name] else point[name]
                for name in search_space if name in point}

    def round_of(self, n_finished: int) -> tuple[int, int]:
        """(first trial, size) of the proposal round that the next trial belongs to, given how many
        trials have finished: rounds of one while the history is short, one longer every 10
        trials up to ``batch_size``. Why: a result moves a model fit on few runs most, and such a fit
        is cheap; rounds of ``batch_size`` from the start left 5 proposals in the first 25 trials
        (on hartmann6 no better than random). A function of the count alone, so every worker
        agrees on where a round starts."""
        start = 0
        while True:
            size = min(self._batch_size, 1 + start // 10)
            if start + size > n_finished:
                return start, size
            start += size

    @staticmethod
    def _claimed_elsewhere(study: Study, trial: FrozenTrial, key: str) -> bool:
        # every state: a trial that claimed the point, ran and finished between our listing and
        # this look is no longer RUNNING, but its point is taken all the same
        others = study._storage.get_all_trials(study._study_id, deepcopy=False)
        return any(t.number != trial.number and t.system_attrs.get(POINT_KEY) == key for t in others)

    def _pick(self, strategy: Strategy, space: Space, history: list[Observation], k: int, taken: set[str],
              tag: tuple, number: int) -> dict[str, Any] | None:
        key = (space.model_dump_json(), tag, tuple(space.key(o.point) for o in history))
        if key not in self._cache:
            self._cache.clear()  # one round at a time: a new round makes the old proposals stale
            props = strategy.propose(history, k)
            self._cache[key] = [p.point for p in props]
            self.last_proposal_ = {"round_history": len(history), "k": k, "fit": dict(getattr(strategy, "fit_", {}))}
        free = [p for p in self._cache[key] if space.key(p) not in taken]
        # the trial number picks among the free points: workers asking at the same moment (before
        # either's point is visible to the other) take different points of the round
        return free[number % len(free)] if free else None


__all__ = ["CubicSampler", "parameter_of", "ProxyGuided"]
