"""Helpers every ``cubic`` sub-command may reuse: the store argument, progress, consoles, numeric
flag parsers, and the runner a ``--device``/``--simulate`` flag names."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from cubic.core.argtypes import (  # noqa: F401  (the flag types: one home, below the CLI)
    finite_float, fraction, int_at_most, int_list_at_most, nonnegative_float, nonnegative_int, port, positive_float,
    positive_float_at_most, positive_int)
from cubic.core.spec import SpecError

STORE_HELP = "trial store URL (SQLAlchemy, e.g. postgresql+psycopg2://user@host/db); " \
             "default $CUBIC_STORE or sqlite:///./.cubic/trials.db"

# -- helpers other nouns may reuse ----------------------------------------------------------------

def safe_console(**kw: Any):
    """A rich Console that shows control characters in any text it prints escaped (see
    :func:`cubic.core.spec.sanitize`): names from user files and the store reach the terminal
    through rich tables, and rich passes ESC through."""
    from rich.console import Console
    from rich.segment import Segment

    from cubic.core.spec import sanitize

    class SafeConsole(Console):
        def _render_buffer(self, buffer):  # every text segment passes here before it is written
            return super()._render_buffer(s if s.control else Segment(sanitize(s.text), s.style) for s in buffer)

    return SafeConsole(**kw)


# the width a console pretends to have off a terminal: wide enough that nothing is ever cut or folded
PLAIN_WIDTH = 100_000


def stdout_console():
    # a pipe or file gets colourless output that is never cut to a width nor folded over lines
    return safe_console() if sys.stdout.isatty() else safe_console(width=PLAIN_WIDTH, no_color=True, soft_wrap=True)


def plain_table(columns: list[str], rows: list[list[Any]]) -> str:
    """Rows as aligned plain text (two spaces between columns, the last one unpadded): nothing cut,
    nothing wrapped, whatever the width, for a pipe, a file or a log."""
    from cubic.core.spec import sanitize

    cells = [[sanitize(" ".join(str(c).split())) for c in row] for row in [columns, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + ("  " if len(r) > 1 else "") + r[-1]
                     for r in cells)


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    """A table on stdout: rich on a terminal; :func:`plain_table` anywhere else (never cut)."""
    if not sys.stdout.isatty():
        from cubic.core.spec import sanitize

        print(sanitize(title))
        print(plain_table(columns, rows))
        return
    from rich.table import Table

    t = Table(title=title)
    for col in columns:
        t.add_column(col)
    for r in rows:
        t.add_row(*(str(c) for c in r))
    stdout_console().print(t)


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", metavar="URL", default=None, help=STORE_HELP)


def open_store(args: argparse.Namespace, create: bool = True):
    """The trial store the command names, after importing any results a failed write left pending.
    ``create`` False: a command that only reads; a SQLite store that does not exist is
    ``cubic.core.store.NoStore`` (one line), not an empty store made at a mistyped path."""
    from cubic.core.store import TrialStore

    url = getattr(args, "store", None)
    return import_pending(TrialStore(url, origin="--store", create=create) if url else TrialStore(create=create))


def import_pending(store):
    """Import the pending file's results meant for ``store`` and say so in one line (stderr)."""
    from cubic.core.store import StoreError, pending_path

    try:
        n = store.import_pending()
    except StoreError as e:  # still failing: the rows stay pending; the command's own write will say so
        print(f"cubic: {pending_path()} not imported yet: {e}", file=sys.stderr)
        return store
    if n:
        print(f"cubic: imported {n} pending result{'s' if n != 1 else ''} from {pending_path()} into the trial "
              "store", file=sys.stderr)
    return store


