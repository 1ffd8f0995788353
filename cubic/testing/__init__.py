"""Test doubles for campaigns, workers and stores (tests and experiments/reliability use them).

- :class:`FastRunner`: a deterministic stand-in for a run (milliseconds; an OOM above 7936
  examples in fp32), on :data:`SPACE` (real Config fields, so cubic's RunnerEvaluate and the trial
  store are the code under test);
- :func:`make_evaluate`: the ``module:factory`` entry (``cubic.testing:make_evaluate``) for
  ``python -m cubic.codesign.worker`` / ``cubic campaign work`` over the stand-in;
- :class:`FaultyRunner`: the real LocalRunner with a test-only fault per point;
- :func:`error_lines`: what a CLI's stderr says besides its live progress, warnings and notes (the
  one rule the tests and the reliability experiment's judge share).
- :func:`recording_listener`: a ``CampaignListener`` that records every event it hears.

Not measurements of anything: they exercise the campaign and the stores at a rate real runs cannot.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections import Counter
from contextlib import contextmanager
from typing import Any

from cubic.core.result import Result
from cubic.core.spec import Workload
from cubic.runners.base import Runner

# a campaign's live progress: a line per run, and the baseline's
_PROGRESS = re.compile(r"^(.* run \d+/\d+ \(trial \d+\): |baseline \()")


def error_lines(stderr: str) -> list[str]:
    """The lines of a CLI's stderr that are not live progress, a ``cubic: warning:`` or a ``cubic: note:``
    (a note before the first run, e.g. the default space's group sizes): an error should be exactly one."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(("cubic: warning:", "cubic: note:"))
            and not _PROGRESS.match(ln)]


LOG_ENV = "CUBIC_RELIABILITY_LOG"
DELAY_ENV = "CUBIC_RELIABILITY_DELAY"
FAST_FINGERPRINT = "reliability-fast-runner"

# The stand-in's space: real Config fields (so cubic's RunnerEvaluate and the trial store are the
# code under test), 2 x 2 x 128 x 4 = 2048 points.
SPACE: dict[str, Any] = {
    "version": 1,
    "name": "reliability",
    "objectives": [{"metric": "examples_per_s", "direction": "maximize"}],
    "constraints": [{"name": "memory per device", "metric": "peak_mem_bytes", "max": 6.0e9}],
    "parameters": [
        {"name": "batch_size", "type": "int", "low": 64, "high": 8192, "step": 64},
        {"name": "kernels.embedding", "type": "categorical", "choices": ["fbgemm", "torch"]},
        {"name": "kernels.dense_dtype", "type": "categorical", "choices": ["fp32", "bf16"]},
        {"name": "seed", "type": "int", "low": 0, "high": 3},
    ],
}


def recording_listener() -> Any:
    """A ``CampaignListener`` that records every event it hears, in order, as ``(event, args)`` in
    ``events``; ``heard(event)`` lists one event's argument tuples. The one listener the tests use."""
    from cubic.codesign.campaign import CampaignListener  # late: the engine imports optuna and sqlalchemy

    class Recording(CampaignListener):
        def __init__(self) -> None:
            self.events: list[tuple[str, tuple]] = []

        def heard(self, event: str) -> list[tuple]:
            return [args for name, args in self.events if name == event]

    for name in (n for n in vars(CampaignListener) if not n.startswith("_")):
        # list.append is atomic: the campaign calls listeners from the threads that run points
        setattr(Recording, name, lambda self, *args, _event=name: self.events.append((_event, args)))
    return Recording()


def toy_workload() -> Workload:
    from cubic.core.workloads import DEFAULT_WORKLOADS

    return DEFAULT_WORKLOADS["dlrm-small"]


def space():
    from search.space import Space

    return Space.model_validate(SPACE)


class FastRunner(Runner):
    """A deterministic stand-in for a run: a short sleep, then metrics that depend only on the
    config (a smooth throughput curve in batch size and kernels, memory linear in batch, and
    out-of-memory above 7936 examples in fp32). Not a measurement of anything: it exercises the
    campaign and the stores at a rate real runs cannot."""

    source = "simulated"

    def __init__(self, delay_s: float | None = None, log: str | None = None):
        self.delay_s = float(os.environ.get(DELAY_ENV, "0.02")) if delay_s is None else delay_s
        self.log = log if log is not None else os.environ.get(LOG_ENV)

    def fingerprint_hash(self) -> str:
        return FAST_FINGERPRINT

    def run(self, workload, config, *, steps=50, warmup=5, progress=None) -> Result:
        head = dict(workload=workload.name, workload_hash=workload.content_hash(),
                    config_hash=config.content_hash(), seed=config.seed, fingerprint={"runner": "fast"},
                    fingerprint_hash=FAST_FINGERPRINT)
        if self.log:
            with open(self.log, "a") as f:
                f.write(config.content_hash() + "\n")
        time.sleep(self.delay_s)
        b = config.apply(workload).batch_size
        if b > 7936 and config.kernels.dense_dtype == "fp32":
            return Result.failed("oom", f"stand-in: {b} examples in fp32 exceed memory", source="simulated", **head)
        noise = int(config.content_hash()[:8], 16) / 2**32
        eps = b * 2000.0 / (b + 700.0) * (1.35 if config.kernels.dense_dtype == "bf16" else 1.0) \
            * (1.1 if config.kernels.embedding == "fbgemm" else 1.0) * (0.97 + 0.06 * noise)
        mem = 2.0e8 + b * 7.0e5 * (0.6 if config.kernels.dense_dtype == "bf16" else 1.0)
        return Result(status="ok", source="simulated", metrics={"examples_per_s": eps, "peak_mem_bytes": mem},
                      **head)


