"""2D sparse parallelism through cubic's own runner (MEASURED on this CPU, gloo): quality and step time.

A thin study over :class:`cubic.runners.distributed.DistributedRunner` (the runner ``cubic run
--world-size W --plan P`` and ``torchrun -m cubic.runners.launch`` use): every variant is one runner
call with a config -- a plan, ``sharding.sync``/``sync_interval``, ``optimizers.embedding`` --
trained by :class:`cubic.core.train.TrainSession` on the workload's real dense model (DLRM here).
No training loop of its own.

Quality (W = 2 processes, 2D = 2 groups of 1 rank: two replicas of every table; the 2 processes
match this machine's 2 cores, and 2 replicas are enough for the semantics measured -- gradient
sync vs weight averaging vs none -- while 4 processes would double the time of every run):

- ``1d``: full sharding over the 2 ranks (the baseline); ``grad``: 2D, per-step all-reduce of
  touched-row gradients (must equal 1D up to float summation order: checked on the per-step losses);
  ``avg-10``, ``avg-100``: 2D, weights + row-wise optimizer state averaged every 10 / 100 steps,
  with row-wise AdaGrad and with ``ms_rowwise_adagrad`` (momentum-scaled row-wise AdaGrad of arXiv
  2508.03854 as RECONSTRUCTED FROM A THIRD-PARTY SUMMARY; see cubic.core.models.RowWiseAdagrad),
  both judged against 1D row-wise AdaGrad.
- NE cost = (NE(2D) - NE(1D)) / NE(1D) on the workload's eval batch at the end (2D: the mean of the
  replicas' own NE), paired by seed (a seed sets the model init and the data stream), mean over
  seeds with the 95% Student-t interval of experiments.common.paired.
- The workload (:func:`study_workload`): dlrm-small's tables capped at 1,000 rows (every row is seen
  often enough to learn), a noiseless teacher, embedding lr 0.1, dense lr 0.005 -- chosen with
  one-process runs so that the model learns: the end NE must be <= NE_BAR (see NE_BAR_WHY).

Speed (W = 4 gloo processes on this 2-core machine, 1 thread each: 2 processes per core, so the
step times include oversubscription): full sharding (G = 4) vs 2D (G = 2) with each sync, on the
same workload, beside the step model's prediction (cubic.runners.step_model.predict_step on this CPU
as measured by cubic.runners.calibration, links from the gloo calibration) for the same workload and plan.

Writes results/two_d.json (or results/two_d_quick.json) with ``targets``, a PNG, and
cost_models/data/two_d_quality.json (the NE cost table the simulator cites; a --quick run writes it
labelled quick).

Resolution seeds: the two NE targets (gradient sync inside +-0.1%, averaging every 100 steps resolved)
need more seeds than the six every variant gets: 1D and 2D part by float rounding, so one seed's NE
cost has an sd of ~0.4% (gradient sync) and ~1% (averaging every 100), and a 95% half-width of 0.1%
needs ~65 paired seeds. The full run adds seeds 6..RESOLVE_SEEDS-1 for the three variants those
targets compare (1d, grad, avg-100 with row-wise AdaGrad); their runs keep the first EARLY_STEPS losses.

    python experiments/two_d.py --quick    # 3 seeds x 300 steps, speed 30 steps (~12 min on 2 idle cores)
    python experiments/two_d.py            # 6 seeds (80 for the resolved targets) x 800 steps, speed 60 steps
                                           # (~50-60 min on 2 idle cores)
    python experiments/two_d.py --reanalyse  # this code's analysis of the stored runs; runs nothing
    python experiments/two_d.py --extend-to 185  # more resolution seeds on the same machine (~50 s a seed)
    python experiments/two_d.py --speed     # the speed section alone measured again (a few minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.common import LEARNS_NE_BAR as NE_BAR  # noqa: E402

NE_BAR_WHY = ("end NE of the 1D baseline <= 0.93: the model has removed >= 7% of the base rate's entropy, 70x the "
              "+-0.1% effect resolved, so an NE cost is a cost to a model that learns (the issue's 0.9 needs ~1,000 "
              "steps on this workload: the full run's 800 steps approach it; the quick run's 300 reach ~0.92)")
PARITY = 1e-3  # +-0.1% NE: the parity band the paper claims for 2D
RATIO_TOLERANCE = 0.25  # a model that only ranks layouts must at least get their ratios roughly right
SPEED_LOOKS = 4  # fresh re-measurements of the speed section: one look's ratio moved 0.17-0.31 in stop 72
AVG100_BOUND = 5e-3
TARGETS_WHY = ("per-step gradient sync computes the 1D update, so its NE cost must be inside +-0.1% (the parity band); "
               "weight averaging every 100 steps trains replicas apart between syncs: its cost must be resolved to "
               "+-0.1% (interval half-width) or shown to exceed 0.1%, and stay <= +0.5% for 2D to be worth recommending")
FLOAT32_GAP_WHY = (
    "a float32 gap, not a different update: on the seed that misses, float rounding flips one ReLU (a pre-activation "
    "of ~1e-7) at step 3 and row-wise AdaGrad's small accumulators magnify it; which of 1D and 2D drifts from the "
    "one-process run depends on the reference's embedding kernel (FBGEMM TBE vs nn.EmbeddingBag). The equality "
    "itself is checked in float64 with empty bags and repeated ids: 1D, 2D gradient sync and one process agree to "
    "1e-12 in every parameter (tests/test_runners_distributed_exact.py, in make test)")
PLANNER = "size_lookup_greedy"
VARIANTS = [  # (name, optimizer, sync, interval); group size 1 for 2D, full sharding for 1d
    ("1d", "rowwise_adagrad", None, None),
    ("grad", "rowwise_adagrad", "gradients", None),
    ("avg-10", "rowwise_adagrad", "weights", 10),
    ("avg-100", "rowwise_adagrad", "weights", 100),
    ("avg-10", "ms_rowwise_adagrad", "weights", 10),
    ("avg-100", "ms_rowwise_adagrad", "weights", 100),
]
RESOLVE_SEEDS = 80  # paired seeds for the two resolved NE targets (see the module docstring)
RESOLVE_VARIANTS = [v for v in VARIANTS if v[1] == "rowwise_adagrad" and v[0] in ("1d", "grad", "avg-100")]
QUALITY_FILE = Path(__file__).resolve().parent.parent / "cost_models" / "data" / "two_d_quality.json"


def study_workload(seed: int = 0, batch_per_rank: int = 256):
    """dlrm-small's tables and DLRM, tables capped at 1,000 rows, noiseless teacher, data seed per seed."""
    from cubic.core.spec import Workload
    from cubic.core.workloads import DEFAULT_WORKLOADS

    w = DEFAULT_WORKLOADS["dlrm-small"].model_dump(mode="json")
    w["name"] = "two-d-study"
    w["batch_size"] = batch_per_rank
    for t in w["tables"]:
        t["rows"] = min(t["rows"], 1000)
    w["data"].update(teacher_noise=0.0, seed=1000 + seed)
    w["optimizers"].update(embedding_lr=0.1, dense_lr=0.005)
    return Workload.model_validate(w)


