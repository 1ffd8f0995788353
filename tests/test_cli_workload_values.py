"""A workload file's values a run or a plan cannot use are bad input at load (stop 57's probe of
workload files): one line naming the file and the field (or the flag), exit 2, nothing recorded.
Before: a table width FBGEMM refuses was a failed run (`cubic run`, exit 1, recorded) or a
47-line traceback (`cubic shard plan`); NaN read "should be <= 10000"; an unknown topology.device
or a missing topology.comm_calibration named neither the file nor the field, and the latter became
a failed run under `cubic run --world-size 2`."""

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
