"""Runners: measure one (workload, config) and return a :class:`cubic.core.result.Result`.

``LocalRunner`` trains the model in a child process (``python -m cubic.runners._child``; the
request goes in on stdin as JSON, progress and the result come back as JSON lines over a pipe)
under a wall-clock limit, so that a crash, a hang or an OOM of the run cannot take the caller down:
every failure comes back as ``Result.failed(kind, reason)``.

What one run does (:func:`train_and_measure`, in the child): a :class:`cubic.core.train.TrainSession`
(the one training step every runner uses: model, optimizers, data -- data seed from the workload so
every config of a workload is scored on the same eval batch, model seed from ``config.seed`` -- and
FP8 through :func:`fp8_transform`), evaluated, then ``warmup`` untimed and ``steps`` timed training
steps on the local device -- CUDA when present and ``device="auto"``, else CPU, the same code
either way -- evaluating every ``eval_every`` steps (by default about a fifth of the run, and then
also at 1, 2, 4, ... steps before the first of those: :func:`evaluated_at`) and at the end (outside
the timed region).
Batches are generated ahead in chunks outside the timed region, so the figures measure training,
not data generation.

How a timed step is timed: one timed step in ``PHASE_EVERY`` (5) runs through the phase clock
(below) and gives the phase times; the others run ``model(batch)`` as a plain training loop would,
timed as a whole (on CUDA between two device synchronisations), with the process's involuntary
context switches counted around each (``getrusage``, outside the timed window): a step during which
another process took one of the run's cores is *preempted*. The losses are read back every
``_NAN_CHECK_EVERY`` (10) steps, at each evaluation and at the end, outside the timed steps, so no
step waits for the device to report its loss.

Reported:
- ``metrics``: ``examples_per_s`` and ``step_time_median_ms``: the median over windows of about a
  tenth of the timed steps each, with a distribution-free 95 % interval from order statistics
  (``examples_per_s_ci_lo/_hi``, ``step_time_ci_lo_ms/_hi_ms``; :func:`cubic.core.train.window_stats`),
  over the unpreempted steps (when at least 3) after the warm-up transient (leading steps slower
  than the run's steady level; ``timing_steps`` used, ``timing_steps_dropped``), and
  ``steps_preempted_frac`` (:func:`cubic.core.stats.contention` calls a run with more than half its
  steps preempted contended); ``speed_probe_ms`` (:func:`speed_probe`, around the timed steps: how
  fast the machine itself was), ``others_busy_frac`` (the share of the machine's CPU time that other
  processes used while the run trained: on other cores they still share its caches and memory
  bandwidth; recorded, not yet a contention rule) and ``steal_frac`` (hypervisor steal over the machine's CPUs while training); ``step_time_p90_ms`` (single steps, all); ``peak_mem_bytes`` (see :func:`peak_memory`: CPU the run's
  own peak RSS, VmHWM, reset when training starts; CUDA ``max_memory_allocated``, plus
  ``peak_mem_reserved_bytes``); the contention the run saw: ``load_avg_1m_start`` /
  ``load_avg_1m_end`` and ``cpu_util`` (process CPU time / wall time / intra-op threads over the
  timed steps); ``loss_start`` / ``loss_end`` and ``ne_start`` / ``ne_end`` (log loss and
  normalized entropy on the eval batch, before the first and after the last step),
  ``train_loss_first`` / ``train_loss_last``, ``batch_size``;
- ``phases_ms``: the median over the phase steps of ``embedding_fwd``, ``dense_fwd`` (dense forward and
  loss), ``dense_bwd``, ``embedding_bwd`` (with FBGEMM this *includes the fused row-wise AdaGrad
  update*: TBE applies it inside backward), ``optimizer`` (dense Adam, the unfused embedding
  optimizer, zero_grad), ``communication`` (0: one process). On CUDA each phase boundary
  synchronises the device.
- ``trajectory``: ``[{step, loss, ne}]`` on the eval batch (step = training steps done);
- ``extra``: ``step_times_ms`` (the timed steps but the phase steps, in order), ``step_preempted``
  (their involuntary context switches), ``phase_steps`` (which timed steps timed the phases);
- fingerprint, fingerprint hash and versions (``cubic.core.fingerprint``), workload/config hashes, seed.

Failure kinds: ``invalid`` (config the runner cannot execute; checked before starting the child),
``error`` (an exception in the child: type and message), ``nan`` (non-finite loss; read back every
10 steps, the run stops there and the reason names the step where it first appeared), ``oom`` (MemoryError, allocator failure or CUDA OOM, including under
``memory_limit_bytes``), ``timeout`` (the parent kills the child after ``timeout_s`` of wall clock,
start-up included), ``killed`` (the child died by a signal, e.g. the kernel's OOM killer, or an
interrupt -- SIGINT/SIGTERM to the child or to the parent -- ended the run; transient, never
``error``). An interrupt of the parent kills the child and raises
:class:`cubic.core.result.RunInterrupted` carrying the ``killed`` Result, so that the caller records
it before stopping. Every Result, failures included, carries this machine's fingerprint, so that a
deterministic failure (oom, nan, invalid) is stored under the real fingerprint and served again.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

try:
    import resource
except ImportError:  # not Unix
    resource = None

from cubic.core.config import Config
from cubic.core.fingerprint import versions
from cubic.core.result import Result, RunInterrupted
from cubic.core.runspec import RunSpec
from cubic.core.spec import SpecError, Workload
from cubic.runners.base import (  # noqa: F401  (re-exported: the names importers of this module used)
    ProgressFn, Runner, classify_exception, peak_memory, proc_status_bytes, reset_peak_rss, resolve_device,
    result_header, validate_config)

PHASES = ("embedding_fwd", "embedding_bwd", "dense_fwd", "dense_bwd", "optimizer", "communication")
FAULTS_ENV = "CUBIC_ALLOW_FAULTS"
_BATCH_BUFFER_BYTES = 256 * 2**20  # pre-generated batches held at once
_PROGRESS_EVERY_S = 0.2
EXIT_GRACE_S = 10.0  # after its result, a child has this long to exit before it is killed
_NAN_CHECK_EVERY = 10  # steps between reading the losses back (and at every evaluation and the end)
PHASE_EVERY = 5  # one timed step in this many is a phase step (see _phase_steps)
PREEMPTION_LOSS = 0.02  # share of a step's wall time lost to other processes that makes it "preempted"
_REPO_ROOT = str(Path(__file__).resolve().parents[2])


class Fault(BaseModel):
    """Test-only fault injection at training step ``at_step`` (0-based, warm-up included).

    Honoured only when the environment has ``CUBIC_ALLOW_FAULTS=1``, so no user path can hit it.
    ``linger``: the child delivers its result, then does not exit (``at_step`` unused).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["raise", "oom", "hang", "nan", "kill", "linger"]
    at_step: int = Field(default=0, ge=0)


