"""The real multi-process runner: the workload's dense model over embeddings sharded table-, column-,
row-wise and data-parallel, trained by 2 gloo processes with real all-to-alls, started by
DistributedRunner or by torchrun (one worker), matches the single-process run of the same seed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cubic.core.config import Config, ShardingChoice
from cubic.core.spec import DataSpec, DLRMArch, Table, Topology, Workload
from cubic.core.workloads import DEFAULT_WORKLOADS
from cubic.runners.distributed import EARLY_STEPS, LOSS_RTOL, NE_RTOL, DistributedRunner
from sharding.types import Plan, Shard

ROOT = Path(__file__).resolve().parents[1]
SMALL = Workload(
    name="five-tables",
    tables=[Table(name=f"t{i}", rows=400 * (i + 1), dim=16, pooling_factor=2.0) for i in range(5)],
    dense_arch=DLRMArch(bottom_mlp=[16, 16], top_mlp=[32, 1]),
    batch_size=32,
    data=DataSpec(num_dense_features=4, eval_batch_size=256),
)


def mixed_plan(wl, world=2, batch=32) -> Plan:
    t = wl.tables
    c = max(4, t[1].dim // 2 // 4 * 4)  # column pieces in multiples of 4
    shards = [
        Shard(table=t[0].name, sharding_type="table_wise", rank=0, rows=t[0].rows, cols=t[0].dim),
        Shard(table=t[1].name, sharding_type="column_wise", rank=0, rows=t[1].rows, cols=c),
        Shard(table=t[1].name, sharding_type="column_wise", rank=1, rows=t[1].rows, col_offset=c, cols=t[1].dim - c),
        Shard(table=t[2].name, sharding_type="row_wise", rank=1, rows=t[2].rows // 2, cols=t[2].dim),
        Shard(table=t[2].name, sharding_type="row_wise", rank=0, row_offset=t[2].rows // 2,
              rows=t[2].rows - t[2].rows // 2, cols=t[2].dim),
    ]
    shards += [Shard(table=x.name, sharding_type="data_parallel", rank=r, rows=x.rows, cols=x.dim)
               for x in t[3:4] for r in range(world)]
    shards += [Shard(table=x.name, sharding_type="table_wise", rank=i % world, rows=x.rows, cols=x.dim)
               for i, x in enumerate(t[4:])]
    return Plan(planner="hand", world_size=world, group_size=world, batch_size=batch,
                topology=Topology(world_size=world, ranks_per_node=world), tables=list(t), shards=shards)


def _config(wl, batch):
    return Config(batch_size=batch, sharding=ShardingChoice(planner="hand",
                                                            plan=mixed_plan(wl, batch=batch).model_dump(mode="json")))


def _check_matches(res, steps_total):
    assert res.ok, res.reason
    m = res.metrics
    assert m["matches_single_process"] == 1.0
    assert m["loss_max_rel_diff_vs_single_process"] <= LOSS_RTOL
    assert m["ne_end_rel_diff_vs_single_process"] <= NE_RTOL
    ref = res.extra["single_process"]
    assert len(ref["losses"]) == len(res.extra["train_losses"]) == steps_total
    # not the same numbers by construction: another process, another kernel, another summation order
    assert res.extra["train_losses"][:EARLY_STEPS] != pytest.approx(ref["losses"][:EARLY_STEPS], rel=0, abs=0)


def test_mixed_plan_on_two_processes_matches_one_process():
    res = DistributedRunner(world_size=2, timeout_s=300).run(SMALL, _config(SMALL, 32), steps=12, warmup=2)
    _check_matches(res, 14)
    assert set(res.extra["shard_types"]) == {"table_wise", "column_wise", "row_wise", "data_parallel"}
    assert res.metrics["world_size"] == 2 and res.extra["global_batch"] == 64
    for k in ("examples_per_s", "examples_per_s_ci_lo", "examples_per_s_ci_hi", "step_time_median_ms",
              "step_time_ci_lo_ms", "step_time_ci_hi_ms", "peak_mem_bytes", "cpu_util", "load_avg_1m_start",
              "load_avg_1m_end", "comm_time_median_ms"):
        assert k in res.metrics and res.metrics[k] >= 0, k
    assert res.metrics["comm_time_median_ms"] > 0 and res.phases_ms["communication"] > 0
    assert res.metrics["ne_end"] < res.metrics["ne_start"]
    assert [t["step"] for t in res.trajectory][0] == 0 and res.trajectory[-1]["step"] == 14
    assert res.fingerprint["world_size"] == 2 and res.fingerprint["runner"] == "distributed"


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_torchrun_starts_the_same_worker(tmp_path):
    wl_path, plan_path, out = tmp_path / "wl.json", tmp_path / "plan.json", tmp_path / "r.json"
    wl_path.write_text(SMALL.model_dump_json())
    plan_path.write_text(mixed_plan(SMALL).model_dump_json())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "cubic.runners.launch", "--workload", str(wl_path), "--plan", str(plan_path),
           "--steps", "10", "--warmup", "1", "--threads", "1", "--json", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from cubic.core.result import Result

    res = Result.model_validate(json.loads(out.read_text()))
    _check_matches(res, 11)
    assert res.extra["world_size"] == 2 and res.extra["backend"] == "gloo"


def test_bad_inputs_are_invalid_not_a_crash():
    cfg = _config(SMALL, 32)
    res = DistributedRunner(world_size=4).run(SMALL, cfg, steps=2)
    assert not res.ok and res.failure_kind == "invalid" and "2 ranks" in res.reason
    other = SMALL.model_copy(update={"tables": [*SMALL.tables[:4], Table(name="t4", rows=7, dim=16)]})
    res = DistributedRunner(world_size=2).run(other, cfg, steps=2)
    assert res.failure_kind == "invalid" and "t4" in res.reason
    res = DistributedRunner(world_size=2).run(SMALL, cfg.model_copy(update={"batch_size": 48}), steps=2)
    assert res.failure_kind == "invalid" and "batch" in res.reason


def test_launch_bad_plan_file_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps({"version": 1, "planner": "x"}))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "cubic.runners.launch", "--workload", "dlrm-small",
                           "--plan", str(bad)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and str(bad) in proc.stderr


def test_launch_refuses_a_misfit_before_any_process_group(tmp_path):
    """Under torchrun, a plan for another number of ranks or a config group that does not divide them
    was a failed Result written by rank 0 (exit 1); now every rank exits 2 with one line naming the
    file, the field and WORLD_SIZE, before a process group starts, and no result is written."""
    plan, cfg, out = tmp_path / "plan.json", tmp_path / "c.yaml", tmp_path / "r.json"
    plan.write_text(mixed_plan(SMALL).model_dump_json())  # for 2 ranks
    cfg.write_text("sharding: {planner: greedy, group_size: 3}\n")
    wl = tmp_path / "wl.json"
    wl.write_text(SMALL.model_dump_json())
    env = dict(os.environ, PYTHONPATH=str(ROOT), WORLD_SIZE="4", RANK="1")
    for extra, needles in ((["--plan", str(plan)], (str(plan), "world_size", "plan is for 2 ranks")),
                           (["--config", str(cfg)], (str(cfg), "sharding.group_size", "WORLD_SIZE 4"))):
        proc = subprocess.run([sys.executable, "-m", "cubic.runners.launch", "--workload", str(wl), *extra,
                               "--json", str(out)], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert all(n in proc.stderr for n in needles), proc.stderr
        assert not out.exists()


def test_one_sync_rule_for_a_config_and_a_plan():
    """Replica sync without a 2D group: the same rule (cubic.runners.base.sync_misfit) and words when
    a config is loaded and when a --plan is checked against it (they were written twice)."""
    from cubic.runners.base import sync_misfit
    from cubic.runners.distributed import check_plan

    plan = mixed_plan(SMALL)  # 2 ranks in one group: 1D
    cfg = Config(batch_size=plan.batch_size, sharding=ShardingChoice(sync="weights"))
    why = check_plan(SMALL, plan, 2, cfg)
    assert why.field == "sharding.sync" and why.in_config and why == sync_misfit(cfg.sharding, 2, 2)[1]
    assert "keeps 2D replicas in step" in why and sync_misfit(cfg.sharding, 1, 2) is None


@pytest.mark.slow  # 2 x 200 steps distributed plus 200 single-process steps per workload
@pytest.mark.parametrize("name", ["dlrm-small", "wukong-small"])
def test_200_steps_fall_and_match_single_process(name):
    wl = DEFAULT_WORKLOADS[name]
    res = DistributedRunner(world_size=2, timeout_s=1800, verify=True).run(wl, _config(wl, 512), steps=200, warmup=0)
    _check_matches(res, 200)
    traj = res.trajectory
    assert traj[-1]["ne"] < traj[0]["ne"] and traj[-1]["loss"] < traj[0]["loss"]
    assert traj[-1]["ne"] < traj[1]["ne"]  # still falling after the first evaluation, not only the first jump


@pytest.mark.slow  # ~30 s on the shared machine; the runner it wires up is tested fast above
def test_cubic_run_world_size_two(tmp_path):
    from cubic.cli.app import main
    from cubic.core.result import Result

    wl_path, plan_path, out = tmp_path / "wl.json", tmp_path / "plan.json", tmp_path / "r.json"
    wl_path.write_text(SMALL.model_dump_json())
    plan_path.write_text(mixed_plan(SMALL).model_dump_json())
    store = f"sqlite:///{tmp_path}/t.db"
    code = main(["run", "--workload", str(wl_path), "--world-size", "2", "--plan", str(plan_path), "--steps", "6",
                 "--warmup", "1", "--json", str(out), "--store", store])
    assert code == 0
    res = Result.model_validate_json(out.read_text())
    assert res.ok and res.extra["world_size"] == 2 and res.metrics["matches_single_process"] == 1.0
    assert res.config_hash != Config().content_hash()  # the plan is part of the config


@pytest.mark.parametrize("argv, words", [
    (["--plan", "PLAN"], "--world-size of 2"),  # a plan with one process
    (["--world-size", "4", "--plan", "PLAN"], "2 ranks"),  # a plan for another size
])
def test_cubic_run_bad_world_size_is_exit_2(tmp_path, capsys, argv, words):
    from cubic.cli.app import main

    plan_path = tmp_path / "plan.json"
    plan_path.write_text(mixed_plan(SMALL).model_dump_json())
    wl_path = tmp_path / "wl.json"
    wl_path.write_text(SMALL.model_dump_json())
    argv = [str(plan_path) if a == "PLAN" else a for a in argv]
    code = main(["run", "--workload", str(wl_path), *argv, "--store", f"sqlite:///{tmp_path}/t.db"])
    err = capsys.readouterr().err
    assert code == 2 and words in err and err.count("\n") == 1
