"""Sharding value objects and the plan document (JSON, ``version`` field).

Shaped like TorchRec's planner types: a :class:`ShardingOption` is one way to cut one table into
shards (a sharding type plus the shards' row/column ranges); a :class:`Shard` is one piece placed on
one rank; a :class:`Plan` is every table's shards plus the predicted (and, once evaluated, measured)
per-rank cost breakdown and memory.

Plan schema (``version`` 1), every field documented on the models below:

```
{"version": 1, "planner": "cubic", "target": "torchrec", "world_size": 4, "group_size": 4, "batch_size": 512,
 "topology": {...cubic.spec.Topology...}, "tables": [{...cubic.spec.Table...}, ...],
 "shards": [{"table": "t0", "sharding_type": "column_wise", "rank": 2,
             "row_offset": 0, "rows": 1000, "col_offset": 0, "cols": 8}, ...],
 "predicted": {"source": "modelled", "per_rank": [{"rank": 0, "compute_ms": .., "comm_ms": ..,
               "sync_ms": .., "total_ms": .., "memory_bytes": ..}, ...], "max_ms": .., ...},
 "measured": null | {same shape, "source": "measured"},
 "planning_time_s": 0.12, "notes": ""}
```

Ranks in ``shards`` are ranks of one model-parallel group (0..group_size-1). With 2D sparse
parallelism (group_size < world_size) the group's plan is replicated world_size/group_size times;
rank r of the cluster holds the shards of group rank r % group_size. Data-parallel tables have one
shard per group rank, each covering the whole table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from cubic.core.units import GIB
from sharding.kernels import KernelChoice, hbm_bytes
from cubic.core.spec import (MAX_BATCH_SIZE, MAX_WORLD_SIZE, Frozen, SpecError, Table, Topology, check_group_size,
                             parse_model, read_structured)

# planner names (sharding.planners.make_planner builds them); here so that the CLI can list them
# without importing torch
PLANNERS = ("cubic", "torchrec", "greedy", "random", "dim_greedy", "lookup_greedy", "size_greedy", "size_lookup_greedy")
# names that ask for no planner of their own: sharding.from_config resolves them to its default planner
NONE_NAMES = frozenset({"none", "", "sim", "sim-greedy"})

class PlanDoesNotFit(SpecError):
    """A planner found no placement of the tables in the memory per rank (a SpecError: one line, exit 2
    at the CLI); callers recognise out-of-memory by this type, never by the message's text."""


PLAN_VERSION = 1
ShardingType = Literal["table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel"]
SHARDING_TYPES: tuple[str, ...] = ("table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel")
COLUMN_MULTIPLE = 4  # column-wise splits are in multiples of 4 (FBGEMM's vector width)
FP32_BYTES = 4


# the embedding optimizer's state per row beside the fp32 weights: row-wise AdaGrad, plain or
# momentum-scaled, one fp32; SGD none
ROW_STATE_BYTES = {"rowwise_adagrad": FP32_BYTES, "ms_rowwise_adagrad": FP32_BYTES, "sgd": 0}
# what a plan's storage assumes: the planners are not told the job's embedding optimizer
PLANNER_OPTIMIZER = "rowwise_adagrad"


class Storage(Frozen):
    """Memory one shard needs on its rank: fp32 weights plus its embedding optimizer's state (a plan
    assumes row-wise AdaGrad's, one fp32 per row: ``PLANNER_OPTIMIZER``)."""

    weights_bytes: int = Field(ge=0)
    optimizer_bytes: int = Field(ge=0)

    @property
    def total(self) -> int:
        return self.weights_bytes + self.optimizer_bytes

    @staticmethod
    def parts(rows, cols, optimizer: str = PLANNER_OPTIMIZER) -> tuple:
        """(weights, optimizer state) bytes of a shard or table, scalars or arrays: the one rule for a
        plan's storage, the step model's memory and weight-sync bytes, and a run's resident state."""
        return rows * cols * FP32_BYTES, rows * ROW_STATE_BYTES[optimizer]

    @classmethod
    def of(cls, rows: int, cols: int, optimizer: str = PLANNER_OPTIMIZER) -> "Storage":
        weights, state = cls.parts(rows, cols, optimizer)
        return cls(weights_bytes=weights, optimizer_bytes=state)


