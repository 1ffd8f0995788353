"""The search benchmark's early-stopping part: the wall time a pruner saves a campaign over a user's
training script, and what it costs in final quality.

The user-script space is mlp-tabular's (experiments/_public_problems.py: learning rate, batch size,
width, optimizer; 972 configurations) run as a real ``--objective`` job (experiments/_curve_job.py:
one sleep of ``epoch_s`` per epoch, an intermediate ``{"step": e, "val_loss": v}`` line after each).
Each seed runs the same campaign three times through the real CLI (``cubic campaign run --objective
... --prune none|median|halving``, cubic's default strategy, a fresh storage and trial store each,
no baseline and no confirm phase: the search only); the pruned campaigns get ``extend`` times the
runs. Read back from each campaign's Optuna study, run by run: the job's wall time (``wall_time_s``,
pruned runs included) and the quality so far, the relative regret of the best *completed* run's
val_loss (0 = the grid's optimum, 1 = a random configuration's median). Two comparisons per seed:

- **at equal final quality** (what the issue asks): the jobs' wall time a pruned campaign took to
  first reach the unpruned campaign's final quality, against the unpruned campaign's whole job time
  (saved = 1 - ratio; a pruned campaign that never gets there within its runs saves nothing: -inf);
- **at an equal number of runs**: the pruned campaign's first ``budget`` runs against the unpruned
  ``budget``: wall time saved, and the final-quality cost with its paired interval over seeds.
Called by ``experiments/search_benchmark.py --early-stop`` (merged into the JSON).
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cubic.codesign.answer import PRUNER_BACKED, PRUNING_NOTE_HEAD
from experiments._public_problems import CURVES, EPOCHS, MLP_BATCH, MLP_LR, MLP_OPT, MLP_WIDTH, problems, random_median
from experiments._search_public import relative_regret

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("none", "median", "halving")  # --prune of `cubic campaign run`
SCRIPT = ROOT / "experiments" / "_curve_job.py"
OBJECTIVE = ("python {script} --lr {lr} --batch {batch} --width {width} --opt {opt} --epoch-s {epoch_s} "
             "--curves {curves}")
# set before the first run: the share of the jobs' wall time a pruner must save, and how much worse
# (in relative regret) its campaign's final best may be, at the upper end of the paired 95% interval
MIN_SAVED = 0.30
MAX_REGRET_COST = 0.05
# set before the first run with the note (stop 41): the share of pruned campaigns whose note about
# the pruner (warns, or says the completed curves back it) matches whether it stopped a would-be winner
MIN_NOTE_RIGHT = 0.8


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
    return [(dict(t.params), trial_result(t)) for t in study.trials if is_run(t)]


def campaign(arm: str, seed: int, budget: int, epoch_s: float, work: Path, curves: str = "ordered",
             warmup: int | None = None) -> dict:
    """One campaign through the real CLI; its runs read back, in order, from its Optuna study."""
    name = f"es-{arm}-{seed}"
    storage = f"sqlite:///{work / (name + '.db')}"
    objective = (OBJECTIVE.replace("{script}", str(SCRIPT)).replace("{epoch_s}", str(epoch_s))
                 .replace("{curves}", curves))
    cmd = [str(Path(sys.executable).parent / "cubic"), "campaign", "run", "--objective", objective,
           "--space", str(work / "space.yaml"), "--name", name,
           "--budget", str(budget), "--seed", str(seed), "--prune", arm, "--no-baseline", "--confirm-repeats", "0",
           "--storage", storage, "--store", f"sqlite:///{work / (name + '-trials.db')}"]
    if warmup and arm != "none":
        cmd += ["--prune-warmup", str(warmup)]
    t0 = time.perf_counter()
    # run in the work folder: the campaign's job logs (.cubic/jobs) stay out of the checkout
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    runs = _runs(storage, name)
    # what the campaign told its user about the pruner (cubic.codesign.answer.pruning_note), as printed
    note = next((ln.strip() for ln in proc.stdout.splitlines() if ln.strip().startswith(PRUNING_NOTE_HEAD)), None)
    return {"arm": arm, "seed": seed, "runs": len(runs), "campaign_wall_s": wall,
            "regret_so_far": quality_so_far([r.metrics["val_loss"] if r.ok else None for _, r in runs],
                                            regret_scale()),
            "jobs_wall_s_per_run": [float(r.metrics["wall_time_s"]) for _, r in runs],
            "kinds": [r.failure_kind or "ok" for _, r in runs],
            "epochs_per_run": [EPOCHS if r.ok else int(r.metrics.get("pruned_step", 0)) for _, r in runs],
            # each run's final val_loss had it run to the end (MODELLED for a pruned run: the script's formula)
            "full_final_per_run": [float(CURVES[curves](p)[-1]) for p, _ in runs], "pruning_note": note}


@functools.lru_cache(maxsize=1)
def regret_scale() -> tuple[float, float]:
    """(optimum, median of random configurations) of the registered mlp-tabular problem: computed
    once per process (the median is 2,000 Optuna trials, ~0.7 s; a part reads it per campaign)."""
    pb = problems()["mlp-tabular"]
    return pb.optimum, random_median(pb)


def quality_so_far(losses: list[float | None], scale: tuple[float, float]) -> list[float | None]:
    """Per run, in order, the relative regret of the best completed run so far (``losses``: a run's
    loss, None for a run that did not complete; None before the first completed run)."""
    opt, med = scale
    best, regret = math.inf, []
    for loss in losses:
        best = best if loss is None else min(best, loss)
        regret.append(None if best == math.inf else relative_regret(best, opt, med))
    return regret


def rescore(es: dict, code_version: str, why: str) -> dict:
    """A stored section's regrets, and all that derives from them, recomputed against the registered
    problem as it stands, from the section's runs as they were measured (no campaign re-run): a
    completed run's loss is the final loss its script printed, which is ``full_final_per_run`` (the
    same formula on the same configuration). For a change to the problem's optimum or random median
    that leaves the script's losses as they were."""
    scale = regret_scale()
    rows = [{**c, "regret_so_far": quality_so_far([f if k == "ok" else None
                                                    for k, f in zip(c["kinds"], c["full_final_per_run"])], scale)}
            for c in es["campaigns"]]
    by = {arm: {r["seed"]: r for r in rows if r["arm"] == arm} for arm in ARMS}
    return {**es, "campaigns": rows,
            "arms": {arm: compare_arm(by, arm, es["seeds"], es["budget"]) for arm in ARMS[1:]},
            "curves": curve_agreement(es.get("script_curves", "ordered")),
            "rescored": {"code_version": code_version, "why": why,
                         "what": "regret_so_far, arms and curves recomputed from the stored runs (their kinds and "
                                 "final losses); the campaigns, their runs, wall times and notes are as measured "
                                 "on the section's context's code"}}


