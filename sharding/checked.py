"""How far cubic's planner beat the heuristics when last judged by what it does not optimise.

``experiments/sharding_benchmark.py`` (a full run) writes ``data/planner_check.json`` beside its results:
the share of task-family x interconnect cells where cubic's plans cost >= 10% less than the best of the
heuristics, where they beat TorchRec's planner, and the regimes where no task was > 3% worse, judged by
measured compute plus a network model the planner was not told of. ``cubic shard plan`` prints it under
a cubic plan (:func:`check_line`), so the edge a user expects from the planner carries how far it held.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHECK_PATH = Path(__file__).parent / "data" / "planner_check.json"


def planner_check(path: Path = CHECK_PATH) -> dict[str, Any] | None:
    """The recorded check (None when no full benchmark run wrote one)."""
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def check_line(c: dict[str, Any] | None) -> str:
    """One line for a cubic plan: how far the planner's edge over the heuristics held when last checked."""
    if c is None:
        return "the planner's edge over the heuristics was never checked by a judge it does not optimise"
    own = c.get("own_model")
    line = (f"the planner, judged by what it does not optimise (measured compute + an independent network model; "
            f"experiments/sharding_benchmark.py on {c['machine']}, code {c['code'][:7]}): its plans cost >= 10% "
            f"less than the best heuristic in {c['bar_met']} of {c['cells']} task-family x interconnect cells, less "
            f"than TorchRec's planner in {c['below_torchrec']} of {c['cells']}, no task > 3% worse than its best "
            f"heuristic in {c['worst_task_met']} of {c['regimes']} interconnects")
    if own:
        line += f" (with a compute model trained there: {own['bar_met']} of {c['cells']} cells)"
    return line + (": a plan's edge on your tables is not assured (plan them with a `--planner` heuristic too and "
                   "`cubic shard evaluate` both)")
