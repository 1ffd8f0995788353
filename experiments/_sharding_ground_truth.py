"""The sharding benchmark's ground truth: each rank's compute measured (:class:`MinOfRounds`, one
look; :func:`judge`) and an independent communication model (written apart from cost_models/comm.py,
which the planner optimises, so a plan is not judged by its own model).

A training step of a plan on G ranks is synchronous at every all-to-all: each collective ends when
its slowest rank does. Per step there are three all-to-alls (ids forward, pooled embeddings
forward, their gradients backward). A collective's time on rank r is

    latency + per_message_s x (peers r exchanges with) + max(bytes r sends, bytes r receives) / bandwidth

on each link kind (intra-node and inter-node legs in parallel; the slower leg counts), and the
collective takes the max over ranks. The step is max over ranks of the compute (measured) plus the
three collectives plus the data-parallel all-reduce (a plain ring over all ranks). Volumes are
computed here from the shards themselves: ids are int64, pooled embeddings fp32; a row-wise
piece receives the ids of its rows and returns full-width partial sums; every other piece receives
every id of its table and returns its columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharding.measure import ShardWork, measure_compute, works_key

ROUNDS = 3  # interleaved measurement rounds per look (minimum kept)


@dataclass(frozen=True)
class PlainNetwork:
    """A plain bandwidth-plus-latency network with a per-message overhead."""

    name: str
    intra_bw_Bps: float
    inter_bw_Bps: float
    latency_s: float
    inter_latency_s: float
    per_message_s: float
    ranks_per_node: int

    def describe(self) -> dict:
        return {"name": self.name, "intra_bw_GBps": self.intra_bw_Bps / 1e9, "inter_bw_GBps": self.inter_bw_Bps / 1e9,
                "latency_us": self.latency_s * 1e6, "inter_latency_us": self.inter_latency_s * 1e6,
                "per_message_us": self.per_message_s * 1e6, "ranks_per_node": self.ranks_per_node,
                "form": "synchronous all-to-all: max over ranks of latency + per-message x peers + "
                        "max(sent, received)/bandwidth per leg; x3 per step; + ring all-reduce of DP tables"}


def _traffic(plan) -> tuple[np.ndarray, np.ndarray]:
    """[G, G] bytes rank i sends rank j per step: ids (input dist) and pooled embeddings (output dist)."""
    G, B = plan.group_size, plan.batch_size
    tables = {t.name: t for t in plan.tables}
    ids = np.zeros((G, G))
    emb = np.zeros((G, G))
    for s in plan.shards:
        if s.sharding_type == "data_parallel":
            continue
        t = tables[s.table]
        rw = s.sharding_type in ("row_wise", "table_row_wise")
        id_bytes = B * t.pooling_factor * (s.rows / t.rows if rw else 1.0) * 8  # from each other rank's batch
        out_bytes = B * (t.dim if rw else s.cols) * 4  # to each other rank, for its batch
        for j in range(G):
            if j != s.rank:
                ids[j, s.rank] += id_bytes
                emb[s.rank, j] += out_bytes
    return ids, emb


def _collective_s(M: np.ndarray, net: PlainNetwork) -> float:
    G = M.shape[0]
    if G <= 1:
        return 0.0
    node = np.arange(G) // max(1, min(net.ranks_per_node, G))
    worst = 0.0
    for r in range(G):
        legs = []
        for same, bw, lat in ((True, net.intra_bw_Bps, net.latency_s), (False, net.inter_bw_Bps, net.inter_latency_s)):
            mask = (node == node[r]) if same else (node != node[r])
            mask = mask.copy()
            mask[r] = False
            if not mask.any():
                continue
            sent, recv = M[r, mask].sum(), M[mask, r].sum()
            peers = int(((M[r, mask] > 0) | (M[mask, r] > 0)).sum())
            legs.append(lat + net.per_message_s * peers + max(sent, recv) / bw)
        worst = max(worst, max(legs) if legs else 0.0)
    return worst


def step_ms(plan, compute_ms: list[float], net: PlainNetwork) -> dict:
    """The plan's step under this network: max compute + three synchronous all-to-alls + DP all-reduce."""
    ids, emb = _traffic(plan)
    a2a = _collective_s(ids, net) + 2 * _collective_s(emb, net)
    W = plan.world_size
    dp_bytes = sum(s.rows * s.cols * 4 for s in plan.shards if s.sharding_type == "data_parallel" and s.rank == 0)
    bw = net.intra_bw_Bps if W <= net.ranks_per_node else net.inter_bw_Bps
    ar = (2 * (W - 1) * (net.latency_s + net.per_message_s) + 2 * (W - 1) / W * dp_bytes / bw) if dp_bytes and W > 1 else 0.0
    comp = max(compute_ms) if compute_ms else 0.0
    return {"total_ms": comp + 1e3 * (a2a + ar), "compute_ms": comp, "comm_ms": 1e3 * (a2a + ar)}


class MinOfRounds:
    """One look at rank shard sets' compute: ``rounds`` interleaved rounds, minimum kept (the 2-core
    machine is shared: contention only inflates a measurement, and interleaving spreads it)."""

    def __init__(self, rounds: int = ROUNDS):
        self.rounds = rounds
        self.values: dict[str, float] = {}
        self.measurements = 0

    def measure(self, sets: dict[str, tuple[list, int]]) -> None:
        todo = {k: v for k, v in sets.items() if k not in self.values}
        best = {k: float("inf") for k in todo}
        for _ in range(self.rounds):
            for k, (works, batch) in todo.items():
                best[k] = min(best[k], measure_compute(works, batch, repeats=1, warmup=1)["total_ms"])
                self.measurements += 1
        self.values.update(best)


def rank_sets(plan) -> list[tuple[str, list, int]]:
    """Per rank, its sharded pieces (batch = the group's) and its data-parallel tables (its own batch),
    each as (key, works, batch); identical sets share a key and are measured once per look."""
    tables = {t.name: t for t in plan.tables}
    G, B = plan.group_size, plan.batch_size
    out = []
    for ss in plan.rank_shards():
        works = [ShardWork.of(tables[s.table], s) for s in ss if s.sharding_type != "data_parallel"]
        dp = [ShardWork.of(tables[s.table], s) for s in ss if s.sharding_type == "data_parallel"]
        out.append((works_key(works, G * B) if works else "", works, G * B))
        out.append((works_key(dp, B) if dp else "", dp, B))
    return out


def plan_sets(plans) -> dict[str, tuple[list, int]]:
    """Every distinct rank set of ``plans``, for one look to measure together."""
    return {k: (w, b) for p in plans for k, w, b in rank_sets(p) if k}


def judge(plan, meter: MinOfRounds, net: PlainNetwork) -> dict:
    """The plan's step from one look (``meter``, its sets measured): step_ms plus each rank's compute."""
    rs = rank_sets(plan)
    comp = [(meter.values[rs[2 * r][0]] if rs[2 * r][0] else 0.0)
            + (meter.values[rs[2 * r + 1][0]] if rs[2 * r + 1][0] else 0.0) for r in range(plan.group_size)]
    return {**step_ms(plan, comp, net), "rank_compute_ms": comp}
