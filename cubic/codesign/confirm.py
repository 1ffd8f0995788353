"""The confirm phase of a campaign: the two leading configurations re-measured in fresh processes
until between-process evidence separates them (or the repeat budget is spent), and the winner's
speedup over the baseline and its ratio to the step model's pick, each with its interval, from rounds of the
three run back to back after the winner was chosen. Its own room beside the engine
(:mod:`cubic.codesign.campaign`), which calls it and stores the outcome (:meth:`Campaign.confirm`)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from cubic.core.stats import paired_ratio, ratio_interval, separated

if TYPE_CHECKING:  # annotations only: the CLI reads SPEEDUP_PAIRS while building its parser, before any search
    from search.space import Space
    from search.strategies import Observation


def confirm(evaluate: Callable[[dict[str, Any]], Any], space: Space, observations: Sequence[Observation],
            repeat_budget: int, baseline: tuple[Any, dict[str, Any]] | None = None,
            pick: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Re-measure the two leading configurations in fresh processes until the winner is
    separated from the runner-up by between-process evidence (cubic.core.stats.separated: each
    measured in >= 2 processes and the 95% interval of their ratio above 1), or
    ``repeat_budget`` extra repeats are spent ("tied within the repeat budget").

    Needs an evaluate that keeps repeats (``estimate``/``add_repeat``: :class:`RunnerEvaluate`,
    a user's job's evaluate); returns None otherwise. Each step adds one repeat to a leader measured
    in one process only (separation needs two each), else to whichever of the two leaders
    contributes more to the ratio's standard error (sd^2/n), then re-ranks every
    feasible configuration by its pooled estimate's geometric mean (:func:`_typical`; a re-measured
    leader may fall behind).
    ``baseline`` (an evaluate with ``estimate``/``add_repeat`` and the baseline's point) gives the
    speedup over it, measured in SPEEDUP_PAIRS back-to-back pairs of the baseline and the winner at the
    end (outside the budget; with a budget of 0 unpaired, from the repeats already taken, labelled so);
    the pairs' runs are the winner's stored repeats, and its row and "separated" pool them.
    ``pick``: the point the answer sets the winner against (the step model's first pick): it runs in the same
    rounds, after the winner (baseline, winner, pick), so the line against it is a ratio of pairs run after the
    winner was chosen (``against_pick``; :func:`_pairs`), as the speedup is; its runs are its stored repeats too,
    so a pick they lift may lead and be paired with the baseline itself.
    :meth:`Campaign.confirm` stores the outcome with the campaign."""
    ev = evaluate
    if not (callable(getattr(ev, "estimate", None)) and callable(getattr(ev, "add_repeat", None))):
        return None
    if getattr(ev, "deterministic", False):
        return _model_figures(ev, space, observations, repeat_budget, baseline)
    metric, maximize = space.primary.metric, space.primary.direction == "maximize"
    points = {}
    for o in observations:
        if o.feasible and metric in o.metrics:
            points.setdefault(space.key(o.point), o.point)
    est = {k: e for k, e in ((k, ev.estimate(p, metric)) for k, p in points.items()) if e is not None}
    if not est:
        return None

    def ranked() -> list[str]:
        return sorted(est, key=lambda k: _typical(est, k), reverse=maximize)

    def apart(w: str, r: str | None) -> bool | None:
        if r is None:
            return None
        return separated(est[w], est[r]) if maximize else separated(est[r], est[w])

    t0 = time.monotonic()
    spent, failed = _repeat_leaders(ev, points, est, ranked, apart, metric, repeat_budget)

    def row(e) -> dict[str, Any]:
        return {"value": e.value, "lo": e.lo, "hi": e.hi, "repeats": e.n, "basis": e.basis,
                "mean_log": e.mean_log, "sd": e.sd, "df": e.df}

    order = ranked() if est else []
    first = order[0] if order else None
    sep_budget = apart(first, order[1]) if len(order) > 1 else None
    w, speedup, paired, against = first, None, [first], None
    pkey = space.key(pick) if pick is not None else None
    if first is not None and (baseline is not None or pkey in est):
        w, speedup, paired, against = _paired_winner(baseline, pkey, ev, space, points, est, ranked, metric,
                                                     maximize, SPEEDUP_PAIRS if repeat_budget else 0)
    r = next((k for k in ranked() if k != w), None)
    sep = apart(w, r) if w is not None else None
    lead = None
    if w is not None and r is not None:
        iv = ratio_interval(est[w], est[r]) if maximize else ratio_interval(est[r], est[w])
        lead = None if iv is None else {"ratio": iv[0], "lo": iv[1], "hi": iv[2]}
    after = f"after {spent} of {repeat_budget} extra repeats"
    moved = w != first
    pairs_are = "the speedup pairs" if baseline is not None else "the pairs with the step model's pick"
    runs_of_pairs = f"{pairs_are}' runs" if moved else f"the winner's runs in {pairs_are}"
    verdict = ("only one feasible configuration" if r is None else
               f"separated {after}" + ("" if sep_budget and not moved else f" and {runs_of_pairs}") if sep else
               f"tied: separated {after}, no longer with {runs_of_pairs}" if sep_budget else
               "not confirmed (--confirm-repeats 0)" if repeat_budget == 0 else
               f"tied within the repeat budget ({spent} of {repeat_budget} extra repeats)")
    if r is not None and (est[w].value < est[r].value if maximize else est[w].value > est[r].value):
        verdict += ("; their medians order the two the other way: the ranking, the ratio and the separation all "
                    "use the geometric mean of the runs")
    if moved:
        verdict += (f"; {pairs_are} moved the configuration ranked first before them below this winner, "
                    f"which was then paired with the {'baseline' if baseline is not None else 'pick'} too "
                    f"({len(paired)} configurations paired)")
    out = {"metric": metric, "direction": space.primary.direction, "confidence": 0.95,
           "interval": "95% interval of what a fresh run measures (cubic.core.stats.estimate)",
           "repeat_budget": repeat_budget, "repeats_spent": spent, "separated": sep, "verdict": verdict,
           "winner": {"point": points[w], **row(est[w])} if w is not None else None,
           "runner_up": {"point": points[r], **row(est[r])} if r is not None else None,
           "lead": lead, "failed_repeats": failed}
    if against is not None:
        out["against_pick"] = {"point": pick, **against}
    if moved:
        out["ranked_first_before_pairs"] = {"point": points[first], **row(est[first])}
    if w is not None and baseline is not None:
        out["speedup"] = speedup
    out["wall_s"] = time.monotonic() - t0
    return out