@contextmanager
def progress_bar(description: str) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr (drawn only on a terminal); yields ``callback(done, total)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = safe_console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console, disable=not console.is_terminal, transient=True) as progress:
        task = progress.add_task(description, total=None)

        def callback(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield callback


def _output_dir(text: str) -> Path:
    """A folder a command will write into, made (with its parents, as `--report reports/own` in the
    README needs) only when the command writes: a command refused as bad input leaves nothing behind.
    Checked now, not after the work: the nearest folder that exists is a writable folder."""
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; give a folder")
    near = next(a for a in (p, *p.parents) if a.exists())
    if not near.is_dir():
        raise argparse.ArgumentTypeError(f"cannot create the folder {text}: {near} is a file")
    if not os.access(near, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot create the folder {text}: {near} is not writable")
    return p


def user_data_output(name: str) -> Path:
    """A command's default output in the user's data folder ($CUBIC_HOME, else $XDG_DATA_HOME/cubic,
    else ~/.local/share/cubic), checked before the work as a typed --out is: a CUBIC_HOME that is a
    file or cannot be made was found after the measurement, named by its path only."""
    from cubic.core.fingerprint import user_data_dir

    path = Path(user_data_dir()) / name
    try:
        _output_dir(str(path.parent))
    except argparse.ArgumentTypeError as e:
        where = next((v for v in ("CUBIC_HOME", "XDG_DATA_HOME") if os.environ.get(v)), "--out")
        raise SpecError(f"{e} (where --out writes by default; give --out FILE)", field=where) from None
    return path


def _writable_path(path: str, what: str) -> Path:
    """Check an output path before long work starts, so a typo does not waste a run."""
    p = Path(path)
    if not p.parent.is_dir():
        raise SpecError("the directory does not exist", source=str(p), field=what)
    return p


def load_checked_config(path: str, processes: int | None = 1):
    """The config file at ``path``, its values checked against what exists and against a run on
    ``processes`` ranks (the --world-size flag; None when any size fits, a simulated cluster) before
    anything runs or is recorded: ``cubic.runners.base.check_run_config``."""
    from cubic.core.config import load_config
    from cubic.runners.base import check_run_config

    config = load_config(path)
    check_run_config(config, processes, source=str(path))
    return config


# -- workloads ------------------------------------------------------------------------------------


def check_topology_refs(topo, source: str | None, device_flag: str | None = None) -> None:
    """The device (name or file) and the comm calibration file a topology names exist: refused here,
    naming the workload file and field (or the flag that gave the device), not later as a failed run
    when a planner or the estimator reads them."""
    from cost_models.comm import calibration_file
    from cost_models.hardware import load_device

    if topo.device != "cpu":
        load_device(topo.device, field=device_flag or "topology.device", source=None if device_flag else source)
    if topo.comm_calibration is not None:
        calibration_file(topo.comm_calibration, "topology.comm_calibration", source=source)


def runner_part(module: str, attr: str, what: str, flag: str):
    """``module.attr`` of an optional runner part, or a one-line SpecError naming the flag when this
    installation lacks that module (an ImportError inside it still raises as itself)."""
    import importlib

    try:
        return getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise SpecError(f"{what} ({module}) is not available in this installation", field=flag) from None


def check_local_device(device: str) -> None:
    """A CUDA device this process cannot see is bad input, refused before anything is recorded (it
    was recorded as a failed trial: 'Torch not compiled with CUDA enabled'). Only for runs in this
    process's machine: a Ray cluster's nodes may have what the coordinator lacks."""
    from cubic.core.fingerprint import check_device

    if device != "auto":
        check_device(device)


def local_runner(timeout_s: float, device: str, threads: int | None = None):
    LocalRunner = runner_part("cubic.runners.local", "LocalRunner", "the local runner", "run")
    return LocalRunner(timeout_s=timeout_s, device=device, threads=threads)


def _simulated_runner(spec: str):
    return runner_part("cubic.runners.sim", "SimulatedRunner", "the simulated cluster", "--simulate").from_spec(spec)


def _make_runner(args: argparse.Namespace):
    if args.simulate:
        return _simulated_runner(args.simulate)
    check_local_device(args.device)
    return local_runner(args.timeout, args.device, getattr(args, "threads", None))


def _expected_fingerprint_hash(runner: Any) -> str | None:
    """See :func:`cubic.runners.local.expected_fingerprint_hash` (the one implementation)."""
    from cubic.runners.local import expected_fingerprint_hash

    return expected_fingerprint_hash(runner)


def default_storage() -> str:
    """The campaigns' Optuna storage when --storage is not given."""
    return os.environ.get("CUBIC_CAMPAIGNS", "sqlite:///./.cubic/campaigns.db")
