"""Planners by name: the one place that knows every planner (heuristics, greedy, cubic's search, TorchRec's)."""

from __future__ import annotations

from sharding.estimate import Estimator
from sharding.planners import CubicPlanner, HeuristicPlanner, Planner


def make_planner(name: str, seed: int = 0, estimator: Estimator | None = None, target: str = "any",
                 **kw) -> Planner:
    """A planner by name: cubic, torchrec, greedy, random, dim_greedy, lookup_greedy, size_greedy, size_lookup_greedy.

    ``target="torchrec"``: plan only shapes TorchRec executes as planned (TorchRec's own planner always does).
    """
    if name == "cubic":
        return CubicPlanner(estimator=estimator, target=target, **kw)
    if name == "greedy":
        from sharding.greedy import GreedyPlanner

        return GreedyPlanner(estimator=estimator, target=target)
    if name == "torchrec":
        from sharding.torchrec_adapter import TorchRecPlanner  # imports torchrec: only when asked

        return TorchRecPlanner(estimator=estimator)
    return HeuristicPlanner(name, seed=seed, estimator=estimator, target=target)