def _one_more(ev, point: dict[str, Any], k: str, est: dict[str, Any], metric: str,
              failed: list[dict[str, Any]]) -> bool:
    """One more process of ``point`` (keyed ``k``), its estimate re-read; a failed run is recorded in ``failed``,
    and one that fails for good drops the point from ``est`` (it fails now where it once ran: no longer a
    candidate). Whether the run succeeded."""
    out = ev.add_repeat(point)
    if not out.ok:
        failed.append({"point": point, "failure_kind": out.failure_kind, "reason": out.reason})
        if not out.transient:
            est.pop(k)
        return False
    est[k] = ev.estimate(point, metric) or est[k]
    return True


def _typical(est: dict[str, Any], k: str) -> float:
    """What the confirm step ranks by: the log-mean of the runs (the geometric mean's log), the statistic of
    the lead's ratio, its interval and "separated" (cubic.core.stats.ratio_interval), so the winner is never
    below its runner-up in the ratio the answer states. By the median, as before, 24 of 380 winners of
    answer_calibration's campaigns (stop 83) read below their runner-up in that ratio. The median where any
    estimate lacks a log-mean (an old stored estimate), as the ratio is then not given either."""
    if all(math.isfinite(e.mean_log) for e in est.values()):
        return est[k].mean_log
    return est[k].value


