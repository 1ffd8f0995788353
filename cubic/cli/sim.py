"""``cubic sim``: the simulated cluster from the command line. Every figure it prints is SIMULATED.

- ``cubic sim scale --workload wukong-large --cluster h100 --gpus 8,16,...,4096 --group-sizes 16,32,64``:
  predicted throughput, scaling efficiency and the dominant phase, full sharding vs 2D.
- ``cubic sim predict --workload wukong-large --simulate h100x64 [--config FILE]``: one step's
  breakdown (phases, memory, plan summary).
- ``cubic sim calibrate [--cluster cpu] [--workload dlrm-small] [--batches 64,256,1024]``: fit the step
  model's efficiency factors to measured step times (the store's measured trials, or fresh local runs)
  and report the fit's MAPE; ``--save FILE`` keeps the parameters for ``--params FILE``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cubic.cli.common import int_at_most, int_list_at_most
from cubic.core.spec import MAX_BATCH_SIZE, MAX_STEPS, MAX_WORLD_SIZE, SpecError, group_misfit

DEFAULT_GPUS = "8,16,32,64,128,256,512,1024,2048,4096"


_gpu_list = int_list_at_most(MAX_WORLD_SIZE)


def _params(args: argparse.Namespace):
    from cubic.runners.step_model import DEFAULT_PARAMS
    from cubic.runners.sim import load_params

    params = load_params(args.params) if getattr(args, "params", None) else DEFAULT_PARAMS
    update: dict[str, Any] = {}
    if getattr(args, "emb_sync", None):
        update["emb_sync"] = args.emb_sync
    if getattr(args, "sync_interval", None):
        if update.get("emb_sync", params.emb_sync) == "gradients":  # it changed nothing, without a word
            raise SpecError("only with weight averaging (--emb-sync weights): per-step gradient sync has no "
                            "interval", field="--sync-interval")
        update["emb_sync_interval"] = args.sync_interval
    _params_origin(args)  # after the flags' checks: bad input stays one line
    return params.model_copy(update=update) if update else params


def _params_origin(args: argparse.Namespace) -> None:
    """A calibration fitted on one cluster applied to another says so (stderr): `sim calibrate` on the CPU
    writes factors for the CPU's step, which --params then applied to an H100 cluster without a word."""
    import sys

    from cubic.core.spec import read_structured

    path = getattr(args, "params", None)
    target = getattr(args, "cluster", None) or str(getattr(args, "simulate", "") or "").rsplit("x", 1)[0]
    doc = read_structured(path) if path else None
    fitted = ((doc or {}).get("report") or {}).get("cluster") if isinstance(doc, dict) else None
    if fitted and target and fitted != target:
        print(f"cubic: note: --params {path} was fitted on cluster {fitted!r}; applied here to {target!r}, whose "
              "step it was not fitted to (the figures below are the model's with those factors)", file=sys.stderr)


def _config(args: argparse.Namespace):
    from cubic.cli.common import load_checked_config
    from cubic.runners.sim import simulation_config

    # a config silent on kernels.dense_dtype simulates as none does (bf16), not as Config's fp32
    return simulation_config(load_checked_config(args.config, processes=None) if args.config else None)


