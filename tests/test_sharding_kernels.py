"""Compute kernels and memory tiers per table: HBM (fused), UVM caching with a cache load factor
(hit rate from the table's Zipf access), UVM; exported as TorchRec's compute_kernel and
CacheParams and checked by TorchRec's own validation of the ParameterShardings."""

import json

import pytest

from cubic.cli.app import main
from cubic.core.spec import SpecError, Table, Topology
from sharding.kernels import KernelChoice, assign_kernels, zipf_hit_rate
from sharding.torchrec_adapter import torchrec_available
from sharding.types import Plan, Shard

needs_torchrec = pytest.mark.skipif(not torchrec_available(), reason="torchrec extra not installed")
MB = 1e6


def overfull_plan():
    """4 tables of ~26 MB on 2 ranks, 2 per rank: 52 MB a rank, for a 30 MB HBM."""
    T = [Table(name=f"t{i}", rows=100_000, dim=64, pooling_factor=float(1 + 4 * i)) for i in range(4)]
    S = [Shard(table=f"t{i}", sharding_type="table_wise", rank=i % 2, rows=100_000, cols=64) for i in range(4)]
    return Plan(planner="hand", world_size=2, group_size=2, batch_size=16,
                topology=Topology(world_size=2, ranks_per_node=2, device="h100", memory_per_rank_gb=0.2), tables=T,
                shards=S)


def test_hit_rate_follows_the_access_distribution():
    uni = Table(name="u", rows=10_000, dim=8, access={"zipf_alpha": 0.0})
    hot = Table(name="h", rows=10_000, dim=8, access={"zipf_alpha": 1.2})
    assert zipf_hit_rate(uni, 0.1) == pytest.approx(0.1, abs=1e-3)
    assert 0.1 < zipf_hit_rate(hot, 0.1) < 1.0 and zipf_hit_rate(hot, 0.2) > zipf_hit_rate(hot, 0.1)


def test_assign_kernels_fits_hbm_and_keeps_hot_tables_in_hbm():
    plan = overfull_plan()
    kernels = assign_kernels(plan, 30 * MB)
    # the colder table of each rank (t0 on rank 0, t1 on rank 1) is cached; the hotter stays fused
    assert set(kernels) == {"t0", "t1"} and all(k.compute_kernel == "fused_uvm_caching" for k in kernels.values())
    from sharding.kernels import hbm_bytes

    with_k = plan.model_copy(update={"kernels": kernels})
    for ss in with_k.rank_shards():
        used = sum(hbm_bytes(s.storage().weights_bytes, s.storage().optimizer_bytes,
                             with_k.kernels.get(s.table, KernelChoice())) for s in ss)
        assert used <= 30 * MB
    tiny = assign_kernels(plan, 1 * MB)  # no cache fits: every table to host memory (UVM)
    assert {k.compute_kernel for k in tiny.values()} == {"fused_uvm"} and len(tiny) == 4
    with pytest.raises(Exception):
        KernelChoice(compute_kernel="fused_uvm_caching")  # a cache needs its load factor


@needs_torchrec
def test_export_carries_kernels_and_passes_torchrecs_validation():
    from sharding.torchrec_adapter import to_torchrec, to_torchrec_json, validate_in_torchrec

    plan = overfull_plan()
    plan = plan.model_copy(update={"kernels": assign_kernels(plan, 30 * MB)})
    doc = to_torchrec_json(plan)
    p0 = doc["parameters"]["t0"]
    assert p0["compute_kernel"] == "fused_uvm_caching" and 0 < p0["cache_load_factor"] < 1
    assert doc["parameters"]["t3"]["compute_kernel"] == "fused"
    _, module_plan = to_torchrec(plan)
    assert module_plan["t0"].cache_params.load_factor == p0["cache_load_factor"]
    validate_in_torchrec(plan)  # TorchRec's validate_compute_kernels + validate_rank_assignment
    # TorchRec's own check really runs: a dense kernel on a table-wise table is refused by it
    bad = Plan.model_construct(**{**dict(plan), "kernels": {"t3": KernelChoice.model_construct(
        compute_kernel="dense", cache_load_factor=None, hit_rate=None)}})
    with pytest.raises(SpecError, match="DENSE kernel requires DATA_PARALLEL"):
        validate_in_torchrec(bad)


