"""Several worker processes on one campaign and one trial store; the store's write throughput."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

from cubic.core.config import Config
from cubic.testing import DELAY_ENV, FastRunner, space, toy_workload
from experiments.reliability.common import ROOT, _env, _store_audit



def fresh_postgres_database(base_url: str) -> str:
    """A new empty database on the server of ``base_url`` (so each run starts from nothing)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    url = make_url(base_url)
    name = f"cubic_rel_{uuid.uuid4().hex[:10]}"
    eng = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with eng.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    eng.dispose()
    return url.set(database=name).render_as_string(hide_password=False)


def start_postgres() -> tuple[str | None, str]:
    """(URL, '') from scripts/start_postgres.sh, or (None, why PostgreSQL cannot be had)."""
    script = ROOT / "scripts" / "start_postgres.sh"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return None, "psycopg2 is not installed (pip install '.[postgres]')"
    try:
        out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"scripts/start_postgres.sh did not run: {e}"
    if out.returncode != 0 or not out.stdout.strip():
        return None, (out.stderr.strip().splitlines() or ["scripts/start_postgres.sh failed"])[-1]
    return out.stdout.strip().splitlines()[-1], ""


def concurrent_workers(storage: str, store: str, workers: int = 4, budget: int = 80, batch: int = 4,
                       strategy: str = "random", delay_s: float = 0.02, timeout_s: float = 900.0,
                       kill_one: bool = False, lease_s: float = 15.0) -> dict[str, Any]:
    """``workers`` worker processes (``python -m cubic.codesign.worker work``) on one campaign
    (Optuna storage ``storage``) and one trial store; one of them coordinates (holds the lease).
    ``kill_one``: SIGKILL the coordinating worker once a third of the budget is done, with a run
    in flight; another worker takes the lease over after ``lease_s`` and the lost run is retried."""
    import optuna

    from cubic.codesign.campaign import Campaign
    from cubic.codesign.storage import _LEASES

    sp = space()
    name = f"conc-{uuid.uuid4().hex[:8]}"
    Campaign(sp, lambda p: {}, name=name, strategy=strategy, budget=budget, batch_size=batch, seed=3,
             storage=storage)
    cmd = [sys.executable, "-m", "cubic.codesign.worker", "work", "--storage", storage, "--name", name,
           "--evaluate", "cubic.testing:make_evaluate", "--store", store]
    env = _env(**{DELAY_ENV: str(delay_s)})
    procs = [subprocess.Popen(cmd + ["--worker-id", f"w{i}", "--lease", str(lease_s)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(workers)]
    killed = None
    if kill_one:
        from sqlalchemy import create_engine, select

        eng = create_engine(storage)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and killed is None:
            with eng.connect() as conn:
                row = conn.execute(select(_LEASES.c.holder).where(_LEASES.c.campaign == name)).first()
            if row is not None:
                study = optuna.load_study(study_name=name, storage=storage)
                ts = study.get_trials(deepcopy=False)
                done = sum(t.state.is_finished() for t in ts)
                mine = [t for t in ts if t.state == optuna.trial.TrialState.RUNNING
                        and t.system_attrs.get("cubic_worker") == row[0]]
                if mine and done >= budget // 3:
                    i = int(row[0][1:])
                    procs[i].send_signal(signal.SIGKILL)
                    killed = row[0]
            time.sleep(0.01)
        eng.dispose()
    outs = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        outs.append((p.returncode, o.decode(errors="replace"), e.decode(errors="replace")))
    study = optuna.load_study(study_name=name, storage=storage)
    trials = [t for t in study.get_trials(deepcopy=False) if "finished_at" in t.user_attrs]  # runs, not lost attempts
    keys = [t.user_attrs["key"] for t in trials]
    # trials are written when their run finishes: the rate between the first and last finish
    finished = sorted(t.user_attrs["finished_at"] for t in trials)
    span = finished[-1] - finished[0] if len(finished) > 1 else 0.0
    locked = sum(("database is locked" in e) for _, _, e in outs)
    audit = _store_audit(store, sp, trials)
    return {
        "workers": workers, "budget": budget, "trials": len(trials),
        "lost_trials": max(0, budget - len(set(keys))), "duplicated_trials": len(keys) - len(set(keys)),
        "retried_after_loss": sum("failed_trial" in t.system_attrs for t in trials),
        "store": audit, "database_is_locked_failures": locked,
        "worker_exit_codes": [rc for rc, _, _ in outs], "killed_worker": killed,
        "coordinators": sum("coordinated" in o for _, o, _ in outs),
        "worker_reports": [o.strip().splitlines()[-1] if o.strip() else "" for _, o, _ in outs],
        "worker_errors": [e.strip()[-600:] for rc, _, e in outs if rc not in (0, -signal.SIGKILL)],
        "campaign_trials_per_s": round((len(trials) - 1) / span, 2) if span > 0 else None,
        "run_delay_s": delay_s,
    }


def _store_writer(url: str, n: int, barrier, out) -> None:
    from cubic.core.store import TrialStore

    wl = toy_workload()
    res = FastRunner(delay_s=0.0)
    with TrialStore(url) as st:
        barrier.wait()
        t0 = time.time()
        for i in range(n):
            cfg = Config(batch_size=64 + (os.getpid() % 1000) * 8 + i, seed=i % 7)
            st.record(wl, cfg, res.run(wl, cfg), steps=1, warmup=0)
        out.put((t0, time.time(), n))


def store_throughput(url: str, workers: int = 4, per_worker: int = 100) -> dict[str, Any]:
    """Trials/s that ``workers`` processes together record into one store (each record is one
    transaction with the full Result), from a common start."""
    import multiprocessing as mp

    from cubic.core.store import TrialStore

    with TrialStore(url) as st:
        before = st.count()
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_store_writer, args=(url, per_worker, barrier, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    spans = [out.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
    with TrialStore(url) as st:
        after = st.count()
    wall = max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
    total = sum(n for _, _, n in spans)
    return {"workers": workers, "trials": total, "stored": after - before, "wall_s": round(wall, 3),
            "trials_per_s": round(total / wall, 1), "exit_codes": [p.exitcode for p in procs]}
