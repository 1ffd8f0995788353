"""The search benchmark's early-stopping part: the wall time a pruner saves a campaign over a user's
training script, and what it costs in final quality.

The user-script space is mlp-tabular's (experiments/_public_problems.py: learning rate, batch size,
width, optimizer; 972 configurations) run as a real ``--objective`` job (experiments/_curve_job.py:
one sleep of ``epoch_s`` per epoch, an intermediate ``{"step": e, "val_loss": v}`` line after each).
Each seed runs the same campaign three times through the real CLI (``cubic campaign run --objective
... --prune none|median|halving``, cubic's default strategy, a fresh storage and trial store each,
no baseline and no confirm phase: the search only). Per campaign: the wall time of the CLI process
and the sum of its jobs' wall times (``wall_time_s`` of every run, pruned ones included), the runs
pruned and the epochs they skipped, and the final quality: the relative regret of the best
*completed* run's val_loss (0 = the grid's optimum, 1 = a random configuration's median).
Called by ``experiments/search_benchmark.py --early-stop`` (merged into the JSON).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from experiments._public_problems import EPOCHS, MLP_BATCH, MLP_LR, MLP_OPT, MLP_WIDTH, problems, random_median

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("none", "median", "halving")  # --prune of `cubic campaign run`
SCRIPT = ROOT / "experiments" / "_curve_job.py"
OBJECTIVE = "python {script} --lr {lr} --batch {batch} --width {width} --opt {opt} --epoch-s {epoch_s}"
# set before the first run: the share of the jobs' wall time a pruner must save, and how much worse
# (in relative regret) its campaign's final best may be, at the upper end of the paired 95% interval
MIN_SAVED = 0.30
MAX_REGRET_COST = 0.05


def space_doc() -> dict:
    """mlp-tabular's grid as a cubic space (the lists are _public_problems' own: one record)."""
    return {"version": 1, "name": "mlp-tabular-job",
            "description": "mlp-tabular's hyperparameters as a user's training script (experiments/_curve_job.py)",
            "objectives": [{"metric": "val_loss", "direction": "minimize"}],
            "parameters": [{"name": "lr", "type": "categorical", "choices": [float(x) for x in MLP_LR], "log": True},
                           {"name": "batch", "type": "categorical", "choices": MLP_BATCH, "log": True},
                           {"name": "width", "type": "categorical", "choices": MLP_WIDTH, "log": True},
                           {"name": "opt", "type": "categorical", "choices": MLP_OPT}]}


def _runs(storage: str, name: str) -> list:
    import optuna

    from cubic.codesign.trials import is_run, trial_result

    study = optuna.load_study(study_name=name, storage=storage)
    return [trial_result(t) for t in study.trials if is_run(t)]


def campaign(arm: str, seed: int, budget: int, epoch_s: float, work: Path) -> dict:
    """One campaign through the real CLI; its figures read back from its Optuna study."""
    name = f"es-{arm}-{seed}"
    storage = f"sqlite:///{work / (name + '.db')}"
    objective = OBJECTIVE.replace("{script}", str(SCRIPT)).replace("{epoch_s}", str(epoch_s))
    cmd = [str(Path(sys.executable).parent / "cubic"), "campaign", "run", "--objective", objective,
           "--space", str(work / "space.yaml"), "--name", name,
           "--budget", str(budget), "--seed", str(seed), "--prune", arm, "--no-baseline", "--confirm-repeats", "0",
           "--storage", storage, "--store", f"sqlite:///{work / (name + '-trials.db')}"]
    t0 = time.perf_counter()
    # run in the work folder: the campaign's job logs (.cubic/jobs) stay out of the checkout
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    runs = _runs(storage, name)
    done = [r for r in runs if r.ok]
    pruned = [r for r in runs if r.failure_kind == "pruned"]
    pb = problems()["mlp-tabular"]
    best = min((r.metrics["val_loss"] for r in done), default=None)  # None: every run was stopped early
    return {"arm": arm, "seed": seed, "runs": len(runs), "completed": len(done), "pruned": len(pruned),
            "other_failures": len(runs) - len(done) - len(pruned),
            "epochs_run": len(done) * EPOCHS + sum(int(r.metrics["pruned_step"]) for r in pruned),
            "campaign_wall_s": wall, "jobs_wall_s": float(sum(r.metrics["wall_time_s"] for r in runs)),
            "best_val_loss": best,
            "final_regret": None if best is None else float((best - pb.optimum) / (random_median(pb) - pb.optimum))}


def run_early_stop(seeds, budget: int = 24, epoch_s: float = 0.2, log=print) -> dict:
    from cubic.core.stats import mean_interval

    rows = []
    with tempfile.TemporaryDirectory(prefix="cubic-early-stop-") as tmp:
        work = Path(tmp)
        (work / "space.yaml").write_text(json.dumps(space_doc()))
        for seed in seeds:
            for arm in ARMS:
                rows.append(campaign(arm, seed, budget, epoch_s, work))
                r = rows[-1]
                log(f"  early stop {arm} seed {seed}: {r['pruned']}/{r['runs']} pruned, epochs {r['epochs_run']}, "
                    f"jobs {r['jobs_wall_s']:.1f} s, campaign {r['campaign_wall_s']:.1f} s, "
                    f"final regret {r['final_regret']}")
    by = {arm: {r["seed"]: r for r in rows if r["arm"] == arm} for arm in ARMS}
    arms = {}
    for arm in ARMS[1:]:
        saved = [1 - by[arm][s]["jobs_wall_s"] / by["none"][s]["jobs_wall_s"] for s in seeds]
        saved_campaign = [1 - by[arm][s]["campaign_wall_s"] / by["none"][s]["campaign_wall_s"] for s in seeds]
        # a campaign with no completed run has no final quality: its seed leaves the paired cost (counted)
        both = [s for s in seeds if by[arm][s]["final_regret"] is not None and by["none"][s]["final_regret"] is not None]
        cost = [by[arm][s]["final_regret"] - by["none"][s]["final_regret"] for s in both]
        m, lo, hi = (x if math.isfinite(x) else None for x in mean_interval(cost))  # None: fewer than 2 seeds
        arms[arm] = {"jobs_wall_saved_median": float(np.median(saved)), "jobs_wall_saved_per_seed": saved,
                     "campaign_wall_saved_median": float(np.median(saved_campaign)),
                     "regret_cost_mean": m, "regret_cost_interval_95": [lo, hi], "regret_cost_per_seed": cost,
                     "seeds_without_a_completed_run": len(seeds) - len(both),
                     "pruned_share": float(np.mean([by[arm][s]["pruned"] / by[arm][s]["runs"] for s in seeds]))}
    return {"kind": "MEASURED on this machine (real CLI campaigns over a user script; its epochs are sleeps, its "
                    "losses mlp-tabular's formula)",
            "space": "mlp-tabular as a user script (972 configurations)", "objective": OBJECTIVE, "budget": budget,
            "epoch_s": epoch_s, "epochs": EPOCHS, "seeds": list(seeds), "strategy": "cubic (the CLI's default)",
            "pruners": {"median": "optuna MedianPruner(n_startup_trials=2, n_warmup_steps=1)",
                        "halving": "optuna SuccessiveHalvingPruner() (ASHA's rule)"},
            "campaigns": rows, "arms": arms,
            "note": ("same number of runs per campaign; 'saved' = 1 - pruned arm / no pruning, per seed; the regret "
                     "cost is the pruned campaign's final relative regret minus the unpruned one's, same seed "
                     "(paired), with its 95% t interval over seeds")}


def early_stop_targets(es: dict) -> dict:
    out = {}
    for arm, a in es["arms"].items():
        saved = a["jobs_wall_saved_median"]
        out[f"early stop: --prune {arm} saves >= {MIN_SAVED:.0%} of the jobs' wall time (median over seeds)"] = {
            "measured": saved, "target": MIN_SAVED, "met": bool(saved >= MIN_SAVED),
            "campaign_wall_saved_median": a["campaign_wall_saved_median"], "pruned_share": a["pruned_share"],
            **({} if saved >= MIN_SAVED else {"reason": (
                f"the pruner stopped {a['pruned_share']:.0%} of the runs; the epochs they skipped are "
                f"{saved:.0%} of the unpruned campaigns' job time")})}
        hi = a["regret_cost_interval_95"][1]
        equal = hi is not None and hi <= MAX_REGRET_COST
        out[f"early stop: --prune {arm} final quality equal (upper 95% bound of the paired regret cost "
            f"<= {MAX_REGRET_COST})"] = {
            "measured": hi, "target": MAX_REGRET_COST, "met": bool(equal),
            "mean": a["regret_cost_mean"], "interval_95": a["regret_cost_interval_95"],
            **({} if equal else {"reason": "fewer than two seeds with a completed run in both arms" if hi is None else (
                f"paired cost {a['regret_cost_mean']:+.3f} [{a['regret_cost_interval_95'][0]:+.3f}, {hi:+.3f}] "
                f"in relative regret over {len(a['regret_cost_per_seed'])} seeds: "
                + ("the pruned campaigns end worse" if a["regret_cost_interval_95"][0] > 0 else
                   "not resolved at this many seeds"))})}
    return out
