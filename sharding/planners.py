"""Planners: ``Planner.plan(tables, topology, batch_size) -> Plan``.

Stages as in TorchRec's planner: enumerate (sharding.enumerate) -> estimate (sharding.estimate,
the learned model + comm model) -> propose/search -> partition (placement on ranks under memory).

- Baselines, table-wise only, as defined in DreamShard/NeuroShard/AutoShard's code (greedy: tables
  sorted by a cost key, largest first, each onto the rank with the lowest running sum of that key
  among ranks with memory left): ``dim_greedy`` (key = dim), ``lookup_greedy`` (dim x pooling),
  ``size_greedy`` (rows x dim), ``size_lookup_greedy`` (dim x pooling x log10(rows)), ``random``.
  Tables too big for one rank are first cut row-wise into the fewest pieces that fit (the same
  pre-split for every planner), since a table-wise-only baseline could not place them at all.
- ``cubic``: NeuroShard-style search on the learned cost model: greedy grid search for placement
  (each piece, costliest first, onto the rank that minimises the predicted plan cost = max over
  ranks of compute + comm + sync), beam search over column-wise / row-wise / data-parallel splits
  of the pieces on the bottleneck rank, then local search (every free piece of the bottleneck rank
  moved or swapped, scored in one batch) from the best plan, the beam and the heuristics'
  placements, then iterated local search (random kicks); all under the memory limit, with a time
  budget.
- ``torchrec``: TorchRec's EmbeddingShardingPlanner (sharding.torchrec_adapter), when installed.

2D sparse parallelism: with ``group_size`` G < world size W every planner plans one group of G
ranks (each holding the per-rank batch), replicated W/G times; the estimate adds each piece's
cross-group exchange of touched rows (cost_models.comm).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from cubic.core.spec import SpecError, Table, Topology, check_group_size
from cubic.core.units import fmt_gib
from cost_models.comm import FP32, ID_BYTES, CommModel, SyncLine, dp_sync_ms, piece_sync_bytes, sync_bytes
from sharding.enumerate import check_inputs, column_pieces, min_row_pieces, row_pieces, torchrec_row_blocks
from sharding.estimate import Estimator, LearnedEstimator, plan_cost, rank_features_from_sums, shard_vector
from sharding.types import (PLANNERS, Plan, PlanDoesNotFit, ReplicaSync, Shard,  # noqa: F401  (PLANNERS: re-exported)
                            Storage)


@dataclass
class Unit:
    """One piece to place: a row x column block of a table, with its features."""

    table: Table
    kind: str
    row_offset: int
    rows: int
    col_offset: int
    cols: int
    vec: np.ndarray
    ids: float
    mem: int
    sync_ms: float = 0.0
    standalone: float = 0.0
    fixed: int | None = None  # rank the piece must go to (TorchRec's row-wise: block i on rank i)


@dataclass
class Context:
    tables: list[Table]
    topology: Topology
    batch: int
    group: int
    world: int
    memory_bytes: float
    comm: CommModel
    estimator: Estimator | None = None
    target: str = "any"
    sync: ReplicaSync = ReplicaSync()  # how the replicas of a 2D plan are kept in step, as priced
    _vec_cache: dict = field(default_factory=dict)

    @property
    def local(self) -> int:
        """Ranks per node within the group (TorchRec's local_size for table-row-wise)."""
        return min(self.topology.ranks_per_node, self.group)

    @property
    def replicas(self) -> int:
        return self.world // self.group

    @property
    def sync_line(self) -> SyncLine:
        """A rank's 2D replica sync as a sum over its pieces (cost_models.comm.SyncLine), drawn through
        the bucket of an even share of the group's bytes (every table whole)."""
        if "sync_line" not in self._vec_cache:
            mode, G, R = self.sync.mode, self.group, self.replicas
            share = [0.0] * len(sync_bytes(mode))
            if R > 1:
                for t in self.tables:
                    piece = piece_sync_bytes(t, t.rows, t.dim, G, self.batch, R, mode=mode,
                                             shard_bytes=Storage.of(t.rows, t.dim).total)
                    share = [a + b / G for a, b in zip(share, piece)]
            self._vec_cache["sync_line"] = SyncLine.at(R, G, self.comm, mode=mode, interval=self.sync.interval,
                                                       bucket=tuple(share))
        return self._vec_cache["sync_line"]

    @property
    def nodes(self) -> int:
        return self.group // self.local if self.group % self.local == 0 else 1

    def unit(self, t: Table, kind: str, ro: int, rows: int, co: int, cols: int, fixed: int | None = None) -> Unit:
        # a sharded piece is pooled for the group's whole batch; a data-parallel one for the rank's
        batch = self.batch if kind == "data_parallel" else self.group * self.batch
        key = (t.name, ro, rows, cols, batch)
        if key not in self._vec_cache:
            self._vec_cache[key] = shard_vector(t, rows, cols, batch)
        storage = Storage.of(rows, cols).total
        skey = ("sync", t.name, rows, cols)
        # what a piece adds to its rank's 2D sync (a Zipf sum): once per piece shape; one group syncs nothing
        if self.replicas > 1 and skey not in self._vec_cache:
            self._vec_cache[skey] = self.sync_line.piece_ms(piece_sync_bytes(
                t, rows, cols, self.group, self.batch, self.replicas, mode=self.sync.mode, shard_bytes=storage))
        sync = self._vec_cache.get(skey, 0.0)
        return Unit(t, kind, ro, rows, co, cols, self._vec_cache[key], t.pooling_factor * rows / t.rows,
                    storage, sync, fixed=fixed)


TARGETS = ("any", "torchrec")


def planner_context(tables, topology, batch_size, group_size, estimator, target: str = "any",
                    sync: ReplicaSync | None = None) -> Context:
    world = topology.world_size
    group = group_size or world
    check_group_size(group, world, field="group_size")
    mem = topology.memory_per_rank_bytes
    check_inputs(tables, group, mem)
    if target not in TARGETS:
        raise SpecError(f"unknown target {target!r} (known: {', '.join(TARGETS)})", field="target")
    return Context(list(tables), topology, batch_size, group, world, mem, CommModel.from_topology(topology), estimator,
                   target, sync or ReplicaSync())


def presplit(ctx: Context) -> dict[str, tuple[str, int]]:
    """Row pieces for tables that fit on no single rank (same for every planner).

    Target "any": the fewest row blocks that fit, placed freely. Target "torchrec": TorchRec's own
    shapes only: table-row-wise over one node (nodes taken in turn) when a node's ranks hold it and
    the group spans several nodes, else row-wise over every rank of the group.
    """
    out = {}
    nxt = 0
    for t in ctx.tables:
        if Storage.of(t.rows, t.dim).total <= ctx.memory_bytes:
            continue
        k = min_row_pieces(t, 0.9 * ctx.memory_bytes)
        if ctx.target != "torchrec":
            out[t.name] = ("row_wise", min(ctx.group, k))
        elif ctx.nodes > 1 and k <= ctx.local:
            out[t.name] = ("table_row_wise", nxt % ctx.nodes)
            nxt += 1
        else:
            out[t.name] = ("row_wise", ctx.group)
    return out


def build_units(ctx: Context, splits: dict[str, tuple[str, int]]) -> tuple[list[Unit], list[Unit]]:
    """(placed units, data-parallel units) for a split decision per table (default table-wise)."""
    units, dp = [], []
    for t in ctx.tables:
        kind, k = splits.get(t.name, ("table_wise", 1))
        if kind == "data_parallel":
            dp.append(ctx.unit(t, kind, 0, t.rows, 0, t.dim))
        elif kind == "column_wise":
            for o, c in column_pieces(t.dim, k):
                units.append(ctx.unit(t, kind, 0, t.rows, o, c))
        elif kind == "table_row_wise":  # k = node: TorchRec's split over that node's ranks, block i on its rank i
            for i, (o, n) in enumerate(torchrec_row_blocks(t.rows, ctx.local)):
                if n:
                    units.append(ctx.unit(t, kind, o, n, 0, t.dim, fixed=k * ctx.local + i))
        elif kind == "row_wise" and ctx.target == "torchrec":  # TorchRec's split over all ranks, pinned
            for i, (o, n) in enumerate(torchrec_row_blocks(t.rows, ctx.group)):
                if n:
                    units.append(ctx.unit(t, kind, o, n, 0, t.dim, fixed=i))
        elif kind == "row_wise":
            for o, n in row_pieces(t.rows, k):
                units.append(ctx.unit(t, kind, o, n, 0, t.dim))
        else:
            units.append(ctx.unit(t, "table_wise", 0, t.rows, 0, t.dim))
    return units, dp


def to_plan(ctx: Context, planner: str, units: list[Unit], ranks: list[int], dp: list[Unit],
            t0: float, notes: str = "") -> Plan:
    shards = [Shard(table=u.table.name, sharding_type=u.kind, rank=r, row_offset=u.row_offset, rows=u.rows,
                    col_offset=u.col_offset, cols=u.cols) for u, r in zip(units, ranks)]
    for u in dp:
        shards += [Shard(table=u.table.name, sharding_type="data_parallel", rank=r, rows=u.rows, cols=u.cols)
                   for r in range(ctx.group)]
    elapsed = time.perf_counter() - t0
    plan = Plan(planner=planner, target=ctx.target, world_size=ctx.world, group_size=ctx.group, batch_size=ctx.batch,
                topology=ctx.topology, tables=ctx.tables, shards=shards, planning_time_s=elapsed, notes=notes,
                comm=ctx.comm.describe(), sync=ctx.sync if ctx.group < ctx.world else None)
    return with_prediction(plan, ctx.estimator, ctx.comm)


def with_prediction(plan: Plan, estimator: Estimator | None, comm: CommModel | None = None) -> Plan:
    if estimator is None:
        return plan
    comm = comm or CommModel.from_topology(plan.topology)
    return plan.model_copy(update={"predicted": plan_cost(plan, estimator, comm)})


class Planner(ABC):
    name: str

    @abstractmethod
    def plan(self, tables: list[Table], topology: Topology, batch_size: int, group_size: int | None = None,
             sync: ReplicaSync | None = None) -> Plan:
        """``sync``: how a 2D plan's replicas are kept in step (default: ``ReplicaSync()``, the runners')."""


# ------------------------------------------------------------------------------------ baselines

HEURISTIC_KEYS = {
    "dim_greedy": lambda t: float(t.dim),
    "lookup_greedy": lambda t: t.dim * t.pooling_factor,
    "size_greedy": lambda t: float(t.rows * t.dim),
    "size_lookup_greedy": lambda t: t.dim * t.pooling_factor * math.log10(max(t.rows, 2)),
}


PORTFOLIO = ("random", "dim_greedy", "lookup_greedy", "size_greedy", "size_lookup_greedy")  # every heuristic


class HeuristicPlanner(Planner):
    """One of the five baselines (see the module docstring)."""

    def __init__(self, kind: str, seed: int = 0, estimator: Estimator | None = None, target: str = "any"):
        if kind not in HEURISTIC_KEYS and kind != "random":
            raise SpecError(f"unknown heuristic {kind!r} (known: random, {', '.join(HEURISTIC_KEYS)})", field="planner")
        self.name, self.seed, self.estimator, self.target = kind, seed, estimator, target

    def plan(self, tables, topology, batch_size, group_size=None, sync=None):
        t0 = time.perf_counter()
        ctx = planner_context(tables, topology, batch_size, group_size, self.estimator, self.target, sync)
        units, _ = build_units(ctx, presplit(ctx))
        return to_plan(ctx, self.name, units, self.assign(ctx, units), [], t0)

    def assign(self, ctx: Context, units: list[Unit]) -> list[int]:
        """Each unit's rank (SpecError when memory runs out)."""
        G = ctx.group
        mem = np.zeros(G)
        load = np.zeros(G)
        ranks = [-1] * len(units)
        used: dict[str, set[int]] = {}
        rng = np.random.default_rng(self.seed)
        if self.name == "random":
            order = list(range(len(units)))
        else:
            key = HEURISTIC_KEYS[self.name]
            # piece's share of its table's key: pieces of a split table carry their fraction
            keys = [key(u.table) * (u.rows * u.cols) / (u.table.rows * u.table.dim) for u in units]
            order = sorted(range(len(units)), key=lambda i: (keys[i], units[i].mem, -i), reverse=True)
        for i in order:
            u = units[i]
            if u.fixed is not None:
                cand = np.array([u.fixed]) if mem[u.fixed] + u.mem <= ctx.memory_bytes else np.zeros(0, dtype=int)
            else:
                ok = mem + u.mem <= ctx.memory_bytes
                for r in used.get(u.table.name, ()):
                    ok[r] = False
                cand = np.flatnonzero(ok)
            if not len(cand):
                raise PlanDoesNotFit(f"{self.name}: no rank has {fmt_gib(u.mem)} left for table {u.table.name!r}",
                                field=f"tables.{u.table.name}")
            if self.name == "random":
                r = int(rng.choice(cand))
            else:
                # lowest running sum, ties broken by least memory used (as in DreamShard's code)
                r = int(cand[np.lexsort((mem[cand], load[cand]))[0]])
                load[r] += keys[i]
            mem[r] += u.mem
            ranks[i] = r
            used.setdefault(u.table.name, set()).add(r)
        return ranks


# ---------------------------------------------------------------------------------- cubic search

class _Pieces(NamedTuple):
    """The units' features as arrays, one row per unit (the local search scores them in batches)."""

    V: np.ndarray
    cols: np.ndarray
    ids: np.ndarray
    sync: np.ndarray
    mem: np.ndarray
    free: np.ndarray  # not pinned to a rank
    tid: np.ndarray  # table index


class _Placement:
    """Greedy grid search of units onto ranks on the learned cost model (vectorised over ranks)."""

    def __init__(self, ctx: Context, model, units: list[Unit], dp: list[Unit]):
        self.ctx, self.model = ctx, model
        G, B, cm = ctx.group, ctx.batch, ctx.comm
        self.units, self.dp = units, dp
        self.tot_cols = sum(u.cols for u in units)
        self.tot_ids = sum(u.ids for u in units)
        # data-parallel tables: the same second kernel and one gradient bucket on every rank
        self.base_sums = np.zeros((G, 8))
        self.base_maxlb = np.zeros(G)
        dp_compute = 0.0
        if dp:
            V = np.stack([u.vec for u in dp])
            dp_compute = float(self.compute(V.sum(axis=0, keepdims=True), V[:, 2].max(keepdims=True), ctx.batch)[0])
        # ... and every rank's 2D replica sync pays its collectives' latencies once (a unit adds its bytes)
        self.base_sync = (dp_compute + dp_sync_ms(sum(u.rows * u.cols * 4 for u in dp), ctx.world, cm)
                          + ctx.sync_line.fixed_ms)
        self.base_mem = sum(u.mem for u in dp)

    def comm(self, cols: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Forward ids + pooled embeddings and backward gradients, per candidate rank (cost_models.comm)."""
        G, B, cm = self.ctx.group, self.ctx.batch, self.ctx.comm
        if G <= 1:
            return np.zeros_like(cols)
        ids_sent = B * (self.tot_ids - ids) * ID_BYTES
        ids_recv = (G - 1) * B * ids * ID_BYTES
        emb_sent = (G - 1) * B * cols * FP32
        emb_recv = B * (self.tot_cols - cols) * FP32
        return cm.all_to_all_ms(G, ids_sent, ids_recv) + 2 * cm.all_to_all_ms(G, emb_sent, emb_recv)

    def compute(self, sums: np.ndarray, maxlb: np.ndarray, batch: int | None = None) -> np.ndarray:
        batch = batch or self.ctx.group * self.ctx.batch
        return self.model.predict(rank_features_from_sums(sums, maxlb, batch))

    def standalone(self) -> np.ndarray:
        if not self.units:
            return np.zeros(0)
        V = np.stack([u.vec for u in self.units])
        return self.compute(V, V[:, 2])

    def run(self, order: list[int] | None = None) -> tuple[list[int], float, np.ndarray]:
        ctx, G = self.ctx, self.ctx.group
        sums = self.base_sums.copy()
        maxlb = self.base_maxlb.copy()
        cols = np.zeros(G)
        ids = np.zeros(G)
        sync = np.full(G, self.base_sync)
        mem = np.full(G, float(self.base_mem))
        cost = self._rank_cost(sums, maxlb, cols, ids, sync)
        ranks = [-1] * len(self.units)
        used: dict[str, list[int]] = {}
        if order is None:
            st = self.standalone()
            order = list(np.argsort(-st, kind="stable"))
        for i in order:
            u = self.units[i]
            ok = mem + u.mem <= ctx.memory_bytes
            for r in used.get(u.table.name, ()):
                ok[r] = False
            if u.fixed is not None:
                ok &= np.arange(G) == u.fixed
            if not ok.any():
                return ranks, math.inf, cost
            new_sums = sums + u.vec
            new_maxlb = np.maximum(maxlb, u.vec[2])
            new_cost = self.compute(new_sums, new_maxlb) + self.comm(cols + u.cols, ids + u.ids) + sync + u.sync_ms
            cur_max = cost.max()
            score = np.where(ok, np.maximum(new_cost, cur_max) + 1e-3 * new_cost, np.inf)
            r = int(np.argmin(score))
            sums[r], maxlb[r], cols[r], ids[r] = new_sums[r], new_maxlb[r], cols[r] + u.cols, ids[r] + u.ids
            sync[r] += u.sync_ms
            mem[r] += u.mem
            cost[r] = new_cost[r]
            ranks[i] = r
            used.setdefault(u.table.name, []).append(r)
        # comm of ranks depends on the final totals only, so costs are exact for the model here
        return ranks, float(cost.max()), cost

    def rank_costs(self, ranks: list[int]) -> np.ndarray:
        G = self.ctx.group
        sums = self.base_sums.copy()
        maxlb = self.base_maxlb.copy()
        cols, ids = np.zeros(G), np.zeros(G)
        sync = np.full(G, self.base_sync)
        for u, r in zip(self.units, ranks):
            sums[r] += u.vec
            maxlb[r] = max(maxlb[r], u.vec[2])
            cols[r] += u.cols
            ids[r] += u.ids
            sync[r] += u.sync_ms
        return self._rank_cost(sums, maxlb, cols, ids, sync)

    def _rank_cost(self, sums: np.ndarray, maxlb: np.ndarray, cols: np.ndarray, ids: np.ndarray,
                   sync: np.ndarray) -> np.ndarray:
        """Cost of each row of per-rank totals: compute (none on an empty rank) + comm + sync."""
        return self.compute(sums, maxlb) * (sums[:, 0] > 0) + self.comm(cols, ids) + sync

    def refine(self, ranks: list[int], deadline: float, max_iters: int = 400) -> tuple[list[int], float]:
        """Local search on the bottleneck rank b: move any free piece off b, or swap it with a piece of
        another rank, taking the best candidate (lowest plan max, then lowest cost of the two ranks
        touched) while it lowers b's cost below the old max: on a plateau of tied ranks this still
        makes progress (the multiset of rank costs falls lexicographically, so it terminates).
        Every candidate is scored in one batch: a move or swap changes only the two ranks' sums."""
        G = self.ctx.group
        n = len(self.units)
        if n == 0 or G <= 1:
            return list(ranks), float(self.rank_costs(ranks).max()) if n else 0.0
        ranks = np.array(ranks, dtype=int)
        pc = self._piece_arrays()
        # pieces may be placed only where no other piece of their table is: table x rank counts
        tcount = np.zeros((pc.tid.max() + 1, G), dtype=int)
        np.add.at(tcount, (pc.tid, ranks), 1)
        for _ in range(max_iters):
            if time.perf_counter() > deadline:
                break
            step = self._refine_step(ranks, pc, tcount)
            if step is None:
                break
            b, i, r, j = step
            tcount[pc.tid[i], b] -= 1
            tcount[pc.tid[i], r] += 1
            ranks[i] = r
            if j >= 0:
                tcount[pc.tid[j], r] -= 1
                tcount[pc.tid[j], b] += 1
                ranks[j] = b
        ranks = [int(r) for r in ranks]
        return ranks, float(self.rank_costs(ranks).max())

    def _piece_arrays(self) -> _Pieces:
        units = self.units
        return _Pieces(V=np.stack([u.vec for u in units]),
                       cols=np.array([u.cols for u in units], dtype=float),
                       ids=np.array([u.ids for u in units], dtype=float),
                       sync=np.array([u.sync_ms for u in units]),
                       mem=np.array([u.mem for u in units], dtype=float),
                       free=np.array([u.fixed is None for u in units]),
                       tid=np.unique([u.table.name for u in units], return_inverse=True)[1])

    def _rank_totals(self, ranks: np.ndarray, pc: _Pieces) -> tuple[np.ndarray, ...]:
        """Per-rank (sums, maxlb, cols, ids, sync, mem) of the placement ``ranks``."""
        G = self.ctx.group
        sums = self.base_sums.copy()
        np.add.at(sums, ranks, pc.V)
        maxlb = self.base_maxlb.copy()
        np.maximum.at(maxlb, ranks, pc.V[:, 2])
        cols = np.bincount(ranks, pc.cols, G)
        ids = np.bincount(ranks, pc.ids, G)
        sync = self.base_sync + np.bincount(ranks, pc.sync, G)
        mem = self.base_mem + np.bincount(ranks, pc.mem, G)
        return sums, maxlb, cols, ids, sync, mem

    def _maxlb_without(self, ranks: np.ndarray, V: np.ndarray, r: int, drop: np.ndarray) -> np.ndarray:
        """Largest lookup_bytes on rank r once each piece in ``drop`` (pieces of r) leaves it."""
        on = np.flatnonzero(ranks == r)
        lb = V[on, 2]
        order = np.argsort(-lb)
        top1 = lb[order[0]]
        top2 = lb[order[1]] if len(on) > 1 else 0.0
        out = np.where(drop == on[order[0]], top2, top1)
        return np.maximum(out, self.base_maxlb[r])

    def _refine_step(self, ranks: np.ndarray, pc: _Pieces, tcount: np.ndarray) -> tuple[int, int, int, int] | None:
        """The best candidate off the bottleneck rank b as (b, i, r, j): piece i of b goes to rank r,
        and piece j of r (unless j = -1, a plain move) comes to b; None when none lowers b's cost."""
        sums, maxlb, cols, ids, sync, mem = self._rank_totals(ranks, pc)
        cost = self._rank_cost(sums, maxlb, cols, ids, sync)
        b = int(np.argmax(cost))
        cand = self._refine_candidates(ranks, pc, tcount, mem, b)
        if cand is None:
            return None
        I, R, J = cand
        new_max, pair = self._refine_scores(ranks, pc, (sums, maxlb, cols, ids, sync), cost, b, I, R, J)
        good = pair < cost[b] - 1e-6
        if not good.any():
            return None
        k = np.flatnonzero(good)[np.lexsort((pair[good], new_max[good]))[0]]
        return b, int(I[k]), int(R[k]), int(J[k])

    def _refine_candidates(self, ranks: np.ndarray, pc: _Pieces, tcount: np.ndarray, mem: np.ndarray,
                           b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The legal candidates (i on b, target rank r, j on r or -1 for a move) as arrays I, R, J;
        None when b has no free piece or no candidate is legal."""
        ctx, G = self.ctx, self.ctx.group
        tid, umem = pc.tid, pc.mem
        on_b = np.flatnonzero((ranks == b) & pc.free)
        if not len(on_b):
            return None
        others = np.flatnonzero((ranks != b) & pc.free)
        I_m = np.repeat(on_b, G)
        R_m = np.tile(np.arange(G), len(on_b))
        ok_m = (R_m != b) & (tcount[tid[I_m], R_m] == 0) & (mem[R_m] + umem[I_m] <= ctx.memory_bytes)
        I, R, J = I_m[ok_m], R_m[ok_m], np.full(ok_m.sum(), -1)
        if G <= 16 or len(on_b) * len(others) <= 20000:
            I_s = np.repeat(on_b, len(others))
            J_s = np.tile(others, len(on_b))
            R_s = ranks[J_s]
            same = tid[I_s] == tid[J_s]
            ok_s = (~same & (tcount[tid[I_s], R_s] == 0) & (tcount[tid[J_s], b] == 0)
                    & (mem[R_s] - umem[J_s] + umem[I_s] <= ctx.memory_bytes)
                    & (mem[b] - umem[I_s] + umem[J_s] <= ctx.memory_bytes))
            I, R, J = np.concatenate([I, I_s[ok_s]]), np.concatenate([R, R_s[ok_s]]), np.concatenate([J, J_s[ok_s]])
        if not len(I):
            return None
        return I, R, J

    def _refine_scores(self, ranks: np.ndarray, pc: _Pieces, totals: tuple[np.ndarray, ...], cost: np.ndarray,
                       b: int, I: np.ndarray, R: np.ndarray, J: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each candidate's new plan max and the larger new cost of the two ranks it touches."""
        G = self.ctx.group
        sums, maxlb, cols, ids, sync = totals
        V, ucols, uids, usync = pc.V, pc.cols, pc.ids, pc.sync
        sw = J >= 0
        Jc = np.where(sw, J, 0)
        vj = np.where(sw[:, None], V[Jc], 0.0)
        cj = np.where(sw, ucols[Jc], 0.0)
        ij = np.where(sw, uids[Jc], 0.0)
        sj = np.where(sw, usync[Jc], 0.0)
        # new bottleneck rank b'
        mb = self._maxlb_without(ranks, V, b, I)
        mb = np.maximum(mb, np.where(sw, vj[:, 2], 0.0))
        cb = self._rank_cost(sums[b] - V[I] + vj, mb, cols[b] - ucols[I] + cj, ids[b] - uids[I] + ij,
                             sync[b] - usync[I] + sj)
        # new target rank r': loses j (a swap) and gains i
        mr = maxlb[R].copy()
        for r in np.unique(R[sw]):
            k = sw & (R == r)
            mr[k] = self._maxlb_without(ranks, V, int(r), J[k])
        mr = np.maximum(mr, V[I, 2])
        cr = self._rank_cost(sums[R] - vj + V[I], mr, cols[R] - cj + ucols[I], ids[R] - ij + uids[I],
                             sync[R] - sj + usync[I])
        # plan max over the untouched ranks: the largest cost outside {b, r}
        top = np.argsort(-cost)[:3]
        rest = np.where(R == top[1], cost[top[2]] if G > 2 else 0.0, cost[top[1]])
        new_max = np.maximum(np.maximum(cb, cr), rest)
        return new_max, np.maximum(cb, cr)

    def kick(self, ranks: list[int], rng: np.random.Generator, n: int = 2) -> list[int]:
        """``n`` random legal moves of free pieces (memory, one piece of a table per rank): the
        perturbation of the iterated local search."""
        ctx, G = self.ctx, self.ctx.group
        ranks = list(ranks)
        mem = np.full(G, float(self.base_mem))
        for u, r in zip(self.units, ranks):
            mem[r] += u.mem
        free = [i for i, u in enumerate(self.units) if u.fixed is None]
        for _ in range(n):
            if not free:
                break
            i = free[int(rng.integers(len(free)))]
            u = self.units[i]
            taken = {ranks[j] for j, v in enumerate(self.units) if v.table.name == u.table.name}
            cand = [r for r in range(G) if r not in taken and mem[r] + u.mem <= ctx.memory_bytes]
            if cand:
                r = cand[int(rng.integers(len(cand)))]
                mem[ranks[i]] -= u.mem
                mem[r] += u.mem
                ranks[i] = r
        return ranks


def budget_note(seconds: float) -> str:
    """What a plan whose search ran into its time budget says (its notes, the CLI's warning)."""
    return (f"the search reached its time budget ({seconds:g} s): a slower or busier machine may return "
            "another plan (--time-budget 0 plans without one, reproducibly)")


class CubicPlanner(Planner):
    """Learned-cost search: greedy grid placement + beam search over splits + refinement.

    The search stops at its own limits (``max_rounds`` of beam search, ``kicks`` without gain) or at
    ``time_budget_s``, whichever comes first; ``time_budget_s=0`` (or None) sets no time limit, so the
    same inputs give the same plan on any machine. ``budget_reached_`` (set by :meth:`plan`) says
    whether the search ran into its time budget: then a slower or busier machine may return
    another plan, and the plan's notes say so."""

    name = "cubic"

    def __init__(self, estimator: Estimator | None = None, beam_width: int = 3, branch: int = 2,
                 time_budget_s: float = 3.0, max_rounds: int = 8, kicks: int = 20, refine_candidates: bool = True, allow: tuple[str, ...] = (
                     "column_wise", "row_wise", "table_row_wise", "data_parallel"), target: str = "any"):
        self.estimator = estimator
        self.target = target
        self.beam_width, self.branch = beam_width, branch
        self.time_budget_s, self.max_rounds = time_budget_s, max_rounds
        self.allow = allow
        self.refine_candidates = refine_candidates
        self.kicks = kicks  # iterated local search: stop after this many kicks in a row that do not help

    def _moves(self, ctx: Context, splits: dict, table: Table, bottleneck: int = 0) -> list[dict]:
        kind, k = splits.get(table.name, ("table_wise", 1))
        out = []
        if kind in ("table_wise", "column_wise") and "column_wise" in self.allow:
            k2 = 2 if kind == "table_wise" else 2 * k
            if k2 <= ctx.group and column_pieces(table.dim, k2):
                out.append({**splits, table.name: ("column_wise", k2)})
        if "table_row_wise" in self.allow and ctx.nodes > 1 and kind in ("table_wise", "row_wise"):
            # rows over the bottleneck's node: all-to-all of ids/embeddings stays on the fast intra-node links
            out.append({**splits, table.name: ("table_row_wise", bottleneck // ctx.local)})
        if ctx.target == "torchrec":  # TorchRec's row-wise: one even split over every rank, nothing between
            if kind in ("table_wise", "table_row_wise") and "row_wise" in self.allow and ctx.group > 1:
                out.append({**splits, table.name: ("row_wise", ctx.group)})
        elif kind in ("table_wise", "row_wise") and "row_wise" in self.allow:
            k2 = 2 if kind == "table_wise" else 2 * k
            if k2 <= ctx.group and row_pieces(table.rows, k2):
                out.append({**splits, table.name: ("row_wise", k2)})
        if (kind == "table_wise" and "data_parallel" in self.allow and ctx.group > 1
                and Storage.of(table.rows, table.dim).total * 50 <= ctx.memory_bytes):
            out.append({**splits, table.name: ("data_parallel", 1)})
        return out

    def plan(self, tables, topology, batch_size, group_size=None, sync=None):
        from threadpoolctl import threadpool_limits

        # the model's matmuls are tiny: a BLAS thread pool only adds wake-up latency to each call
        with threadpool_limits(1):
            return self._plan(tables, topology, batch_size, group_size, sync)

    def _plan(self, tables, topology, batch_size, group_size, sync):
        t0 = time.perf_counter()
        est = self.estimator or LearnedEstimator()
        ctx = planner_context(tables, topology, batch_size, group_size, est, self.target, sync)
        budget = self.time_budget_s or math.inf
        deadline = t0 + budget
        self.budget_reached_ = False
        if not est.can_predict():
            raise SpecError(f"the cubic planner scores plans with Estimator.predict, which {type(est).__name__} "
                            "does not provide (pass a modelled estimator)", field="estimator")
        model = est
        start = self._evaluate(ctx, model, presplit(ctx), deadline)
        _, sp0, pl0, _, _ = start
        start, won, heur_ranks = self._portfolio_start(ctx, start)
        if len(pl0.units) < ctx.group:  # idle ranks: cut the costliest tables until every rank has a piece
            fill = self._evaluate(ctx, model, self._idle_fill_splits(ctx, start), deadline)
            if fill[0] < start[0] - 1e-9:
                start, won = fill, None
        best, beam, rounds = self._beam_search(ctx, model, start, deadline)
        if not math.isfinite(best[0]):
            raise PlanDoesNotFit("no placement fits the memory limit", field="memory_per_rank_gb")
        end = deadline + 0.25 * budget
        first = f"{won}'s placement" if won and best[1] is sp0 else "the search's placement"
        pl, ranks, score, splits, origin = self._refine_starts(best, beam, pl0, sp0, heur_ranks, first, end)
        ranks, score, kicks, kept = self._iterated_local_search(ctx, pl, ranks, score, end)
        # every stage checks the clock: one that ended past the deadline may have been cut by it
        self.budget_reached_ = time.perf_counter() >= deadline
        n_split = {k: sum(1 for v in splits.values() if v[0] == k)
                   for k in ("column_wise", "row_wise", "table_row_wise", "data_parallel")}
        notes = f"target {ctx.target}; search rounds {rounds}; splits {n_split}; predicted max {score:.3f} ms"
        notes += f"; local search from {origin}, {kicks} kicks ({kept} kept)"
        plan = self._portfolio_guard(ctx, to_plan(ctx, self.name, pl.units, ranks, pl.dp, t0, notes), pl0,
                                     heur_ranks, t0)
        if self.budget_reached_:
            plan = plan.model_copy(update={"notes": f"{plan.notes}; {budget_note(self.time_budget_s)}"})
        return plan

    def _evaluate(self, ctx: Context, model, splits: dict, deadline: float) -> tuple:
        """A split decision's candidate (score, splits, placement, ranks, rank costs)."""
        units, dp = build_units(ctx, splits)
        pl = _Placement(ctx, model, units, dp)
        ranks, score, cost = pl.run()
        if not math.isfinite(score):  # memory-tight: place the biggest pieces first instead
            ranks, score, cost = pl.run(order=sorted(range(len(units)), key=lambda i: -units[i].mem))
        if math.isfinite(score) and ctx.group <= 32 and self.refine_candidates:
            # a split is judged on its refined placement: greedy placement alone misjudges splits
            ranks, score = pl.refine(ranks, deadline, max_iters=60 if ctx.group <= 8 else 15)
            cost = pl.rank_costs(ranks)
        return score, splits, pl, ranks, cost

    def _portfolio_start(self, ctx: Context, start: tuple) -> tuple[tuple, str | None, list]:
        """(start, the heuristic whose placement it now is or None, [(heuristic, ranks)]).

        Portfolio: the heuristics' placements of the same pieces, scored by the same model; the
        search starts from the best, so the plan returned is never worse than any of them."""
        _, sp0, pl0, _, _ = start
        won = None
        heur_ranks = []
        for kind in PORTFOLIO:
            try:
                r_h = HeuristicPlanner(kind).assign(ctx, pl0.units)
            except PlanDoesNotFit:  # a heuristic that cannot place the pieces is no candidate
                continue
            heur_ranks.append((kind, r_h))
            c_h = pl0.rank_costs(r_h)
            if c_h.max() < start[0] - 1e-9:
                start, won = (float(c_h.max()), sp0, pl0, r_h, c_h), kind
        return start, won, heur_ranks

    def _idle_fill_splits(self, ctx: Context, start: tuple) -> dict:
        """The start's splits with its costliest tables cut until there are pieces for every rank."""
        _, sp0, pl0, _, cost = start
        splits, n = dict(sp0), len(pl0.units)
        st = pl0.standalone()
        for i in np.argsort(-st, kind="stable"):
            t = pl0.units[i].table
            moves = self._moves(ctx, splits, t, int(np.argmax(cost)))
            if t.name in splits or not moves:
                continue
            splits = moves[0]
            n += len(build_units(ctx, {t.name: splits[t.name]})[0]) - 1
            if n >= ctx.group:
                break
        return splits

    def _beam_search(self, ctx: Context, model, start: tuple, deadline: float) -> tuple[tuple, list, int]:
        """Beam search over splits of the bottleneck rank's pieces: (best, final beam, rounds)."""
        by_name = {t.name: t for t in ctx.tables}
        beam = [start]
        best = start
        seen = {tuple(sorted(start[1].items()))}
        rounds = 0
        while rounds < self.max_rounds and time.perf_counter() < deadline:
            rounds += 1
            cands = []
            for score, splits, pl, ranks, cost in beam:
                if not math.isfinite(score):
                    continue
                b = int(np.argmax(cost))
                # the bottleneck rank's costliest pieces are the ones worth cutting
                on_b = sorted((i for i, r in enumerate(ranks) if r == b), key=lambda i: -pl.units[i].vec[2])
                names = list(dict.fromkeys(pl.units[i].table.name for i in on_b))[: self.branch]
                for n in names:
                    for s in self._moves(ctx, splits, by_name[n], b):
                        key = tuple(sorted(s.items()))
                        if key in seen:
                            continue
                        seen.add(key)
                        cands.append(self._evaluate(ctx, model, s, deadline))
                        if time.perf_counter() > deadline:
                            break
            if not cands:
                break
            pool = sorted(beam + cands, key=lambda c: c[0])[: self.beam_width]
            if pool[0][0] >= best[0] - 1e-6 and all(c in beam for c in pool):
                break
            beam = pool
            best = min(best, pool[0], key=lambda c: c[0])
        return best, beam, rounds

    def _refine_starts(self, best: tuple, beam: list, pl0: _Placement, sp0: dict, heur_ranks: list, first: str,
                       end: float) -> tuple:
        """Local search from the best plan, the rest of the beam and the heuristics' placements of the
        same pieces (different basins): the best result as (placement, ranks, score, splits, origin)."""
        _, splits, pl, ranks, _ = best
        starts = [(pl, ranks, splits, first)] + [(c[2], c[3], c[1], "a beam plan") for c in beam
                                                 if c is not best and math.isfinite(c[0])]
        if pl is pl0:
            starts += [(pl0, r, sp0, f"{kind}'s placement") for kind, r in heur_ranks]
        score, origin = math.inf, first
        for p_s, r_s, sp_s, label in starts:
            r_s, sc = p_s.refine(r_s, end)
            if sc < score - 1e-9:
                pl, ranks, score, splits, origin = p_s, r_s, sc, sp_s, label
            if time.perf_counter() > end:
                break
        return pl, ranks, score, splits, origin

    def _iterated_local_search(self, ctx: Context, pl: _Placement, ranks: list[int], score: float,
                               end: float) -> tuple[list[int], float, int, int]:
        """Random kicks, each refined, from the best placement: (ranks, score, kicks, kicks kept)."""
        rng, stale, kicks, kept = np.random.default_rng(0), 0, 0, 0
        # (not on large groups: there the bottleneck is a pinned or comm-bound rank and kicks only cost time)
        while stale < self.kicks and ctx.group <= 32 and time.perf_counter() < end and len(pl.units) > 1:
            r_k, sc = pl.refine(pl.kick(ranks, rng), end)
            kicks += 1
            if sc < score - 1e-9:
                ranks, score, stale, kept = r_k, sc, 0, kept + 1
            else:
                stale += 1
        return ranks, score, kicks, kept

    def _portfolio_guard(self, ctx: Context, plan: Plan, pl0: "_Placement", heur_ranks: list, t0: float) -> Plan:
        """The guarantee, checked on whole plans with the plan cost itself (not the search's running
        sums): under the estimator and comm model the planner was given, the plan returned is never
        worse than the best memory-feasible heuristic's; if one is better, its plan is returned."""
        best = plan
        for kind, r_h in heur_ranks:
            alt = to_plan(ctx, self.name, pl0.units, r_h, pl0.dp, t0,
                          f"target {ctx.target}; portfolio: {kind}'s placement (the search found nothing better "
                          "under its model)")
            if alt.predicted.max_ms < best.predicted.max_ms - 1e-9:
                best = alt
        return best
