"""``cubic shard <verb>``: plan, evaluate, collect, train, export (and calibrate-comm).

    cubic shard plan --tables T --world-size W --memory-gb M [--group-size G] [--batch-size B]
                     [--planner cubic|torchrec|random|dim_greedy|...] --out plan.json
    cubic shard evaluate plan.json [--repeats 5] [--out measured.json]
    cubic shard evaluate plan.json --backend torchrec [--world-size W] [--steps 10]
    cubic shard collect --samples 500 [--seed 0] [--store URL]
    cubic shard train [--store URL] [--out model.json]
    cubic shard export plan.json --format torchrec [--local-size L] [--out tr.json]
        (exit 2 with one line naming the table when TorchRec cannot run the plan as planned)
    cubic shard calibrate-comm

``--tables``: an embedded workload name, a workload YAML/JSON, or a CSV (name, rows, dim,
pooling_factor, zipf_alpha[, feature_group]). Bad input raises SpecError (exit 2, one line).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cubic.core.spec import MAX_REPEATS, MAX_STEPS, SpecError, sanitize


def _estimator(path: str | None, device: str | None = None):
    """GPU device -> the HBM lookup model for it; otherwise the learned CPU model (warns when it was
    trained on another machine)."""
    from sharding.estimate import GpuEstimator, LearnedEstimator, cost_model_path, machine_mismatch

    if device and device != "cpu":
        return GpuEstimator(device)  # SpecError for an unknown device
    p = Path(path) if path else cost_model_path()
    if not p.is_file():
        raise SpecError("no cost model file (train one with `cubic shard train`)", source=str(p))
    est = LearnedEstimator(path=p)
    est.warning = machine_mismatch(getattr(est.model, "meta_", {}) or {})  # printed once the plan is made
    return est


COMM_FLAGS = {"intra_node_bw_gbps": "--intra-node-bw-gbps", "inter_node_bw_gbps": "--inter-node-bw-gbps",
              "intra_node_latency_us": "--intra-node-latency-us", "inter_node_latency_us": "--inter-node-latency-us"}


def _comm_flags(args) -> dict:
    """The interconnect the user typed: bandwidth/latency flags select the bandwidth model (on every
    device, cpu included) unless --comm-model says otherwise; --comm-calibration a calibration file."""
    from cost_models.comm import calibration_file

    out = {k: getattr(args, k, None) for k in COMM_FLAGS}
    for k, flag in COMM_FLAGS.items():
        if out[k] is not None and not (0 < out[k] < 1e6 or (out[k] == 0 and "latency" in k)):
            raise SpecError(f"must be {'>= 0' if 'latency' in k else '> 0'} and below 1e6, got {out[k]:g}", field=flag)
    model = getattr(args, "comm_model", None)
    cal = getattr(args, "comm_calibration", None)
    if cal is not None:
        model = model or "calibrated"
        out["comm_calibration"] = str(calibration_file(cal, "--comm-calibration").resolve())
    if model is None and any(out[k] is not None for k in COMM_FLAGS):
        model = "bandwidth"
    out["comm_model"] = model
    return out


def _with_tiers(plan, hbm_gb: float, est):
    """Memory tiers per table (sharding.kernels.assign_kernels): the plan placed under
    --memory-gb (HBM + host), tables of an over-full rank moved to UVM caching / UVM so each rank's
    HBM use fits --hbm-gb; re-predicted by the estimator that planned it (``est``)."""
    from sharding.kernels import assign_kernels

    if not 0 < hbm_gb < 1e6:
        raise SpecError(f"must be > 0 and below 1e6, got {hbm_gb:g}", field="--hbm-gb")
    try:
        kernels = assign_kernels(plan, hbm_gb * 1e9)
    except ValueError as e:
        raise SpecError(str(e), field="--hbm-gb") from None
    tiered = plan.model_copy(update={"kernels": kernels})
    if plan.predicted is not None and isinstance(getattr(plan, "comm", None), dict):
        from cost_models.comm import CommModel
        from sharding.planners import with_prediction

        tiered = with_prediction(tiered.model_copy(update={"predicted": None}), est,
                                 CommModel.from_topology(plan.topology))
    return tiered


def _sync(args, world: int):
    """The replica sync a 2D plan is priced with, from --sync / --sync-interval (refused where they mean nothing)."""
    from sharding.types import ReplicaSync

    sync, interval = getattr(args, "sync", None), getattr(args, "sync_interval", None)
    if (sync or interval) and not (args.group_size and args.group_size < world):
        raise SpecError("prices a 2D plan's replica sync: give --group-size smaller than the world size",
                        field="--sync" if sync else "--sync-interval")
    if interval and sync == "gradients":
        raise SpecError("is the weight-averaging interval; --sync gradients syncs every step", field="--sync-interval")
    return ReplicaSync.of(sync, interval)


def _make_plan(args, tables, topo, batch: int, est):
    """One planner run as the flags say (its time budget; tiers under --hbm-gb)."""
    from sharding.planners import budget_note
    from sharding.registry import make_planner

    kw = {"time_budget_s": args.time_budget} if args.planner == "cubic" else {}
    planner = make_planner(args.planner, seed=args.seed, estimator=est, target=args.target, **kw)
    plan = planner.plan(tables, topo, batch, args.group_size, _sync(args, topo.world_size))
    if getattr(planner, "budget_reached_", False):
        print(f"warning: {budget_note(args.time_budget)}", file=sys.stderr)
    return _with_tiers(plan, args.hbm_gb, est) if args.hbm_gb is not None else plan


def _checked(plan):
    """The plan with its ranks' lookup measured here (the compute check's measured side), or why not."""
    from sharding.estimate import CHECK_REPEATS

    try:  # the second look: the plan's own ranks measured here, so its modelled ms are checked, not trusted
        return plan.model_copy(update={"measured": measure(plan, CHECK_REPEATS, "--check")}), None
    except SpecError as e:
        return plan, f"compute check skipped: {e}"


# what experiments/sharding_rescale.py measured re-planning at the check's scale to buy (two CPUs, 18
# tasks x 3 regimes, twelve runs): said where a user turns it on, so the flag is not taken for a fix
RESCALE_EVIDENCE = ("measured (results/sharding_rescale.json and, in README, its twelve runs of 18 tasks on two CPUs): "
                    "no resolved gain for a model 0.64x or 1.3-1.6x off; for one 3-7x slow 1-3 points lower mean "
                    "cost in five runs, not resolved in three, its worst task up to 16 points worse; for one ~3.5x "
                    "fast (0.26-0.31x) 1.5-3.3 points worse; a model fitted here (`cubic shard collect` then `cubic "
                    "shard train`) fixes the scale")


def _check_hbm(args, topo) -> None:
    """The per-rank HBM the plan fills fits the GPU named: --hbm-gb where given (--memory-gb is then HBM +
    host), else the memory per rank (the flag typed, else the workload's topology.memory_per_rank_gb)."""
    from sharding.inputs import check_device_hbm

    if args.hbm_gb is not None:
        check_device_hbm(topo.device, args.hbm_gb, "--hbm-gb")
    elif args.memory_gib is not None:
        check_device_hbm(topo.device, topo.memory_per_rank_gb, "--memory-gib", gib_flag=True)
    elif args.memory_gb is not None:
        check_device_hbm(topo.device, args.memory_gb, "--memory-gb")
    else:
        check_device_hbm(topo.device, topo.memory_per_rank_gb, "topology.memory_per_rank_gb", source=args.tables)


def cmd_plan(args) -> int:
    from cubic.cli.common import check_topology_refs
    from cubic.core.units import GB, GIB
    from sharding.checked import check_line, planner_check
    from sharding.estimate import ScaledEstimator
    from sharding.inputs import load_tables, topology_for
    from sharding.types import format_plan

    tables, wl = load_tables(args.tables)
    memory_gb = args.memory_gib * GIB / GB if args.memory_gib is not None else args.memory_gb
    topo = topology_for(args.world_size, memory_gb, wl, args.ranks_per_node, args.device, _comm_flags(args))
    if topo.world_size > topo.ranks_per_node and topo.world_size % topo.ranks_per_node:
        # a job's nodes hold equal numbers of ranks (torchrun's --nproc-per-node): this plan could not be launched
        typed = "--ranks-per-node" if args.ranks_per_node else "--world-size" if args.world_size else None
        raise SpecError(f"{topo.ranks_per_node} ranks per node do not divide {topo.world_size} ranks",  # the flag
                        source=None if typed else args.tables, field=typed or "topology.ranks_per_node")  # or the file's
    check_topology_refs(topo, args.tables, "--device" if args.device else None)
    _check_hbm(args, topo)
    batch = args.batch_size or (wl.batch_size if wl else 512)
    checking = getattr(args, "check", None) is not False and topo.device == "cpu"
    if getattr(args, "rescale", False) and not checking:
        raise SpecError("re-plans at the compute check's measured scale: the check runs on --device cpu, without "
                        "--no-check", field="--rescale")
    est = _estimator(args.model, topo.device)
    plan = _make_plan(args, tables, topo, batch, est)
    if getattr(est, "warning", None):
        print(f"warning: {est.warning}", file=sys.stderr)
    skipped, rescaled = None, None
    if checking and plan.predicted is not None:
        plan, skipped = _checked(plan)
    check = _compute_check(plan)
    if getattr(args, "rescale", False) and check is not None:
        if check.holds:
            rescaled = "--rescale: the check holds (the model within its tolerance here): the model's plan kept"
        else:
            first, model_plan, scaled = check, plan, ScaledEstimator.at_check(est, check)
            plan, skipped = _checked(_make_plan(args, tables, topo, batch, scaled))
            note = (f"re-planned at the compute check's measured scale (--rescale: the model x{scaled.scale:.3g}; "
                    f"it predicted {first.ratio:.2f}x the measured lookup)")
            plan = plan.model_copy(update={"notes": f"{plan.notes}; {note}" if plan.notes else note,
                                           "planning_time_s": model_plan.planning_time_s + plan.planning_time_s})
            same = "the same plan as the model's" if plan.shards == model_plan.shards else "a different plan"
            rescaled = f"{note}: {same}; {RESCALE_EVIDENCE}"
            check = _compute_check(plan)
    if args.out:
        plan.save(args.out)
    if args.json:
        print(plan.to_json())
    else:
        print(sanitize(format_plan(plan, plan.predicted)))
        edge = check_line(planner_check()) if plan.planner == "cubic" else None  # what a cubic plan is chosen for
        for line in (rescaled, check.line() if check else None, skipped, edge):
            if line:
                print(line)
        print(f"planned in {plan.planning_time_s:.2f} s" + (f"; wrote {args.out}" if args.out else ""))
    if check and check.warning():
        print(f"warning: {check.warning()}", file=sys.stderr)
    return 0


def _evaluate_torchrec(args) -> int:
    from cubic.core.config import Config, ShardingChoice
    from cubic.core.spec import Workload
    from cubic.runners.torchrec_runner import TorchRecRunner
    from sharding.torchrec_adapter import local_size_of
    from sharding.types import load_plan

    plan = load_plan(args.plan)
    W = args.world_size or plan.group_size
    if plan.group_size != W or plan.world_size != W:
        raise SpecError(f"plan is for {plan.world_size} ranks in groups of {plan.group_size}; --world-size {W} "
                        "local processes must equal both (2D replicas are not run here)", source=args.plan)
    local_size_of(plan, args.local_size)  # a --local-size that cannot hold these ranks: refused before the run
    wl = Workload(name=Path(args.plan).stem, tables=plan.tables, batch_size=plan.batch_size, topology=plan.topology)
    cfg = Config(sharding=ShardingChoice(plan=plan.model_dump(mode="json")), seed=args.seed)
    res = TorchRecRunner(world_size=W, local_size=args.local_size).run(wl, cfg, steps=args.steps,
                                                                        warmup=min(args.warmup, args.steps - 1))
    over = oversubscription(W)
    res = res.model_copy(update={"extra": {**res.extra, "oversubscription": over}})
    if args.json:
        print(res.model_dump_json(indent=1))
    elif res.ok:
        m, ph = res.metrics, res.phases_ms
        print(f"{res.extra['label']}; plan by {plan.planner} (target {plan.target}), batch {plan.batch_size}/rank, "
              f"{args.steps} steps, median of the last {args.steps - min(args.warmup, args.steps - 1)}")
        print(f"  step {m['step_time_median_ms']:.2f} ms (slowest rank; per rank "
              + ", ".join(f"{x:.1f}" for x in res.extra["per_rank_step_ms"]) + ")")
        print("  phases: " + ", ".join(f"{k} {v:.2f} ms" for k, v in ph.items()))
        print(f"  loss {m['loss_start']:.4f} -> {m['loss_end']:.4f}")
        print(f"  {over['line']}")
        if plan.predicted:
            dev = plan.topology.device
            print(f"cubic's estimate ({plan.predicted.source}, {dev}, embedding kernels + all-to-all only, one "
                  f"uncontended core per rank): max {plan.predicted.max_ms:.2f} ms per step"
                  + (f"; the measured step is on {over['processes']} processes sharing {over['cores']} cores, "
                     "so it is not comparable" if over["factor"] > 1 else
                     "; the measured step ran on a loaded machine, so it is not comparable" if over["loaded"] else
                     f"; measured / estimate {m['step_time_median_ms'] / plan.predicted.max_ms:.1f}x: the "
                     "estimate leaves out the dense part, the optimizer and the framework's own time"))
    if not res.ok:
        print(f"torchrec run failed ({res.failure_kind}): {res.reason}", file=sys.stderr)
        return 1
    return 0


def oversubscription(processes: int) -> dict:
    """Processes vs the cores this process may run on, with the line printed beside measured figures."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    factor = processes / cores
    # the load average counts this run's own processes too: above the cores, other work shared them
    loaded = factor <= 1 and load is not None and load > cores
    line = (f"{processes} processes on {cores} cores" + (f" (load {load:.1f})" if load is not None else "")
            + (f": OVERSUBSCRIBED {factor:.1f}x, each rank gets ~1/{factor:.1f} of a core, so the step time is "
               "inflated by CPU contention" if factor > 1 else
               f": LOADED, the load exceeds the {cores} cores, so other work shared them and the step time is "
               "inflated by CPU contention" if loaded else ": one core per process at least"))
    return {"processes": processes, "cores": cores, "factor": factor, "loadavg_1m": load, "loaded": loaded,
            "line": line}


def measure(plan, repeats: int, source: str):
    """The plan's cost with each rank's lookup measured on this CPU's kernel (communication modelled
    as the plan's topology says), and its lower bound from the device's modelled estimator."""
    from cost_models.comm import CommModel
    from sharding.estimate import measured_cost, table_lower_bound

    _check_measurable(plan, source)
    comm = CommModel.from_topology(plan.topology)
    cost = measured_cost(plan, repeats, comm)  # one comm model (a calibration file read once) for both
    # the lower bound is a function of the tables and the topology only: the device's modelled
    # estimator (never this plan's noisy measurements, which made it move with the plan)
    lb_est = _estimator(None, plan.topology.device)
    lb = table_lower_bound(plan.tables, plan.group_size, plan.batch_size, lb_est, comm)
    return cost.model_copy(update={"lower_bound_ms": lb, "details": {
        **cost.details, "repeats": repeats, "lower_bound": f"modelled: {lb_est.describe()}; comm as the columns"}})


def _compute_check(plan):
    """The compute check, where the plan carries a modelled CPU lookup and a measured one (else None)."""
    from sharding.estimate import compute_check

    if not (plan.predicted and plan.measured) or plan.topology.device != "cpu" or plan.predicted.source != "modelled":
        return None
    return compute_check(plan.predicted, plan.measured)


def cmd_evaluate(args) -> int:
    if args.backend == "torchrec":
        return _evaluate_torchrec(args)
    from sharding.types import format_plan, load_plan

    plan = load_plan(args.plan)
    cost = measure(plan, args.repeats, args.plan)
    plan = plan.model_copy(update={"measured": cost})
    if args.out:
        plan.save(args.out)
    if args.json:
        print(cost.model_dump_json(indent=1))
    else:
        print(sanitize(format_plan(plan, cost)))
        slow = max(cost.per_rank, key=lambda r: r.total_ms)
        print(f"of the slowest rank's {slow.total_ms:.2f} ms, {slow.compute_ms:.2f} ms lookup is MEASURED on this cpu "
              f"and {slow.comm_ms + slow.sync_ms:.2f} ms communication is MODELLED ({cost.details['comm']['kind']})")
        if plan.predicted:
            err = (plan.predicted.max_ms - cost.max_ms) / cost.max_ms
            print(f"predicted max {plan.predicted.max_ms:.2f} ms (modelled) vs {cost.max_ms:.2f} ms (measured lookup + "
                  f"modelled communication) ({err:+.1%})")
        check = _compute_check(plan)
        if check:
            print(check.line())
            if check.warning():
                print(f"warning: {check.warning()}", file=sys.stderr)
    return 0


def _check_measurable(plan, source: str) -> None:
    """The busiest rank's inputs, gradients and (row-capped) tables must fit in memory before measuring."""
    from cubic.core.spec import check_allocation
    from sharding.measure import ROW_CAP

    tables = {t.name: t for t in plan.tables}
    batch = plan.group_size * plan.batch_size  # a sharded piece pools the whole group's batch
    need = max((batch * sum(64 * tables[s.table].pooling_factor + 16 * s.cols for s in ss)
                + sum(12 * min(s.rows, ROW_CAP) * s.cols for s in ss)) for ss in plan.rank_shards())
    check_allocation(need, f"measuring a batch of {batch:,} examples", field="batch_size", source=source)


def cmd_collect(args) -> int:
    from cubic.cli.common import open_store, progress_bar
    from sharding.collect import collect

    store = open_store(args)
    t0 = time.perf_counter()
    with progress_bar("measuring rank shard sets") as cb:
        rows = collect(args.samples, seed=args.seed, repeats=args.repeats, store=store, start_index=args.start,
                       progress=cb)
    print(f"recorded {len(rows)} measured samples (table cubic_sharding_samples) of {store!r} "
          f"in {time.perf_counter() - t0:.0f} s")
    return 0


def cmd_train(args) -> int:
    import numpy as np
    from scipy.stats import spearmanr

    from cost_models.sharding_cost import ShardingCostModel
    from cubic.cli.common import open_store, user_data_output
    from cubic.core.fingerprint import fingerprint, fingerprint_hash
    from sharding.collect import features_and_labels, samples_from_store
    from sharding.estimate import USER_MODEL_NAME

    out = Path(args.out) if args.out else user_data_output(USER_MODEL_NAME)  # checked before the fit
    store = open_store(args, create=False)
    samples = samples_from_store(store)
    if len(samples) < 30:
        raise SpecError(f"only {len(samples)} samples for this machine in the store; run `cubic shard collect` first",
                        field="samples")
    X, y = features_and_labels(samples)
    idx = np.random.default_rng(args.seed).permutation(len(y))
    n_test = int(len(y) * args.holdout)
    test, train = idx[:n_test], idx[n_test:]
    m = ShardingCostModel(random_state=args.seed).fit(X[train], y[train])
    scores = {}
    if n_test >= 5:
        p = m.predict(X[test])
        scores = {"holdout_spearman": float(spearmanr(p, y[test])[0]),
                  "holdout_mape": float(np.mean(np.abs(p - y[test]) / y[test])), "holdout_n": n_test}
    if not args.holdout_only:
        m = ShardingCostModel(random_state=args.seed).fit(X, y)  # the shipped model sees every sample
    fp = fingerprint("cpu")
    meta = {"trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "samples": len(y),
            "store": repr(store), "fingerprint": fp, "fingerprint_hash": fingerprint_hash(fp),
            "label": "measured fwd+bwd ms (thread CPU time, FBGEMM CPU TBE, median of repeats)", **scores}
    out.parent.mkdir(parents=True, exist_ok=True)
    m.save(out, meta=meta)
    print(json.dumps({"wrote": str(out), **{k: v for k, v in meta.items() if k != "fingerprint"}}, indent=1))
    return 0


def cmd_export(args) -> int:
    from sharding.torchrec_adapter import to_torchrec, to_torchrec_json, torchrec_available
    from sharding.types import load_plan

    plan = load_plan(args.plan)
    if args.format != "torchrec":
        raise SpecError(f"unknown format {args.format!r} (known: torchrec)", field="--format")
    # maps every table onto TorchRec's layout or refuses (SpecError: one line, exit 2) naming the table
    doc = to_torchrec_json(plan, args.local_size)
    if torchrec_available():
        to_torchrec(plan, args.local_size)  # and TorchRec's own objects accept it
    text = json.dumps(doc, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
        print(f"wrote {args.out}")
    else:
        print(text)
    if doc["replicas"] > 1:  # what cubic has not run says so where the user reads it
        G, W = doc["world_size"], doc["world_size"] * doc["replicas"]
        print(f"cubic: note: a 2D plan ({doc['replicas']} replicas of groups of {G}): TorchRec runs it with "
              f"DMPCollection(plan=load_plan(...), sharding_group_size={G}, world_size={W}); a group's layout is "
              "what DMP runs (checked on CPU), but DMPCollection, CUDA-only in TorchRec 1.9, has not run a cubic "
              "plan: check the first steps of your job", file=sys.stderr)
    return 0


def cmd_calibrate(args) -> int:
    from cost_models.comm import USER_CALIBRATION_NAME, calibrate
    from cubic.cli.common import user_data_output

    out = args.out or user_data_output(USER_CALIBRATION_NAME)  # checked before the all-to-alls are measured
    doc = calibrate(repeats=args.repeats, path=out, passes=args.passes)
    print(json.dumps({"wrote": str(out), "constants": doc["constants"], "fit_mape": doc["fit_mape"],
                      "collectives": doc["collectives"], "oversubscribed": doc.get("oversubscribed"),
                      "passes": doc["passes"], "pass_spread": doc["pass_spread"],
                      "machine": doc["fingerprint"].get("cpu_model"), "fingerprint_hash": doc["fingerprint_hash"],
                      "loadavg_1m": doc["loadavg_1m"]}, indent=1))
    print("`cubic shard plan` on cpu now prices all-to-alls and 2D replica syncs with it (a plan records the file "
          "and its machine)",
          file=sys.stderr)
    return 0


def _register_plan(sub) -> None:
    from cubic.cli.common import (finite_float, int_at_most, nonnegative_float, nonnegative_int,
                                  positive_float_at_most, positive_int)
    from cubic.core.spec import MAX_BATCH_SIZE, MAX_MEMORY_GB, MAX_WORLD_SIZE
    from cubic.core.units import GB, GIB
    from sharding.types import PLANNERS

    pl = sub.add_parser("plan", help="plan the sharding of a set of tables")
    pl.add_argument("--tables", required=True, help="workload name/file or CSV (name,rows,dim,pooling_factor,zipf_alpha)")
    pl.add_argument("--world-size", type=int_at_most(MAX_WORLD_SIZE), default=None)
    mem = pl.add_mutually_exclusive_group()
    mem.add_argument("--memory-gb", type=positive_float_at_most(MAX_MEMORY_GB), default=None,
                     help="memory per rank in decimal GB (1e9 bytes, as a workload's topology.memory_per_rank_gb); "
                          "output shows memory in GiB; on a GPU --device at most its HBM (with --hbm-gb: HBM + host)")
    mem.add_argument("--memory-gib", type=positive_float_at_most(MAX_MEMORY_GB * GB / GIB), default=None,
                     help="memory per rank in GiB (2**30 bytes)")
    pl.add_argument("--group-size", type=int_at_most(MAX_WORLD_SIZE), default=None, help="2D sparse parallelism: ranks per group")
    pl.add_argument("--sync", choices=("gradients", "weights"), default=None,
                    help="2D: how the job keeps the replicas in step (its sharding.sync), priced by the planner "
                         "(default weights, as the runners)")
    pl.add_argument("--sync-interval", type=int_at_most(1_000_000), default=None,
                    help="2D, --sync weights: steps between weight syncs (the job's sharding.sync_interval; "
                         "default 100)")
    pl.add_argument("--batch-size", type=int_at_most(MAX_BATCH_SIZE), default=None, help="examples per rank per step")
    pl.add_argument("--ranks-per-node", type=positive_int, default=None)
    pl.add_argument("--device", default=None, help="cpu (learned CPU kernel model, calibrated comm) or a modelled GPU "
                    "(h100, h200, a100: HBM lookup model, comm from the topology bandwidths)")
    net = pl.add_argument_group("interconnect (default: the workload's topology; on cpu the calibration of "
                                "`cubic shard calibrate-comm` when there is one)")
    net.add_argument("--intra-node-bw-gbps", type=finite_float, default=None, help="per-rank bandwidth inside a node, GB/s")
    net.add_argument("--inter-node-bw-gbps", type=finite_float, default=None, help="per-rank bandwidth between nodes, GB/s")
    net.add_argument("--intra-node-latency-us", type=finite_float, default=None, help="per all-to-all inside a node, us")
    net.add_argument("--inter-node-latency-us", type=finite_float, default=None, help="per all-to-all between nodes, us")
    net.add_argument("--comm-model", default=None, choices=("auto", "bandwidth", "calibrated"),
                     help="bandwidth: the flags/topology above; calibrated: a calibration file (default when "
                          "--comm-calibration is given); a bandwidth/latency flag alone means bandwidth")
    net.add_argument("--comm-calibration", default=None, help="a `cubic shard calibrate-comm` file")
    pl.add_argument("--hbm-gb", type=finite_float, default=None,
                    help="HBM per rank, decimal GB: tables of a rank past it get TorchRec's UVM caching (cache "
                         "load factor from their access distribution) or UVM kernels; --memory-gb is then HBM + host")
    pl.add_argument("--planner", default="cubic", choices=PLANNERS)
    pl.add_argument("--target", default="torchrec", choices=("torchrec", "any"),
                    help="torchrec (default): only shard shapes TorchRec executes as planned (`shard export`); "
                         "any: cubic's free row splits too (cost studies only)")
    pl.add_argument("--model", default=None, help="cost model JSON (default: the shipped one)")
    pl.add_argument("--time-budget", type=nonnegative_float, default=3.0,
                    help="cubic search budget, seconds (0: none, the search's own limits only: the same inputs "
                         "give the same plan on any machine)")
    pl.add_argument("--check", action=argparse.BooleanOptionalAction, default=None,
                    help="on cpu (default there): measure each rank's lookup of the plan on this machine and say "
                         "how far the cost model's ms are from it; --no-check skips it")
    pl.add_argument("--rescale", action="store_true",
                    help="when the compute check finds the model outside its tolerance, plan again with the model "
                         f"scaled to the measured lookup (opt-in; {RESCALE_EVIDENCE})")
    pl.add_argument("--seed", type=nonnegative_int, default=0)
    pl.add_argument("--out", default=None)
    pl.add_argument("--json", action="store_true")
    pl.set_defaults(func=cmd_plan)


def register(subparsers) -> None:
    from cubic.cli.common import add_store_argument, fraction, int_at_most, nonnegative_int, positive_int

    p = subparsers.add_parser("shard", help="sharding plans for embedding tables")
    sub = p.add_subparsers(dest="verb", metavar="<verb>", required=True)
    _register_plan(sub)

    ev = sub.add_parser("evaluate", help="measure a plan's cost on the real kernel")
    ev.add_argument("plan")
    ev.add_argument("--repeats", type=int_at_most(MAX_REPEATS), default=5)
    ev.add_argument("--backend", default="kernel", choices=("kernel", "torchrec"),
                    help="kernel: each rank's shard set timed on FBGEMM + modelled comm; torchrec: train under "
                         "TorchRec DMP on --world-size local gloo processes")
    ev.add_argument("--world-size", type=positive_int, default=None, help="torchrec: processes (default: the plan's)")
    ev.add_argument("--local-size", type=positive_int, default=None, help="torchrec: ranks per node (LOCAL_WORLD_SIZE)")
    ev.add_argument("--steps", type=int_at_most(MAX_STEPS), default=10, help="torchrec: training steps")
    ev.add_argument("--warmup", type=int_at_most(MAX_STEPS, low=0), default=3,
                    help="torchrec: steps left out of the median")
    ev.add_argument("--seed", type=nonnegative_int, default=0)
    ev.add_argument("--out", default=None, help="write the plan with its measured cost")
    ev.add_argument("--json", action="store_true")
    ev.set_defaults(func=cmd_evaluate)

    co = sub.add_parser("collect", help="measure augmented rank shard sets into the trial store")
    co.add_argument("--samples", type=positive_int, default=200)
    co.add_argument("--seed", type=nonnegative_int, default=0)
    co.add_argument("--start", type=nonnegative_int, default=0, help="first sample index (to extend a collection)")
    co.add_argument("--repeats", type=int_at_most(MAX_REPEATS), default=3)
    add_store_argument(co)
    co.set_defaults(func=cmd_collect)

    tr = sub.add_parser("train", help="fit the learned cost model on collected samples")
    tr.add_argument("--out", default=None, help="default: $CUBIC_HOME (or ~/.local/share/cubic)/sharding_cost_model.json, "
                    "which `shard plan` then prefers to the packaged model")
    tr.add_argument("--holdout", type=fraction, default=0.2, help="share of the samples held out (default 0.2)")
    tr.add_argument("--holdout-only", action="store_true", help="save the model fitted without the holdout")
    tr.add_argument("--seed", type=nonnegative_int, default=0)
    add_store_argument(tr)
    tr.set_defaults(func=cmd_train)

    ex = sub.add_parser("export", help="export a plan to another planner's format")
    ex.add_argument("plan")
    ex.add_argument("--format", default="torchrec")
    ex.add_argument("--local-size", type=positive_int, default=None,
                    help="ranks per node in the job (LOCAL_WORLD_SIZE; default: the plan's ranks_per_node)")
    ex.add_argument("--out", default=None)
    ex.set_defaults(func=cmd_export)

    ca = sub.add_parser("calibrate-comm",
                        help="re-measure the gloo alpha-beta constants (all-to-all, all-reduce, all-gather)")
    ca.add_argument("--repeats", type=int_at_most(MAX_REPEATS), default=10)
    ca.add_argument("--passes", type=int_at_most(20), default=3,
                    help="fresh process groups per world, pooled by median (default 3)")
    ca.add_argument("--out", default=None, help="default: $CUBIC_HOME (or ~/.local/share/cubic)/comm_calibration.json, "
                    "which `shard plan` then prefers to the packaged one")
    ca.set_defaults(func=cmd_calibrate)