def note_check(es: dict) -> dict:
    """Whether each pruned campaign's note about its pruner told the truth: it warns (does not say the
    completed curves back the pruner) exactly when a stopped run would have beaten the campaign's
    best completed run (the script's formula); a campaign with no note warns of nothing."""
    rows = []
    for c in es["campaigns"]:
        if c["arm"] == "none":
            continue
        note = c.get("pruning_note")
        warned = note is not None and PRUNER_BACKED not in note
        winners = first_runs(c, len(c["kinds"]))["pruned_winners"]
        rows.append({"arm": c["arm"], "seed": c["seed"], "warned": warned, "noted": note is not None,
                     "pruned_winners": winners, "right": warned == (winners > 0)})
    return {"campaigns": rows, "right": sum(r["right"] for r in rows), "of": len(rows)}


def first_runs(c: dict, n: int) -> dict:
    """A campaign's figures over its first ``n`` runs."""
    kinds, full = c["kinds"][:n], c["full_final_per_run"][:n]
    best = min((f for f, k in zip(full, kinds) if k == "ok"), default=math.inf)
    return {"runs": len(kinds), "completed": kinds.count("ok"), "pruned": kinds.count("pruned"),
            # pruned runs that, run to the end, would have beaten the best completed one: the winners a pruner cost
            "pruned_winners": sum(k == "pruned" and f < best for f, k in zip(full, kinds)),
            "other_failures": len(kinds) - kinds.count("ok") - kinds.count("pruned"),
            "epochs_run": sum(c["epochs_per_run"][:n]), "jobs_wall_s": float(sum(c["jobs_wall_s_per_run"][:n])),
            "final_regret": c["regret_so_far"][:n][-1] if kinds else None}