def faults_allowed() -> bool:
    return os.environ.get(FAULTS_ENV) == "1"


class LocalRunner(Runner):
    """Runs each measurement in a child process on this machine (see the module docstring).

    ``threads`` sets the child's intra-op threads (default: torch's default); ``memory_limit_bytes``
    caps what the run may allocate beyond the child's footprint after importing torch (RLIMIT_AS
    on the address space, so virtual reservations count); ``eval_every`` (training steps) defaults
    to about five evaluations per run plus the early ones (:func:`evaluated_at`); set, it is exact.
    """

    source = "measured"

    def __init__(self, timeout_s: float = 600.0, device: str = "auto", threads: int | None = None,
                 memory_limit_bytes: int | None = None, fault: Fault | None = None, eval_every: int | None = None):
        if fault is not None and not faults_allowed():
            raise ValueError(f"fault injection is for tests only: set {FAULTS_ENV}=1 to allow it")
        if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {device!r}")
        self.timeout_s = float(timeout_s)
        self.device = device
        self.threads = threads
        self.memory_limit_bytes = memory_limit_bytes
        self.fault = fault
        self.eval_every = eval_every

    def run(self, workload: Workload, config: Config, *, steps: int = 50, warmup: int = 5,
            progress: ProgressFn | None = None) -> Result:
        t0 = time.monotonic()
        try:
            head = result_header(workload, config)
        except Exception as e:  # noqa: BLE001 -- never raise in the caller
            return Result.failed("invalid", f"{type(e).__name__}: {e}")
        try:
            if steps < 1 or warmup < 0:
                return self._stamp(Result.failed(
                    "invalid", f"steps must be >= 1 and warmup >= 0 (got {steps}, {warmup})", **head))
            why = validate_config(workload, config)
            if why:
                return self._stamp(Result.failed("invalid", why, **head))
            result = self._run_child(workload, config, steps, warmup, progress, head)
        except RunInterrupted as e:
            e.result.wall_time_s = time.monotonic() - t0
            self._stamp(e.result)
            raise
        except Exception as e:  # noqa: BLE001 -- the parent's own failures are data too
            result = Result.failed("error", f"runner: {type(e).__name__}: {e}", **head)
        result.wall_time_s = time.monotonic() - t0
        return self._stamp(result)

    def _stamp(self, result: Result) -> Result:
        """A failure from before or outside the child's measurement carries no fingerprint: give it
        this machine's, the one a success on this device would carry."""
        if not result.fingerprint_hash:
            from cubic.core.fingerprint import fingerprint, fingerprint_hash

            try:
                kind = resolve_device(self.device).split(":")[0]
                fp = fingerprint(kind)
                result.fingerprint, result.fingerprint_hash = fp, fingerprint_hash(fp)
            except Exception:  # noqa: BLE001 -- no fingerprint is better than no result
                pass
        return result

    def _run_child(self, workload, config, steps, warmup, progress, head) -> Result:
        request = {
            "workload": workload.model_dump(mode="json"), "config": config.model_dump(mode="json"),
            "steps": steps, "warmup": warmup, "device": self.device, "threads": self.threads,
            "memory_limit_bytes": self.memory_limit_bytes, "eval_every": self.eval_every,
            "fault": self.fault.model_dump() if self.fault is not None else None,
            # collected once per parent process (lru_cache): the version probe imports optional peers
            # (torchrec, xgboost, ...) and costs seconds, which every child would otherwise pay again
            "versions": versions(),
        }
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)
        read_fd, write_fd = os.pipe()
        with tempfile.TemporaryFile() as log:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-P", "-m", "cubic.runners._child", str(write_fd), str(os.getpid())],  # -P: no cwd on sys.path
                    stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(write_fd,), env=env,
                )
            finally:
                os.close(write_fd)
            try:
                proc.stdin.write(json.dumps(request).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                message, timed_out = self._collect(proc, read_fd, progress)
            except KeyboardInterrupt as e:  # Ctrl-C / SIGTERM in the caller: the run is killed, not failed
                proc.kill()
                proc.wait()
                what = " ".join(str(e).split()) or "SIGINT"
                raise RunInterrupted(Result.failed(
                    "killed", f"interrupted ({what}) in the parent; child killed",
                    extra={"interrupted": "parent"}, **head)) from None
            except BaseException:  # never leave the child running
                proc.kill()
                proc.wait()
                raise
            if timed_out:
                proc.kill()
            try:  # the pipe closed: the child is leaving; one that hangs on its way out is killed
                code = proc.wait(timeout=EXIT_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            log.seek(0)
            tail = _tail(log.read().decode(errors="replace"))
        if timed_out:
            return Result.failed("timeout", f"no result within {self.timeout_s:g} s; child killed", **head)
        if message is not None:
            return Result.model_validate(message)
        if code < 0:
            sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            if self.memory_limit_bytes and sig in ("SIGABRT", "SIGSEGV", "SIGBUS"):
                return Result.failed("oom", f"child died by {sig} under a memory limit of "
                                            f"{self.memory_limit_bytes} bytes; {tail}", **head)
            return Result.failed("killed", f"child killed by {sig} (SIGKILL may be the kernel's OOM killer); {tail}",
                                 **head)
        return Result.failed("error", f"child exited with code {code} without a result; {tail}", **head)

    def _collect(self, proc, read_fd: int, progress: ProgressFn | None) -> tuple[dict | None, bool]:
        """Read JSON lines until the child closes the pipe or the deadline passes."""
        deadline = time.monotonic() + self.timeout_s
        buf, result = b"", None
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return result, True
                ready, _, _ = select.select([read_fd], [], [], min(left, 1.0))
                if not ready:
                    continue
                chunk = os.read(read_fd, 1 << 16)
                if not chunk:
                    return result, False
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    msg = json.loads(line)
                    if msg["type"] == "progress" and progress is not None:
                        try:
                            progress(msg["done"], msg["total"])
                        except Exception:  # noqa: BLE001 -- a broken progress bar must not end the run
                            progress = None
                    elif msg["type"] == "result":
                        result = msg["result"]
        finally:
            os.close(read_fd)


def _tail(text: str, n: int = 600) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-4:])[-n:] if lines else "no output"


