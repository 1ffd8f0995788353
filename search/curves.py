"""Learning curves of a campaign's runs: what a run keeps of its curve (:func:`thin_curve`), the
value a run a pruner stopped is credited (:func:`credit_pruned`), and whether the completed runs'
curves back the pruner's early judgement (:func:`early_ranking`).

A curve is ``[[step, value], ...]`` in step order, kept in a run's ``Result.extra["curve"]`` (the
runner's record) and as an Optuna trial's intermediate values (the campaign's). Optuna is not
imported here: a runner keeps curves without loading the search.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from cubic.core.result import Result
from search.space import Space

if TYPE_CHECKING:
    from search.strategies import Observation

CURVE_POINTS = 512  # a learning curve kept with a run: at most this many (step, value) points


def thin_curve(points: list[tuple[int, float]]) -> list[list[float]]:
    """A run's learning curve as stored with its result (``extra["curve"]``): ``[[step, value], ...]``
    in step order, at most :data:`CURVE_POINTS`, thinned evenly and always keeping the last."""
    pts = [[int(st), float(v)] for st, v in sorted(points) if math.isfinite(v)]
    if len(pts) > CURVE_POINTS:
        idx = np.unique(np.linspace(0, len(pts) - 1, CURVE_POINTS).round().astype(int))
        pts = [pts[i] for i in idx]
    return pts


def _index(curve: list) -> tuple[list, list]:
    # a curve with its steps listed once, for _value_at's bisection (a list per lookup made every
    # lookup as slow as the curve is long)
    return [st for st, _ in curve], curve


def _value_at(indexed: tuple[list, list], step: float) -> float | None:
    # a completed run's value at the last report at or before ``step`` (curves are in step order)
    steps, curve = indexed
    i = bisect.bisect_right(steps, step)
    return curve[i - 1][1] if i else None


def credit_pruned(space: Space, history: list[Observation]) -> list[Observation]:
    """The history with each run a pruner stopped (``pruned``, its last intermediate value in its
    metrics) seen as a run at the value its curve was heading for: its last value plus the median
    gain the completed runs made from that step to their end (their curves in ``extra["curve"]``),
    never credited above the worst completed run (it was stopped for looking worse, and Optuna's
    samplers rank a pruned trial below the completed ones). Without completed curves reaching that
    step, the last value itself. So the proxy learns from its curve instead of counting its region
    infeasible, and does not take a curve stopped early for a final one. One objective only; a
    pruned run without a value, or before any run completed, stays a failure. CubicSampler and the
    campaign share it."""
    if len(space.objectives) != 1:
        return list(history)
    o = space.objectives[0]
    done = [h for h in history if h.ok and math.isfinite(h.metrics.get(o.metric, math.nan))]
    if not done:
        return list(history)
    finals = [h.metrics[o.metric] for h in done]
    worst = min(finals) if o.direction == "maximize" else max(finals)
    gains_after: dict[float, list[float]] = {}  # per step: the completed runs' gains from it to their end
    curves = [(_index(c.result.extra.get("curve") or []), c.metrics[o.metric]) for c in done]

    def gains(step: float) -> list[float]:
        if step not in gains_after:
            gains_after[step] = [end - at for ix, end in curves if (at := _value_at(ix, step)) is not None]
        return gains_after[step]

    out = []
    for h in history:
        last = h.metrics.get(o.metric, math.nan)
        if h.failure_kind == "pruned" and math.isfinite(last):
            own = h.result.extra.get("curve") or []
            step = own[-1][0] if own else h.metrics.get("pruned_step")
            seen = [] if step is None else gains(step)
            gain = float(np.median(seen)) if seen else 0.0
            v = min(last + gain, worst) if o.direction == "maximize" else max(last + gain, worst)
            h = replace(h, result=Result(status="ok", source=h.result.source, metrics={**h.metrics, o.metric: v},
                                         extra={**h.result.extra, "pruned": True, "last_value": last,
                                                "median_gain_after": gain, "gain_from_runs": len(seen)}))
        out.append(h)
    return out


# early_ranking: how well a step ranks the completed runs as their ends do before a note says it
# backs the pruner (RANKS_WELL) or not (RANKS_POORLY), and the fewest runs that say anything
RANKS_WELL, RANKS_POORLY, MIN_RANKED_RUNS = 0.8, 0.5, 5


def early_ranking(space: Space, history: list[Observation]) -> dict | None:
    """Whether the completed runs' curves back the pruner: at the median step where runs were
    stopped, the Spearman correlation between the completed runs' values there and at their ends,
    and the first step that ranks them at :data:`RANKS_WELL` or better (what ``--prune-warmup``
    could be). The completed runs are those the pruner let finish, a biased sample, but the only
    curves that reach the end. ``spearman`` None: fewer than :data:`MIN_RANKED_RUNS` completed
    curves reach that step (or none differ), too few to check the pruner. None without a stopped
    run or with several objectives."""
    from scipy.stats import spearmanr

    if len(space.objectives) != 1:
        return None
    metric = space.objectives[0].metric
    stopped = [h for h in history if h.failure_kind == "pruned"]
    steps = [(h.result.extra.get("curve") or [[h.metrics.get("pruned_step")]])[-1][0] for h in stopped]
    steps = [float(st) for st in steps if st is not None]
    done = [(_index(h.result.extra["curve"]), h.metrics[metric]) for h in history
            if h.ok and math.isfinite(h.metrics.get(metric, math.nan)) and h.result.extra.get("curve")]
    if not steps:
        return None

    def rho(step: float) -> tuple[float | None, int]:
        pairs = [(at, end) for ix, end in done if (at := _value_at(ix, step)) is not None]
        if len(pairs) < MIN_RANKED_RUNS or len({a for a, _ in pairs}) < 2 or len({e for _, e in pairs}) < 2:
            return None, len(pairs)
        return float(spearmanr([a for a, _ in pairs], [e for _, e in pairs]).statistic), len(pairs)

    step = float(np.median(steps))
    r, n = rho(step)
    if r is None:
        return {"stopped": len(steps), "step": step, "spearman": None, "runs": n, "first_step_ranking_well": None}
    later = sorted({st for (curve_steps, _), _ in done for st in curve_steps if st >= step})
    well = next((st for st in later if (rho(st)[0] or -1.0) >= RANKS_WELL), None)
    return {"stopped": len(steps), "step": step, "spearman": r, "runs": n, "first_step_ranking_well": well}
