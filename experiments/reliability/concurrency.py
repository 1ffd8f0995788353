"""Several worker processes on one campaign and one trial store; the store's write throughput."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from cubic.core.config import Config
from cubic.testing import DELAY_ENV, FastRunner, space, toy_workload
from experiments.reliability.common import ROOT, worker_env, store_audit



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


def start_postgres(pg_dir: str | Path | None = None, port: int | None = None) -> tuple[str | None, str]:
    """(URL, '') from scripts/start_postgres.sh, or (None, why PostgreSQL cannot be had). ``pg_dir``
    and ``port``: a server of its own (one a test may restart), not the shared one."""
    script = ROOT / "scripts" / "start_postgres.sh"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return None, "psycopg2 is not installed (pip install '.[postgres]')"
    try:
        env = {**os.environ, **({"CUBIC_PG_DIR": str(pg_dir)} if pg_dir else {}),
               **({"CUBIC_PG_PORT": str(port)} if port else {})}
        out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=600, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"scripts/start_postgres.sh did not run: {e}"
    if out.returncode != 0 or not out.stdout.strip():
        return None, (out.stderr.strip().splitlines() or ["scripts/start_postgres.sh failed"])[-1]
    return out.stdout.strip().splitlines()[-1], ""


def concurrent_workers(storage: str, store: str, workers: int = 4, budget: int = 80, batch: int = 4,
                       strategy: str = "random", delay_s: float = 0.02, timeout_s: float = 900.0,
                       kill_one: bool = False, lease_s: float = 15.0, fault: str | None = None,
                       restart_db: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """``workers`` worker processes (``python -m cubic.codesign.worker work``) on one campaign
    (Optuna storage ``storage``) and one trial store; one of them coordinates (holds the lease).
    A fault once a third of the budget is done, with a run in flight:
    ``kill`` (or ``kill_one``): SIGKILL the coordinating worker; another takes the lease over after
    ``lease_s`` and the lost run is retried.
    ``stall``: SIGSTOP a worker that is not coordinating -- what a remote host that stops
    heartbeating looks like -- and SIGCONT it once its trial was taken back (after the heartbeat's
    grace period) and finished by another worker: re-run once, told once.
    ``db_restart``: ``restart_db()`` (the database server stopped and started again); the workers
    wait for it and re-attach."""
    fault = fault or ("kill" if kill_one else None)
    import optuna

    from cubic.codesign.campaign import Campaign
    from cubic.codesign.storage import _LEASES

    sp = space()
    name = f"conc-{uuid.uuid4().hex[:8]}"
    Campaign(sp, lambda p: {}, name=name, strategy=strategy, budget=budget, batch_size=batch, seed=3,
             storage=storage)
    cmd = [sys.executable, "-m", "cubic.codesign.worker", "work", "--storage", storage, "--name", name,
           "--evaluate", "cubic.testing:make_evaluate", "--store", store]
    env = worker_env(**{DELAY_ENV: str(delay_s)})
    procs = [subprocess.Popen(cmd + ["--worker-id", f"w{i}", "--lease", str(lease_s)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(workers)]
    killed, fault_report = None, {}
    if fault:
        from sqlalchemy import create_engine, select

        eng = create_engine(storage)
        deadline = time.monotonic() + timeout_s
        # until the fault is made, or the workers are all gone (a campaign that ended before the
        # fault could land: reported as no fault, not a wait until the deadline)
        while time.monotonic() < deadline and not fault_report and any(p.poll() is None for p in procs):
            with eng.connect() as conn:
                row = conn.execute(select(_LEASES.c.holder).where(_LEASES.c.campaign == name)).first()
            if row is not None:
                study = optuna.load_study(study_name=name, storage=storage)
                ts = study.get_trials(deepcopy=False)
                done = sum(t.state.is_finished() for t in ts)
                running = [t for t in ts if t.state == optuna.trial.TrialState.RUNNING]
                if done >= budget // 3:
                    if fault == "kill" and any(t.system_attrs.get("cubic_worker") == row[0] for t in running):
                        procs[int(row[0][1:])].send_signal(signal.SIGKILL)
                        killed, fault_report = row[0], {"fault": "kill", "worker": row[0]}
                    elif fault == "stall":
                        other = [t for t in running if t.system_attrs.get("cubic_worker") not in (None, row[0])]
                        if other:
                            fault_report = _stall(procs, other[0], study, deadline)
                    elif fault == "db_restart" and running:
                        eng.dispose()
                        fault_report = {"fault": "db_restart", "done_before": done, **restart_db()}
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
    audit = store_audit(store, sp, trials)
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
        "run_delay_s": delay_s, "fault": fault_report,
        "reattached_workers": sum("re-attached" in e for _, _, e in outs),
        "lost_runs_not_told": sum(e.count("this run is not told") for _, _, e in outs),
        # stopped between taking a trial and starting its run: nothing ran there (CampaignListener.lost_take)
        "lost_takes": sum(e.count("taken back before its run began") for _, _, e in outs),
    }


def fault_outcome_problems(r: dict[str, Any]) -> list[str]:
    """What a ``concurrent_workers`` run got wrong under its fault (empty: it held). One rule for the slow
    tests and the reliability judge, so that neither passes what the other fails."""
    f, store = r.get("fault") or {}, r.get("store") or {}
    checks = [("every trial of the budget ran", r.get("trials") == r.get("budget")),
              ("no trial lost", r.get("lost_trials") == 0), ("no trial duplicated", r.get("duplicated_trials") == 0),
              ("every worker exited 0", set(r.get("worker_exit_codes") or [1]) == {0}),
              ("nothing lost from the trial store", store.get("lost") == 0 and store.get("orphans") == 0)]
    if f.get("fault") == "db_restart":
        checks += [("the server was stopped and started", bool(f.get("stopped") and f.get("started"))),
                   ("a worker re-attached", r.get("reattached_workers", 0) >= 1)]
    elif f.get("fault") == "stall":
        # the stalled worker reports its attempt lost: a run it finished and does not tell, (stopped between
        # taking the trial and starting) a take it leaves to another worker, or (stopped inside a transaction
        # the server then ended) it re-attaches and goes on
        told = r.get("lost_runs_not_told", 0) + r.get("lost_takes", 0) + r.get("reattached_workers", 0)
        checks += [("the stalled trial finished", f.get("state_when_resumed") == "COMPLETE"),
                   ("retired once, after the grace period", f.get("interrupted_attempts") == 1),
                   ("finished by another worker", f.get("finished_by") not in (None, f.get("worker"))),
                   ("the stalled worker reported its attempt once", told == 1),
                   # the untold run is still a measurement in the trial store: a second row of that point at most
                   ("at most one extra row in the trial store", store.get("duplicates", 0) <= 1)]
    return [what for what, ok in checks if not ok]


def _stall(procs, t, study, deadline: float) -> dict[str, Any]:
    """SIGSTOP the worker running trial ``t`` (its heartbeat stops, as a cut-off host's would);
    SIGCONT it once the trial was finished by another worker (or at ``deadline``)."""
    import optuna

    worker = t.system_attrs["cubic_worker"]
    p = procs[int(worker[1:])]
    t0 = time.monotonic()
    p.send_signal(signal.SIGSTOP)
    now = t
    while time.monotonic() < deadline:
        now = study._storage.get_trial(t._trial_id)
        if now.state == optuna.trial.TrialState.COMPLETE:
            break
        time.sleep(0.2)
    p.send_signal(signal.SIGCONT)
    return {"fault": "stall", "worker": worker, "trial": t.number, "stalled_s": round(time.monotonic() - t0, 1),
            "state_when_resumed": now.state.name, "finished_by": now.system_attrs.get("cubic_worker"),
            "interrupted_attempts": now.system_attrs.get("cubic_interrupted", 0)}


def pg_ctl(data_dir: str | Path, *args: str) -> subprocess.CompletedProcess:
    """pg_ctl on a throw-away cluster made by scripts/start_postgres.sh (as its 'postgres' user when root)."""
    import glob

    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")) or ["pg_ctl"]
    who = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    return subprocess.run(who + [bins[-1], "-D", str(data_dir), *args], capture_output=True, text=True, timeout=120)


def restart_postgres(pg_dir: str | Path, port: int, down_s: float = 5.0) -> dict[str, Any]:
    """Stop the server of ``pg_dir`` (fast shutdown: open connections are cut), keep it down
    ``down_s``, start it again with scripts/start_postgres.sh; what the workers saw is theirs."""
    t0 = time.monotonic()
    stop = pg_ctl(Path(pg_dir) / "data", "stop", "-m", "fast", "-w")
    time.sleep(down_s)
    env = {**os.environ, "CUBIC_PG_DIR": str(pg_dir), "CUBIC_PG_PORT": str(port)}
    start = subprocess.run(["bash", str(ROOT / "scripts" / "start_postgres.sh")], capture_output=True, text=True,
                           timeout=300, env=env)
    return {"stopped": stop.returncode == 0, "started": start.returncode == 0,
            "down_s": round(time.monotonic() - t0, 1)}


class PrivatePostgres(NamedTuple):
    url: str | None  # None: PostgreSQL cannot be had here, ``why`` says why
    why: str
    restart: Callable[[], dict[str, Any]]  # restart_postgres on this server (down 5 s)


@contextmanager
def private_postgres(port: int, tag: str) -> Iterator[PrivatePostgres]:
    """A PostgreSQL server of its own on ``port`` (one a run may restart, unlike the shared one on
    55432), stopped and removed on exit. Its directory is under /tmp, not pytest's tmp: the
    server's user must read it."""
    pg = f"/tmp/cubic-pg-{tag}-{uuid.uuid4().hex[:8]}"
    url, why = start_postgres(pg, port)
    try:
        yield PrivatePostgres(url, why, lambda: restart_postgres(pg, port, down_s=5.0))
    finally:
        if url is not None:
            pg_ctl(f"{pg}/data", "stop", "-m", "immediate")
        shutil.rmtree(pg, ignore_errors=True)


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
