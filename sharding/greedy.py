"""``greedy``: the simple cost-balancing planner (the simulator's, now a registered Planner).

Each table is one table-wise piece unless its cost (its lookups, priced by the estimator, plus its
all-to-all bytes at the comm model's per-byte cost, plus its 2D cross-group sync) exceeds the
per-rank target ``total / G``, or its bytes exceed a rank's memory; then it is cut column-wise (down
to 16-column pieces) or row-wise into as many pieces as it needs, whichever gives the cheaper
pieces. Pieces are placed longest-first on the least-loaded rank with room (LPT); a table that
finds no room is cut twice as finely and the placement retried. Pieces follow ``target``'s shapes
(``sharding.planners.build_units``: TorchRec's row-wise is one pinned split over every rank).

Cheap (no search) and needs no learned model on GPU topologies: what ``planner: none`` means in a
config (``sharding.from_config``).
"""

from __future__ import annotations

import math
import time

import numpy as np

from cost_models.comm import FP32, ID_BYTES
from sharding.enumerate import column_pieces, row_pieces
from sharding.estimate import Estimator
from sharding.measure import ShardWork
from sharding.planners import Context, Planner, Unit, planner_context, build_units, presplit, to_plan
from sharding.types import PlanDoesNotFit

MIN_CW_COLS = 16  # smallest column-wise piece (64-byte rows; narrower wastes memory sectors)


def default_estimator(device: str) -> Estimator:
    """The modelled compute estimator of a device: the HBM lookup model for a modelled GPU, else the
    learned CPU kernel model."""
    from cost_models.hardware import DEVICES
    from sharding.estimate import GpuEstimator, LearnedEstimator

    return GpuEstimator(device) if device in DEVICES else LearnedEstimator()


class GreedyPlanner(Planner):
    name = "greedy"

    def __init__(self, estimator: Estimator | None = None, target: str = "any"):
        self.estimator, self.target = estimator, target

    def plan(self, tables, topology, batch_size, group_size=None, sync=None):
        t0 = time.perf_counter()
        est = self.estimator or default_estimator(topology.device)
        ctx = planner_context(tables, topology, batch_size, group_size, est, self.target, sync)
        min_k: dict[str, int] = {}
        for _ in range(64):
            splits = self._splits(ctx, min_k)
            units, dp = build_units(ctx, splits)
            costs = self._costs(ctx, units)
            ranks, stuck = self._place(ctx, units, costs)
            if stuck is None:
                n = sum(1 for v in splits.values() if v[0] != "table_wise")
                return to_plan(ctx, self.name, units, ranks, dp, t0, notes=f"greedy (LPT); {n} tables split")
            k = splits.get(stuck.table.name, ("table_wise", 1))[1]
            if k >= ctx.group or self.target == "torchrec" and splits.get(stuck.table.name, ("",))[0] == "row_wise":
                raise PlanDoesNotFit(f"greedy: table {stuck.table.name!r} fits no rank's memory in the group of "
                                     f"{ctx.group}", field=f"tables.{stuck.table.name}")
            min_k[stuck.table.name] = min(ctx.group, 2 * max(k, 1))
        raise PlanDoesNotFit("greedy: no feasible placement found", field="tables")  # pragma: no cover

    def _piece_cost(self, ctx: Context, pieces: list[tuple]) -> np.ndarray:
        """ms of each (table, kind, rows, cols) piece alone: lookups (estimator) + its all-to-all bytes."""
        if not pieces:
            return np.zeros(0)
        G, B = ctx.group, ctx.batch
        comp = np.array(ctx.estimator.compute_ms([[ShardWork(t, 0, rows, cols)] for t, _, rows, cols in pieces], G * B))
        beta_ms = 1e3 * ctx.comm.beta(G - 1)
        out = []
        for (t, kind, rows, cols), c in zip(pieces, comp):
            out_cols = t.dim if kind in ("row_wise", "table_row_wise") else cols
            share = rows / t.rows
            nbytes = 2 * B * (G - 1) * out_cols * FP32 + B * (G - 1) * t.pooling_factor * share * ID_BYTES
            out.append(c + beta_ms * nbytes)
        return np.array(out)

    def _splits(self, ctx: Context, min_k: dict[str, int]) -> dict[str, tuple[str, int]]:
        G = ctx.group
        splits = dict(presplit(ctx))
        full = self._piece_cost(ctx, [(t, "table_wise", t.rows, t.dim) for t in ctx.tables])
        target = full.sum() / G
        for t, c in zip(ctx.tables, full):
            k_mem = max(splits.get(t.name, ("", 1))[1] if t.name in splits else 1, min_k.get(t.name, 1))
            if t.name in splits and splits[t.name][0] == "table_row_wise":
                continue  # TorchRec's node split for a table too big for a rank: kept as presplit chose it
            k_need = min(G, max(k_mem, math.ceil(c / target) if target > 0 else 1))
            if k_need <= 1:
                continue
            options = []  # (piece cost, kind, k)
            k_cw = k_need
            while k_cw >= max(2, k_mem) and not (column_pieces(t.dim, k_cw) and t.dim // k_cw >= MIN_CW_COLS):
                k_cw -= 1
            if k_cw >= max(2, k_mem):
                options.append((self._piece_cost(ctx, [(t, "column_wise", t.rows, -(-t.dim // k_cw))])[0],
                                "column_wise", k_cw))
            k_rw = G if ctx.target == "torchrec" else k_need
            if ctx.target == "torchrec" or row_pieces(t.rows, k_rw):
                rows = -(-t.rows // k_rw)
                options.append((self._piece_cost(ctx, [(t, "row_wise", rows, t.dim)])[0], "row_wise", k_rw))
            if options:
                _, kind, k = min(options)
                splits[t.name] = (kind, k)
        return splits

    def _costs(self, ctx: Context, units: list[Unit]) -> np.ndarray:
        pieces = [(u.table, u.kind, u.rows, u.cols) for u in units]
        return self._piece_cost(ctx, pieces) + np.array([u.sync_ms for u in units])

    def _place(self, ctx: Context, units: list[Unit], costs: np.ndarray) -> tuple[list[int], Unit | None]:
        """LPT under memory, pieces of a table on distinct ranks; (ranks, the unit that found no room)."""
        G = ctx.group
        mem, load = np.zeros(G), np.zeros(G)
        taken: dict[str, list[int]] = {}
        ranks = [-1] * len(units)
        for i in np.argsort(-costs, kind="stable"):
            u = units[i]
            fits = mem + u.mem <= ctx.memory_bytes
            fits[taken.get(u.table.name, [])] = False
            if u.fixed is not None:
                fits &= np.arange(G) == u.fixed
            if not fits.any():
                return ranks, u
            cand = np.flatnonzero(fits)
            r = int(cand[np.argmin(load[cand])])
            ranks[i] = r
            taken.setdefault(u.table.name, []).append(r)
            mem[r] += u.mem
            load[r] += costs[i]
        return ranks, None