# --- the measurement itself (runs in the child) -----------------------------------------------

class CpuMeter:
    """Process CPU time over wall time over threads during a region, and the load average around it.

    ``with meter:`` also leaves the region's wall time in ``last_ms`` and in ``last_preempted`` how
    often the scheduler took a core from one of the process's threads during it (involuntary
    context switches, ``getrusage``) when that cost the region more than ``PREEMPTION_LOSS`` of its
    wall time (wall - CPU time / threads; with several threads, idle ones count as lost too, so any
    preemption then counts): 0 means no other process ran in its place for long enough to matter.
    """

    def __init__(self):
        import torch

        self.threads = torch.get_num_threads()
        self.load_start = os.getloadavg()[0]
        self.cpu = self.wall = 0.0
        self.last_ms, self.last_preempted = math.nan, 0

    def __enter__(self) -> "CpuMeter":
        self._r = cpu_and_preemptions()
        self._w = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._w
        r = cpu_and_preemptions()  # read after the clock: the system call is not in the timed region
        cpu = r[0] - self._r[0]
        self.cpu += cpu
        self.wall += wall
        # a preemption counts when the region lost a noticeable share of its wall time: a long step
        # nearly always sees a brief one (a kernel thread), which costs it nothing measurable
        lost = wall - cpu / self.threads
        self.last_ms = wall * 1e3
        self.last_preempted = r[1] - self._r[1] if lost > PREEMPTION_LOSS * wall else 0

    def metrics(self) -> dict[str, float]:
        return {"load_avg_1m_start": self.load_start, "load_avg_1m_end": os.getloadavg()[0],
                "cpu_util": self.cpu / self.wall / self.threads if self.wall > 0 else math.nan}


