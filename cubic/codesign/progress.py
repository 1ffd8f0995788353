"""Live progress of a campaign: one line per finished run, and a progress bar on a terminal.

The campaign engine (:mod:`cubic.codesign.campaign`) never writes to the terminal: it tells a
:class:`~cubic.codesign.campaign.CampaignListener`. The entry points (``cubic campaign run|resume|
work`` and ``python -m cubic.codesign.worker``) pass :class:`ProgressLines`, which prints on stderr
(stdout stays for the summary and ``--json``):

    c1 run 3/12 (trial 2): batch_size=1024 kernels.dense_dtype=bf16 -> examples/s 1,234,567
    [1,200,000, 1,260,000], NE 0.912, peak memory 11.5 GiB; measured; predicted examples/s 1,100,000
    by the proxy (gbm, P(feasible) 0.93)

(one line). On a terminal a rich bar stays under the lines; anywhere else (a pipe, a file, CI)
the lines are plain text, never cut or wrapped, and there is no bar.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from cubic.codesign.answer import fmt
from cubic.codesign.campaign import CampaignListener, RunEvent
from cubic.codesign.trials import MEMORY_METRICS, NE_METRICS, PROVENANCE, first_metric, is_run
from cubic.core.result import Result
from cubic.core.units import fmt_gib
from cubic.core.spec import sanitize
from cubic.core.stats import ci_names
from search.space import Space

UNITS = {"examples_per_s": "examples/s", "examples_per_s_per_gpu": "examples/s per GPU",
         "step_time_median_ms": "step ms", "wall_time_s": "wall s"}


def varying(space: Space) -> list[str]:
    """The parameters that can take more than one value (the ones worth printing per run)."""
    return [p.name for p in space.parameters if p.count() != 1]


def _value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _metric(metrics: dict[str, float], name: str) -> str | None:
    v = metrics.get(name)
    if not isinstance(v, (int, float)):
        return None
    out = f"{UNITS.get(name, name)} {fmt(float(v))}"
    lo, hi = (metrics.get(n) for n in ci_names(name))
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and hi > lo:  # (a simulation's is a point)
        out += f" [{fmt(float(lo))}, {fmt(float(hi))}]"  # the 95% interval
    return out


def format_run(e: RunEvent, space: Space, knobs: list[str] | None = None) -> str:
    """One line for one finished run: trial, the varying knobs as k=v, the result (the primary
    metric with its 95% interval, NE, peak memory; or the failure kind and reason), where the figures
    come from (measured, simulated, served from the trial store) and what the strategy predicted."""
    ev = e.evaluation
    knobs = varying(space) if knobs is None else knobs
    config = " ".join(f"{k}={_value(e.point[k])}" for k in knobs if k in e.point) or "(default point)"
    head = f"{e.campaign} run {e.runs}/{e.budget} (trial {e.trial}): {config}"
    result = format_result(ev, space, e.violation)
    where = PROVENANCE[e.provenance] + (" (SIMULATED)" if e.provenance == "served" and ev.source == "simulated" else "")
    line = f"{head} -> {result}; {where}"
    if e.attempts > 1:
        line += f" after {e.attempts} attempts"
    pred = _prediction(e.predicted, space)
    return line + (f"; {pred}" if pred else "")


def format_result(ev: Result, space: Space, violation: float = 0.0) -> str:
    """A run's outcome in a few words: the primary metric with its 95% interval, NE and peak memory
    (and INFEASIBLE with the constraints it breaks), ``PRUNED: reason`` for a run a pruner stopped
    (a decision, not a failure), or ``FAILED <kind>: reason`` on one line."""
    m = ev.metrics
    if not ev.ok:
        reason = " ".join((ev.reason or "").split())[:500]
        head = "PRUNED" if ev.failure_kind == "pruned" else f"FAILED {ev.failure_kind or 'error'}"
        return head + (f": {reason}" if reason else "")
    primary = space.primary.metric
    shown = _metric(m, primary)
    basis = (((ev.extra or {}).get("pooled") or {}).get("estimates") or {}).get(primary, {}).get("basis")
    if shown and basis and "[" in shown:  # what the interval rests on, as every view says it
        shown += f" ({basis})"
    parts = [p for p in (shown,) if p]
    ne = first_metric(m, NE_METRICS)
    if ne is not None and primary not in NE_METRICS:
        from cubic.codesign.evaluate import examples_text

        at = m.get("examples_budget") if "ne_at_budget" in m else None
        parts.append(f"NE {ne:.4f}" + (f" at {examples_text(at)} examples" if at else ""))
    mem = first_metric(m, MEMORY_METRICS)
    if mem is not None:
        parts.append(f"peak memory {fmt_gib(mem)}")
    if isinstance(m.get("repeats"), (int, float)) and m["repeats"] > 1:
        parts.append(f"{int(m['repeats'])} repeats")
    result = ", ".join(parts) or "ok"
    broken = [_broken(c, m) for c in space.constraints if c.violation(m) > 0]
    if violation > 0 and broken:
        result += f"; INFEASIBLE: {'; '.join(broken)}"
    return result


def _broken(c, m: dict[str, float]) -> str:
    """A broken constraint with its value and limit: ``loss 0.71 > 0.6``."""
    v = float(m[c.metric])
    show = fmt_gib if c.metric in MEMORY_METRICS else fmt
    bound = f"> {show(c.max)}" if c.max is not None and v > c.max else f"< {show(c.min)}"
    name = f" ({c.name})" if c.name and c.name != c.metric else ""
    return f"{c.metric} {show(v)} {bound}{name}"


def _prediction(p: dict[str, Any] | None, space: Space) -> str | None:
    if not p:
        return None
    metric = space.primary.metric
    pf = p.get("p_feasible") if isinstance(p.get("p_feasible"), (int, float)) else None
    if p.get("source"):  # e.g. the step-model prior of the first round
        by = f"the {p['source']}"
    else:
        extras = ([str(p["family"])] if p.get("family") else []) + ([f"P(feasible) {pf:.2f}"] if pf is not None else [])
        by = "the proxy" + (f" ({', '.join(extras)})" if extras else "")
    if isinstance(p.get(metric), (int, float)):
        return f"predicted {UNITS.get(metric, metric)} {fmt(float(p[metric]))} by {by}"
    if pf is not None:
        return f"predicted by {by}"
    return None


class TerminalBar:
    """A rich progress bar on a terminal's stderr, with lines printed above it."""

    def __init__(self, console, description: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeRemainingColumn(), console=console, transient=True)
        self.task = self.progress.add_task(description, total=None)
        self.progress.start()

    def update(self, done: int, total: int) -> None:
        self.progress.update(self.task, completed=done, total=total)

    def print(self, line: str) -> None:
        # text, not markup: a knob value such as "[1, 2]" is shown as it is
        self.progress.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        self.progress.stop()