def make_plan(wl, world: int, group: int):
    """The plan the runner would make for this config (the one plan path, sharding.from_config)."""
    from cubic.core.config import Config
    from sharding.from_config import plan_for

    return plan_for(wl, Config.model_validate({"sharding": {"planner": PLANNER, "group_size": group}}), world)


def variant_config(plan, seed: int, optimizer: str, sync: str | None, interval: int | None):
    from cubic.core.config import Config

    sharding = {"planner": PLANNER, "plan": plan.model_dump(mode="json")}
    if sync:
        sharding.update(sync=sync, **({"sync_interval": interval} if interval else {}))
    return Config.model_validate({"seed": seed, "sharding": sharding, "optimizers": {"embedding": optimizer}})


def run_quality(seeds, steps, log=print, variants=VARIANTS, keep_losses: int | None = None):
    """Every variant on every seed; ``keep_losses`` keeps only that many of each run's per-step losses
    (the resolution seeds: the early-loss check reads EARLY_STEPS, and 800 losses a run would make the
    result file megabytes)."""
    from cubic.runners.distributed import DistributedRunner

    runner = DistributedRunner(world_size=2, timeout_s=3600, verify=False, threads=1)
    runs = []
    for seed in seeds:
        wl = study_workload(seed)
        plans = {1: make_plan(wl, 2, 1), 2: make_plan(wl, 2, 2)}
        for name, opt, sync, interval in variants:
            cfg = variant_config(plans[2 if name == "1d" else 1], seed, opt, sync, interval)
            t0 = time.perf_counter()
            res = runner.run(wl, cfg, steps=steps, warmup=0)
            if not res.ok:
                raise RuntimeError(f"{name}/{opt} seed {seed}: {res.failure_kind}: {res.reason}")
            m = res.metrics
            runs.append({"variant": name, "optimizer": opt, "seed": seed, "ne": m["ne_end"], "ne_start": m["ne_start"],
                         "replica_ne": res.extra.get("two_d", {}).get("replica_ne_end", [m["ne_end"]]),
                         "losses": res.extra["train_losses"][:keep_losses], "step_ms_median": m["step_time_median_ms"],
                         "step_ms_ci": [m["step_time_ci_lo_ms"], m["step_time_ci_hi_ms"]],
                         "sync_ms_mean": m["sync_time_mean_ms"], "wall_s": time.perf_counter() - t0})
            log(f"seed {seed} {name:>7} {opt:>18}: NE {m['ne_end']:.4f} (start {m['ne_start']:.4f}), "
                f"step {m['step_time_median_ms']:.1f} ms, sync {m['sync_time_mean_ms']:.2f} ms/step, "
                f"{time.perf_counter() - t0:.0f} s")
    return runs


def summarise(runs):
    """Per (optimizer, variant): NE over seeds and the NE cost vs 1D row-wise AdaGrad paired by seed."""
    from cubic.runners.distributed import EARLY_STEPS
    from experiments.common import paired

    base = {r["seed"]: r for r in runs if r["variant"] == "1d"}
    groups: dict = {}
    for r in runs:
        groups.setdefault(r["optimizer"], {}).setdefault(r["variant"], []).append(r)
    out: dict = {}
    for opt, vs in groups.items():
        for var, rs in vs.items():
            refs = [base[r["seed"]] for r in rs]
            cost = [(r["ne"] - b["ne"]) / b["ne"] for r, b in zip(rs, refs)]
            early = max(max(abs(a - c) / abs(c) for a, c in zip(r["losses"][:EARLY_STEPS], b["losses"][:EARLY_STEPS]))
                        for r, b in zip(rs, refs))
            out.setdefault(opt, {})[var] = {
                "baseline": "1d/rowwise_adagrad", "seeds": [r["seed"] for r in rs],
                "ne_per_seed": [r["ne"] for r in rs], "ne_mean": statistics.fmean(r["ne"] for r in rs),
                "ne_cost_rel": paired(cost, PARITY),
                "early_loss_max_rel_diff_vs_1d": early,
                "step_ms_median": statistics.median(r["step_ms_median"] for r in rs),
                "sync_ms_mean": statistics.fmean(r["sync_ms_mean"] for r in rs),
            }
    return out


def run_speed(steps, log=print, looks: int = 0):
    """4 gloo processes: full sharding vs 2D (G = 2) per sync, measured, beside the step model; then
    ``looks`` fresh re-measurements of the three cases (each row's ``looks_*``: the first look and the
    fresh ones), so that the ratio target is judged on more than one look. Then the same three cases on
    2 processes, a core each (``one_core_each``: the regime the model describes, so whether sharing a
    core explains the 4-process miss is measured, not assumed)."""
    speed = speed_cases(4, steps, log, looks)
    log("one core each (2 processes):")
    speed["one_core_each"] = speed_cases(2, steps, log, looks)
    return speed


