import pytest

from cubic.core.config import Config, FP8Choice, Kernels, ShardingChoice
from cubic.runners.local import PHASES, Fault, LocalRunner, validate_config
from cubic.core.spec import DataSpec, DLRMArch, Table, Workload
from cubic.core.workloads import DEFAULT_WORKLOADS

TINY = Workload(
    name="tiny",
    tables=[Table(name="a", rows=500, dim=8, pooling_factor=2.0), Table(name="b", rows=2000, dim=4, pooling_factor=1.0)],
    dense_arch=DLRMArch(bottom_mlp=[16, 8], top_mlp=[16, 1]),
    batch_size=64,
    data=DataSpec(num_dense_features=4, eval_batch_size=256),
)


@pytest.fixture
def faults(monkeypatch):
    monkeypatch.setenv("CUBIC_ALLOW_FAULTS", "1")


def test_ok_run_reports_everything():
    seen = []
    r = LocalRunner(timeout_s=300, threads=1).run(TINY, Config(seed=3), steps=4, warmup=1,
                                                  progress=lambda d, t: seen.append((d, t)))
    assert r.ok, r.reason
    assert r.source == "measured" and r.workload == "tiny" and r.seed == 3
    assert r.workload_hash == TINY.content_hash() and r.config_hash == Config(seed=3).content_hash()
    for key in ("examples_per_s", "step_time_median_ms", "step_time_p90_ms", "peak_mem_bytes",
                "loss_start", "loss_end", "ne_start", "ne_end"):
        assert r.metrics[key] > 0, key
    assert r.metrics["step_time_p90_ms"] >= r.metrics["step_time_median_ms"]
    assert set(r.phases_ms) == set(PHASES) and r.phases_ms["communication"] == 0.0
    assert r.phases_ms["embedding_fwd"] > 0 and r.phases_ms["dense_bwd"] > 0
    assert r.trajectory[0]["step"] == 0 and r.trajectory[-1]["step"] == 5
    assert r.trajectory[-1]["ne"] == r.metrics["ne_end"]
    assert r.fingerprint["device"] == "cpu" and len(r.fingerprint_hash) == 16 and "torch" in r.versions
    # one timed step in PHASE_EVERY times the phases, the others the step as a whole
    assert r.extra["threads"] == 1 and r.extra["phase_steps"] == [2] and len(r.extra["step_times_ms"]) == 3
    assert len(r.extra["step_preempted"]) == 3 and 0 <= r.metrics["steps_preempted_frac"] <= 1
    # the machine's own speed around the run, and what the hypervisor took (NaN where not counted)
    assert r.metrics["speed_probe_ms"] > 0
    for key in ("steal_frac", "others_busy_frac"):
        v = r.metrics[key]
        assert v != v or 0 <= v <= 1, (key, v)
    assert seen and seen[-1] == (5, 5)
    assert r.wall_time_s > 0


def test_faults_refused_without_opt_in(monkeypatch):
    monkeypatch.delenv("CUBIC_ALLOW_FAULTS", raising=False)
    with pytest.raises(ValueError, match="CUBIC_ALLOW_FAULTS"):
        LocalRunner(fault=Fault(kind="raise"))


@pytest.mark.parametrize(
    "fault, kind, words",
    [
        (Fault(kind="raise", at_step=1), "error", "injected fault"),
        (Fault(kind="nan", at_step=2), "nan", "nan"),
        (Fault(kind="oom", at_step=0), "oom", "alloc"),
        (Fault(kind="kill", at_step=0), "killed", "SIGKILL"),
    ],
)
def test_failures_come_back_as_results(faults, fault, kind, words):
    config = Config(kernels=Kernels(embedding="torch"))  # skips importing fbgemm: a faster child
    r = LocalRunner(timeout_s=300, threads=1, fault=fault).run(TINY, config, steps=3, warmup=1)
    assert r.status == "failed" and r.failure_kind == kind, (r.failure_kind, r.reason)
    assert words.lower() in r.reason.lower()
    assert r.workload == "tiny" and r.config_hash == config.content_hash()


