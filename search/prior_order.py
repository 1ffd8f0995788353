"""The step model's prior as the search reads it: which feature columns hold its predictions, which
configurations it expects to run and fit, and its order over a small discrete space, walked by the
``prior-order`` strategy (:class:`search.strategies.PriorOrder`) and the order each answer sets its winner in
(:mod:`cubic.codesign.against_prior`).

Why the order is a baseline: on simulated clusters no design choice was made on (``search_benchmark
--held-out``, SIMULATED), cubic's search needed 11.2 runs to 98% of the best and walking this order 12.5, per
instance -1.3 [-4.0, +1.4]: the search is not shown to add to the model it starts from, so a user's own
campaign should be able to show whether it does on their machine (``--baselines`` runs it beside cubic's)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from search.space import Space

RANKED_AT_MOST = 5000  # spaces this small are listed whole: the order here, every point scored in a round (ProxyGuided)


def prior_columns(space: Space, featurize) -> dict[str, int]:
    """metric -> column of the feature row holding an analytical model's log prediction of it
    (a featurizer names them in ``prior_columns``, relative to its own output)."""
    cols = getattr(featurize, "prior_columns", None) or {}
    if not cols:
        return {}
    offset = len(space.features(space.sample(np.random.default_rng(0))))
    return {m: offset + j for m, j in cols.items()}


def prior_runs(X: np.ndarray, priors: dict[str, int], space: Space) -> np.ndarray:
    """Candidates (feature rows) the analytical prior gives a throughput: none means it predicts an OOM
    or an invalid configuration. The first round and the proxy's rounds both keep to them."""
    return np.isfinite(X[:, priors[space.primary.metric]])


def prior_expects_to_fit(X: np.ndarray, priors: dict[str, int], space: Space) -> np.ndarray:
    """Candidates the prior gives a throughput and expects within every constraint it predicts (peak
    memory): the first round's choices, and the head of the prior's order."""
    ok = prior_runs(X, priors, space)
    for c in space.constraints:
        if c.metric in priors and c.max is not None and c.max > 0:
            mem = X[:, priors[c.metric]]
            ok &= ~(np.isfinite(mem) & (mem > math.log(c.max)))
    return ok


def order_by_prior(pred: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Indices in the step model's order: ``ok`` (expected to run and fit) first, then by ``pred`` (its log
    prediction, larger is better; NaN or -inf last), ties in the given order (a stable sort)."""
    pred = np.where(np.isfinite(pred), pred, -np.inf)
    return np.lexsort((-pred, ~np.asarray(ok, dtype=bool)))


def orderable(space: Space) -> bool:
    """Whether the step model's order over ``space`` can be listed: a small discrete space, maximised."""
    size = space.size()
    return size is not None and size <= RANKED_AT_MOST and space.primary.direction == "maximize"


def prior_proposal(space: Space, value: float, source: str) -> dict[str, Any]:
    """What a proposal taken from the prior says it predicted: its log value and the metric, and from where."""
    pred = {"objective": float(value), space.primary.metric: float(math.exp(value))} if math.isfinite(value) else {}
    return {**pred, "source": source}


def prior_ranking(space: Space, featurize, run_context: dict[str, Any]) -> list[tuple[dict[str, Any], float]] | None:
    """(point, the prior's log prediction of the objective) for every point, in the step model's order
    (:func:`order_by_prior` over :func:`prior_expects_to_fit`). None where the space is not a small discrete
    one, the objective is not maximised, or the prior predicts no point (no step model for these runs)."""
    cols = dict(getattr(featurize, "prior_columns", None) or {})  # columns of the featurizer's own output
    m = space.primary.metric
    if m not in cols or not orderable(space):
        return None
    pts = space.enumerate()
    F = np.asarray([np.asarray(featurize(p, run_context), dtype=np.float64) for p in pts])
    if F.ndim != 2 or F.shape[1] <= max(cols.values()):  # nothing featurized here (no workload in the context)
        return None
    pred = F[:, cols[m]]
    if not np.isfinite(pred).any():
        return None
    return [(pts[int(j)], float(pred[j])) for j in order_by_prior(pred, prior_expects_to_fit(F, cols, space))]