def speed_cases(processes: int, steps: int, log, looks: int) -> dict:
    """Full sharding (G = processes) vs 2D (G = processes / 2) per sync on ``processes`` gloo processes,
    measured ``1 + looks`` times, beside the step model."""
    from experiments.common import calibration_origin
    from cubic.runners.calibration import cpu_gloo_model, measure_cpu_device
    from cubic.runners.distributed import DistributedRunner
    from cubic.runners.step_model import predict_step

    P, g = processes, processes // 2
    wl = study_workload(0)
    plans = {P: make_plan(wl, P, P), g: make_plan(wl, P, g)}
    cases = [(f"1d (full sharding, G={P})", P, None, None), (f"2D G={g}, gradient sync", g, "gradients", None),
             (f"2D G={g}, averaging every 100", g, "weights", 100)]
    # the links are a gloo calibration (the user's, else the packaged one: 'links' says whose machine):
    # with free links the model could not see the sync's cost
    cluster, params = cpu_gloo_model(measure_cpu_device(1), P)
    links = calibration_origin(processes=P)
    runner = DistributedRunner(world_size=P, timeout_s=3600, verify=False, threads=1)
    cores = os.cpu_count() or 1

    def measured(name, cfg, look):
        res = runner.run(wl, cfg, steps=steps, warmup=5)
        if not res.ok:
            raise RuntimeError(f"{name}{f' (look {look})' if look > 1 else ''}: {res.failure_kind}: {res.reason}")
        return res

    rows = []
    for name, gs, sync, interval in cases:
        cfg = variant_config(plans[gs], 0, "rowwise_adagrad", sync, interval)
        res = measured(name, cfg, 1)
        m = res.metrics
        pred = predict_step(wl, cfg, cluster, P, params)  # batch: per rank, as the plan
        rows.append({"case": name, "group_size": gs, "sync": sync, "sync_interval": interval,
                     "measured_step_ms": m["step_time_median_ms"],
                     "measured_step_ms_ci95": [m["step_time_ci_lo_ms"], m["step_time_ci_hi_ms"]],
                     "measured_sync_ms_mean": m["sync_time_mean_ms"], "measured_comm_ms_median": m["comm_time_median_ms"],
                     "predicted_step_ms": pred.step_s * 1e3, "predicted_phases_ms": pred.standard_phases_ms(),
                     "predicted_sync_ms": pred.phases_s["embedding_sync"] * 1e3,
                     **sync_volume(res, plans[gs], wl, sync)})
        log(f"{name}: measured {m['step_time_median_ms']:.1f} ms [{m['step_time_ci_lo_ms']:.1f}, "
            f"{m['step_time_ci_hi_ms']:.1f}], sync {m['sync_time_mean_ms']:.2f} ms/step; modelled {pred.step_s * 1e3:.1f} ms"
            f", sync {pred.phases_s['embedding_sync'] * 1e3:.2f} ms/step")
    for r in rows:
        r["looks_measured_step_ms"] = [r["measured_step_ms"]]
    for k in range(looks):
        for r, (name, gs, sync, interval) in zip(rows, cases):
            res = measured(name, variant_config(plans[gs], 0, "rowwise_adagrad", sync, interval), k + 2)
            r["looks_measured_step_ms"].append(res.metrics["step_time_median_ms"])
        log(f"look {k + 2}: " + ", ".join(f"{r['case']} {r['looks_measured_step_ms'][-1]:.1f} ms" for r in rows))
    b = rows[0]
    for r in rows:
        r["measured_ratio_vs_1d"] = r["measured_step_ms"] / b["measured_step_ms"]
        r["predicted_ratio_vs_1d"] = r["predicted_step_ms"] / b["predicted_step_ms"]
        r["looks_measured_ratio_vs_1d"] = [x / y for x, y in zip(r["looks_measured_step_ms"], b["looks_measured_step_ms"])]
    shared = P > cores
    return {"processes": P, "cores": cores, "threads_per_process": 1, "steps": steps, "workload": wl.name,
            "looks": 1 + looks,
            "note": (f"MEASURED: {P} gloo processes on {cores} cores ("
                     + ("processes share cores: contention is in every figure" if shared else "a core each or more")
                     + "); MODELLED: the step model with this CPU's measured GEMM/memory figures (cpu_params), one "
                     "device per rank" + (" (it does not model processes sharing a core)" if shared else "")
                     + f", links from the gloo calibration {links['file']} (cubic.runners.calibration."
                     f"cpu_gloo_cluster), each collective its own fit of {links['fit']}, {links['where']}"),
            "links": {k: links[k] for k in ("file", "machine", "this_machine", "where", "fit", "fit_mape")},
            "cluster_sources": dict(cluster.sources),
            "rows": rows}


def modelled_rank0_sync_bytes(plan, wl) -> float:
    """The bytes the rule prices for rank 0's pieces of a gradient sync (one vectorised
    cost_models.comm.touched_row_sync_bytes call over them, as the step model makes it)."""
    from cost_models.comm import group_draws, touched_row_sync_bytes

    tables, G, R = {t.name: t for t in wl.tables}, plan.group_size, plan.world_size // plan.group_size
    mine = [(sh, tables[sh.table]) for sh in plan.shards if sh.rank == 0 and sh.sharding_type != "data_parallel"]
    if not mine:
        return 0.0
    ids, grads = touched_row_sync_bytes([sh.rows for sh, _ in mine], [sh.cols for sh, _ in mine],
                                        [t.access.effective_alpha() for _, t in mine],
                                        [group_draws(t, sh.rows, G, plan.batch_size) for sh, t in mine], R)
    return float(ids.sum() + grads.sum())


