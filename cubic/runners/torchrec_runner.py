"""TorchRec runner: a workload's embedding tables trained under TorchRec's DistributedModelParallel.

``TorchRecRunner(world_size).run(workload, config)`` turns the config's sharding plan (a cubic plan,
or one made by ``config.sharding.planner`` with ``target="torchrec"``) into TorchRec's ShardingPlan
(:func:`sharding.torchrec_adapter.load_plan`'s path), spawns ``world_size`` local processes on gloo
(``LOCAL_WORLD_SIZE`` = the plan's ranks per node, so table-row-wise gets TorchRec's intra/cross-node
groups), wraps an ``EmbeddingBagCollection`` in DMP (FBGEMM TBE, fused row-wise Adagrad in backward;
data-parallel tables are DDP-replicated and take a dense Adagrad step) and trains it on the workload's
synthetic batches: logit = pooled embeddings . a fixed projection, binary cross-entropy.
Per step it times, with a barrier before each step: ``embedding_fwd`` (DMP forward: input all-to-all,
lookups, output all-to-all), ``embedding_bwd`` (backward: gradient all-to-all, fused update) and
``optimizer`` (the data-parallel tables' all-reduce and step). Figures are measured on this machine's
CPU with W gloo processes, not on the plan's target device.

:func:`check_plan` is the correctness check: the plan's pooled embeddings under DMP vs the unsharded
``EmbeddingBagCollection`` holding the same weights, on every rank's own batch.

The runner is separate from cubic's own multi-process runner (cubic.runners.distributed): both are
``Runner``s, so a campaign can use either.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import traceback
from pathlib import Path

from cubic.core.config import Config
from cubic.core.result import Result
from cubic.core.spec import Workload
from cubic.runners.base import Runner

LR = 0.05


def _init_process(rank: int, world: int, local: int, port: int) -> None:
    import logging
    import warnings

    import torch
    import torch.distributed as dist

    # TorchRec and FBGEMM warn about deprecations on every rank; a child's stderr is not the place
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    # TorchRec reads the node layout from these (torchrec.distributed.comm.get_local_size)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(local), LOCAL_RANK=str(rank % local))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _leave(code: int) -> None:
    """End a rank once its result (or traceback) file is written, without teardown
    (:func:`cubic.runners._child.exit_without_teardown`: at normal exit, or in
    ``destroy_process_group``, a still-joinable gloo/FBGEMM worker thread can be destroyed and abort
    the rank after its work is done). On success the ranks first meet at a barrier so none closes
    its sockets while a peer is still in a collective.
    """
    import torch.distributed as dist

    from cubic.runners._child import exit_without_teardown

    try:
        if code == 0 and dist.is_initialized():
            dist.barrier()
    except Exception:
        code = 1
    finally:
        exit_without_teardown(code)


def _full_weights(tables, seed: int) -> dict:
    import torch

    out = {}
    for i, t in enumerate(tables):
        g = torch.Generator().manual_seed(seed * 10_007 + i)
        out[t.name] = (torch.rand(t.rows, t.dim, generator=g) * 2 - 1) / t.dim ** 0.5
    return out


def _ebc(tables, device):
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    return EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                                             feature_names=[t.name]) for t in tables], device=device)


def _dmp(tables, plan_doc: dict, local: int, seed: int, optimizer: bool):
    """DMP over a meta EmbeddingBagCollection with the plan, its shards filled from the full weights."""
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from sharding.torchrec_adapter import load_plan_dict

    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR} if optimizer else {}
    ebc = _ebc(tables, torch.device("meta"))
    plan = load_plan_dict(plan_doc, device="cpu", local_size=local, model=ebc)  # as a user's job loads it
    dmp = DistributedModelParallel(module=ebc, device=torch.device("cpu"), plan=plan,
                                   sharders=[EmbeddingBagCollectionSharder(fused_params=fused)])
    full = _full_weights(tables, seed)
    with torch.no_grad():
        for key, v in dmp.state_dict().items():
            name = key.split("embedding_bags.")[-1].rsplit(".weight", 1)[0]
            src = full[name]
            if hasattr(v, "local_shards"):  # ShardedTensor: this rank's pieces with their offsets
                for sh in v.local_shards():
                    (ro, co), (nr, nc) = sh.metadata.shard_offsets, sh.metadata.shard_sizes
                    sh.tensor.copy_(src[ro:ro + nr, co:co + nc])
            else:
                v.copy_(src)
    return dmp, full


def _kjt(tables, sparse_per_table):
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    return KeyedJaggedTensor.from_lengths_sync(keys=[t.name for t in tables],
                                               values=torch.cat([v for v, _ in sparse_per_table]),
                                               lengths=torch.cat([ln for _, ln in sparse_per_table]))


def _check_worker(rank, world, local, port, tables_json, plan_doc, batch, seed, out_path):
    import torch

    from cubic.core.spec import Table

    _init_process(rank, world, local, port)
    try:
        tables = [Table.model_validate(t) for t in json.loads(tables_json)]
        dmp, full = _dmp(tables, plan_doc, local, seed, optimizer=False)
        ref = _ebc(tables, torch.device("cpu"))
        with torch.no_grad():
            for t in tables:
                ref.embedding_bags[t.name].weight.copy_(full[t.name])
        g = torch.Generator().manual_seed(seed * 1000 + 1 + rank)
        sp = []
        for t in tables:  # uniform ids: every shard, the last rows included, is looked up
            lens = torch.randint(0, 5, (batch,), generator=g)
            sp.append((torch.randint(0, t.rows, (int(lens.sum()),), generator=g), lens))
        kjt = _kjt(tables, sp)
        out = dmp(kjt)
        out = out.wait() if hasattr(out, "wait") else out
        want = ref(kjt)
        errs = {t.name: float((out[t.name].detach() - want[t.name].detach()).abs().max()) for t in tables}
        Path(f"{out_path}.{rank}").write_text(json.dumps(errs))
    except BaseException:
        Path(f"{out_path}.err{rank}").write_text(traceback.format_exc())
        _leave(1)
    _leave(0)


def _train_worker(rank, world, local, port, workload_json, plan_doc, batch, steps, warmup, seed, out_path):
    import torch
    import torch.distributed as dist

    from cubic.core.data import SyntheticData

    _init_process(rank, world, local, port)
    try:
        wl = Workload.model_validate_json(workload_json)
        tables = wl.tables
        dmp, _ = _dmp(tables, plan_doc, local, seed, optimizer=True)
        # data-parallel tables are plain (DDP) parameters: a dense Adagrad step after DDP's all-reduce
        dense = [p for _, p in dmp.named_parameters()
                 if p.requires_grad and not getattr(p, "_in_backward_optimizers", None)
                 and type(p).__name__ != "ShardedTensor"]
        opt = torch.optim.Adagrad(dense, lr=LR) if dense else None
        g = torch.Generator().manual_seed(seed)
        proj = {t.name: torch.randn(t.dim, generator=g) / t.dim ** 0.5 for t in tables}
        data = SyntheticData(wl, seed=seed)
        rows = {"step": [], "embedding_fwd": [], "embedding_bwd": [], "optimizer": [], "loss": []}
        for step in range(steps):
            gb = data.batch(step, batch_size=world * batch)
            lo, hi = rank * batch, (rank + 1) * batch
            sp = []
            for v, off in zip(gb.sparse.values, gb.sparse.offsets):
                a, b = int(off[lo]), int(off[hi])
                sp.append((v[a:b], off[lo + 1:hi + 1] - off[lo:hi]))
            kjt = _kjt(tables, sp)
            y = gb.labels[lo:hi]
            dist.barrier()
            t0 = time.perf_counter()
            out = dmp(kjt)
            out = out.wait() if hasattr(out, "wait") else out
            logit = sum(out[t.name] @ proj[t.name] for t in tables)
            t1 = time.perf_counter()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y)
            loss.backward()
            t2 = time.perf_counter()
            if opt is not None:
                opt.step()
                opt.zero_grad()
            t3 = time.perf_counter()
            for k, v in (("step", t3 - t0), ("embedding_fwd", t1 - t0), ("embedding_bwd", t2 - t1),
                         ("optimizer", t3 - t2)):
                rows[k].append(v * 1e3)
            rows["loss"].append(float(loss.detach()))
        Path(f"{out_path}.{rank}").write_text(json.dumps(
            {k: (statistics.median(v[warmup:] or v) if k != "loss" else v) for k, v in rows.items()}))
    except BaseException:
        Path(f"{out_path}.err{rank}").write_text(traceback.format_exc())
        _leave(1)
    _leave(0)


def _spawn(fn, world: int, args: tuple, timeout_s: float) -> list[dict]:
    """Run ``fn(rank, world, *args, out_path)`` on ``world`` spawned processes; per-rank JSON results.
    Raises TimeoutError, or RuntimeError with the first failing rank's last traceback line."""
    import torch.multiprocessing as mp

    from cubic.runners.base import free_port

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out")
        ctx = mp.start_processes(fn, args=(world, args[0], free_port(), *args[1:], out), nprocs=world,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=0.5):
                if time.monotonic() > deadline:
                    for p in ctx.processes:
                        if p.is_alive():
                            p.terminate()
                    raise TimeoutError(f"no result after {timeout_s:.0f} s")
        except Exception as e:  # a rank raised or died: its traceback is in its .err file
            errs = sorted(Path(d).glob("out.err*"))
            lines = errs[0].read_text().strip().splitlines() if errs else [str(e)]
            raise RuntimeError(f"rank {errs[0].name[7:] if errs else '?'}: {lines[-1]}") from None
        return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]


