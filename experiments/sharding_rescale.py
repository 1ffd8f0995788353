"""Should a plan whose compute check fails be re-planned with the model scaled to this machine?

`cubic shard plan` on cpu measures the plan's own ranks and warns when the cost model's lookup ms
are outside 0.8-1.25x the measured (sharding.estimate.compute_check); it re-plans at the measured
scale only when asked (`--rescale`, opt-in). This benchmark is the evidence for that choice. Per task
and interconnect regime (the sharding benchmark's small tasks and regimes,
experiments/sharding_benchmark.py), for each compute model:

1. plan with cubic's planner (the model as it is);
2. the compute check of that plan: its ranks measured here (3 repeats, as `shard plan` does), the
   model's scale = predicted / measured lookup;
3. re-plan with the model scaled by 1 / scale (``ScaledEstimator``: the same ranking, compute
   weighed against communication at this machine's measured scale);
4. both plans, and the heuristics', judged by the sharding benchmark's ground truth (each rank's
   compute MEASURED in min-of-rounds looks the check never saw, communication MODELLED by the
   independent plain network), in ``--looks`` looks; each cell's gap to its best heuristic is the
   mean over the looks.

Models: the packaged one (trained on an AMD EPYC) and ``--other-model`` (default: the Intel Xeon
model in experiments/data, ~7x off in scale on an EPYC). Each is named by where it was trained,
against THIS machine's fingerprint (sharding_benchmark.model_origin): on an EPYC the Xeon model is
the foreign one, on a Xeon the packaged model is. Target, per model: re-planning at the measured scale lowers
the mean gap by at least 1 point, resolved (the paired 95% interval's upper end below -1 point).
Met would be the case for re-planning; missed says the warning is the product.

    .venv/bin/python experiments/sharding_rescale.py [--quick] [--tasks 18] [--looks 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from cubic.core.spec import SpecError  # noqa: E402
from cubic.core.stats import mean_interval  # noqa: E402
from cubic.core.workloads import generate_tables  # noqa: E402
from experiments import sharding_benchmark as sb  # noqa: E402
from experiments._sharding_ground_truth import MinOfRounds, plan_sets  # noqa: E402
from experiments.common import png_path, run_context, write_result  # noqa: E402
from sharding.estimate import (CHECK_REPEATS, Estimator, LearnedEstimator, ScaledEstimator,  # noqa: E402
                               compute_check, measured_cost)
from sharding.registry import make_planner  # noqa: E402

NAME = "sharding_rescale"
OTHER = Path(__file__).resolve().parent / "data" / "sharding_cost_model_intel_xeon.json"
HELPS = -0.01  # re-planning must lower the mean gap to the best heuristic by >= 1 point, resolved


def plan_pair(tables, topo, est: Estimator, budget: float) -> dict:
    """The model's plan, its compute check, and the plan re-made at the check's measured scale."""
    def plan(e):
        return make_planner("cubic", seed=0, estimator=e, target="torchrec", time_budget_s=budget).plan(
            tables, topo, sb.BATCH)

    first = plan(est)
    check = compute_check(first.predicted, measured_cost(first))  # as `shard plan`'s check measures it
    return {"plan": first, "rescaled": plan(ScaledEstimator.at_check(est, check)), "ratio": check.ratio,
            "check_holds": check.holds, "spearman": check.spearman}


def run_task(i: int, models: dict, regs: dict, budget: float, looks: int) -> list[dict]:
    lo, hi = sb.FAMILIES[i % len(sb.FAMILIES)][1:]
    n = int(np.random.default_rng(2024 + i).integers(lo, hi + 1))
    tables = generate_tables(n, seed=1000 + i)  # as the sharding benchmark's small-i (it runs i < 9)
    base = sb.topology_for(tables, 4)
    plans, cells = {}, []
    for rname, (fields, _, _) in regs.items():
        topo = base.model_copy(update=fields)
        if topo.world_size % topo.ranks_per_node:
            topo = topo.model_copy(update={"ranks_per_node": topo.world_size})
        for h in sb.HEURISTICS:
            try:
                plans[(rname, h)] = make_planner(h, seed=0, estimator=models["packaged"], target="torchrec").plan(
                    tables, topo, sb.BATCH)
            except SpecError:  # memory-infeasible for this heuristic: not a candidate
                pass
        for mname, est in models.items():
            pair = plan_pair(tables, topo, est, budget)
            plans[(rname, mname)], plans[(rname, mname + "/rescaled")] = pair["plan"], pair["rescaled"]
            cells.append({"task": f"small-{i}", "tables": n, "regime": rname, "model": mname,
                          "ratio": pair["ratio"], "check_holds": pair["check_holds"], "spearman": pair["spearman"],
                          "same_plan": pair["plan"].shards == pair["rescaled"].shards})
    judged = {k: [] for k in plans}
    for _ in range(looks):  # each look a fresh meter over every plan's rank sets: the check's probe is not reused
        meter = MinOfRounds()
        meter.measure(plan_sets(plans.values()))
        for (rname, m), p in plans.items():
            judged[(rname, m)].append(sb.judge_in_regime(p, meter, regs, rname)["total_ms"])
    for c in cells:
        r, m = c["regime"], c["model"]
        gaps = {}
        for kind, key in (("as_is", m), ("rescaled", m + "/rescaled")):
            per_look = [mine / min(judged[(r, h)][k] for h in sb.HEURISTICS if (r, h) in judged) - 1
                        for k, mine in enumerate(judged[(r, key)])]
            gaps[kind] = float(np.mean(per_look))
            c[f"gap_{kind}_per_look"] = per_look
        c.update(gap_as_is=gaps["as_is"], gap_rescaled=gaps["rescaled"], gain=gaps["rescaled"] - gaps["as_is"])
    return cells


def model_origin(est: Estimator) -> str:
    """Where ``est``'s learned model was trained, against this machine (sharding_benchmark.model_origin)."""
    return sb.model_origin(getattr(getattr(est, "model", None), "meta_", None) or {})


