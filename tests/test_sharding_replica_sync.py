"""A 2D plan is priced with the replica sync the job runs (sharding.types.ReplicaSync): before stop 71
every planner priced a per-step all-gather of touched rows whatever the config said, while the runners,
the step model and TorchRec's DMPCollection.sync() average whole shards every 100 steps by default.
Under ``gradients`` the planner and the step model priced the exchange two ways until stop 72 (the rows one
group touched, all-gathered; the union over replicas, all-reduced): both now read one rule, the volumes
the runner exchanges (cost_models.comm.touched_row_sync_bytes; the runner's own count is checked in
tests/test_runners_two_d.py)."""

from __future__ import annotations

import json
import warnings

import pytest

from cost_models.comm import CommModel, piece_sync_bytes, replica_sync_ms, touched_row_sync_bytes
from cubic.core.config import Config, ShardingChoice
from cubic.core.spec import Table, Topology
from cubic.core.workloads import DEFAULT_WORKLOADS, generate_tables
from sharding.estimate import GpuEstimator, plan_cost
from sharding.from_config import plan_for
from sharding.registry import make_planner
from sharding.types import ReplicaSync, Storage, load_plan

TOPO8 = Topology(world_size=8, ranks_per_node=8, memory_per_rank_gb=4.0)


def toy_estimator() -> GpuEstimator:
    from cost_models.hardware import CLUSTERS

    return GpuEstimator(CLUSTERS["h100"].device)  # an analytical one: no model file, fast


def test_weight_averaging_is_the_shard_all_reduced_every_interval():
    t = Table(name="t", rows=100_000, dim=64)
    comm = CommModel.from_topology(TOPO8)
    nbytes = Storage.of(t.rows, t.dim).total
    every_100 = replica_sync_ms(4, 2, comm, mode="weights", interval=100, shard_bytes=nbytes)
    # replicas of a 2-rank group on an 8-rank node: all four on the node
    assert every_100 == pytest.approx(comm.all_reduce_ms(4, nbytes, 4) / 100)
    assert replica_sync_ms(4, 2, comm, mode="weights", interval=10, shard_bytes=nbytes) == pytest.approx(10 * every_100)
    assert replica_sync_ms(1, 2, comm, mode="weights", interval=1, shard_bytes=nbytes) == 0


def test_a_gradient_sync_is_the_touched_ids_gathered_and_their_union_reduced():
    t = Table(name="t", rows=100_000, dim=64)
    comm = CommModel.from_topology(TOPO8)
    draws = 2 * 512 * t.pooling_factor
    ids1, grads1 = touched_row_sync_bytes(t.rows, t.dim, t.access.effective_alpha(), draws, 1)
    ids4, grads4 = touched_row_sync_bytes(t.rows, t.dim, t.access.effective_alpha(), draws, 4)
    own = ids1[0] / 8  # the rows one group touched
    assert ids4[0] == ids1[0] and grads1[0] == pytest.approx(own * t.dim * 4)  # one replica: its own rows
    assert own * t.dim * 4 < grads4[0] < 4 * own * t.dim * 4  # the union: more than one's, fewer than the sum
    # the runner's three collectives: the pieces' counts and the ids all-gathered, the union reduced
    bucket = replica_sync_ms(4, 2, comm, mode="gradients", interval=1, ids_bytes=ids4[0], grad_bytes=grads4[0],
                             pieces=3)
    assert bucket == pytest.approx(comm.all_gather_ms(4, 3 * 8, 4) + comm.all_gather_ms(4, ids4[0], 4)
                                   + comm.all_reduce_ms(4, grads4[0], 4))
    assert piece_sync_bytes(t, t.rows, t.dim, 2, 512, 4, mode="gradients", shard_bytes=0) == (8, ids4[0], grads4[0])