# The pairs' runs are stored repeats of the winner and its row pools them (one trial, one interval), so they
# can move it below the runner-up: 27 of 380 campaigns in results/answer_calibration.json (stop 78) named a
# winner their own figures then ranked second, one of them with the runner-up separated above it. The one
# they rank first is measured against the baseline the same way; at most this many configurations are.
PAIRED_AT_MOST = 3


def _paired_winner(baseline: tuple[Any, dict[str, Any]] | None, pkey: str | None, ev, space: Space,
                   points: dict[str, dict[str, Any]], est: dict[str, Any], ranked: Callable[[], list[str]],
                   metric: str, maximize: bool,
                   pairs: int) -> tuple[str, dict[str, Any] | None, list[str], dict[str, Any] | None]:
    """(winner, its speedup over the baseline, the configurations paired, the winner against the pick keyed
    ``pkey``): the first-ranked configuration run in ``pairs`` rounds with the baseline and the pick
    (:func:`_pairs`) and its estimate re-read with the rounds' runs pooled (the pick's too), then whichever now
    ranks first, until the first-ranked one has been paired (each at most once, at most PAIRED_AT_MOST); the
    winner is the best of those paired, so the answer's winner is first by every run it shows where the cap is
    not reached. The line against the pick is the final winner's own rounds' (None: no pick to set it against,
    or fewer than two rounds usable)."""
    bkey = space.key(baseline[1]) if baseline is not None and baseline[1] else None
    speedups: dict[str, dict[str, Any] | None] = {}
    against: dict[str, dict[str, Any] | None] = {}
    paired: list[str] = []
    w = ranked()[0]
    while True:
        paired.append(w)
        refs = {}
        if baseline is not None and w != bkey:
            refs["baseline"] = baseline
        if pkey is not None and pkey in est and pkey not in (w, bkey):  # the pick as the baseline: its pairs
            refs["pick"] = (ev, points[pkey])
        rounds = _pairs(refs, ev, points[w], metric, pairs)
        if baseline is not None:
            speedups[w] = (_itself(baseline, metric) if w == bkey else
                           _speedup(baseline, ev, points[w], est[w], metric, maximize, pairs, rounds.get("baseline")))
        if pkey is not None and pkey != w:
            against[w] = _paired_line(rounds.get("baseline" if pkey == bkey else "pick"), maximize, pairs)
        for k in (w, pkey):  # the rounds' runs are stored repeats of both
            if k in est:
                est[k] = ev.estimate(points[k], metric) or est[k]
        w = ranked()[0]
        if w in paired or len(paired) >= PAIRED_AT_MOST:
            break
    w = next(k for k in ranked() if k in paired)
    return w, speedups.get(w), paired, against.get(w)


# what the confirm step says of a deterministic source (the simulator): a repeat gives the same figure,
# so a "95% interval" of zero width or a "separated" would claim evidence nothing measured
MODEL_FIGURES = ("SIMULATED: the step model gives the same figure every time, so nothing was repeated and no "
                 "interval applies; its figures were never timed on a GPU cluster")