def targets_of(cells: list[dict], models: dict) -> tuple[dict, dict]:
    summary, targets = {}, {}
    for m, est in models.items():
        mine = [c for c in cells if c["model"] == m]
        mean, lo, hi = mean_interval(c["gain"] for c in mine)
        origin = model_origin(est)
        summary[m] = {"trained": origin, "cells": len(mine),
                      "mean_gap_as_is": float(np.mean([c["gap_as_is"] for c in mine])),
                      "mean_gap_rescaled": float(np.mean([c["gap_rescaled"] for c in mine])),
                      "gain_mean": mean, "gain_ci95": [lo, hi],
                      "worst_gap_as_is": max(c["gap_as_is"] for c in mine),
                      "worst_gap_rescaled": max(c["gap_rescaled"] for c in mine),
                      "median_scale": float(np.median([c["ratio"] for c in mine])),
                      "same_plan_cells": sum(c["same_plan"] for c in mine)}
        met = bool(hi < HELPS)
        t = {"measured": mean, "ci95": [lo, hi], "target": HELPS, "met": met, "model": origin,
             "label": "MEASURED compute (fresh looks) + MODELLED independent communication"}
        if not met:
            t["reason"] = (f"re-planning at the measured scale moved the mean gap to the best heuristic by {mean:+.1%} "
                           f"[{lo:+.1%}, {hi:+.1%}] over {len(mine)} task-regime cells: not a resolved gain of 1 point; "
                           "`shard plan` warns about the scale and keeps the model's plan (re-plans only with "
                           "--rescale)")
        # the name leaves out where the model was trained (its field says): a look on another machine
        # matches it by name (experiments.common.against_look) and says whether its verdict moved
        targets[f"{m} model: re-planning at the compute check's measured scale lowers the mean gap by >= 1 point"] = t
    return summary, targets


