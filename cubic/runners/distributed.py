"""Real distributed training: the workload's model with its embedding tables sharded by a plan,
trained by W processes with torch.distributed, launched the way TorchRec jobs are (torchrun).

One worker, :func:`run_worker`, is what every rank runs, whether started by ``torchrun
--nproc-per-node W -m cubic.runners.launch ...`` or by :class:`DistributedRunner`, which starts the
same module W times with the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT). Backend gloo on CPU, NCCL on CUDA (one device per local rank).

Every rank trains a :class:`cubic.core.train.TrainSession` -- the same step, optimizers and data as
the single-process runner -- whose embedding stage is a :class:`ShardedEmbedding`:

1. input dist: all-to-all of bag lengths, then of ids, each piece's ids to its owner (row-wise
   pieces get only the ids of their row range, re-based);
2. each owner pools its pieces for the whole global batch (``nn.EmbeddingBag``, sum);
3. output dist: an all-to-all of the pooled pieces back to the ranks whose examples they are; its
   backward is the reverse all-to-all of the gradients (:class:`_AllToAll`, timed both ways);
4. pieces are reassembled per table (column pieces fill their columns, row pieces add partial sums);
   data-parallel tables are looked up locally.

The dense part is the workload's real architecture (DLRM / Wukong / DMT from ``cubic.core.models``,
the same seed on every rank), replicated; its gradients (and those of data-parallel tables) are
summed over ranks on the loss scaled by 1/W, i.e. averaged, and Adam updates them. Sharded rows are
updated on their owner by row-wise AdaGrad (:class:`cubic.core.models.RowWiseAdagrad`); for a table
split by columns, each row's mean square is summed over its pieces by an all-reduce in the group of
owners, so every piece takes the step the whole row would (TorchRec keeps per-piece state there
instead, which is a different optimizer).

2D sparse parallelism (a plan whose ``group_size`` G < W; :class:`TwoD`): cluster rank r is rank
``r % G`` of group ``r // G``; each group's G ranks hold the plan's shards and run the steps above
on the group's process group; the W/G replicas of each shard are kept in step by
``config.sharding.sync``: ``gradients`` sums the touched rows' gradients over the replicas every
step (each replica's backward carries 1/W of the global mean loss, so the sum is the 1D gradient:
the same training up to float summation order, checked in tests/test_runners_two_d.py), ``weights``
scales each replica's gradient by W/G (the gradient of its own group's mean loss) and averages the
shards' weights and row-wise AdaGrad state every ``sync_interval`` steps (default weights/100, the
step model's). The dense part and data-parallel tables stay data-parallel over all W ranks.

Rank W trains on examples ``[r*B, (r+1)*B)`` of the global batch of W*B examples; the single-process
reference (:func:`reference_run`: a plain ``TrainSession`` on the global batch, same seed, same data)
therefore computes the same function. What differs is float summation order: the pooled sums, the
all-reduce of gradients and the reassembly add in another order, and Adam's division by
``sqrt(v) + eps`` amplifies tiny differences in near-zero gradient coordinates, so two runs that
differ only in summation order drift apart the way chaotic dynamics do. A ReLU whose pre-activation sits
within that noise of zero can flip between two such runs, and row-wise AdaGrad's step on a row with
a small accumulator (~lr * g / rms(g), whatever g's size) turns the changed gradient into a visible
gap (issue 24, experiments/two_d.py's study workload, data seed 5: one example's top-MLP unit at
+3.7e-8 vs -9.7e-8 at step 3, loss gap 3.4e-6 at step 4, 7e-3 by step 11; which run lands on which
side is chance). The exact check is in float64, where no such flip occurs: 1D and 2D runs equal the
one-process run to 1e-12 on batches with empty bags and duplicate ids
(tests/test_runners_distributed_exact.py). Tolerances, from what was
measured on this CPU (2 gloo ranks, per-rank batch 512, 200 steps; see tests/test_runners_distributed.py):

- per-step training loss over the first :data:`EARLY_STEPS` steps within :data:`LOSS_RTOL` = 1e-4
  relative. Measured: <= 1.8e-7 (dlrm-small, a plan with table-, column-, row-wise and
  data-parallel pieces; wukong-small, the default planner's plan): single-precision rounding, before
  it compounds; the gap grows to ~1e-4 by step 20. This is the sharp test: with the column pieces'
  row-sum all-reduce removed (per-piece AdaGrad state, TorchRec's behaviour) the gap is 8e-4 at
  step 1 and 4e-2 by step 6; without the dense gradient all-reduce it is 1e-2 at step 1 (measured).
- eval NE after the run within :data:`NE_RTOL` = 2 % relative: the coarse "the run went to the same
  place" test. Measured at step 200: 5.1e-3 (dlrm-small) and 6e-5 (wukong-small); on the way there
  the dlrm-small gap reaches 4 % (step 80). Two single-process runs differing only in the embedding
  kernel (FBGEMM TBE vs nn.EmbeddingBag: the same update, another summation order) differ as much:
  4.5e-3 at step 200, 4 % at step 80. 2 % is four times the end-of-run spread of that float noise.

With FP8 the check is off by default and never fails a run: FP8 scales are computed from each
rank's own tensors, so the distributed run is a different (equally valid) quantization of the same
step (see :data:`FP8_NOTE`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cubic.core.config import Config
from cubic.core.result import Result
from cubic.core.runspec import RunSpec
from cubic.core.spec import SpecError, Workload
from cubic.runners.base import Runner, sync_misfit
from cubic.runners.sharded_embedding import ShardedEmbedding, TwoD
from sharding.types import Plan

EARLY_STEPS = 10
LOSS_RTOL = 1e-4  # per-step training loss, first EARLY_STEPS steps, vs the single-process run
NE_RTOL = 0.02  # eval NE at the end of the run vs the single-process run
DEFAULT_PLANNER = "size_lookup_greedy"
FP8_NOTE = ("FP8 scales come from each rank's local tensors (as in any data-parallel FP8 training), so the "
            "distributed run quantizes differently from one process on the global batch: compared, not "
            "required to match (measured early-step loss gap with rowwise FP8: ~5e-4)")
CHECK_SINGLE_MAX_STEPS = 300  # runs up to this long check against the single-process run by default
_REPO_ROOT = str(Path(__file__).resolve().parents[2])


# -- plans ----------------------------------------------------------------------------------------


class Misfit(str):
    """Why a plan cannot run (a str: callers print it or record it as the failure's reason), with the
    field it concerns and whether that field is the config's (else the plan's): what a command names."""

    field: str
    in_config: bool

    def __new__(cls, why: str, field: str, in_config: bool = False) -> "Misfit":
        out = super().__new__(cls, why)
        out.field, out.in_config = field, in_config
        return out


def check_plan(workload: Workload, plan: Plan, world: int, config: Config | None = None) -> Misfit | None:
    """Why ``plan`` cannot train ``workload`` on ``world`` ranks here (None when it can). A 2D plan
    (``group_size`` G < ``world_size``) trains W/G replicas of its G-rank group."""
    if plan.world_size != world:
        return Misfit(f"plan is for {plan.world_size} ranks (in groups of {plan.group_size}); this run has {world}",
                      "world_size")
    if config is not None:
        want = config.sharding.group_size
        if want and want != plan.group_size:
            return Misfit(f"config.sharding.group_size {want} differs from the plan's group_size {plan.group_size} "
                          f"(make the plan with --group-size {want})", "sharding.group_size", True)
        if why := sync_misfit(config.sharding, plan.group_size, world):
            return Misfit(why[1], why[0], True)
        if config.batch_size and config.batch_size != plan.batch_size:
            return Misfit(f"config.batch_size {config.batch_size} differs from the plan's per-rank batch "
                          f"{plan.batch_size}", "batch_size", True)
    mine = {t.name: (t.rows, t.dim) for t in workload.tables}
    theirs = {t.name: (t.rows, t.dim) for t in plan.tables}
    if mine != theirs:
        diff = sorted(set(mine.items()) ^ set(theirs.items()))
        return Misfit(f"plan tables differ from the workload's tables (first difference: {diff[0][0]})", "tables")
    return None


def config_with_plan(workload: Workload, config: Config, plan_path: str, world: int,
                     config_source: str | None = None) -> Config:
    """``config`` with the plan document at ``plan_path`` as its plan: the one step for `cubic run
    --plan` and torchrun's launch. A bad document, or a plan that cannot train ``workload`` on
    ``world`` ranks with this config, is bad input named in the file that holds the field (the
    config's, ``config_source``, or the plan's)."""
    from cubic.core.spec import read_structured
    from sharding.types import plan_from_dict

    plan = plan_from_dict(read_structured(plan_path), source=plan_path)
    config = config.model_copy(update={"sharding": config.sharding.model_copy(
        update={"plan": plan.model_dump(mode="json")})})
    why = check_plan(config.apply(workload), plan, world, config)
    if why:
        raise SpecError(why, source=config_source if why.in_config and config_source else plan_path, field=why.field)
    return config


def make_plan(workload: Workload, config: Config, world: int) -> Plan:
    """The plan the config runs with on ``world`` ranks of one node (the one plan path:
    ``sharding.from_config.plan_for``; ``planner: none`` is its default planner)."""
    from sharding.from_config import plan_for

    return plan_for(workload, config, world)


# -- the worker every rank runs -------------------------------------------------------------------


def _global_config(config: Config, plan: Plan | None, world: int) -> Config:
    """The config with the global batch (W x the plan's per-rank batch) and no sharding section:
    what the single-process reference trains, and what every rank's session slices."""
    if plan is None:
        return config
    return config.model_copy(update={"batch_size": world * plan.batch_size,
                                     "sharding": type(config.sharding)()})


def reference_run(workload: Workload, config: Config, *, steps: int, eval_at: list[int],
                  device: str | torch.device = "cpu", transform=None) -> dict[str, list]:
    """The same model trained in one process on the global batch: per-step losses and the eval
    trajectory at the training steps in ``eval_at``."""
    from cubic.core.train import TrainSession

    s = TrainSession(workload, config, device, transform=transform)
    traj = [{"step": 0.0, **s.evaluate()}] if 0 in eval_at else []
    for step in range(steps):
        s.step(step)
        if step + 1 in eval_at:
            traj.append({"step": float(step + 1), **s.evaluate()})
    return {"losses": s.losses, "trajectory": traj}


def compare_to_reference(losses: list[float], trajectory: list[dict], ref: dict) -> dict[str, Any]:
    """How far a distributed run is from the single-process reference, and whether within tolerance."""
    early = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses[:EARLY_STEPS], ref["losses"][:EARLY_STEPS])]
    loss_dev = max(early) if early else 0.0
    ne, ne_ref = trajectory[-1]["ne"], ref["trajectory"][-1]["ne"]
    ne_dev = abs(ne - ne_ref) / max(abs(ne_ref), 1e-12)
    ok = loss_dev <= LOSS_RTOL and ne_dev <= NE_RTOL
    return {"loss_max_rel_diff_vs_single_process": loss_dev, "ne_end_rel_diff_vs_single_process": ne_dev,
            "ne_end_single_process": ne_ref, "matches_single_process": float(ok)}