def speed_probe() -> float:
    """Milliseconds for a fixed piece of work (small matrix products, in cache, and a copy of 16 MiB,
    out of it) on the run's threads: the median of 5. Taken before and after the timed steps, it
    tells how fast the machine itself was during the run, whatever the config: on a shared host a
    whole machine slows down for minutes at a time (another tenant, the hypervisor), which neither
    the load average nor the process's CPU time shows, since the run still has its core (in
    results/measurement_noise.json of 23 Nov, 20 consecutive runs were 20 % slower, their start-up
    too, at a load average of 1.0)."""
    import torch

    a = torch.full((128, 128), 0.5)
    src, dst = torch.ones(4 * 2**20), torch.empty(4 * 2**20)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(8):
            a @ a
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[2] * 1e3


def machine_ticks() -> tuple[int, int] | None:
    """(busy, steal) clock ticks of this machine's CPUs so far, all of them (/proc/stat: user, nice,
    system, irq, softirq, steal are busy; steal is what the hypervisor ran elsewhere); None where
    there is no such count."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        if fields[0] != "cpu" or len(fields) < 9:
            return None
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
        return user + nice + system + irq + softirq + steal, steal
    except (OSError, ValueError):
        return None


def cpu_and_preemptions() -> tuple[float, int]:
    """(CPU seconds, involuntary context switches) of this process, all threads."""
    if resource is None:  # not Unix: CPU time without preemption counts
        return time.process_time(), 0
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nivcsw


def resolve_fp8(config: Config, workload: Workload):
    """The config's FP8 choice with a budget policy resolved to a placement by a short Probe
    (``fp8.recommend.resolve_choice``); other choices as they are."""
    if config.fp8.policy != "budget":
        return config.fp8
    from fp8.recommend import resolve_choice  # validated by the parent: the module exists

    return resolve_choice(config.fp8, config.apply(workload))


def fp8_transform(config: Config, workload: Workload, choice=None):
    """The model transform a config's FP8 choice asks for (None when off); ``choice``: the choice
    already resolved (:func:`resolve_fp8`), e.g. by rank 0 for every rank."""
    if config.fp8.policy == "off":
        return None
    from fp8.runtime import apply_fp8

    w = config.apply(workload)
    choice = choice if choice is not None else resolve_fp8(config, workload)
    return lambda model: apply_fp8(model, choice, w)


def _batch_nbytes(batch) -> int:
    s = batch.sparse
    return (batch.dense.nbytes + batch.labels.nbytes + sum(v.nbytes for v in s.values)
            + sum(o.nbytes for o in s.offsets))


class _Inject:
    def __init__(self, fault: Fault | None):
        self.fault = fault if (fault is not None and faults_allowed()) else None

    def at(self, step: int, kind: str) -> bool:
        return self.fault is not None and self.fault.at_step == step and self.fault.kind == kind

    def before_step(self, step: int) -> None:
        if self.at(step, "raise"):
            raise RuntimeError(f"injected fault at step {step}")
        if self.at(step, "oom"):
            import torch

            torch.empty(1 << 50, dtype=torch.uint8)  # 1 PiB: the allocator refuses
            raise MemoryError(f"injected oom at step {step}")
        if self.at(step, "hang"):
            while True:
                time.sleep(1.0)
        if self.at(step, "kill"):
            os.kill(os.getpid(), signal.SIGKILL)


def _phase_steps(steps: int) -> set[int]:
    """Which of ``steps`` timed steps (0-based) time the phases: one in ``PHASE_EVERY``, the third
    of each group, the rest time the step as a whole. The phase clock splits the backward at the
    pooled embeddings and reads the clock between phases, a few per cent more per step on CPU (and
    a device synchronisation per phase on CUDA), so its steps are not in the step-time figures. A run
    too short for both (< 2 steps) times its step through the clock."""
    if steps < 2:
        return set(range(steps))
    return {j for j in range(steps) if j % PHASE_EVERY == min(2, steps - 1)}


def quality_metrics(trajectory: list[dict], losses: list[float]) -> dict[str, float]:
    """What a run did to the model: eval loss and NE before the first and after the last step, and
    the mean training loss of the first and of the last (up to) five steps."""
    import numpy as np

    k = min(5, len(losses))
    return {"loss_start": trajectory[0]["loss"], "loss_end": trajectory[-1]["loss"],
            "ne_start": trajectory[0]["ne"], "ne_end": trajectory[-1]["ne"],
            "train_loss_first": float(np.mean(losses[:k])), "train_loss_last": float(np.mean(losses[-k:]))}


@dataclass
class _Timings:
    """What the training loop (:func:`_train_timed`) measured."""

    times: dict[str, list[float]]  # ms: "step" (whole timed steps) and each of PHASES (phase steps)
    preempted: list[int]  # involuntary context switches of each "step" entry (0: not preempted)
    phase_steps: set[int]
    gen_s: float  # seconds generating batches during the loop
    failure: str | None  # the non-finite loss's message: the run stopped there


def _session(workload: Workload, config: Config, dev, fault: Fault | None):
    """The run's TrainSession (FP8 applied) and its fault injector (a ``nan`` fault hooks the loss)."""
    from cubic.core.train import TrainSession

    session = TrainSession(workload, config, dev, transform=fp8_transform(config, workload))
    inject = _Inject(fault)
    if inject.fault is not None and inject.fault.kind == "nan":
        session.loss_hook = lambda step, loss: loss * float("nan") if inject.at(step, "nan") else loss
    return session, inject


