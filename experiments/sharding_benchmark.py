"""Sharding benchmark: cubic's learned-cost search vs five heuristics and TorchRec's planner.

Every plan is scored by the same ground truth (sharding.estimate.plan_cost with the measured
estimator): per rank, forward+backward embedding compute MEASURED on FBGEMM's CPU TBE (single
thread, thread CPU time, median of repeats, shared cache so identical shard sets get identical
figures) + all-to-all/sync time MODELLED by the alpha-beta model calibrated on real gloo
all-to-alls on this machine (sharding/data/comm_calibration.json). Plan cost = max over ranks.

Tasks (NeuroShard's format: a set of tables and a number of ranks):
- ``--tasks`` (default 50) seeded small tasks: 10-60 tables from cubic.core.workloads.generate_tables
  (seed 1000+i, unseen by the cost model, trained on seeds >= 100000) on 4 ranks, grouped into
  three families by table count (10-26, 27-43, 44-60);
- a multi-node family (``--multi-node-tasks``, default 10): 60-200 tables on 4 nodes x 8 ranks; the
  gloo calibration is the intra-node rate and a byte between nodes costs the topology's intra/inter
  bandwidth ratio (9x) more (modelled: there is no multi-node calibration);
- large tasks: 512 tables on 64 ranks and 856 tables on 128 ranks (fewer repeats per rank, per-rank
  batch 4096 / ranks; TorchRec's planner runs in a child process capped at 180 s wall).
Every planner plans with ``target="torchrec"``: each plan scored is one TorchRec executes as planned.
Targets: per family, cubic's mean cost >= 15% below the best heuristic's and below TorchRec's; no
task > 3% worse than its best heuristic; 856 tables on 128 ranks planned in < 5 s.
A sharded piece's kernel runs over the group's whole batch (ranks x per-rank batch, 2048 on the
small tasks), as its owner pools the ids every rank sent it.
Memory per rank = max(1.5 x total / ranks, 1.05 x largest table, 1 GB) (weights + row-wise
Adagrad state): the largest table always fits; the limit binds on tasks with multi-GB tables.

    .venv/bin/python experiments/sharding_benchmark.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from cubic.core.spec import SpecError, Topology  # noqa: E402
from cubic.core.workloads import generate_tables  # noqa: E402
from experiments.common import png_path, run_context, write_result  # noqa: E402
from cost_models.comm import CALIBRATION_PATH, CommModel  # noqa: E402
from sharding.estimate import LearnedEstimator, MeasuredEstimator, plan_cost, table_lower_bound  # noqa: E402
from sharding.measure import MeasurementCache  # noqa: E402
from sharding.registry import make_planner
from sharding.torchrec_adapter import torchrec_available  # noqa: E402
from sharding.types import Storage  # noqa: E402

HEURISTICS = ("random", "dim_greedy", "lookup_greedy", "size_greedy", "size_lookup_greedy")
BATCH = 512
MEMORY_FLOOR = 1e9  # TorchRec reserves fixed per-rank storage (inputs, 15%): below ~1 GB it plans nothing
LARGE_GLOBAL_BATCH = 4096  # large tasks: per-rank batch 4096 / ranks, so a piece's kernel sees 4096 examples
TORCHREC_TIMEOUT_S = 180.0  # large tasks: TorchRec's planner runs in a child process with this wall cap
TARGET_GAP = -0.15  # the target: mean cost >= 15% below the best heuristic
FAMILIES = (("10-26 tables", 10, 26), ("27-43 tables", 27, 43), ("44-60 tables", 44, 60))
MULTI_NODE = (4, 8)  # nodes x ranks per node of the multi-node family (inter-node bytes cost 9x, modelled)


def topology_for(tables, world: int, ranks_per_node: int | None = None) -> Topology:
    sizes = [Storage.of(t.rows, t.dim).total for t in tables]
    mem = max(1.5 * sum(sizes) / world, 1.05 * max(sizes), MEMORY_FLOOR)
    return Topology(world_size=world, ranks_per_node=ranks_per_node or world, memory_per_rank_gb=mem / 1e9,
                    device="cpu")


def _torchrec_child(tables_json, topo_json, batch, conn):
    from cubic.core.spec import Table
    from sharding.torchrec_adapter import TorchRecPlanner

    try:
        tables = [Table.model_validate(t) for t in json.loads(tables_json)]
        t0 = time.perf_counter()
        plan = TorchRecPlanner().plan(tables, Topology.model_validate_json(topo_json), batch)
        conn.send(("ok", plan.model_dump_json(), time.perf_counter() - t0))
    except Exception as e:  # reported to the parent as data
        conn.send(("failed", f"{type(e).__name__}: {e}", 0.0))


def torchrec_with_timeout(tables, topo, batch, est, timeout_s):
    """TorchRec's planner in a child process, so a run that takes too long is data, not a hang."""
    import multiprocessing as mp

    from sharding.planners import with_prediction
    from sharding.types import Plan

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_torchrec_child, args=(json.dumps([t.model_dump(mode="json") for t in tables]),
                                                     topo.model_dump_json(), batch, child))
    proc.start()
    try:
        if not parent.poll(timeout_s):
            raise SpecError(f"TorchRec's planner did not finish within {timeout_s:.0f} s (wall, shared machine)")
        status, body, secs = parent.recv()
    finally:
        if proc.is_alive():
            proc.terminate()
        proc.join(5)
    if status != "ok":
        raise SpecError(body)
    plan = Plan.model_validate_json(body).model_copy(update={"planning_time_s": secs})
    return with_prediction(plan, est)