def rank_session(workload: Workload, config: Config, plan: Plan | None, *, rank: int, world: int,
                 device: torch.device, transform=None):
    """This rank's :class:`cubic.core.train.TrainSession` on the global config (:func:`_global_config`):
    the workload's model whose embedding stage is this rank's :class:`ShardedEmbedding` (1D: its
    pieces of the plan; 2D: its pieces in its group, with the replica groups), or the local stage in
    one process. The process group must be initialised when ``world > 1``; every rank calls this in
    the same order (it creates process groups)."""
    from cubic.core.train import TrainSession

    gconf = _global_config(config, plan, world)
    wl = gconf.apply(workload)
    two_d = (TwoD.create(rank, world, plan.group_size, config.sharding.sync, config.sharding.sync_interval)
             if plan is not None and world > 1 and plan.group_size < world else None)
    if two_d is not None:
        emb = ShardedEmbedding(wl, plan, rank % two_d.group_size, two_d.group_size, seed=config.seed, device=device,
                               two_d=two_d)
    else:
        emb = ShardedEmbedding(wl, plan, rank, world, seed=config.seed, device=device) if world > 1 else None
    return TrainSession(workload, gconf, device, transform=transform, embedding=emb, rank=rank, world_size=world)


@dataclass
class _RankRun:
    """What one rank's training loop (:func:`_train_rank`) leaves for the Result."""

    trajectory: list[dict]
    times: dict[str, list[float]]  # per timed step, ms: "step", "sync" and each of PHASES
    meter: Any  # the CpuMeter around the timed steps
    setup_peak: int | None  # VmHWM before training
    peak_reset: bool  # whether VmHWM was reset when training started
    failure: str | None  # the non-finite loss's message: every rank stopped at that step