def evaluated_at(done: int, every: int, early: bool = True) -> bool:
    """Whether a run evaluates after ``done`` training steps: every ``every`` steps and, with
    ``early`` (the default cadence), before the first of those after 1, 2, 4, ... steps. A campaign
    reads a large batch's NE at its equal training budget (cubic.codesign.evaluate), which falls
    within that batch's first few updates; with evaluations only every fifth of the run it was
    interpolated from the untrained model across many updates (the early curve is not straight)."""
    return done > 0 and (done % every == 0 or (early and done < every and done & (done - 1) == 0))


def _evaluate(session, step: int) -> dict[str, float]:
    return {"step": float(step), **session.evaluate()}


def _train_timed(session, dev, meter: CpuMeter, inject: _Inject, trajectory: list[dict], *, steps: int,
                 warmup: int, every: int, early: bool, progress: ProgressFn | None) -> _Timings:
    """``warmup`` untimed and ``steps`` timed training steps (see the module docstring), appending
    the evaluations every ``every`` steps (not the last) to ``trajectory``. Stops at a non-finite loss."""
    import torch

    from cubic.core.train import NonFiniteLoss, PhaseClock

    total = warmup + steps
    clock = PhaseClock(dev, session.comm_seconds)
    sync = torch.cuda.synchronize if dev.type == "cuda" else None
    times: dict[str, list[float]] = {p: [] for p in ("step", *PHASES)}
    preempted: list[int] = []
    phase_steps = _phase_steps(steps)
    first = session.batch(0)
    chunk = max(1, min(total, _BATCH_BUFFER_BYTES // max(_batch_nbytes(first), 1)))
    pending: list = [first] + [session.batch(s) for s in range(1, chunk)]
    last_progress = 0.0
    gen_s = 0.0
    for step in range(total):
        if not pending:  # batches are generated ahead, outside the timed region
            g0 = time.perf_counter()
            pending = [session.batch(s) for s in range(step, min(total, step + chunk))]
            gen_s += time.perf_counter() - g0
        b = pending.pop(0)
        inject.before_step(step)
        done = step + 1
        try:
            if step - warmup in phase_steps:  # phase times, from their own steps (the split costs a little)
                with meter:
                    clock.start()
                    session.step_unchecked(step, b, clock)
                for name in PHASES:
                    times[name].append(clock.ms[name])
                if steps < 2:  # no other timed step
                    times["step"].append(clock.step_ms)
                    preempted.append(meter.last_preempted)
            elif step >= warmup:
                if sync is not None:
                    sync()
                with meter:
                    session.step_unchecked(step, b)
                    if sync is not None:
                        sync()
                times["step"].append(meter.last_ms)
                preempted.append(meter.last_preempted)
            else:
                session.step_unchecked(step, b)
            # outside the timed steps, and not every step: reading the loss back waits for the device
            if done % _NAN_CHECK_EVERY == 0 or done == total or done % every == 0:
                session.check_losses()
        except NonFiniteLoss as e:
            return _Timings(times, preempted, phase_steps, gen_s, str(e))
        if evaluated_at(done, every, early) and done < total:
            trajectory.append(_evaluate(session, done))
        now = time.monotonic()
        if progress is not None and (now - last_progress >= _PROGRESS_EVERY_S or done == total):
            progress(done, total)
            last_progress = now
    return _Timings(times, preempted, phase_steps, gen_s, None)


def _others_and_steal(ticks0: tuple[int, int] | None, own0: float, ticks_t0: float) -> tuple[float, float]:
    """The shares of the machine's CPU time that other processes and the hypervisor (steal) used
    since ``ticks0`` (:func:`machine_ticks`), ``own0`` (this process's CPU seconds) and ``ticks_t0``
    (``time.monotonic``) were read; NaN where there is no such count."""
    ticks1, own1, ticks_wall = machine_ticks(), cpu_and_preemptions()[0], time.monotonic() - ticks_t0
    hz = os.sysconf("SC_CLK_TCK")
    available = hz * ticks_wall * (os.cpu_count() or 1)  # clock ticks all CPUs had while the run trained
    if ticks0 is not None and ticks1 is not None and available > 0:
        # what other processes (and the hypervisor) used of the machine while this run trained
        others = max(0.0, (ticks1[0] - ticks0[0] - (own1 - own0) * hz) / available)
        steal = (ticks1[1] - ticks0[1]) / available
    else:
        others = steal = math.nan
    return others, steal


def train_and_measure(workload: Workload, config: Config, *, steps: int = 50, warmup: int = 5,
                      device: str = "auto", eval_every: int | None = None, fault: Fault | None = None,
                      progress: ProgressFn | None = None, versions_info: dict[str, str] | None = None) -> Result:
    """One measurement in this process (the child's body). Exceptions propagate to the caller."""
    import numpy as np
    import torch

    from cubic.core.fingerprint import fingerprint, fingerprint_hash
    from cubic.core.train import window_stats

    head = result_header(workload, config)
    dev = torch.device(resolve_device(device))
    session, inject = _session(workload, config, dev, fault)
    w = session.workload
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)

    total = warmup + steps
    every = eval_every or max(1, total // 5)
    trajectory = [_evaluate(session, 0)]
    probe_before = speed_probe() if dev.type == "cpu" else math.nan  # before the peak-memory reset
    setup_peak = proc_status_bytes("VmHWM")
    peak_reset = dev.type == "cpu" and reset_peak_rss()
    meter = CpuMeter()
    ticks0, own0, ticks_t0 = machine_ticks(), cpu_and_preemptions()[0], time.monotonic()
    run = _train_timed(session, dev, meter, inject, trajectory, steps=steps, warmup=warmup, every=every,
                       early=eval_every is None, progress=progress)
    if run.failure is not None:
        return Result.failed("nan", run.failure, trajectory=trajectory, **head)
    others, steal = _others_and_steal(ticks0, own0, ticks_t0)
    trajectory.append(_evaluate(session, total))
    mem = peak_memory(dev)  # before the probe's buffers can raise it
    probe_after = speed_probe() if dev.type == "cpu" else math.nan

    step_ms = np.asarray(run.times["step"])
    metrics = {
        **window_stats(run.times["step"], w.batch_size, preempted=run.preempted),
        "step_time_p90_ms": float(np.percentile(step_ms, 90)),
        **mem,
        **quality_metrics(trajectory, session.losses),
        "batch_size": float(w.batch_size),
        **meter.metrics(),
        # how fast the machine itself was around the run (see speed_probe); the shares of the
        # machine's CPU time that other processes and the hypervisor (steal) used while it trained
        "speed_probe_ms": 0.5 * (probe_before + probe_after),
        "others_busy_frac": others, "steal_frac": steal,
    }
    fp = fingerprint(dev.type)
    return Result(
        status="ok", source="measured", metrics=metrics,
        phases_ms={p: float(np.median(run.times[p])) for p in PHASES},
        trajectory=trajectory, fingerprint=fp, fingerprint_hash=fingerprint_hash(fp),
        versions=versions_info if versions_info is not None else versions(),
        extra={"device": str(dev), "threads": torch.get_num_threads(), "embedding_kernel": session.model.embedding.kernel,
               "dense_dtype": config.kernels.dense_dtype, "steps": steps, "warmup": warmup, "eval_every": every,
               "data_gen_s": run.gen_s, "step_times_ms": [round(x, 4) for x in step_ms.tolist()],
               "step_preempted": run.preempted, "phase_steps": sorted(run.phase_steps),
               "peak_mem": "cuda max_memory_allocated/reserved" if dev.type == "cuda" else
                           ("VmHWM since training started" if peak_reset else "VmHWM of the process"),
               "setup_peak_rss_bytes": setup_peak,
               # more runnable processes than cores: multi-threaded step times are unreliable
               "cpu_contended": meter.load_start > (os.cpu_count() or 1)},
        **head,
    )


def expected_fingerprint_hash(runner: Any) -> str | None:
    """The fingerprint hash the runner's results will carry, so the store can serve a repeat: the
    runner's own ``fingerprint_hash()`` where it has one, else (measured local runs) this machine's
    fingerprint on the device type the runner resolves to (``cuda:1`` -> ``cuda``). None: results of
    this runner cannot be served (e.g. a simulated runner that says nothing)."""
    own = getattr(runner, "fingerprint_hash", None)
    if callable(own):
        return own()
    if isinstance(own, str):
        return own
    if getattr(runner, "source", "measured") != "measured":
        return None
    from cubic.core.fingerprint import fingerprint, fingerprint_hash

    try:
        kind = RunSpec(device=str(getattr(runner, "device", "auto") or "auto")).resolved_device()
        import torch

        torch.device(kind)
    except RuntimeError:
        raise SpecError(f"not a torch device: {getattr(runner, 'device', None)!r}", field="--device") from None
    return fingerprint_hash(fingerprint(kind))