def _model_figures(ev, space: Space, observations: Sequence[Observation], repeat_budget: int,
                   baseline: tuple[Any, dict[str, Any]] | None) -> dict[str, Any] | None:
    """:func:`confirm` for a deterministic evaluate: the two leaders and the speedup over the baseline as
    the model's ratios, with no repeats, no interval and no verdict of separation (``separated`` None)."""
    metric, maximize = space.primary.metric, space.primary.direction == "maximize"
    values: dict[str, tuple[dict[str, Any], float]] = {}
    for o in observations:
        e = ev.estimate(o.point, metric) if o.feasible and metric in o.metrics else None
        if e is not None and e.value:
            values.setdefault(space.key(o.point), (o.point, e.value))
    if not values:
        return None
    order = sorted(values.values(), key=lambda pv: pv[1], reverse=maximize)

    def row(pv: tuple[dict[str, Any], float]) -> dict[str, Any]:
        return {"point": pv[0], "value": pv[1], "lo": pv[1], "hi": pv[1], "repeats": 1,
                "basis": "SIMULATED: one evaluation of a deterministic model", "deterministic": True}

    def ratio(a: float, b: float) -> float:
        return a / b if maximize else b / a

    out = {"metric": metric, "direction": space.primary.direction, "deterministic": True,
           "interval": "none: " + MODEL_FIGURES, "repeat_budget": repeat_budget, "repeats_spent": 0,
           "separated": None, "winner": row(order[0]), "runner_up": row(order[1]) if len(order) > 1 else None,
           "lead": None, "failed_repeats": [], "wall_s": 0.0,
           "verdict": "only one feasible configuration" if len(order) < 2 else MODEL_FIGURES}
    if len(order) > 1:
        r = ratio(order[0][1], order[1][1])
        out["lead"] = {"ratio": r, "lo": r, "hi": r}
    if baseline is not None and callable(getattr(baseline[0], "estimate", None)):
        be = baseline[0].estimate(baseline[1], metric)
        if be is not None and be.value:
            itself = bool(baseline[1]) and space.key(order[0][0]) == space.key(baseline[1])
            r = 1.0 if itself else ratio(order[0][1], be.value)
            out["speedup"] = {"ratio": r, "lo": r, "hi": r, "paired": False, "pairs": 0, "pairs_planned": 0,
                              **_baseline_fields(be), "beats_baseline": r > 1.0 and not itself,
                              "deterministic": True, "method": "the ratio of the step model's figures for the "
                              f"winner and the baseline ({MODEL_FIGURES})"}
            if itself:
                out["speedup"]["winner_is_baseline"] = True
    return out


def _repeat_leaders(ev, points: dict[str, dict[str, Any]], est: dict[str, Any], ranked: Callable[[], list[str]],
                    apart: Callable[[str, str | None], bool | None], metric: str,
                    repeat_budget: int) -> tuple[int, list[dict[str, Any]]]:
    """The repeat loop of :func:`confirm`: adds repeats to the two leaders (updating ``est`` in place,
    dropping a configuration that now fails for good) until they are apart or the budget is spent;
    returns (repeats spent, the failed repeats)."""
    spent, failed = 0, []
    while True:
        order = ranked()
        w, r = order[0], (order[1] if len(order) > 1 else None)
        if r is None or apart(w, r) or spent >= repeat_budget:
            return spent, failed
        # "separated" needs each leader in >= 2 processes: a leader with one gets its second first (by
        # the error rule alone a noisy winner drew every repeat, and a one-run runner-up, whose
        # spread is unknown, could never be separated from it: the whole budget spent for a tie)
        single = [k for k in (w, r) if est[k].n < 2]
        target = single[0] if single else max(
            (w, r), key=lambda k: (est[k].sd ** 2 / est[k].n if math.isfinite(est[k].sd) else math.inf, -est[k].n))
        spent += 1
        if not _one_more(ev, points[target], target, est, metric, failed) and not est:
            return spent, failed


# The speedup is measured in PAIRS: the baseline and the winner run back to back, SPEEDUP_PAIRS times, at
# the campaign's end. Measured apart (the baseline's repeats before the campaign, the winner's during it),
# the machine's drift lies between them: between two passes minutes apart this machine's throughput moved
# 12.4% for every configuration alike, while configurations moved against each other by less than repeat
# noise (measurement_noise), and answer_calibration found the unpaired ratio contradicted by a later
# re-measurement in 3 of 36 dlrm-small campaigns even with the baseline measured again at the end. A pair
# shares its moment, so a drift common to both cancels in its ratio (dlrm-small, 10 pairs: sd of one
# pair's log ratio 0.064 against 0.086 for two unpaired runs). The step model's pick runs in the same rounds,
# after the winner, for the same reason and one more: every run of these rounds is made after the winner was
# chosen, so none of them is a run the search ranked (the pick's first run is one the search ranked below the
# leaders: pooled into the line against it, 23 of the 31 misses of against_pick_calibration, stop 84, lay
# above the true ratio).
SPEEDUP_PAIRS = 4