def cmd_scale(args: argparse.Namespace) -> int:
    from cost_models.hardware import load_cluster
    from cubic.cli.common import stdout_console
    from cubic.runners.sim import SCALING_CHECKED, dense_precision, scaling_sweep
    from cubic.core.workloads import load_workload
    from rich.table import Table as RichTable

    workload = load_workload(args.workload)
    cluster = load_cluster(args.cluster)
    config = _config(args)
    rows = scaling_sweep(workload, cluster, args.gpus, args.group_sizes, config, _params(args),
                         include_full=not args.no_full)
    for g in args.group_sizes:  # the sweep skips a group size that does not divide a GPU count: say so
        if all(group_misfit(g, w) for w in args.gpus):
            print(f"cubic: warning: --group-sizes {g} divides none of --gpus {','.join(map(str, args.gpus))}: "
                  "no 2D row for it", file=sys.stderr)
    if args.json:
        print(json.dumps({"simulated": True, "checked": SCALING_CHECKED, "workload": workload.name,
                          "cluster": cluster.name, "dense_dtype": config.kernels.dense_dtype,
                          "precision": dense_precision(config), "rows": rows}, indent=1, default=str))
        return 0
    t = RichTable(title=f"SIMULATED scaling of {workload.name} on {cluster.name} "
                        f"(batch {workload.batch_size}/GPU, {dense_precision(config)}; efficiency vs best per-GPU "
                        "at the smallest scale)")
    for col in ("GPUs", "strategy", "step ms", "examples/s", "per GPU", "efficiency", "dominant phase", "mem GiB"):
        t.add_column(col, justify="right" if col not in ("strategy", "dominant phase") else "left")
    for r in rows:
        if r["status"] != "ok":
            t.add_row(str(r["gpus"]), r["strategy"], "-", "-", "-", "-", r["status"].upper(),
                      f"{r.get('peak_mem_gib', float('nan')):.0f}")
            continue
        t.add_row(str(r["gpus"]), r["strategy"], f"{r['step_ms']:.1f}", f"{r['examples_per_s']:,.0f}",
                  f"{r['examples_per_s_per_gpu']:,.0f}", f"{r['scaling_efficiency']:.2f}", r["dominant_phase"],
                  f"{r['peak_mem_gib']:.0f}")
    stdout_console().print(t)
    print(SCALING_CHECKED)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from cubic.runners.step_model import predict_step
    from cubic.cli.common import stdout_console
    from cubic.core.units import fmt_gib, gib
    from cubic.runners.sim import SIM_CHECKED, SimulatedRunner, assumed_quality, dense_precision
    from cubic.runners.step_model import sync_params
    from cubic.core.workloads import load_workload

    workload = load_workload(args.workload)
    runner = SimulatedRunner.from_spec(args.simulate, params=_params(args))
    config = _config(args)
    try:
        p = predict_step(workload, config, runner.cluster, runner.world_size, runner.params)
    except SpecError as e:  # a config value that cannot run on this cluster: named in the config file
        if e.source is None and args.config and (e.field or "").split(".")[0] in type(config).model_fields:
            raise SpecError(e.message, source=args.config, field=e.field) from None
        raise
    quality = assumed_quality(workload.optimizers.embedding, p.group_size, runner.world_size,
                              sync_params(config, runner.params))
    precision = dense_precision(config, p.dense.get("site_precisions"))
    out = {
        "simulated": True, "cluster": runner.describe(), "workload": workload.name, "oom": p.oom,
        "oom_reason": p.oom_reason, "dense_dtype": config.kernels.dense_dtype, "precision": precision,
        "step_ms": p.step_s * 1e3, "examples_per_s": p.examples_per_s,
        "phases_ms": {k: v * 1e3 for k, v in p.phases_s.items()}, "dominant_phase": p.dominant_phase,
        "memory_gib": {k: gib(v) for k, v in p.memory.items()}, "peak_mem_gib": gib(p.peak_mem_bytes),
        "plan": p.plan, "dense": p.dense, "assumed_quality": quality, "checked": SIM_CHECKED,
    }
    if args.json:
        print(json.dumps(out, indent=1, default=str))
        return 1 if p.oom else 0
    con = stdout_console()
    con.print(f"SIMULATED step of {workload.name} on {runner.describe()['name']} "
              f"(group size {p.group_size}, batch {p.batch_per_rank}/GPU, {precision})")
    if p.oom:
        con.print(f"OOM: {p.oom_reason}")
        return 1
    con.print(f"step {p.step_s * 1e3:.2f} ms, {p.examples_per_s:,.0f} examples/s, peak memory "
              f"{fmt_gib(p.peak_mem_bytes)}, dominant phase: {p.dominant_phase}")
    for k, v in p.phases_s.items():
        con.print(f"  {k:<18} {v * 1e3:9.3f} ms")
    con.print("memory: " + ", ".join(f"{k} {fmt_gib(v)}" for k, v in p.memory.items()))
    if quality["ne_cost_rel"] is None:
        con.print(f"assumed NE cost vs full sharding: unknown ({quality['source']})")
    else:
        src = quality["source"]
        src = src if src.startswith(f"{quality['kind']}:") else f"{quality['kind']}: {src}"  # said once
        assumed = f"; ASSUMED: {quality['assumption']}" if quality.get("assumption") else ""
        con.print(f"assumed NE cost vs full sharding: {100 * quality['ne_cost_rel']:+.3f}% "
                  f"(95% CI {100 * quality['ci95'][0]:+.3f}..{100 * quality['ci95'][1]:+.3f}%; {src}{assumed})",
                  markup=False, highlight=False)
    con.print("plan: " + ", ".join(f"{k}={v}" for k, v in p.plan.items() if not isinstance(v, float))
              + f", embedding imbalance {p.plan.get('embedding_imbalance', 1.0):.2f}")
    con.print(SIM_CHECKED, markup=False, highlight=False)
    return 0