class Shard(Frozen):
    """One piece of one table on one (group) rank: a row range times a column range."""

    table: str
    sharding_type: ShardingType
    rank: int = Field(ge=0)
    row_offset: int = Field(default=0, ge=0)
    rows: int = Field(gt=0)
    col_offset: int = Field(default=0, ge=0)
    cols: int = Field(gt=0)

    def storage(self) -> Storage:
        return Storage.of(self.rows, self.cols)


class ShardSpec(Frozen):
    """A shard before placement (TorchRec's ``Shard`` without a rank): row and column ranges."""

    row_offset: int = 0
    rows: int
    col_offset: int = 0
    cols: int


class ShardingOption(Frozen):
    """One way to shard one table: its type and the unplaced pieces (placement adds ranks)."""

    table: str
    sharding_type: ShardingType
    shards: list[ShardSpec]


class RankCost(Frozen):
    """Cost of one rank per training step, in ms. ``total_ms = compute_ms + comm_ms + sync_ms``."""

    rank: int
    compute_ms: float = Field(description="embedding forward + backward (with fused optimizer update)")
    comm_ms: float = Field(description="forward (ids + pooled embeddings) and backward (gradients) all-to-all")
    sync_ms: float = Field(default=0.0, description="data-parallel all-reduce and 2D cross-group sync")
    total_ms: float
    memory_bytes: int = Field(ge=0)
    fwd_compute_ms: float | None = Field(default=None, description="forward share of compute_ms (when the estimator splits it)")
    bwd_compute_ms: float | None = Field(default=None, description="backward + optimizer share of compute_ms")
    input_bytes: float | None = Field(default=None, description="ids the rank receives per step (input all-to-all)")
    output_bytes: float | None = Field(default=None, description="pooled embeddings the rank sends per step (forward)")


class PlanCost(Frozen):
    """Per-rank breakdown; the plan's cost is the slowest rank."""

    source: Literal["measured", "modelled"]
    per_rank: list[RankCost]
    max_ms: float
    mean_ms: float
    lower_bound_ms: float | None = Field(default=None, description="max(total/W, largest indivisible shard)")
    details: dict = Field(default_factory=dict, description="how it was obtained (repeats, batch, constants)")

    @classmethod
    def from_ranks(cls, source: str, per_rank: list[RankCost], **kw) -> "PlanCost":
        totals = [r.total_ms for r in per_rank] or [0.0]
        return cls(source=source, per_rank=per_rank, max_ms=max(totals), mean_ms=sum(totals) / len(totals), **kw)


class ReplicaSync(Frozen):
    """How the replicas of a 2D plan's groups are kept in step (the config's ``sharding.sync`` /
    ``sync_interval``), as the planner prices it: ``gradients``, a per-step exchange of the rows a group's
    batch touched; ``weights``, the whole shard (weights and row-wise optimizer state) averaged every
    ``interval`` steps, TorchRec's ``DMPCollection.sync()``. The default is the runners' and the step
    model's when a config is silent."""

    mode: Literal["gradients", "weights"] = "weights"
    interval: int = Field(default=100, ge=1, le=1_000_000, description="steps between syncs (weights only)")

    @model_validator(mode="before")
    @classmethod
    def _gradients_every_step(cls, data):
        # a per-step exchange has no interval: one value per meaning, so equal syncs compare equal
        if isinstance(data, dict) and data.get("mode") == "gradients":
            return {**data, "interval": 1}
        return data

    @classmethod
    def of(cls, sync: str | None, interval: int | None) -> "ReplicaSync":
        """The sync a config's ``sharding.sync`` / ``sync_interval`` ask for, defaults where silent."""
        return cls(mode=sync or cls().mode, interval=interval or cls().interval)  # gradients: 1, by the validator