def plot(cells: list[dict], models: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 5), squeeze=False)
    for ax, m in zip(axes[0], models):
        mine = [c for c in cells if c["model"] == m]
        for r in dict.fromkeys(c["regime"] for c in mine):
            xs = [100 * c["gap_as_is"] for c in mine if c["regime"] == r]
            ys = [100 * c["gap_rescaled"] for c in mine if c["regime"] == r]
            ax.scatter(xs, ys, label=r, s=25)
        lim = [min(100 * min(c["gap_as_is"], c["gap_rescaled"]) for c in mine) - 2,
               max(100 * max(c["gap_as_is"], c["gap_rescaled"]) for c in mine) + 2]
        ax.plot(lim, lim, "k--", lw=0.8, label="no change")
        ax.set_xlabel("gap to best heuristic, model as is (%; measured compute, modelled comm)")
        ax.set_ylabel("gap, re-planned at the measured scale (%)")
        scale = np.median([c["ratio"] for c in mine])
        ax.set_title(f"{m} model, {model_origin(models[m])} (median scale {scale:.2f}x)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 task, 1 look, 0.3 s budget")
    ap.add_argument("--tasks", type=int, default=18, help="small tasks small-0 ... (the sharding benchmark runs the first 9)")
    ap.add_argument("--looks", type=int, default=2, help="fresh min-of-rounds looks judging every plan")
    ap.add_argument("--budget", type=float, default=2.0, help="cubic's time budget per plan, s")
    ap.add_argument("--other-model", default=str(OTHER),
                    help="a second compute model, named by where it was trained ('' for none)")
    args = ap.parse_args(argv)
    if args.tasks < 1 or args.looks < 1:
        ap.error(f"--tasks {args.tasks} --looks {args.looks}: each at least 1")
    n_tasks, looks, budget = (1, 1, 0.3) if args.quick else (args.tasks, args.looks, args.budget)
    ctx = run_context("mixed")
    models: dict[str, Estimator] = {"packaged": LearnedEstimator()}
    if args.other_model:
        models["other"] = sb.own_estimator(args.other_model)
    regs = sb.regimes()
    t0 = time.perf_counter()
    cells = []
    for i in range(n_tasks):
        cells += run_task(i, models, regs, budget, looks)
        print(f"[{time.perf_counter() - t0:4.0f}s] small-{i}: " + "; ".join(
            f"{c['regime']} {c['model']} {c['gap_as_is']:+.1%} -> {c['gap_rescaled']:+.1%} (scale {c['ratio']:.2f})"
            for c in cells if c["task"] == f"small-{i}"), flush=True)
    summary, targets = targets_of(cells, models)
    name = NAME + ("_quick" if args.quick else "")
    write_result(name, {
        **ctx, "what": __doc__.split("\n\n")[0],
        "protocol": {"tasks": n_tasks, "looks": looks, "budget_s": budget, "check_repeats": CHECK_REPEATS,
                     "regimes": {r: v[2] for r, v in regs.items()}},
        "models": {m: e.describe() for m, e in models.items()},
        "labels": {"gap": "judged cost / best memory-feasible heuristic's - 1, mean over the looks: MEASURED compute "
                          "(FBGEMM CPU TBE, min of rounds, fresh per look) + MODELLED communication (independent "
                          "plain network)", "ratio": "the compute check's predicted / measured lookup (MEASURED)"},
        "load": {"loadavg_1m_at_start": ctx["loadavg_1m_at_start"], "loadavg_1m_at_end": os.getloadavg()[0]},
        "summary": summary, "targets": targets, "cells": cells, "runtime_s": time.perf_counter() - t0})
    plot(cells, models, png_path(name))
    for k, t in targets.items():
        print(f"  [{'met' if t['met'] else 'MISSED'}] {k}: {t['measured']:+.2%} [{t['ci95'][0]:+.2%}, {t['ci95'][1]:+.2%}]")
    print(f"wrote results/{name}.json and results/{name}.png in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