def sync_volume(res, plan, wl, sync: str | None) -> dict:
    """A gradient sync's bytes on rank 0 per step: counted by the runner (MEASURED) beside the rule the
    planner and the step model price (MODELLED, cost_models.comm.touched_row_sync_bytes over rank 0's pieces);
    and the ms rank 0 spent inside its three collectives (MEASURED; the rest of the sync finds and merges rows),
    and of those, waiting for a replica peer to arrive (MEASURED, cubic.runners.distributed._peer_wait)."""
    counted = (res.extra.get("two_d") or {}).get("sync_volume_rank0")
    if sync != "gradients" or not counted:
        return {}
    modelled = modelled_rank0_sync_bytes(plan, wl)
    measured = counted["ids_bytes_per_sync"] + counted["grad_bytes_per_sync"]
    return {"measured_sync_bytes_rank0": measured, "modelled_sync_bytes_rank0": modelled,
            "sync_bytes_modelled_over_measured": modelled / measured,
            "measured_sync_collectives_ms_rank0": counted["collective_ms_per_sync"],
            **({"measured_sync_peer_wait_ms_rank0": counted["peer_wait_ms_per_sync"]}
               if "peer_wait_ms_per_sync" in counted else {})}


def unresolved_reason(st: dict) -> str:
    """Why an NE cost is not resolved against +-PARITY, saying whether its interval still excludes 0, and,
    when the interval is already narrower than the band but off centre, which side of the band holds."""
    from cubic.core.stats import samples_to_resolve

    lo, hi = st["ci95"]
    if st["half_width"] > PARITY:
        why = (f"{st['seeds']} seeds leave a half-width of {100 * st['half_width']:.3f}%; about "
               f"{st['seeds_to_resolve']} would resolve it (--extend-to {st['seeds_to_resolve']} adds them)")
    else:  # narrow enough, off centre: more seeds only help while the mean stays inside the band
        below = lo < -PARITY
        side = (f"no cost above {100 * hi:+.3f}% (the +{100 * PARITY:.1f}% side holds), while 2D may be up to "
                f"{-100 * lo:.3f}% better than 1D" if below else
                f"2D may cost up to {100 * hi:+.3f}% (the +{100 * PARITY:.1f}% side is not shown)")
        why = (f"{st['seeds']} seeds give a half-width of {100 * st['half_width']:.3f}%, narrower than the band, "
               f"but the interval sits off centre (mean {100 * st['mean']:+.3f}%): {side}")
        if abs(st["mean"]) < PARITY:
            n = samples_to_resolve(st["sd"], PARITY - abs(st["mean"]))
            why += f"; about {n} seeds would bring it inside if the mean held (--extend-to {n})"
    if lo > 0 or hi < 0:
        side = "better" if hi < 0 else "worse"
        why = (f"the 95% CI [{100 * lo:+.3f}%, {100 * hi:+.3f}%] excludes 0 (measurably {side} than 1D on this "
               f"workload) but crosses the {'-' if hi < 0 else '+'}{100 * PARITY:.1f}% edge: " + why)
    elif st["half_width"] <= PARITY:
        why = (f"the 95% CI [{100 * lo:+.3f}%, {100 * hi:+.3f}%] crosses the {'-' if lo < -PARITY else '+'}"
               f"{100 * PARITY:.1f}% edge: " + why)
    return why


def ratio_errors(speed: dict) -> list[float]:
    """The step model's worst 2D/1D ratio error over the 2D cases, per look (the first look first)."""
    rows = speed["rows"][1:]
    first = max(abs(r["predicted_ratio_vs_1d"] / r["measured_ratio_vs_1d"] - 1.0) for r in rows)
    return [first] + [max(abs(r["predicted_ratio_vs_1d"] / r["looks_measured_ratio_vs_1d"][k] - 1.0) for r in rows)
                      for k in range(1, speed.get("looks", 1))]


def _sync_text(rows) -> str:
    return ", ".join(f"{r['case']}: {r['measured_sync_ms_mean']:.1f} ms/step"
                     + (f", modelled {r['predicted_sync_ms']:.2f}" if "predicted_sync_ms" in r else "")
                     + (f", its bytes modelled at {r['sync_bytes_modelled_over_measured']:.2f}x the runner's count"
                        if "sync_bytes_modelled_over_measured" in r else "")
                     + (f", {r['measured_sync_collectives_ms_rank0']:.1f} ms of it inside the collectives on rank 0"
                        if "measured_sync_collectives_ms_rank0" in r else "")
                     + (f" ({r['measured_sync_peer_wait_ms_rank0']:.1f} of those waiting for a replica peer to arrive)"
                        if "measured_sync_peer_wait_ms_rank0" in r else "") for r in rows)


def one_core_each(speed: dict) -> dict | None:
    """The same check with a core per process (``speed['one_core_each']``, runs since stop 73): whether
    sharing cores explains the 4-process miss, measured."""
    sp = speed.get("one_core_each")
    if not sp:
        return None
    from cubic.core.stats import mean_interval

    errs = ratio_errors(sp)
    out = {"processes": sp["processes"], "cores": sp["cores"], "ratio_error_first_look": errs[0],
           "label": "measured vs modelled, a core per process (not a target: the evidence for the 4-process reason)"}
    if len(errs) > 1:
        mean, lo, hi = mean_interval(errs)
        out["ratio_error_over_looks"] = {"looks": len(errs), "per_look": errs, "mean": mean, "ci95": [lo, hi]}
    over = out.get("ratio_error_over_looks")
    out["holds"] = bool(max(errs[0], over["mean"] if over else 0.0) <= RATIO_TOLERANCE)
    out["text"] = (f"with a core per process ({sp['processes']} processes on {sp['cores']} cores) the ratio error is "
                   f"{errs[0]:.0%} on the first look"
                   + (f", {over['mean']:.0%} [{over['ci95'][0]:.0%}, {over['ci95'][1]:.0%}] over {over['looks']} looks"
                      if over else "")
                   + (": within the bar, as sharing cores being the 4-process miss would have it"
                      if out["holds"] else ": past the bar too, so sharing cores does not explain the miss alone")
                   + " (" + _sync_text(sp["rows"][1:]) + ")")
    return out


