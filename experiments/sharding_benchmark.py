"""Sharding benchmark: cubic's planner vs five heuristics and TorchRec's planner, under several
interconnect regimes, each planner TOLD the regime's network, each plan JUDGED by a ground truth
the planners did not optimise.

Ground truth of a plan (per task, per regime):
- compute: each rank's shard set MEASURED on FBGEMM's CPU TBE (single thread, thread CPU time);
  every distinct rank set of every method and regime of a task is measured in ``ROUNDS``
  interleaved rounds and the minimum kept (the 2-core machine is shared: contention only inflates
  a measurement, and interleaving spreads it over the methods); then ``RELOOKS`` fresh looks at the
  same plans (``--relooks``), and every target is judged on the first look and on the mean over all
  looks, met only when both meet it (the worst task by its mean gap: one look's maximum over 36 noisy
  cells is biased up, and a miss or a pass that a re-measurement does not repeat is not a finding);
- communication: experiments/_sharding_ground_truth.py, written apart from cost_models/comm.py: a
  plain bandwidth + latency network with a per-message overhead; each all-to-all is synchronous
  (it ends when its slowest rank does, per-rank max(sent, received)); three all-to-alls a step.
  The planners optimise cost_models.comm's per-rank additive form (and, in the gloo regime, its
  calibrated constants); the judge adds per-message overheads they were not told of.
  Step = max rank compute + the collectives (MODELLED, by the independent model).

Regimes (``REGIMES``): the packaged gloo calibration (cost_models/data/comm_calibration.json: the
planners are told that file, not a user's, and the JSON says whether it was measured on this
machine), a plain 10 GB/s network, and a GPU-like topology of 8 ranks per node (NVLink-class
200 GB/s inside a node, NIC-class 12.5 GB/s between nodes). The learned compute model is the shipped
one; the JSON says whether it was trained on a machine of this fingerprint and, when not, every missed target's
reason says so. ``--own-model PATH`` adds the second look at such a miss: the same planner
(``cubic-own-model``) with a compute model trained on a machine of this fingerprint (`cubic shard collect && cubic
shard train --out PATH`), planned and judged on the same tasks and measured rank sets, its targets
named "second look, ...", and each missed target of the shipped model says what it measured. Given a
model trained on ANOTHER machine, the same run is a cross-check (its targets named "cross-check,
compute model trained on another machine (CPU): ..."): where the shipped model is this machine's,
it shows the other side of the same question.

Tasks: small families of 4 ranks (10-26, 27-43, 44-60 tables from cubic.core.workloads.
generate_tables, seeds 1000+i, unseen by the cost model) and a multi-node family (60-120 tables on
2 nodes x 8 ranks). Every planner plans with ``target="torchrec"``. Memory per rank =
max(1.5 x total / ranks, 1.05 x largest table, 1 GB).

Targets per regime: on every family, cubic's mean cost >= 10% below the best memory-feasible
heuristic's; no task more than 3% worse than its best heuristic; below TorchRec's planner.

    .venv/bin/python experiments/sharding_benchmark.py [--quick] [--own-model PATH]
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
from cubic.core.stats import mean_interval  # noqa: E402
from experiments.common import (calibration_origin, png_path, run_context,  # noqa: E402
                                run_of, with_other_machines, write_result)
from experiments._sharding_ground_truth import ROUNDS, MinOfRounds, PlainNetwork, judge, plan_sets  # noqa: E402
from cost_models.comm import CALIBRATION_PATH, CommModel  # noqa: E402
from sharding.estimate import SCALE_TOLERANCE, LearnedEstimator, machine_mismatch  # noqa: E402
from sharding.registry import make_planner  # noqa: E402
from sharding.torchrec_adapter import torchrec_available  # noqa: E402
from sharding.types import Storage  # noqa: E402

HEURISTICS = ("random", "dim_greedy", "lookup_greedy", "size_greedy", "size_lookup_greedy")
BATCH = 512
MEMORY_FLOOR = 1e9  # TorchRec reserves fixed per-rank storage (inputs, 15%): below ~1 GB it plans nothing
TORCHREC_TIMEOUT_S = 180.0  # TorchRec's planner runs in a child process with this wall cap
TARGET_GAP = -0.10  # the target: mean cost >= 10% below the best heuristic, per family and regime
FAMILIES = (("10-26 tables", 10, 26), ("27-43 tables", 27, 43), ("44-60 tables", 44, 60))
MULTI_NODE = (2, 8)  # nodes x ranks per node of the multi-node family
MULTI_BATCH = 128  # per-rank batch of the multi-node family (a piece's kernel sees 16 x 128 examples)
RELOOKS = 3  # fresh re-measurements of every plan after the first look (a worst task must survive them)
WORST = "no task > 3% worse than its best heuristic"  # the per-task target's name, after the regime's
# cubic's planner with a compute model trained on a machine of this fingerprint (--own-model): the second look at
# whether a miss is the shipped model's machine or the planner
OWN = "cubic-own-model"
OWN_PREFIX = "second look, compute model trained on a machine of this fingerprint: "


def regimes() -> dict:
    """name -> (the Topology fields the planners are told, the independent judge's network, how)."""
    where = calibration_origin(CALIBRATION_PATH)["where"]

    def gloo(rpn: int) -> PlainNetwork:
        # the all-to-all constants the planner is told for a node of rpn processes (the calibration's fit for them)
        m = CommModel.calibrated(CALIBRATION_PATH, processes=rpn)
        bw = 1.0 / m.beta_intra_s_per_byte
        return PlainNetwork("gloo-calibrated", bw, bw / 9.0, m.alpha_s, m.alpha_s, m.alpha_peer_s, rpn)

    fit = dict(CommModel.calibrated(CALIBRATION_PATH, processes=8).origin)
    return {
        "gloo-calibrated": (
            # the packaged file by name: a user's own calibration, if any, would be another network than the judge's
            {"comm_model": "calibrated", "comm_calibration": str(CALIBRATION_PATH)},
            gloo,
            f"planner told the packaged gloo calibration ({where}; for a node of 8 processes its fit of "
            f"{fit['fit']}, all-to-all fit MAPE {fit['fit_mape']:.0%}); judge: the same bandwidth and per-message "
            "overhead in the independent synchronous form (between nodes 9x slower, as the topology's ratio)"),
        "10GB/s": (
            {"comm_model": "bandwidth", "intra_node_bw_gbps": 10.0, "inter_node_bw_gbps": 10.0,
             "intra_node_latency_us": 20.0, "inter_node_latency_us": 20.0},
            lambda rpn: PlainNetwork("10GB/s", 10e9, 10e9, 20e-6, 20e-6, 5e-6, rpn),
            "planner told 10 GB/s + 20 us; judge adds 5 us per message the planner was not told of"),
        "gpu-like-8-per-node": (
            {"comm_model": "bandwidth", "intra_node_bw_gbps": 200.0, "inter_node_bw_gbps": 12.5,
             "intra_node_latency_us": 3.0, "inter_node_latency_us": 10.0, "ranks_per_node": 8},
            lambda rpn: PlainNetwork("gpu-like", 200e9, 12.5e9, 3e-6, 10e-6, 2e-6, 8),
            "planner told NVLink-class 200 GB/s + 3 us inside a node of 8, NIC-class 12.5 GB/s + 10 us between; "
            "judge adds 2 us per message"),
    }


def name_foreign_model(targets: dict, *why: str | None) -> None:
    """A missed target's reason names a compute model trained on another machine (sharding.estimate
    .machine_mismatch) or one whose figures do not hold here (:func:`carry_over`): its error on this
    CPU is part of why it missed. None in ``why`` adds nothing."""
    said = "; ".join(w for w in why if w)
    for t in targets.values():
        if said and not t["met"] and "reason" in t:
            t["reason"] += f"; {said}"


def own_estimator(path: str) -> LearnedEstimator:
    """--own-model's estimator; a file that is not a trained model is the flag's error, exit 2."""
    try:
        est = LearnedEstimator(path=path)
    except Exception as e:  # noqa: BLE001 - any load failure is the user's file
        print(f"sharding_benchmark: --own-model {path}: not a trained sharding cost model ({type(e).__name__}: {e})",
              file=sys.stderr)
        raise SystemExit(2)
    return est


def model_origin(meta: dict) -> str:
    """Where a learned compute model was trained, against THIS machine's fingerprint: how the sharding
    benchmarks name a model, so that a model native here is never called foreign, nor the other way
    round. A fingerprint names a CPU model and its cores, not a host: a model of this fingerprint may
    come from another host (stop 64's: 1.85x and 2.09x off on the hosts of stops 69 and 70), which
    :func:`carry_over` then says."""
    fp = meta.get("fingerprint") or {}
    if machine_mismatch(meta) is None:
        return f"trained on a machine of this fingerprint ({fp.get('cpu_model')}, {fp.get('cpu_count')} cores)"
    return f"trained on another machine ({fp.get('cpu_model', 'unrecorded')})"


def carry_over(accuracy: dict) -> str | None:
    """Why a model's compute figures do not hold here (None when they do), from its accuracy on this
    run's measured ranks (:func:`model_accuracy`, one regime), by the band `cubic shard plan --check`
    allows (sharding.estimate.SCALE_TOLERANCE)."""
    ratio = accuracy.get("median_measured_over_predicted")
    if not accuracy.get("ranks") or ratio is None or 1 / SCALE_TOLERANCE <= ratio <= SCALE_TOLERANCE:
        return None
    return (f"its compute predictions are {1 / ratio:.2f}x what this machine measures (median over "
            f"{accuracy['ranks']} measured ranks): the host it was trained on times differently")


def own_prefix(meta: dict) -> str:
    """The own model's targets' prefix: OWN_PREFIX when it was trained on a machine of this fingerprint, else the
    machine it was trained on (--own-model given another machine's model: a cross-check, named so)."""
    if machine_mismatch(meta) is None:
        return OWN_PREFIX
    return f"cross-check, compute model {model_origin(meta)}: "


def own_look(families, regs, methods, own_est, targets, looks: int = 0) -> dict:
    """``OWN``'s figures beside the shipped model's: its targets (named with :func:`own_prefix`) join
    ``targets``, and a missed shipped-model target's reason says what the own model measured."""
    meta = getattr(own_est.model, "meta_", {})
    prefix = own_prefix(meta)
    fam, own_t = analyse(families, regs, methods, cubic=OWN, prefix=prefix, looks=looks)
    tasks = [t for _, ts in families for t in ts]
    accuracy = {r: model_accuracy(tasks, r, own=True) for r in regs}
    mismatch = machine_mismatch(meta)
    off_here = carry_over(accuracy[regs[0]])
    name_foreign_model(own_t, mismatch, off_here)  # (both None when it was trained here and holds here)
    for k, t in targets.items():
        twin = own_t.get(prefix + k)
        if twin and not t["met"] and twin["measured"] is not None:
            t["reason"] += (f"; {prefix.rstrip(': ')}, the same planner: "
                            f"{twin['measured']:+.1%} ({'met' if twin['met'] else 'missed'})")
    targets.update(own_t)
    return {"what": (f"cubic's planner with the compute model of --own-model ({prefix.rstrip(': ')}), planned and "
                     "judged beside the shipped model's on the same tasks and measured rank sets"
                     + (f"; {off_here}" if off_here else "")),
            "model": meta, "machine_mismatch": mismatch, "holds_here": off_here is None, "regimes": fam,
            "accuracy": accuracy}


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


def run_task(name, tables, world, methods, est, meter, regs, budget, batch=BATCH, ranks_per_node=None,
             own_est=None, keep: dict | None = None):
    """Every method planned under every regime (told the regime's network), measured once for all;
    ``OWN`` is cubic's planner with ``own_est``, a compute model trained on a machine of this fingerprint; the plans
    go into ``keep[name]`` (for the fresh re-measurement, :func:`relook`)."""
    base = topology_for(tables, world, ranks_per_node)
    out = {"task": name, "tables": len(tables), "ranks": world, "ranks_per_node": base.ranks_per_node,
           "memory_per_rank_gb": base.memory_per_rank_gb, "batch_per_rank": batch, "regimes": {}}
    plans: dict[tuple[str, str], object] = {}
    for rname, (fields, _, _) in regs.items():
        topo = base.model_copy(update=fields)
        if topo.world_size % topo.ranks_per_node:
            topo = topo.model_copy(update={"ranks_per_node": topo.world_size})
        out["regimes"][rname] = {"comm_told": CommModel.from_topology(topo).describe(), "methods": {}}
        for m in methods:
            kw = {"time_budget_s": budget} if m in ("cubic", OWN) else {}
            m_est = own_est if m == OWN else est
            t0 = time.perf_counter()
            try:
                if m in HEURISTICS and any(k[1] == m for k in plans):  # heuristics ignore the network
                    prev = next(p for k, p in plans.items() if k[1] == m)
                    plan = prev.model_copy(update={"topology": topo})
                elif m == "torchrec":
                    plan = torchrec_with_timeout(tables, topo, batch, est, TORCHREC_TIMEOUT_S)
                else:
                    plan = make_planner("cubic" if m == OWN else m, seed=0, estimator=m_est, target="torchrec",
                                        **kw).plan(tables, topo, batch)
            except SpecError as e:  # a planner that finds no plan is data, not a crash
                out["regimes"][rname]["methods"][m] = {"failed": str(e), "planning_s": time.perf_counter() - t0}
                continue
            plan_s = plan.planning_time_s if m == "torchrec" else time.perf_counter() - t0
            if plan.predicted is None or m in HEURISTICS:
                from sharding.planners import with_prediction

                plan = with_prediction(plan.model_copy(update={"predicted": None}), est)
            plans[(rname, m)] = plan
            out["regimes"][rname]["methods"][m] = {"planning_s": plan_s, "predicted_ms": plan.predicted.max_ms,
                                                  "sharding_types": sorted({s.sharding_type for s in plan.shards}),
                                                  "notes": plan.notes}
    meter.measure(plan_sets(plans.values()))
    for (rname, m), plan in plans.items():
        g = judge_in_regime(plan, meter, regs, rname)
        out["regimes"][rname]["methods"][m].update({
            "measured_ms": g["total_ms"], "judge_compute_ms": g["compute_ms"], "judge_comm_ms": g["comm_ms"],
            "measured_compute_ms": g["rank_compute_ms"],
            "predicted_compute_ms": [r.compute_ms for r in plan.predicted.per_rank]})
    if keep is not None:
        keep[name] = plans
    return out


def judge_in_regime(plan, meter, regs: dict, rname: str) -> dict:
    """One plan judged by ``meter``'s rank costs and the regime's independent network (built for the
    plan's ranks per node): the first look and every re-measurement judge through here."""
    return judge(plan, meter, regs[rname][1](plan.topology.ranks_per_node))


def _ms(t, r, m, look: int = 0):
    """A method's judged ms in look ``look``: 0 the first (``measured_ms``), k > 0 the k-th fresh
    re-measurement of the same plan (``relook_ms``, :func:`relook`); None where there is none."""
    v = t["regimes"][r]["methods"].get(m, {})
    if not look:
        return v.get("measured_ms")
    more = v.get("relook_ms") or []
    return more[look - 1] if look <= len(more) else None


def best_heuristic(t, r, look: int = 0) -> str | None:
    """The memory-feasible heuristic with the lowest judged cost on one task and regime (in one look)."""
    hs = [m for m in HEURISTICS if _ms(t, r, m, look) is not None]
    return min(hs, key=lambda m: _ms(t, r, m, look)) if hs else None


def gap(t, r, other=None, cubic="cubic", look: int = 0) -> float | None:
    """cubic's (or ``OWN``'s) judged cost over the best heuristic's (or ``other``'s), minus 1 (in one look)."""
    other = other or best_heuristic(t, r, look)
    c, o = _ms(t, r, cubic, look), _ms(t, r, other, look) if other else None
    return c / o - 1 if c and o else None


def relook(tasks: list[dict], kept: dict, regs: dict, looks: int) -> int:
    """The fresh re-measurement: ``looks`` more looks at every kept plan (each a new MinOfRounds over
    every task's rank sets, so no look reuses another's minimum), each plan judged again into its
    method's ``relook_ms``; returns the measurements made."""
    n = 0
    for _ in range(looks):
        meter = MinOfRounds()
        meter.measure(plan_sets(p for plans in kept.values() for p in plans.values()))
        n += meter.measurements
        for t in tasks:
            for (rname, m), plan in kept[t["task"]].items():
                g = judge_in_regime(plan, meter, regs, rname)
                t["regimes"][rname]["methods"][m].setdefault("relook_ms", []).append(g["total_ms"])
    return n


def model_accuracy(tasks, regime, own=False):
    """The planners' compute model against the measured ranks: the shipped one's (every method's
    plans but ``OWN``'s), or with ``own`` the model trained on a machine of this fingerprint (``OWN``'s plans)."""
    p, y = [], []
    for t in tasks:
        for m, v in t["regimes"][regime]["methods"].items():
            if (m == OWN) != own:
                continue
            for a, b in zip(v.get("predicted_compute_ms", []), v.get("measured_compute_ms", [])):
                if b > 0:
                    p.append(a)
                    y.append(b)
    if not y:
        return {"ranks": 0}
    from scipy.stats import spearmanr

    p, y = np.array(p), np.array(y)
    return {"ranks": len(y), "spearman": float(spearmanr(p, y)[0]), "mape": float(np.mean(np.abs(p - y) / y)),
            "median_measured_over_predicted": float(np.median(y / p))}


def analyse(families: list, regs: list[str], methods: list[str], cubic: str = "cubic", prefix: str = "",
            look: int = 0, looks: int = 0):
    """Per regime and family: mean judged cost per method, cubic's (or ``OWN``'s: ``cubic``) paired
    gaps; the targets (named with ``prefix``), from look ``look``; with ``looks`` fresh re-measurements
    recorded, each target also judged over all looks (:func:`judge_over_looks`)."""
    out, targets = {}, {}
    for r in regs:
        out[r] = {}
        per_task = []
        tr_gaps = []
        for fname, ts in families:
            ts = [t for t in ts if r in t["regimes"]]
            if not ts:
                continue

            def ms(t, m):
                return _ms(t, r, m, look)

            means = {m: (float(np.mean(v)) if (v := [ms(t, m) for t in ts if ms(t, m) is not None]) else None)
                     for m in methods}
            failures = {m: sum(1 for t in ts if ms(t, m) is None) for m in methods}
            feasible = {m: v for m, v in means.items() if m in HEURISTICS and v is not None and failures[m] == 0}
            best_h = min(feasible, key=feasible.get) if feasible else None
            both = [t for t in ts if ms(t, cubic) and best_h and ms(t, best_h)]
            g = (float(np.mean([ms(t, cubic) for t in both]) / np.mean([ms(t, best_h) for t in both]) - 1)
                 if both else None)
            both_tr = [t for t in ts if ms(t, cubic) and ms(t, "torchrec")]
            g_tr = (float(np.mean([ms(t, cubic) for t in both_tr])
                          / np.mean([ms(t, "torchrec") for t in both_tr]) - 1) if both_tr else None)
            pred = [t["regimes"][r]["methods"][cubic]["predicted_ms"] / t["regimes"][r]["methods"][best_h]["predicted_ms"]
                    - 1 for t in both]
            out[r][fname] = {"tasks": len(ts), "mean_measured_ms": means, "failures": failures,
                             "best_heuristic": best_h, "cubic_vs_best_heuristic": g, "cubic_vs_torchrec": g_tr,
                             "cubic_vs_best_heuristic_predicted_by_its_model": float(np.mean(pred)) if pred else None}
            why = {}
            if g is not None and g > TARGET_GAP:
                why = {"reason": (
                    f"under its own model cubic's plans were {out[r][fname]['cubic_vs_best_heuristic_predicted_by_its_model']:+.1%} "
                    f"against {best_h}'s (the portfolio guarantees <= 0); judged (measured compute + independent comm) "
                    f"{g:+.1%}: the gain the model sees is smaller than its error on these ranks, or the judge's "
                    "per-message overhead and synchronous collectives price the plans differently")}
            targets[f"{prefix}{r}: mean cost >= 10% below the best heuristic ({fname})"] = {
                "measured": g, "target": TARGET_GAP, "met": bool(g is not None and g <= TARGET_GAP), **why}
            if g_tr is not None:
                targets[f"{prefix}{r}: below TorchRec's planner ({fname})"] = {"measured": g_tr, "target": 0.0, "met": bool(g_tr < 0)}
                tr_gaps.append(g_tr)
            per_task += [(t["task"], x) for t in ts if (x := gap(t, r, cubic=cubic, look=look)) is not None]
        worst = max(per_task, key=lambda x: x[1]) if per_task else (None, None)
        targets[f"{prefix}{r}: {WORST}"] = {
            "measured": worst[1], "worst_task": worst[0], "target": 0.03,
            "met": bool(worst[1] is not None and worst[1] <= 0.03),  # numpy's bool would be written "False"
            "tasks_over_3pct": sorted(n for n, x in per_task if x > 0.03),
            **({"reason": "measured compute of cubic's ranks above the model's prediction of them on "
                                    "these tasks (see per-task measured/predicted compute)"}
               if worst[1] is not None and worst[1] > 0.03 else {})}
    for k, v in targets.items():  # the convention: a missed target says why
        if not v["met"] and not v.get("reason"):
            v["reason"] = ("TorchRec's planner, told the same network, found a cheaper plan under the judge on this "
                           "family" if "TorchRec" in k else "no measurement (a planner failed on every task)")
    if looks and not look:
        judge_over_looks(families, regs, methods, targets, looks, cubic, prefix)
    return out, targets


def judge_over_looks(families, regs, methods, targets, looks: int, cubic: str, prefix: str) -> None:
    """Each target judged again over all 1 + ``looks`` looks (the first and the fresh re-measurements of
    the same plans): the family and TorchRec figures per look with the mean's 95% interval; the worst
    task by its mean gap over the looks (one look's maximum over many noisy cells is biased up). A
    target is met only when the first look and the mean over the looks both meet it; a missed one
    says whether its miss holds on the re-measurement."""
    per_look = [targets] + [analyse(families, regs, methods, cubic, prefix, look=k)[1] for k in range(1, looks + 1)]
    for key, t in targets.items():
        if key.endswith(WORST):
            r = key[len(prefix):-len(": " + WORST)]
            _judge_worst_over_looks(t, [x for _, ts in families for x in ts if r in x["regimes"]], r, looks, cubic)
            continue
        vals = [x[key]["measured"] for x in per_look if key in x and x[key]["measured"] is not None]
        if len(vals) < 2:
            continue
        mean, lo, hi = mean_interval(vals)
        t["over_looks"] = {"looks": len(vals), "per_look": vals, "mean": mean, "ci95": [lo, hi]}
        ok = mean < t["target"] if "TorchRec" in key else mean <= t["target"]
        over = f"over {len(vals)} looks (fresh re-measurements of the same plans) {mean:+.1%} [{lo:+.1%}, {hi:+.1%}]"
        if t["met"] and not ok:
            t["met"] = False
            t["reason"] = f"met on the first look ({vals[0]:+.1%}) but not {over}: it does not survive a re-measurement"
        elif not t["met"]:
            t["reason"] += f"; {over}"


def _judge_worst_over_looks(t: dict, tasks: list[dict], r: str, looks: int, cubic: str) -> None:
    """The worst-task target ``t`` of regime ``r`` judged again: each task's gap per look, the worst
    task by its mean (with the 95% interval), and what that says of the first look's verdict."""
    per = {x["task"]: g for x in tasks
           if len(g := [v for k in range(looks + 1) if (v := gap(x, r, cubic=cubic, look=k)) is not None]) > 1}
    if not per:
        return
    stats = {name: mean_interval(g) for name, g in per.items()}
    name = max(stats, key=lambda n: stats[n][0])
    mean, lo, hi = stats[name]
    t["over_looks"] = {"looks": len(per[name]), "worst_task": name, "per_look": per[name], "mean": mean,
                        "ci95": [lo, hi], "tasks_mean_over_3pct": sorted(n for n, s in stats.items() if s[0] > 0.03),
                        "tasks_resolved_over_3pct": sorted(n for n, s in stats.items() if s[1] > 0.03)}
    over = f"over {len(per[name])} looks the worst task is {name}, {mean:+.1%} [{lo:+.1%}, {hi:+.1%}]"
    if t["met"] and mean > 0.03:
        t["met"] = False
        t["reason"] = f"met on the first look ({t['measured']:+.1%}) but not {over}: it does not survive a re-measurement"
    elif not t["met"]:
        t["reason"] += "; " + over + (
            ": the miss holds (resolved above 3%)" if lo > 0.03 else
            ": above 3% on the mean, not resolved from measurement noise" if mean > 0.03 else
            ": the first look's excess is within measurement noise (mean <= 3%); missed on the first look")


def plot(fam, regs, methods, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, len(regs), figsize=(6 * len(regs), 5), squeeze=False)
    for i, r in enumerate(regs):
        names = list(fam[r])
        width = 0.8 / len(methods)
        for j, m in enumerate(methods):
            vals = [fam[r][f]["mean_measured_ms"].get(m) or 0 for f in names]
            ax[0, i].bar(np.arange(len(names)) + j * width, vals, width, label=m)
        ax[0, i].set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, fontsize=7)
        ax[0, i].set_ylabel("mean step, ms (measured compute + independent modelled comm)")
        ax[0, i].set_title(f"regime {r} (planners told it)")
        ax[0, i].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


