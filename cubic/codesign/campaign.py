"""The campaign engine: propose k points per round, validate them by real runs, retrain, repeat.

Generic API (any space, any evaluate function)::

    from search.space import Space
    from cubic.codesign.campaign import Campaign

    space = Space.model_validate({"parameters": [{"name": "x", "type": "float", "low": 0, "high": 1}],
                                  "objectives": [{"metric": "score", "direction": "maximize"}]})
    c = Campaign(space, lambda point: {"score": -(point["x"] - 0.3) ** 2 + 1}, budget=20,
                 batch_size=4, storage="sqlite:///tune.db", name="my-tune")
    summary = c.run()
    print(summary.best_point, summary.best_metrics)

``evaluate(point)`` returns a dict of metrics (a successful run) or a
:class:`cubic.core.result.Result` (``Result.failed(kind, reason)`` says a run failed; timeouts and
killed runs are transient, so retried), the one record of a run: the campaign writes a trial's
Optuna attributes from it (:func:`trial_attrs`) and the strategies see it through
:class:`search.strategies.Observation` (:func:`trial_observation`); an exception is a failed run
(kind ``error``), never a crash of the campaign.

Storage. A campaign is an Optuna study in an Optuna storage (SQLite file by default, any
SQLAlchemy URL such as PostgreSQL so that workers on several machines share it), driven by
Optuna's ask/tell: each round the *coordinator* proposes k points and enqueues them as WAITING
trials (``study.enqueue_trial``); whoever runs a point -- the coordinator's own threads or any
number of worker processes (:meth:`Campaign.work`) -- takes a WAITING trial atomically (Optuna's
WAITING -> RUNNING compare-and-set, the one ``study.ask`` uses), beats Optuna's heartbeat while
the run lasts and ``tell``s the result with its metrics, failure kind, round and the proxy's
prediction as trial attributes. A RUNNING trial whose worker died (no heartbeat for the grace
period, or a dead pid on this host) is put back as the same trial, WAITING again
(:meth:`Campaign._requeue`); such a lost attempt is not a run. One coordinator per campaign:
it holds a lease row (``cubic_campaign_leases``, with an expiry it renews) in the same database,
so that two ``campaign resume`` cannot both propose. Everything a resume needs is in the storage:
SIGKILL at any moment loses at most the runs in flight, no finished run is run again, and the
strategy's state (``Strategy.state_dict``) is stored after each round. cubic's own evaluate
(:class:`cubic.codesign.evaluate.RunnerEvaluate`) also records every Result in the trial store
(cubic.core.store) with the campaign's name, and serves repeated configs from it.

Rooms: this module is the engine (the ask/tell loop, rounds). Beside it:
:mod:`cubic.codesign.confirm` (the confirm phase: the leaders re-measured until separated),
:mod:`cubic.codesign.storage` (the Optuna storage, the coordinator's lease, campaign listing),
:mod:`cubic.codesign.trials` (a run's Result as trial attributes and back; which trials are runs),
:mod:`cubic.codesign.prior` (cubic's featurizer and the step-model prior) and
:mod:`cubic.codesign.evaluate` (evaluate-by-runner over the trial store).
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import optuna

from cubic.codesign.against_prior import against_prior, pick_trial
from cubic.codesign.confirm import confirm
from cubic.codesign.storage import (DEFAULT_STORAGE, INTERRUPTED, LEASE_S, META_KEY, WORKER_ATTR, Lease, LeaseHeld,
                                   creation_lock, heartbeat_interval, load_meta, open_storage, pid_dead, take_trial,
                                   worker_name)
from cubic.codesign.trials import as_result, is_run, provenance, told_state, trial_attrs, trial_observation
from cubic.core.result import Result
from cubic.core.spec import SpecError
from cubic.core.store import StoreError
from search.space import Space
from search.curves import credit_pruned, early_ranking
from search.strategies import Observation, SearchContext, Strategy, make_strategy, objective_value

STATE_KEY = "cubic_strategy_state"
MAX_INTERRUPTED = 3  # lost attempts of one trial (kills of its worker) before it is retired
BASELINE_KEY = "cubic_baseline"  # the baseline run measure_baseline keeps with the study


@dataclass
class RunEvent:
    """One finished run, as a :class:`CampaignListener` hears of it (live progress)."""

    campaign: str
    trial: int  # the Optuna trial number
    round: int
    point: dict[str, Any]
    evaluation: Result  # as told: ok is False when the objective was missing
    attempts: int
    violation: float  # constraint violation (0: feasible)
    predicted: dict[str, Any] | None  # what the strategy predicted for the point when it proposed it
    runs: int  # the campaign's finished runs so far, this one included
    budget: int

    @property
    def provenance(self) -> str:
        return provenance(self.evaluation)


class CampaignListener:
    """What a campaign tells whoever started it (the CLI prints it); every method a no-op here, so
    the engine itself never writes to the terminal. Called from the threads that run points."""

    def started(self, campaign: str, runs: int, budget: int) -> None:
        """``run()`` or ``work()`` begins; ``runs`` of ``budget`` are already done."""

    def started_run(self, campaign: str, trial: int, point: dict[str, Any], runs: int, budget: int) -> None:
        """A run begins (by this process): its trial number and knobs; ``runs`` finished so far."""

    def finished_run(self, event: RunEvent) -> None:
        """A run was told to the campaign (by this process)."""

    def retrying(self, campaign: str, trial: int, point: dict[str, Any], retry: int, allowed: int,
                 failed: Result) -> None:
        """A run failed transiently (``failed``: timeout, killed) and runs again: retry ``retry`` of
        the ``allowed`` ones its failure kind gets (:func:`retries_allowed`)."""

    def lost_run(self, campaign: str, trial: int, point: dict[str, Any]) -> None:
        """A run this process finished is not told: its trial was taken back while this process was
        silent past the heartbeat's grace period (stopped, descheduled, cut off) and is another
        worker's now, so the study counts that point once."""

    def lost_take(self, campaign: str, trial: int) -> None:
        """A trial this process took went back before its run began (this process was silent past
        the heartbeat's grace period between taking it and starting): nothing ran here; another
        worker's attempt counts."""

    def lease_lost(self, campaign: str) -> None:
        """This worker coordinated until its lease lapsed (its database was away longer than the
        lease) and another process took the lease over: it coordinates now; this one runs points."""

    def stopped(self, campaign: str, reason: str) -> None:
        """``run()`` or ``work()`` ends (reason: a stop reason, "worker done", or "error")."""