def _speedup(baseline: tuple[Any, dict[str, Any]], ev, wpoint: dict[str, Any], win, metric: str, maximize: bool,
             pairs: int = 0, rounds: tuple[list[float], list[float], int] | None = None) -> dict[str, Any] | None:
    """The winner over the baseline with its 95% confidence interval: from ``rounds`` (the log ratios of
    :func:`_pairs`' back-to-back pairs, of ``pairs`` planned; the geometric mean of the pairs' ratios, a
    t-interval over their log ratios) when two pairs or more succeeded; else unpaired, the ratio of the
    typical values (cubic.core.stats.ratio_interval, the baseline given a second repeat when it has one),
    labelled so. The pairs' runs are stored repeats of both like any other."""
    bev, bpoint = baseline
    if not callable(getattr(bev, "estimate", None)):
        return None
    logs, loaded, contended, left_out = _usable(rounds, maximize)
    win = ev.estimate(wpoint, metric) or win  # the pairs' runs are the winner's repeats too: one estimate
    be = bev.estimate(bpoint, metric)
    if be is not None and be.n < 2 and len(logs) < 2 and callable(getattr(bev, "add_repeat", None)):
        if bev.add_repeat(bpoint).ok:
            be = bev.estimate(bpoint, metric) or be
    if be is None:
        return None
    if len(logs) >= 2:
        iv = paired_ratio(logs)
        method = _paired_method(len(logs), "the baseline and the winner", left_out, loaded, contended)
    else:
        iv = ratio_interval(win, be) if maximize else ratio_interval(be, win)
        when = ("the baseline's and the winner's repeats pooled, the pairs' runs among them" if pairs else
                "the baseline was measured before the campaign and the winner during it")
        method = ("UNPAIRED: exp(difference of log-means), Welch interval on logs, each side's between-process "
                  f"variance (its repeats pooled with the machine's); {when}, so a drift of the machine between "
                  "them is not in the interval"
                  + (f" ({len(logs)} of {pairs} pairs usable; left out: {left_out})" if pairs else ""))
    if iv is None:
        return None
    return {"ratio": iv[0], "lo": iv[1], "hi": iv[2], "paired": len(logs) >= 2, "pairs": len(logs),
            "pairs_planned": pairs, "pairs_contended": contended, **_baseline_fields(be),
            "beats_baseline": iv[1] > 1.0, "method": method}


def _paired_line(rounds: tuple[list[float], list[float], int] | None, maximize: bool,
                 pairs: int) -> dict[str, Any] | None:
    """The winner over the step model's pick from the rounds' pairs, as :func:`_speedup` states the winner over
    the baseline ("separated": the interval above 1x); None with fewer than two usable pairs (the line is then
    the pooled runs', :mod:`cubic.codesign.against_prior`)."""
    logs, loaded, contended, left_out = _usable(rounds, maximize)
    iv = paired_ratio(logs)
    if iv is None:
        return None
    return {"ratio": iv[0], "lo": iv[1], "hi": iv[2], "paired": True, "pairs": len(logs), "pairs_planned": pairs,
            "pairs_contended": contended, "separated": iv[1] > 1.0,
            "method": _paired_method(len(logs), "the winner and the step model's pick", left_out, loaded, contended)}


