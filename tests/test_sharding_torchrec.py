"""Plans cubic produces for TorchRec run under TorchRec 1.9's DMP (CPU, gloo) with exact embeddings,
or `shard export` refuses them with one line (exit 2)."""

import json

import pytest

from cubic.cli.app import main
from cubic.core.spec import SpecError, Table, Topology
from sharding.enumerate import torchrec_row_blocks
from sharding.torchrec_adapter import torchrec_available, torchrec_layout
from sharding.types import Plan, Shard

needs_torchrec = pytest.mark.skipif(not torchrec_available(), reason="torchrec extra not installed")


def plan_of(tables, shards, world, per_node, planner="hand"):
    return Plan(planner=planner, world_size=world, group_size=world, batch_size=8,
                topology=Topology(world_size=world, ranks_per_node=per_node), tables=tables, shards=shards)


def rw(name, rows, dim, pieces):
    """Row pieces [(rank, offset, rows)] of one table."""
    return [Shard(table=name, sharding_type="row_wise", rank=r, row_offset=o, rows=n, cols=dim) for r, o, n in pieces]


def every_type_plan():
    """4 ranks on 2 nodes of 2; one table of each TorchRec sharding type, edge cases included."""
    T = [Table(name="tw", rows=100, dim=8), Table(name="cw", rows=50, dim=24), Table(name="rw", rows=943, dim=8),
         Table(name="rw_tiny", rows=3, dim=4), Table(name="twrw", rows=101, dim=8), Table(name="dp", rows=20, dim=4)]
    S = [Shard(table="tw", sharding_type="table_wise", rank=1, rows=100, cols=8)]
    # uneven widths (8, 8, 4, 4) on ranks out of order
    S += [Shard(table="cw", sharding_type="column_wise", rank=r, rows=50, col_offset=o, cols=c)
          for r, o, c in [(0, 0, 8), (3, 8, 8), (2, 16, 4), (1, 20, 4)]]
    S += rw("rw", 943, 8, [(i, o, n) for i, (o, n) in enumerate(torchrec_row_blocks(943, 4))])  # 236 x3 + 235
    S += rw("rw_tiny", 3, 4, [(0, 0, 1), (1, 1, 1), (2, 2, 1)])  # rank 3 holds an empty block
    S += [Shard(table="twrw", sharding_type="table_row_wise", rank=2 + i, row_offset=51 * i, rows=51 - i, cols=8)
          for i in range(2)]
    S += [Shard(table="dp", sharding_type="data_parallel", rank=i, rows=20, cols=4) for i in range(4)]
    return plan_of(T, S, 4, 2)


@needs_torchrec
@pytest.mark.parametrize("rows", [1, 3, 7, 10, 100, 943, 1001])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_row_blocks_are_torchrecs_own_split(rows, n):
    from torchrec.distributed.sharding_plan import _calculate_rw_shard_sizes_and_offsets

    sizes, offsets = _calculate_rw_shard_sizes_and_offsets(rows, n, 4)
    assert torchrec_row_blocks(rows, n) == [(o[0], s[0]) for s, o in zip(sizes, offsets)]


def test_every_type_maps_to_torchrec_layouts():
    lay = torchrec_layout(every_type_plan())
    assert {k: v.sharding_type for k, v in lay.items()} == {
        "tw": "table_wise", "cw": "column_wise", "rw": "row_wise", "rw_tiny": "row_wise",
        "twrw": "table_row_wise", "dp": "data_parallel"}
    assert lay["rw_tiny"].ranks == [0, 1, 2, 3] and lay["rw_tiny"].shards[-1][1] == 0  # empty block on rank 3
    assert lay["twrw"].ranks == [2, 3]
    # row-wise pieces on exactly one node's ranks with TorchRec's split over that node are table-row-wise
    p = plan_of([Table(name="t", rows=101, dim=8)], rw("t", 101, 8, [(2, 0, 51), (3, 51, 50)]), 4, 2)
    assert torchrec_layout(p)["t"].sharding_type == "table_row_wise"


