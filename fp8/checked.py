"""How close a recommended placement's NE stayed to full precision when last trained with it.

The Probe's NE cost is measured forward only, on the model it trained; what a user acts on is a job
trained with FP8. ``experiments/fp8_benchmark.py`` (a full run, ``--production-only`` or ``--retarget``)
writes ``data/quality_check.json`` beside its results: for each workload it trained, the recommended
placement against full precision over paired seeds (mean relative NE difference, its 95% interval,
the verdict at +-0.1%), and from the results file's earlier looks the newest per other machine (how
many of those checks held there). ``cubic fp8 probe`` prints it under a placement (:func:`check_line`),
this machine's look first, so the quality a user expects carries how far it held when trained.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cubic.core.looks import split_looks

CHECK_PATH = Path(__file__).parent / "data" / "quality_check.json"
NE_BAR = 0.001  # the benchmark's +-0.1% (relative NE difference)


def quality_check(path: Path = CHECK_PATH) -> dict[str, Any] | None:
    """The recorded check (None when no full benchmark run wrote one)."""
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def verdict(c: dict[str, Any]) -> str:
    """What one paired-seed check says, in words."""
    if c.get("not_judged"):
        return (f"not judged (full precision ends at NE {c['full_precision_end_ne']:.3f}: the model has not "
                f"learned, so the difference is not FP8's cost)")
    lo, hi = c["ci95"]
    if -NE_BAR <= lo and hi <= NE_BAR:
        return "within +-0.1%"
    if lo > NE_BAR:
        return "costs more than 0.1%"
    if hi < -NE_BAR:
        return "better than full precision by more than 0.1%"
    return "not resolved (the interval reaches past +-0.1%)"


def _one(c: dict[str, Any]) -> str:
    what = f"{c['workload']}'s {c['placement']} ({c['sites']} site{'s' if c['sites'] != 1 else ''} in FP8)"
    if not c["sites"]:
        return f"{what}: full precision, nothing to check"
    if c.get("not_judged"):
        return f"{what}: {verdict(c)}"
    lo, hi = c["ci95"]
    return f"{what} {_pct(c['mean'])}% NE [{_pct(lo)}, {_pct(hi)}] over {c['seeds']} seeds: {verdict(c)}"


def _pct(x: float) -> str:
    """A relative difference in percent, with a digit more where three would round it onto the bar."""
    on_bar = abs(x) != NE_BAR and f"{100 * abs(x):.3f}" == f"{100 * NE_BAR:.3f}"
    return f"{100 * x:+.4f}" if on_bar else f"{100 * x:+.3f}"


def check_line(c: dict[str, Any] | None, here: str | None = None) -> str:
    """One line for a placement: the NE cost of recommended placements trained with FP8 when last checked,
    first on this machine (``here``: its CPU model, read when not given) when a look was made on it, then
    how many checks held on each other machine; a placement made where no look was says so."""
    if c is None:
        return "a recommended placement's NE cost was never checked by training with it"
    here, ours, others = split_looks(c, here)

    def look(r: dict[str, Any], full: bool) -> str:  # an earlier look keeps its verdicts, not its intervals
        return "; ".join(map(_one, r["checks"])) if full and r.get("checks") else \
            f"{r['within']} of {r['checked']} within +-0.1%"

    line = "trained with FP8 against full precision (paired seeds; experiments/fp8_benchmark.py): "
    if ours is not None:
        line += f"on this machine ({here}, code {str(ours['code'])[:7]}): {look(ours, True)}"
    else:
        line += f"never checked on this machine ({here})"
    for r in others:
        line += f"; on {r['machine']} (code {str(r['code'])[:7]}): {look(r, ours is None and r is c)}"
    return line + (". The table's held-out NE cost is the Probe's, forward only on its own model; measure yours "
                   "trained: `cubic fp8 check --workload W --placement FILE --seeds N`")