def test_nan_between_loss_checks_is_caught_and_named(faults):
    # the losses are read back every few steps, not every step: the run still fails as nan, naming the step
    config = Config(kernels=Kernels(embedding="torch"))
    r = LocalRunner(timeout_s=300, threads=1, fault=Fault(kind="nan", at_step=3)).run(TINY, config, steps=30, warmup=1)
    assert r.failure_kind == "nan" and "at step 3" in r.reason, r.reason


def test_hang_times_out(faults):
    r = LocalRunner(timeout_s=6, threads=1, fault=Fault(kind="hang")).run(TINY, Config(), steps=3, warmup=0)
    assert r.failure_kind == "timeout" and r.transient
    assert r.wall_time_s < 30


def test_memory_limit_gives_oom():
    big = TINY.model_copy(update={"tables": [Table(name="huge", rows=50_000_000, dim=16, pooling_factor=1.0)]})
    r = LocalRunner(timeout_s=300, threads=1, memory_limit_bytes=256 * 2**20).run(big, Config(), steps=2, warmup=0)
    assert r.failure_kind == "oom", (r.failure_kind, r.reason)


def test_invalid_configs_rejected_without_a_child():
    runner = LocalRunner(timeout_s=300)
    r = runner.run(TINY, Config(sharding=ShardingChoice(planner="greedy")), steps=2)
    assert r.failure_kind == "invalid" and "--world-size" in r.reason
    r = runner.run(TINY, Config(model={"no_such_knob": 3}), steps=2)
    assert r.failure_kind == "invalid" and "no_such_knob" in r.reason
    r = runner.run(TINY, Config(), steps=0)
    assert r.failure_kind == "invalid"


def test_fp8_needs_its_runtime():
    why = validate_config(TINY, Config(fp8=FP8Choice(policy="all")))
    from importlib.util import find_spec

    if find_spec("fp8.runtime") is None:
        assert why and "fp8.runtime" in why
    else:
        assert why is None


def test_error_in_child_is_reported():
    # an exception the runner did not plan for: an unknown device string reaches torch in the child
    r = LocalRunner(timeout_s=300, device="cuda:99").run(TINY, Config(), steps=1, warmup=0)
    assert r.status == "failed" and r.failure_kind == "error" and r.reason


@pytest.mark.slow
def test_wukong_small_300_steps_lowers_ne():
    r = LocalRunner(timeout_s=1800).run(DEFAULT_WORKLOADS["wukong-small"], Config(), steps=300)
    assert r.ok, r.reason
    assert r.metrics["ne_end"] < r.metrics["ne_start"] - 0.1, r.metrics
    assert r.metrics["ne_end"] < 1.0


def test_child_dies_with_its_parent(tmp_path):
    # a caller killed outright (SIGKILL, no cleanup) must not leave its run training as an orphan
    import os
    import signal
    import subprocess
    import sys
    import time

    script = ("from cubic.runners.local import Fault, LocalRunner\n"
              "from cubic.core.config import Config, Kernels\n"
              "import tests.test_runners_local as t\n"
              "LocalRunner(timeout_s=600, fault=Fault(kind='hang')).run(t.TINY, Config(kernels=Kernels(embedding='torch')), steps=2)\n")
    env = dict(os.environ, CUBIC_ALLOW_FAULTS="1")
    parent = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=os.path.dirname(os.path.dirname(__file__)))
    children_file = f"/proc/{parent.pid}/task/{parent.pid}/children"
    if not os.path.exists(children_file):
        parent.kill()
        pytest.skip("needs Linux /proc children")
    child = None
    deadline = time.monotonic() + 120
    while child is None and time.monotonic() < deadline:
        # the run's child, not the short-lived git processes the parent starts first (code_version)
        with open(children_file) as f:
            for pid in f.read().split():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as c:
                        if b"cubic.runners._child" in c.read():
                            child = int(pid)
                except FileNotFoundError:
                    pass
        time.sleep(0.2)
    assert child is not None, "the runner never started its child"
    time.sleep(2.0)  # let the child get past its start-up
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        try:  # reaped by init once dead; a zombie counts as gone
            with open(f"/proc/{child}/stat") as f:
                if f.read().split()[2] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.2)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the child outlived its killed parent")


