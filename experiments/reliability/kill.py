"""SIGKILL at random moments, resume each time: nothing lost, nothing run twice, same outcome."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from cubic.testing import LOG_ENV, make_evaluate, space
from experiments.reliability.common import comparable, worker_env, count_lines, store_audit, sqlite_integrity


def user_view(study, name: str, storage: str) -> dict[str, Any]:
    """What a user reads after the kills: the study's rows (``study.trials_dataframe()``, what
    optuna-dashboard shows), their states, points appearing more than once, and the run count of
    ``cubic campaign list``."""
    from collections import Counter

    from cubic.codesign.storage import list_campaigns

    df = study.trials_dataframe(attrs=("number", "state", "params"))
    params = [c for c in df.columns if c.startswith("params_")]
    points = Counter(tuple(map(str, r)) for r in df[params].itertuples(index=False)) if len(df) else Counter()
    listed = {c["name"]: c for c in list_campaigns(storage)}.get(name, {})
    return {"trials": int(len(df)), "states": dict(Counter(df["state"])) if len(df) else {},
            "duplicated_points": sum(n - 1 for n in points.values() if n > 1),
            "failed_without_a_run": sum(1 for t in study.get_trials(deepcopy=False)
                                        if t.state.name == "FAIL" and "finished_at" not in t.user_attrs),
            "interrupted_attempts_resumed": sum(int(t.system_attrs.get("cubic_interrupted", 0))
                                                for t in study.get_trials(deepcopy=False)),
            "campaign_list_runs": listed.get("runs")}



def kill_repeatedly(command: Callable[[], list[str]], wd: Path, env: dict[str, str], log: Path, kills: int,
                    rng: random.Random, max_wait_s: float, timeout_s: float) -> tuple[int, list[float], bool]:
    """Start ``command()`` (asked anew each time: the first start may differ from a resume), wait until
    it has begun a new evaluation (a new line in ``log``), then a random moment of up to ``max_wait_s``,
    and SIGKILL it; ``kills`` times or until ``timeout_s``. Returns (kills done, their moments,
    whether the campaign finished before all kills: a budget too small for the test). The one kill
    loop of both kill tests."""
    done, moments, t0 = 0, [], time.monotonic()
    while done < kills and time.monotonic() - t0 < timeout_s:
        before = count_lines(log)
        proc = subprocess.Popen(command(), cwd=wd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while proc.poll() is None and count_lines(log) <= before:
            time.sleep(0.005)
        wait = rng.uniform(0.0, max_wait_s)
        if proc.poll() is None:
            time.sleep(wait)
        if proc.poll() is not None:  # the campaign finished before this kill
            err = proc.stderr.read().decode(errors="replace")
            if proc.returncode != 0:
                raise RuntimeError(f"campaign process failed (rc {proc.returncode}): {err[-2000:]}")
            return done, moments, True
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        moments.append(round(wait, 3))
        done += 1
    return done, moments, False


def kill_resume(workdir: str | Path, kills: int = 20, budget: int = 120, batch: int = 4, seed: int = 7,
                strategy: str = "tpe", max_wait_s: float = 0.8, rng_seed: int = 0,
                timeout_s: float = 1800.0) -> dict[str, Any]:
    """Run a campaign in a child process, SIGKILL it at a random moment after it has started
    evaluating, resume it, ``kills`` times; then let it finish and compare with an uninterrupted
    campaign of the same seed run in this process."""
    import optuna

    from cubic.codesign.campaign import Campaign

    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    sp = space()
    storage, store, log = f"sqlite:///{wd}/campaigns.db", f"sqlite:///{wd}/trials.db", wd / "evals.log"
    # the campaign row is created before the first kill (creation itself is not what is tested)
    Campaign(sp, lambda p: {}, name="killed", strategy=strategy, budget=budget, batch_size=batch, seed=seed,
             storage=storage)
    cmd = [sys.executable, "-m", "cubic.codesign.worker", "run", "--storage", storage, "--name", "killed",
           "--evaluate", "cubic.testing:make_evaluate", "--store", store]
    env = worker_env(**{LOG_ENV: str(log)})
    rng = random.Random(rng_seed)
    t0 = time.monotonic()
    done, moments, finished_early = kill_repeatedly(lambda: cmd, wd, env, log, kills, rng, max_wait_s, timeout_s)
    runs_started = count_lines(log)
    final = subprocess.run(cmd, cwd=wd, env=env, capture_output=True, timeout=timeout_s)
    if final.returncode != 0:
        raise RuntimeError(f"final resume failed: {final.stderr.decode(errors='replace')[-2000:]}")
    runs_started_total = count_lines(log)
    elapsed = time.monotonic() - t0

    # the same campaign, never interrupted
    ref_dir = wd / "reference"
    ref_dir.mkdir(exist_ok=True)
    ref_store = f"sqlite:///{ref_dir}/trials.db"
    ref = Campaign(sp, make_evaluate(sp, ref_store), name="killed", strategy=strategy, budget=budget,
                   batch_size=batch, seed=seed, storage=f"sqlite:///{ref_dir}/campaigns.db")
    ref_summary = ref.run()

    study = optuna.load_study(study_name="killed", storage=storage)
    got, want = comparable(study), comparable(ref.study)
    runs = [t for t in study.get_trials(deepcopy=False) if "finished_at" in t.user_attrs]  # not lost attempts
    keys = [t.user_attrs["key"] for t in runs]
    audit = store_audit(store, sp, study)
    seen = user_view(study, "killed", storage)
    resumed = Campaign.resume("killed", lambda p: {}, storage=storage)
    s = resumed.summary()
    return {
        "kills": done, "kill_moments_s_after_first_eval": moments, "finished_before_all_kills": finished_early,
        "budget": budget, "trials": len(keys),
        "retried_after_kill": sum("failed_trial" in t.system_attrs for t in runs),
        "duplicated_trials": len(keys) - len(set(keys)),
        "lost_trials": max(0, budget - len(set(keys))),
        "store": audit, "evaluations_started": runs_started_total,
        # a run in flight at a kill is run again on resume (its trial resumed): not a duplicate point
        "evaluations_redone_after_kills": runs_started_total - budget,
        "user_view": seen,
        "evaluations_before_final_resume": runs_started,
        "integrity_check": {"campaigns.db": sqlite_integrity(storage), "trials.db": sqlite_integrity(store)},
        "equals_uninterrupted": got == want,
        # point key -> (resumed, uninterrupted) where they differ (values hold dicts: compared, not hashed)
        "differences": [[k, got.get(k), want.get(k)] for k in sorted(set(got) | set(want))
                        if got.get(k) != want.get(k)][:5],
        "best_point": s.best_point, "best_point_uninterrupted": ref_summary.best_point,
        "status": study.user_attrs.get("status"), "elapsed_s": round(elapsed, 1),
    }


SLOW_JOB = """import json, sys, time
with open("runs.log", "a") as f:
    f.write(sys.argv[1] + "\\n")
