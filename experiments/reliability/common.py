"""Shared helpers of the reliability attacks: paths, environments, audits."""

from __future__ import annotations

import os
import sqlite3
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

def sqlite_integrity(url_or_path: str) -> str:
    path = url_or_path.split("sqlite:///", 1)[-1]
    con = sqlite3.connect(path)
    try:
        return ";".join(r[0] for r in con.execute("PRAGMA integrity_check").fetchall())
    finally:
        con.close()


def worker_env(**extra: str) -> dict[str, str]:
    """The environment for a worker process: this one's, the repository on PYTHONPATH, ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def count_lines(path: Path) -> int:
    """Lines in ``path`` (0 when it does not exist yet)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def comparable(study) -> dict[str, Any]:
    """A campaign's outcome without wall-clock figures: point key -> (state, metrics, round)."""
    out = {}
    for t in study.get_trials(deepcopy=False):
        if "finished_at" not in t.user_attrs:
            continue  # a lost worker's attempt (retried), or a trial still waiting: not a run
        m = {k: round(v, 9) for k, v in (t.user_attrs.get("metrics") or {}).items() if k != "wall_time_s"}
        out[t.user_attrs["key"]] = (t.state.name, m, t.user_attrs.get("failure_kind"), t.user_attrs.get("round"))
    return out


def store_audit(store_url: str, space_, runs) -> dict[str, Any]:
    """Every run of the campaign (a study, or its list of run trials) in the trial store exactly
    once, and nothing else."""
    from cubic.core.store import TrialStore

    with TrialStore(store_url) as st:
        hashes = Counter(t.config_hash for t in st.trials())
    if hasattr(runs, "get_trials"):
        runs = [t for t in runs.get_trials(deepcopy=False) if "finished_at" in t.user_attrs]
    want = {space_.to_config(dict(t.params)).content_hash() for t in runs}
    return {"store_trials": sum(hashes.values()),
            "lost": len(want - set(hashes)),
            "duplicates": sum(n - 1 for n in hashes.values() if n > 1),
            "orphans": len(set(hashes) - want)}