def time_to_quality(c: dict, target: float | None) -> tuple[int, float] | None:
    """(runs, jobs' wall time) until the campaign's quality first reaches ``target`` (None: never)."""
    if target is None:
        return None
    spent = 0.0
    for i, (reg, w) in enumerate(zip(c["regret_so_far"], c["jobs_wall_s_per_run"])):
        spent += w
        if reg is not None and reg <= target:
            return i + 1, spent
    return None


def _median_or_none(xs: list[float | None]) -> float | None:
    """Median over seeds, a seed that never got there counted as -inf; None when that is the median."""
    m = float(np.median([-math.inf if x is None else x for x in xs]))
    return m if math.isfinite(m) else None


def compare_arm(by: dict, arm: str, seeds, budget: int) -> dict:
    from cubic.core.stats import mean_interval

    base = {s: first_runs(by["none"][s], budget) for s in seeds}
    own = {s: first_runs(by[arm][s], budget) for s in seeds}
    saved = [1 - own[s]["jobs_wall_s"] / base[s]["jobs_wall_s"] for s in seeds]
    # a campaign with no completed run has no final quality: its seed leaves the paired cost (counted)
    both = [s for s in seeds if own[s]["final_regret"] is not None and base[s]["final_regret"] is not None]
    cost = [own[s]["final_regret"] - base[s]["final_regret"] for s in both]
    m, lo, hi = (x if math.isfinite(x) else None for x in mean_interval(cost))  # None: fewer than 2 seeds
    reach = {s: time_to_quality(by[arm][s], base[s]["final_regret"]) for s in seeds}
    at_quality = [None if reach[s] is None else 1 - reach[s][1] / base[s]["jobs_wall_s"] for s in seeds]
    whole = {s: first_runs(by[arm][s], len(by[arm][s]["kinds"])) for s in seeds}
    return {"equal_quality": {"jobs_wall_saved_median": _median_or_none(at_quality),
                              "jobs_wall_saved_per_seed": at_quality,
                              "reached": sum(x is not None for x in at_quality),
                              "pruned_runs": sum(whole[s]["pruned"] for s in seeds),
                              "pruned_winners": sum(whole[s]["pruned_winners"] for s in seeds),
                              "runs_to_reach_per_seed": [None if reach[s] is None else reach[s][0] for s in seeds]},
            "equal_runs": {"jobs_wall_saved_median": float(np.median(saved)), "jobs_wall_saved_per_seed": saved,
                           "regret_cost_mean": m, "regret_cost_interval_95": [lo, hi], "regret_cost_per_seed": cost,
                           "seeds_without_a_completed_run": len(seeds) - len(both),
                           "pruned_runs": sum(own[s]["pruned"] for s in seeds),
                           "pruned_winners": sum(own[s]["pruned_winners"] for s in seeds),
                           "pruned_share": float(np.mean([own[s]["pruned"] / own[s]["runs"] for s in seeds]))}}


def section_key(curves: str = "ordered", warmup: int | None = None) -> str:
    """Where a run of this part is stored in the benchmark's JSON: one section per script and warmup."""
    return "early_stopping" + ("" if curves == "ordered" else f"_{curves}") + ("_warmup" if warmup else "")


def target_prefix(curves: str = "ordered", warmup: int | None = None) -> str:
    """The section's targets' names start with this (experiments/_search_merged.MERGED)."""
    what = "" if curves == "ordered" else f", {curves} curves"
    return f"early stop{what}" + (f", --prune-warmup {warmup}:" if warmup else ":")