class Plan(Frozen):
    version: Literal[1] = PLAN_VERSION
    planner: str = Field(description="which planner produced it")
    target: Literal["any", "torchrec"] = Field(
        default="any", description="torchrec: only shapes TorchRec executes as planned (sharding.torchrec_adapter)")
    world_size: int = Field(ge=1, le=MAX_WORLD_SIZE)
    group_size: int = Field(ge=1, le=MAX_WORLD_SIZE, description="ranks per model-parallel group (== world_size unless 2D)")
    batch_size: int = Field(ge=1, le=MAX_BATCH_SIZE, description="examples per rank per step")
    topology: Topology
    tables: list[Table] = Field(min_length=1)
    shards: list[Shard]
    predicted: PlanCost | None = None
    measured: PlanCost | None = None
    planning_time_s: float = 0.0
    notes: str = ""
    kernels: dict[str, KernelChoice] = Field(default_factory=dict, description=(
        "per table, its TorchRec compute kernel when not the default (fused; dense for data-parallel): "
        "fused_uvm_caching with its cache load factor, or fused_uvm (sharding.kernels)"))
    sync: ReplicaSync | None = Field(default=None, description=(
        "2D plans: the replica sync the planner priced (a job that syncs otherwise runs a plan priced for "
        "another cost); None for a plan of one group, or a plan that predates the field (read as the default)"))
    comm: dict | None = Field(default=None, description=(
        "the communication model the planner priced the plan with and where it came from "
        "(cost_models.comm.CommModel.describe(): kind calibrated|bandwidth, file, machine, this_machine, constants)"))

    @model_validator(mode="after")
    def _covers_every_table(self) -> "Plan":
        validate_shards(self.tables, self.shards, self.group_size, self.world_size)
        names = {t.name for t in self.tables}
        dp = {s.table for s in self.shards if s.sharding_type == "data_parallel"}
        for n, k in self.kernels.items():
            if n not in names:
                raise ValueError(f"kernel of unknown table {n!r}")
            if (k.compute_kernel == "dense") != (n in dp):
                raise ValueError(f"table {n!r}: compute kernel {k.compute_kernel} does not fit its sharding type "
                                 "(dense is for data-parallel tables only, and they need it)")
        return self

    def table(self, name: str) -> Table:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def rank_shards(self) -> list[list[Shard]]:
        out: list[list[Shard]] = [[] for _ in range(self.group_size)]
        for s in self.shards:
            out[s.rank].append(s)
        return out

    def memory_per_rank(self) -> list[int]:
        return [sum(s.storage().total for s in ss) for ss in self.rank_shards()]

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(self.to_json() + "\n")
        return p


def validate_shards(tables: list[Table], shards: list[Shard], group_size: int, world_size: int) -> None:
    """Every table covered exactly once by its shards (DP: once per rank); ranks in range; one type per table."""
    check_group_size(group_size, world_size, field="group_size")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"duplicated table name {dup!r}")
    by_table: dict[str, list[Shard]] = {n: [] for n in names}
    for s in shards:
        if s.table not in by_table:
            raise ValueError(f"shard of unknown table {s.table!r}")
        if s.rank >= group_size:
            raise ValueError(f"shard of {s.table!r} on rank {s.rank} >= group_size {group_size}")
        by_table[s.table].append(s)
    for t in tables:
        ss = by_table[t.name]
        if not ss:
            raise ValueError(f"table {t.name!r} has no shard")
        kinds = {s.sharding_type for s in ss}
        if len(kinds) != 1:
            raise ValueError(f"table {t.name!r} mixes sharding types {sorted(kinds)}")
        kind = kinds.pop()
        if kind == "data_parallel":
            if sorted(s.rank for s in ss) != list(range(group_size)) or any(
                (s.rows, s.cols, s.row_offset, s.col_offset) != (t.rows, t.dim, 0, 0) for s in ss
            ):
                raise ValueError(f"data-parallel table {t.name!r} needs one full replica per rank")
            continue
        area = 0
        for s in ss:
            if s.row_offset + s.rows > t.rows or s.col_offset + s.cols > t.dim:
                raise ValueError(f"shard of {t.name!r} exceeds the table ({t.rows}x{t.dim})")
            area += s.rows * s.cols
        # disjoint and covering: pieces are a grid of row ranges x column ranges
        cells = {(s.row_offset, s.col_offset) for s in ss}
        if area != t.rows * t.dim or len(cells) != len(ss):
            raise ValueError(f"shards of {t.name!r} do not cover it exactly once")


def load_plan(path: str | Path) -> Plan:
    return parse_model(Plan, read_structured(path), source=str(path))


