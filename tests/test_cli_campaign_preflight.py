"""What `cubic campaign run` can know before its first run is checked before it (stop 58's probe):
an unknown --warm-start campaign was found after the baseline had run and been stored; a Ray
address where nothing answers made every run a failed run, stored as the configuration's own
failure (an "error") and served to every later campaign as its result."""

import pytest

from cubic.cli import app as cli
from cubic.core.store import TrialStore

pytestmark = pytest.mark.usefixtures("isolated")  # tests/conftest.py: a fresh directory and store

RUN = ["campaign", "run", "--workload", "dlrm-small", "--name", "c", "--simulate", "h100x8", "--budget", "2",
       "--storage", "sqlite:///c.db"]


def _one_line(err: str, *needles: str) -> None:
    line = err.strip()
    assert "\n" not in line and line.startswith("cubic: error:"), line
    for n in needles:
        assert n in line, (n, line)


def test_an_unknown_warm_start_campaign_is_refused_before_the_baseline(tmp_path, capsys, isolated):
    assert cli.main([*RUN, "--warm-start", "nope"]) == 2
    _one_line(capsys.readouterr().err, "--warm-start", "no campaign 'nope'")
    assert TrialStore(isolated).count() == 0 and not (tmp_path / "c.db").exists()


def test_a_ray_address_where_nothing_answers_is_bad_input_at_once(tmp_path, capsys, isolated):
    assert cli.main([*RUN, "--ray-address", "127.0.0.1:1"]) == 2
    _one_line(capsys.readouterr().err, "--ray-address", "nothing answers at 127.0.0.1:1")
    assert TrialStore(isolated).count() == 0 and not (tmp_path / "c.db").exists()


def test_a_ray_cluster_that_cannot_be_reached_is_an_infrastructure_fault_not_the_configs():
    """Transient (``killed``: retried, never served from the store as the configuration's result)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray instance is already joined in this process")
    from cubic.core.config import Config
    from cubic.core.workloads import load_workload
    from cubic.runners.ray_runner import RayRunner
    from cubic.runners.sim import SimulatedRunner

    res = RayRunner(SimulatedRunner.from_spec("h100x8"), address="not-an-address").run(load_workload("dlrm-small"),
                                                                                        Config(), steps=2, warmup=0)
    assert not res.ok and res.failure_kind == "killed" and "infrastructure fault" in res.reason
