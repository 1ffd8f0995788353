"""What the search added to the step model, said in each campaign's answer: the winner against the step
model's own first pick (the first round's first run), measured by the interval rule the confirm step uses,
and the run at which walking the step model's order would have reached the winner; and, where the campaign
ran its ``--baselines``, its winner against the one the same budget found walking that order.

Why in the answer: on simulated clusters no design choice was made on, the search was not shown to add to
the step model it starts from (:mod:`search.prior_order`); a user deciding whether the next campaign is
worth its runs needs the same comparison on their own runs."""

from __future__ import annotations

import math
from typing import Any, Sequence

from cubic.core.stats import Estimate, ratio_interval, separated
from search.prior_order import prior_ranking
from search.space import Space
from search.strategies import Observation

PICK_SOURCE = "step-model prior"  # the first round's proposal source for the model's own pick


def against_prior(space: Space, runs: Sequence[Any], observations: Sequence[Observation], evaluate,
                  winner: dict[str, Any] | None, featurize=None,
                  run_context: dict[str, Any] | None = None,
                  paired: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The winner against the step model's first pick. ``runs``: the campaign's trials in the order they
    were proposed (``user_attrs['predicted']['source']`` names the pick); ``paired``: the confirm step's pairs
    of the two run back to back after the winner was chosen (``against_pick``), the line's ratio, interval and
    "separated" where given for this pick; else ``evaluate.estimate(point, metric)``, each side's pooled
    estimate (labelled UNPAIRED; a deterministic evaluate: the model's ratio, no interval); the pick's pooled
    estimate is shown either way. ``featurize``, ``run_context``: the campaign's, for
    :func:`search.prior_order.prior_ranking`. None when no run was the step model's pick (no prior, or a warm
    start whose first round was the warm proxy's)."""
    if winner is None or space.primary.direction != "maximize":
        return None
    key = space.key
    pick = pick_trial(runs)
    if pick is None:
        return None
    m = space.primary.metric
    wkey, pkey = key(winner), key(dict(pick.params))
    out: dict[str, Any] = {
        "metric": m, "pick": {"number": pick.number, "point": dict(pick.params), "run": _run_of(space, runs, pkey)},
        "is_winner": wkey == pkey, "winner_run": _run_of(space, runs, wkey), "runs": len(runs),
        "winner_prior_rank": None, "ranked": None}
    order = prior_ranking(space, featurize, run_context or {})
    if order is not None:
        ranks = {key(p): i + 1 for i, (p, _) in enumerate(order)}
        out["winner_prior_rank"], out["ranked"] = ranks.get(wkey), len(order)
    if out["is_winner"]:
        return out
    est = getattr(evaluate, "estimate", None)
    ok = any(o.feasible and m in o.metrics and key(o.point) == pkey for o in observations)
    w, p = (est(winner, m), est(dict(pick.params), m)) if callable(est) and ok else (None, None)
    if w is None or p is None:
        out["pick"]["failed"] = not ok
        return out
    out["pick"].update(value=p.value, lo=p.lo, hi=p.hi, repeats=p.n)
    if getattr(evaluate, "deterministic", False):
        out.update(deterministic=True, ratio=w.value / p.value if p.value else None)
        return out
    if paired and key(paired["point"]) == pkey:
        return {**out, **{k: paired[k] for k in ("ratio", "lo", "hi", "separated", "paired", "pairs",
                                                  "pairs_contended", "method")}}
    return {**out, **_compared(w, p), "paired": False}


def pick_trial(runs: Sequence[Any]) -> Any | None:
    """The run that measured the step model's own first pick (the first round's, by its proposal source)."""
    return next((t for t in runs if ((t.user_attrs.get("predicted") or {}).get("source") == PICK_SOURCE)), None)


def _run_of(space: Space, runs: Sequence[Any], k: str) -> int | None:
    """The run (1-based, in the order proposed) that first measured the configuration keyed ``k``."""
    return next((i + 1 for i, t in enumerate(runs) if space.key(dict(t.params)) == k), None)


def _compared(a: Estimate, b: Estimate) -> dict[str, Any]:
    """``a`` over ``b`` as the confirm step states a ratio: typical values with the 95% interval of their ratio
    (the plain ratio of the two values where a side has no spread to give one), and "separated"."""
    iv = ratio_interval(a, b)
    return {"ratio": iv[0] if iv else (a.value / b.value if b.value else None), "lo": iv[1] if iv else None,
            "hi": iv[2] if iv else None, "separated": separated(a, b)}


def against_order(space: Space, confirm: dict[str, Any] | None, sibling: str, sibling_confirm: dict[str, Any] | None,
                  sibling_runs: Sequence[Any]) -> dict[str, Any] | None:
    """The campaign's confirmed winner against the winner of the same budget spent walking the step model's
    order (its ``--baselines`` sibling ``sibling``, strategy ``prior-order``), from the two confirm records.
    Unpaired: the two campaigns ran at different moments, so a drift of the machine between them is in the
    ratio (said so in the answer). None when either has no confirmed winner."""
    w, o = (confirm or {}).get("winner"), (sibling_confirm or {}).get("winner")
    if not w or not o or space.primary.direction != "maximize":
        return None
    okey = space.key(o["point"])
    runs = sorted(sibling_runs, key=lambda t: t.number)
    out: dict[str, Any] = {"campaign": sibling, "runs": len(runs), "point": o["point"], "value": o["value"],
                           "run": _run_of(space, runs, okey), "same": space.key(w["point"]) == okey}
    if out["same"] or not o["value"]:
        return out
    if confirm.get("deterministic") or sibling_confirm.get("deterministic"):
        return {**out, "deterministic": True, "ratio": w["value"] / o["value"]}
    ew, eo = (Estimate(r["value"], r["lo"], r["hi"], r["repeats"], r.get("mean_log", math.nan), r.get("sd", math.nan),
                       r.get("df", 0)) for r in (w, o))
    return {**out, **_compared(ew, eo), "repeats": o["repeats"]}