def plan_from_dict(data: dict, source: str = "plan") -> Plan:
    return parse_model(Plan, data, source=source)


SHARDING_TYPE_NAMES = {"table_wise": "table-wise", "row_wise": "row-wise", "column_wise": "column-wise",
                       "table_row_wise": "table-row-wise", "data_parallel": "data-parallel"}
SHARDING_TYPE_HELP = {
    "table-wise": "the whole table on one rank",
    "row-wise": "rows split across ranks (ids routed to each row range's owner)",
    "column-wise": "columns split across ranks (each piece pools every id for its columns)",
    "table-row-wise": "rows split across the ranks of one node",
    "data-parallel": "a full replica on every rank; gradients all-reduced each step",
}


def _rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5" (every rank named, none elided)."""
    out: list[str] = []
    for r in sorted(set(ranks)):
        if out and out[-1][1] == r - 1:
            out[-1] = (out[-1][0], r)
        else:
            out.append((r, r))  # type: ignore[arg-type]
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)  # type: ignore[misc]


def _pieces(t: Table, ss: list["Shard"]) -> str:
    kind = ss[0].sharding_type
    if kind == "table_wise":
        return "whole table"
    if kind == "data_parallel":
        return "a full replica on each rank"
    out = []
    for s in sorted(ss, key=lambda s: (s.row_offset, s.col_offset, s.rank)):
        rows = "" if s.rows == t.rows else f"rows {s.row_offset}-{s.row_offset + s.rows - 1}"
        cols = "" if s.cols == t.dim else f"cols {s.col_offset}-{s.col_offset + s.cols - 1}"
        out.append(f"r{s.rank}: " + " ".join(x for x in (rows, cols) if x))
    return "; ".join(out)