def run_task(name, tables, world, methods, est, cache, budget, batch=BATCH, lb=True, torchrec_timeout_s=None,
             ranks_per_node=None):
    topo = topology_for(tables, world, ranks_per_node)
    comm = CommModel.from_topology(topo)  # one node: the gloo calibration; several: inter-node scaled
    out = {"task": name, "tables": len(tables), "ranks": world, "ranks_per_node": topo.ranks_per_node,
           "memory_per_rank_gb": topo.memory_per_rank_gb, "batch_per_rank": batch, "comm": comm.source,
           "methods": {}}
    meas = MeasuredEstimator(cache)
    for m in methods:
        kw = {"time_budget_s": budget} if m == "cubic" else {}
        t0 = time.perf_counter()
        try:
            if m == "torchrec" and torchrec_timeout_s:
                plan = torchrec_with_timeout(tables, topo, batch, est, torchrec_timeout_s)
            else:
                # every plan must run in TorchRec as planned (what `shard export` accepts)
                plan = make_planner(m, seed=0, estimator=est, target="torchrec", **kw).plan(tables, topo, batch)
        except SpecError as e:  # a planner that finds no plan is data, not a crash
            out["methods"][m] = {"failed": str(e), "planning_s": time.perf_counter() - t0}
            continue
        plan_s = plan.planning_time_s if m == "torchrec" and torchrec_timeout_s else time.perf_counter() - t0
        cost = plan_cost(plan, meas, comm)
        out["methods"][m] = {
            "measured_ms": cost.max_ms, "predicted_ms": plan.predicted.max_ms, "planning_s": plan_s,
            "measured_compute_ms": [r.compute_ms for r in cost.per_rank],
            "predicted_compute_ms": [r.compute_ms for r in plan.predicted.per_rank],
            "rank_features_n_shards": [len(ss) for ss in plan.rank_shards()],
            "comm_ms_max": max(r.comm_ms for r in cost.per_rank),
            "sharding_types": sorted({s.sharding_type for s in plan.shards}), "notes": plan.notes,
        }
    if lb:
        out["lower_bound_ms"] = table_lower_bound(tables, world, batch, meas, comm)
    return out


def best_heuristic(t) -> str | None:
    """One task: the heuristic with the lowest measured cost (None when none was measured)."""
    hs = [m for m in HEURISTICS if "measured_ms" in t["methods"].get(m, {})]
    return min(hs, key=lambda m: t["methods"][m]["measured_ms"]) if hs else None


def cubic_vs_best_heuristic(t) -> float | None:
    """One task: cubic's measured cost over the best heuristic's, minus 1."""
    c = t["methods"].get("cubic", {}).get("measured_ms")
    h = best_heuristic(t)
    return c / t["methods"][h]["measured_ms"] - 1 if c and h else None


def headroom(cubic_ms: float, heuristic_ms: float, heuristic: str, lower_bound_ms: float, what: str = "a cost") -> str:
    """Why the 15% target was missed, against the lower-bound estimate (sharding.estimate.table_lower_bound:
    all tables fused in chunks, measured, over the ranks, plus a balanced all-to-all)."""
    need = (1 + TARGET_GAP) * heuristic_ms / lower_bound_ms - 1
    return (f"headroom: meeting it needs {what} {need:+.1%} against the lower-bound estimate "
            f"(sharding.estimate.table_lower_bound); cubic's plans are at "
            f"{cubic_ms / lower_bound_ms - 1:+.1%}, the best heuristic's ({heuristic}) at "
            f"{heuristic_ms / lower_bound_ms - 1:+.1%}. The estimate is approximate, not a proof (cache effects make a "
            "rank's share of the tables cheaper than its share of the whole), but a plan far below it is not expected")