def test_peak_memory_is_the_runs_own_not_the_parents():
    # ru_maxrss would carry this process's 1.5 GB into the child across exec (Linux); VmHWM does not
    import numpy as np

    ballast = np.ones(1536 * 2**20 // 8)  # 1.5 GB, touched, held while the run goes
    config = Config(kernels=Kernels(embedding="torch"))
    r = LocalRunner(timeout_s=300, threads=1).run(TINY, config, steps=2, warmup=0)
    assert r.ok, r.reason
    assert ballast[-1] == 1.0
    assert 50e6 < r.metrics["peak_mem_bytes"] < 1.2e9, r.metrics["peak_mem_bytes"]


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_peak_memory_grows_with_the_batch():
    from cubic.core.data import SyntheticData
    from cubic.runners.local import _batch_nbytes

    wl = DEFAULT_WORKLOADS["dlrm-small"]
    peaks = {}
    for batch in (256, 4096):
        r = LocalRunner(timeout_s=300, threads=1).run(wl, Config(batch_size=batch), steps=2, warmup=0)
        assert r.ok, r.reason
        peaks[batch] = r.metrics["peak_mem_bytes"]
    # at least the two pre-generated batches (held together) grow; activations add more
    data = SyntheticData(wl)
    floor = 2 * (_batch_nbytes(data.batch(0, 4096)) - _batch_nbytes(data.batch(0, 256)))
    assert peaks[4096] - peaks[256] > floor, (peaks, floor)


def test_timing_is_a_distribution_with_its_contention():
    r = LocalRunner(timeout_s=300, threads=1).run(TINY, Config(), steps=20, warmup=1)
    m = r.metrics
    # 4 of the 20 timed steps time the phases; unpreempted steps after the warm-up transient time the run
    assert r.ok and len(r.extra["step_times_ms"]) == 16 and len(r.extra["phase_steps"]) == 4
    assert 3 <= m["timing_windows"] and m["timing_steps"] + m["timing_steps_dropped"] <= 16
    assert m["step_time_ci_lo_ms"] <= m["step_time_median_ms"] <= m["step_time_ci_hi_ms"]
    assert m["examples_per_s_ci_lo"] <= m["examples_per_s"] <= m["examples_per_s_ci_hi"]
    assert m["load_avg_1m_start"] >= 0 and m["load_avg_1m_end"] >= 0
    assert 0 < m["cpu_util"] <= 1.5  # process CPU time per thread per second of wall time


def test_a_run_evaluates_at_its_first_updates_and_then_every_fifth():
    from cubic.runners.local import evaluated_at

    # 60 steps evaluate every 12: before the first, after 1, 2, 4 and 8 steps, where a large batch's
    # NE at a campaign's equal budget lies (cubic.codesign.evaluate)
    assert [d for d in range(0, 61) if evaluated_at(d, 12)] == [1, 2, 4, 8, 12, 24, 36, 48, 60]
    assert [d for d in range(0, 6) if evaluated_at(d, 1)] == [1, 2, 3, 4, 5]
    # an explicit cadence is exact (runner_overhead's 10**9: no evaluation inside the run)
    assert [d for d in range(0, 61) if evaluated_at(d, 12, early=False)] == [12, 24, 36, 48, 60]
    assert not any(evaluated_at(d, 10**9, early=False) for d in range(0, 100))



def test_a_run_in_process_evaluates_where_evaluated_at_says():
    from cubic.runners.local import train_and_measure

    r = train_and_measure(TINY, Config(seed=1), steps=18, warmup=2, device="cpu")  # every 4 steps
    assert [p["step"] for p in r.trajectory] == [0, 1, 2, 4, 8, 12, 16, 20]
    r = train_and_measure(TINY, Config(seed=1), steps=18, warmup=2, device="cpu", eval_every=10)
    assert [p["step"] for p in r.trajectory] == [0, 10, 20]