def terminal_bar(description: str, stream: TextIO | None = None) -> TerminalBar | None:
    """A bar when ``stream`` (default stderr) is a terminal; None otherwise (plain lines only)."""
    stream = stream or sys.stderr
    isatty = getattr(stream, "isatty", None)
    if not (isatty and isatty()):  # the stream itself: FORCE_COLOR in CI must not draw a bar into a log
        return None
    from rich.console import Console

    return TerminalBar(Console(file=stream), description)


class ProgressLines(CampaignListener):
    """The campaign listener the entry points pass: :func:`format_run` per run, on stderr."""

    def __init__(self, space: Space, stream: TextIO | None = None):
        self.space, self.knobs = space, varying(space)
        self.stream = stream
        self._lock = threading.Lock()
        self._bar = None
        self._closed = False
        self._t0: float | None = None  # when this process started running points
        self._done = 0  # runs finished by this process (what the ETA is paced on)
        self._best: tuple[float, str] | None = None  # (objective value, text) of the best feasible run so far

    def _print(self, line: str) -> None:
        if self._bar is not None:
            self._bar.print(line)
        elif not self._closed:
            try:
                print(line, file=self.stream or sys.stderr, flush=True)
            except (BrokenPipeError, ValueError):  # the reader went away (`| head`): the campaign goes on
                self._closed = True

    def started_run(self, campaign: str, trial: int, point: dict[str, Any], runs: int, budget: int) -> None:
        config = " ".join(f"{k}={_value(point[k])}" for k in self.knobs if k in point) or "(default point)"
        with self._lock:
            if self._t0 is None:
                self._t0 = time.monotonic()
            self._print(sanitize(f"{campaign} run {min(runs + 1, budget)}/{budget} (trial {trial}) starts: {config}"))

    def _tail(self, event: RunEvent) -> str:
        """Best so far, runs left and the ETA (this process's pace), after a run's line."""
        ev = event.evaluation
        if ev.ok and event.violation <= 0:
            self._consider(ev.metrics, event.trial)
        self._done += 1
        left = max(0, event.budget - event.runs)
        parts = [f"best so far {self._best[1] if self._best else 'none feasible'}", f"{left} runs left"]
        if left and self._t0 is not None:
            eta = (time.monotonic() - self._t0) / self._done * left
            parts.append(f"ETA {eta / 60:.1f} min" if eta >= 90 else f"ETA {eta:.0f} s")
        return " | " + "; ".join(parts)

    def _consider(self, metrics: dict[str, Any], trial: int) -> None:
        primary = self.space.primary
        v = metrics.get(primary.metric)
        if isinstance(v, (int, float)):
            score = float(v) if primary.direction == "maximize" else -float(v)
            if self._best is None or score > self._best[0]:
                self._best = (score, (_metric(metrics, primary.metric) or fmt(float(v))) + f" (trial {trial})")

    def seen(self, trials) -> None:
        """Runs finished before this process (a resumed campaign's): "best so far" counts them (it
        forgot them, and named a worse run the best)."""
        with self._lock:
            for t in trials:
                a = t.user_attrs
                if is_run(t) and a.get("ok") and (a.get("violation") or 0) <= 0:
                    self._consider(a.get("metrics") or {}, t.number)

    def started(self, campaign: str, runs: int, budget: int) -> None:
        with self._lock:
            if self._bar is None:
                self._bar = terminal_bar(f"campaign {sanitize(campaign)}", self.stream)
            if self._bar is not None:
                self._bar.update(min(runs, budget), budget)

    def finished_run(self, event: RunEvent) -> None:
        with self._lock:
            line = sanitize(format_run(event, self.space, self.knobs) + self._tail(event))
            self._print(line)
            if self._bar is not None:
                self._bar.update(min(event.runs, event.budget), event.budget)

    def retrying(self, campaign: str, trial: int, point: dict[str, Any], retry: int, allowed: int,
                 failed: Result) -> None:
        why = " ".join((failed.reason or "").split())[:200]
        with self._lock:
            self._print(sanitize(f"{campaign} trial {trial}: retry {retry} of {allowed} after "
                                 f"{failed.failure_kind}" + (f" ({why})" if why else "")))

    def lost_run(self, campaign: str, trial: int, point: dict[str, Any]) -> None:
        with self._lock:
            self._print(sanitize(f"{campaign} trial {trial}: this run is not told (the trial was taken back while "
                                 "this process was silent past the heartbeat's grace period; another worker's "
                                 "attempt counts)"))

    def lost_take(self, campaign: str, trial: int) -> None:
        with self._lock:
            self._print(sanitize(f"{campaign} trial {trial}: taken back before its run began (this process was "
                                 "silent past the heartbeat's grace period; another worker's attempt counts)"))

    def lease_lost(self, campaign: str) -> None:
        with self._lock:
            self._print(sanitize(f"{campaign}: this worker's lease lapsed and another process coordinates now; "
                                 "this one runs points"))

    def stopped(self, campaign: str, reason: str) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