def _rank_device(device: str) -> torch.device:
    """The device this rank trains on: on CUDA without an index, its local rank's."""
    from cubic.runners.base import resolve_device

    dev = torch.device(resolve_device(device))
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return dev


def _train_rank(session, dev: torch.device, emb: ShardedEmbedding | None, *, warmup: int, total: int,
                eval_at: list[int]) -> _RankRun:
    """``warmup`` untimed then timed steps (through the phase clock), evaluating at ``eval_at``
    (outside the timed region) and at the end unless the loss went non-finite."""
    from cubic.core.train import NonFiniteLoss, PhaseClock
    from cubic.runners.base import proc_status_bytes, reset_peak_rss
    from cubic.runners.local import PHASES, CpuMeter

    trajectory = [{"step": 0.0, **session.evaluate()}]
    setup_peak = proc_status_bytes("VmHWM")
    peak_reset = dev.type == "cpu" and reset_peak_rss()
    meter = CpuMeter()
    clock = PhaseClock(dev, session.comm_seconds)
    times: dict[str, list[float]] = {p: [] for p in ("step", "sync", *PHASES)}
    sync_s = (lambda: emb.sync_s) if emb is not None else (lambda: 0.0)
    failure = None
    for step in range(total):
        b = session.batch(step)  # outside the timed region
        try:
            if step >= warmup:
                s0 = sync_s()
                with meter:
                    clock.start()
                    session.step(step, b, clock)
                times["step"].append(clock.step_ms)
                times["sync"].append((sync_s() - s0) * 1e3)
                for p in PHASES:
                    times[p].append(clock.ms[p])
            else:
                session.step(step, b)
        except NonFiniteLoss as e:  # the loss is global: every rank stops at the same step
            failure = str(e)
            break
        if step + 1 in eval_at and step + 1 < total:
            trajectory.append({"step": float(step + 1), **session.evaluate()})
    if failure is None:
        trajectory.append({"step": float(total), **session.evaluate()})
    return _RankRun(trajectory, times, meter, setup_peak, peak_reset, failure)


