"""A workload file's values a run or a plan cannot use are bad input at load (stop 57's probe of
workload files): one line naming the file and the field (or the flag), exit 2, nothing recorded.
Before: a table width FBGEMM refuses was a failed run (`cubic run`, exit 1, recorded) or a
47-line traceback (`cubic shard plan`); NaN read "should be <= 10000"; an unknown topology.device
or a missing topology.comm_calibration named neither the file nor the field, and the latter became
a failed run under `cubic run --world-size 2`."""

import json

import pytest
import yaml

from cubic.cli import app as cli
from cubic.core.spec import SpecError, Table
from cubic.core.store import TrialStore
from cubic.core.workloads import load_workload


pytestmark = pytest.mark.usefixtures("isolated")  # tests/conftest.py: a fresh directory and store


def _workload(tmp_path, edit) -> str:
    doc = load_workload("dlrm-small").model_dump(mode="json")
    edit(doc)
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(doc))
    return "w.yaml"


def _one_line(err: str, *needles: str) -> None:
    line = err.strip()
    assert "\n" not in line and line.startswith("cubic: error:"), line
    for n in needles:
        assert n in line, (n, line)


def test_a_table_width_fbgemm_refuses_is_named_at_load():
    with pytest.raises(ValueError, match="multiple of 4"):
        Table(name="t", rows=10, dim=6)
    assert Table(name="t", rows=10, dim=8).dim == 8


@pytest.mark.parametrize("edit, field, needle", [
    (lambda d: d["tables"][0].update(dim=6), "tables.0.dim", "multiple of 4"),
    (lambda d: d["tables"][0].update(pooling_factor=float("nan")), "tables.0.pooling_factor", "finite number"),
    (lambda d: d["topology"].update(memory_per_rank_gb=float("inf")), "topology.memory_per_rank_gb", "finite"),
    (lambda d: d["topology"].update(device="tpu"), "topology.device", "unknown device 'tpu'"),
    (lambda d: d["topology"].update(comm_calibration="nope.json"), "topology.comm_calibration", "no such"),
])
def test_cubic_run_and_shard_plan_refuse_the_value(tmp_path, capsys, isolated, edit, field, needle):
    w = _workload(tmp_path, edit)
    for argv in (["run", "--workload", w, "--world-size", "2", "--steps", "2", "--warmup", "0"],
                 ["shard", "plan", "--tables", w, "--world-size", "2", "--no-check"]):
        assert cli.main(argv) == 2, argv
        _one_line(capsys.readouterr().err, w, field, needle)
    assert TrialStore(isolated).count() == 0


def test_the_device_flag_is_named_when_it_gave_the_device(capsys):
    assert cli.main(["shard", "plan", "--tables", "dlrm-small", "--world-size", "2", "--device", "tpu"]) == 2
    _one_line(capsys.readouterr().err, "--device", "unknown device 'tpu'")
    assert cli.main(["fp8", "model", "--device", "nope.yaml", "--m", "64", "--k", "64", "--n", "64"]) == 2
    _one_line(capsys.readouterr().err, "--device", "no such device file")


def test_a_missing_calibration_names_the_field_where_the_comm_model_reads_it():
    from cost_models.comm import CommModel

    with pytest.raises(SpecError, match=r"nope.json: topology.comm_calibration: no such calibration file"):
        CommModel.calibrated("nope.json")