def run_early_stop(seeds, budget: int = 24, epoch_s: float = 0.2, extend: int = 2, log=print,
                   curves: str = "ordered", warmup: int | None = None) -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="cubic-early-stop-") as tmp:
        work = Path(tmp)
        (work / "space.yaml").write_text(json.dumps(space_doc()))
        for seed in seeds:
            for arm in ARMS:
                rows.append(campaign(arm, seed, budget if arm == "none" else extend * budget, epoch_s, work,
                                     curves, warmup))
                r, f = rows[-1], first_runs(rows[-1], budget)
                log(f"  early stop {arm} seed {seed}: {r['runs']} runs, first {budget}: {f['pruned']} pruned, "
                    f"epochs {f['epochs_run']}, jobs {f['jobs_wall_s']:.1f} s, final regret {f['final_regret']}; "
                    f"all: final regret {r['regret_so_far'][-1]}, campaign {r['campaign_wall_s']:.1f} s")
    by = {arm: {r["seed"]: r for r in rows if r["arm"] == arm} for arm in ARMS}
    return {"kind": "MEASURED on this machine (real CLI campaigns over a user script; its epochs are sleeps, its "
                    "losses mlp-tabular's formula)",
            "space": "mlp-tabular as a user script (972 configurations)", "objective": OBJECTIVE, "budget": budget,
            "script_curves": curves, "prune_warmup": warmup,
            "pruned_budget": extend * budget, "epoch_s": epoch_s, "epochs": EPOCHS, "seeds": list(seeds),
            "strategy": "cubic (the CLI's default)",
            "pruners": {"median": f"optuna MedianPruner(n_startup_trials=2, n_warmup_steps={warmup or 1})",
                        "halving": f"optuna SuccessiveHalvingPruner(min_resource={warmup or 'auto'!r}) (ASHA's rule)"},
            "campaigns": rows, "arms": {arm: compare_arm(by, arm, seeds, budget) for arm in ARMS[1:]},
            "curves": curve_agreement(curves),
            "note": (f"the unpruned campaigns run {budget} runs, the pruned ones {extend * budget}; 'equal_quality': "
                     "jobs' wall time until the pruned campaign first reaches the unpruned one's final relative "
                     "regret, against the unpruned campaign's (same seed); 'equal_runs': the pruned campaign's "
                     f"first {budget} runs (a campaign's first runs do not depend on its budget) against the "
                     "unpruned campaign, the regret cost paired by seed with its 95% t interval; each campaign's "
                     "whole wall time (CLI process) is in 'campaigns'")}


def curve_agreement(curves: str = "ordered") -> dict:
    """How well a curve's early epochs rank the grid's configurations by their final loss (Spearman,
    per epoch), over all of them and over the 100 best (where a search spends its late runs): near
    1, a pruner judging by an early epoch stops no configuration that would end best."""
    import itertools

    from scipy.stats import spearmanr

    params = space_doc()["parameters"]
    grid = [dict(zip([p["name"] for p in params], v)) for v in itertools.product(*(p["choices"] for p in params))]
    c = np.array([CURVES[curves](g) for g in grid])
    best = np.argsort(c[:, -1])[:100]
    return {"kind": "MODELLED (the script's formula over its configurations)", "configurations": len(grid),
            "spearman_epoch_vs_final": [round(float(spearmanr(c[:, e], c[:, -1]).statistic), 4)
                                        for e in range(c.shape[1])],
            "spearman_epoch_vs_final_best_100": [round(float(spearmanr(c[best, e], c[best, -1]).statistic), 4)
                                                 for e in range(c.shape[1])]}


def _why_not_equal(es: dict, pruned: int, winners: int) -> str:
    """What the figures say about a quality cost: whether the pruner stopped would-be winners."""
    agree = es.get("curves") or {}
    rho, best = agree.get("spearman_epoch_vs_final") or [], agree.get("spearman_epoch_vs_final_best_100") or []
    if not pruned:
        return ""
    if winners:
        return (f"; {winners} of the {pruned} pruned runs would have beaten its campaign's best completed run had "
                "it run to the end (the script's formula): the pruner stopped would-be winners")
    return (f"; none of the {pruned} pruned runs would have beaten its campaign's best completed run had it run "
            "to the end (the script's formula)"
            + (f", and epoch 1 ranks the configurations against the final epoch at Spearman {rho[0]:.3f}"
               if rho else "")
            + (f" (the 100 best at {best[0]:.3f})" if rho and best else "")
            + ": the pruners stopped no winner, so the cost is in what the search proposed (the likely why, not "
            "measured: it learns less from a stopped run, credited its curve's extrapolated value but never "
            "above the worst completed run, than from a completed run)")