def misranked(t) -> str:
    """Why cubic lost a task to a heuristic: what the cost model predicted for both plans against what
    was measured (cubic picks by prediction: a loss it predicted as a win is a cost-model error)."""
    c = t["methods"]["cubic"]
    h = best_heuristic(t)
    hm = t["methods"][h]
    ratios = [a / b for a, b in zip(c.get("measured_compute_ms", []), c.get("predicted_compute_ms", [])) if b > 0]
    return (f"{t['task']}: cubic's plan was predicted {c['predicted_ms']:.2f} ms against {h}'s "
            f"{hm['predicted_ms']:.2f} ms, measured {c['measured_ms']:.2f} against {hm['measured_ms']:.2f}; "
            f"measured/predicted compute of cubic's ranks {', '.join(f'{r:.2f}' for r in ratios)} "
            "(a cost-model error on this task, or a rank measured while the machine was busy)")


def summarise(families, methods):
    """Per family [(name, tasks)]: mean measured cost per method (over the tasks it planned), failures,
    and cubic's paired gaps (on the tasks both planned)."""
    fam = {}
    for fname, ts in families:
        if not ts:
            continue
        means, failures = {}, {}
        for m in methods:
            vals = [t["methods"][m]["measured_ms"] for t in ts if "measured_ms" in t["methods"].get(m, {})]
            means[m] = float(np.mean(vals)) if vals else None
            failures[m] = len(ts) - len(vals)

        def paired(other):
            both = [t for t in ts if "measured_ms" in t["methods"].get(other, {})
                    and "measured_ms" in t["methods"].get("cubic", {})]
            if not both:
                return None
            c = np.mean([t["methods"]["cubic"]["measured_ms"] for t in both])
            o = np.mean([t["methods"][other]["measured_ms"] for t in both])
            return float(c / o - 1.0)

        heur = {m: v for m, v in means.items() if m in HEURISTICS and v is not None and failures[m] == 0}
        best_h = min(heur, key=heur.get) if heur else None
        fam[fname] = {"tasks": len(ts), "mean_measured_ms": means, "failures": failures, "best_heuristic": best_h,
                      "cubic_vs_best_heuristic": paired(best_h) if best_h else None,
                      "cubic_vs_torchrec": paired("torchrec") if "torchrec" in methods else None,
                      "torchrec_planned_tasks": len(ts) - failures.get("torchrec", len(ts))}
        # headroom: how far above the measured lower bound a plan may be and still meet the 15% target
        lb = float(np.mean([t["lower_bound_ms"] for t in ts]))
        fam[fname]["mean_lower_bound_ms"] = lb
        if best_h and means.get("cubic") is not None:
            fam[fname]["over_lower_bound"] = {"cubic": means["cubic"] / lb - 1, best_h: means[best_h] / lb - 1,
                                              "the 15% target": (1 + TARGET_GAP) * means[best_h] / lb - 1}
    return fam


def model_accuracy(tasks):
    from scipy.stats import spearmanr

    p, y = [], []
    for t in tasks:
        for m, r in t["methods"].items():
            if "measured_compute_ms" not in r:
                continue
            for a, b in zip(r["predicted_compute_ms"], r["measured_compute_ms"]):
                if b > 0:
                    p.append(a)
                    y.append(b)
    p, y = np.array(p), np.array(y)
    # identical shard sets appear under several methods: score each distinct rank once
    _, idx = np.unique(np.round(np.stack([p, y], 1), 9), axis=0, return_index=True)
    p, y = p[idx], y[idx]
    return {"ranks": len(y), "spearman": float(spearmanr(p, y)[0]), "mape": float(np.mean(np.abs(p - y) / y)),
            "median_ape": float(np.median(np.abs(p - y) / y)),
            "bias_mean_pred_over_measured": float(np.mean(p / y))}, p, y