@dataclass
class Summary:
    name: str
    status: str
    stop_reason: str
    runs: int
    best_point: dict[str, Any] | None
    best_metrics: dict[str, float] | None
    best_so_far: list[float]  # primary objective's best feasible value after each run
    proxy: dict[str, Any]
    warm_start: dict[str, Any]
    confirm: dict[str, Any] | None = None  # the confirm phase (Campaign.confirm), when it ran
    served: int = 0  # runs served from the trial store (every session's, from the runs' attributes)
    pruned: int = 0  # runs a pruner stopped early (PRUNED trials cubic told)
    pruning: dict[str, Any] | None = None  # whether the completed curves back the pruner (search.curves.early_ranking)

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass
class WorkerReport:
    worker: str
    runs: int = 0
    coordinated: bool = False  # this worker held the lease at some point and proposed rounds
    served: int = 0  # of its runs, those served from the trial store
    keys: list[str] = field(default_factory=list)


_W, _R = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING


class Campaign:
    """Propose -> validate -> record -> retrain, until the budget is spent or progress plateaus.

    ``run()`` coordinates (holds the campaign's lease; raises :class:`LeaseHeld` when another
    process does); ``work()`` is one of several processes on a shared storage: it runs enqueued
    points and coordinates whenever no one else holds the lease. Both are the same loop."""

    def __init__(self, space: Space, evaluate: Callable[[dict[str, Any]], Any], *, name: str = "campaign",
                 strategy: str | Strategy = "cubic", budget: int = 40, batch_size: int = 4, seed: int = 0,
                 storage: Any = None, patience: int | None = None, min_improvement: float = 0.005,
                 max_retries: int = 2, workers: int = 1, featurize=None, context: dict[str, Any] | None = None,
                 warm_start: tuple[str, ...] | list[str] = (), resume: bool = False,
                 listener: CampaignListener | None = None,
                 target: float | None = None, lease_s: float = LEASE_S, worker: str | None = None):
        if budget < 1 or batch_size < 1:
            raise SpecError("budget and batch size must be >= 1", field="budget" if budget < 1 else "batch_size")
        self.space = space
        self.evaluate = evaluate
        self.name = name
        self.strategy = make_strategy(strategy) if isinstance(strategy, str) else strategy
        self.strategy_name = strategy if isinstance(strategy, str) else self.strategy.name
        self.budget, self.batch_size, self.seed = budget, batch_size, seed
        self.patience, self.min_improvement = patience, min_improvement
        self.max_retries, self.workers = max_retries, workers
        self.featurize, self.context = featurize, dict(context or {})
        self.warm_start = list(warm_start)
        self.listener = listener or CampaignListener()  # live progress: the CLI's, or silence
        self.target = target  # stop once the best feasible primary metric is this good
        self.lease_s, self.worker = lease_s, worker or worker_name()
        self.storage = open_storage(storage)
        self.study = self._open_study(resume)
        self.strategy.bind(SearchContext(space, seed, featurize, (), self.context))
        self._n_warm = 0

    # ---- storage --------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        return {"version": 1, "name": self.name, "space": self.space.to_json(), "strategy": self.strategy_name,
                "budget": self.budget, "batch_size": self.batch_size, "seed": self.seed,
                "patience": self.patience, "min_improvement": self.min_improvement,
                "max_retries": self.max_retries, "context": self.context, "warm_start": self.warm_start,
                "target": self.target, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def _open_study(self, resume: bool) -> optuna.Study:
        if resume:
            return self._find_or_create_study(resume)
        with creation_lock(self.storage):  # a study without settings may be another process's creation
            return self._find_or_create_study(resume)

    def _find_or_create_study(self, resume: bool) -> optuna.Study:
        directions = [o.direction for o in self.space.objectives]
        found = {s.study_name: s for s in optuna.get_all_study_summaries(self.storage, include_best_trial=False)}
        # a study without settings is a creation a kill cut short: the name is free to reuse
        exists = self.name in found and META_KEY in found[self.name].user_attrs
        if exists and not resume:
            raise SpecError("a campaign of this name exists; resume it, replace it (--replace), or pick another name",
                            field=self.name)
        if not exists and resume:
            raise SpecError("no such campaign", field=self.name)
        if not exists and self.name in found:
            if found[self.name].n_trials:
                raise SpecError("an Optuna study of this name (not a cubic campaign) exists", field=self.name)
            optuna.delete_study(study_name=self.name, storage=self.storage)  # a creation cut short: start over
        study = optuna.create_study(study_name=self.name, storage=self.storage, directions=directions,
                                    load_if_exists=True)
        if not exists:
            study.set_user_attr("status", "created")
            with warnings.catch_warnings():  # "experimental" since Optuna 3.2: the names optuna-dashboard shows
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names([o.metric for o in self.space.objectives])
            study.set_user_attr(META_KEY, self.meta())  # last: a campaign exists once its settings do
        return study

    def measure_baseline(self, point: dict[str, Any], label: str, evaluate=None,
                         shown_point: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run the baseline once, outside the budget, and keep it with the study for the report's
        answer (cubic.codesign.answer); a resumed campaign keeps the one it has."""
        if self.study.user_attrs.get(BASELINE_KEY):
            return self.study.user_attrs[BASELINE_KEY]
        fn, attempts = evaluate or self.evaluate, 0
        unjudged = getattr(fn, "unjudged", None) or nullcontext  # a pruner judges candidates, not the baseline
        while True:
            attempts += 1
            try:
                with unjudged():
                    ev = as_result(fn(point))
            except Exception as e:  # a failed baseline is data, as any failed run
                ev = Result.failed("error", f"{type(e).__name__}: {e}")
            if not _retry_again(ev, attempts, self.max_retries):
                break
        doc = {"label": label, "point": shown_point if shown_point is not None else dict(point), "ok": ev.ok,
               "metrics": {k: float(v) for k, v in ev.metrics.items() if isinstance(v, (int, float))},
               "failure_kind": ev.failure_kind, "reason": (ev.reason or "")[:500], "source": ev.source,
               # what each interval rests on ("1 repeat + ASSUMED floor"): said wherever it is shown
               "basis": {k: e["basis"] for k, e in (((ev.extra or {}).get("pooled") or {}).get("estimates")
                                                    or {}).items() if isinstance(e, dict) and e.get("basis")}}
        self.study.set_user_attr(BASELINE_KEY, doc)
        return doc

    @classmethod
    def resume(cls, name: str, evaluate, storage: Any = DEFAULT_STORAGE, **overrides) -> "Campaign":
        """Continue a stored campaign with its stored settings (``overrides`` e.g. a new budget)."""
        st = open_storage(storage)
        meta = load_meta(st, name)
        kw = dict(strategy=meta["strategy"], budget=meta["budget"], batch_size=meta["batch_size"],
                  seed=meta["seed"], patience=meta["patience"], min_improvement=meta["min_improvement"],
                  max_retries=meta["max_retries"], context=meta.get("context"),
                  warm_start=meta.get("warm_start", ()), target=meta.get("target"))
        kw.update({k: v for k, v in overrides.items() if v is not None})
        c = cls(Space.model_validate(meta["space"]), evaluate, name=name, storage=st, resume=True, **kw)
        done = sum(is_run(t) for t in c._trials())
        if overrides.get("budget") is not None and overrides["budget"] < done:  # checked before it is stored
            raise SpecError(f"the campaign has made {done} runs already: a budget of {overrides['budget']} would "
                            f"rewrite its record; give {done} (confirm only) or more", field="budget")
        if overrides.get("budget") is not None and overrides["budget"] != meta["budget"]:
            c.study.set_user_attr(META_KEY, {**meta, "budget": overrides["budget"]})
        state = c.study.user_attrs.get(STATE_KEY)
        if state:
            c.strategy.load_state_dict(state.get("state") or {})
        return c

    def _trials(self, states=None) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=states)

    def _runs(self) -> list[optuna.trial.FrozenTrial]:
        """Finished runs in a fixed order, (round, key): a run retried after a lost worker has a
        later trial number, and the history a round proposes from must not depend on it."""
        return sorted((t for t in self._trials() if is_run(t)),
                      key=lambda t: (t.user_attrs.get("round", 0), t.user_attrs.get("key") or "", t.number))

    def observations(self) -> list[Observation]:
        return [trial_observation(t, self.context) for t in self._runs()]

    def _warm_observations(self) -> list[Observation]:
        out: list[Observation] = []
        names = {p.name for p in self.space.parameters}
        for other in self.warm_start:
            meta = load_meta(self.storage, other)
            study = optuna.load_study(study_name=other, storage=self.storage)
            for t in study.get_trials(deepcopy=False):
                if not is_run(t):
                    continue
                o = trial_observation(t, meta.get("context", {}))
                # another space: keep the shared parameters (the rest default to the space's features)
                out.append(replace(o, point={k: v for k, v in o.point.items() if k in names}))
        return out

    def _tell(self, trial_id: int, number: int, point: dict[str, Any], ev: Result,
              attempts: int) -> tuple[Result, float]:
        """Record a finished run on its (RUNNING) trial: attributes, constraint, then tell; returns
        the Result as told (a missing objective makes it invalid) and its constraint violation."""
        values = self._objective_values(ev.metrics) if ev.ok else None
        if ev.ok and values is None:
            ev = Result.failed("invalid", "objective metric missing from the result",
                               metrics=ev.metrics, source=ev.source)
        violation = max((c.violation(ev.metrics) for c in self.space.constraints), default=0.0) if ev.ok else 0.0
        attrs = trial_attrs(point, ev, attempts=attempts, violation=violation, strategy=self.strategy_name)
        st = self.study._storage
        for step, value in ev.extra.get("curve") or ():  # its learning curve, where Optuna keeps one (the
            st.set_trial_intermediate_value(trial_id, int(step), float(value))  # dashboard plots it)
        for k, v in attrs.items():
            st.set_trial_user_attr(trial_id, k, v)
        self._tell_values(trial_id, number, values, violation, ev.failure_kind)
        return ev, violation

    def _objective_values(self, metrics: dict[str, Any]) -> list[float] | None:
        """The space's objectives from a run's metrics; None when one is missing or not finite."""
        vals = [metrics.get(o.metric) for o in self.space.objectives]
        if any(v is None or not math.isfinite(v) for v in vals):
            return None
        return [float(v) for v in vals]

    def _tell_values(self, trial_id: int, number: int, values: list[float] | None, violation: float,
                     failure_kind: str | None) -> None:
        """Tell Optuna a recorded run: its objective values and constraint, or (``values`` None) FAIL,
        or PRUNED for a run a pruner stopped (Optuna then gives it its last intermediate value)."""
        if values is not None:
            self.study._storage.set_trial_system_attr(trial_id, "constraints", [violation])  # samplers read it
        self.study.tell(number, values, state=told_state(values is not None, failure_kind))

    def _evaluate_with_retries(self, point: dict[str, Any], trial: int | None = None) -> tuple[Result, int]:
        attempts = 0
        while True:
            attempts += 1
            try:
                ev = as_result(self.evaluate(point))
            except StoreError:  # the trial store failed, not the run: the campaign stops (results pending)
                raise
            except Exception as e:  # an evaluate that raises is a failed run, not a failed campaign
                ev = Result.failed("error", f"{type(e).__name__}: {e}")
            if not _retry_again(ev, attempts, self.max_retries):
                return ev, attempts
            if trial is not None:
                self.listener.retrying(self.name, trial, point, attempts, retries_allowed(ev, self.max_retries), ev)

    # ---- running enqueued points (coordinator threads and workers alike) ------------------
    def _take(self) -> optuna.trial.FrozenTrial | None:
        """A WAITING trial, now RUNNING and ours (compare-and-set and claim at once: :func:`take_trial`), or None."""
        st = self.study._storage
        for t in self._trials(states=(_W,)):
            if heartbeat_interval(st):
                # beat first: a worker killed right after the compare-and-set must leave a heartbeat
                # row behind, or Optuna never sees its trial as stale (it only ages existing beats)
                st.record_heartbeat(t._trial_id)
            try:
                taken = take_trial(self.storage, t._trial_id, self.worker)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # another worker took it and has finished it since we listed it
            if not taken:
                continue
            try:
                self._claim(t)
            except optuna.exceptions.UpdateFinishedTrialError:
                # silent past the grace period between the compare-and-set and these writes: the
                # trial went back, another worker ran and told it; nothing ran here
                self.listener.lost_take(self.name, t.number)
                continue
            mine = st.get_trial(t._trial_id)  # as taken: its start time marks this attempt as ours
            if mine.state != _R or mine.system_attrs.get(WORKER_ATTR) != self.worker:
                self.listener.lost_take(self.name, t.number)  # (taken back and re-taken meanwhile)
                continue
            return mine
        return None

    def _claim(self, t: optuna.trial.FrozenTrial) -> None:
        """Give a trial just taken (and claimed, :func:`take_trial`) the params Optuna's samplers and importance read."""
        st = self.study._storage
        point = dict(t.system_attrs.get("fixed_params") or t.params)
        for p in self.space.parameters:
            if p.name in point and p.name not in t.params:  # (a resumed trial has them)
                d = p.distribution()
                st.set_trial_param(t._trial_id, p.name, d.to_internal_repr(point[p.name]), d)

    def _still_ours(self, t: optuna.trial.FrozenTrial) -> bool:
        """Whether the trial is still the RUNNING attempt this process took (same start time, same
        worker): a stalled worker's trial is put back after the grace period and taken by another."""
        now = self.study._storage.get_trial(t._trial_id)
        return (now.state == _R and now.datetime_start == t.datetime_start
                and now.system_attrs.get(WORKER_ATTR) == self.worker)

    def _run_one(self, t: optuna.trial.FrozenTrial) -> tuple[dict[str, Any], Result | None]:
        st = self.study._storage
        point = dict(t.system_attrs.get("fixed_params") or t.params)
        if type(self.listener).started_run is not CampaignListener.started_run:  # (no storage read otherwise)
            self.listener.started_run(self.name, t.number, point, len(self._runs()), self.budget)
        stop = threading.Event()
        beat = None
        if heartbeat_interval(st):
            def _beat():
                while True:
                    try:
                        st.record_heartbeat(t._trial_id)
                    except Exception:  # noqa: BLE001 - a missed beat only risks a retry
                        pass
                    if stop.wait(heartbeat_interval(st)):
                        return

            beat = threading.Thread(target=_beat, daemon=True)
            beat.start()
        try:
            ev, attempts = self._evaluate_with_retries(point, t.number)
        except BaseException:  # Ctrl-C, SystemExit: the run is lost, not failed -- back in the queue
            self._requeue(t._trial_id)  # (the same trial: a resume runs it, nothing counts it twice)
            raise
        finally:
            stop.set()
            if beat is not None:
                beat.join()
        if not self._still_ours(t):  # taken back while this process was silent: the other attempt counts
            self.listener.lost_run(self.name, t.number, point)
            return point, None
        try:
            ev, violation = self._tell(t._trial_id, t.number, point, ev, attempts)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):  # (ValueError: "Cannot tell a COMPLETE trial")
            if self._still_ours(t):
                raise
            self.listener.lost_run(self.name, t.number, point)  # taken back between the check and the tell
            return point, None
        if type(self.listener).finished_run is not CampaignListener.finished_run:  # (no-op: no storage read)
            self.listener.finished_run(RunEvent(
                campaign=self.name, trial=t.number, round=int(t.user_attrs.get("round", 0)), point=point,
                evaluation=ev, attempts=attempts, violation=violation, predicted=t.user_attrs.get("predicted"),
                runs=len(self._runs()), budget=self.budget))
        return point, ev

    def _drain(self, report: WorkerReport | None = None, until_empty: bool = True) -> int:
        """Run WAITING trials on ``workers`` threads until none is left; returns runs made."""
        n = 0

        def loop(_: int) -> int:
            done = 0
            while True:
                t = self._take()
                if t is None:
                    return done
                point, ev = self._run_one(t)
                if ev is None:  # lost to another worker (see CampaignListener.lost_run): not this one's run
                    continue
                done += 1
                if report is not None:
                    report.keys.append(self.space.key(point))
                    report.served += provenance(ev) == "served"
                if not until_empty:
                    return done

        # no more threads than points waiting (each thread runs points until none is left): 100000
        # workers on a budget of 1 spent minutes starting threads that found nothing to run
        threads = 1 if self.workers <= 1 else min(self.workers, max(1, len(self._trials(states=(_W,)))))
        if threads <= 1:
            n = loop(0)
        else:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                n = sum(pool.map(loop, range(threads)))
        if report is not None:
            report.runs += n
        return n

    def _recover_lost(self) -> None:
        """Put back RUNNING trials whose worker is gone -- silent past the heartbeat's grace period,
        or a dead process on this host (no need to wait) -- as the SAME trial, WAITING again
        (:meth:`_requeue`): a kill leaves no FAIL and no copy in the study, so that after any
        number of kills it holds exactly the budget's trials, each point once. A run recorded in
        full before the kill is told as recorded instead (:meth:`_tell_recorded_lost`)."""
        self._tell_recorded_lost()
        for t in self._trials(states=(_R,)):
            if "finished_at" not in t.user_attrs and t._trial_id in self._lost_ids():
                self._requeue(t._trial_id, seen=t)

    def _lost_ids(self) -> set[int]:
        """RUNNING trials whose worker is gone (stale heartbeat, or a dead pid on this host)."""
        st = self.study._storage
        stale = set()
        if heartbeat_interval(st) and hasattr(st, "_get_stale_trial_ids"):
            stale = set(st._get_stale_trial_ids(self.study._study_id))  # Optuna's own staleness test
        return stale | {t._trial_id for t in self._trials(states=(_R,))
                        if pid_dead(t.system_attrs.get(WORKER_ATTR))}

    def _tell_recorded_lost(self) -> None:
        """Tell, as recorded, a lost worker's trial whose run was recorded in full (killed between
        writing "finished_at" and ``tell``): failing it would show a finished run as FAIL and make a
        resumed campaign differ from an uninterrupted one. Only stale trials (heartbeat past its
        grace period, or a dead process on this host): a live worker is never raced."""
        lost = None
        for t in self._trials(states=(_R,)):
            a = t.user_attrs
            if "finished_at" not in a:
                continue
            lost = self._lost_ids() if lost is None else lost
            if t._trial_id not in lost:
                continue
            values = self._objective_values(a.get("metrics") or {}) if a.get("ok") else None
            try:
                self._tell_values(t._trial_id, t.number, values, float(a.get("violation", 0.0)), a.get("failure_kind"))
            except (optuna.exceptions.UpdateFinishedTrialError, ValueError, RuntimeError):
                pass  # another process told or failed it first

    def _requeue(self, trial_id: int, seen: optuna.trial.FrozenTrial | None = None) -> None:
        """Put a RUNNING trial whose run was lost (its worker killed, or Ctrl-C) back to WAITING:
        the same trial, resumed by whoever takes it next -- not failed, not copied, not fed to the
        search. A compare-and-set on (RUNNING, the start time ``seen``), so that a trial another
        worker has taken since is left alone. After ``MAX_INTERRUPTED`` lost attempts the trial is
        retired (PRUNED, ``interrupted`` in its attributes): not a run, and never a failure of its
        configuration; the budget proposes another point in its place."""
        st = self.study._storage
        if seen is None:
            seen = st.get_trial(trial_id)
        if seen.state != _R:
            return
        n = int(seen.system_attrs.get("cubic_interrupted", 0)) + 1
        engine = getattr(self.storage, "engine", None)
        if n > MAX_INTERRUPTED:
            try:
                st.set_trial_user_attr(trial_id, "interrupted", f"retired after {n - 1} interrupted attempts")
                st.set_trial_state_values(trial_id, state=optuna.trial.TrialState.PRUNED)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass
            return
        if engine is None:  # in memory: one process, no one else can have taken it
            st.set_trial_system_attr(trial_id, "cubic_interrupted", n)
            st.set_trial_state_values(trial_id, state=_W)
            return
        from optuna.storages._rdb import models
        from sqlalchemy import update

        tm = models.TrialModel.__table__
        with engine.begin() as conn:
            back = conn.execute(update(tm).where(tm.c.trial_id == trial_id, tm.c.state == _R,
                                                 tm.c.datetime_start == seen.datetime_start)
                                .values(state=_W)).rowcount
        if back:
            st.set_trial_system_attr(trial_id, "cubic_interrupted", n)

    # ---- the loop -----------------------------------------------------------------------
    def run(self) -> Summary:
        """Coordinate the campaign to its end (budget, plateau, target, exhausted space)."""
        with Lease(self.storage, self.name, self.worker, self.lease_s) as lease:
            self.listener.started(self.name, len(self._runs()), self.budget)
            stop_reason = "error"
            try:
                stop_reason = self._coordinate(lease)
            finally:
                self.listener.stopped(self.name, stop_reason)
        return self.summary(stop_reason=stop_reason, n_warm=self._n_warm)

    def work(self, poll_s: float = 0.2) -> WorkerReport:
        """One of several processes on this campaign: run enqueued points; coordinate whenever the
        lease is free (the first worker, or after the coordinator died); return once finished."""
        rep = WorkerReport(worker=self.worker)
        self.listener.started(self.name, len(self._runs()), self.budget)
        try:
            return self._work(rep, poll_s)
        finally:
            self.listener.stopped(self.name, "worker done")

    def _work(self, rep: WorkerReport, poll_s: float) -> WorkerReport:
        lease = Lease(self.storage, self.name, self.worker, self.lease_s)
        while True:
            if self._drain(report=rep, until_empty=False):
                continue
            status = self.study._storage.get_study_user_attrs(self.study._study_id).get("status")
            if status == "finished" and not self._trials(states=(_W, _R)):
                return rep
            if status != "finished" and lease.try_acquire():
                rep.coordinated = True
                try:
                    self._coordinate(lease, report=rep)
                except LeaseHeld:
                    # the lease lapsed under this worker (its database was away longer than the
                    # lease) and another took it over: that one coordinates, this one works on
                    self.listener.lease_lost(self.name)
                finally:
                    lease.release()
                continue
            self._recover_lost()
            time.sleep(poll_s)

    def _coordinate(self, lease: Lease, report: WorkerReport | None = None) -> str:
        self.study.set_user_attr("status", "running")
        self.study.set_user_attr("stop_reason", "")  # the last stop's reason is not this run's
        warm = self._warm_observations()
        self._n_warm = len(warm)
        self.strategy.bind(SearchContext(self.space, self.seed, self.featurize, tuple(warm), self.context))
        self._restore_round()
        self._recover_lost()
        try:
            while True:
                if lease.lost.is_set():
                    raise LeaseHeld(self.name, *(lease.holder_now() or ("another process", time.time())))
                self._drain(report)
                if self._trials(states=(_W, _R)):  # in flight on other workers (or lost: recovered here)
                    self._recover_lost()
                    time.sleep(0.2)
                    continue
                stop_reason = self._next_round()
                if stop_reason:
                    break
        except KeyboardInterrupt:  # Ctrl-C (or SIGTERM, see cubic.cli.app): not "running" any more
            self._mark_interrupted()
            raise
        self.study.set_user_attr("stop_reason", stop_reason)
        self.study.set_user_attr("status", "finished")
        return stop_reason

    def _mark_interrupted(self) -> None:
        """Status ``interrupted`` (``resume`` continues it); a storage that is away leaves it as it
        was, and ``list_campaigns`` tells a stale ``running`` by its lapsed lease."""
        try:
            self.study.set_user_attr("status", INTERRUPTED)
            self.study.set_user_attr("stop_reason", "interrupted")
        except Exception:  # noqa: BLE001 - the interrupt must go on whatever the storage does
            pass

    def _next_round(self) -> str | None:
        """Propose and enqueue the next round; or the reason to stop."""
        history = self.observations()
        if len(history) >= self.budget:
            return "budget"
        if self._plateaued():
            return "plateau"
        if self._reached_target(history):
            return "target"
        rounds = [t.user_attrs.get("round", 0) for t in self._trials()]
        round_index = (max(rounds) + 1) if rounds else 0
        k = min(self.batch_size, self.budget - len(history))
        done = {self.space.key(o.point) for o in history}
        # a run a pruner stopped enters as its curve's last value (credit_pruned), not as a failure
        proposals = [p for p in self.strategy.propose(credit_pruned(self.space, history), k)
                     if self.space.key(p.point) not in done][:k]
        if not proposals:
            return "exhausted"
        # the round and the strategy's state in one write, then its trials: a coordinator killed
        # between the two goes on with this round (_restore_round) instead of proposing again
        rec = {"round": round_index, "state": self.strategy.state_dict(),
               "points": [{"point": p.point, "predicted": p.predicted} for p in proposals]}
        self.study.set_user_attr(STATE_KEY, rec)
        self._enqueue_round(rec)
        return None

    def _enqueue_round(self, rec: dict[str, Any]) -> None:
        """Enqueue the recorded round's points that have no trial yet (all of them, but after a
        coordinator was killed mid-round)."""
        have = {t.user_attrs.get("key") for t in self._trials() if t.user_attrs.get("round") == rec.get("round")}
        for p in rec.get("points") or ():
            key = self.space.key(p["point"])
            if key not in have:
                self.study.enqueue_trial(p["point"], user_attrs={"round": rec["round"], "key": key,
                                                                 "predicted": p.get("predicted")}, skip_if_exists=False)

    def _restore_round(self) -> None:
        """Where the last coordinator left off: the strategy's state as of its last round, and that
        round's points all enqueued. Run by whoever coordinates (a resume, or a worker taking over),
        so a campaign killed anywhere proposes what an uninterrupted one would."""
        rec = self.study.user_attrs.get(STATE_KEY)
        if rec:
            self.strategy.load_state_dict(rec.get("state") or {})
            self._enqueue_round(rec)

    def _reached_target(self, history: list[Observation]) -> bool:
        if self.target is None:
            return False
        o = self.space.primary
        vals = [h.metrics[o.metric] for h in history if h.feasible and o.metric in h.metrics]
        if not vals:
            return False
        return max(vals) >= self.target if o.direction == "maximize" else min(vals) <= self.target

    def _plateaued(self) -> bool:
        if not self.patience:
            return False
        rounds: dict[int, float] = {}
        for t in self._trials():
            if not is_run(t):
                continue
            o = trial_observation(t, self.context)
            v = objective_value(self.space, o) if o.feasible else None
            r = t.user_attrs.get("round", 0)
            rounds[r] = max(rounds.get(r, -math.inf), v if v is not None else -math.inf)
        order = sorted(rounds)
        if len(order) <= self.patience:
            return False
        best_before = max(rounds[r] for r in order[: -self.patience])
        best_recent = max(rounds[r] for r in order[-self.patience:])
        # objective values are logs for positive metrics: a difference is a relative improvement
        return not best_recent > best_before + self.min_improvement

    def summary(self, stop_reason: str = "", n_warm: int = 0) -> Summary:
        # in the order the runs were proposed (trial number), not the history's (round, key) order
        runs = sorted(self._runs(), key=lambda t: t.number)  # (one read of the study)
        obs = [trial_observation(t, self.context) for t in runs]
        curve, best, best_obs = [], -math.inf, None
        for o in obs:
            v = objective_value(self.space, o) if o.feasible else None
            if v is not None and v > best:
                best, best_obs = v, o
            m = best_obs.metrics[self.space.primary.metric] if best_obs else float("nan")
            curve.append(m)
        return Summary(name=self.name, status=self.study.user_attrs.get("status", ""),
                       stop_reason=stop_reason or self.study.user_attrs.get("stop_reason", ""), runs=len(obs),
                       best_point=best_obs.point if best_obs else None,
                       best_metrics=best_obs.metrics if best_obs else None, best_so_far=curve,
                       proxy=dict(getattr(self.strategy, "fit_", {})),
                       warm_start={"campaigns": self.warm_start, "trials": n_warm},
                       confirm=self.study.user_attrs.get("confirm"),
                       served=sum(bool((t.user_attrs.get("extra") or {}).get("served_from_store")) for t in runs),
                       pruned=sum(t.state == optuna.trial.TrialState.PRUNED for t in runs),
                       pruning=early_ranking(self.space, obs))

    # ---- confirm phase (cubic.codesign.confirm) --------------------------------------------
    def confirm(self, repeat_budget: int, baseline: tuple[Any, dict[str, Any]] | None = None) -> dict[str, Any] | None:
        """Re-measure the two leaders in fresh processes until separated or ``repeat_budget`` is
        spent; stored with the campaign (:attr:`Summary.confirm`). See :func:`cubic.codesign.confirm.confirm`."""
        obs = self.observations()
        runs = sorted(self._runs(), key=lambda t: t.number)
        pick = pick_trial(runs)  # the answer sets the winner against it: run in the rounds after the winner
        out = confirm(self.evaluate, self.space, obs, repeat_budget, baseline,
                      pick=dict(pick.params) if pick is not None else None)
        if out is not None:
            out["against_prior"] = against_prior(self.space, runs, obs, self.evaluate,
                                                 (out.get("winner") or {}).get("point"), self.featurize, self.context,
                                                 paired=out.get("against_pick"))
            self.study.set_user_attr("confirm", out)
        return out


def retries_allowed(ev: Result, max_retries: int) -> int:
    """Retries a failed run gets: none for a deterministic failure, ``max_retries`` for a transient
    one, but a timeout at most one (a value that hung twice likely always hangs: budget goes elsewhere)."""
    if ev.ok is not False or not ev.transient:
        return 0
    return min(1, max_retries) if ev.failure_kind == "timeout" else max_retries


def _retry_again(ev: Result, attempts: int, max_retries: int) -> bool:
    """Whether a run that failed on attempt ``attempts`` runs again (:func:`retries_allowed`)."""
    return attempts <= retries_allowed(ev, max_retries)