@pytest.mark.parametrize("rows,pieces,world,per_node,needle", [
    (900, [(0, 0, 300), (1, 300, 300), (2, 600, 300)], 8, 8, "TorchRec row-wise spans all 8 ranks"),  # 3 of 8
    (900, [(0, 0, 225), (1, 225, 225), (2, 450, 225), (3, 675, 225)], 8, 8, "spans all 8 ranks"),  # 4 of 8
    (943, [(0, 0, 471), (1, 471, 472)], 2, 2, "as [472, 471]"),  # uneven: loads in DMP, wrong embeddings
    (943, [(1, 0, 472), (0, 472, 471)], 2, 2, "block i on rank i"),  # blocks on swapped ranks
])
def test_export_refuses_what_torchrec_cannot_run(tmp_path, capsys, rows, pieces, world, per_node, needle):
    p = plan_of([Table(name="t3", rows=rows, dim=8)], rw("t3", rows, 8, pieces), world, per_node)
    path = p.save(tmp_path / "plan.json")
    code = main(["shard", "export", str(path), "--format", "torchrec"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "table t3" in err and needle in err and "re-plan with --target torchrec" in err


def tables_for(seed, n=24):
    from cubic.core.workloads import generate_tables

    return generate_tables(n, seed=seed)


@pytest.mark.parametrize("planner", ["cubic", "size_greedy", "lookup_greedy", "random"])
@pytest.mark.parametrize("seed,world,per_node,mem_frac", [(1, 8, 4, 0.3), (2, 8, 8, 0.15), (3, 4, 2, 0.5)])
def test_planners_targeting_torchrec_only_make_exportable_plans(planner, seed, world, per_node, mem_frac):
    from sharding.registry import make_planner
    from sharding.types import Storage

    tables = tables_for(seed)
    total = sum(Storage.of(t.rows, t.dim).total for t in tables)
    biggest = max(Storage.of(t.rows, t.dim).total for t in tables)
    # tight memory: the biggest tables fit on no single rank and must be cut
    mem = max(mem_frac * biggest, 1.6 * total / world)
    topo = Topology(world_size=world, ranks_per_node=per_node, memory_per_rank_gb=mem / 1e9)
    kw = {"time_budget_s": 0.3} if planner == "cubic" else {}
    plan = make_planner(planner, target="torchrec", **kw).plan(tables, topo, 256)
    assert plan.target == "torchrec"
    lay = torchrec_layout(plan)  # raises SpecError if any table is not expressible
    assert set(lay) == {t.name for t in tables}


def test_free_row_splits_are_not_exportable():
    """Without the target, a memory-tight plan cuts a table into 2 pieces of 8 ranks: export must refuse it."""
    from sharding.planners import HeuristicPlanner
    from sharding.types import Storage

    t = Table(name="big", rows=200_000, dim=64)
    small = [Table(name=f"s{i}", rows=1000, dim=16) for i in range(8)]
    mem = 0.6 * Storage.of(t.rows, t.dim).total
    plan = HeuristicPlanner("size_greedy").plan([t] + small, Topology(world_size=8, memory_per_rank_gb=mem / 1e9), 64)
    assert len([s for s in plan.shards if s.table == "big"]) == 2
    with pytest.raises(SpecError, match="table big: row-wise"):
        torchrec_layout(plan)
    fixed = HeuristicPlanner("size_greedy", target="torchrec").plan(
        [t] + small, Topology(world_size=8, memory_per_rank_gb=mem / 1e9), 64)
    assert torchrec_layout(fixed)["big"].sharding_type == "row_wise"


@needs_torchrec
def test_load_plan_gives_torchrec_sharding_plan(tmp_path):
    from torchrec.distributed.types import ShardingPlan

    from sharding.torchrec_adapter import load_plan

    plan = every_type_plan()
    path = plan.save(tmp_path / "plan.json")
    assert main(["shard", "export", str(path), "--out", str(tmp_path / "tr.json")]) == 0
    for src in (path, tmp_path / "tr.json"):
        sp = load_plan(src, module_path="sparse.ebc")
        assert isinstance(sp, ShardingPlan)
        ps = sp.plan["sparse.ebc"]
        assert ps["rw"].sharding_type == "row_wise" and len(ps["rw"].sharding_spec.shards) == 4
        assert ps["twrw"].ranks == [2, 3] and ps["dp"].sharding_spec is None
    doc = json.loads((tmp_path / "tr.json").read_text())
    assert doc["local_world_size"] == 2 and doc["world_size"] == 4


@needs_torchrec
def test_dmp_pooled_embeddings_equal_unsharded_for_every_type():
    """One spawn of 4 gloo processes (2 nodes of 2): TW, uneven CW, RW over all ranks (with an empty
    block), TWRW, DP, against the unsharded EmbeddingBagCollection with the same weights."""
    from cubic.runners.torchrec_runner import check_plan

    errs = check_plan(every_type_plan())
    assert set(errs) == {"tw", "cw", "rw", "rw_tiny", "twrw", "dp"}
    assert max(errs.values()) < 1e-5, errs


@needs_torchrec
@pytest.mark.slow
def test_dmp_runs_planner_output_and_trains(tmp_path):
    """Broader: cubic's and TorchRec's planners on 4 ranks / 2 nodes under memory pressure (row-wise,
    table-row-wise splits) checked in DMP, then a few training steps through the TorchRec runner."""
    from cubic.core.config import Config, ShardingChoice
    from cubic.core.spec import Workload
    from cubic.runners.torchrec_runner import TorchRecRunner, check_plan
    from sharding.registry import make_planner
    from sharding.types import Storage

    tables = tables_for(7, n=10)
    tables = [t.model_copy(update={"rows": min(t.rows, 50_000)}) for t in tables]
    total = sum(Storage.of(t.rows, t.dim).total for t in tables)
    biggest = max(Storage.of(t.rows, t.dim).total for t in tables)
    topo = Topology(world_size=4, ranks_per_node=2, memory_per_rank_gb=max(0.6 * biggest, 1.5 * total / 4) / 1e9)
    roomy = topo.model_copy(update={"memory_per_rank_gb": 1.0})  # TorchRec reserves 15% + fixed storage per rank
    kinds = set()
    for name, tp in (("cubic", topo), ("torchrec", roomy)):
        plan = make_planner(name, target="torchrec").plan(tables, tp, 64)
        kinds |= {s.sharding_type for s in plan.shards}
        errs = check_plan(plan)
        assert max(errs.values()) < 1e-5, (name, errs)
    assert kinds & {"row_wise", "table_row_wise"}, kinds
    wl = Workload(name="t", tables=tables, batch_size=64, topology=topo)
    res = TorchRecRunner(world_size=4).run(wl, Config(sharding=ShardingChoice(plan=plan.model_dump(mode="json"))),
                                           steps=4, warmup=1)
    assert res.ok, res.reason
    assert res.metrics["step_time_median_ms"] > 0 and set(res.phases_ms) >= {"embedding_fwd", "embedding_bwd"}


@needs_torchrec
@pytest.mark.slow
def test_cli_evaluate_with_torchrec_backend(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["shard", "plan", "--tables", "dlrm-small", "--world-size", "2", "--memory-gb", "2",
                 "--time-budget", "0.3", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["shard", "evaluate", str(out), "--backend", "torchrec", "--steps", "3", "--warmup", "1"]) == 0
    text = capsys.readouterr().out
    assert "measured on this CPU, 2 gloo processes" in text and "embedding_fwd" in text and "modelled" in text


@needs_torchrec
def test_load_plan_checks_the_jobs_world_and_local_size(tmp_path, monkeypatch):
    """A 4-rank plan in a 2-process job: one line naming WORLD_SIZE before TorchRec sees it (it used
    to crash inside tw_sharding.py); a table-row-wise plan in a job with another LOCAL_WORLD_SIZE too."""
    from sharding.torchrec_adapter import load_plan

    path = every_type_plan().save(tmp_path / "plan.json")
    assert main(["shard", "export", str(path), "--out", str(tmp_path / "tr.json")]) == 0
    for src in (path, tmp_path / "tr.json"):
        with pytest.raises(SpecError, match=r"for 4 ranks but this job has 2 \(WORLD_SIZE\)") as e:
            load_plan(src, world_size=2)
        assert len(str(e.value).splitlines()) == 1 and str(src) in str(e.value)
        monkeypatch.setenv("WORLD_SIZE", "4")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # the plan's table-row-wise table spans nodes of 2
        with pytest.raises(SpecError, match="'twrw' is table-row-wise over 2 ranks per node but this job has 4"):
            load_plan(src)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        with pytest.warns(UserWarning, match=r"without model= checks the plan against nothing"):  # said, not silent
            assert load_plan(src).plan[""]["twrw"].ranks == [2, 3]
        monkeypatch.delenv("WORLD_SIZE")
        monkeypatch.delenv("LOCAL_WORLD_SIZE")


def _model(tables, meta=True):
    """A job's model: the collection under ``sparse.ebc``, beside a dense layer (as TorchRec's DLRM)."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    m = torch.nn.Module()
    m.sparse = torch.nn.Module()
    m.sparse.ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=[f"f_{n}"]) for n, r, d in tables],
        device=torch.device("meta" if meta else "cpu"))
    m.dense = torch.nn.Linear(4, 4)
    return m


@needs_torchrec
@pytest.mark.parametrize("exported", [False, True])
def test_load_plan_checks_the_model_it_will_shard(tmp_path, exported):
    """A plan loaded with the job's model: the collection is found, or the one line names what does not
    fit (the path, a table either side lacks, rows or dim). Unchecked, DMP ran a wrong path without a
    word, leaving the tables unsharded (test_dmp_leaves_an_unnamed_collection_unsharded)."""
    from sharding.torchrec_adapter import load_plan

    plan = every_type_plan()
    path = plan.save(tmp_path / "plan.json")
    if exported:
        assert main(["shard", "export", str(path), "--out", str(tmp_path / "tr.json")]) == 0
        path = tmp_path / "tr.json"
    mine = [(t.name, t.rows, t.dim) for t in plan.tables]
    sp = load_plan(path, model=_model(mine))
    assert list(sp.plan) == ["sparse.ebc"] and set(sp.plan["sparse.ebc"]) == {t.name for t in plan.tables}
    assert list(load_plan(path, module_path="sparse.ebc", model=_model(mine)).plan) == ["sparse.ebc"]
    field = "parameters" if exported else "tables"
    cases = {
        "module_path: the model has no EmbeddingBagCollection or EmbeddingCollection at 'sparse_arch.ebc'":
            dict(module_path="sparse_arch.ebc", model=_model(mine)),
        "module_path: the model has no EmbeddingBagCollection or EmbeddingCollection at ''":
            dict(module_path="", model=_model(mine)),
        f"{field}: table 'dp' is in the plan but not in the model's 'sparse.ebc'": dict(model=_model(mine[:-1])),
        f"{field}: the model's 'sparse.ebc' has table 'extra'": dict(model=_model(mine + [("extra", 10, 4)])),
        f"{field}.rw: table 'rw': the plan places 943 rows x 8 dims, the model's 'sparse.ebc' has 944 x 8":
            dict(model=_model([(n, r + (n == "rw"), d) for n, r, d in mine])),
        f"{field}.cw: table 'cw': the plan places 50 rows x 24 dims, the model's 'sparse.ebc' has 50 x 32":
            dict(model=_model([(n, r, 32 if n == "cw" else d) for n, r, d in mine])),
    }
    for msg, kw in cases.items():
        with pytest.raises(SpecError) as e:
            load_plan(path, **kw)
        assert str(e.value).startswith(f"{path}: {msg}"), str(e.value)
        assert "\n" not in str(e.value)
    two = _model(mine)
    two.other = _model(mine).sparse.ebc
    with pytest.raises(SpecError, match="module_path: the model has 2 embedding collections .'sparse.ebc', 'other'."):
        load_plan(path, model=two)



def test_an_exports_shape_is_checked_before_the_model_is(tmp_path):
    """An export's ``shape`` decides the check against the model: one that is not two positive
    integers, or that the table's own shards overrun, is refused naming it (it was ignored and the
    shape read off the shards instead, where the rest of the export parser refuses)."""
    from sharding.torchrec_adapter import load_plan

    plan = every_type_plan()
    assert main(["shard", "export", str(plan.save(tmp_path / "plan.json")), "--out", str(tmp_path / "tr.json")]) == 0
    doc = json.loads((tmp_path / "tr.json").read_text())
    mine = [(t.name, t.rows, t.dim) for t in plan.tables]
    rows = doc["parameters"]["rw"]["shape"][0]
    for shape, why in ((["a", 8], "is not [rows, dim]"), ([rows, 8, 1], "is not [rows, dim]"), ([0, 8], "is not"),
                       ([True, 8], "is not"), ([rows - 1, 8], f"its shards cover {rows} x 8")):
        bad = json.loads(json.dumps(doc))
        bad["parameters"]["rw"]["shape"] = shape
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(SpecError) as e:
            load_plan(tmp_path / "bad.json", model=_model(mine))
        assert str(e.value).startswith(f"{tmp_path / 'bad.json'}: parameters.rw.shape: ") and why in str(e.value), e.value
    del doc["parameters"]["rw"]["shape"]  # an export before stop 60: read off the shards
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert set(load_plan(tmp_path / "old.json", model=_model(mine)).plan["sparse.ebc"]) == {t.name for t in plan.tables}


_UNNAMED = """
import json, os, sys
import torch, torch.distributed as dist
from torchrec.distributed import DistributedModelParallel
from cubic.runners.base import free_port
from sharding.torchrec_adapter import load_plan_dict
sys.path.insert(0, os.path.dirname(sys.argv[1]))
from test_sharding_torchrec import _model, plan_of, Shard, Table

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
dist.init_process_group("gloo", rank=0, world_size=1)
tables = [Table(name="t0", rows=100, dim=8), Table(name="t1", rows=50, dim=16)]
doc = json.loads(plan_of(tables, [Shard(table=t.name, sharding_type="table_wise", rank=0, rows=t.rows, cols=t.dim)
                                  for t in tables], 1, 1).model_dump_json())
out = {}
for path in ("sparse_arch.ebc", None):
    model = _model([(t.name, t.rows, t.dim) for t in tables])
    sp = load_plan_dict(doc, module_path=path, model=None if path else model, device="cpu")
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=sp)
    out[path or next(iter(sp.plan))] = type(dmp.module.sparse.ebc).__name__
dist.destroy_process_group()
print(json.dumps(out))
"""


@needs_torchrec
def test_dmp_leaves_an_unnamed_collection_unsharded():
    """Why the check above exists, on TorchRec itself (one gloo process): DMP given a plan for a path
    where the model has no collection runs, and its collection stays an unsharded
    EmbeddingBagCollection; at the path the check finds, DMP shards it."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _UNNAMED, __file__], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {
        "sparse_arch.ebc": "EmbeddingBagCollection", "sparse.ebc": "ShardedEmbeddingBagCollection"}
