"""Any job as a campaign's objective: a command line with ``{parameter}`` placeholders.

``CommandRunner(objective, parameters, metric=...)`` is a campaign ``evaluate`` callable
(``point -> Result``), not a :class:`cubic.runners.local.Runner`: a user's job has no cubic
workload or Config, only the space's parameters. For each point it

- fills the template SAFELY: the template is split with :func:`shlex.split` first, each argument
  is filled on its own, and the job runs as an argument list (never through a shell), so a value
  can neither add arguments nor run anything. ``{{``/``}}`` are literal braces. An argument naming
  a parameter that is inactive at this point (a conditional ``when``) is dropped, with the flag
  before it when the argument is exactly the placeholder (``--recipe {fp8.recipe}``).
- places: ``{out}`` -- a fresh file path per run for a metrics file the job writes (JSON, or JSON
  lines); ``{nproc}`` -- processes per run (the space's ``nproc`` parameter when it has one, else
  ``nproc``), for a ``launcher`` such as ``torchrun --standalone --nproc-per-node {nproc}`` that
  is prepended to the objective (torchrun runs Python scripts itself, so a leading ``python`` of
  the objective is dropped under torchrun). A first word ``python``/``python3`` is the interpreter
  running cubic (``sys.executable``), so a job sees the same environment as cubic does.
- reads metrics from the metrics file when ``{out}`` is used, else (or when the file lacks the
  metric) from the LAST JSON object line on stdout that has ``metric``; numeric fields only.
  ``wall_time_s`` and ``peak_rss_bytes`` (the largest process of the job, from ``wait4``) are
  measured by the runner and added unless the job reports them.
- maps what went wrong to :class:`cubic.core.result.Result` failure kinds: ``timeout`` (ran past
  ``timeout_s``: its whole process group is stopped), ``oom`` (``CUDA out of memory``,
  ``MemoryError``, ``std::bad_alloc``... in the stderr tail, or SIGKILL / exit 137, the kernel OOM
  killer's mark), ``killed`` (another signal), ``error`` (any other non-zero exit: the last stderr
  line), ``invalid`` (exit 0 but no metric), ``nan`` (a non-finite metric).

Early stopping (``pruner``: an Optuna pruner, e.g. ``MedianPruner`` or ``SuccessiveHalvingPruner``):
a job may print intermediate lines, JSON objects with ``step`` and the metric
(``{"step": 3, "val_loss": 0.41}``); the runner reports each to the pruner over the learning curves
of the runs it has made (an in-memory Optuna study: trial.report / should_prune, the pruners'
own rule) and stops the job's process group when the pruner says so. The run is a ``pruned``
failure carrying its last intermediate value and step (``pruned_step``), and every run watched so
keeps its learning curve (``extra["curve"]``): the search learns from that value plus the gain the
completed runs made after that step, never credited above the worst completed run
(search.curves.credit_pruned), as
Optuna's TPE ranks a pruned trial. Why Optuna's pruners and not Tune's
ASHA: cubic's campaign already is an Optuna ask/tell loop, a pruner needs only the curves (no
Ray cluster, no trial actors), and ASHA itself is Optuna's ``SuccessiveHalvingPruner``.

Logs: with ``logs_dir`` each run keeps ``<dir>/<n>-<key>/{stdout,stderr}`` (and ``{out}``), and a
failed run's reason names them; otherwise they go to a temporary folder removed after the run.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import uuid
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from cubic.core.result import Result
from cubic.core.spec import SpecError, stable_hash

RESERVED = ("out", "nproc")
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
# stderr lines that mean the job ran out of memory, whatever its exit code
OOM_SIGNATURES = ("CUDA out of memory", "OutOfMemoryError", "MemoryError", "std::bad_alloc",
                  "Cannot allocate memory", "Signal 9 (SIGKILL)", "exitcode  : -9")
_TAIL_BYTES = 64 * 1024  # of stderr kept for the failure kind and reason
_STDOUT_SCAN_BYTES = 8 * 2**20  # the metrics line is near the end; a job may print gigabytes before it
_GRACE_S = 5.0  # between SIGTERM and SIGKILL of a timed-out job


def placeholders(template: str) -> list[str]:
    """The placeholder names of a template (in order, with repeats)."""
    return [m.group(1) for m in _TOKEN.finditer(template) if m.group(1) is not None]


def fill(arg: str, values: dict[str, Any]) -> str | None:
    """One argument with its placeholders replaced; None when it names a value not in ``values``."""
    out, pos = [], 0
    for m in _TOKEN.finditer(arg):
        out.append(arg[pos:m.start()])
        tok = m.group(0)
        if tok in ("{{", "}}"):
            out.append(tok[0])
        elif m.group(1) not in values:
            return None
        else:
            out.append(_text(values[m.group(1)]))
        pos = m.end()
    out.append(arg[pos:])
    return "".join(out)


def fill_all(words: Sequence[str], values: dict[str, Any]) -> list[str]:
    """Every argument filled; one naming an absent (inactive) value is dropped, and so is the
    literal flag before it when the argument is just the placeholder (``--recipe {fp8.recipe}``)."""
    argv: list[str] = []
    flag = False  # whether argv[-1] is a literal flag of the template
    for word in words:
        filled = fill(word, values)
        if filled is None:
            if _TOKEN.fullmatch(word) and flag:
                argv.pop()
            flag = False
            continue
        argv.append(filled)
        flag = word.startswith("-") and not placeholders(word)
    return argv


def render(objective: str, point: dict[str, Any], launcher: str | None = None, nproc: int = 1,
           out: str = "metrics.json") -> str:
    """The command line a point stands for, for people (reports): no checks, nothing run."""
    words = (shlex.split(launcher) if launcher else []) + shlex.split(objective)
    return shlex.join(fill_all(words, {"nproc": nproc, **point, "out": out}))


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _split(template: str, flag: str) -> list[str]:
    try:
        argv = shlex.split(template)
    except ValueError as e:  # an unbalanced quote
        raise SpecError(f"cannot split the command line: {e}", field=flag) from None
    if not argv:
        raise SpecError("empty command line", field=flag)
    return argv


def _executable(word: str, flag: str) -> str:
    if _PYTHON.fullmatch(word):
        return sys.executable
    if "{" in word:
        raise SpecError(f"the program ({word!r}) cannot be a placeholder", field=flag)
    found = shutil.which(word)
    if found is None:
        where = "no such file" if os.sep in word else "not found on PATH"
        raise SpecError(f"{word!r}: {where}", field=flag)
    return word


# interpreters whose first positional argument is a script file (`python mytrian.py` must exist)
_INTERPRETER = re.compile(r"(python(\d+(\.\d+)?)?|bash|sh|zsh|perl|ruby|node|Rscript)")
_INLINE = {"-c", "-m", "-e", "--eval"}  # code or a module given inline: no script file to check


def _check_script(job: list[str], cwd: Path) -> None:
    """Refuse before any run a script the interpreter would fail to open (a misspelled name
    would otherwise fail the baseline and every run with "can't open file")."""
    if not _INTERPRETER.fullmatch(Path(job[0]).name) and job[0] != sys.executable:
        return
    for word in job[1:]:
        if word in _INLINE:
            return
        if word.startswith("-"):
            continue
        if "{" not in word and not (cwd / word).is_file():
            raise SpecError(f"{word!r}: no such script (looked in {cwd})", field="--objective")
        return


class CommandRunner:
    """``point -> Result`` by running a command line (see the module docstring)."""

    source = "measured"

    def __init__(self, objective: str, parameters: Sequence[str], *, metric: str, launcher: str | None = None,
                 nproc: int = 1, timeout_s: float = 3600.0, cwd: str | Path | None = None,
                 logs_dir: str | Path | None = None, env: dict[str, str] | None = None, pruner=None,
                 direction: str = "minimize"):
        self.template, self.launcher_template = objective, launcher
        self.parameters, self.metric = list(parameters), metric
        self.nproc, self.timeout_s = int(nproc), float(timeout_s)
        self.cwd = Path(cwd) if cwd else None
        self.logs_dir = Path(logs_dir) if logs_dir else None
        self.env = env
        self.runs = 0
        self.curves = _Curves(pruner, direction) if pruner is not None else None
        # False while the campaign measures rather than searches (the baseline, the noise floor, the
        # confirm step's repeats and pairs): their curves join the pruner's study, but none is stopped
        self.judging = True
        for name in RESERVED:
            if name in self.parameters and name != "nproc":
                raise SpecError(f"a parameter may not be named {{{name}}}: cubic fills it in", field=name)
        job = _split(objective, "--objective")
        launch = _split(launcher, "--launcher") if launcher else []
        if launch:
            launch[0] = _executable(launch[0], "--launcher")
            if Path(launch[0]).name == "torchrun" and _PYTHON.fullmatch(job[0]):
                job = job[1:]  # torchrun starts Python itself: `python train.py` -> `train.py`
                if not job:
                    raise SpecError("no script after python", field="--objective")
                script = (self.cwd or Path.cwd()) / job[0]
                if not job[0].startswith("-") and "{" not in job[0] and not script.is_file():
                    raise SpecError(f"{job[0]!r}: no such script", field="--objective")
            else:
                job[0] = _executable(job[0], "--objective")
        else:
            job[0] = _executable(job[0], "--objective")
        self.argv = launch + job
        # what the job is called in results: its script (`python train.py` -> train.py), else its program
        script = job[1:] if job[0] == sys.executable else job
        self.label = Path(next((w for w in script if not w.startswith("-") and "{" not in w), job[0])).name
        known = set(self.parameters) | set(RESERVED)
        used = set()
        for flag, words in (("--launcher", launch), ("--objective", job)):
            for word in words:
                if re.search(r"[{}]", _TOKEN.sub("", word)):  # `{lr` was reported as {lr} never used
                    raise SpecError(f"{word!r}: an unclosed '{{' or a lone '}}' (a literal brace is written {{{{ "
                                    "or }})", field=flag)
            for name in (n for w in words for n in placeholders(w)):
                if name not in known:
                    raise SpecError(f"unknown placeholder {{{name}}} (the space's parameters: "
                                    f"{', '.join(self.parameters)}; and {{out}}, {{nproc}})", field=flag)
                used.add(name)
        unused = [p for p in self.parameters if p not in used]
        if unused:  # the search would vary a knob the job never sees
            raise SpecError(f"the space's parameter {unused[0]!r} is not passed to the job: put "
                            f"{{{unused[0]}}} in the command line", field="--objective")
        if self.nproc != 1 and "nproc" not in used:  # it would change nothing, without a word
            raise SpecError(f"{self.nproc} processes per run, but neither --launcher nor --objective has {{nproc}} "
                            "to pass it (e.g. --launcher 'torchrun --standalone --nproc-per-node {nproc}')",
                            field="--nproc")
        self.uses_out = "out" in used
        if not launch:  # the command line's own mistakes first, then the file it names
            _check_script(job, self.cwd or Path.cwd())

    def command(self, point: dict[str, Any], out: str | Path = "") -> list[str]:
        """The argument list for ``point`` (inactive parameters' arguments dropped)."""
        return fill_all(self.argv, {"nproc": self.nproc, **point, "out": str(out)})

    def __call__(self, point: dict[str, Any]) -> Result:
        return self.run_point(point)

    def run_point(self, point: dict[str, Any]) -> Result:
        self.runs += 1
        key = stable_hash({k: point[k] for k in sorted(point)})
        if self.logs_dir is not None:
            run_dir = self.logs_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{self.runs}-{key[:8]}"
            run_dir.mkdir(parents=True, exist_ok=True)
            keep = True
        else:
            run_dir, keep = Path(tempfile.mkdtemp(prefix="cubic-job-")), False
        self._watch = None
        try:
            result = self._run(point, key, run_dir, keep)
            if self._watch is not None:  # the finished curve joins the pruner's study
                self.curves.finish(self._watch, result.metrics.get(self.metric) if result.ok else None)
            return result
        finally:
            if not keep:
                shutil.rmtree(run_dir, ignore_errors=True)

    def _run(self, point: dict[str, Any], key: str, run_dir: Path, keep: bool) -> Result:
        out_file = run_dir / "metrics.json"
        argv = self.command(point, out_file)
        header = dict(workload=self.label, config_hash=key, extra={"command": shlex.join(argv)})
        token = f"{os.getpid()}-{uuid.uuid4().hex}"  # inherited by every descendant, setsid ones included
        env = {**os.environ, **(self.env or {}), JOB_TOKEN: token}
        t0 = time.monotonic()
        with open(run_dir / "stdout", "wb") as fo, open(run_dir / "stderr", "wb") as fe:
            try:
                proc = subprocess.Popen(argv, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, cwd=self.cwd,
                                        env=env, start_new_session=True)  # its own group: stop all of it
            except OSError as e:
                return Result.failed("error", f"cannot start {argv[0]}: {e.strerror or e}", **header)
            watch = self._watch = (self.curves.watch(run_dir / "stdout", self.metric, judged=self.judging)
                                   if self.curves else None)
            try:
                rc, maxrss_kb, timed_out = _wait(proc, self.timeout_s, watch)
            finally:
                kill_tagged(token)  # what left the job's process group (setsid) ends with the run too
        wall = time.monotonic() - t0
        for name in ("stdout", "stderr"):
            cap_log(run_dir / name)
        if watch is not None and watch.curve:  # its learning curve: what credit_pruned extrapolates with
            from search.curves import thin_curve  # on use: a run without curves needs none of the search

            header["extra"]["curve"] = thin_curve(watch.curve)
        if watch is not None and watch.pruned:
            header["wall_time_s"] = wall
            return Result.failed("pruned", f"stopped early at step {watch.step} by {type(self.curves.pruner).__name__}: "
                                 f"{self.metric} {watch.value:g}", metrics={self.metric: watch.value,
                                                                           "pruned_step": float(watch.step),
                                                                           "wall_time_s": wall}, **header)
        err_tail = _tail(run_dir / "stderr", _TAIL_BYTES)
        logs = f" (logs: {run_dir})" if keep else ""
        header["wall_time_s"] = wall
        if timed_out:
            return Result.failed("timeout", f"no result after {self.timeout_s:g} s; the job was stopped{logs}",
                                 **header)
        if rc != 0:
            kind, why = classify_exit(rc, err_tail)
            return Result.failed(kind, f"{why}{logs}", **header)
        metrics = None
        if self.uses_out and out_file.is_file():
            metrics = last_metrics(_tail(out_file, _STDOUT_SCAN_BYTES), self.metric)
        if metrics is None:
            metrics = last_metrics(_tail(run_dir / "stdout", _STDOUT_SCAN_BYTES), self.metric)
        if metrics is None:
            where = "the metrics file {out} or " if self.uses_out else ""
            return Result.failed("invalid", f"exit 0, but no JSON line with {self.metric!r} in {where}stdout "
                                 f"(print e.g. {{\"{self.metric}\": 123.4}} as the last line){logs}", **header)
        if not math.isfinite(metrics[self.metric]):
            return Result.failed("nan", f"{self.metric} is {metrics[self.metric]}{logs}", metrics=metrics, **header)
        metrics.setdefault("wall_time_s", wall)
        if maxrss_kb:
            metrics.setdefault("peak_rss_bytes", float(maxrss_kb) * 1024.0)
        return Result(status="ok", metrics=metrics, **header)


LOG_CAP_BYTES = 4 << 20  # kept per stream and run: the first 1 MiB and the last 3 MiB


def cap_log(path: Path, cap: int = LOG_CAP_BYTES) -> bool:
    """Keep a job log's head (where it says what it is) and tail (where it failed, and the metrics
    line) with a marker stating the cap and what was dropped, so 1 GiB of output keeps 4 MiB.
    Done when the run ends: the file may grow while the job runs (the job writes it directly,
    with no pipe cubic must drain). True when the file was cut."""
    try:
        size = path.stat().st_size
    except OSError:
        return False
    if size <= cap:
        return False
    head_n, tail_n = cap // 4, cap - cap // 4
    with open(path, "rb") as f:
        head = f.read(head_n)
        f.seek(size - tail_n)
        tail = f.read()
    marker = (f"\n[cubic: log capped at {cap} bytes: {size - head_n - tail_n} bytes of {size} dropped "
              f"between the first {head_n} and the last {tail_n}]\n").encode()
    tmp = path.with_name(path.name + ".cap")
    tmp.write_bytes(head + marker + tail)
    os.replace(tmp, path)
    return True


def _wait(proc: subprocess.Popen, timeout_s: float, watch=None) -> tuple[int, int, bool]:
    """(exit code, peak RSS in KiB of the job's largest process, timed out). Popen.wait does not
    report resource usage, so reap with wait4; on a timeout or an interrupt the whole group goes,
    and so it does when ``watch()`` (the pruner's look at the job's output) returns True."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                _kill_group(proc.pid, signal.SIGKILL)  # stragglers it left behind
                if watch is not None:  # the lines printed since the last look: the curve's end, judged no more
                    watch(judge=False)
                return proc.returncode, usage.ru_maxrss, False
            if time.monotonic() > deadline or (watch is not None and watch()):
                _kill_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(_GRACE_S)
                except subprocess.TimeoutExpired:
                    _kill_group(proc.pid, signal.SIGKILL)
                    proc.wait()
                _kill_group(proc.pid, signal.SIGKILL)
                return proc.returncode, 0, True
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)
    except BaseException:  # Ctrl-C in the campaign: the job must not outlive it
        _kill_group(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


JOB_TOKEN = "CUBIC_JOB_TOKEN"


def kill_tagged(token: str, proc_root: str = "/proc") -> int:
    """SIGKILL every process whose environment carries ``CUBIC_JOB_TOKEN=token``; returns how many.

    Why a tag, not a cgroup or a subreaper: a child that calls setsid leaves the process group and,
    once its parent exits, is re-parented away, so neither killpg nor walking the parent links at
    the end finds it; cgroups need a writable delegated hierarchy (absent in most containers and
    for most users); PR_SET_CHILD_SUBREAPER would make the campaign reap every orphan of every
    concurrent job. The environment is inherited across fork, exec and setsid, and the token is
    unique per run. Limit: a process that clears its environment escapes (Linux only; elsewhere
    the process group is all that is stopped)."""
    needle, killed = f"{JOB_TOKEN}={token}".encode(), 0
    try:
        pids = [int(d) for d in os.listdir(proc_root) if d.isdigit()]
    except OSError:
        return 0
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            with open(f"{proc_root}/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except (OSError, ValueError):
            continue  # gone, or another user's
    return killed


class _Curves:
    """The learning curves of a runner's jobs as an in-memory Optuna study, for a pruner."""

    def __init__(self, pruner, direction: str):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.pruner = pruner
        self.study = optuna.create_study(direction=direction, pruner=pruner)

    def watch(self, stdout: Path, metric: str, judged: bool = True) -> "_Watch":
        return _Watch(self.study, stdout, metric, judged)

    def finish(self, watch: "_Watch", value: float | None) -> None:
        import optuna

        if watch.pruned:
            self.study.tell(watch.trial, state=optuna.trial.TrialState.PRUNED)
        elif value is not None and math.isfinite(value):
            self.study.tell(watch.trial, value)
        else:
            self.study.tell(watch.trial, state=optuna.trial.TrialState.FAIL)


class _Watch:
    """Reads the job's new stdout lines; reports ``{"step": n, metric: v}`` lines; True = stop."""

    def __init__(self, study, stdout: Path, metric: str, judged: bool = True):
        self.trial, self.stdout, self.metric, self.judged = study.ask(), stdout, metric, judged
        self.offset, self.partial = 0, b""
        self.step, self.value, self.pruned = None, None, False
        self.curve: list[tuple[int, float]] = []

    def __call__(self, judge: bool = True) -> bool:
        try:
            with open(self.stdout, "rb") as f:
                f.seek(self.offset)
                data = f.read(1 << 20)
        except OSError:
            return False
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            obj = _json_object(line)
            if obj is None or not _number(obj.get("step")) or not _number(obj.get(self.metric)):
                continue
            self.step, self.value = int(obj["step"]), float(obj[self.metric])
            if math.isfinite(self.value):
                self.curve.append((self.step, self.value))
                self.trial.report(self.value, self.step)
                if judge and self.judged and self.trial.should_prune():
                    self.pruned = True
                    return True
        return False


def _json_object(line: bytes) -> dict | None:
    line = line.strip()
    if not line.startswith(b"{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, n: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def classify_exit(rc: int, stderr_tail: str) -> tuple[str, str]:
    """(failure kind, reason) of a job that exited with ``rc`` != 0."""
    last = next((ln.strip() for ln in reversed(stderr_tail.splitlines()) if ln.strip()), "")
    last = f": {last[:300]}" if last else ""
    sig = -rc if rc < 0 else (rc - 128 if 128 < rc < 160 else 0)  # a shell or launcher reports 128 + signal
    for s in OOM_SIGNATURES:
        if s in stderr_tail:
            return "oom", f"out of memory ({s!r} in stderr, exit {rc}){last}"
    if sig == signal.SIGKILL:
        return "oom", f"killed by SIGKILL (exit {rc}), the mark of the kernel's OOM killer{last}"
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return "killed", f"killed by {name} (exit {rc}){last}"
    return "error", f"exit {rc}{last}"


def last_metrics(text: str, metric: str) -> dict[str, float] | None:
    """Numeric fields of the last JSON object line in ``text`` that has ``metric`` (or of the
    whole text, when it is one JSON object, as a metrics file may be)."""
    stripped = text.strip()
    if stripped.startswith("{") and "\n" in stripped:
        try:
            whole = json.loads(stripped)
        except ValueError:
            whole = None
        if isinstance(whole, dict) and _number(whole.get(metric)):
            return _numeric(whole)
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and _number(obj.get(metric)):
            return _numeric(obj)
    return None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _numeric(obj: dict[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in obj.items() if _number(v)}
