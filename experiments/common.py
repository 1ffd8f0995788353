"""Shared by every benchmark: where results go and what each result file records about its run."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from cubic.core.fingerprint import code_version, fingerprint, fingerprint_hash, versions
from cubic.core.stats import mean_interval, rate_interval, samples_to_resolve, trials_to_resolve

REPO = Path(__file__).resolve().parent.parent
# A quality comparison means something only on a model that learns: a baseline whose end NE is at or
# below this bar has removed >= 7% of the base rate's entropy, 70x the +-0.1% NE effects resolved
LEARNS_NE_BAR = 0.93
RESULTS = REPO / "results"


def run_context(kind: str) -> dict[str, Any]:
    """``kind`` is 'measured', 'simulated' or 'mixed'; load average shows whether the machine was busy."""
    fp = fingerprint("cpu")
    return {
        "kind": kind,
        "fingerprint": fp,
        "fingerprint_hash": fingerprint_hash(fp),
        "versions": versions(),
        "code_version": code_version(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_1m_at_start": os.getloadavg()[0],
    }


def retarget_stamp() -> dict[str, Any]:
    """Which code recomputed a result's targets from its stored figures, and when (``--retarget``): the
    run's own context stays as it was, and a reader can tell a retarget from the run."""
    ctx = run_context("mixed")
    return {"code_version": ctx["code_version"], "at": ctx["started_at"]}


def calibration_origin(path: str | Path | None = None, processes: int | None = None) -> dict[str, Any]:
    """Whose machine a gloo calibration was measured on (cost_models.comm's origin; default: the
    user's, else the packaged one) and, for a job of ``processes``, which of its fits prices it, as a
    result file says it: a file inside the repository by its path there (not the checkout's), and
    ``where`` in words, the other machine named once."""
    from cost_models.comm import CommModel

    o = dict(CommModel.calibrated(path, processes=processes).origin)
    try:
        o["file"] = str(Path(o["file"]).resolve().relative_to(REPO))
    except ValueError:  # a user's own calibration, outside the repository: its full path
        pass
    o["where"] = f"measured on this machine ({o['machine']})" if o["this_machine"] else o["foreign_reason"]
    return o


def target_defects(targets: Any) -> list[str]:
    """What breaks the benchmark convention in a ``targets`` object: each entry has ``measured``,
    ``target`` and a JSON-boolean ``met``, and a missed one says why under ``reason`` (one key, so a
    reader finds it; numpy's bool would be written as the string "False")."""
    if not isinstance(targets, dict) or not targets:
        return ["targets: missing or empty"]
    out = []
    for k, t in targets.items():
        if not isinstance(t, dict) or not set(t) >= {"measured", "target", "met"}:
            out.append(f"{k}: needs measured, target and met")
        elif not isinstance(t["met"], bool):
            out.append(f"{k}: met is {type(t['met']).__name__}, not a boolean")
        elif not t["met"] and not t.get("reason"):
            out.append(f"{k}: missed without a reason")
    return out


