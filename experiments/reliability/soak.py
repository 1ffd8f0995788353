"""A soak, as users at scale run campaigns: many workers on PostgreSQL, many trials of the stand-in
runner, workers and the coordinator SIGKILLed at random and restarted (as a cluster manager
would), one database restart; and the proposal time of cubic's search at 100 / 1,000 / 10,000
trials (where it stops scaling)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from typing import Any, Callable

from cubic.testing import DELAY_ENV, space
from experiments.reliability.common import worker_env, store_audit


def soak(storage: str, store: str, workers: int = 8, budget: int = 1000, kills: int = 10,
         restart_db: Callable[[], dict[str, Any]] | None = None, delay_s: float = 0.02, lease_s: float = 10.0,
         strategy: str = "tpe", timeout_s: float = 3600.0, seed: int = 0) -> dict[str, Any]:
    """``workers`` worker processes on one campaign of ``budget`` trials; ``kills`` SIGKILLs of a
    random worker (every other one the coordinator) spread over the budget, each killed worker
    restarted under a new id; ``restart_db()`` once at half the budget. Returns what a user reads
    afterwards (the study's trials, points, failures) and the throughput over time."""
    import optuna

    from cubic.codesign.campaign import Campaign
    from cubic.codesign.storage import _LEASES
    from sqlalchemy import create_engine, select

    sp = space()
    name = f"soak-{uuid.uuid4().hex[:8]}"
    Campaign(sp, lambda p: {}, name=name, strategy=strategy, budget=budget, batch_size=workers, seed=seed,
             storage=storage)
    start, started = _worker_starter(storage, store, name, lease_s, delay_s)
    procs = dict(start() for _ in range(workers))
    rng = random.Random(seed)
    kill_at = sorted(rng.sample(range(budget // 10, budget - budget // 10), kills)) if kills else []
    restart_at = budget // 2 if restart_db else None
    events: list[dict[str, Any]] = []
    samples: list[tuple[float, int]] = []
    exits: list[tuple[str, int | None, str]] = []
    t0 = time.monotonic()
    eng = create_engine(storage)
    study = optuna.load_study(study_name=name, storage=storage)
    done = 0
    try:
        while time.monotonic() - t0 < timeout_s:
            try:
                ts = study.get_trials(deepcopy=False)
                done = sum(t.state.is_finished() for t in ts)
                status = study.user_attrs.get("status")
                with eng.connect() as conn:
                    row = conn.execute(select(_LEASES.c.holder).where(_LEASES.c.campaign == name)).first()
            except Exception:  # noqa: BLE001 - the database is restarting: look again
                time.sleep(0.5)
                continue
            samples.append((round(time.monotonic() - t0, 2), done))
            if kill_at and done >= kill_at[0]:
                kill_at.pop(0)
                _kill_one(procs, row[0] if row else None, rng, events, done, t0)
            if restart_at is not None and done >= restart_at:
                restart_at = None
                eng.dispose()
                events.append({"event": "db_restart", "done": done, "t_s": round(time.monotonic() - t0, 1),
                               **restart_db()})
            _reap(procs, exits, start, restart=status != "finished")
            if not procs:
                break
            time.sleep(0.5)
    finally:  # past the timeout, or the watch itself failed: no worker outlives the soak
        for p in procs.values():
            p.kill()
            p.communicate()
    wall = time.monotonic() - t0
    eng.dispose()
    study = optuna.load_study(study_name=name, storage=storage)
    return _soak_report(study.get_trials(deepcopy=False), store, sp, workers=workers, budget=budget,
                        strategy=strategy, delay_s=delay_s, wall=wall, timeout_s=timeout_s, events=events,
                        workers_started=started["n"], exits=exits, samples=samples)


def _worker_starter(storage: str, store: str, name: str, lease_s: float,
                    delay_s: float) -> tuple[Callable[[], tuple[str, subprocess.Popen]], dict[str, int]]:
    """A function that starts one more worker on campaign ``name`` under a new id (s0, s1, ...), and
    the count of workers it started (a dict it updates)."""
    cmd = [sys.executable, "-m", "cubic.codesign.worker", "work", "--storage", storage, "--name", name,
           "--evaluate", "cubic.testing:make_evaluate", "--store", store, "--lease", str(lease_s)]
    env = worker_env(**{DELAY_ENV: str(delay_s)})
    started = {"n": 0}

    def start() -> tuple[str, subprocess.Popen]:
        wid = f"s{started['n']}"
        started["n"] += 1
        return wid, subprocess.Popen(cmd + ["--worker-id", wid], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    return start, started


def _kill_one(procs: dict[str, subprocess.Popen], coord: str | None, rng: random.Random,
              events: list[dict[str, Any]], done: int, t0: float) -> None:
    """SIGKILL one worker: the coordinator ``coord`` (the lease's holder) when ``events`` holds an even
    number of entries and it is one of ours, else one at random; the kill goes into ``events``."""
    victim = coord if (len(events) % 2 == 0 and coord in procs) else rng.choice(sorted(procs))
    procs[victim].send_signal(signal.SIGKILL)
    events.append({"event": "kill", "worker": victim, "coordinator": victim == coord, "done": done,
                   "t_s": round(time.monotonic() - t0, 1)})


def _reap(procs: dict[str, subprocess.Popen], exits: list[tuple[str, int | None, str]],
          start: Callable[[], tuple[str, subprocess.Popen]], restart: bool) -> None:
    """Move each worker that has exited from ``procs`` to ``exits`` (id, exit code, end of stderr) and,
    when ``restart``, start one in its place."""
    for wid, p in list(procs.items()):
        if p.poll() is None:
            continue
        out, err = p.communicate()
        exits.append((wid, p.returncode, (err or "").strip()[-400:]))
        del procs[wid]
        if restart:  # a cluster manager restarts a worker that died (the campaign is not finished)
            nid, np_ = start()
            procs[nid] = np_


def _soak_report(trials: list, store: str, sp, *, workers: int, budget: int, strategy: str, delay_s: float,
                 wall: float, timeout_s: float, events: list[dict[str, Any]], workers_started: int,
                 exits: list[tuple[str, int | None, str]], samples: list[tuple[float, int]]) -> dict[str, Any]:
    """What a user reads after the soak: the study's ``trials`` (runs, points, failures), the trial
    store's audit, the kills and restarts, the workers' exits and the throughput over time."""
    runs = [t for t in trials if "finished_at" in t.user_attrs]
    keys = Counter(t.user_attrs["key"] for t in runs)
    per_100 = _rate_per_100(samples)
    return {
        "workers": workers, "budget": budget, "strategy": strategy, "run_delay_s": delay_s, "wall_s": round(wall, 1),
        "timed_out": wall >= timeout_s, "trials_in_study": len(trials),
        "finished_runs": len(runs), "states": dict(Counter(t.state.name for t in trials)),
        "duplicated_points": sum(n - 1 for n in keys.values() if n > 1),
        "lost_trials": max(0, budget - len(keys)),
        "failed_without_a_run": sum(1 for t in trials if t.state.name == "FAIL" and "finished_at" not in t.user_attrs),
        "interrupted_attempts_resumed": sum(int(t.system_attrs.get("cubic_interrupted", 0)) for t in trials),
        "store": store_audit(store, sp, runs), "events": events,
        "kills": sum(e["event"] == "kill" for e in events),
        "db_restarts": sum(e["event"] == "db_restart" for e in events),
        "workers_started": workers_started,
        "worker_exits": Counter(rc for _, rc, _ in exits),
        "worker_errors": [e for _, rc, e in exits if rc not in (0, -signal.SIGKILL)][:5],
        "reattached": sum("re-attached" in e for _, _, e in exits),
        "campaign_trials_per_s": round(len(runs) / wall, 2) if wall > 0 else None,
        "trials_per_s_by_hundred": per_100,
    }


def _rate_per_100(samples: list[tuple[float, int]]) -> dict[str, float]:
    """Trials/s over each block of 100 finished trials (does the campaign slow as the study grows?)."""
    out: dict[str, float] = {}
    first: dict[int, float] = {}
    for t, n in samples:
        first.setdefault(n // 100, t)
    blocks = sorted(first)
    for a, b in zip(blocks, blocks[1:]):
        if b == a + 1 and first[b] > first[a]:
            out[f"{a * 100}-{b * 100}"] = round(100 / (first[b] - first[a]), 2)
    return out


def proposal_time(n: int, k: int = 8, strategy: str = "cubic", seed: int = 0) -> dict[str, Any]:
    """Seconds for one ``propose(history, k)`` of ``strategy`` on a synthetic history of ``n``
    finished runs of the stand-in (a space large enough for 10,000 distinct points): the
    coordinator's cost per round as a study grows. The first proposal fits and selects the proxy
    family by cross-validation; the second re-fits it."""
    import numpy as np

    from cubic.testing import SPACE, FastRunner, toy_workload
    from search.space import Space
    from search.strategies import Observation, SearchContext, make_strategy

    sp = Space.model_validate({**SPACE, "parameters": [{**p, "step": 1} if p["name"] == "batch_size" else p
                                                       for p in SPACE["parameters"]]})
    rng = np.random.default_rng(seed)
    runner, wl = FastRunner(delay_s=0.0), toy_workload()
    seen, hist = set(), []
    while len(hist) < n:
        p = sp.sample(rng)
        if sp.key(p) in seen:
            continue
        seen.add(sp.key(p))
        hist.append(Observation(point=p, result=runner.run(wl, sp.to_config(p))))
    s = make_strategy(strategy).bind(SearchContext(sp, seed))
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        s.propose(hist, k)
        times.append(time.perf_counter() - t0)
    return {"trials": n, "k": k, "strategy": strategy, "first_s": round(times[0], 3), "refit_s": round(times[1], 3),
            "fit": getattr(s, "fit_", {})}


def proposal_scaling(sizes=(100, 1000, 10000), timeout_s: float = 600.0, strategy: str = "cubic") -> dict[str, Any]:
    """:func:`proposal_time` per size, each in a process of its own with a time limit (a size that
    does not finish within it is where the search stops scaling on this machine)."""
    out = {}
    for n in sizes:
        code = ("import json; from experiments.reliability.soak import proposal_time; "
                f"print(json.dumps(proposal_time({n}, strategy={strategy!r}), default=str))")
        t0 = time.monotonic()
        try:
            r = subprocess.run([sys.executable, "-c", code], env=worker_env(), capture_output=True, text=True,
                               timeout=timeout_s)
            out[str(n)] = (json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else
                           {"error": (r.stderr.strip().splitlines() or ["failed"])[-1][:300]})
        except subprocess.TimeoutExpired:
            out[str(n)] = {"timed_out_after_s": timeout_s}
        out[str(n)]["wall_s"] = round(time.monotonic() - t0, 1)
    return out
