"""One hostile-input attack and how it is judged (``experiments/reliability_inputs.py`` runs them).

An :class:`Attack` is a command (cubic's CLI, its campaign worker, or a user's job program) with the
files it is given; :func:`run_attack` runs it in a child process, memory-capped and time-limited, in
its own working directory, and judges the :class:`Outcome`: within its limit, no traceback, the
expected exit code, (for bad input) exactly one ``cubic: ...`` line on stderr saying what it must,
nothing forbidden in the output, no stored row lost, (for bad input) no row recorded, and nothing
left behind that it must not create.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cubic.testing import error_lines

REPO = Path(__file__).resolve().parents[2]
MEM_LIMIT_BYTES = 8 * 2**30  # a regression (an alias bomb expanding) fails this child, not the machine
CLI = "import sys; from cubic.cli.app import main; sys.exit(main(sys.argv[1:]))"
WORKER = "import sys; from cubic.codesign.worker import main; sys.exit(main(sys.argv[1:]))"


@dataclass
class Outcome:
    cls: str
    variant: str
    ok: bool
    rc: int | None
    elapsed_s: float
    hung: bool = False
    traceback: bool = False
    data_lost: int = 0
    why: str = ""
    stderr_tail: str = ""


@dataclass
class Attack:
    cls: str
    variant: str
    argv: list[str]
    setup: Callable[[Path], None] | None = None
    expect_rc: tuple[int, ...] = (2,)
    must_say: tuple[str, ...] = ()  # substrings of stderr (the file, field or row named)
    forbid: tuple[str, ...] = ()  # anywhere in stdout+stderr
    one_line: bool = True  # stderr holds exactly one line (besides progress, warnings and notes)
    timeout_s: float = 60.0
    program: str = CLI
    env: dict[str, str] = field(default_factory=dict)
    rows: Callable[[Path], int] | None = None  # stored rows that must survive the command
    fsize_limit: int | None = None  # RLIMIT_FSIZE: a full disk
    quick: bool = False  # part of the reduced form run by `make test`
    absent: tuple[str, ...] = ()  # paths (in the attack's directory) the command must not create


def run_attack(attack: Attack, wd: Path) -> Outcome:
    """Run ``attack`` in ``wd`` (a child process, memory-capped, time-limited) and judge it."""
    # the worker imports its --evaluate module by name: from the attack's directory
    path = f"{REPO}{os.pathsep}{wd}" if attack.program == WORKER else str(REPO)
    env = {k: v for k, v in os.environ.items() if k not in ("CUBIC_STORE", "CUBIC_CAMPAIGNS")}  # the attack's own
    env = {**env, "PYTHONPATH": path, "CUBIC_DB_CONNECT_TIMEOUT_S": "3", **attack.env}

    def limits():  # noqa: ANN202 -- in the child, before exec
        resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT_BYTES, MEM_LIMIT_BYTES))
        if attack.fsize_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (attack.fsize_limit, attack.fsize_limit))

    before = attack.rows(wd) if attack.rows else 0
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-P", "-c", attack.program, *attack.argv], cwd=wd, env=env,
                              capture_output=True, text=True, errors="replace", timeout=attack.timeout_s,
                              preexec_fn=limits)
    except subprocess.TimeoutExpired as e:
        err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return Outcome(attack.cls, attack.variant, False, None, round(time.monotonic() - t0, 2), hung=True,
                       why=f"no answer within {attack.timeout_s:g} s", stderr_tail=err[-300:])
    elapsed = round(time.monotonic() - t0, 2)
    out, err = proc.stdout, proc.stderr
    lines = error_lines(err)  # live progress, warnings and notes aside (the tests' rule)
    why = []
    tb = "Traceback (most recent call last)" in err
    if tb:
        why.append("traceback")
    if proc.returncode not in attack.expect_rc:
        why.append(f"exit {proc.returncode}, expected {attack.expect_rc}")
    if attack.one_line and (len(lines) != 1 or not lines[0].startswith(("cubic: ", "cubic.codesign.worker: "))):
        why.append(f"{len(lines)} stderr lines, expected one 'cubic: ...' line")
    for s in attack.must_say:
        if s not in err:
            why.append(f"stderr does not say {s!r}")
    for s in attack.forbid:
        if s in out or s in err:
            why.append(f"output holds {s!r}")
    after = attack.rows(wd) if attack.rows else 0
    lost = max(0, before - after)
    if lost:
        why.append(f"{lost} stored rows lost")
    if attack.expect_rc == (2,) and after > before:  # bad input records nothing
        why.append(f"{after - before} rows recorded")
    made = [a for a in attack.absent if (wd / a).exists()]
    if made:
        why.append(f"left behind {made}")
    return Outcome(attack.cls, attack.variant, not why, proc.returncode, elapsed, traceback=tb, data_lost=lost,
                   why="; ".join(why), stderr_tail=err[-300:])


def write_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
