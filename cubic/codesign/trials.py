"""A trial's record: a run's Result as Optuna user attributes (written once, :func:`trial_attrs`) and back
(:func:`trial_result`), what the strategies see of it (:func:`trial_observation`), which trials
count as runs (:func:`is_run`), and the metric names and provenance labels every view uses.
"""

from __future__ import annotations

import time
from typing import Any, get_args

import optuna

from cubic.core.result import FailureKind, Result
from cubic.core.units import gib
from search.strategies import Observation

# what an evaluate notes in Result.extra about how the campaign got the run (served from the trial
# store, its trial ids): copied into the trial's "extra" attribute beside the run's identity
RUN_NOTES = ("served_from_store", "trial_id", "trial_ids", "repeats_run")


def as_result(out: Any) -> Result:
    """An evaluate's answer as the run's Result: a dict of metrics is a successful run."""
    if isinstance(out, Result):
        return out
    if isinstance(out, dict):
        return Result(status="ok", metrics={k: float(v) for k, v in out.items()})
    raise TypeError(f"evaluate returned {type(out).__name__}; expected dict or Result")


def provenance(ev: Result) -> str:
    """Where a run's figures come from: "served" (the trial store held it: nothing ran),
    "simulated" or "measured"."""
    if ev.extra.get("served_from_store"):
        return "served"
    return "simulated" if ev.source == "simulated" else "measured"


def is_run(t: optuna.trial.FrozenTrial) -> bool:
    """A finished run: told by cubic (COMPLETE, FAIL, or PRUNED for a run a pruner stopped), or
    written by plain Optuna. A FAIL or PRUNED that cubic never told is not a run: a lost worker's
    attempt failed by the heartbeat, or a trial retired after repeated interruptions
    (:meth:`Campaign._requeue`)."""
    if t.state == optuna.trial.TrialState.COMPLETE:
        return True
    return (t.state in (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
            and ("finished_at" in t.user_attrs or "round" not in t.user_attrs))


def told_state(ok: bool, failure_kind: str | None) -> optuna.trial.TrialState:
    """The Optuna state a finished run is told with: COMPLETE, PRUNED for a run a pruner stopped
    (what the dashboard and Optuna's samplers read as stopped early, not as failed), else FAIL."""
    if ok:
        return optuna.trial.TrialState.COMPLETE
    return optuna.trial.TrialState.PRUNED if failure_kind == "pruned" else optuna.trial.TrialState.FAIL


def trial_attrs(point: dict[str, Any], result: Result, *, attempts: int, violation: float,
                strategy: str) -> dict[str, Any]:
    """A finished run's Optuna user attributes, written from its Result (the one place they are
    made; :func:`trial_result` reads them back). ``finished_at`` comes last: its presence marks a
    run cubic told."""
    identity = {"config_hash": result.config_hash, "workload": result.workload,
                "workload_hash": result.workload_hash, "fingerprint_hash": result.fingerprint_hash}
    # the run's identity in the trial store (how a report joins trials to stored runs): a run's
    # Result has one, a dict of metrics from a plain evaluate has none
    extra = {**(identity if any(identity.values()) else {}),
             **{k: result.extra[k] for k in RUN_NOTES if k in result.extra}}
    return {"metrics": {k: float(v) for k, v in result.metrics.items() if isinstance(v, (int, float))},
            "ok": result.ok, "failure_kind": result.failure_kind, "reason": (result.reason or "")[:500],
            "transient": result.transient, "source": result.source, "attempts": attempts,
            "violation": violation, "strategy": strategy, "extra": extra,
            **readable_attrs(point, result),
            "finished_at": time.time()}


# cubic's runs: NE at the campaign's equal training budget (cubic.codesign.evaluate.AT_BUDGET) where
# it was read, else ne_end; a user's job usually reports ne
NE_METRICS = ("ne_at_budget", "ne_end", "ne")


MEMORY_METRICS = ("peak_mem_bytes", "peak_rss_bytes")  # what the job reports, else what the runner saw


def is_throughput(metric: str) -> bool:
    """A speed (examples_per_s; "qps", as README's --objective example reports): "faster" in the answer,
    and a speed winner owes a word on quality."""
    m = metric.lower()
    return m.endswith(("_per_s", "_per_sec", "qps")) or "throughput" in m


PROVENANCE = {"served": "served from the trial store", "measured": "measured", "simulated": "SIMULATED"}


def first_metric(metrics: dict[str, Any], names: tuple[str, ...]) -> float | None:
    """The first of ``names`` that ``metrics`` holds as a number (NE_METRICS, MEMORY_METRICS)."""
    return next((float(metrics[k]) for k in names if isinstance(metrics.get(k), (int, float))), None)


def readable_attrs(point: dict[str, Any], ev: Result) -> dict[str, Any]:
    """A trial's attributes as a person reads them in optuna-dashboard (the rest are for cubic)."""
    out: dict[str, Any] = {"config": ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                               for k, v in point.items())[:300],
                           "measured/served": PROVENANCE[provenance(ev)]}
    ne = first_metric(ev.metrics, NE_METRICS)
    if ne is not None:
        out["NE"] = round(ne, 4)
    mem = first_metric(ev.metrics, MEMORY_METRICS)
    if mem is not None:
        out["peak memory GiB"] = round(gib(mem), 3)
    return out


_FAILURE_KINDS = frozenset(get_args(FailureKind))


def trial_result(t: optuna.trial.FrozenTrial) -> Result:
    """The Result a trial's attributes hold (:func:`trial_attrs`); a trial written by plain Optuna
    has no attributes: its values are the metrics."""
    a = t.user_attrs
    ok = t.state == optuna.trial.TrialState.COMPLETE and a.get("ok", True)
    metrics = a.get("metrics")
    if metrics is None and t.values:
        metrics = {f"value{i}": v for i, v in enumerate(t.values)}
    ex = dict(a.get("extra") or {})
    if t.intermediate_values:  # the run's learning curve (what search.curves.credit_pruned reads)
        ex["curve"] = [[int(st), float(v)] for st, v in sorted(t.intermediate_values.items())]
    kind = a.get("failure_kind")
    return Result(status="ok" if ok else "failed", source=a.get("source", "measured"),
                  failure_kind=kind if kind in _FAILURE_KINDS else (None if kind is None else "error"),
                  reason=a.get("reason") or None, metrics=dict(metrics or {}),
                  workload=ex.pop("workload", "") or "", workload_hash=ex.pop("workload_hash", "") or "",
                  config_hash=ex.pop("config_hash", "") or "", fingerprint_hash=ex.pop("fingerprint_hash", "") or "",
                  extra=ex)


def trial_observation(t: optuna.trial.FrozenTrial, context: dict[str, Any]) -> Observation:
    """What the strategies see of a trial: its Result at its point, with the constraint violation
    the campaign recorded."""
    point = dict(t.params) or dict(t.system_attrs.get("fixed_params") or {})
    return Observation(point=point, result=trial_result(t), violation=float(t.user_attrs.get("violation", 0.0)),
                       context=dict(context))