def _hand_plan(k: int, topo: Topology, sync: ReplicaSync):
    """A 100k x 64 table whole (k=1) or in k column pieces, all on rank 0 of a 2-rank group."""
    from sharding.types import Plan, Shard

    t = Table(name="t", rows=100_000, dim=64)
    shards = [Shard(table="t", sharding_type="table_wise" if k == 1 else "column_wise", rank=0, rows=t.rows,
                    col_offset=j * t.dim // k, cols=t.dim // k) for j in range(k)]
    return Plan(planner="hand", world_size=8, group_size=2, batch_size=512, topology=topo, tables=[t],
                shards=shards, sync=sync)


@pytest.mark.parametrize("mode", ["gradients", "weights"])
def test_a_rank_s_pieces_sync_in_one_bucket_with_one_set_of_latencies(mode):
    """The runner exchanges a rank's pieces in one set of collectives (ShardedEmbedding._sum_touched_rows;
    one all-reduce under ``weights``); until stop 73 the plan's estimate paid the latencies per piece."""
    sync = ReplicaSync(mode=mode, interval=1 if mode == "gradients" else 100)
    topo = Topology(world_size=8, ranks_per_node=4, memory_per_rank_gb=4.0)  # replicas across nodes
    comm = CommModel.from_topology(topo)
    plan = _hand_plan(8, topo, sync)
    t = plan.tables[0]
    priced = plan_cost(plan, toy_estimator(), comm).per_rank
    pieces = [piece_sync_bytes(t, s.rows, s.cols, 2, 512, 4, mode=mode, shard_bytes=s.storage().total)
              for s in plan.shards]
    kw = lambda b: {"shard_bytes": b[0]} if mode == "weights" else {"ids_bytes": b[1], "grad_bytes": b[2]}  # noqa: E731
    total = [sum(p[i] for p in pieces) for i in range(len(pieces[0]))]  # the bucket's bytes per collective
    bucket = replica_sync_ms(4, 2, comm, mode=mode, interval=sync.interval, pieces=8, **kw(total))
    assert priced[0].sync_ms == pytest.approx(bucket) and priced[1].sync_ms == 0  # rank 1 holds nothing
    per_piece = sum(replica_sync_ms(4, 2, comm, mode=mode, interval=sync.interval, **kw(p)) for p in pieces)
    latencies = replica_sync_ms(4, 2, comm, mode=mode, interval=sync.interval, shard_bytes=1, ids_bytes=1,
                                grad_bytes=1)
    assert per_piece - bucket > 6 * latencies  # seven sets of latencies not paid


@pytest.mark.parametrize("mode", ["gradients", "weights"])
def test_the_planner_s_own_sum_is_the_plan_s_bucketed_sync(mode):
    """A planner adds a rank's sync up piece by piece (cost_models.comm.SyncLine: the bucket's latencies
    once, each piece's bytes at the bucket's slope): its per-rank sync is the estimate's, near enough."""
    from sharding.planners import planner_context

    sync = ReplicaSync(mode=mode, interval=1 if mode == "gradients" else 100)
    tables = generate_tables(16, seed=3)
    topo = Topology(world_size=16, ranks_per_node=4, memory_per_rank_gb=4.0)  # four replicas, one per node
    plan = make_planner("greedy", estimator=toy_estimator()).plan(tables, topo, 256, 4, sync)
    ctx = planner_context(tables, topo, 256, 4, toy_estimator(), sync=sync)
    own = [ctx.sync_line.fixed_ms] * 4
    by_table = {t.name: t for t in tables}
    for s in plan.shards:
        if s.sharding_type != "data_parallel":
            own[s.rank] += ctx.unit(by_table[s.table], s.sharding_type, s.row_offset, s.rows, s.col_offset,
                                    s.cols).sync_ms
    priced = [r.sync_ms for r in plan.predicted.per_rank]
    assert own == pytest.approx(priced, rel=0.02)


def test_the_step_model_exchanges_what_the_planner_prices_under_a_gradient_sync():
    """The simulated step's sync bytes per rank are the planner's rule summed over the rank's shards."""
    import numpy as np

    from cost_models.hardware import CLUSTERS
    from cubic.runners.step_model import DEFAULT_PARAMS, predict_step

    w = DEFAULT_WORKLOADS["dlrm-small"]
    c = Config(kernels={"dense_dtype": "bf16"}, sharding=ShardingChoice(planner="sim", group_size=4, sync="gradients"))
    grads = DEFAULT_PARAMS.model_copy(update={"emb_sync": "gradients"})
    p = predict_step(w, c, CLUSTERS["h100"], 16, grads)
    plan, tables = p.sharding_plan, {t.name: t for t in w.tables}
    per_rank = np.zeros(plan.group_size)
    for s in plan.shards:
        if s.sharding_type == "data_parallel":
            continue
        t = tables[s.table]
        draws = 4 * w.batch_size * t.pooling_factor * s.rows / t.rows  # a row-wise piece: its rows' share
        ids, g = touched_row_sync_bytes(s.rows, s.cols, t.access.effective_alpha(), draws, 4)
        per_rank[s.rank] += ids[0] + g[0]
    assert p.plan["embedding_sync_bytes_per_rank"] == pytest.approx(per_rank.max(), rel=1e-9)


@pytest.mark.parametrize("planner", ["cubic", "greedy", "lookup_greedy"])
def test_a_2d_plan_is_priced_and_labelled_with_its_sync(planner, tmp_path):
    tables = generate_tables(10, seed=2)
    kw = {"time_budget_s": 0.3} if planner == "cubic" else {}
    make = lambda: make_planner(planner, estimator=toy_estimator(), **kw)  # noqa: E731
    weights = make().plan(tables, TOPO8, 128, 4)
    assert weights.sync == ReplicaSync()  # the runners' default when nothing is said
    grads = make().plan(tables, TOPO8, 128, 4, ReplicaSync(mode="gradients", interval=1))
    assert grads.sync.mode == "gradients"
    # the prediction follows the sync the plan says, so re-pricing the plan reproduces it
    for plan in (weights, grads):
        again = plan_cost(plan, toy_estimator(), CommModel.from_topology(plan.topology))
        assert [r.sync_ms for r in again.per_rank] == [r.sync_ms for r in plan.predicted.per_rank]
    assert [r.sync_ms for r in weights.predicted.per_rank] != [r.sync_ms for r in grads.predicted.per_rank]
    # a plan of one group has no replicas to sync, and says none
    assert make().plan(tables, TOPO8, 128).sync is None
    # the field survives the plan document; a per-step sync has no interval, however it was written
    assert load_plan(grads.save(tmp_path / "p.json")).sync == grads.sync
    assert ReplicaSync.model_validate({"mode": "gradients", "interval": 100}) == grads.sync


def test_a_config_s_sync_reaches_its_plan():
    w = DEFAULT_WORKLOADS["dlrm-small"]
    cfg = lambda **s: Config(sharding=ShardingChoice(planner="greedy", group_size=2, **s))  # noqa: E731
    topo = Topology(world_size=4, ranks_per_node=4, memory_per_rank_gb=2.0)
    assert plan_for(w, cfg(), 4, topology=topo).sync == ReplicaSync()
    assert plan_for(w, cfg(sync="gradients"), 4, topology=topo).sync == ReplicaSync(mode="gradients", interval=1)
    assert plan_for(w, cfg(sync="weights", sync_interval=10), 4, topology=topo).sync.interval == 10


def test_the_simulator_plans_with_the_sync_it_simulates():
    from cost_models.hardware import CLUSTERS
    from cubic.runners.step_model import DEFAULT_PARAMS, predict_step

    w = DEFAULT_WORKLOADS["dlrm-wide"]
    c = Config(kernels={"dense_dtype": "bf16"}, sharding=ShardingChoice(planner="sim", group_size=8))
    assert predict_step(w, c, CLUSTERS["h100"], 64).sharding_plan.sync == ReplicaSync()
    grads = DEFAULT_PARAMS.model_copy(update={"emb_sync": "gradients"})
    assert predict_step(w, c, CLUSTERS["h100"], 64, grads).sharding_plan.sync.mode == "gradients"
    c10 = c.model_copy(update={"sharding": c.sharding.model_copy(update={"sync": "weights", "sync_interval": 10})})
    assert predict_step(w, c10, CLUSTERS["h100"], 64, grads).sharding_plan.sync == ReplicaSync(interval=10)


def test_shard_plan_takes_the_sync_and_refuses_it_where_it_means_nothing(capsys):
    from cubic.cli.app import main

    base = ["shard", "plan", "--tables", "dlrm-small", "--world-size", "4", "--memory-gb", "2",
            "--planner", "lookup_greedy", "--json"]
    assert main([*base, "--group-size", "2", "--sync", "weights", "--sync-interval", "10"]) == 0
    assert json.loads(capsys.readouterr().out)["sync"] == {"mode": "weights", "interval": 10}
    assert main([*base, "--sync", "gradients"]) == 2
    assert "--sync: prices a 2D plan's replica sync" in capsys.readouterr().err
    assert main([*base, "--group-size", "2", "--sync", "gradients", "--sync-interval", "10"]) == 2
    assert "--sync-interval: is the weight-averaging interval" in capsys.readouterr().err


def test_a_job_syncing_otherwise_than_its_plan_was_priced_is_warned():
    from cubic.runners.base import check_run_config

    w = DEFAULT_WORKLOADS["dlrm-small"]
    topo = Topology(world_size=4, ranks_per_node=4, memory_per_rank_gb=2.0)
    plan = plan_for(w, Config(sharding=ShardingChoice(planner="greedy", group_size=2)), 4, topology=topo)
    doc = json.loads(plan.model_dump_json())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_run_config(Config(sharding=ShardingChoice(plan=doc)), 4, source="job.yaml")  # same sync: silent
    with pytest.warns(UserWarning, match="priced for replica sync weights every 100 steps, the job syncs gradients"):
        check_run_config(Config(sharding=ShardingChoice(plan=doc, sync="gradients")), 4, source="job.yaml")


def test_torchrun_s_ranks_warn_of_a_sync_mismatch_once(tmp_path, monkeypatch):
    """Every rank under torchrun reads the config; the mismatch is one job's, said by rank 0 alone."""
    from cubic.runners.base import PricedSyncWarning
    from cubic.runners.launch import _inputs, _parser

    w = DEFAULT_WORKLOADS["dlrm-small"]
    topo = Topology(world_size=4, ranks_per_node=4, memory_per_rank_gb=2.0)
    plan = plan_for(w, Config(sharding=ShardingChoice(planner="greedy", group_size=2)), 4, topology=topo)
    cfg = tmp_path / "job.json"
    cfg.write_text(json.dumps({"sharding": {"plan": json.loads(plan.model_dump_json()), "sync": "gradients"}}))
    args = _parser().parse_args(["--workload", "dlrm-small", "--config", str(cfg)])
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.warns(PricedSyncWarning, match="the job syncs gradients"):
        _inputs(args)
    monkeypatch.setenv("RANK", "3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _inputs(args)


def test_a_2d_plans_legend_says_how_its_sync_is_priced_and_what_that_was_held_to():
    from cost_models.comm import GRADIENT_SYNC_CHECKED
    from sharding.types import format_plan

    w = DEFAULT_WORKLOADS["dlrm-small"]
    topo = Topology(world_size=4, ranks_per_node=4, memory_per_rank_gb=2.0)
    plan = lambda **s: plan_for(w, Config(sharding=ShardingChoice(planner="greedy", **s)), 4, topology=topo)  # noqa: E731
    sync_line = lambda p: next(x for x in format_plan(p).splitlines() if x.startswith("  sync ms"))  # noqa: E731
    grads = sync_line(plan(group_size=2, sync="gradients"))
    assert "touched row ids all-gathered" in grads and GRADIENT_SYNC_CHECKED in grads
    weights = sync_line(plan(group_size=2, sync="weights", sync_interval=10))
    assert "every 10 steps" in weights and GRADIENT_SYNC_CHECKED not in weights
    assert "this plan" not in sync_line(plan())  # one group: no replicas to sync