def check_plan(plan, local_size: int | None = None, batch: int = 16, seed: int = 0, timeout_s: float = 300.0) -> dict:
    """Max |pooled(DMP with the plan) - pooled(unsharded EBC, same weights)| per table, over all ranks.

    Runs ``plan.group_size`` gloo processes. SpecError when the plan cannot be exported to TorchRec.
    """
    from sharding.torchrec_adapter import local_size_of, to_torchrec_json

    doc = to_torchrec_json(plan, local_size)
    L = local_size_of(plan, local_size)
    tables = json.dumps([t.model_dump(mode="json") for t in plan.tables])
    per_rank = _spawn(_check_worker, plan.group_size, (L, tables, doc, batch, seed), timeout_s)
    return {t.name: max(r[t.name] for r in per_rank) for t in plan.tables}


class TorchRecRunner(Runner):
    """Trains the workload's embeddings under TorchRec DMP with the config's plan on W gloo processes."""

    source = "measured"

    def __init__(self, world_size: int = 2, local_size: int | None = None, timeout_s: float = 600.0):
        self.world_size, self.local_size, self.timeout_s = world_size, local_size, timeout_s

    def fingerprint(self) -> dict:
        from cubic.core.fingerprint import fingerprint

        return {**fingerprint("cpu"), "runner": "torchrec", "world_size": self.world_size, "backend": "gloo"}

    def _plan(self, workload: Workload, config: Config, batch: int):
        """The one plan path (``sharding.from_config.plan_for``), TorchRec's shapes only."""
        from sharding.from_config import plan_for
        from sharding.inputs import topology_for

        topo = topology_for(self.world_size, None, workload, ranks_per_node=self.local_size or self.world_size)
        return plan_for(workload, config.model_copy(update={"batch_size": batch}), self.world_size, topology=topo,
                        target="torchrec")

    def run(self, workload: Workload, config: Config, *, steps: int = 20, warmup: int = 5, progress=None) -> Result:
        from cubic.core.fingerprint import fingerprint_hash, versions
        from sharding.torchrec_adapter import local_size_of, to_torchrec_json, torchrec_available

        t_start = time.perf_counter()
        fp = self.fingerprint()
        common = dict(workload=workload.name, workload_hash=workload.content_hash(), config_hash=config.content_hash(),
                      seed=config.seed, fingerprint=fp, fingerprint_hash=fingerprint_hash(fp), versions=versions())
        if not torchrec_available():
            return Result.failed("invalid", "torchrec is not installed (optional extra)", **common)
        try:
            wl = config.apply(workload)
            batch = config.batch_size or wl.batch_size
            plan = self._plan(wl, config, batch)
            if plan.group_size != self.world_size or plan.world_size != self.world_size:
                return Result.failed("invalid", f"plan is for {plan.world_size} ranks in groups of {plan.group_size}; "
                                                f"this runner has {self.world_size} (no 2D replicas here)", **common)
            if sorted(t.name for t in plan.tables) != sorted(t.name for t in wl.tables):
                return Result.failed("invalid", "plan tables differ from the workload's tables", **common)
            wl = wl.model_copy(update={"tables": plan.tables})
            doc = to_torchrec_json(plan, self.local_size)  # refuses (SpecError) what TorchRec cannot run
            L = local_size_of(plan, self.local_size)
        except (ValueError, KeyError) as e:
            return Result.failed("invalid", str(e), **common)
        try:
            per_rank = _spawn(_train_worker, self.world_size,
                              (L, wl.model_dump_json(), doc, plan.batch_size, steps, warmup, config.seed),
                              self.timeout_s)
        except TimeoutError as e:
            return Result.failed("timeout", str(e), **common)
        except RuntimeError as e:
            return Result.failed("error", str(e), **common)
        # the step ends when the slowest rank ends: report the max over ranks of each median
        phases = {k: max(r[k] for r in per_rank) for k in ("embedding_fwd", "embedding_bwd", "optimizer")}
        step = max(r["step"] for r in per_rank)
        losses = [statistics.fmean(v) for v in zip(*(r["loss"] for r in per_rank))]
        metrics = {"step_time_median_ms": step, "examples_per_s": self.world_size * plan.batch_size / (step / 1e3),
                   "loss_start": losses[0], "loss_end": losses[-1]}
        extra = {"runner": "torchrec", "world_size": self.world_size, "local_world_size": L, "backend": "gloo",
                 "device": "cpu", "per_rank_step_ms": [r["step"] for r in per_rank],
                 "label": f"measured on this CPU, {self.world_size} gloo processes (TorchRec DMP, FBGEMM CPU TBE)"}
        traj = [{"step": float(i), "loss": v} for i, v in enumerate(losses)]
        return Result(status="ok", source="measured", metrics=metrics, phases_ms=phases, trajectory=traj, extra=extra,
                      wall_time_s=time.perf_counter() - t_start, **common)