def stored_result(name: str, empty: dict[str, Any] | None = None) -> dict[str, Any]:
    """results/<name>.json as last written (a part run on its own merges into it), or a copy of
    ``empty`` when there is none yet."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else json.loads(json.dumps(empty or {}))


def write_result(name: str, payload: dict[str, Any], run: dict[str, Any] | None = None) -> Path:
    """Writes results/<name>.json; a targets object that breaks the convention is refused before
    anything is written (a benchmark's --quick test then fails instead of a full run's JSON lying).
    Paths inside this checkout are written relative to it. ``run``: the context of a part measured
    again and merged into the stored file (a section's own invocation), when it is not the file's run."""
    bad = target_defects(payload.get("targets"))
    if bad:
        raise ValueError(f"results/{name}.json: targets break the benchmark convention: " + "; ".join(bad))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload.setdefault("finished_at", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    payload.setdefault("loadavg_1m_at_end", os.getloadavg()[0])
    _keep_earlier_looks(payload, path, run)
    return _write(path, payload)


def _write(path: Path, payload: dict[str, Any]) -> Path:
    text = json.dumps(payload, indent=2, sort_keys=False, default=str)
    # a file of this checkout by its path in the repository: a result names no one's worktree
    path.write_text(text.replace(str(REPO) + "/", "") + "\n")
    return path


# how many earlier runs a results file keeps the verdicts of (the oldest dropped first)
EARLIER_LOOKS_KEPT = 8


def run_of(doc: dict[str, Any]) -> dict[str, Any]:
    """Which run a results file is from: its context, at the top or under ``context``; the machine is
    the CPU's model (and the device a GPU file names)."""
    ctx = doc.get("context") if isinstance(doc.get("context"), dict) else {}
    fp = doc.get("fingerprint", ctx.get("fingerprint"))
    run = {k: doc.get(k, ctx.get(k)) for k in ("started_at", "finished_at", "code_version", "fingerprint_hash")}
    run["machine"] = fp.get("cpu_model") if isinstance(fp, dict) else None
    if isinstance(doc.get("device"), str):
        run["device"] = doc["device"]
    return run


def look_of(doc: dict[str, Any]) -> dict[str, Any]:
    """An earlier run as a later file keeps it: the run, and each target's figure and verdict."""
    targets = doc.get("targets") if isinstance(doc.get("targets"), dict) else {}
    return {**run_of(doc), "targets": {k: {f: t.get(f) for f in ("measured", "target", "met") if f in t}
                                       for k, t in targets.items() if isinstance(t, dict)}}


def against_look(targets: dict[str, Any], look: dict[str, Any]) -> dict[str, Any]:
    """The targets of a run set against an earlier run's (same name): which kept their verdict and
    which moved, so a reader sees whether a verdict survived a second look (another machine, other code)."""
    before = look.get("targets") or {}
    common_ = [k for k in targets if k in before and isinstance(targets[k], dict)]
    moved = {k: f"{'met' if before[k].get('met') else 'missed'} -> {'met' if targets[k].get('met') else 'missed'}"
             for k in common_ if bool(before[k].get("met")) != bool(targets[k].get("met"))}
    return {"look": {k: look.get(k) for k in ("started_at", "code_version", "machine", "device") if look.get(k)},
            "same_verdict": len(common_) - len(moved), "verdict_moved": moved,
            "only_now": len([k for k in targets if k not in before]),
            "only_then": len([k for k in before if k not in targets])}


def newest_look_per_machine(looks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The newest of ``looks`` (oldest first) on each machine they name, in the order last looked on."""
    newest: dict[str, dict[str, Any]] = {}
    for lk in looks:
        if lk.get("machine"):
            newest.pop(lk["machine"], None)
            newest[lk["machine"]] = lk
    return newest


def with_other_machines(this: dict[str, Any], payload: dict[str, Any],
                        counts: Callable[[dict[str, Any], str], dict[str, Any]]) -> dict[str, Any]:
    """A packaged check's record of the run in ``payload`` (``this``, which names its ``machine``) with the
    same counts from the file's earlier looks, the newest per other machine, the last looked on first
    (``other_machines``): a plan or placement made on either machine quotes the check made there.
    ``counts(look, machine)`` makes a look's entry."""
    newest = newest_look_per_machine([lk for lk in payload.get("earlier_looks") or [] if lk.get("targets")])
    return {**this, "other_machines": [counts(lk, m) for m, lk in reversed(newest.items()) if m != this["machine"]]}


def across_machines(targets: dict[str, Any], run: dict[str, Any],
                    looks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Each target's newest verdict on every machine the file has looked on (``run``'s own last), and
    the targets whose verdict is not the same on all of them, so a reader sees which claims held on one
    machine only (None where the file has looked on one machine)."""
    newest = newest_look_per_machine([*looks, {**run, "targets": targets}])
    if len(newest) < 2:
        return None
    verdicts = {m: {k: bool(t.get("met")) for k, t in (lk.get("targets") or {}).items() if isinstance(t, dict)}
                for m, lk in newest.items()}
    names = [k for k in targets if all(k in v for v in verdicts.values())]
    differ = {k: {m: "met" if v[k] else "missed" for m, v in verdicts.items()} for k in names
              if len({v[k] for v in verdicts.values()}) > 1}
    return {"machines": {m: {f: lk.get(f) for f in ("code_version", "started_at")} for m, lk in newest.items()},
            "compared": len(names), "same_on_every_machine": len(names) - len(differ), "differ": differ}


def _last_run(doc: dict[str, Any]) -> dict[str, Any]:
    """The run whose figures a file last received: a merged part's (``last_run``); in a file written
    before parts said so, the newest of its own context and its parts' (a section's ``context`` or
    ``measured`` block: two_d's speed measured again on another machine than its quality runs)."""
    if isinstance(doc.get("last_run"), dict):
        return doc["last_run"]
    parts = [{**run_of(c), "part": True} for v in doc.values() if isinstance(v, dict)
             for c in (v.get("context"), v.get("measured"))
             if isinstance(c, dict) and isinstance(c.get("started_at"), str)]
    return max([run_of(doc), *parts], key=lambda r: r.get("started_at") or "")


def _keep_earlier_looks(payload: dict[str, Any], path: Path, run: dict[str, Any] | None) -> None:
    """A run that replaces another run's figures (the whole file, or a part of it measured again) keeps
    the file as it stood, its verdicts with the run they came from (``earlier_looks``, newest last), and
    says which of its own moved against it (``against_last_look``) and which differ from the newest look
    on each other machine (``across_machines``); a re-write that measured nothing (``--retarget``,
    ``--reanalyse``, a part's later rows, :func:`relook`) carries the looks unchanged."""
    if run is not None:
        payload["last_run"] = {**run_of(run), "part": True}
    try:
        old = json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError):  # an unreadable file is replaced, as before: nothing to keep
        old = None
    if not isinstance(old, dict):
        return
    this_run = _last_run(payload)
    now, then = this_run["started_at"], _last_run(old)["started_at"]
    looks = list(old.get("earlier_looks") or [])
    if now and then and now != then:  # another run: the file as it stood becomes the newest earlier look
        looks = (looks + [{**look_of(old), **_last_run(old)}])[-EARLIER_LOOKS_KEPT:]
    elif payload.get("earlier_looks"):  # the same run re-written from its stored file
        looks = list(payload["earlier_looks"])
    if looks:
        payload["earlier_looks"] = looks
        payload["against_last_look"] = vs = against_look(payload.get("targets") or {}, looks[-1])
        across = across_machines(payload.get("targets") or {}, this_run, looks)
        payload.pop("across_machines", None)  # a stored one is re-derived, never carried
        if across is not None:
            payload["across_machines"] = across
        if now != then:  # the run that wrote it hears it at once, not from a diff
            lk = vs["look"]
            moved = "; ".join(f"{k}: {v}" for k, v in vs["verdict_moved"].items()) or "none"
            other = "".join(f"; {vs[k]} {what}" for k, what in (("only_now", "new (not in that look)"),
                                                                   ("only_then", "gone (only in that look)")) if vs[k])
            print(f"{path.name}: against the last look ({lk.get('machine')}, code {lk.get('code_version')}, "
                  f"{lk.get('started_at')}): {vs['same_verdict']} targets kept their verdict; moved: {moved}{other}")
            if across is not None:
                print(f"{path.name}: on {len(across['machines'])} machines ({', '.join(across['machines'])}), the "
                      "newest look on each: " + (f"{across['same_on_every_machine']} of {across['compared']} "
                                                 f"targets the same verdict on all; {len(across['differ'])} differ"
                                                 if across["compared"] else "no target of this run in all of "
                                                 "them by its name"))


def png_path(name: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    return RESULTS / f"{name}.png"


def paired(diffs: list[float], target: float) -> dict[str, Any]:
    """Mean of paired differences (e.g. relative NE, same seed) with its 95% Student-t interval
    (cubic.core.stats.mean_interval, the one interval formula), and how it sits against +-target."""
    n = len(diffs)
    mean, lo, hi = mean_interval(diffs)
    sd = statistics.stdev(diffs) if n > 1 else math.nan
    return {"seeds": n, "mean": mean, "sd": sd, "ci95": [lo, hi], "half_width": (hi - lo) / 2, "per_seed": diffs,
            "ci_includes_zero": lo <= 0.0 <= hi, "ci_inside_target": -target <= lo and hi <= target,
            # paired seeds a CI of half-width `target` would take if the spread stayed at this estimate
            "seeds_to_resolve": samples_to_resolve(sd, target) if n > 1 and math.isfinite(sd) else None}


def rate_target(hits: int, n: int, bound: float, above: bool, what: str, why: str) -> dict[str, Any]:
    """A target on a rate seen ``hits`` times in ``n`` (``what`` names what ``n`` counts): met on the point
    estimate, with its second look (:func:`rate_resolution`); ``why`` is its reason when missed."""
    v, lo, hi = rate_interval(hits, n)
    met = bool(v >= bound if above else v <= bound)
    return {"measured": v, "target": bound, "met": met, **rate_resolution(v, (lo, hi), n, bound, above, what),
            **({} if met else {"reason": why})}


def rate_resolution(rate: float, ci95: tuple[float, float] | list[float], n: int, bound: float, above: bool,
                    what: str) -> dict[str, Any]:
    """A rate target's second look: its exact 95% interval (cubic.core.stats.rate_interval), whether the
    interval lies on the target's side (a "met" on the point estimate alone is not a resolved one), and how
    many ``what`` (campaigns, claims) would resolve it at the rate seen."""
    lo, hi = ci95
    if not math.isfinite(lo):
        return {"ci95": None, "resolved": False}
    resolved = lo > bound if above else hi < bound
    out = {"ci95": [lo, hi], "resolved": bool(resolved), "over": n}
    if not resolved:
        need = trials_to_resolve(rate, bound, above)
        out["to_resolve"] = (f"{need} {what} at the rate seen" if need
                             else "not at the rate seen (it is on the target's wrong side or on it)")
    return out


def ci_text(st: dict[str, Any]) -> str:
    """A :func:`paired` result's interval in words, e.g. ``95% CI [+0.043%, +0.230%] over 22 paired seeds``."""
    lo, hi = st["ci95"]
    return f"95% CI [{100 * lo:+.3f}%, {100 * hi:+.3f}%] over {st['seeds']} paired seeds"


def relook(names: list[str]) -> list[Path]:
    """Re-writes stored results files, measuring nothing: the fields derived from a file's targets and its
    earlier looks (``against_last_look``, ``across_machines``) recomputed by this code, every figure,
    verdict, look and stamp as stored. A name with no file is refused before any file is written."""
    paths = [RESULTS / f"{name}.json" for name in names]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"no results file results/{missing[0].name}")
    out = []
    for path in paths:
        payload = json.loads(path.read_text())
        _keep_earlier_looks(payload, path, None)  # the same run: its looks as stored, the derived fields anew
        out.append(_write(path, payload))
    return out


if __name__ == "__main__":  # python -m experiments.common relook [NAME ...]  (default: every results file)
    import sys

    if sys.argv[1:2] != ["relook"]:
        print("usage: python -m experiments.common relook [NAME ...]", file=sys.stderr)
        sys.exit(2)
    try:
        written = relook(sys.argv[2:] or sorted(f.stem for f in RESULTS.glob("*.json")))
    except FileNotFoundError as e:
        print(f"experiments.common relook: {e}", file=sys.stderr)
        sys.exit(2)
    for p in written:
        print(f"re-derived results/{p.name}")
