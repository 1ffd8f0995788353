"""The confirm phase of a campaign: the two leading configurations re-measured in fresh processes
until between-process evidence separates them (or the repeat budget is spent), and the winner's
speedup over the baseline with its interval. Its own room beside the engine
(:mod:`cubic.codesign.campaign`), which calls it and stores the outcome (:meth:`Campaign.confirm`)."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

from cubic.core.stats import ratio_interval, separated
from search.space import Space
from search.strategies import Observation


def confirm(evaluate: Callable[[dict[str, Any]], Any], space: Space, observations: Sequence[Observation],
            repeat_budget: int, baseline: tuple[Any, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """Re-measure the two leading configurations in fresh processes until the winner is
    separated from the runner-up by between-process evidence (cubic.core.stats.separated: each
    measured in >= 2 processes and the 95% interval of their ratio above 1), or
    ``repeat_budget`` extra repeats are spent ("tied within the repeat budget").

    Needs an evaluate that keeps repeats (``estimate``/``add_repeat``: :class:`RunnerEvaluate`,
    a user's job's evaluate); returns None otherwise. Each step adds one repeat to a leader measured
    in one process only (separation needs two each), else to whichever of the two leaders
    contributes more to the ratio's standard error (sd^2/n), then re-ranks every
    feasible configuration by its pooled estimate (a re-measured leader may fall behind).
    ``baseline`` (an evaluate with ``estimate``/``add_repeat`` and the baseline's point) gives
    the speedup its interval the same way, the baseline re-measured BASELINE_END_REPEATS times at the
    end (outside the budget; with a budget of 0 only a second repeat when it has one).
    :meth:`Campaign.confirm` stores the outcome with the campaign."""
    ev = evaluate
    if not (callable(getattr(ev, "estimate", None)) and callable(getattr(ev, "add_repeat", None))):
        return None
    metric, maximize = space.primary.metric, space.primary.direction == "maximize"
    points = {}
    for o in observations:
        if o.feasible and metric in o.metrics:
            points.setdefault(space.key(o.point), o.point)
    est = {k: e for k, e in ((k, ev.estimate(p, metric)) for k, p in points.items()) if e is not None}
    if not est:
        return None

    def ranked() -> list[str]:
        return sorted(est, key=lambda k: est[k].value, reverse=maximize)

    def apart(w: str, r: str | None) -> bool | None:
        if r is None:
            return None
        return separated(est[w], est[r]) if maximize else separated(est[r], est[w])

    spent, failed, t0 = 0, [], time.monotonic()
    while True:
        order = ranked()
        w, r = order[0], (order[1] if len(order) > 1 else None)
        if r is None or apart(w, r) or spent >= repeat_budget:
            break
        # "separated" needs each leader in >= 2 processes: a leader with one gets its second first (by
        # the error rule alone a noisy winner drew every repeat, and a one-run runner-up, whose
        # spread is unknown, could never be separated from it: the whole budget spent for a tie)
        single = [k for k in (w, r) if est[k].n < 2]
        target = single[0] if single else max(
            (w, r), key=lambda k: (est[k].sd ** 2 / est[k].n if math.isfinite(est[k].sd) else math.inf, -est[k].n))
        out = ev.add_repeat(points[target])
        spent += 1
        if not out.ok:
            failed.append({"point": points[target], "failure_kind": out.failure_kind, "reason": out.reason})
            if not out.transient:  # it fails now where it once ran: no longer a candidate
                est.pop(target)
                if not est:
                    break
            continue
        est[target] = ev.estimate(points[target], metric) or est[target]

    def row(e) -> dict[str, Any]:
        return {"value": e.value, "lo": e.lo, "hi": e.hi, "repeats": e.n, "basis": e.basis,
                "mean_log": e.mean_log, "sd": e.sd, "df": e.df}

    order = ranked() if est else []
    w = order[0] if order else None
    r = order[1] if len(order) > 1 else None
    sep = apart(w, r) if w is not None else None
    lead = None
    if w is not None and r is not None:
        iv = ratio_interval(est[w], est[r]) if maximize else ratio_interval(est[r], est[w])
        lead = None if iv is None else {"ratio": iv[0], "lo": iv[1], "hi": iv[2]}
    verdict = ("only one feasible configuration" if r is None else
               f"separated after {spent} of {repeat_budget} extra repeats" if sep else
               "not confirmed (--confirm-repeats 0)" if repeat_budget == 0 else
               f"tied within the repeat budget ({spent} of {repeat_budget} extra repeats)")
    out = {"metric": metric, "direction": space.primary.direction, "confidence": 0.95,
           "interval": "95% interval of what a fresh run measures (cubic.core.stats.estimate)",
           "repeat_budget": repeat_budget, "repeats_spent": spent, "separated": sep, "verdict": verdict,
           "winner": {"point": points[w], **row(est[w])} if w is not None else None,
           "runner_up": {"point": points[r], **row(est[r])} if r is not None else None,
           "lead": lead, "failed_repeats": failed}
    if w is not None and baseline is not None:
        out["speedup"] = _speedup(baseline, est[w], metric, maximize, BASELINE_END_REPEATS if repeat_budget else 0)
    out["wall_s"] = time.monotonic() - t0
    return out


# The baseline's repeats are all taken before the campaign (its noise floor: back-to-back), and this
# machine's throughput drifts between sessions more than between back-to-back repeats (measurement_noise:
# pass to pass about twice repeat to repeat). answer_calibration found the speedup's interval from those
# repeats alone contradicted by a later re-measurement in 5 of 36 dlrm-small campaigns (14%, both ways),
# so the confirm step measures the baseline again at the end: its repeats span the campaign, their
# spread includes the drift, and their centre is not one moment's.
BASELINE_END_REPEATS = 2


def _speedup(baseline: tuple[Any, dict[str, Any]], win, metric: str, maximize: bool,
             end_repeats: int = 0) -> dict[str, Any] | None:
    """The winner over the baseline: the ratio of their typical values with its 95% interval
    (cubic.core.stats.ratio_interval); the baseline gets ``end_repeats`` fresh processes now (outside
    the repeat budget; at least a second one when it has one)."""
    bev, bpoint = baseline
    if not callable(getattr(bev, "estimate", None)):
        return None
    be = bev.estimate(bpoint, metric)
    if be is not None and callable(getattr(bev, "add_repeat", None)):
        for _ in range(max(end_repeats, 2 - be.n)):
            if bev.add_repeat(bpoint).ok:
                be = bev.estimate(bpoint, metric) or be
    if be is None:
        return None
    iv = ratio_interval(win, be) if maximize else ratio_interval(be, win)
    if iv is None:
        return None
    return {"ratio": iv[0], "lo": iv[1], "hi": iv[2], "baseline_repeats": be.n, "baseline_value": be.value,
            "baseline_lo": be.lo, "baseline_hi": be.hi, "baseline_basis": be.basis,
            "beats_baseline": iv[1] > 1.0,
            "baseline_end_repeats": end_repeats,
            "method": "exp(difference of log-means), Welch interval on logs, each side's between-process "
                      "variance (its repeats pooled with the machine's)"
                      + (f"; the baseline measured before the campaign and {end_repeats} times after it, so its "
                         "spread includes the machine's drift between them" if end_repeats else "")}