time.sleep(float(sys.argv[2]))
print(json.dumps({"score": -(float(sys.argv[1]) - 0.3) ** 2}))
"""


def kill_resume_cli(workdir: str | Path, kills: int = 4, budget: int = 8, batch: int = 2, strategy: str = "cubic",
                    job_s: float = 0.3, max_wait_s: float = 2.0, rng_seed: int = 0,
                    timeout_s: float = 1200.0) -> dict[str, Any]:
    """The real CLI path: ``cubic campaign run`` of a user's job (``--objective``), SIGKILLed at
    random moments (a job running, a result being recorded, between rounds, the proxy retraining:
    ``cubic`` fits its proxy before each round), ``cubic campaign resume`` after each kill, then
    resumed to the end. Counts what a user reads (:func:`user_view`)."""
    import optuna

    from experiments.reliability.readback import SPACE

    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    (wd / "job.py").write_text(SLOW_JOB)
    (wd / "space.yaml").write_text(SPACE)
    storage = f"sqlite:///{wd}/.cubic/campaigns.db"
    cli = [sys.executable, "-m", "cubic.cli.app", "campaign"]
    run = cli + ["run", "--name", "killed", "--objective", f"{sys.executable} job.py {{x}} {job_s}", "--space",
                 "space.yaml", "--budget", str(budget), "--batch", str(batch), "--strategy", strategy, "--timeout",
                 "120", "--storage", storage]
    resume = cli + ["resume", "killed", "--storage", storage]
    log, env, rng = wd / "runs.log", worker_env(), random.Random(rng_seed)
    t0 = time.monotonic()

    def created() -> bool:
        try:
            return any(c["name"] == "killed" for c in __import__("cubic.codesign.storage", fromlist=["x"])
                       .list_campaigns(storage))
        except Exception:  # noqa: BLE001 - no storage yet
            return False

    done, moments, finished_early = kill_repeatedly(lambda: resume if created() else run, wd, env, log, kills, rng,
                                                    max_wait_s, timeout_s)
    final = subprocess.run(resume if created() else run, cwd=wd, env=env, capture_output=True, timeout=timeout_s)
    if final.returncode != 0:
        raise RuntimeError(f"final resume failed: {final.stderr.decode(errors='replace')[-1500:]}")
    study = optuna.load_study(study_name="killed", storage=storage)
    return {"path": "cubic campaign run/resume --objective", "strategy": strategy, "kills": done,
            "kill_moments_s_after_a_job_started": moments, "finished_before_all_kills": finished_early,
            "budget": budget, "jobs_started": count_lines(log), "user_view": user_view(study, "killed", storage),
            "status": study.user_attrs.get("status"), "integrity_check": sqlite_integrity(storage),
            "elapsed_s": round(time.monotonic() - t0, 1)}