HBM_TARGET = "tables past total HBM: cubic (UVM caching) below TorchRec's planner (same kernels allowed)"
HBM_SHARE = 0.5  # the HBM family: the ranks' HBM together holds half of the tables (weights + optimizer)


def hbm_family(n_tasks: int, budget: float) -> dict:
    """Tables past total HBM (MODELLED on an H100 topology of 4 ranks, NVLink-class network): cubic
    places under HBM + host memory and moves the coldest tables of an over-full rank to UVM caching
    (sharding.kernels.assign_kernels); TorchRec's planner gets the same HBM and host caps and chooses
    its own kernels (fused, fused_uvm_caching, fused_uvm). Both plans priced by the same model: the
    H100 lookup model + the misses' PCIe time + the comm model (sharding.estimate.plan_cost)."""
    from sharding.estimate import GpuEstimator, plan_cost
    from sharding.kernels import assign_kernels
    from sharding.torchrec_adapter import TorchRecPlanner, validate_in_torchrec

    est = GpuEstimator("h100")
    tasks = []
    for i in range(n_tasks):
        n = int(np.random.default_rng(7024 + i).integers(20, 61))
        tables = generate_tables(n, seed=7000 + i)
        total = sum(Storage.of(t.rows, t.dim).total for t in tables)
        hbm = HBM_SHARE * total / 4
        topo = Topology(world_size=4, ranks_per_node=4, device="h100", comm_model="bandwidth",
                        intra_node_bw_gbps=200.0, intra_node_latency_us=3.0,
                        memory_per_rank_gb=max(1.5 * total / 4, 1.05 * max(Storage.of(t.rows, t.dim).total
                                                                               for t in tables)) / 1e9)
        comm = CommModel.from_topology(topo)
        row = {"task": f"hbm-{i}", "tables": n, "total_gb": total / 1e9, "hbm_per_rank_gb": hbm / 1e9, "methods": {}}
        for m in ("cubic", "torchrec"):
            try:
                if m == "cubic":
                    plan = make_planner("cubic", estimator=est, target="torchrec", time_budget_s=budget).plan(
                        tables, topo, BATCH)
                    plan = plan.model_copy(update={"kernels": assign_kernels(plan, hbm)})
                else:
                    plan = TorchRecPlanner(estimator=est, hbm_bytes=hbm).plan(tables, topo, BATCH)
                validate_in_torchrec(plan)
                cost = plan_cost(plan, est, comm)
                kinds = {}
                for k in plan.kernels.values():
                    kinds[k.compute_kernel] = kinds.get(k.compute_kernel, 0) + 1
                row["methods"][m] = {"modelled_ms": cost.max_ms, "kernels": kinds,
                                     "load_factors": sorted({k.cache_load_factor for k in plan.kernels.values()
                                                             if k.cache_load_factor})}
            except (SpecError, ValueError) as e:
                row["methods"][m] = {"failed": str(e)[:300]}
        tasks.append(row)
        print(f"  hbm task {i} ({n} tables, {total / 1e9:.2f} GB on 4 x {hbm / 1e9:.2f} GB HBM): "
              + ", ".join(f"{m} {v.get('modelled_ms', float('nan')):.2f} ms {v.get('kernels', v.get('failed'))}"
                          for m, v in row["methods"].items()), flush=True)
    both = [t for t in tasks if all("modelled_ms" in t["methods"].get(m, {}) for m in ("cubic", "torchrec"))]
    g = (float(np.mean([t["methods"]["cubic"]["modelled_ms"] for t in both])
               / np.mean([t["methods"]["torchrec"]["modelled_ms"] for t in both]) - 1) if both else None)
    target = {"measured": g, "target": 0.0, "met": g is not None and g < 0, "label": "MODELLED (no GPU here)",
              "tasks_compared": len(both)}
    if not target["met"]:
        target["reason"] = ("TorchRec's planner, with the same HBM/host caps and kernels allowed, priced cheaper by the "
                            "shared model" if g is not None else "no task planned by both")
    return {"what": hbm_family.__doc__.split("\n\n")[0].replace("\n", " "), "label": "modelled", "tasks": tasks,
            "cubic_vs_torchrec": g, "target": target}