def _aligned(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """Columns padded to their widest cell, the last one left unpadded (never cut)."""
    cells = [header, *rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join((c.rjust(w[i]) if i in right else c.ljust(w[i])) if i < len(r) - 1 else c
                      for i, c in enumerate(r)).rstrip() for r in cells]


def _collapsed(rows: list[list[str]]) -> list[list[str]]:
    """Consecutive ranks whose figures are all the same as one row, "a-b" in the rank column: a plan
    on 100,000 ranks printed 99,992 rows of idle ranks."""
    out: list[list[str]] = []
    first = ""
    for row in rows:
        if out and out[-1][1:] == row[1:]:
            out[-1] = [f"{first}-{row[0]}", *row[1:]]
        else:
            first = row[0]
            out.append(list(row))
    return out


def format_plan(plan: Plan, cost: PlanCost | None = None) -> str:
    """The plan as TorchRec's planner stats show one: per rank, compute, communication and memory by
    kind; per table, its sharding type spelled out, its ranks and pieces; and a legend saying what
    each column is and whether it is measured or modelled, for which device. Plain text: no column
    or list is ever cut, whatever the terminal's width."""
    cost = cost or plan.measured or plan.predicted
    device = plan.topology.device
    gpu = device not in ("cpu", "")
    mem_kind = "HBM" if gpu else "DRAM"
    by_rank = plan.rank_shards()
    cap = plan.topology.memory_per_rank_gb
    replicas = plan.world_size // plan.group_size
    lines = [
        f"plan by {plan.planner} (target {plan.target}): {len(plan.tables)} tables on {plan.group_size} ranks"
        + (f" (x{replicas} replicas, 2D: cluster rank r holds group rank r % {plan.group_size})" if replicas > 1 else "")
        + f", batch {plan.batch_size}/rank, device {device}, {_nodes(plan)}"
        + ("; lookup {0}, communication {1}".format(*cost_labels(plan, cost)) if cost else "; no cost"),
        "",
        "per rank (one training step):",
    ]
    rc = {r.rank: r for r in cost.per_rank} if cost else {}
    comp_l, comm_l = cost_labels(plan, cost)
    split = bool(cost and any(r.fwd_compute_ms is not None for r in cost.per_rank))
    vols = bool(cost and any(r.input_bytes is not None for r in cost.per_rank))
    # tiers (--hbm-gb) keep some tables in host memory: weights + optimizer is HBM + host, HBM a column of its own
    tiered = bool(plan.kernels)
    total_col = "HBM+host GiB" if tiered else f"{mem_kind} GiB"
    header = (["rank", "shards", "tables", "weights GiB", "optimizer GiB", total_col, f"of {cap * 1e9 / GIB:.3g} GiB"]
              + (["HBM GiB"] if tiered else []) + [f"lookup ms ({comp_l})"] + (["fwd/bwd ms"] if split else [])
              + (["input KiB", "output KiB"] if vols else [])
              + [f"all-to-all ms ({comm_l})", f"sync ms ({comm_l})", "total ms"])
    rows = []
    for r, ss in enumerate(by_rank):
        st = [s.storage() for s in ss]
        wb, ob = sum(x.weights_bytes for x in st), sum(x.optimizer_bytes for x in st)
        in_hbm = [f"{_hbm_bytes(plan, ss) / GIB:.4f}"] if tiered else []
        c = rc.get(r)
        times = [f"{c.compute_ms:.3f}"] if c else ["-"]
        if split:
            times.append(f"{c.fwd_compute_ms:.3f}/{c.bwd_compute_ms:.3f}" if c and c.fwd_compute_ms is not None else "-")
        if vols:
            times += [f"{c.input_bytes / 1024:.1f}", f"{c.output_bytes / 1024:.1f}"] if c else ["-", "-"]
        times += [f"{c.comm_ms:.3f}", f"{c.sync_ms:.3f}", f"{c.total_ms:.3f}"] if c else ["-"] * 3
        rows.append([str(r), str(len(ss)), str(len({s.table for s in ss})), f"{wb / GIB:.4f}", f"{ob / GIB:.4f}",
                     f"{(wb + ob) / GIB:.4f}", f"{(wb + ob) / 1e9 / cap:.1%}", *in_hbm, *times])
    lines += _aligned(header, _collapsed(rows), right=set(range(len(header))))
    if cost:
        slow = max(cost.per_rank, key=lambda x: x.total_ms).rank if cost.per_rank else 0
        lb = (f"; lower bound {cost.lower_bound_ms:.3f} ms ({cost.details.get('lower_bound', 'same models')})"
              if cost.lower_bound_ms else "")
        lines.append(f"plan cost (the slowest rank, {slow}): {cost.max_ms:.3f} ms per step; mean {cost.mean_ms:.3f} ms{lb}")
        lines.append("imbalance (max / mean over ranks, as TorchRec's planner stats): " + ", ".join(
            f"{k} {_imbalance(v):.3f}" for k, v in (("total", [r.total_ms for r in cost.per_rank]),
                                                    ("lookup", [r.compute_ms for r in cost.per_rank]),
                                                    ("memory", plan.memory_per_rank()))))
    lines += ["", "per table:"]
    shards: dict[str, list[Shard]] = {}
    for s in plan.shards:
        shards.setdefault(s.table, []).append(s)
    header = ["table", "rows", "dim", "pooling", "sharding type", "compute kernel", "ranks",
              "pieces (rank: rows/cols it holds)"]
    rows = [[t.name, str(t.rows), str(t.dim), f"{t.pooling_factor:g}", SHARDING_TYPE_NAMES[shards[t.name][0].sharding_type],
             compute_kernel(plan, t.name), _rank_ranges([s.rank for s in shards[t.name]]), _pieces(t, shards[t.name])]
            for t in plan.tables]
    lines += _aligned(header, rows, right={1, 2, 3})
    lines += ["", "legend:"] + _legend(plan, cost, mem_kind, gpu)
    return "\n".join(lines)


def _hbm_bytes(plan: Plan, shards: list[Shard]) -> float:
    """HBM a rank's shards take under their tables' compute kernels (sharding.kernels.hbm_bytes)."""
    fused = KernelChoice()
    return sum(hbm_bytes(st.weights_bytes, st.optimizer_bytes, plan.kernels.get(s.table, fused))
               for s in shards for st in (s.storage(),))


def cost_labels(plan: Plan, cost: PlanCost | None) -> tuple[str, str]:
    """(lookup, communication) provenance for column headers: measured or modelled, and for which
    device. Communication is modelled for every plan (never measured per plan)."""
    if cost is None:
        return "no cost", "no cost"
    dev = cost.details.get("device") or plan.topology.device
    where = "this cpu" if cost.source == "measured" and dev == "cpu" else dev
    return f"{cost.source}, {where}", f"modelled, {dev}"


def compute_kernel(plan: Plan, table: str) -> str:
    """TorchRec's compute kernel for a table of the plan: ``dense`` for data-parallel tables, else
    ``fused`` (FBGEMM's table-batched embedding with the fused optimizer, weights in HBM/DRAM)."""
    if table in plan.kernels:
        k = plan.kernels[table]
        return k.compute_kernel + (f" (load factor {k.cache_load_factor:g}, hit {k.hit_rate:.0%})"
                                   if k.cache_load_factor is not None and k.hit_rate is not None else "")
    kinds = {s.sharding_type for s in plan.shards if s.table == table}
    return "dense" if kinds == {"data_parallel"} else "fused"


def _imbalance(values) -> float:
    v = [float(x) for x in values]
    mean = sum(v) / len(v) if v else 0.0
    return max(v) / mean if mean > 0 else 1.0


def _nodes(plan: Plan) -> str:
    """The node layout the all-to-all is priced on (it moves the figure ~2x: a workload's default of one
    rank per node makes every peer a network hop)."""
    per = min(plan.topology.ranks_per_node, plan.group_size)
    nodes = -(-plan.group_size // per)
    return f"{nodes} node{'s' if nodes > 1 else ''} x {per} rank{'s' if per > 1 else ''} (--ranks-per-node)"


def comm_line(comm: dict | str | None) -> str:
    """One line naming a recorded communication model (Plan.comm / PlanCost.details["comm"]); a
    calibration from another machine is named so."""
    if not isinstance(comm, dict):
        return f"alpha-beta model ({comm or 'unrecorded'})"
    if comm.get("kind") == "calibrated":
        mape = comm.get("fit_mape")
        fitted = ", ".join(k.replace("_", "-") + "s"
                           for k in (comm.get("collectives_fitted") or "all_to_all").split(", "))
        line = (f"alpha-beta model fitted to gloo {fitted} measured on {comm.get('machine')} ({comm.get('cores')} "
                f"cores, {comm.get('measured_at')}" + (f", fit error {mape:.0%}" if isinstance(mape, (int, float)) else "")
                + (f"; fit of {comm['fit']}" if comm.get("fit") else "") + f"; {comm.get('file')})")
        if not comm.get("this_machine"):
            line = (f"FROM ANOTHER MACHINE: {line}: {comm.get('foreign_reason')}; `cubic shard calibrate-comm` "
                    "measures this one")
        from cost_models.comm import LINK_CHECKED

        return line + (f"; inter-node {comm['inter_node']}" if comm.get("inter_node") else "") + f"; {LINK_CHECKED}"
    if comm.get("kind") == "bandwidth":
        return (f"bandwidth model: {comm['intra_node_bw_gbps']:g} GB/s + {comm['intra_node_latency_us']:g} us per "
                f"all-to-all inside a node, {comm['inter_node_bw_gbps']:g} GB/s + {comm['inter_node_latency_us']:g} us "
                f"between nodes ({comm.get('ranks_per_node')} ranks per node; latencies from {comm.get('latencies_from')})")
    return f"alpha-beta model ({comm.get('kind', 'unrecorded')})"


def _sync_legend(plan: Plan) -> str:
    """How a 2D plan's replica sync is priced, and, for a gradient sync, what that price was held to."""
    if plan.group_size >= plan.world_size:
        return ""
    sync = plan.sync or ReplicaSync()
    if sync.mode == "weights":
        return (f" (this plan: each shard's weights and row-wise state all-reduced over the replicas every "
                f"{sync.interval} steps, amortized per step)")
    from cost_models.comm import GRADIENT_SYNC_CHECKED

    return (" (this plan: every step the touched row ids all-gathered over the replicas and the union's "
            f"gradients all-reduced; {GRADIENT_SYNC_CHECKED})")


def _legend(plan: Plan, cost: PlanCost | None, mem_kind: str, gpu: bool) -> list[str]:
    device = plan.topology.device
    d = cost.details if cost else {}
    if cost is None:
        compute_src = comm_src = "no cost attached to this plan"
    else:
        compute_src = d.get("compute") or (f"{cost.source} for {device}")
        if cost.source == "measured" and "measured" not in compute_src:
            compute_src = f"measured: {compute_src}"
        comm_src = f"MODELLED for every plan, never measured per plan: {comm_line(d.get('comm') or plan.comm)}"
    kernel_batch = plan.group_size * plan.batch_size
    tiered = bool(plan.kernels)
    total = "HBM+host GiB" if tiered else f"{mem_kind} GiB"
    out = [
        f"  rank: a rank of one model-parallel group of {plan.group_size} "
        "(a-b: ranks a to b, each with the row's figures)"
        + (f"; the plan is replicated {plan.world_size // plan.group_size}x (2D)" if plan.group_size < plan.world_size else ""),
        "  shards: pieces on the rank; tables: distinct tables they come from",
        f"  weights GiB: fp32 embedding rows x cols x 4 bytes; optimizer GiB: row-wise Adagrad state, 4 bytes per row "
        f"(GiB = 2^30 bytes); {total} = weights + optimizer, computed from the shard shapes (exact for the "
        "tables; dense model, activations and buffers not included)",
        f"  of {plan.topology.memory_per_rank_gb * 1e9 / GIB:.3g} GiB: {total} as a share of the memory per rank "
        f"(`--memory-gb` {plan.topology.memory_per_rank_gb:g}, decimal GB: the plan's topology.memory_per_rank_gb"
        + ("; HBM + host with --hbm-gb)" if tiered else ")"),
        *(["  HBM GiB: the part of weights + optimizer kept in HBM under each table's compute kernel (fused: all; "
           "fused_uvm_caching: its load-factor share; fused_uvm: none); the rest is in host memory"] if tiered else []),
        f"  lookup ms (compute): embedding forward + backward with the fused optimizer update, the rank's sharded pieces as one "
        f"kernel at the group's batch ({kernel_batch} examples: the ids arrive by all-to-all), plus data-parallel "
        f"tables at the rank's own batch; {compute_src}",
        f"  all-to-all ms (communication): forward (ids out, pooled embeddings back) and backward (gradients) all-to-all; {comm_src}",
        "  sync ms (communication): data-parallel gradient all-reduce and 2D cross-group sync; the same model as "
        "the all-to-all" + _sync_legend(plan),
        "  total ms = lookup + all-to-all + sync; the plan's cost is the slowest rank's total",
        "  fwd/bwd ms: the lookup's forward and backward (+ fused optimizer) parts (measured estimators only); "
        "input KiB: ids the rank receives per step; output KiB: pooled embeddings it sends per step (forward; the "
        "backward sends as many gradient bytes back)",
        "  compute kernel: TorchRec's (fused: FBGEMM table-batched embedding, fused optimizer, weights in "
        f"{mem_kind}; fused_uvm_caching: weights in host memory, the hottest load-factor share of rows cached in "
        "HBM, hit rate MODELLED from the table's Zipf access (never checked on a GPU: the lent H100's check could "
        "not import fbgemm_gpu, results/gpu_checks.json); fused_uvm: weights in host memory; dense: a "
        "data-parallel table's torch embedding); on a modelled GPU the misses' PCIe time is added to lookup ms "
        "(MODELLED, sharding.kernels)",
        "  imbalance: max / mean over ranks (1.000 = perfectly balanced)",
        "  lower bound: max(all tables' cost / ranks, the largest indivisible piece) + a balanced all-to-all; a "
        "function of the tables and the topology only (the modelled estimator for the device, not this plan's "
        "measurements); approximate, not a proof",
        "  pooling: mean ids per example (pooling factor); pieces: rows/cols ranges, inclusive, each piece's rank",
        "  sharding types:",
        *(f"    {k}: {v}" for k, v in SHARDING_TYPE_HELP.items()),
    ]
    return out


__all__ = [
    "PLAN_VERSION", "SHARDING_TYPES", "COLUMN_MULTIPLE", "Storage", "Shard", "ShardSpec", "ShardingOption",
    "RankCost", "PlanCost", "Plan", "PlanDoesNotFit", "validate_shards", "load_plan", "plan_from_dict", "format_plan", "SpecError",
    "SHARDING_TYPE_NAMES",
]
