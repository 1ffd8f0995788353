"""Analytical step-time model of recommendation-model training on a GPU cluster (SIMULATED).

Nothing here is measured: it predicts one training step of a workload + co-design config on
``world_size`` ranks of a :class:`~cost_models.hardware.ClusterSpec`, from first principles and the
public figures in ``cost_models/hardware.py``. Every figure it produces is *simulated*.

What one step is, per rank, on the critical path (TorchRec-style hybrid parallelism):

1. input all-to-all: ids and lengths of the rank's local batch go to the ranks owning each shard
   (pipelined behind the previous step's dense compute, as TorchRec's ``TrainPipelineSparseDist``);
2. embedding lookup forward (HBM-bandwidth bound: ids x row bytes rounded up to 32-byte sectors,
   minus the share served by L2 for the hottest rows of skewed tables);
3. output all-to-all: pooled embeddings back to the data-parallel ranks (row-wise shards send
   partial sums, column-wise shards their columns);
4. dense forward and backward: every GEMM of the dense architecture via ``cost_models.gpu_gemm``
   (precision and FP8 recipe per site, small-GEMM efficiency, split-K, cast kernels);
5. data-parallel all-reduce of dense gradients (hierarchical: NVLink inside a node, ring or tree
   between nodes, whichever is faster), overlapped with the backward by the ``overlap`` fraction;
6. output all-to-all backward (embedding gradients), embedding backward with the fused row-wise
   AdaGrad update of each unique row touched (unique rows from the Zipf access skew);
7. 2D sparse parallelism only: synchronisation of each shard across its ``world_size / group_size``
   replicas -- by default TorchRec ``DMPCollection.sync()``-style averaging of the shard's weights and
   optimizer state every ``emb_sync_interval`` steps (amortized per step); with
   ``emb_sync="gradients"``, every step the touched rows' counts and ids all-gathered and the gradients
   of every row touched by any replica (the union of the replicas' Zipf draws) all-reduced, as the
   runner does, one bucket per rank (cost_models.comm.rank_sync_ms, the plan estimate's rule too);
8. dense optimizer (Adam: bandwidth-bound read/write of params, grads and two moments).

Every collective is alpha-beta (Hockney): a latency per collective step, a per-peer overhead for
all-to-all messages, and bytes over the per-GPU link bandwidth times an efficiency. The slowest
rank of a group sets the pace of each all-to-all (they are synchronisation points), so load
imbalance of the sharding plan shows up directly.

Sharding: an explicit plan document in ``Config.sharding.plan`` (a full ``sharding.types.Plan``,
read by ``sharding.types.plan_from_dict`` as ``cubic shard export/evaluate`` read it) is used as
given; otherwise the one plan path (``sharding.from_config.plan_for``) plans for the cluster with
the planner the config names (``none`` = the registered ``greedy`` planner of ``sharding.greedy``),
priced with the device's HBM lookup model and the cluster's bandwidths. ``Config.sharding.group_size`` = G < world_size is 2D sparse
parallelism (model-parallel groups of G ranks, embeddings replicated world_size/G times).

Not modelled: network congestion/incast and non-full-bisection fabrics, stragglers and jitter,
kernel-level overlap of embedding and dense compute on separate streams, host-side input pipeline,
prefetch/UVM caching of tables beyond HBM, quantized communication, and model quality (loss, NE; the
simulator reports the MEASURED NE cost of a 2D sync choice from cost_models.two_d_quality instead).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from pydantic import Field

from cost_models.comm import CommModel, rank_sync_ms
from cost_models.access import zipf_stats  # noqa: F401  (re-exported: the step model's access model)
from cost_models.gpu_embedding import lookup_time_s
from cost_models.gpu_gemm import DEFAULT_CONSTANTS, GemmConstants, gemm_time_s, linear_block_kernels
from cost_models.hardware import ClusterSpec, DeviceSpec
from cubic.core.recipes import FP8_RECIPES
from cubic.core.config import Config
from cubic.core.units import GIB
from cubic.core.spec import (DLRMArch, DMTArch, Frozen, SpecError, Table, Topology, Workload, WukongArch, check_group_size,
                             stable_hash)
from sharding.types import Plan, ReplicaSync, Storage, plan_from_dict

ID_BYTES = 8  # int64 ids in the input all-to-all and the TBE kernels
LENGTH_BYTES = 4  # int32 lengths per (example, table)
EMB_BYTES = 4  # fp32 embedding weights and pooled outputs/gradients (FBGEMM TBE default)


# public sources (or stated assumptions) of the model's own constants; the hardware figures are in
# cost_models/hardware.py and the GEMM model's in cost_models/gpu_gemm.py
PARAM_SOURCES = {
    "hbm_eff": ("modelling assumption: FBGEMM TBE lookups reach ~60-70% of HBM bandwidth for rows of "
                ">= 64 bytes (gather of random rows; sector rounding is modelled separately)"),
    "nvlink_eff": "modelling assumption: NCCL bus bandwidth ~80% of the NVLink rate (nccl-tests on DGX H100)",
    "net_eff": "modelling assumption: NCCL bus bandwidth ~80% of the 400 Gb/s NIC rate across nodes",
    "overlap": "modelling assumption: DDP bucketed all-reduce hides behind ~80% of the backward compute",
    "a2a_peer_overhead_s": ("modelling assumption (LogP-style per-message overhead): NCCL all-to-all posts "
                            "one send+recv per peer; ~1 us of proxy/NIC work per message does not overlap"),
    "l2_bytes": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 50 MB L2 cache",
    "l2_bw_ratio": "modelling assumption: L2 hit bandwidth ~1.6x HBM (public H100 microbenchmarks ~5.5 TB/s)",
    "reserved_bytes": "modelling assumption: CUDA context, NCCL buffers and allocator fragmentation ~3 GB",
    "sort_passes": "modelling assumption: radix sort of int64 ids in the TBE backward ~4 read+write passes",
}


class StepModelParams(Frozen):
    """Efficiency factors and constants of the step model; calibration fits some of them.

    ``gemm_eff`` scales the GEMM model's throughput (1.0 = ``cost_models.gpu_gemm`` as is);
    ``hbm_eff``/``nvlink_eff``/``net_eff`` are achieved fractions of the datasheet bandwidths;
    ``overlap`` the fraction of backward compute that hides the dense all-reduce;
    ``step_overhead_s`` a fixed per-step cost (launches, Python, synchronisation).
    """

    gemm_eff: float = Field(default=1.0, gt=0.0, le=10.0)
    hbm_eff: float = Field(default=0.65, gt=0.0, le=1.0)
    nvlink_eff: float = Field(default=0.80, gt=0.0, le=1.0)
    net_eff: float = Field(default=0.80, gt=0.0, le=1.0)
    overlap: float = Field(default=0.80, ge=0.0, le=1.0)
    step_overhead_s: float = Field(default=0.0, ge=0.0, le=10.0)
    a2a_peer_overhead_s: float = Field(default=1e-6, ge=0.0, le=1e-3)
    l2_bytes: float = Field(default=50e6, ge=0.0)
    l2_bw_ratio: float = Field(default=1.6, ge=1.0, le=100.0)
    reserved_bytes: float = Field(default=3e9, ge=0.0)
    sort_passes: float = Field(default=4.0, ge=0.0, le=64.0)
    pipeline_input_dist: bool = True
    emb_sync: Literal["gradients", "weights"] = Field(
        default=ReplicaSync().mode,
        description=("2D replica synchronisation: 'gradients' = every step, all-gather the touched ids and "
                     "all-reduce the gradients of the rows touched by any replica; 'weights' = TorchRec "
                     "DMPCollection.sync(): all-reduce (average) the whole shard weights and optimizer state "
                     "every emb_sync_interval steps"))
    emb_sync_interval: int = Field(default=ReplicaSync().interval, ge=1, le=1_000_000,
                                   description="steps between weight syncs (emb_sync='weights' only)")
    gemm_constants: dict[str, Any] = Field(default_factory=dict,
                                           description="overrides of gpu_gemm.GemmConstants (e.g. num_sms for a CPU)")

    def gemm_constants_obj(self) -> GemmConstants:
        if not self.gemm_constants:
            return DEFAULT_CONSTANTS
        import dataclasses

        return dataclasses.replace(DEFAULT_CONSTANTS, **self.gemm_constants)


DEFAULT_PARAMS = StepModelParams()


# --------------------------------------------------------------------------------------------
# Access skew: unique rows touched and L2 hit rate under Zipf(alpha) over `rows` ids


# --------------------------------------------------------------------------------------------
# Dense architecture -> GEMM sites (the one place the layer list is derived from the arch)


@dataclass(frozen=True)
class DenseSite:
    """One GEMM of the dense part: ``[m, k] @ [k, n]``; ``linear`` sites are nn.Linear (FP8-eligible).
    ``name`` is the real model's module name under its dense part (``cubic.core.models.build_dense``: the
    names a placement probed on the model carries, less ``dense.``); a site that batches several
    modules of one shape (the per-table projections) names them in ``modules``."""

    name: str
    m: int
    k: int
    n: int
    kind: str = "linear"  # "linear" | "bmm" (activation x activation, stays in the base precision)
    norm_before: bool = False
    act_after: str | None = None
    modules: tuple[str, ...] = ()

    @property
    def module_names(self) -> tuple[str, ...]:
        """The real model's nn.Linear modules this site stands for (none for a bmm)."""
        return () if self.kind != "linear" else (self.modules or (self.name,))

    @property
    def params(self) -> int:
        return self.k * self.n if self.kind == "linear" else 0

    @property
    def flops_fwd(self) -> float:
        return 2.0 * self.m * self.k * self.n