def hbm_only(name: str, n_tasks: int, budget: float) -> int:
    """--hbm-only: the (modelled) family past total HBM, run and added to the recorded JSON."""
    from experiments.common import RESULTS

    doc = json.loads((RESULTS / f"{name}.json").read_text())
    fam = hbm_family(n_tasks, budget)
    doc["hbm_family"] = fam
    doc["targets"][HBM_TARGET] = fam["target"]
    write_result(name, doc)
    print(f"hbm family: cubic vs torchrec {fam['cubic_vs_torchrec']}")
    return 0


def run_tasks(n_tasks, n_multi, methods, est, own_est, meter, regs, budget, t_start, keep=None):
    """The small 4-rank tasks (spread over FAMILIES) and the multi-node ones, each run and judged
    (run_task; their plans into ``keep``), with the load after each; progress on stdout."""
    tasks, multi, loads = [], [], []
    for i in range(n_tasks + n_multi):
        if i < n_tasks:
            lo, hi = FAMILIES[i % len(FAMILIES)][1:]
            n = int(np.random.default_rng(2024 + i).integers(lo, hi + 1))
            t = run_task(f"small-{i}", generate_tables(n, seed=1000 + i), 4, methods, est, meter, regs, budget,
                         own_est=own_est, keep=keep)
            tasks.append(t)
        else:
            j = i - n_tasks
            n = int(np.random.default_rng(3024 + j).integers(60, 121))
            t = run_task(f"multi-node-{j}", generate_tables(n, seed=3000 + j), MULTI_NODE[0] * MULTI_NODE[1], methods,
                         est, meter, regs, budget, batch=MULTI_BATCH, ranks_per_node=MULTI_NODE[1], own_est=own_est,
                         keep=keep)
            multi.append(t)
        loads.append(os.getloadavg()[0])
        t["loadavg_1m"] = loads[-1]
        gaps = [f"{r} {c}/best {g:+.1%}" for r in regs for c in ("cubic", OWN) if (g := gap(t, r, cubic=c)) is not None]
        print(f"[{time.perf_counter() - t_start:5.0f}s] {t['task']} ({n} tables, load {loads[-1]:.1f}): "
              + "; ".join(gaps), flush=True)
    return tasks, multi, loads