def test_plan_refuses_kernels_of_unknown_tables():
    plan = overfull_plan()
    with pytest.raises(Exception, match="kernel"):
        Plan.model_validate({**plan.model_dump(), "kernels": {"nope": {"compute_kernel": "fused_uvm"}}})


def _tiered_plan(tmp_path, device: str, *extra: str):
    """`shard plan --hbm-gb` of four tables on 2 ranks of ``device``; the plan's path."""
    csv = tmp_path / "t.csv"
    csv.write_text("name,rows,dim,pooling_factor,zipf_alpha\n"
                   + "".join(f"t{i},100000,64,{1 + 4 * i},1.1\n" for i in range(4)))
    out = tmp_path / "p.json"
    assert main(["shard", "plan", "--tables", str(csv), "--world-size", "2", "--memory-gb", "0.2", "--device", device,
                 "--planner", "size_greedy", "--hbm-gb", "0.03", *extra, "--out", str(out)]) == 0
    return out


def test_cli_plan_with_hbm_tiers(tmp_path, capsys):
    out = _tiered_plan(tmp_path, "h100")
    text = capsys.readouterr().out
    assert "fused_uvm_caching" in text and "load factor" in text
    doc = json.loads(out.read_text())
    assert doc["kernels"] and all(v["compute_kernel"] != "fused" for v in doc["kernels"].values())


def test_tiers_are_priced_by_the_plan_cost_on_a_gpu():
    from cost_models.comm import CommModel
    from sharding.estimate import GpuEstimator, plan_cost

    plan = overfull_plan()
    est, comm = GpuEstimator("h100"), CommModel.from_topology(plan.topology)
    base = plan_cost(plan, est, comm)
    tiered = plan_cost(plan.model_copy(update={"kernels": assign_kernels(plan, 30 * MB)}), est, comm)
    host = plan_cost(plan.model_copy(update={"kernels": assign_kernels(plan, 1 * MB)}), est, comm)
    # PCIe misses cost more than HBM reads; every table in host memory costs the most
    assert base.max_ms < tiered.max_ms < host.max_ms


def test_tiers_are_re_priced_by_the_model_the_user_gave(tmp_path):
    """--hbm-gb re-predicts the tiered plan: with --model, by that model (it once used the default)."""
    from pathlib import Path

    xeon = Path(__file__).resolve().parent.parent / "experiments" / "data" / "sharding_cost_model_intel_xeon.json"
    out = _tiered_plan(tmp_path, "cpu", "--model", str(xeon), "--no-check")
    doc = json.loads(out.read_text())
    assert doc["kernels"] and "Xeon" in doc["predicted"]["details"]["compute"]


def test_tiered_plan_table_says_hbm_plus_host_and_shows_hbm(tmp_path, capsys):
    """With --hbm-gb, the column headed "HBM GiB" held weights + optimizer wherever they lived (HBM + host)."""
    from sharding.types import format_plan, load_plan

    out = _tiered_plan(tmp_path, "h100")
    capsys.readouterr()
    plan = load_plan(out)
    lines = format_plan(plan).splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("rank "))
    header = lines[i].split("  ")
    cols = [c.strip() for c in header if c.strip()]
    assert "HBM+host GiB" in cols and "HBM GiB" in cols
    total, hbm = cols.index("HBM+host GiB"), cols.index("HBM GiB")
    for row in lines[i + 1:i + 1 + plan.group_size]:
        vals = row.split()
        assert float(vals[hbm]) <= 0.03e9 / 2**30 + 1e-4 < float(vals[total])  # HBM within --hbm-gb, the rest host
    untiered = format_plan(plan.model_copy(update={"kernels": {}}))
    assert "HBM GiB" in untiered and "HBM+host" not in untiered


def test_the_cache_hit_rate_is_said_unchecked_while_the_gpu_file_has_no_measurement():
    # the legend's words follow results/gpu_checks.json: every UVM-caching case there failed to run
    import json
    from pathlib import Path

    import sharding.types as types

    cases = json.loads((Path(__file__).resolve().parent.parent / "results" / "gpu_checks.json").read_text())
    measured = [c for c in cases.get("sharding_uvm_caching") or [] if "failed" not in c]
    said = "never checked on a GPU" in Path(types.__file__).read_text()
    assert said == (not measured)