def _usable(rounds: tuple[list[float], list[float], int] | None,
            maximize: bool) -> tuple[list[float], list[float], bool, str]:
    """(the log ratios used, the winner's better side positive, the contended ones, whether the contended ones
    are used, what was left out) of one comparison's pairs: the clean pairs, or every pair where fewer than two
    are clean, as the estimates use contended repeats when every repeat was contended."""
    logs, loaded, failed = rounds or ([], [], 0)
    if not maximize:
        logs, loaded = [-x for x in logs], [-x for x in loaded]
    contended = len(logs) < 2 and len(logs) + len(loaded) >= 2
    if contended:
        logs = logs + loaded
    left_out = ", ".join(f"{n} {what}" for n, what in ((failed, "failed"), (len(loaded), "contended"))
                         if n and not (what == "contended" and contended))
    return logs, loaded, contended, left_out


def _paired_method(n: int, two: str, left_out: str, loaded: list[float], contended: bool) -> str:
    method = (f"{n} pairs, {two} run back to back at the campaign's end: the geometric mean of the pairs' ratios, "
              "a t-interval over their log ratios (a drift of the machine common to both cancels in each pair)"
              + (f"; pairs left out: {left_out}" if left_out else ""))
    if contended:
        method += (f"; CONTENDED: {len(loaded)} of the {n} pairs ran on a loaded machine (more runnable threads "
                   "than cores); load common to a pair's two runs cancels in its ratio, load that differs between "
                   "them does not")
    return method


def _itself(baseline: tuple[Any, dict[str, Any]], metric: str) -> dict[str, Any] | None:
    """The winner IS the baseline configuration: its ratio to itself is 1 by definition, so nothing is
    run (pairs of one configuration measure only noise, and their 95% interval excludes 1 one time in
    twenty: a test of the answer saw "1.04x better than the baseline" for the baseline itself)."""
    bev, bpoint = baseline
    be = bev.estimate(bpoint, metric) if callable(getattr(bev, "estimate", None)) else None
    if be is None:
        return None
    return {"ratio": 1.0, "lo": 1.0, "hi": 1.0, "paired": False, "pairs": 0, "pairs_planned": 0,
            **_baseline_fields(be), "beats_baseline": False, "winner_is_baseline": True,
            "method": "the winner is the baseline configuration: its ratio to itself is 1, nothing measured"}


def _baseline_fields(be) -> dict[str, Any]:
    return {"baseline_repeats": be.n, "baseline_value": be.value, "baseline_lo": be.lo, "baseline_hi": be.hi,
            "baseline_basis": be.basis}


def _pairs(refs: dict[str, tuple[Any, dict[str, Any]]], ev, wpoint: dict[str, Any], metric: str,
           pairs: int) -> dict[str, tuple[list[float], list[float], int]]:
    """``pairs`` rounds, each the first of ``refs`` (name -> (its evaluate, its point)), the winner, then the
    others, back to back; per name, log(winner / it) of each round whose two runs both succeeded: (the
    uncontended pairs, the pairs with a contended run, how many failed). Nothing when an evaluate cannot give
    one run's value."""
    evs = [ev] + [e for e, _ in refs.values()]
    if not refs or not all(callable(getattr(e, n, None)) for e in evs for n in ("add_repeat", "run_value")):
        return {}
    out: dict[str, tuple[list[float], list[float], int]] = {k: ([], [], 0) for k in refs}

    def value(e, point) -> tuple[float | None, bool]:  # (figure, contended)
        if not e.add_repeat(point).ok:
            return None, False
        v = e.run_value(point, metric)
        if v is None and callable(getattr(e, "contended_value", None)):
            c = e.contended_value(point, metric)
            return c, c is not None
        return v, False

    names = list(refs)
    for _ in range(pairs):
        got = {names[0]: value(*refs[names[0]])}
        w, wc = value(ev, wpoint)
        got.update((k, value(*refs[k])) for k in names[1:])
        for k, (r, rc) in got.items():
            clean, loaded, failed = out[k]
            if r is None or w is None:
                out[k] = (clean, loaded, failed + 1)
            else:
                (loaded if rc or wc else clean).append(math.log(w / r))
    return out