def early_stop_targets(es: dict) -> dict:
    out, head = {}, target_prefix(es.get("script_curves", "ordered"), es.get("prune_warmup"))
    for arm, a in es["arms"].items():
        q, e = a["equal_quality"], a["equal_runs"]
        saved = q["jobs_wall_saved_median"]
        ok = saved is not None and saved >= MIN_SAVED
        out[f"{head} --prune {arm} saves >= {MIN_SAVED:.0%} of the jobs' wall time at equal final quality "
            "(median over seeds)"] = {
            "measured": saved, "target": MIN_SAVED, "met": bool(ok), "reached": q["reached"],
            "seeds": len(es["seeds"]), "per_seed": q["jobs_wall_saved_per_seed"],
            **({} if ok else {"reason": (
                f"the pruned campaigns reached the unpruned ones' final quality in {q['reached']} of "
                f"{len(es['seeds'])} seeds within {es['pruned_budget']} runs (saved per seed: "
                + ", ".join("never" if x is None else f"{x:+.0%}" for x in q["jobs_wall_saved_per_seed"])
                + "); the median over seeds counts a seed that never got there as no saving"
                + _why_not_equal(es, q.get("pruned_runs", 0), q.get("pruned_winners", 0)))})}
        s_runs = e["jobs_wall_saved_median"]
        out[f"{head} --prune {arm} saves >= {MIN_SAVED:.0%} of the jobs' wall time at an equal number of runs "
            "(median over seeds)"] = {
            "measured": s_runs, "target": MIN_SAVED, "met": bool(s_runs >= MIN_SAVED),
            "pruned_share": e["pruned_share"],
            **({} if s_runs >= MIN_SAVED else {"reason": (
                f"the pruner stopped {e['pruned_share']:.0%} of the runs; the epochs they skipped are "
                f"{s_runs:.0%} of the unpruned campaigns' job time")})}
        hi = e["regret_cost_interval_95"][1]
        equal = hi is not None and hi <= MAX_REGRET_COST
        out[f"{head} --prune {arm} final quality equal at an equal number of runs (upper 95% bound of the "
            f"paired regret cost <= {MAX_REGRET_COST})"] = {
            "measured": hi, "target": MAX_REGRET_COST, "met": bool(equal),
            "mean": e["regret_cost_mean"], "interval_95": e["regret_cost_interval_95"],
            **({} if equal else {"reason": "fewer than two seeds with a completed run in both arms" if hi is None else (
                f"paired cost {e['regret_cost_mean']:+.3f} [{e['regret_cost_interval_95'][0]:+.3f}, {hi:+.3f}] "
                f"in relative regret over {len(e['regret_cost_per_seed'])} seeds: "
                + ("the pruned campaigns end worse" if e["regret_cost_interval_95"][0] > 0 else
                   "not resolved at this many seeds")
                + _why_not_equal(es, e.get("pruned_runs", 0), e.get("pruned_winners", 0)))})}
    if any("pruning_note" in c for c in es.get("campaigns", ())):  # (runs before stop 41 printed no note)
        chk = note_check(es)
        share = chk["right"] / chk["of"] if chk["of"] else None
        ok = share is not None and share >= MIN_NOTE_RIGHT
        wrong = [f"--prune {r['arm']} seed {r['seed']}: " + ("warned" if r["warned"] else "did not warn")
                 + f", {r['pruned_winners']} would-be winners stopped" for r in chk["campaigns"] if not r["right"]]
        out[f"{head} the answer's note on the pruner is right (warns exactly when it stopped a would-be winner) "
            f"in >= {MIN_NOTE_RIGHT:.0%} of the pruned campaigns"] = {
            "measured": share, "target": MIN_NOTE_RIGHT, "met": bool(ok), "right": chk["right"], "of": chk["of"],
            **({} if ok else {"reason": "; ".join(wrong) or "no pruned campaign"})}
    return out
