"""The quality (NE) cost of 2D sparse parallelism, from what ``experiments/two_d.py`` MEASURED.

``cost_models/data/two_d_quality.json`` (written by that experiment, with its provenance: run, date,
code version, "measured on CPU gloo, <processes and groups>, cubic's DistributedRunner, <workload>,
<steps>, 1D end NE", and whether it was a --quick run) lists, per embedding optimizer and
replica sync (``gradients`` every step, or ``weights`` averaged every ``interval`` steps), the
relative NE cost of 2D vs full (1D) sharding with its 95% interval across paired seeds (``seeds``:
how many; the experiment gives the resolved targets more seeds than the rest).

:func:`ne_cost` answers for any (optimizer, sync, interval): an interval that was run is
``measured``; one between two measured intervals is linearly interpolated and one outside them
extrapolated from the nearest two (``modelled``, and says from which). It never invents a figure
for an optimizer or sync mode the file lacks: then it returns None. What a 2D recommendation or
the scaling study assumes for quality is this answer, with its ``source`` string.

The figures were measured on a small synthetic workload on CPU; carrying them to another workload
or scale is itself an assumption, stated in every ``source``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from cubic.core.spec import SpecError, read_structured

DATA = Path(__file__).resolve().parent / "data" / "two_d_quality.json"
SYNCS = ("gradients", "weights")


@dataclass(frozen=True)
class NECost:
    """The NE cost a 2D config is assumed to have, and where that figure comes from."""

    ne_cost_rel: float
    ci95: tuple[float, float]
    kind: str  # "measured" (this interval was run) or "modelled" (interpolated/extrapolated from measured ones)
    source: str  # file, run and how the figure was obtained

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"ci95": list(self.ci95)}


def load(path: str | Path | None = None) -> dict[str, Any]:
    """The quality table; SpecError naming the file and field when it is malformed."""
    file = Path(path) if path else DATA
    try:
        stamp = file.stat().st_mtime_ns  # a rewritten table is read again
    except OSError:
        stamp = None
    return _load(str(file), stamp)


@lru_cache(maxsize=8)
def _load(path: str, stamp: int | None) -> dict[str, Any]:
    doc = read_structured(path)  # the one bounded reader: a bad file is a SpecError naming it
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise SpecError("expected an object with a list 'entries'", source=path, field="entries")
    if not isinstance(doc.get("provenance"), dict):
        raise SpecError("expected an object 'provenance' (run, date, code_version, measured_on)", source=path,
                        field="provenance")
    for i, e in enumerate(doc["entries"]):
        ok = (isinstance(e, dict) and isinstance(e.get("optimizer"), str) and e.get("sync") in SYNCS
              and isinstance(e.get("interval"), int) and e["interval"] >= 1
              and isinstance(e.get("ne_cost_rel"), (int, float))
              and isinstance(e.get("ci95"), list) and len(e["ci95"]) == 2)
        if not ok:
            raise SpecError("each entry needs optimizer, sync (gradients|weights), interval >= 1, ne_cost_rel, ci95 "
                            "[lo, hi]", source=path, field=f"entries[{i}]")
    return doc


def ne_cost(optimizer: str, sync: str, interval: int = 1, path: str | Path | None = None) -> NECost | None:
    """The NE cost of 2D with ``optimizer`` and replica ``sync`` every ``interval`` steps (see the module
    docstring), or None when the table has nothing for that optimizer and sync mode."""
    file = Path(path) if path else DATA
    doc = load(file)
    prov = doc["provenance"]
    added = "".join(f"; seeds {e['seeds'][0]}..{e['seeds'][1]} added {e['started_at']}, code {e['code_version']}"
                    for e in prov.get("extended", []))
    where = (f"{file.name} ({prov.get('run', '?')}, {prov.get('date', '?')}, code {prov.get('code_version', '?')}"
             f"{added}; {prov.get('measured_on', '?')}{', QUICK run' if prov.get('quick') else ''})")
    rows = sorted((e for e in doc["entries"] if e["optimizer"] == optimizer and e["sync"] == sync),
                  key=lambda e: e["interval"])
    if not rows:
        return None
    if sync == "gradients":  # every step by definition
        interval = 1
    exact = [e for e in rows if e["interval"] == interval]
    if exact:
        e = exact[0]
        seeds = f", {e['seeds']} paired seeds" if e.get("seeds") else ""
        return NECost(float(e["ne_cost_rel"]), (float(e["ci95"][0]), float(e["ci95"][1])), "measured",
                      f"measured: {where}, {optimizer}, sync {sync} every {interval} steps{seeds}")
    if len(rows) == 1:
        e = rows[0]
        return NECost(float(e["ne_cost_rel"]), (float(e["ci95"][0]), float(e["ci95"][1])), "modelled",
                      f"modelled: the only measured interval ({e['interval']}) of {where} taken for {interval}")
    below = [e for e in rows if e["interval"] < interval]
    above = [e for e in rows if e["interval"] > interval]
    a, b = (below[-1], above[0]) if below and above else ((rows[0], rows[1]) if not below else (rows[-2], rows[-1]))
    f = (interval - a["interval"]) / (b["interval"] - a["interval"])
    lerp = [float(x) + f * (float(y) - float(x)) for x, y in
            ((a["ne_cost_rel"], b["ne_cost_rel"]), (a["ci95"][0], b["ci95"][0]), (a["ci95"][1], b["ci95"][1]))]
    how = "interpolated" if below and above else "extrapolated"
    return NECost(lerp[0], (min(lerp[1:]), max(lerp[1:])), "modelled",
                  f"modelled: linearly {how} in the sync interval from the measured intervals {a['interval']} and "
                  f"{b['interval']} of {where}, {optimizer}, sync {sync}")