def plot(fam, acc_p, acc_y, large, methods, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(17, 5))
    names = list(fam)
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        vals = [fam[f]["mean_measured_ms"].get(m) or 0 for f in names]
        ax[0].bar(np.arange(len(names)) + j * width, vals, width, label=m)
    ax[0].set_xticks(np.arange(len(names)) + 0.4 - width / 2, names)
    ax[0].set_ylabel("mean plan cost, ms (measured compute + modelled comm)")
    ax[0].set_title("4 ranks: mean cost per task family")
    ax[0].legend(fontsize=7)
    for t in large:
        ms = [m for m in methods if "measured_ms" in t["methods"].get(m, {})]
        ax[1].bar([f"{m}\n{t['tables']}/{t['ranks']}" for m in ms], [t["methods"][m]["measured_ms"] for m in ms])
    ax[1].tick_params(axis="x", labelsize=6, rotation=60)
    ax[1].set_title("large tasks: plan cost, ms (measured + modelled)")
    ax[2].scatter(acc_y, acc_p, s=6, alpha=0.5)
    lim = [0, max(acc_y.max(), acc_p.max()) * 1.05]
    ax[2].plot(lim, lim, "k--", lw=1)
    ax[2].set_xlabel("measured rank compute, ms")
    ax[2].set_ylabel("predicted (learned model), ms")
    ax[2].set_title("cost model on unseen tables (modelled vs measured)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def analyse(tasks, multi, large, methods):
    """Families, cost-model accuracy, the gap to the lower bound and the targets: a function of the
    recorded tasks only (``--retarget`` recomputes them from the JSON)."""
    families = [(f, [t for t in tasks if lo <= t["tables"] <= hi]) for f, lo, hi in FAMILIES]
    families.append((f"multi-node {MULTI_NODE[0]}x{MULTI_NODE[1]} ranks", multi))
    fam = summarise(families, methods)
    acc, p, y = model_accuracy(tasks)
    gap_lb = [t["methods"]["cubic"]["measured_ms"] / t["lower_bound_ms"] - 1 for t in tasks + multi + large
              if "measured_ms" in t["methods"].get("cubic", {})]
    big = next((t for t in large if t["tables"] == 856), None)
    targets = {}
    for f, v in fam.items():
        g = v["cubic_vs_best_heuristic"]
        met = g is not None and g <= TARGET_GAP
        h = v["best_heuristic"]
        why = ({"reason_if_missed": headroom(v["mean_measured_ms"]["cubic"], v["mean_measured_ms"][h], h,
                                             v["mean_lower_bound_ms"], what="a mean cost")}
               if "over_lower_bound" in v and not met else {})
        targets[f"mean cost >= 15% below the best heuristic ({f})"] = {
            "measured": g, "target": TARGET_GAP, "met": met, "by": None if g is None else g - TARGET_GAP, **why}
        if v["cubic_vs_torchrec"] is not None:
            targets[f"cubic below TorchRec ({f})"] = {"measured": v["cubic_vs_torchrec"], "target": 0.0,
                                                       "met": v["cubic_vs_torchrec"] < 0, "by": v["cubic_vs_torchrec"]}
    for t in large:
        g = cubic_vs_best_heuristic(t)
        tr = t["methods"].get("torchrec", {}).get("measured_ms")
        c = t["methods"]["cubic"].get("measured_ms")
        if g is not None:
            h = best_heuristic(t)
            targets[f"cost >= 15% below the best heuristic ({t['task']})"] = {
                "measured": g, "target": TARGET_GAP, "met": g <= TARGET_GAP, "by": g - TARGET_GAP,
                **({} if g <= TARGET_GAP else
                   {"reason_if_missed": headroom(c, t["methods"][h]["measured_ms"], h, t["lower_bound_ms"])})}
        if c and tr:
            targets[f"cubic below TorchRec ({t['task']})"] = {"measured": c / tr - 1, "target": 0.0, "met": c < tr,
                                                              "by": c / tr - 1}
    per_task = [(t["task"], cubic_vs_best_heuristic(t)) for t in tasks + multi + large]
    per_task = [(n, g) for n, g in per_task if g is not None]
    worst = max(per_task, key=lambda x: x[1]) if per_task else (None, None)
    targets["no task > 3% worse than its best heuristic"] = {
        "measured": worst[1], "worst_task": worst[0], "target": 0.03,
        "met": worst[1] is not None and worst[1] <= 0.03, "by": None if worst[1] is None else worst[1] - 0.03,
        "tasks_over_3pct": sorted(n for n, g in per_task if g > 0.03)}
    if worst[1] is not None and worst[1] > 0.03:
        targets["no task > 3% worse than its best heuristic"]["reason_if_missed"] = misranked(
            next(t for t in tasks + multi + large if t["task"] == worst[0]))
    targets["within 10% of the lower bound on average"] = {
        "measured": float(np.mean(gap_lb)), "target": 0.10, "met": float(np.mean(gap_lb)) <= 0.10,
        "by": float(np.mean(gap_lb)) - 0.10}
    if big:
        ps = big["methods"]["cubic"].get("planning_s")
        targets["planning 856 tables on 128 ranks < 5 s"] = {"measured": ps, "target": 5.0,
                                                             "met": ps is not None and ps < 5.0,
                                                             "by": None if ps is None else ps - 5.0}
    targets["cost model Spearman >= 0.95 on unseen tables"] = {"measured": acc["spearman"], "target": 0.95,
                                                               "met": acc["spearman"] >= 0.95,
                                                               "by": acc["spearman"] - 0.95}
    targets["cost model MAPE <= 15% on unseen tables"] = {"measured": acc["mape"], "target": 0.15,
                                                          "met": acc["mape"] <= 0.15, "by": acc["mape"] - 0.15}
    return fam, acc, p, y, gap_lb, targets


def retarget(name: str) -> int:
    """The analysis and targets of a recorded run, recomputed by this code; the measurements and the
    run's context stay as they were."""
    from experiments.common import RESULTS

    doc = json.loads((RESULTS / f"{name}.json").read_text())
    fam, acc, p, y, gap_lb, targets = analyse(doc["tasks"], doc["multi_node_tasks"], doc["large_tasks"],
                                              doc["methods"])
    doc.update({"families": fam, "cost_model_accuracy": acc, "lower_bound_gap_cubic_mean": float(np.mean(gap_lb)),
                "targets": targets})
    write_result(name, doc)  # the recorded finished_at and load stay
    plot(fam, p, y, doc["large_tasks"], doc["methods"], png_path(name))
    for k, v in targets.items():
        print(f"  [{'met' if v['met'] else 'MISSED'}] {k}: {v['measured']}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 small tasks, one 200-table/16-rank task")
    ap.add_argument("--tasks", type=int, default=50)
    ap.add_argument("--multi-node-tasks", type=int, default=10, help="tasks on 4 nodes x 8 ranks")
    ap.add_argument("--retarget", action="store_true",
                    help="recompute the analysis and targets from the recorded tasks in the JSON (measure nothing)")
    args = ap.parse_args(argv)
    if args.retarget:
        return retarget("sharding_benchmark" + ("_quick" if args.quick else ""))
    n_tasks = 4 if args.quick else args.tasks
    n_multi = 1 if args.quick else args.multi_node_tasks
    large_specs = [(200, 16)] if args.quick else [(512, 64), (856, 128)]
    ctx = run_context("mixed")
    est = LearnedEstimator()
    comm = CommModel.calibrated()  # recorded in the protocol; each task uses CommModel.from_topology
    methods = ["cubic"] + (["torchrec"] if torchrec_available() else []) + list(HEURISTICS)
    t_start = time.perf_counter()
    cache = MeasurementCache(repeats=3, warmup=1)  # median of 3: the 2-core machine is shared; 50 tasks must fit
    tasks = []
    rng = np.random.default_rng(2024)
    for i in range(n_tasks):
        n = int(rng.integers(10, 61))
        tables = generate_tables(n, seed=1000 + i)
        t = run_task(f"small-{i}", tables, 4, methods, est, cache, budget=2.0)
        t["loadavg_1m"] = os.getloadavg()[0]
        tasks.append(t)
        ms = {m: round(r["measured_ms"], 2) for m, r in t["methods"].items() if "measured_ms" in r}
        print(f"[{time.perf_counter() - t_start:6.0f}s] task {i:2d} ({n} tables): {ms} lb {t['lower_bound_ms']:.2f}",
              flush=True)
    multi = []
    for i in range(n_multi):
        n = 40 if args.quick else int(rng.integers(60, 201))
        tables = generate_tables(n, seed=3000 + i)
        t = run_task(f"multi-node-{i}", tables, MULTI_NODE[0] * MULTI_NODE[1], methods, est, cache, budget=2.0,
                     batch=LARGE_GLOBAL_BATCH // (MULTI_NODE[0] * MULTI_NODE[1]), ranks_per_node=MULTI_NODE[1],
                     torchrec_timeout_s=TORCHREC_TIMEOUT_S)
        t["loadavg_1m"] = os.getloadavg()[0]
        multi.append(t)
        ms = {m: round(r["measured_ms"], 2) for m, r in t["methods"].items() if "measured_ms" in r}
        print(f"[{time.perf_counter() - t_start:6.0f}s] multi-node task {i} ({n} tables, {MULTI_NODE[0]}x{MULTI_NODE[1]} "
              f"ranks): {ms} lb {t['lower_bound_ms']:.2f}", flush=True)
    large_cache = MeasurementCache(repeats=2, warmup=1)  # fewer repeats: 64-128 ranks x 7 methods
    large = []
    for n, w in large_specs:
        tables = generate_tables(n, seed=5000 + n)
        t = run_task(f"large-{n}x{w}", tables, w, methods, est, large_cache, budget=3.0,
                     batch=LARGE_GLOBAL_BATCH // w, torchrec_timeout_s=TORCHREC_TIMEOUT_S)
        t["loadavg_1m"] = os.getloadavg()[0]
        large.append(t)
        ms = {m: (round(r["measured_ms"], 1), round(r["planning_s"], 2)) for m, r in t["methods"].items()
              if "measured_ms" in r}
        print(f"[{time.perf_counter() - t_start:6.0f}s] large {n} tables / {w} ranks: (ms, planning s) {ms} "
              f"lb {t['lower_bound_ms']:.1f}", flush=True)
    fam, acc, p, y, gap_lb, targets = analyse(tasks, multi, large, methods)
    payload = {
        **ctx,
        "what": ("plan cost per method: measured FBGEMM CPU TBE compute (single thread, thread CPU time, median "
                 "of repeats) + modelled all-to-all (alpha-beta, calibrated on gloo loopback) per rank, max over "
                 "ranks; lower bound per sharding.estimate.table_lower_bound (measured); cost model accuracy "
                 "= predicted vs measured compute of every distinct rank of every small-task plan"),
        "labels": {"plan cost": "mixed: measured compute + modelled comm", "planning time": "measured",
                   "cost model accuracy": "modelled vs measured", "lower bound": "measured compute + modelled comm"},
        "protocol": {"batch_per_rank": BATCH, "small_repeats": cache.repeats, "small_warmup": cache.warmup,
                     "large_repeats": large_cache.repeats, "large_warmup": large_cache.warmup,
                     "large_note": ("large tasks: every rank measured, with 2 repeats (median) after 1 warmup; per-rank "
                                    "batch 4096 / ranks (global batch 4096) to keep 128-rank kernels measurable"),
                     "clock": "thread CPU time (the machine is shared; wall time is preempted)",
                     "comm_calibration": str(CALIBRATION_PATH.name), "comm_constants": comm.__dict__,
                     "cost_model": est.model.meta_ if hasattr(est.model, "meta_") else {},
                     "cubic_time_budget_s": {"small": 2.0, "large": 3.0}, "quick": args.quick,
                     "torchrec_timeout_s_large": TORCHREC_TIMEOUT_S,
                     "memory_rule": "max(1.5 x total / ranks, 1.05 x largest table, 1 GB)"},
        "methods": methods,
        "families": fam,
        "multi_node_tasks": multi,
        "large_tasks": large,
        "cost_model_accuracy": acc,
        "lower_bound_gap_cubic_mean": float(np.mean(gap_lb)),
        "targets": targets,
        "cache": {"small_hits": cache.hits, "small_measurements": cache.misses,
                  "large_hits": large_cache.hits, "large_measurements": large_cache.misses},
        "tasks": tasks,
        "runtime_s": time.perf_counter() - t_start,
    }
    name = "sharding_benchmark" + ("_quick" if args.quick else "")
    path = write_result(name, payload)
    plot(fam, p, y, large, methods, png_path(name))
    print("\nfamilies (mean plan cost, ms; measured compute + modelled comm):")
    for f, v in fam.items():
        cells = ", ".join(f"{m} {x:.2f}" for m, x in v["mean_measured_ms"].items() if x is not None)
        tr = f", vs torchrec {v['cubic_vs_torchrec']:+.1%}" if v["cubic_vs_torchrec"] is not None else ""
        print(f"  {f}: {cells}; cubic vs best heuristic ({v['best_heuristic']}) {v['cubic_vs_best_heuristic']:+.1%}{tr}")
    print(f"cost model on unseen tables (modelled vs measured): Spearman {acc['spearman']:.3f}, MAPE {acc['mape']:.1%} "
          f"over {acc['ranks']} ranks")
    print(f"cubic vs lower bound (measured): {np.mean(gap_lb):+.1%} on average")
    for k, v in targets.items():
        print(f"  [{'met' if v['met'] else 'MISSED'}] {k}: {v['measured']}")
    print(f"wrote {path} and {png_path(name)} in {payload['runtime_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