def _reduce_over_ranks(run: _RankRun, mem: dict[str, float], *, dev: torch.device, world: int,
                       two_d: TwoD | None) -> tuple[list[float], list[float], list[float]]:
    """(step times, sync times, each 2D replica's end NE) over all ranks, then leaves the process
    group: these are every rank's last collectives. ``mem["peak_mem_bytes"]`` becomes the largest rank's."""
    import torch.distributed as dist

    step_ms = run.times["step"]
    replica_ne: list[float] = []
    sync_ms = run.times["sync"]
    if world > 1:  # a step is as slow as the slowest rank; a run needs the largest rank's memory
        n = len(step_ms)
        agg = torch.tensor(step_ms + sync_ms + [mem["peak_mem_bytes"]], dtype=torch.float64, device=dev)  # NCCL: on device
        dist.all_reduce(agg, op=dist.ReduceOp.MAX)
        step_ms, sync_ms, mem["peak_mem_bytes"] = agg[:n].tolist(), agg[n:2 * n].tolist(), float(agg[-1])
        if two_d is not None:  # each replica's own model: the NE every group's ranks computed, averaged
            ne = torch.zeros(two_d.replicas, dtype=torch.float64, device=dev)
            ne[two_d.replica] = run.trajectory[-1]["ne"] / two_d.group_size
            dist.all_reduce(ne)
            replica_ne = ne.tolist()
        dist.destroy_process_group()
    return step_ms, sync_ms, replica_ne