def planner_check_record(payload: dict) -> dict:
    """What ``sharding.checked`` packages from a full run (``cubic shard plan`` prints it under a cubic plan):
    the shipped model's cells meeting the 10% bar and beating TorchRec's planner, the regimes with no task
    > 3% worse, and, when --own-model was trained on a machine of this fingerprint, its 10% bar count; and
    the same counts from the file's earlier looks, the newest per other machine (``other_machines``), so a
    plan made on either machine quotes the check made there."""
    regs = list(payload["regimes"])
    fams = list(payload["regimes"][regs[0]])

    def record(t: dict, machine: str | None, code: str | None, finished_at: str | None) -> dict:
        def counts(prefix: str) -> dict:
            bar = [t.get(f"{prefix}{r}: mean cost >= 10% below the best heuristic ({f})") for r in regs for f in fams]
            tr = [t.get(f"{prefix}{r}: below TorchRec's planner ({f})") for r in regs for f in fams]
            return {"bar_met": sum(bool(x and x["met"]) for x in bar), "cells": len(bar),
                    "below_torchrec": sum(bool(x and x["met"]) for x in tr),
                    "worst_task_met": sum(bool(t.get(f"{prefix}{r}: {WORST}", {}).get("met")) for r in regs),
                    "regimes": len(regs)}

        own = counts(OWN_PREFIX) if any(k.startswith(OWN_PREFIX) for k in t) else None
        return {"machine": machine or "?", "code": code, "finished_at": finished_at,
                "file": "results/sharding_benchmark.json", **counts(""),
                "own_model": None if own is None else {k: own[k] for k in ("bar_met", "below_torchrec",
                                                                         "worst_task_met")}}

    run = run_of(payload)
    this = record(payload["targets"], run["machine"], run["code_version"], run["finished_at"])
    return with_other_machines(this, payload,
                               lambda lk, m: record(lk["targets"], m, lk.get("code_version"), lk.get("finished_at")))