def test_a_calibration_beside_the_workload_is_read_from_any_directory(tmp_path, monkeypatch, capsys):
    """A relative topology.comm_calibration (or device file) is read beside the workload file: it
    was read from the working directory, so the same workload failed from another one."""
    import shutil

    from cost_models.comm import CALIBRATION_PATH

    d = tmp_path / "job"
    d.mkdir()
    shutil.copy(CALIBRATION_PATH, d / "cal.json")
    doc = load_workload("dlrm-small").model_dump(mode="json")
    doc["topology"].update(comm_calibration="cal.json", comm_model="calibrated")
    (d / "w.yaml").write_text(yaml.safe_dump(doc))
    wl = load_workload("job/w.yaml")
    assert wl.topology.comm_calibration == str(tmp_path.joinpath("job", "cal.json").relative_to(tmp_path))
    assert cli.main(["shard", "plan", "--tables", "job/w.yaml", "--world-size", "2", "--no-check"]) == 0
    capsys.readouterr()
    (d / "cal.json").unlink()  # missing: the line names the workload file, the field and the path it read
    assert cli.main(["shard", "plan", "--tables", "job/w.yaml", "--world-size", "2", "--no-check"]) == 2
    _one_line(capsys.readouterr().err, "job/w.yaml: topology.comm_calibration", "'job/cal.json'")


def test_a_missing_calibration_flag_is_named_by_the_one_rule(capsys):
    assert cli.main(["shard", "plan", "--tables", "dlrm-small", "--world-size", "2", "--no-check",
                     "--comm-calibration", "nope.json"]) == 2
    _one_line(capsys.readouterr().err, "nope.json: --comm-calibration: no such calibration file")


def test_one_group_rule_at_every_site_that_checks_it(tmp_path, capsys):
    """A group that does not divide the world: the same rule (cubic.core.spec.group_misfit) and
    message in the CLI's config check, the planner, a plan file and the step model."""
    from cubic.core.spec import check_group_size, group_misfit
    from cubic.runners.sim import default_config
    from cubic.runners.step_model import predict_step
    from cost_models.hardware import CLUSTERS
    from sharding.planners import planner_context

    assert group_misfit(2, 4) is None and group_misfit(4, 4) is None
    assert [bool(group_misfit(g, 4)) for g in (0, 3, 8)] == [True, True, True]
    with pytest.raises(SpecError, match=r"w.yaml: sharding.group_size: a group of 3 ranks must divide --world-size 4"):
        check_group_size(3, 4, source="w.yaml", world_flag="--world-size")
    wl = load_workload("dlrm-small")
    with pytest.raises(SpecError, match=r"group_size: a group of 3 ranks must divide the world size 4"):
        planner_context(wl.tables, wl.topology.model_copy(update={"world_size": 4}), 64, 3, None)
    cfg = default_config()
    cfg = cfg.model_copy(update={"sharding": cfg.sharding.model_copy(update={"group_size": 3})})
    with pytest.raises(SpecError, match=r"sharding.group_size: a group of 3 ranks must divide the world size 4"):
        predict_step(wl, cfg, CLUSTERS["h100"], 4)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"sharding": {"group_size": 3}}))
    assert cli.main(["run", "--workload", "dlrm-small", "--config", "c.yaml", "--world-size", "4",
                     "--steps", "2", "--warmup", "0"]) == 2
    _one_line(capsys.readouterr().err, "c.yaml: sharding.group_size: a group of 3 ranks must divide --world-size 4")
    assert cli.main(["shard", "plan", "--tables", "dlrm-small", "--world-size", "4", "--no-check", "--out", "p.json"]) == 0
    plan = json.loads((tmp_path / "p.json").read_text())
    (tmp_path / "p3.json").write_text(json.dumps(plan | {"group_size": 3}))
    capsys.readouterr()
    assert cli.main(["shard", "evaluate", "p3.json"]) == 2  # pydantic's "Value error, " prefix gone, the field named
    _one_line(capsys.readouterr().err, "p3.json: group_size: a group of 3 ranks must divide the world size 4")


def test_sim_predict_names_the_config_file_of_a_value_the_cluster_cannot_run(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"sharding": {"group_size": 3}}))
    assert cli.main(["sim", "predict", "--workload", "dlrm-small", "--config", "c.yaml", "--simulate", "h100x8"]) == 2
    _one_line(capsys.readouterr().err, "c.yaml: sharding.group_size: a group of 3 ranks must divide the world size 8")