def make_evaluate(space_, store_url: str | None):
    """``module:factory`` entry for ``python -m cubic.codesign.worker``: cubic's RunnerEvaluate over the
    stand-in runner, recording into the trial store at ``store_url``."""
    from cubic.codesign.evaluate import RunnerEvaluate
    from cubic.core.store import TrialStore

    store = TrialStore(store_url) if store_url else None
    return RunnerEvaluate(toy_workload(), FastRunner(), space_, steps=1, warmup=0, store=store)


FAULT_PLAN = ("raise", "oom", "nan", "hang", "kill", "kill-once", None)


class FaultyRunner(Runner):
    """The real LocalRunner with a test-only fault chosen per point: the n-th new point gets the
    n-th kind of ``plan`` (then no fault). ``kill-once`` kills only the first attempt (a transient
    failure that a retry fixes); ``hang`` hangs only on the first attempt (a timeout, then ok)."""

    # what LocalRunner reports for each injected fault (the fast test's stand-in returns these)
    REPORTED = {"raise": ("error", "RuntimeError: injected fault at step 0"),
                "oom": ("oom", "RuntimeError: injected oom: can't allocate memory"),
                "nan": ("nan", "training loss is nan at step 0"),
                "hang": ("timeout", "no result within 60 s; child killed"),
                "kill": ("killed", "child killed by SIGKILL")}

    def __init__(self, plan=FAULT_PLAN, timeout_s: float = 60.0, simulate: bool = False):
        self.plan, self.timeout_s, self.simulate = list(plan), timeout_s, simulate
        self.kind_of: dict[str, str | None] = {}
        self.attempts: Counter = Counter()
        if simulate:
            self.source = "simulated"
            self.fingerprint_hash = lambda: FAST_FINGERPRINT

    def run(self, workload, config, *, steps=2, warmup=0, progress=None) -> Result:
        from cubic.runners.local import Fault, LocalRunner

        key = config.content_hash()
        if key not in self.kind_of:
            n = len(self.kind_of)
            self.kind_of[key] = self.plan[n] if n < len(self.plan) else None
        self.attempts[key] += 1
        kind = self.kind_of[key]
        if kind in ("kill-once", "hang") and self.attempts[key] > 1:
            kind = None
        kind = "kill" if kind == "kill-once" else kind
        if self.simulate:
            if kind is None:
                return FastRunner(delay_s=0.0, log="").run(workload, config)
            fk, why = self.REPORTED[kind]
            return Result.failed(fk, why, source="simulated", workload=workload.name,
                                 workload_hash=workload.content_hash(), config_hash=config.content_hash(),
                                 fingerprint_hash=FAST_FINGERPRINT)
        fault = Fault(kind=kind, at_step=0) if kind else None
        return LocalRunner(timeout_s=self.timeout_s, threads=1, fault=fault).run(workload, config, steps=steps,
                                                                                 warmup=warmup)


def stand_in_runner(marker: str | None = None, delay_s: float = 0.0, crash: bool = False):
    """A runner for remote workers (Ray): ``examples_per_s`` = 1000 x batch size and the pid it ran
    in; ``marker``: a file written when a run is on a worker ("a run is on a node now"), then
    ``delay_s`` of sleep; ``crash``: the worker process dies mid-run. Built in a function so that
    Ray ships the class by value to workers that cannot import tests/ or experiments/."""

    class StandInRunner:
        source = "measured"

        def run(self, workload, config, *, steps=50, warmup=5, progress=None):
            if marker:
                with open(marker, "w") as f:
                    f.write(str(os.getpid()))
            if crash:
                os._exit(1)
            time.sleep(delay_s)
            return Result(status="ok", workload=workload.name, metrics={
                "examples_per_s": 1000.0 * (config.batch_size or 1), "pid": float(os.getpid())})

    return StandInRunner()


def tiny_workload() -> Workload:
    from cubic.core.spec import DataSpec, DLRMArch, Table

    return Workload(name="reliability-tiny",
                    tables=[Table(name="a", rows=500, dim=8, pooling_factor=2.0),
                            Table(name="b", rows=2000, dim=4, pooling_factor=1.0)],
                    dense_arch=DLRMArch(bottom_mlp=[16, 8], top_mlp=[16, 1]), batch_size=64,
                    data=DataSpec(num_dense_features=4, eval_batch_size=256))


@contextmanager
def silent_server():
    """A loopback TCP server that accepts every connection and never sends a byte (bounded: it
    serves only while the block runs)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    srv.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []  # connections kept open: the client waits for a reply

    def serve() -> None:
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except (socket.timeout, OSError):
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join(2)
        for c in held:
            c.close()
        srv.close()