def _parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 small tasks, one multi-node task")
    ap.add_argument("--tasks", type=int, default=9, help="small 4-rank tasks (spread over the three families)")
    ap.add_argument("--multi-node-tasks", type=int, default=3, help=f"tasks on {MULTI_NODE[0]} nodes x {MULTI_NODE[1]} ranks")
    ap.add_argument("--budget", type=float, default=2.0, help="cubic's time budget per plan, s")
    ap.add_argument("--hbm-only", action="store_true",
                    help="run only the (modelled) family past total HBM and add it to the recorded JSON")
    ap.add_argument("--hbm-tasks", type=int, default=6)
    ap.add_argument("--own-model", metavar="PATH",
                    help="also plan with cubic's planner on a compute model trained on this machine (`cubic shard "
                         "collect && cubic shard train --out PATH`), judged on the same tasks and measurements")
    ap.add_argument("--relooks", type=int, default=RELOOKS,
                    help="fresh re-measurements of every plan after the first look (each target is also judged over "
                         "all looks; 0: none)")
    args = ap.parse_args(argv)
    if args.relooks < 0:
        ap.error(f"--relooks {args.relooks}: a count of re-measurements, 0 or more")
    return args


def _method_note(regs: dict, est, mismatch, args, looks: int, load_start: float, loads) -> dict:
    """What the run did and how each figure was made (the JSON's what/ground_truth/labels/load/protocol)."""
    return {
        "what": ("per task and interconnect regime, every planner told the regime's network (Topology comm fields); "
                 "each plan judged by: max over ranks of MEASURED compute (FBGEMM CPU TBE, thread CPU time, min of "
                 f"{ROUNDS} interleaved rounds) + MODELLED communication by an independent synchronous plain-network "
                 "model (experiments/_sharding_ground_truth.py), not the cost_models.comm model the planners optimise; "
                 f"then {looks} fresh re-measurement(s) of the same plans (relook_ms), each target also judged over "
                 "all looks (its over_looks; met only when the first look and the mean over the looks both meet it)"),
        "ground_truth": {"compute": "measured", "communication": "modelled: independent plain bandwidth + latency + "
                         "per-message overhead, synchronous all-to-all (per-rank max(sent, received), max over ranks)",
                         "regimes": {r: {"told": v[0], "judge": v[1](8).describe(), "how": v[2]} for r, v in regs.items()}},
        "labels": {"measured_ms": "mixed: measured compute + independently modelled comm",
                   "predicted_ms": "modelled: the planner's own model (learned compute + cost_models.comm)",
                   "planning_s": "measured"},
        "load": {"loadavg_1m_start": load_start, "loadavg_1m_per_task": loads,
                 "note": "2-core machine shared with other jobs; compute is thread CPU time, min of interleaved rounds"},
        "protocol": {"batch_per_rank": BATCH, "multi_batch_per_rank": MULTI_BATCH, "rounds": ROUNDS, "relooks": looks,
                     "cubic_time_budget_s": args.budget, "quick": args.quick, "target": "torchrec",
                     "comm_calibration": {k: v for k, v in calibration_origin(CALIBRATION_PATH).items()
                                          if k in ("file", "machine", "cores", "this_machine", "where", "fit_mape")},
                     "cost_model": getattr(est.model, "meta_", {}),
                     "cost_model_machine_mismatch": mismatch,  # None: trained on a machine of this fingerprint
                     "not_run_here": "the 512x64 and 856x128 large tasks of the previous version (planning time "
                                     "target) were left out of this regime study for time"},
    }