def _measured_cases(args: argparse.Namespace, cluster_name: str) -> tuple[list, list[float], str]:
    """(cases, measured step seconds, where they came from)."""
    from cubic.core.config import Config
    from cubic.core.workloads import load_workload

    cases: list = []
    y: list[float] = []
    if args.from_store:
        from cubic.cli.common import open_store

        store = open_store(args, create=False)
        for trial in store.trials(source="measured", status="ok"):
            if args.workload and trial.workload != args.workload:
                continue
            step = trial.metrics.get("step_time_median_ms")
            try:
                w = load_workload(trial.workload)
            except SpecError:
                continue  # a workload file no longer known by name
            if step and step > 0:
                cases.append((w, Config.model_validate(trial.config), args.world_size))
                y.append(step / 1e3)
        return cases, y, "measured trials in the store"
    from cubic.runners.local import LocalRunner  # measuring needs the local runner

    runner = LocalRunner(device="cpu", threads=1)  # single-thread: less noise on a shared machine
    workloads = [args.workload] if args.workload else ["dlrm-small", "wukong-small", "dmt-small"]
    for name in workloads:
        w = load_workload(name)
        for b in args.batches:
            cfg = Config(batch_size=b)
            res = runner.run(w, cfg, steps=args.steps, warmup=2)
            if res.ok and res.metrics.get("step_time_median_ms"):
                cases.append((w, cfg, 1))
                y.append(res.metrics["step_time_median_ms"] / 1e3)
    return cases, y, f"fresh MEASURED LocalRunner runs on this CPU ({args.steps} steps each)"