def comm_regime_text() -> str:
    """What experiments/comm_regime.py measured of gloo calls after compute, per layout (its stored
    result: the second look at the link model itself), or nothing when it has not run."""
    from experiments.common import stored_result

    def span(xs: list[float]) -> str:
        lo, hi = f"{min(xs):.1f}", f"{max(xs):.1f}"
        return f"{lo}x" if lo == hi else f"{lo}-{hi}x"

    parts = [f"{key.rsplit(', ', 1)[0]} {span(v['measured_over_modelled_per_look'])} (the exchange alone "
             f"{span(v['exchange_over_modelled_per_look'])})"
             for key, v in (stored_result("comm_regime").get("summary") or {}).items()
             if key.endswith(", after_compute")]
    return ("; fresh gloo calls after compute ran at these multiples of the calibration's line "
            "(experiments/comm_regime.py, results/comm_regime.json): " + ", ".join(parts)) if parts else ""


def speed_target(speed: dict) -> dict:
    """The step model's second look: its 2D/1D step-time ratio beside the measured one, per 2D case. With
    fresh looks recorded, the error is also judged over them: met only when the first look and the mean
    over the looks both meet it (one look's error moved 0.17-0.31 between three re-measurements). A miss's
    reason says what the same check gave with a core per process (:func:`one_core_each`)."""
    from cubic.core.stats import mean_interval

    rows = speed["rows"][1:]
    per_look = ratio_errors(speed)
    err = per_look[0]
    t = {"measured": err, "target": RATIO_TOLERANCE, "met": bool(err <= RATIO_TOLERANCE),
         "ratios": {r["case"]: {"measured": r["measured_ratio_vs_1d"], "modelled": r["predicted_ratio_vs_1d"]}
                    for r in rows}}
    over = ""
    if len(per_look) > 1:
        mean, lo, hi = mean_interval(per_look)
        over = f"; over {len(per_look)} looks mean {mean:.0%} [{lo:.0%}, {hi:.0%}]"
        t["over_looks"] = {"looks": len(per_look), "per_look": per_look, "mean": mean, "ci95": [lo, hi],
                           "label": "measured: fresh re-measurements of the three cases"}
        if t["met"] and mean > RATIO_TOLERANCE:
            t["met"] = False
            t["reason"] = (f"met on the first look ({err:.0%}) but not over {len(per_look)} looks (mean {mean:.0%} "
                           f"[{lo:.0%}, {hi:.0%}]): it does not survive a re-measurement")
        elif t["met"] and hi > RATIO_TOLERANCE:
            t["note"] = (f"met on the first look and over {len(per_look)} looks (mean {mean:.0%}), but the mean's "
                         f"95% interval [{lo:.0%}, {hi:.0%}] reaches past {RATIO_TOLERANCE:.0%}: not resolved")
    one = one_core_each(speed)
    if one:
        t["one_core_each"] = one
    if err > RATIO_TOLERANCE or not t["met"]:
        b = speed["rows"][0]
        t["reason"] = t.get("reason", f"{err:.0%} on the first look{over}") + ": " + (
            f"the model prices 1D at {b['predicted_step_ms']:.1f} ms against {b['measured_step_ms']:.1f} ms measured: "
            f"it gives each rank a core of its own (here {speed.get('processes', 4)} processes share "
            f"{speed.get('cores', 2)}) and prices a collective as the gloo calibration's alpha-beta line, while the "
            "measured sync (" + _sync_text(rows) + ") also pays for finding and merging the touched rows"
            + ("; " + one["text"] if one else " and for waiting on a descheduled peer") + comm_regime_text()
            + "; the simulator's 2D speed figures are not validated by this machine")
    return {f"step model: 2D/1D step-time ratio within {RATIO_TOLERANCE:.0%} of the measured ratio "
            "(modelled vs measured, 4 gloo processes)": t}


def quality_doc(summary, payload) -> dict:
    """The packaged quality table the simulator reads (cost_models.two_d_quality)."""
    entries = []
    for opt, vs in summary.items():
        for var, s in vs.items():
            if var == "1d":
                continue
            st = s["ne_cost_rel"]
            entries.append({"optimizer": opt, "sync": "gradients" if var == "grad" else "weights",
                            "interval": 1 if var == "grad" else int(var.split("-")[1]),
                            "ne_cost_rel": st["mean"], "ci95": st["ci95"], "seeds": st["seeds"],
                            "baseline": s["baseline"]})
    q = payload["quick"]
    return {
        "what": "NE cost of 2D sparse parallelism vs full (1D) sharding, per embedding optimizer and replica sync",
        "metric": ("ne_cost_rel = (NE(2D) - NE(1D)) / NE(1D) on the workload's eval batch (2D: mean of the replicas), "
                   "paired by seed; mean over seeds with a 95% Student-t interval"),
        "kind": "measured",
        "provenance": {
            "run": "experiments/two_d.py" + (" --quick" if q else ""),
            "result": "results/two_d" + ("_quick" if q else "") + ".json",
            "date": payload["started_at"], "code_version": payload["code_version"],
            "measured_on": (f"CPU gloo, 2 processes (2D: 2 groups x 1 rank), cubic's DistributedRunner, workload "
                            f"{payload['workload']} (DLRM, 8 tables <= 1,000 rows, batch 256/rank), "
                            f"{payload['steps']} steps, the seeds in each entry, 1D end NE "
                            f"{payload['ne_end_1d_mean']:.3f}"),
            "quick": q,
            # seeds added later by --extend-to: their own measurement's code and start
            **({"extended": [{"code_version": e["code_version"], "started_at": e["started_at"], "seeds": e["seeds"]}
                             for e in payload["extensions"]]} if payload.get("extensions") else {}),
        },
        "entries": entries,
    }