def _mlp(prefix: str, m: int, sizes: list[int], d_in: int, *, norm_first: bool = False,
         last_act: bool = True) -> list[DenseSite]:
    # the sites of cubic.core.models.MLP(d_in, sizes, last_act): ReLU between, after the last unless last_act=False
    out, k = [], d_in
    for j, n in enumerate(sizes):
        act = last_act or j < len(sizes) - 1
        out.append(DenseSite(f"{prefix}.fc.{j}", m, k, n, norm_before=norm_first and j == 0,
                             act_after="relu" if act else None))
        k = n
    return out


def _projection_sites(tables: list[Table], m: int, d: int) -> list[DenseSite]:
    # a table whose dim is not the common width d has its own projection (proj.<table>); the ones of
    # one dim are costed as one batched GEMM
    out = []
    for dim in sorted({t.dim for t in tables if t.dim != d}):
        names = tuple(f"proj.{t.name}" for t in tables if t.dim == dim)
        out.append(DenseSite(f"proj.d{dim}", m * len(names), dim, d, modules=names))
    return out


def dense_sites(workload: Workload, batch: int) -> list[DenseSite]:
    """Every GEMM of the workload's dense architecture at ``batch`` rows (per-rank batch)."""
    arch, B = workload.dense_arch, batch
    F = workload.data.num_dense_features
    tables = workload.tables
    sites: list[DenseSite] = []
    if isinstance(arch, WukongArch):
        d = arch.emb_dim
        # the real model's dense features: max(1, round(F / 8)) embeddings, no activation (WukongDense)
        n_dense = max(1, round(F / 8)) if F else 0
        if F:
            sites.append(DenseSite("dense_proj", B, F, n_dense * d))
        sites += _projection_sites(tables, B, d)
        n_in = len(tables) + n_dense
        for i in range(arch.num_layers):
            p = f"layers.{i}"
            n_out = arch.num_emb_lcb + arch.num_emb_fmb
            # optimized FM: X^T Y (learned n x k projection), then X (X^T Y) per example
            # the previous layer's output LayerNorm (when layer_norm) is priced before this layer's first
            # GEMM over it: the same B x n_in x d elements
            sites.append(DenseSite(f"{p}.fmb.proj", B * d, n_in, arch.rank_fmb, norm_before=i > 0 and arch.layer_norm))
            sites.append(DenseSite(f"{p}.fmb.fm", B * n_in, d, arch.rank_fmb, kind="bmm"))
            # the FMB's own LayerNorm over the FM output comes before its MLP always (layer_norm is the
            # layers' output norm, not this one)
            sites += _mlp(f"{p}.fmb.mlp", B, [arch.mlp_width] * arch.fmb_mlp_layers + [arch.num_emb_fmb * d],
                          n_in * arch.rank_fmb, norm_first=True, last_act=False)
            sites.append(DenseSite(f"{p}.lcb.proj", B * d, n_in, arch.num_emb_lcb))
            if n_in != n_out:
                sites.append(DenseSite(f"{p}.residual", B * d, n_in, n_out))
            n_in = n_out
        # the last layer's output LayerNorm, priced before the top MLP's first GEMM over it (same elements)
        sites += _mlp("top", B, list(arch.top_mlp), n_in * d, norm_first=arch.layer_norm, last_act=False)
    elif isinstance(arch, DLRMArch):
        d = arch.bottom_mlp[-1]
        if F:
            sites += _mlp("bottom", B, list(arch.bottom_mlp), F)
        sites += _projection_sites(tables, B, d)
        n = len(tables) + (1 if F else 0)
        sites.append(DenseSite("interaction", B * n, d, n, kind="bmm"))
        # the real top MLP reads the bottom's output only when there are dense features
        sites += _mlp("top", B, list(arch.top_mlp), (d if F else 0) + n * (n - 1) // 2, last_act=False)
    elif isinstance(arch, DMTArch):
        groups = list(dict.fromkeys(t.feature_group for t in tables))  # the real model's order: first appearance
        towers: list[list[Table]] = [[] for _ in range(arch.num_towers)]
        for gi, g in enumerate(groups):
            towers[gi % arch.num_towers] += [t for t in tables if t.feature_group == g]
        for j, ts in enumerate(towers):
            if ts:
                sites += _mlp(f"towers.{j}", B, list(arch.tower_mlp) + [arch.tower_dim], sum(t.dim for t in ts))
        if F:
            sites += _mlp("bottom", B, [arch.tower_dim], F)
        n_towers = sum(1 for ts in towers if ts) + (1 if F else 0)
        sites += _mlp("top", B, list(arch.top_mlp), n_towers * arch.tower_dim, last_act=False)
    else:  # pragma: no cover - DenseArch is a closed union
        raise SpecError(f"unknown dense arch {type(arch).__name__}", field="dense_arch")
    return sites


def _priced_sites(sites: list[DenseSite], config: Config,
                  workload: Workload) -> list[tuple[DenseSite, str, str | None]]:
    """(site, precision, recipe) from the config's dense dtype and FP8 policy. A placement is a
    full ``fp8.placement.Placement`` document, read by ``fp8.placement.parse_placement``; its site
    names are the real model's module names (``dense.top.fc.0``), matched to the sites' module names
    exactly, and a site the model lacks is refused as a real run refuses it
    (``fp8.runtime.placement_misfit``). A placed site is FP8 whatever its size (the placement decided; the
    size rule is policy "all"'s). A batched site (one dim's table projections) whose modules the placement
    splits is priced as one batched GEMM per (precision, recipe) of its modules, so a mixed placement is
    priced as placed, not in the base precision."""
    base = "bf16" if config.kernels.dense_dtype == "bf16" else "fp32"
    fp8 = config.fp8
    placed: dict[str, str] = {}
    if fp8.policy == "placement":
        # imported here: fp8's kernels import torch, which only placement configs need to load
        from fp8.placement import parse_placement
        from fp8.runtime import placement_misfit

        placement = parse_placement(fp8.placement or {}, source="config.fp8.placement")
        # a name that matched nothing was simulated in the base precision without a word
        if misfit := placement_misfit(placement, workload):
            raise SpecError(misfit[1], field=f"fp8.placement.{misfit[0]}")  # the caller names the config file
        placed = {name.removeprefix("dense."): str(site.recipe) for name, site in placement.fp8_sites().items()}
    out: list[tuple[DenseSite, str, str | None]] = []
    for s in sites:
        eligible = s.kind == "linear" and s.n >= 16 and s.k >= 16
        if eligible and fp8.policy in ("all", "budget"):
            out.append((s, "fp8", fp8.recipe))
        elif s.kind == "linear" and fp8.policy == "placement":
            groups: dict[str | None, list[str]] = {}
            for m in s.module_names:
                groups.setdefault(placed.get(m), []).append(m)
            rows = s.m // len(s.module_names)  # a batched site's rows are its modules' rows, stacked
            for recipe, mods in groups.items():
                part = s if len(groups) == 1 else replace(s, name=f"{s.name}[{','.join(mods)}]",
                                                          m=rows * len(mods), modules=tuple(mods))
                if recipe is None:
                    out.append((part, base, None))
                else:
                    out.append((part, "fp8", recipe if recipe in FP8_RECIPES else fp8.recipe))
        else:
            out.append((s, base, None))
    return out


@dataclass
class DenseCost:
    fwd_s: float
    bwd_s: float
    params: int
    activation_bytes: float
    flops_fwd: float
    precisions: dict[str, int]


_DENSE_CACHE: dict[tuple, DenseCost] = {}


def dense_cost(workload: Workload, config: Config, batch: int, device: DeviceSpec,
               params: StepModelParams = DEFAULT_PARAMS) -> DenseCost:
    """Forward/backward time of the dense part on one rank, its parameter count and saved activations."""
    key = (stable_hash(workload.dense_arch.model_dump(mode="json")), workload.data.num_dense_features,
           tuple((t.name, t.dim, t.feature_group) for t in workload.tables), config.kernels.dense_dtype,
           stable_hash(config.fp8.model_dump(mode="json")), batch, stable_hash(device.model_dump(mode="json")),
           stable_hash(params.gemm_constants))
    if key not in _DENSE_CACHE:
        if len(_DENSE_CACHE) > 4096:
            _DENSE_CACHE.clear()
        _DENSE_CACHE[key] = _dense_cost(workload, config, batch, device, params)
    c = _DENSE_CACHE[key]
    # gemm_eff scales the GEMM model's throughput; everything else is the cached shape-level cost
    return DenseCost(c.fwd_s / params.gemm_eff, c.bwd_s / params.gemm_eff, c.params, c.activation_bytes,
                     c.flops_fwd, dict(c.precisions))


def _dense_cost(workload: Workload, config: Config, batch: int, device: DeviceSpec,
                params: StepModelParams) -> DenseCost:
    consts = params.gemm_constants_obj()
    sites = dense_sites(workload, batch)
    fwd = bwd = act = 0.0
    counts: dict[str, int] = {}  # per GEMM site of the real model: a batched site counts its modules
    for s, p, recipe in _priced_sites(sites, config, workload):
        counts[p] = counts.get(p, 0) + max(1, len(s.module_names))
        eb = 4 if p == "fp32" else 2
        if s.kind == "bmm":
            # X (X^T Y)-style batched products: fwd one GEMM, bwd two of the same size
            t = gemm_time_s(s.m, s.k, s.n, p if p != "fp8" else "bf16", None, device, constants=consts)
            fwd += t
            bwd += 2 * t
            act += s.m * (s.k + s.n) * eb
            continue
        for kern in linear_block_kernels(s.m, s.k, s.n, p, recipe, norm_before=s.norm_before,
                                         act_after=s.act_after, device=device, constants=consts):
            if kern.phase == "fwd":
                fwd += kern.time_s
            else:
                bwd += kern.time_s
        # saved for backward: the input (and the norm's input), the output for the activation
        act += s.m * s.k * (1 if p == "fp8" else eb) + s.m * s.n * eb * (1 if s.act_after else 0)
        act += s.m * s.k * eb if s.norm_before else 0
    return DenseCost(fwd, bwd, sum(s.params for s in sites), act,
                     sum(s.flops_fwd for s in sites), counts)


# --------------------------------------------------------------------------------------------
# Sharding plan: shards of tables on the ranks of one model-parallel group


@dataclass
class ShardLoad:
    """One shard on one group rank, with its per-step work for the group's batch."""

    table: int  # index into the workload's tables
    kind: str  # table_wise | column_wise | row_wise | table_row_wise | data_parallel
    rank: int
    rows: int
    cols: int
    id_share: float  # share of the table's ids this shard processes (row-wise: its rows' share)
    k: int = 1  # number of shards of this table


def _shard_time_s(t: Table, rows: float, cols: float, n_ids: float, out_rows: float, hit: float,
                  unique: float, dev: DeviceSpec, params: StepModelParams, sgd: bool) -> tuple[float, float, float]:
    """(forward, backward, row-update) time of one shard's lookups on its rank (cost_models.gpu_embedding)."""
    return lookup_time_s(n_ids, cols, out_rows, hit, unique, dev.hbm_bw, hbm_eff=params.hbm_eff,
                         l2_bw_ratio=params.l2_bw_ratio, sort_passes=params.sort_passes, sgd=sgd)


def shard_loads(plan: Plan, workload: Workload) -> list[ShardLoad]:
    """The step model's view of a sharding plan (``sharding.types.Plan``, read by
    ``plan_from_dict``): one load per shard. The plan must place the workload's tables as the
    config shapes them (same names, rows and dims)."""
    index = {t.name: i for i, t in enumerate(workload.tables)}
    planned = {t.name: t for t in plan.tables}
    for t in workload.tables:
        p = planned.get(t.name)
        if p is None:
            raise SpecError(f"plan does not place table {t.name!r}", field="sharding.plan.tables")
        if (p.rows, p.dim) != (t.rows, t.dim):
            raise SpecError(f"table {t.name!r} is {p.rows}x{p.dim} in the plan but {t.rows}x{t.dim} in the workload",
                            field="sharding.plan.tables")
    extra = sorted(set(planned) - set(index))
    if extra:
        raise SpecError(f"plan places table {extra[0]!r}, which the workload does not have", field="sharding.plan.tables")
    per_table: dict[int, int] = {}
    out: list[ShardLoad] = []
    for s in plan.shards:
        ti = index[s.table]
        share = 1.0 if s.sharding_type in ("table_wise", "column_wise", "data_parallel") else s.rows / workload.tables[ti].rows
        out.append(ShardLoad(ti, s.sharding_type, s.rank, s.rows, s.cols, share))
        per_table[ti] = per_table.get(ti, 0) + 1
    for s in out:
        s.k = per_table[s.table]
    return out


def _topology(cluster: ClusterSpec, world_size: int, mem_per_rank: float) -> Topology:
    """The cluster as a plan's topology (the sharding schema's)."""
    return Topology(world_size=world_size, ranks_per_node=min(cluster.ranks_per_node, world_size),
                    memory_per_rank_gb=max(mem_per_rank, 1.0) / 1e9, intra_node_bw_gbps=cluster.nvlink_bw / 1e9,
                    inter_node_bw_gbps=cluster.network_bw / 1e9, device=cluster.device.name)


def cluster_plan(workload: Workload, config: Config, cluster: ClusterSpec, world_size: int,
                 mem_budget: float, params: StepModelParams = DEFAULT_PARAMS) -> Plan:
    """The plan a config runs with on the cluster, through the one plan path
    (``sharding.from_config.plan_for``: the config's plan, else its planner; ``none`` = the greedy
    planner), priced with the device's HBM lookup model. Raises PlanDoesNotFit when nothing fits."""
    from sharding.estimate import GpuEstimator  # on use: the sharding package loads torch
    from sharding.from_config import plan_for

    # the plan is priced with the replica sync the step simulates (the config's, else params')
    p = sync_params(config, params)
    return plan_for(workload, config, world_size, topology=_topology(cluster, world_size, mem_budget),
                    estimator=GpuEstimator(cluster.device), sync=ReplicaSync.of(p.emb_sync, p.emb_sync_interval))


def plan_document(workload: Workload, config: Config, cluster: ClusterSpec, world_size: int,
                  params: StepModelParams = DEFAULT_PARAMS) -> dict[str, Any] | None:
    """The plan ``predict_step`` would use, as a sharding plan document (the ``sharding.types.Plan``
    schema that ``cubic shard export/evaluate`` read; None if nothing fits).

    Pinning it in ``Config.sharding.plan`` keeps the plan fixed while other factors vary
    (calibration fits efficiencies for the plan a measured run actually used).
    """
    if config.sharding.plan is not None:
        return config.sharding.plan
    pred = predict_step(workload, config, cluster, world_size, params)
    if pred.sharding_plan is None:
        return None
    return pred.sharding_plan.model_dump(mode="json")


# --------------------------------------------------------------------------------------------
# Collectives (alpha-beta)


def allreduce_ms(nbytes: float, members_per_node: int, nodes: int, cluster: ClusterSpec,
                 params: StepModelParams) -> float:
    """The cluster's hierarchical all-reduce (cost_models.comm.CommModel.all_reduce_ms, the one model)."""
    return cluster_comm(cluster, params).all_reduce_ms(members_per_node * nodes, nbytes, members_per_node)


def cluster_comm(cluster: ClusterSpec, params: StepModelParams) -> CommModel:
    """The cluster as cost_models.comm's all-to-all model: NVLink within a node, the network across
    nodes, each at the calibrated efficiency, a latency per leg and an overhead per peer."""
    return CommModel(alpha_s=cluster.nvlink_latency_s, alpha_peer_s=params.a2a_peer_overhead_s,
                     beta_intra_s_per_byte=1.0 / (cluster.nvlink_bw * params.nvlink_eff),
                     beta_inter_s_per_byte=1.0 / (cluster.network_bw * params.net_eff),
                     ranks_per_node=cluster.ranks_per_node, source="modelled",
                     alpha_inter_s=cluster.network_latency_s,
                     fitted=tuple((k, *c) for k, c in sorted(cluster.collectives.items())))


def all_to_all_s(per_peer: np.ndarray, scale_out: np.ndarray, G: int, cluster: ClusterSpec,
                 params: StepModelParams) -> float:
    """All-to-all within a group of G ranks; ``per_peer[r]``: bytes rank r sends to each other rank,
    ``scale_out[r]`` multiplies it (1 = uniform). The collective ends when its slowest rank is done."""
    if G <= 1:
        return 0.0
    return float(np.max(cluster_comm(cluster, params).all_to_all_ranks_ms(per_peer * scale_out, G))) / 1e3


# --------------------------------------------------------------------------------------------
# The step


@dataclass
class StepPrediction:
    """One simulated step: time with breakdown (seconds), throughput, memory, plan summary, OOM."""

    step_s: float
    phases_s: dict[str, float]  # exposed time of each phase on the critical path; they sum to step_s
    examples_per_s: float
    peak_mem_bytes: float
    memory: dict[str, float]
    oom: bool
    oom_reason: str | None
    world_size: int
    group_size: int
    batch_per_rank: int
    plan: dict[str, Any] = field(default_factory=dict)
    dense: dict[str, Any] = field(default_factory=dict)
    shards: list[ShardLoad] = field(default_factory=list, repr=False)
    sharding_plan: Plan | None = field(default=None, repr=False)  # the plan the step ran (one record of it)

    @property
    def dominant_phase(self) -> str:
        return max(self.phases_s, key=self.phases_s.get) if self.phases_s else ""

    def standard_phases_ms(self) -> dict[str, float]:
        """The Result phase keys: embedding_fwd/bwd, dense_fwd/bwd, optimizer, communication."""
        p = {k: v * 1e3 for k, v in self.phases_s.items()}
        return {
            "embedding_fwd": p.get("embedding_fwd", 0.0),
            "embedding_bwd": p.get("embedding_bwd", 0.0),
            "dense_fwd": p.get("dense_fwd", 0.0),
            "dense_bwd": p.get("dense_bwd", 0.0),
            "optimizer": p.get("sparse_optimizer", 0.0) + p.get("dense_optimizer", 0.0),
            "communication": sum(p.get(k, 0.0) for k in COMM_PHASES),
            "overhead": p.get("overhead", 0.0),
        }


COMM_PHASES = ("a2a_input", "a2a_output_fwd", "a2a_output_bwd", "dense_allreduce", "embedding_sync")


def sync_params(config: Config, params: StepModelParams = DEFAULT_PARAMS) -> StepModelParams:
    """``params`` with the config's 2D replica sync choice (``Config.sharding.sync`` / ``sync_interval``,
    when set) in place of ``emb_sync`` / ``emb_sync_interval``."""
    update: dict[str, Any] = {}
    if config.sharding.sync is not None:
        update["emb_sync"] = config.sharding.sync
    if config.sharding.sync_interval is not None:
        update["emb_sync_interval"] = config.sharding.sync_interval
    return params.model_copy(update=update) if update else params


@dataclass
class _GroupShards:
    """One model-parallel group's shards as arrays (one entry per shard), with the ids each
    processes per step and its L2 hit rate: what the compute, communication and memory terms read."""

    kind: list[str]
    table: np.ndarray
    rank: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    share: np.ndarray
    dp: np.ndarray  # data-parallel tables (replicated on every rank)
    pf: np.ndarray
    alpha: np.ndarray
    dim: np.ndarray
    ex: np.ndarray  # examples each shard's lookups serve per step
    n_ids: np.ndarray
    unique: np.ndarray
    hit: np.ndarray
    out_cols: np.ndarray  # pooled-output columns a shard sends (row-wise shards send whole rows)

    @classmethod
    def of(cls, shards: list[ShardLoad], wl: Workload, B: int, G: int, params: StepModelParams) -> "_GroupShards":
        tables = wl.tables
        t_idx = np.array([s.table for s in shards])
        rank = np.array([s.rank for s in shards])
        rows = np.array([s.rows for s in shards], dtype=np.float64)
        cols = np.array([s.cols for s in shards], dtype=np.float64)
        share = np.array([s.id_share for s in shards])
        kind = [s.kind for s in shards]
        dp = np.array([k == "data_parallel" for k in kind])
        pf = np.array([tables[i].pooling_factor for i in t_idx])
        alpha = np.array([tables[i].access.effective_alpha() for i in t_idx])
        dim = np.array([tables[i].dim for i in t_idx], dtype=np.float64)
        # ids each shard processes per step: the group's batch (data-parallel tables: the rank's own)
        ex = np.where(dp, B, B * G).astype(np.float64)
        n_ids = ex * pf * share
        # L2 share of each shard: proportional to its id traffic on its rank
        traffic = n_ids * cols
        rank_traffic = np.bincount(rank, weights=traffic, minlength=G)
        cache_rows = params.l2_bytes * traffic / np.maximum(rank_traffic[rank], 1e-9) / np.maximum(cols * EMB_BYTES, 1)
        unique, hit = zipf_stats(n_ids, rows, alpha, cache_rows)
        out_cols = np.where(np.array([k in ("row_wise", "table_row_wise") for k in kind]), dim, cols)
        return cls(kind, t_idx, rank, rows, cols, share, dp, pf, alpha, dim, ex, n_ids, unique, hit, out_cols)

    def embedding_times(self, wl: Workload, G: int, dev: DeviceSpec, params: StepModelParams,
                        sgd_emb: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per group rank: embedding forward, backward and sparse-optimizer seconds."""
        n = len(self.kind)
        f_t, b_t, u_t = np.zeros(n), np.zeros(n), np.zeros(n)
        for j in range(n):
            f_t[j], b_t[j], u_t[j] = _shard_time_s(wl.tables[self.table[j]], self.rows[j], self.cols[j], self.n_ids[j],
                                                   self.ex[j], self.hit[j], self.unique[j], dev, params, sgd_emb)
        return tuple(np.bincount(self.rank, weights=w, minlength=G) for w in (f_t, b_t, u_t))

    def shard_bytes(self, optimizer: str) -> np.ndarray:
        """Each shard's weights and its embedding optimizer's state (sharding.types.Storage.parts)."""
        return sum(Storage.parts(self.rows, self.cols, optimizer))


@dataclass
class _Comm:
    """Communication of one step: seconds and bytes of each collective."""

    a2a_input_s: float
    a2a_output_s: float
    allreduce_s: float
    sync_s: float
    ids_per_peer: np.ndarray
    out_per_peer: np.ndarray
    allreduce_bytes: float
    sync_bytes: float


def _communication(sh: _GroupShards, dc: DenseCost, B: int, G: int, W: int, grad_bytes: int, emb_optimizer: str,
                   cluster: ClusterSpec, params: StepModelParams) -> _Comm:
    # all-to-all volumes: what each owner sends to each other group rank per step
    mp = ~sh.dp
    ids_pp = np.bincount(sh.rank[mp], weights=(B * sh.pf * sh.share * ID_BYTES + B * LENGTH_BYTES)[mp], minlength=G)
    out_pp = np.bincount(sh.rank[mp], weights=(B * sh.out_cols * EMB_BYTES)[mp], minlength=G)
    ones = np.ones(G)
    t_in = all_to_all_s(ids_pp, ones, G, cluster, params)
    t_out = all_to_all_s(out_pp, ones, G, cluster, params)

    # data-parallel all-reduce of dense gradients (+ data-parallel tables) across all W ranks
    rpn = min(cluster.ranks_per_node, W)
    nodes = -(-W // rpn)
    dp_bytes = dc.params * grad_bytes + float((sh.rows * sh.cols * EMB_BYTES)[sh.dp].sum()) / max(G, 1)
    t_ar = allreduce_ms(dp_bytes, rpn, nodes, cluster, params) / 1e3

    # 2D: each rank's bucket of shards kept in step with its replicas (cost_models.comm.rank_sync_ms)
    R = W // G
    t_sync = 0.0
    sync_bytes = 0.0
    if R > 1 and mp.any():
        comm = cluster_comm(cluster, params)
        per_rank, sent = rank_sync_ms(sh.rank[mp], G, R, comm, mode=params.emb_sync,
                                      interval=params.emb_sync_interval, shard_bytes=sh.shard_bytes(emb_optimizer)[mp],
                                      rows=sh.rows[mp], cols=sh.cols[mp], alpha=sh.alpha[mp], draws=sh.n_ids[mp])
        sync_bytes = float(sent.max())
        t_sync = float(max(per_rank)) / 1e3
    return _Comm(t_in, t_out, t_ar, t_sync, ids_pp, out_pp, dp_bytes, sync_bytes)


def _group_plan(wl: Workload, config: Config, cluster: ClusterSpec, W: int, dc: DenseCost, dense_mem: float,
                emb_act: float, params: StepModelParams) -> tuple[Plan | None, str, StepPrediction | None]:
    """(the plan of one model-parallel group, its planner's name, None), or (None, planner, the OOM
    prediction) when even a perfectly balanced plan, or the planner's, cannot fit.
    sharding.from_config is the one plan path."""
    from sharding.from_config import planner_name
    from sharding.types import PlanDoesNotFit

    dev, B = cluster.device, wl.batch_size
    plan = None if config.sharding.plan is None else plan_from_dict(config.sharding.plan, source="config.sharding.plan")
    G = plan.group_size if plan is not None else (config.sharding.group_size or W)
    planner = plan.planner if plan is not None else planner_name(config)
    check_group_size(G, W)
    base_mem = params.reserved_bytes + dense_mem + dc.activation_bytes + emb_act
    emb_bytes = sum(sum(Storage.parts(t.rows, t.dim, wl.optimizers.embedding)) for t in wl.tables)
    low = base_mem + emb_bytes / G
    if low > dev.hbm_bytes:
        # even a perfectly balanced plan cannot fit: report the lower bound of the peak
        return None, planner, _oom(wl, W, G, B, low,
                                   f"peak memory >= {low / GIB:.1f} GiB exceeds {dev.hbm_bytes / GIB:.1f} GiB HBM "
                                   f"of {dev.name} (embeddings >= {emb_bytes / G / GIB:.1f} GiB per rank over a group "
                                   f"of {G}, activations {(dc.activation_bytes + emb_act) / GIB:.1f} GiB, "
                                   f"dense+optimizer {dense_mem / GIB:.1f} GiB)",
                                   planner, dc)
    if plan is None:
        try:  # leave room for the all-to-all buffers: a planner fills at most 90% of what remains
            plan = cluster_plan(wl, config, cluster, W, 0.9 * (dev.hbm_bytes - base_mem), params)
        except PlanDoesNotFit as e:
            return None, planner, _oom(wl, W, G, B, low, f"planner {planner}: {e}", planner, dc)
    return plan, planner, None


def predict_step(workload: Workload, config: Config, cluster: ClusterSpec, world_size: int,
                 params: StepModelParams = DEFAULT_PARAMS) -> StepPrediction:
    """Simulated step of ``config`` applied to ``workload`` on ``world_size`` ranks of ``cluster``."""
    if world_size < 1:
        raise SpecError("must be >= 1", field="world_size")
    params = sync_params(config, params)
    wl = config.apply(workload)
    dev = cluster.device
    B = wl.batch_size
    W = world_size
    sgd_emb = wl.optimizers.embedding == "sgd"

    # dense part (identical on every rank)
    dc = dense_cost(wl, config, B, dev, params)
    grad_bytes = 2 if config.kernels.dense_dtype == "bf16" else 4
    dense_mem = dc.params * (4 + 4 + (8 if wl.optimizers.dense == "adam" else 0)
                             + (2 if config.kernels.dense_dtype == "bf16" else 0))
    emb_act = B * sum(t.dim for t in wl.tables) * EMB_BYTES * 2  # pooled inputs and their gradients
    plan, planner, oom_prediction = _group_plan(wl, config, cluster, W, dc, dense_mem, emb_act, params)
    if oom_prediction is not None:
        return oom_prediction
    G, shards = plan.group_size, shard_loads(plan, wl)
    R = W // G
    sh = _GroupShards.of(shards, wl, B, G, params)
    emb_fwd_r, emb_bwd_r, emb_upd_r = sh.embedding_times(wl, G, dev, params, sgd_emb)
    emb_total_r = emb_fwd_r + emb_bwd_r + emb_upd_r
    slow = int(np.argmax(emb_total_r))
    comm = _communication(sh, dc, B, G, W, grad_bytes, wl.optimizers.embedding, cluster, params)

    # dense optimizer: Adam reads param, grad, m, v and writes param, m, v (fp32); SGD reads 2 writes 1
    opt_bytes = dc.params * (28 if wl.optimizers.dense == "adam" else 12)
    t_dense_opt = opt_bytes / (dev.hbm_bw * params.hbm_eff) if dc.params else 0.0

    emb_fwd, emb_bwd, emb_upd = float(emb_fwd_r[slow]), float(emb_bwd_r[slow]), float(emb_upd_r[slow])
    hidden = params.overlap * (dc.bwd_s + emb_bwd + emb_upd)
    ar_exposed = max(0.0, comm.allreduce_s - hidden)
    t_in = comm.a2a_input_s
    in_exposed = max(0.0, t_in - (dc.fwd_s + dc.bwd_s)) if params.pipeline_input_dist else t_in
    phases = {
        "a2a_input": in_exposed,
        "embedding_fwd": emb_fwd,
        "a2a_output_fwd": comm.a2a_output_s,
        "dense_fwd": dc.fwd_s,
        "dense_bwd": dc.bwd_s,
        "dense_allreduce": ar_exposed,
        "a2a_output_bwd": comm.a2a_output_s,
        "embedding_bwd": emb_bwd,
        "sparse_optimizer": emb_upd,
        "embedding_sync": comm.sync_s,
        "dense_optimizer": t_dense_opt,
        "overhead": params.step_overhead_s,
    }
    step = sum(phases.values())

    # memory of the busiest rank (memory-wise)
    emb_mem_r = np.bincount(sh.rank, weights=sh.shard_bytes(wl.optimizers.embedding), minlength=G)
    # buffers: received ids, pooled outputs to send and their gradients, sorted ids in backward
    buf_r = np.bincount(sh.rank, weights=sh.n_ids * (ID_BYTES * 3) + sh.ex * sh.out_cols * EMB_BYTES * 2, minlength=G)
    mrank = int(np.argmax(emb_mem_r + buf_r))
    memory = {
        "embedding_shards": float(emb_mem_r[mrank]),
        "embedding_buffers": float(buf_r[mrank]),
        "dense_params_grads_optimizer": float(dense_mem),
        "activations": float(dc.activation_bytes + emb_act),
        "reserved": float(params.reserved_bytes),
    }
    peak = sum(memory.values())
    oom = peak > dev.hbm_bytes
    mean_load = float(emb_total_r.mean())
    plan_info = {
        "planner": planner,
        "group_size": G,
        "replicas": R,
        "shards": len(shards),
        "sharding_types": dict(Counter(sh.kind)),
        "embedding_imbalance": float(emb_total_r.max() / mean_load) if mean_load > 0 else 1.0,
        "a2a_output_bytes_per_rank": float(comm.out_per_peer.max() * (G - 1)),
        "a2a_input_bytes_per_rank": float(comm.ids_per_peer.max() * (G - 1)),
        "dense_allreduce_bytes": float(comm.allreduce_bytes),
        "embedding_sync_bytes_per_rank": comm.sync_bytes,
        "mean_l2_hit": float(np.average(sh.hit, weights=np.maximum(sh.n_ids, 1e-9))) if shards else 0.0,
    }
    dense_info = {"params": dc.params, "flops_fwd_per_rank": dc.flops_fwd, "site_precisions": dc.precisions,
                  "allreduce_s": comm.allreduce_s, "a2a_input_s": t_in}
    return StepPrediction(
        step_s=step, phases_s=phases, examples_per_s=B * W / step, peak_mem_bytes=peak, memory=memory,
        oom=oom, oom_reason=(f"peak memory {peak / GIB:.1f} GiB exceeds {dev.hbm_bytes / GIB:.1f} GiB HBM of "
                             f"{dev.name} (embeddings {memory['embedding_shards'] / GIB:.1f} GiB, activations "
                             f"{memory['activations'] / GIB:.1f} GiB, dense+optimizer "
                             f"{memory['dense_params_grads_optimizer'] / GIB:.1f} GiB)") if oom else None,
        world_size=W, group_size=G, batch_per_rank=B, plan=plan_info, dense=dense_info, shards=shards,
        sharding_plan=plan,
    )


def _oom(wl: Workload, W: int, G: int, B: int, peak_lower_bound: float, reason: str, planner: str,
         dc: DenseCost) -> StepPrediction:
    return StepPrediction(
        step_s=float("nan"), phases_s={}, examples_per_s=0.0, peak_mem_bytes=peak_lower_bound,
        memory={"lower_bound": peak_lower_bound}, oom=True, oom_reason=reason, world_size=W, group_size=G,
        batch_per_rank=B, plan={"planner": planner, "group_size": G, "replicas": W // G},
        dense={"params": dc.params},
    )