def _worker_metrics(run: _RankRun, step_ms: list[float], sync_ms: list[float], mem: dict[str, float],
                    losses: list[float], *, global_batch: int, world: int) -> dict[str, float]:
    """Rank 0's metrics from the figures reduced over ranks."""
    import numpy as np

    from cubic.core.train import window_stats
    from cubic.runners.local import quality_metrics

    return {
        **window_stats(step_ms, global_batch),
        "step_time_p90_ms": float(np.percentile(step_ms, 90)),
        **mem,
        **quality_metrics(run.trajectory, losses),
        "batch_size": float(global_batch // world), "world_size": float(world),
        "comm_time_median_ms": float(np.median(run.times["communication"])),
        "sync_time_mean_ms": float(np.mean(sync_ms)) if sync_ms else 0.0,
        "sync_time_median_ms": float(np.median(sync_ms)) if sync_ms else 0.0,
        **run.meter.metrics(),
    }


def _worker_extra(run: _RankRun, step_ms: list[float], sync_ms: list[float], losses: list[float], *,
                  dev: torch.device, world: int, backend: str, global_batch: int, steps: int, warmup: int,
                  every: int, plan: Plan | None) -> dict[str, Any]:
    """Rank 0's ``extra``: how the run was made, and its per-step figures."""
    return {
        "device": str(dev), "world_size": world, "backend": backend, "global_batch": global_batch,
        "threads": torch.get_num_threads(), "steps": steps, "warmup": warmup, "eval_every": every,
        "train_losses": losses, "step_times_ms": [round(x, 4) for x in step_ms],
        "peak_mem": "max over ranks; " + ("cuda max_memory_allocated/reserved" if dev.type == "cuda" else
                                          "VmHWM since training started" if run.peak_reset else "VmHWM"),
        "setup_peak_rss_bytes_rank0": run.setup_peak,
        "shard_types": sorted({s.sharding_type for s in plan.shards}) if plan else [],
        "tolerance": {"early_steps": EARLY_STEPS, "loss_rtol": LOSS_RTOL, "ne_rtol": NE_RTOL},
        "sync_times_ms": [round(x, 4) for x in sync_ms],
    }


def never_synced_note(sync: str, interval: int, total: int) -> str | None:
    """What a weight-averaging 2D run of ``total`` steps (warm-up included) shorter than its sync interval
    must say beside its figures: its replicas never averaged, so their NE differ by training apart, and
    its sync time is the per-step gradient scaling of weight averaging, not a weight sync. None otherwise."""
    if sync != "weights" or total >= interval:
        return None
    return (f"the 2D replicas never synchronised: {total} steps (warm-up included) < sync interval {interval} "
            "(weight averaging); each replica trained on its own, so replica_ne_end differ, and sync_time_*_ms is "
            "the per-step gradient scaling of weight averaging, not a weight sync (run >= the interval, or set "
            "sharding.sync_interval)")


def _peer_wait(emb, two_d: TwoD | None, world: int, dev: torch.device) -> None:
    """Under a gradient sync, the part of rank 0's time inside its sync collectives spent waiting for the
    last of its replica peers to arrive (``sync_volume["peer_wait_share"]``, a share of the seconds of the
    calls kept in ``sync_calls``): a collective ends when the last peer arrives plus the exchange, so the rest is the
    exchange the comm model prices. Gloo's collectives are synchronous and the ranks share one host's
    monotonic clock (else nothing is recorded). Every rank joins: one all-reduce, after training."""
    import torch.distributed as dist

    if (two_d is None or two_d.sync != "gradients" or world <= 1 or dev.type != "cpu"
            or os.environ.get("LOCAL_WORLD_SIZE", str(world)) != str(world)):
        return
    calls = list(emb.sync_calls)
    if not calls:  # every rank made as many sync collectives as rank 0: none here means none anywhere
        return
    starts = torch.zeros(world, len(calls), dtype=torch.float64)
    starts[dist.get_rank()] = torch.tensor([t0 for t0, _ in calls], dtype=torch.float64)
    dist.all_reduce(starts)
    peers = starts[0::two_d.group_size]  # rank 0's replica group: ranks 0, G, 2G, ...
    if dist.get_rank() == 0:
        wait = (peers.max(dim=0).values - peers[0]).clamp(min=0.0)
        spent = torch.tensor([dt for _, dt in calls], dtype=torch.float64)
        emb.sync_volume["peer_wait_share"] = float(torch.minimum(wait, spent).sum() / spent.sum())


def _add_two_d(metrics: dict[str, float], extra: dict[str, Any], two_d: TwoD, replica_ne: list[float],
               optimizer: str, total: int, emb=None) -> None:
    """The 2D layout's figures; ``ne_end`` becomes the mean over replicas of each one's own NE; under a
    gradient sync, what rank 0 exchanged per sync (``sync_volume_rank0``, MEASURED, warm-up included)."""
    import numpy as np

    extra["two_d"] = {**two_d.describe(), "replica_ne_end": replica_ne,
                      "ne_end": "mean over replicas of each replica's own eval NE (the trajectory is replica 0's)",
                      "optimizer": optimizer,
                      "weight_syncs": total // two_d.interval if two_d.sync == "weights" else 0}
    vol = getattr(emb, "sync_volume", None)
    if vol and vol["syncs"]:
        n = vol["syncs"]
        extra["two_d"]["sync_volume_rank0"] = {
            "ids_bytes_per_sync": vol["ids_bytes"] / n, "grad_bytes_per_sync": vol["grad_bytes"] / n,
            "collective_ms_per_sync": 1e3 * vol["collective_s"] / n, "sync_ms_per_sync": 1e3 * emb.sync_s / n,
            "syncs": n}
        if "peer_wait_share" in vol:  # of the collectives' time, waiting for a replica peer to arrive
            extra["two_d"]["sync_volume_rank0"]["peer_wait_ms_per_sync"] = (
                vol["peer_wait_share"] * 1e3 * vol["collective_s"] / n)
    note = never_synced_note(two_d.sync, two_d.interval, total)
    if note:  # printed under the run's figures (cubic.cli.run_report)
        extra.setdefault("notes", []).append(note)
    metrics["ne_end"] = float(np.mean(replica_ne))
    metrics["group_size"], metrics["replicas"] = float(two_d.group_size), float(two_d.replicas)
    metrics["sync_interval"] = float(two_d.interval)


def _compare_single_process(workload: Workload, gconf: Config, run: _RankRun, losses: list[float],
                            metrics: dict[str, float], extra: dict[str, Any], *, total: int, eval_at: list[int],
                            dev: torch.device, transform, fp8: bool) -> str | None:
    """Runs the single-process reference and records the comparison in ``metrics`` and ``extra``;
    why the run fails when it deviates beyond tolerance (None when it matches, and always with FP8)."""
    ref = reference_run(workload, gconf, steps=total, eval_at=eval_at, device=dev, transform=transform)
    metrics.update(compare_to_reference(losses, run.trajectory, ref))
    extra["single_process"] = ref
    if fp8:
        extra["single_process_note"] = FP8_NOTE
        return None
    if metrics["matches_single_process"]:
        return None
    return (f"the distributed run deviates from the single-process run: early loss "
            f"{metrics['loss_max_rel_diff_vs_single_process']:.2e} (tolerance {LOSS_RTOL:g}), end NE "
            f"{metrics['ne_end_rel_diff_vs_single_process']:.2e} (tolerance {NE_RTOL:g})")


def run_worker(workload: Workload, config: Config, plan: Plan | None, *, steps: int, warmup: int = 5,
               rank: int = 0, world: int = 1, device: str = "auto", eval_every: int | None = None,
               check_single: bool | None = None, versions_info: dict[str, str] | None = None,
               fp8_choice=None) -> Result | None:
    """One rank of a run (the process group is initialised when ``world > 1``). Rank 0 returns the
    Result (and runs the single-process reference after the others are done, when asked); other
    ranks return None. ``fp8_choice``: the config's FP8 choice already resolved (a budget policy's
    placement comes from one Probe on rank 0, not one per rank). Exceptions propagate."""
    import numpy as np

    from cubic.core.fingerprint import fingerprint, fingerprint_hash, versions
    from cubic.runners.base import peak_memory, result_header
    from cubic.runners.local import PHASES, fp8_transform

    head = result_header(workload, config)
    dev = _rank_device(device)
    gconf = _global_config(config, plan, world)
    transform = fp8_transform(config, workload, fp8_choice)
    wl = gconf.apply(workload)
    session = rank_session(workload, config, plan, rank=rank, world=world, device=dev, transform=transform)
    emb = session.model.embedding if world > 1 else None
    two_d: TwoD | None = getattr(emb, "two_d", None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    total = warmup + steps
    every = eval_every or max(1, total // 5)
    eval_at = sorted({0, total, *range(every, total, every)})
    run = _train_rank(session, dev, emb, warmup=warmup, total=total, eval_at=eval_at)
    mem = peak_memory(dev)
    _peer_wait(emb, two_d, world, dev)
    step_ms, sync_ms, replica_ne = _reduce_over_ranks(run, mem, dev=dev, world=world, two_d=two_d)
    if rank != 0:
        return None
    fp = {**fingerprint(dev.type), "runner": "distributed", "world_size": world,
          "backend": ("nccl" if dev.type == "cuda" else "gloo") if world > 1 else "none"}
    common = dict(fingerprint=fp, fingerprint_hash=fingerprint_hash(fp),
                  versions=versions_info if versions_info is not None else versions(), **head)
    if run.failure is not None:
        return Result.failed("nan", run.failure, trajectory=run.trajectory, **common)
    losses = session.losses
    metrics = _worker_metrics(run, step_ms, sync_ms, mem, losses, global_batch=wl.batch_size, world=world)
    extra = _worker_extra(run, step_ms, sync_ms, losses, dev=dev, world=world, backend=fp["backend"],
                          global_batch=wl.batch_size, steps=steps, warmup=warmup, every=every, plan=plan)
    if two_d is not None:
        _add_two_d(metrics, extra, two_d, replica_ne, wl.optimizers.embedding, total, emb)
    fp8 = config.fp8.policy != "off"
    if check_single is None:
        check_single = (world > 1 and total <= CHECK_SINGLE_MAX_STEPS and not fp8
                        and (two_d is None or two_d.sync == "gradients"))  # averaged replicas differ by design
    phases = {p: float(np.median(run.times[p])) for p in PHASES}
    if check_single:
        why = _compare_single_process(workload, gconf, run, losses, metrics, extra, total=total, eval_at=eval_at,
                                      dev=dev, transform=transform, fp8=fp8)
        if why is not None:
            return Result.failed("error", why, metrics=metrics, trajectory=run.trajectory, phases_ms=phases,
                                 extra=extra, **common)
    return Result(status="ok", source="measured", metrics=metrics, trajectory=run.trajectory, phases_ms=phases,
                  extra=extra, **common)


# -- the runner -----------------------------------------------------------------------------------


class DistributedRunner(Runner):
    """Runs a (sharded) config on ``world_size`` local processes: ``python -m cubic.runners.launch``
    started W times with torchrun's environment, so that a run here and a run under torchrun are
    the same code. ``verify``: check against the single-process run (default: for runs of up to
    :data:`CHECK_SINGLE_MAX_STEPS` steps)."""

    source = "measured"

    def __init__(self, world_size: int = 2, timeout_s: float = 600.0, verify: bool | None = None,
                 device: str = "cpu", threads: int | None = 1):
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.verify = verify
        self.device = device
        self.threads = threads  # intra-op threads per rank (W ranks share the machine's cores)

    def fingerprint(self) -> dict:
        """This machine's fingerprint plus what makes a W-process run differ from a one-process run
        of the same config (so that the trial store never serves one for the other)."""
        from cubic.core.fingerprint import fingerprint

        kind = "cuda" if self.device.startswith("cuda") else "cpu"
        return {**fingerprint(kind), "runner": "distributed", "world_size": self.world_size,
                "backend": "nccl" if kind == "cuda" else "gloo"}

    def run_spec(self) -> RunSpec:
        return RunSpec(kind="distributed", device=self.device, threads=self.threads, world_size=self.world_size)

    def fingerprint_hash(self) -> str:
        from cubic.core.fingerprint import fingerprint_hash

        return fingerprint_hash(self.fingerprint())

    def run(self, workload: Workload, config: Config, *, steps: int = 50, warmup: int = 5, progress=None) -> Result:
        from cubic.runners.base import free_port
        from cubic.core.fingerprint import fingerprint_hash, versions

        t_start = time.monotonic()
        fp = self.fingerprint()
        common = dict(workload=workload.name, workload_hash=workload.content_hash(),
                      config_hash=config.content_hash(), seed=config.seed, fingerprint=fp,
                      fingerprint_hash=fingerprint_hash(fp))
        try:
            plan = make_plan(workload, config, self.world_size)
            why = check_plan(config.apply(workload), plan, self.world_size, config)
        except (ValueError, KeyError) as e:
            return Result.failed("invalid", str(e), **common)
        if why:
            return Result.failed("invalid", why, **common)
        cfg = config if config.sharding.plan else config.model_copy(
            update={"sharding": config.sharding.model_copy(update={"plan": plan.model_dump(mode="json")})})
        with tempfile.TemporaryDirectory() as d:
            req = Path(d) / "request.json"
            out = Path(d) / "result.json"
            req.write_text(json.dumps({
                "workload": workload.model_dump(mode="json"), "config": cfg.model_dump(mode="json"),
                "steps": steps, "warmup": warmup, "device": self.device, "check_single": self.verify,
                "versions": versions(), "threads": self.threads,
            }))
            port = free_port()
            procs = []
            logs = []
            try:
                for r in range(self.world_size):
                    env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(self.world_size),
                               LOCAL_WORLD_SIZE=str(self.world_size), MASTER_ADDR="127.0.0.1",
                               MASTER_PORT=str(port), CUBIC_PARENT_PID=str(os.getpid()))
                    env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
                    log = open(Path(d) / f"rank{r}.log", "w+b")
                    logs.append(log)
                    procs.append(subprocess.Popen(
                        [sys.executable, "-P", "-m", "cubic.runners.launch", "--request", str(req), "--json", str(out)],
                        stdout=log, stderr=log, env=env))
                failed = self._wait(procs, time.monotonic() + self.timeout_s)
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                    p.wait()
            try:
                if failed == "timeout":
                    return Result.failed("timeout", f"no result after {self.timeout_s:.0f} s; ranks killed", **common)
                if out.exists():
                    result = Result.model_validate_json(out.read_text())
                else:
                    result = Result.failed(*self._why(failed, procs, logs), **common)
            finally:
                for log in logs:
                    log.close()
        result.wall_time_s = time.monotonic() - t_start
        return result

    @staticmethod
    def _wait(procs, deadline: float) -> int | str | None:
        """Until every rank exits: None, or the first rank that failed (the others would wait for it
        in a collective, so they are ended), or "timeout"."""
        while True:
            codes = [p.poll() for p in procs]
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                return bad[0]
            if all(c is not None for c in codes):
                return None
            if time.monotonic() > deadline:
                return "timeout"
            time.sleep(0.05)

    @staticmethod
    def _why(failed: int | None, procs, logs) -> tuple[str, str]:
        r = failed if isinstance(failed, int) else 0
        code = procs[r].returncode
        logs[r].seek(0)
        lines = [ln for ln in logs[r].read().decode(errors="replace").splitlines() if ln.strip()]
        tail = lines[-1][-500:] if lines else "no output"
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            return "killed", f"rank {r} died by {name} (SIGKILL may be the kernel's OOM killer): {tail}"
        return "error", f"rank {r} exited with code {code} without a result: {tail}"
