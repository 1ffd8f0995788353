"""cubic's local search (sharding.planners._Placement.refine / kick): legal, monotone, locally optimal."""

import time

import numpy as np
import pytest

from cubic.core.workloads import generate_tables
from sharding.estimate import LearnedEstimator
from sharding.planners import planner_context, _Placement, build_units, presplit
from tests.test_sharding_portfolio import topo_for


@pytest.fixture(scope="module")
def est():
    return LearnedEstimator()


def legal(pl, ranks):
    """One piece of a table per rank, pinned pieces on their rank, memory within the limit."""
    G = pl.ctx.group
    mem = np.full(G, float(pl.base_mem))
    seen = set()
    for u, r in zip(pl.units, ranks):
        assert 0 <= r < G and (u.table.name, r) not in seen
        assert u.fixed is None or r == u.fixed
        seen.add((u.table.name, r))
        mem[r] += u.mem
    assert (mem <= pl.ctx.memory_bytes).all()


@pytest.mark.parametrize("seed,n,world,target", [(21, 30, 4, "torchrec"), (22, 45, 8, "any"), (23, 20, 4, "torchrec")])
def test_refine_from_a_random_placement_is_legal_monotone_and_a_local_optimum(est, seed, n, world, target):
    tables = generate_tables(n, seed=seed)
    ctx = planner_context(tables, topo_for(tables, world, world), 256, None, est, target)
    units, dp = build_units(ctx, presplit(ctx))
    pl = _Placement(ctx, est.model, units, dp)
    rng = np.random.default_rng(seed)
    start, _, _ = pl.run()  # a legal start, then scrambled by kicks
    start = pl.kick(start, rng, n=len(units))
    legal(pl, start)
    before = pl.rank_costs(start).max()
    ranks, score = pl.refine(start, time.perf_counter() + 30)
    legal(pl, ranks)
    cost = pl.rank_costs(ranks)
    assert score == pytest.approx(cost.max())
    assert score < before  # a scrambled placement is never a local optimum
    # no single move of a free piece off the bottleneck rank lowers the plan max (brute force)
    b = int(np.argmax(cost))
    for i, u in enumerate(units):
        if ranks[i] != b or u.fixed is not None:
            continue
        for r in range(ctx.group):
            trial = list(ranks)
            trial[i] = r
            if r == b or any(trial[j] == r for j, v in enumerate(units) if v.table.name == u.table.name and j != i):
                continue
            mem_r = pl.base_mem + sum(v.mem for j, v in enumerate(units) if trial[j] == r)
            if mem_r > ctx.memory_bytes:
                continue
            assert pl.rank_costs(trial).max() >= score - 1e-6, (i, r)
