"""How far cubic's planner beat the heuristics when last judged by what it does not optimise.

``experiments/sharding_benchmark.py`` (a full run) writes ``data/planner_check.json`` beside its results:
the share of task-family x interconnect cells where cubic's plans cost >= 10% less than the best of the
heuristics, where they beat TorchRec's planner, and the regimes where no task was > 3% worse, judged by
measured compute plus a network model the planner was not told of; and the same counts from the results
file's earlier looks, the newest per other machine (the edge is its compute model's, and held on one CPU
where it did not on another). ``cubic shard plan`` prints it under a cubic plan (:func:`check_line`),
this machine's look first, so the edge a user expects from the planner carries how far it held where
they plan.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cubic.core.looks import split_looks

CHECK_PATH = Path(__file__).parent / "data" / "planner_check.json"


def planner_check(path: Path = CHECK_PATH) -> dict[str, Any] | None:
    """The recorded check (None when no full benchmark run wrote one)."""
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def _counts(r: dict[str, Any]) -> str:
    own = r.get("own_model")
    return (f"its plans cost >= 10% less than the best heuristic in {r['bar_met']} of {r['cells']} task-family x "
            f"interconnect cells, less than TorchRec's planner in {r['below_torchrec']} of {r['cells']}, no task "
            f"> 3% worse than its best heuristic in {r['worst_task_met']} of {r['regimes']} interconnects"
            + (f" (with a compute model trained there: {own['bar_met']} of {r['cells']} cells)" if own else ""))


def check_line(c: dict[str, Any] | None, here: str | None = None) -> str:
    """One line for a cubic plan: how far the planner's edge over the heuristics held when last checked,
    first on this machine (``here``: its CPU model, read when not given) when a look was made on it, then
    on each other machine checked; a plan made where no look was says so."""
    if c is None:
        return "the planner's edge over the heuristics was never checked by a judge it does not optimise"
    here, ours, others = split_looks(c, here)
    line = ("the planner, judged by what it does not optimise (measured compute + an independent network model; "
            "experiments/sharding_benchmark.py): ")
    if ours is not None:
        line += f"on this machine ({here}, code {str(ours['code'])[:7]}): {_counts(ours)}"
    else:
        line += f"never checked on this machine ({here})"
    for r in others:
        line += (f"; on {r['machine']} (code {str(r['code'])[:7]}): " +
                 (_counts(r) if ours is None and r is c else
                  f"{r['bar_met']} of {r['cells']} cells at the 10% bar"
                  + (f" ({r['own_model']['bar_met']} with a compute model trained there)"
                     if r.get("own_model") else "")))
    return line + (": a plan's edge on your tables is not assured (plan them with a `--planner` heuristic too and "
                   "`cubic shard evaluate` both)")
