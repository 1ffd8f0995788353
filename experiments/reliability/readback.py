"""Read-back attacks: files cubic reads back (the pending file, stored rows, lease rows) hold
garbage, and names a user typed try to become paths outside ``.cubic/``. Every attack goes through
the real ``cubic`` command in a child process; a command passes when it ends without a traceback,
imports no bad row, quarantines each bad pending line with one warning naming the file and line,
and still does its work (the good rows imported and listed)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from experiments.reliability.common import worker_env

CLI = [sys.executable, "-m", "cubic.cli.app"]


def _good_row(seed: int) -> dict[str, Any]:
    """A pending entry as the store writes it (a real row of the stand-in runner)."""
    from cubic.core.config import Config
    from cubic.core.store import TrialStore
    from cubic.testing import FastRunner, toy_workload

    wl, cfg = toy_workload(), Config(seed=seed)
    res = FastRunner(delay_s=0.0, log="").run(wl, cfg)
    row = TrialStore._row(None, wl.name, wl.content_hash(), cfg, res, None, 1, 1, 0, None)  # no self needed
    return json.loads(json.dumps(row, default=str))


def _mutate(entry: dict[str, Any], path: str, value: Any) -> str:
    e = json.loads(json.dumps(entry))
    *head, last = path.split(".")
    d = e
    for k in head:
        d = d[k]
    if value is _DROP:
        d.pop(last)
    else:
        d[last] = value
    return json.dumps(e)


_DROP = object()

# kind -> the bad line made from a good entry
PENDING_ATTACKS: dict[str, Callable[[dict[str, Any]], str]] = {
    "null": lambda e: "null",
    "a list": lambda e: "[1, 2, 3]",
    "a number": lambda e: "42",
    "torn JSON": lambda e: json.dumps(e)[: len(json.dumps(e)) // 2],
    "no row": lambda e: _mutate(e, "row", _DROP),
    "row null": lambda e: _mutate(e, "row", None),
    "no store": lambda e: _mutate(e, "store", _DROP),
    "bad created_at": lambda e: _mutate(e, "row.created_at", "yesterday-ish"),
    "naive created_at": lambda e: _mutate(e, "row.created_at", "2026-01-01T00:00:00"),
    "status weird": lambda e: _mutate(e, "row.status", "weird"),
    "metrics a string": lambda e: _mutate(e, "row.metrics", "fast"),
    "metric a string": lambda e: _mutate(e, "row.metrics", {"examples_per_s": "fast"}),
    "status weird and metrics a string": lambda e: _mutate(json.loads(_mutate(e, "row.status", "weird")),
                                                           "row.metrics", "fast"),
    "result not a Result": lambda e: _mutate(e, "row.result", {"status": "ok", "metrics": []}),
    "result disagrees with status": lambda e: _mutate(e, "row.status", "failed"),
    "config hash forged": lambda e: _mutate(e, "row.config_hash", "0" * 64),
    "config unknown key": lambda e: _mutate(e, "row.config.rm_rf", True),
    "attempt 0": lambda e: _mutate(e, "row.attempt", 0),
    "seed a string": lambda e: _mutate(e, "row.seed", "7"),
    "extra column": lambda e: _mutate(e, "row.id", 1),
    "campaign a list": lambda e: _mutate(e, "row.campaign", [1]),
    "workload too long": lambda e: _mutate(e, "row.workload", "w" * 10_000),
    "hash with a path": lambda e: _mutate(e, "row.workload_hash", "../../etc/passwd"),
}

# stored rows a foreign writer (or a bit flip) left in the trial store
STORED_ATTACKS: dict[str, dict[str, Any]] = {
    "status weird": {"status": "weird"},
    "metrics a string": {"metrics": '"fast"'},
    "metrics not JSON": {"metrics": "{fast"},
    "result not JSON": {"result": "<html>"},
    "result a list": {"result": "[]"},
    "source weird": {"source": "guessed"},
    "created_at garbage": {"created_at": "soon"},
}


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def pending_attacks(workdir: str | Path) -> dict[str, Any]:
    """All bad pending lines in one file between good ones; ``cubic trials list`` imports the good,
    quarantines each bad one with a warning, crashes on none; a second command sees a clean store."""
    from cubic.core.store import TrialStore, redact_url

    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{wd}/trials.db"
    pending = wd / ".cubic" / "pending.jsonl"
    pending.parent.mkdir(parents=True, exist_ok=True)
    entry = {"id": "x", "store": redact_url(url), "written_at": "2026-01-01T00:00:00+00:00", "row": _good_row(1)}
    lines = [json.dumps(entry)]
    kinds = list(PENDING_ATTACKS)
    for kind in kinds:
        lines.append(PENDING_ATTACKS[kind](entry))
    lines.append(json.dumps({**entry, "row": _good_row(2)}))
    pending.write_text("\n".join(lines) + "\n")
    env = worker_env(CUBIC_PENDING=str(pending))
    first = _run(["trials", "list", "--store", url], wd, env)
    second = _run(["trials", "list", "--store", url], wd, env)
    warnings = [ln for ln in first.stderr.splitlines() if "is not a pending result" in ln]
    named = sum(f"{pending} line {i + 2} " in first.stderr for i in range(len(kinds)))
    q = pending.with_name(pending.name + ".quarantine")
    quarantined = len(q.read_text().splitlines()) if q.exists() else 0
    with TrialStore(url) as st:
        stored = st.count()
        listed = len(st.trials())
    crashes = sum("Traceback" in p.stderr or p.returncode != 0 for p in (first, second))
    return {"kinds": kinds, "lines": len(kinds), "warnings": len(warnings), "warnings_naming_file_and_line": named,
            "quarantined": quarantined, "good_rows_imported": stored, "rows_imported_unchecked": stored - 2,
            "rows_listed": listed, "pending_left": pending.exists(), "crashes": crashes,
            "rc": [first.returncode, second.returncode], "second_run_warnings": second.stderr.count("warning"),
            "stderr_tail": (first.stderr + second.stderr)[-600:] if crashes else ""}


def stored_row_attacks(workdir: str | Path) -> dict[str, Any]:
    """Corrupt stored rows beside good ones: ``cubic trials list`` and ``export`` list the good rows,
    warn about each bad one, never crash."""
    from cubic.core.config import Config
    from cubic.core.store import TrialStore
    from cubic.testing import FastRunner, toy_workload

    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    db = wd / "trials.db"
    url = f"sqlite:///{db}"
    wl = toy_workload()
    with TrialStore(url) as st:
        for i in range(len(STORED_ATTACKS) + 2):
            st.record(wl, Config(seed=i), FastRunner(delay_s=0.0, log="").run(wl, Config(seed=i)))
    con = sqlite3.connect(db)
    for i, change in enumerate(STORED_ATTACKS.values(), start=2):
        sets = ", ".join(f"{k} = ?" for k in change)
        con.execute(f"UPDATE cubic_trials SET {sets} WHERE id = ?", [*change.values(), i])
    con.commit()
    con.close()
    env = worker_env()
    out = {"kinds": list(STORED_ATTACKS), "crashes": 0, "commands": {}}
    for argv in (["trials", "list", "--store", url], ["trials", "export", "--out", str(wd / "t.csv"), "--store", url]):
        p = _run(argv, wd, env)
        crashed = "Traceback" in p.stderr or p.returncode != 0
        out["crashes"] += crashed
        out["commands"][argv[1]] = {"rc": p.returncode, "skipped_warnings": p.stderr.count("is corrupt"),
                                    "stderr_tail": p.stderr[-400:] if crashed else ""}
    with TrialStore(url) as st:
        out["good_rows_listed"] = len(st.trials())
    out["good_rows"] = 2
    return out


JOB = """import json, sys
print(json.dumps({"score": float(sys.argv[1])}))
"""
SPACE = """version: 1
name: hostile
objectives: [{metric: score, direction: maximize}]
parameters: [{name: x, type: float, low: 0.0, high: 1.0}]
"""


HOSTILE_NAMES = ("../../../escaped", "/tmp/cubic-escaped-abs", "..", ".", "a/../../b", "~/x", "$(touch pwned)",
                 "name with spaces/and/slashes")


def hostile_names(workdir: str | Path, names: tuple[str, ...] = HOSTILE_NAMES) -> dict[str, Any]:
    """``cubic campaign run --name`` with names that try to be paths: every file the command writes
    stays inside the working directory's ``.cubic/`` (or the report folder it was given)."""
    wd = Path(workdir)
    out = {"names": list(names), "escaped": 0, "crashes": 0, "refused": 0, "ran": 0, "details": []}
    for i, name in enumerate(names):
        root = wd / f"n{i}"
        cwd = root / "a" / "b" / "c"
        cwd.mkdir(parents=True)
        (cwd / "job.py").write_text(JOB)
        (cwd / "space.yaml").write_text(SPACE)
        before = {p for p in Path("/tmp").iterdir() if "escaped" in p.name}
        t0 = time.time()
        p = _run(["campaign", "run", "--name", name, "--objective", f"{sys.executable} job.py {{x}}", "--space",
                  "space.yaml", "--budget", "1", "--batch", "1", "--timeout", "60", "--storage",
                  f"sqlite:///{cwd}/.cubic/c.db", "--report", "rep"], cwd, worker_env())
        written = [q for q in root.rglob("*") if q.is_file() and q.stat().st_mtime >= t0 - 1]
        outside = [str(q) for q in written if not (q.is_relative_to(cwd / ".cubic") or q.is_relative_to(cwd / "rep")
                                                   or q.parent == cwd)]
        outside += [str(q) for q in Path("/tmp").iterdir() if "escaped" in q.name and q not in before]
        crashed = "Traceback" in p.stderr
        out["escaped"] += bool(outside)
        out["crashes"] += crashed
        out["refused"] += p.returncode == 2
        out["ran"] += p.returncode == 0
        out["details"].append({"name": name, "rc": p.returncode, "outside": outside[:3],
                               "stderr_tail": p.stderr[-300:] if (crashed or p.returncode not in (0, 2)) else ""})
    return out
