"""First start without a race: campaigns, workers and ``cubic run``s started at the same moment on a
new campaign storage and a new trial store (nothing exists yet) all succeed.

Every process imports cubic first, then sleeps until one shared instant and only then runs its
command, so that the first database opens (schema creation of the Optuna storage and of the trial
store, the lease table) really collide."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from experiments.reliability.common import worker_env
from experiments.reliability.readback import JOB, SPACE

AT = ("import sys, time; from cubic.cli.app import main; from cubic.codesign.worker import main as wmain; "
      "t = float(sys.argv[1]); time.sleep(max(0.0, t - time.time())); "
      "sys.exit((wmain if sys.argv[2] == 'worker' else main)(sys.argv[3:]))")


def _commands(wd: Path, storage: str, store: str, campaigns: int, workers: int, runs: int) -> list[list[str]]:
    job = f"{sys.executable} job.py {{x}}"
    out = []
    for i in range(campaigns):
        out.append(["cli", "campaign", "run", "--name", f"c{i}", "--objective", job, "--space", "space.yaml",
                    "--budget", "2", "--batch", "2", "--timeout", "60", "--storage", storage])
    for i in range(workers):
        out.append(["worker", "work", "--storage", storage, "--name", "shared", "--evaluate",
                    "cubic.testing:make_evaluate", "--store", store, "--space", str(wd / "stand_in.yaml"),
                    "--budget", "4", "--batch", "2", "--strategy", "random"])
    for i in range(runs):
        out.append(["cli", "run", "--workload", "dlrm-small", "--simulate", "h100x8", "--steps", str(10 + i),
                    "--store", store])
    return out


def _new_urls(d: Path, pg_base: str | None) -> tuple[str, str]:
    """(campaign storage, trial store) of one try: new SQLite files, or one new PostgreSQL database
    holding both (cubic's tables are ``cubic_*``, Optuna's its own)."""
    if pg_base:
        from experiments.reliability.concurrency import fresh_postgres_database

        url = fresh_postgres_database(pg_base)
        return url, url
    return f"sqlite:///{d}/.cubic/campaigns.db", f"sqlite:///{d}/.cubic/trials.db"


def first_start(workdir: str | Path, tries: int = 20, campaigns: int = 2, workers: int = 2, runs: int = 2,
                pg_base: str | None = None, lead_s: float = 8.0) -> dict[str, Any]:
    """The real commands: ``tries`` rounds, each on a new storage and store, ``campaigns`` x
    ``cubic campaign run`` + ``workers`` x ``python -m cubic.codesign.worker work`` (one new
    campaign) + ``runs`` x ``cubic run --simulate`` released at one instant. A failure is any
    process with a non-zero exit. ``pg_base``: a PostgreSQL server URL (a new database per try)."""
    import yaml

    from cubic.core.store import redact_url
    from cubic.testing import SPACE as STAND_IN

    wd = Path(workdir)
    failures, details, elapsed = 0, [], []
    for k in range(tries):
        d = wd / f"try{k}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "job.py").write_text(JOB)
        (d / "space.yaml").write_text(SPACE)
        (d / "stand_in.yaml").write_text(yaml.safe_dump(STAND_IN))
        st, tr = _new_urls(d, pg_base)
        cmds = _commands(d, st, tr, campaigns, workers, runs)
        t_go = time.time() + lead_s  # every child imported cubic by then (a loaded machine: raise it)
        procs = [subprocess.Popen([sys.executable, "-c", AT, repr(t_go), c[0], *c[1:]], cwd=d, env=worker_env(),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in cmds]
        for p, c in zip(procs, cmds):
            _, err = p.communicate(timeout=600)
            if p.returncode != 0:
                failures += 1
                details.append({"try": k, "command": " ".join(redact_url(x) if "://" in x else x for x in c[:4]),
                                "rc": p.returncode, "stderr": err[-400:]})
        elapsed.append(round(time.time() - t_go, 1))
    return {"backend": "postgresql" if pg_base else "sqlite", "tries": tries,
            "processes_per_try": campaigns + workers + runs, "campaigns": campaigns,
            "workers": workers, "cubic_runs": runs, "failures": failures, "details": details[:5],
            "seconds_after_release": elapsed}


OPEN = """import sys, time
kind, storage, store, t, i = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
from cubic.codesign.campaign import Campaign
from cubic.core.store import TrialStore
from cubic.testing import space
time.sleep(max(0.0, t - time.time()))
if kind == "store":
    TrialStore(store).create_campaign("c" + i, {}, "w")
else:
    Campaign(space(), lambda p: {}, name="c" + i, storage=storage, budget=2)
"""


def first_open(workdir: str | Path, tries: int = 20, processes: int = 6, pg_base: str | None = None,
               lead_s: float = 6.0) -> dict[str, Any]:
    """The first opens alone, cheaper than whole commands: per try, ``processes`` processes create
    a campaign on one new campaign storage at one instant, and as many create a campaign row in
    one new trial store (each the schema's first creation)."""
    wd = Path(workdir)
    failures, details = 0, []
    for k in range(tries):
        d = wd / f"open{k}"
        d.mkdir(parents=True, exist_ok=True)
        st, tr = _new_urls(d, pg_base)
        t_go = time.time() + lead_s
        procs = [(kind, subprocess.Popen([sys.executable, "-c", OPEN, kind, st, tr, repr(t_go), str(i)], cwd=d,
                                         env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
                 for kind in ("storage", "store") for i in range(processes)]
        for kind, p in procs:
            _, err = p.communicate(timeout=300)
            if p.returncode != 0:
                failures += 1
                details.append({"try": k, "kind": kind, "rc": p.returncode,
                                "error": (err.strip().splitlines() or [""])[-1][:300]})
    return {"backend": "postgresql" if pg_base else "sqlite", "tries": tries, "processes_per_try": 2 * processes,
            "failures": failures, "details": details[:5]}