def _print_outcome(fam: dict, regs: dict, own_est, own: dict, targets: dict) -> None:
    for r, fs in fam.items():
        for f, v in fs.items():
            g, gt = v["cubic_vs_best_heuristic"], v["cubic_vs_torchrec"]
            print(f"  {r} / {f}: cubic vs best heuristic ({v['best_heuristic']}) "
                  + (f"{g:+.1%}" if g is not None else "-") + (f", vs torchrec {gt:+.1%}" if gt is not None else "")
                  + f" (its model said {v['cubic_vs_best_heuristic_predicted_by_its_model'] or 0:+.1%})")
    if own_est:
        for r in regs:
            print(f"  {OWN} accuracy on {r}: {own['accuracy'][r]}")
    for k, v in targets.items():
        sl = v.get("over_looks")
        print(f"  [{'met' if v['met'] else 'MISSED'}] {k}: {v['measured']}"
              + (f" (over {sl['looks']} looks: {sl['mean']:+.3f} [{sl['ci95'][0]:+.3f}, {sl['ci95'][1]:+.3f}])" if sl else ""))


def main(argv=None) -> int:
    args = _parse_args(argv)
    own_est = own_estimator(args.own_model) if args.own_model else None
    name = "sharding_benchmark" + ("_quick" if args.quick else "")
    if args.hbm_only:
        return hbm_only(name, 2 if args.quick else args.hbm_tasks, args.budget)
    n_tasks = 3 if args.quick else args.tasks
    n_multi = 1 if args.quick else args.multi_node_tasks
    ctx = run_context("mixed")
    load_start = os.getloadavg()[0]
    est = LearnedEstimator()
    regs = regimes()
    methods = ["cubic"] + ([OWN] if own_est else []) + (["torchrec"] if torchrec_available() else []) + list(HEURISTICS)
    t_start = time.perf_counter()
    meter, kept = MinOfRounds(), {}
    tasks, multi, loads = run_tasks(n_tasks, n_multi, methods, est, own_est, meter, regs, args.budget, t_start, kept)
    looks = min(args.relooks, 1) if args.quick else args.relooks
    t_relook = time.perf_counter()
    relooked = relook(tasks + multi, kept, regs, looks)
    print(f"[{time.perf_counter() - t_start:5.0f}s] {looks} fresh re-measurement(s) of every plan ({relooked} "
          f"measurements, {time.perf_counter() - t_relook:.0f} s)", flush=True)
    families = [(f, [t for t in tasks if lo <= t["tables"] <= hi]) for f, lo, hi in FAMILIES]
    families.append((f"multi-node {MULTI_NODE[0]}x{MULTI_NODE[1]} ranks", multi))
    fam, targets = analyse(families, list(regs), methods, looks=looks)
    mismatch = machine_mismatch(getattr(est.model, "meta_", {}))
    accuracy = {r: model_accuracy(tasks + multi, r) for r in regs}
    shipped_off_here = carry_over(accuracy[next(iter(regs))])
    name_foreign_model(targets, mismatch, shipped_off_here)
    own = {"path": args.own_model, **own_look(families, list(regs), methods, own_est, targets, looks)} if own_est else {
        "not_run": "no --own-model: whether a miss is the shipped model's machine is not checked by this run"}
    payload = {
        **ctx,
        **_method_note(regs, est, mismatch, args, looks, load_start, loads),
        "methods": methods,
        "regimes": fam,
        "cost_model_accuracy": accuracy,
        "cost_model_holds_here": shipped_off_here is None,
        "own_model": own,
        "targets": targets,
        "measurements": meter.measurements + relooked,
        "tasks": tasks,
        "multi_node_tasks": multi,
        "runtime_s": time.perf_counter() - t_start,
    }
    payload["hbm_family"] = fam_hbm = hbm_family(2 if args.quick else args.hbm_tasks, args.budget)
    payload["targets"][HBM_TARGET] = fam_hbm["target"]
    path = write_result(name, payload)
    if not args.quick:  # the packaged record of the planner's edge, from the run whose results it quotes
        from sharding.checked import CHECK_PATH

        CHECK_PATH.write_text(json.dumps(planner_check_record(json.loads(path.read_text())), indent=2) + "\n")
    plot(fam, list(regs), methods, png_path(name))
    _print_outcome(fam, regs, own_est, own, targets)
    print(f"wrote {path} and {png_path(name)} in {payload['runtime_s']:.0f} s")
    return 0

if __name__ == "__main__":
    sys.exit(main())
