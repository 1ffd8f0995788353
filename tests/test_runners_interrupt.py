"""LocalRunner: an interrupt (SIGINT/SIGTERM to the child, or to the parent) is a `killed` run,
never an `error`; every failure carries the machine's real fingerprint, so that a deterministic
one is stored where a repeat will find it. Real child processes, fault injection for the hang/oom."""

import os
import signal
import subprocess
import threading

import pytest

from cubic.codesign.evaluate import expected_fingerprint_hash
from cubic.core.config import Config
from cubic.core.result import RunInterrupted
from cubic.core.spec import Workload
from cubic.runners.local import Fault, LocalRunner

TINY = Workload.model_validate({
    "name": "tiny", "batch_size": 64,
    "tables": [{"name": "a", "rows": 1000, "dim": 8, "pooling_factor": 2}],
    "dense_arch": {"kind": "dlrm", "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
    "data": {"num_dense_features": 4, "eval_batch_size": 256},
})


@pytest.fixture(autouse=True)
def faults(monkeypatch):
    monkeypatch.setenv("CUBIC_ALLOW_FAULTS", "1")


def _children() -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_child_is_a_killed_run_with_a_reason(sig):
    _signal_the_child(sig)


def _signal_the_child(sig):
    runner = LocalRunner(timeout_s=120, device="cpu", threads=1, fault=Fault(kind="hang", at_step=1))
    started = threading.Event()
    out = {}

    def go():
        out["r"] = runner.run(TINY, Config(), steps=3, warmup=0, progress=lambda d, t: started.set())

    before = set(_children())
    t = threading.Thread(target=go)
    t.start()
    assert started.wait(120), "the child never reached its first step"
    (child,) = set(_children()) - before
    os.kill(child, sig)
    t.join(60)
    assert not t.is_alive(), "the runner did not return within 60 s of the child's interrupt"
    r = out["r"]
    assert r.failure_kind == "killed" and r.transient, r.reason
    assert sig.name in r.reason and r.extra["interrupted"] == sig.name
    assert r.fingerprint_hash == expected_fingerprint_hash(runner)


def test_an_interrupt_of_the_parent_kills_the_child_and_raises_with_the_killed_result():
    runner = LocalRunner(timeout_s=120, device="cpu", threads=1, fault=Fault(kind="hang", at_step=1))

    def ctrl_c(done, total):
        raise KeyboardInterrupt  # as if Ctrl-C reached the parent while it waited for the child

    before = set(_children())
    with pytest.raises(RunInterrupted) as e:
        runner.run(TINY, Config(), steps=3, warmup=0, progress=ctrl_c)
    assert e.value.result.failure_kind == "killed" and e.value.result.extra["interrupted"] == "parent"
    assert e.value.result.fingerprint_hash == expected_fingerprint_hash(runner)
    assert set(_children()) - before == set()  # no child left running


def test_deterministic_failures_carry_the_real_fingerprint():
    oom = LocalRunner(timeout_s=120, device="cpu", threads=1, fault=Fault(kind="oom", at_step=0))
    r = oom.run(TINY, Config(), steps=2, warmup=0)
    assert r.failure_kind == "oom" and r.fingerprint_hash == expected_fingerprint_hash(oom)
    invalid = LocalRunner(device="cpu").run(TINY, Config(model={"no_such_knob": 1}), steps=2, warmup=0)
    assert invalid.failure_kind == "invalid" and invalid.fingerprint_hash == expected_fingerprint_hash(oom)


def test_a_child_that_hangs_after_its_result_is_killed_and_the_result_kept(monkeypatch):
    import time

    import cubic.runners.local as local

    monkeypatch.setattr(local, "EXIT_GRACE_S", 1.0)
    runner = LocalRunner(timeout_s=120, device="cpu", threads=1, fault=Fault(kind="linger"))
    t0 = time.monotonic()
    r = runner.run(TINY, Config(), steps=2, warmup=0)
    assert r.ok, r.reason
    assert time.monotonic() - t0 < 60  # not the run's 120 s timeout: the lingering child was killed


def test_sigint_interrupts_the_child_even_when_the_caller_ignores_it():
    # a script's background job (`cubic ... &` without job control) starts with SIGINT ignored, and
    # exec keeps an ignored signal ignored: the child must set its own handler
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _signal_the_child(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, old)