def cmd_calibrate(args: argparse.Namespace) -> int:
    from cubic.runners.calibration import (StepModelCalibrator, check_factors, cpu_cluster, cpu_params,
                                           measure_cpu_device)
    from cost_models.hardware import load_cluster
    from cubic.cli.common import stdout_console

    # before anything is measured: a typo here would be found after the runs
    factors = tuple(check_factors([f.strip() for f in args.factors.split(",") if f.strip()], field="--factors"))
    if args.cluster == "cpu":
        # fresh runs use one thread; stored trials were measured with whatever they used
        cluster = cpu_cluster(measure_cpu_device(1))
        base = cpu_params(1)
    else:
        cluster = load_cluster(args.cluster)
        base = _params(args)
    cases, y, origin = _measured_cases(args, cluster.name)
    if len(cases) < len(factors):
        raise SpecError(f"{len(cases)} measured step times found ({origin}); need at least {len(factors)}",
                        field="--from-store" if args.from_store else "--batches")
    cal = StepModelCalibrator(cluster, factors=factors, base_params=base).fit(cases, y)
    if args.save:
        cal.save(args.save)
    rep = cal.report() | {"origin": origin, "device": cluster.device.model_dump(mode="json")}
    # with as many cases as factors the fit is exact; only held-out error says how good it is
    rep["mape_leave_one_out_pct"] = cal.leave_one_out_mape(cases, y) if len(cases) > len(factors) else None
    if args.json:
        print(json.dumps(rep, indent=1, default=str))
        return 0
    con = stdout_console()
    con.print(f"calibrated the step model on {len(cases)} step times ({origin}), cluster {cluster.name}")
    for k, v in cal.factors_.items():
        con.print(f"  {k:<16} {v:.4g}")
    con.print(f"MAPE {cal.mape_before_:.1f}% before -> {cal.mape_:.1f}% after (on the fitted cases)")
    loo = rep["mape_leave_one_out_pct"]
    con.print(f"held-out (leave-one-out) MAPE {loo:.1f}%" if loo is not None else
              f"no held-out error: {len(cases)} cases for {len(factors)} factors (give more batches or workloads)")
    if args.save:
        con.print(f"saved to {args.save} (use with --params)")
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("sim", help="the SIMULATED GPU cluster: scaling, one-step breakdowns, calibration",
                              description="Analytical step-time model of training on a GPU cluster (H100/H200 "
                                          "or a YAML cluster). Every figure is SIMULATED, never measured.")
    from cubic.cli.common import positive_int

    sub = p.add_subparsers(dest="sim_command", metavar="<verb>", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--workload", default="wukong-large", metavar="NAME|FILE", help="default wukong-large")
        q.add_argument("--config", metavar="FILE", help="co-design config (default: bf16 dense, simulator's planner; "
                       "a config not setting kernels.dense_dtype is simulated in bf16 too)")
        q.add_argument("--params", metavar="FILE", help="step-model parameters (e.g. from `cubic sim calibrate --save`)")
        q.add_argument("--emb-sync", choices=["weights", "gradients"],
                       help="2D replica sync: periodic weight averaging (default) or per-step gradients")
        q.add_argument("--sync-interval", type=positive_int, metavar="STEPS", help="steps between 2D weight syncs (default 100)")
        q.add_argument("--json", action="store_true", help="machine-readable output")

    s = sub.add_parser("scale", help="throughput and scaling efficiency from 8 to 4096 GPUs: full sharding vs 2D")
    common(s)
    s.add_argument("--cluster", default="h100", metavar="NAME|FILE", help="h100, h200, a100 or a YAML cluster file (docs/clusters.md)")
    s.add_argument("--gpus", type=_gpu_list, default=_gpu_list(DEFAULT_GPUS), metavar="N,N,...")
    s.add_argument("--group-sizes", type=_gpu_list, default=[16, 32, 64], metavar="G,G,...",
                   help="2D sparse parallelism group sizes (default 16,32,64)")
    s.add_argument("--no-full", action="store_true", help="leave out full model-parallel sharding")
    s.set_defaults(func=cmd_scale)

    q = sub.add_parser("predict", help="one simulated step: phase breakdown, memory, plan")
    common(q)
    q.add_argument("--simulate", default="h100x64", metavar="CLUSTERxN", help="e.g. h100x64 (default), FILE.yamlx64, or a cluster file giving "
                   "world_size (docs/clusters.md)")
    q.set_defaults(func=cmd_predict)

    c = sub.add_parser("calibrate", help="fit efficiency factors to measured step times and report MAPE")
    c.add_argument("--cluster", default="cpu", metavar="cpu|NAME|FILE",
                   help="cpu (this machine, measured with micro-benchmarks; default) or a cluster name/file")
    c.add_argument("--workload", default=None, metavar="NAME", help="only this workload (default: the small ones)")
    c.add_argument("--from-store", action="store_true", help="fit to measured trials in the store instead of running")
    c.add_argument("--world-size", type=positive_int, default=1, help="GPUs of the stored measured trials (default 1)")
    c.add_argument("--batches", type=int_list_at_most(MAX_BATCH_SIZE), default=[64, 256, 1024], metavar="B,B,...",
                   help="batch sizes of the fresh local runs (default 64,256,1024)")
    c.add_argument("--steps", type=int_at_most(MAX_STEPS), default=20, help="timed steps per fresh run (default 20)")
    c.add_argument("--factors", default="gemm_eff,hbm_eff,step_overhead_s",
                   help="comma-separated factors to fit (gemm_eff, hbm_eff, nvlink_eff, net_eff, overlap, step_overhead_s)")
    c.add_argument("--params", metavar="FILE", help="starting parameters for a GPU cluster")
    c.add_argument("--save", metavar="FILE", help="write the fitted parameters and report (JSON)")
    c.add_argument("--json", action="store_true")
    c.add_argument("--store", metavar="URL", default=None, help="trial store URL (with --from-store)")
    c.set_defaults(func=cmd_calibrate, emb_sync=None, sync_interval=None)
