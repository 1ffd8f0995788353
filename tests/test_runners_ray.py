"""RayRunner against a real Ray head that this test starts on loopback (and stops by its own pid)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cubic.core.config import Config
from cubic.core.result import Result
from cubic.core.workloads import DEFAULT_WORKLOADS
from cubic.testing import stand_in_runner

pytestmark = pytest.mark.slow  # starting a Ray head takes tens of seconds on a busy 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    ray_bin = Path(sys.executable).parent / "ray"
    if not ray_bin.exists():
        pytest.skip("Ray is not installed (pip install 'cubic[ray]')")
    port = _free_port()
    temp = Path("/tmp") / f"rc{os.getpid()}"  # short: Ray's socket paths must stay under 107 chars
    cmd = [str(ray_bin), "start", "--head", "--block", f"--port={port}", "--num-cpus=1",
           "--node-ip-address=127.0.0.1", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"]
    log = tmp_path_factory.mktemp("ray") / "head.log"
    # a loopback test cluster without token authentication: Ray >= 2.5x turns it on for `ray start`
    # when ~/.ray/auth_token exists (any earlier Ray session may leave one), and this driver would be refused
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True, env=env)
    address = f"127.0.0.1:{port}"
    import ray

    deadline = time.time() + 120
    err = None
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        try:
            ray.init(address=address, log_to_driver=False)
            err = None
            break
        except Exception as e:  # not up yet
            err = e
            time.sleep(2)
    if not ray.is_initialized():
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
        # Ray is installed: a head that does not start is a failure, not a skip (a skip hid one: see
        # RAY_AUTH_MODE above)
        pytest.fail(f"Ray head did not start: {err}; log: {log.read_text()[-500:]}")
    yield address
    ray.shutdown()
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # our head and the processes it started, nothing else
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(temp, ignore_errors=True)


def test_runs_execute_on_ray_workers_and_lost_workers_are_transient(ray_head):
    from cubic.runners.ray_runner import RayRunner

    wl = DEFAULT_WORKLOADS["dlrm-small"]
    r = RayRunner(stand_in_runner(), address=ray_head, num_cpus=1).run(wl, Config(batch_size=64), steps=2, warmup=0)
    assert r.ok and r.metrics["examples_per_s"] == 64000.0
    assert r.metrics["pid"] != os.getpid() and r.extra["ray"]["address"] == ray_head
    bad = RayRunner(stand_in_runner(crash=True), address=ray_head).run(wl, Config(), steps=2, warmup=0)
    assert not bad.ok and bad.failure_kind == "killed" and bad.transient


def test_a_run_that_never_gets_a_node_is_an_infrastructure_fault_not_a_timeout(ray_head):
    # the head has 1 CPU: a run asking for 4 never starts; that is not the configuration's timeout
    from cubic.runners.ray_runner import RayRunner

    wl = DEFAULT_WORKLOADS["dlrm-small"]
    r = RayRunner(stand_in_runner(), address=ray_head, num_cpus=4, start_timeout_s=3).run(wl, Config(), steps=2,
                                                                                         warmup=0)
    assert not r.ok and r.failure_kind == "killed" and r.transient, r.reason
    assert "never started" in r.reason and "not this configuration's" in r.reason
    # a run that starts and then runs too long is the configuration's timeout, counted from its start
    slow = RayRunner(stand_in_runner(delay_s=30), address=ray_head, num_cpus=1, timeout_s=2, start_timeout_s=60)
    r = slow.run(wl, Config(), steps=2, warmup=0)
    assert r.failure_kind == "timeout" and "of the run's start" in r.reason, r.reason


def test_a_campaign_validates_on_ray(ray_head):
    from cubic.codesign.campaign import Campaign
    from cubic.codesign.evaluate import RunnerEvaluate
    from cubic.runners.ray_runner import RayRunner
    from search.space import Space

    wl = DEFAULT_WORKLOADS["dlrm-small"]
    space = Space.model_validate({"parameters": [{"name": "batch_size", "type": "categorical",
                                                  "choices": [32, 64, 128, 256, 512]}]})
    ev = RunnerEvaluate(wl, RayRunner(stand_in_runner(), address=ray_head), space, steps=2, warmup=0)
    s = Campaign(space, ev, strategy="random", budget=4, batch_size=2, workers=2).run()
    assert s.runs == 4 and s.best_metrics["examples_per_s"] >= 128000.0