def plot(summary, speed, path, quick: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    one = speed.get("one_core_each")
    fig, axes = plt.subplots(1, 3 if one else 2, figsize=(18 if one else 12, 4.5))
    a = axes[0]
    labels, means, errs = [], [], []
    for opt, vs in summary.items():
        for var, s in vs.items():
            if var == "1d":
                continue
            st = s["ne_cost_rel"]
            labels.append(f"{var}\n{'ms-' if opt.startswith('ms') else ''}rw-adagrad\n{st['seeds']} seeds")
            means.append(100 * st["mean"])
            errs.append(100 * st["half_width"] if st["seeds"] > 1 else 0.0)
    a.bar(range(len(means)), means, yerr=errs, capsize=4, color="tab:blue")
    a.axhspan(-100 * PARITY, 100 * PARITY, color="tab:green", alpha=0.15, label="+-0.1% parity")
    a.axhline(0, color="k", lw=0.8)
    a.set_xticks(range(len(labels)), labels, fontsize=8)
    a.set_ylabel("NE cost vs 1D, % (measured, 95% CI)")
    a.set_title("2D quality (2 gloo processes, 2 groups x 1)" + (" -- QUICK run" if quick else ""))
    a.legend(fontsize=8)
    for b, sp in zip(axes[1:], [speed] + ([one] if one else [])):
        _speed_panel(b, sp, quick)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _speed_panel(b, sp: dict, quick: bool) -> None:
    """Measured (95% CI) beside modelled step time of one process count's three cases."""
    rows = sp["rows"]
    x = range(len(rows))
    a2 = [r["measured_step_ms"] for r in rows]
    lo = [r["measured_step_ms"] - r["measured_step_ms_ci95"][0] for r in rows]
    hi = [r["measured_step_ms_ci95"][1] - r["measured_step_ms"] for r in rows]
    procs, cores = sp.get("processes", 4), sp.get("cores", 2)
    b.bar([i - 0.2 for i in x], a2, 0.4, yerr=[lo, hi], capsize=4, label=f"measured ({procs} procs / {cores} cores)")
    b.bar([i + 0.2 for i in x], [r["predicted_step_ms"] for r in rows], 0.4, label="modelled (step model)")
    b.set_xticks(list(x), [r["case"].replace(", ", "\n") for r in rows], fontsize=8)
    b.set_ylabel("step time, ms")
    b.set_title(f"step time, {procs} processes: full sharding vs 2D" + (" -- QUICK run" if quick else ""))
    b.legend(fontsize=8)


def result_payload(ctx: dict, quick: bool, steps: int, seeds: list[int], resolve: list[int], runs: list[dict],
                   speed: dict, runtime_s: float) -> dict:
    """A run's result file from its measured ``runs`` and ``speed``: its summary, labels and targets. The
    one analysis of a fresh run and of ``--reanalyse`` (the stored runs read back)."""
    from cubic.runners.distributed import EARLY_STEPS

    summary = summarise(runs)
    ra = summary["rowwise_adagrad"]
    ne_1d = ra["1d"]["ne_mean"]
    g, a100 = ra["grad"], ra["avg-100"]["ne_cost_rel"]
    resolved = a100["half_width"] <= PARITY or a100["ci95"][0] > PARITY or a100["ci95"][1] < -PARITY
    payload = {**ctx, "what": "2D sparse parallelism through cubic's DistributedRunner (this CPU, gloo): NE and step time",
               "quick": quick, "steps": steps, "seeds": seeds, "resolve_seeds": resolve,
               "resolve_variants": [f"{n}/{o}" for n, o, _, _ in RESOLVE_VARIANTS], "workload": study_workload(0).name,
               "workload_spec": study_workload(0).model_dump(mode="json"),
               "quality_layout": "2 processes: 1D = full sharding over 2 ranks; 2D = 2 groups x 1 rank (2 replicas)",
               "labels": {"ne": "measured (eval batch, end of run; 2D: mean of the replicas)",
                          "runs": (f"every variant on seeds {seeds[0]}..{seeds[-1]}; the resolution seeds "
                                   f"(resolve_seeds) run only resolve_variants and keep their first {EARLY_STEPS} "
                                   "losses"),
                          "step time": "measured (median of windows, 95% order-statistics CI)",
                          "predicted_step_ms": "modelled (cubic.runners.step_model)"},
               "optimizers": {"rowwise_adagrad": "row-wise AdaGrad (FBGEMM EXACT_ROWWISE_ADAGRAD's rule)",
                              "ms_rowwise_adagrad": ("momentum-scaled row-wise AdaGrad, RECONSTRUCTED FROM A THIRD-PARTY "
                                                     "SUMMARY of arXiv 2508.03854: accumulator / replicas")},
               "ne_bar": NE_BAR, "ne_bar_why": NE_BAR_WHY, "ne_end_1d_mean": ne_1d,
               "summary": summary, "speed": speed, "runs": runs, "targets_rationale": TARGETS_WHY,
               "runtime_s": runtime_s}
    payload["targets"] = {
        f"1D end NE <= {NE_BAR} (the model learns; measured, mean over seeds)": {
            "measured": ne_1d, "target": NE_BAR, "met": bool(ne_1d <= NE_BAR),
            **({} if ne_1d <= NE_BAR else {"reason": "the 1D model did not learn enough in this many steps: the NE "
                                                    "costs below are measured on a model that barely learns"})},
        "per-step gradient sync: max relative early-loss gap vs 1D (float summation order; measured)": {
            "measured": g["early_loss_max_rel_diff_vs_1d"], "target": 1e-4, "met": bool(g["early_loss_max_rel_diff_vs_1d"] <= 1e-4),
            **({} if g["early_loss_max_rel_diff_vs_1d"] <= 1e-4 else {"reason": FLOAT32_GAP_WHY})},
        "per-step gradient sync: |NE cost vs 1D| inside +-0.1% (measured, 95% CI)": {
            "measured": g["ne_cost_rel"]["mean"], "ci95": g["ne_cost_rel"]["ci95"], "target": PARITY,
            "met": bool(g["ne_cost_rel"]["ci_inside_target"]),
            **({} if g["ne_cost_rel"]["ci_inside_target"] else {
                "reason": unresolved_reason(g["ne_cost_rel"]) + " (the trajectories of 1D and 2D part by float "
                                                                "rounding, see the early-loss target)"})},
        "averaging every 100 steps: NE cost resolved within +-0.1% or shown to exceed it (measured, 95% CI)": {
            "measured": a100["mean"], "ci95": a100["ci95"], "half_width": a100["half_width"], "target": PARITY,
            "met": bool(resolved), **({} if resolved else {"reason": unresolved_reason(a100)})},
        "averaging every 100 steps: NE cost <= +0.5% (measured, mean)": {
            "measured": a100["mean"], "target": AVG100_BOUND, "met": bool(a100["mean"] <= AVG100_BOUND),
            **({} if a100["mean"] <= AVG100_BOUND else {"reason": f"mean NE cost {100 * a100['mean']:+.2f}% over "
                                                                  f"{a100['seeds']} paired seeds"})},
    }
    payload["targets"].update(speed_target(speed))
    return payload


def measure(args) -> dict:
    """A fresh run: the quality runs (with the resolution seeds) and the speed runs, as a result payload."""
    from experiments.common import run_context
    from cubic.runners.distributed import EARLY_STEPS

    steps = args.steps or (300 if args.quick else 800)
    seeds = list(range(args.seeds or (3 if args.quick else 6)))
    ctx = run_context("measured")
    t0 = time.perf_counter()
    runs = run_quality(seeds, steps, log=lambda s: print(s, flush=True))
    resolve = list(range(len(seeds), args.resolve_seeds if args.resolve_seeds is not None else
                         (0 if args.quick else RESOLVE_SEEDS)))
    runs += run_quality(resolve, steps, log=lambda s: print(s, flush=True), variants=RESOLVE_VARIANTS,
                        keep_losses=EARLY_STEPS)
    speed = run_speed(args.speed_steps or (30 if args.quick else 60), log=lambda s: print(s, flush=True),
                      looks=speed_looks(args))
    return result_payload(ctx, args.quick, steps, seeds, resolve, runs, speed, time.perf_counter() - t0)


def _stored_payload(d: dict, resolve: list[int], runs: list[dict]) -> dict:
    """The one analysis over a stored run's ``runs``: its context (code_version: the first measurement's),
    speed and additions kept."""
    ctx = {k: d[k] for k in ("kind", "fingerprint", "fingerprint_hash", "versions", "code_version", "started_at",
                             "loadavg_1m_at_start")}
    payload = result_payload(ctx, d["quick"], d["steps"], d["seeds"], resolve, runs, d["speed"], d["runtime_s"])
    payload.update(finished_at=d["finished_at"], loadavg_1m_at_end=d["loadavg_1m_at_end"])
    if d.get("extensions"):
        payload["extensions"] = d["extensions"]
    return payload


def _stored_run(name: str, flag: str) -> tuple[Path, dict]:
    """The stored result file ``flag`` works on (ExtendError, naming the flag, when there is none or it
    lacks a field this code reads)."""
    from experiments.common import RESULTS

    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise ExtendError(f"{flag}: no stored run at {path} (run experiments/two_d.py first)")
    d = json.loads(path.read_text())
    for field in ("seeds", "resolve_seeds", "runs", "speed"):  # what this code re-reads; older files lack some
        if field not in d:
            raise ExtendError(f"{flag}: {path}: no field {field!r} (written by code {d.get('code_version')}, "
                              f"older than this analysis: measure it afresh, experiments/two_d.py"
                              f"{' --quick' if d.get('quick') else ''})")
    return path, d


def _reanalysed_stamp() -> dict:
    """Which code re-analysed a stored run, and when."""
    from cubic.core.fingerprint import code_version

    return {"code_version": code_version(), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def reanalysed(name: str) -> dict:
    """--reanalyse: the stored run's result rebuilt by this code's analysis; its runs, speed and context
    are the stored ones, ``reanalysed`` names this code."""
    _, d = _stored_run(name, "--reanalyse")
    payload = _stored_payload(d, d["resolve_seeds"], d["runs"])
    payload["reanalysed"] = _reanalysed_stamp()
    return payload


def speed_looks(args) -> int:
    """Fresh looks after the first (--speed-looks; a quick run takes none)."""
    return args.speed_looks if args.speed_looks is not None else (0 if args.quick else SPEED_LOOKS)


def speed_remeasured(name: str, steps: int, log=print, looks: int = SPEED_LOOKS) -> dict:
    """--speed: the stored run's speed section measured again now, on this machine (``speed.measured``
    says when, where and on which code), the quality runs kept; the one analysis over both."""
    from experiments.common import run_context

    _, d = _stored_run(name, "--speed")
    ctx, t0 = run_context("measured"), time.perf_counter()
    speed = run_speed(steps, log=log, looks=looks)
    speed["measured"] = {**ctx, "wall_s": time.perf_counter() - t0,
                         "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "loadavg_1m_at_end": os.getloadavg()[0],
                         "label": "the speed section alone measured again (--speed); the quality runs are the stored ones"}
    payload = _stored_payload({**d, "speed": speed}, d["resolve_seeds"], d["runs"])
    payload["reanalysed"] = _reanalysed_stamp()
    return payload


class ExtendError(ValueError):
    """--extend-to cannot add to the stored run (the message names the flag)."""


def extended(name: str, upto: int, log=print) -> dict:
    """--extend-to N: the stored run's resolution seeds continued up to N paired seeds (the number an
    unresolved target's reason names), measured now with the stored steps, then the one analysis over
    all of them. Only on the machine the stored runs were measured on (seeds from two machines would
    pool two machines' rounding), and first the stored last seed is run again: its NE must come back
    to the digit for the pooling to be one measurement, else nothing is added. ``extensions`` records
    each addition: its context, the re-run seed, and the added seeds' own NE costs (a look the stored
    seeds did not see)."""
    from cubic.core.fingerprint import machine_differences
    from cubic.runners.distributed import EARLY_STEPS
    from experiments.common import run_context

    path, d = _stored_run(name, "--extend-to")
    have = d["seeds"] + d["resolve_seeds"]
    if upto < len(have) + 2:  # the added seeds' own interval needs two of them
        raise ExtendError(f"--extend-to {upto}: {path.name} has {len(have)} paired seeds; give at least "
                          f"{len(have) + 2}")
    if diff := machine_differences(d["fingerprint"]):
        raise ExtendError(f"--extend-to: {path.name} was measured on another machine ({', '.join(diff)} differ): "
                          "its seeds and this machine's would pool two machines' rounding; run the study afresh here")
    ctx, t0 = run_context("measured"), time.perf_counter()
    last = max(have)
    again = run_quality([last], d["steps"], log=log, variants=RESOLVE_VARIANTS, keep_losses=EARLY_STEPS)
    stored_ne = {f"{r['variant']}/{r['optimizer']}": r["ne"] for r in d["runs"] if r["seed"] == last}
    reproduced = [{"variant": (v := f"{r['variant']}/{r['optimizer']}"), "stored_ne": stored_ne[v], "ne_now": r["ne"]}
                  for r in again]
    if any(x["stored_ne"] != x["ne_now"] for x in reproduced):  # before the hours the new seeds take
        raise ExtendError(f"--extend-to: seed {last} run again does not give the stored NE ("
                          + ", ".join(f"{x['variant']} {x['stored_ne']:.6f} -> {x['ne_now']:.6f}" for x in reproduced)
                          + "): this machine does not reproduce the stored run; run the study afresh here")
    added = list(range(last + 1, last + 1 + upto - len(have)))
    runs = run_quality(added, d["steps"], log=log, variants=RESOLVE_VARIANTS, keep_losses=EARLY_STEPS)
    fresh = summarise(runs)["rowwise_adagrad"]
    payload = _stored_payload(d, d["resolve_seeds"] + added, d["runs"] + runs)
    payload["extensions"] = payload.get("extensions", []) + [{
        **ctx, "seeds": [added[0], added[-1]], "wall_s": time.perf_counter() - t0,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "reproduced": {"seed": last, "runs": reproduced},
        "added_seeds_alone": {f"{v}/rowwise_adagrad": fresh[v]["ne_cost_rel"] for v in ("grad", "avg-100")},
        "label": "measured: the added seeds only, paired by seed with their own 1D runs (a fresh look)"}]
    return payload


def main(argv=None) -> int:
    from experiments.common import ci_text, png_path, write_result

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="3 seeds x 300 steps, speed 30 steps (labelled quick)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--resolve-seeds", type=int, default=None,
                    help=f"paired seeds for the two resolved NE targets (default {RESOLVE_SEEDS}; "
                         "--quick: none beyond --seeds)")
    ap.add_argument("--speed-steps", type=int, default=None)
    ap.add_argument("--no-quality-file", action="store_true",
                    help=f"do not rewrite {QUALITY_FILE.name} (a --quick run never does: the simulator cites it)")
    ap.add_argument("--reanalyse", action="store_true",
                    help="rebuild the summary, targets and PNG from the runs in the stored JSON; run nothing")
    ap.add_argument("--speed-looks", type=int, default=None,
                    help=f"fresh re-measurements of the speed section after the first (default {SPEED_LOOKS}; "
                         "--quick: 0)")
    ap.add_argument("--speed", action="store_true",
                    help="measure the speed section again now (minutes), keep the stored quality runs; "
                         f"{QUALITY_FILE.name} is not rewritten")
    ap.add_argument("--extend-to", type=int, metavar="N", default=None,
                    help="add resolution seeds to the stored run until it has N paired seeds (e.g. the number an "
                         "unresolved target names), measured now on the same machine, and re-analyse")
    args = ap.parse_args(argv)
    if args.speed_looks is not None and args.speed_looks < 0:
        print(f"--speed-looks: must be >= 0 (got {args.speed_looks})", file=sys.stderr)
        return 2
    name = "two_d" + ("_quick" if args.quick else "")
    try:
        payload = (reanalysed(name) if args.reanalyse else
                   speed_remeasured(name, args.speed_steps or (30 if args.quick else 60),
                                    log=lambda s: print(s, flush=True), looks=speed_looks(args)) if args.speed else
                   extended(name, args.extend_to, log=lambda s: print(s, flush=True)) if args.extend_to else
                   measure(args))
    except ExtendError as e:
        print(e, file=sys.stderr)
        return 2
    summary, speed = payload["summary"], payload["speed"]
    # a part measured again (--speed, --extend-to) is a run of its own beside the stored quality runs
    part = speed["measured"] if args.speed else payload["extensions"][-1] if args.extend_to else None
    path = write_result(name, payload, run=part)
    plot(summary, speed, png_path(name), args.quick)
    for opt, vs in summary.items():
        for var, s in vs.items():
            print(f"{opt:>18} {var:>7}: NE {s['ne_mean']:.4f}, cost {100 * s['ne_cost_rel']['mean']:+.3f}% "
                  f"({ci_text(s['ne_cost_rel'])})")
    print(f"wrote {path}")
    if args.extend_to:
        ext = payload["extensions"][-1]
        print(f"seed {ext['reproduced']['seed']} run again: NE equal to the stored, to the digit")
        lo, hi = ext["seeds"]
        for var, st in ext["added_seeds_alone"].items():
            print(f"added seeds {lo}..{hi} alone, {var}: {100 * st['mean']:+.3f}% ({ci_text(st)})")
    if args.quick:  # the packaged table the simulator cites stays the full run's
        print(f"{QUALITY_FILE.name} not rewritten: a quick run's figures are a smoke test")
    elif args.speed:
        print(f"{QUALITY_FILE.name} not rewritten: --speed measured no quality run")
    elif not args.no_quality_file:
        QUALITY_FILE.write_text(json.dumps(quality_doc(summary, payload), indent=2) + "\n")
        print(f"wrote {QUALITY_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
