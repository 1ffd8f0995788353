"""Terminal rendering (rich) of results, trial lists and workloads; used by the CLI and reusable.

Simulated figures are modelled, not measured: every rendering of one says SIMULATED.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from cubic.core.result import Result
from cubic.core.spec import Workload
from cubic.core.units import fmt_gib

PHASE_ORDER = ("embedding_fwd", "embedding_bwd", "dense_fwd", "dense_bwd", "optimizer", "communication")


def fmt_bytes(n: float | None) -> str:
    if n is None or not math.isfinite(n):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_num(x: float | None, digits: int = 4) -> str:
    """Compact, readable: 12,345 / 123.4 / 41.5 / 1.25 / 0.6931; NaN shown as NaN (a diverged run says so)."""
    if x is None:
        return "-"
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.{digits}g}"


def _arrow(m: dict[str, float], start: str, end: str) -> str | None:
    if start not in m and end not in m:
        return None
    return f"{fmt_num(m.get(start))} -> {fmt_num(m.get(end))}"


def source_label(source: str) -> Text:
    if source == "simulated":
        return Text("SIMULATED", style="bold magenta")
    return Text("measured", style="cyan")


def result_renderable(result: Result, *, trial_id: int | None = None, served_from_store: bool = False) -> Group:
    """The headline table of one run, its per-phase breakdown, and the failure reason if failed."""
    m = result.metrics
    parts: list[Any] = []
    head = Text()
    head.append(f"{result.workload or '?'}", style="bold")
    head.append("  ")
    if result.source == "simulated":
        head.append("SIMULATED (modelled, not measured)", style="bold magenta")
    else:
        where = result.fingerprint.get("gpu_name") or result.fingerprint.get("cpu_model") or ""
        head.append(f"measured{' on ' + str(where) if where else ''}", style="cyan")
    head.append("  ")
    head.append("OK" if result.ok else f"FAILED ({result.failure_kind})", style="bold green" if result.ok else "bold red")
    parts.append(head)
    ids = [f"config {result.config_hash or '?'}", f"seed {result.seed}"]
    if trial_id is not None:
        ids.append(f"trial #{trial_id}")
    if served_from_store:
        ids.append("served from the trial store (use --force to run again)")
    parts.append(Text(" | ".join(ids), style="dim"))

    table = Table(show_header=True, header_style="bold", title=None)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows: list[tuple[str, str | None]] = [
        ("throughput (examples/s)", fmt_num(m["examples_per_s"]) if "examples_per_s" in m else None),
        ("step time median (ms)", fmt_num(m["step_time_median_ms"]) if "step_time_median_ms" in m else None),
        ("step time p90 (ms)", fmt_num(m["step_time_p90_ms"]) if "step_time_p90_ms" in m else None),
        ("peak memory", fmt_gib(m["peak_mem_bytes"]) if "peak_mem_bytes" in m else None),
        ("loss start -> end", _arrow(m, "loss_start", "loss_end")),
        ("NE start -> end", _arrow(m, "ne_start", "ne_end")),
        ("wall time (s)", fmt_num(result.wall_time_s) if result.wall_time_s else None),
    ]
    known = {"examples_per_s", "step_time_median_ms", "step_time_p90_ms", "peak_mem_bytes",
             "loss_start", "loss_end", "ne_start", "ne_end"}
    # a metric's _ci_lo/_ci_hi are left to interval_line, the one interval shown (one run's timing
    # windows are not an interval of what a fresh run measures)
    rows += [(k, f"{int(v):,}" if float(v).is_integer() else fmt_num(v)) for k, v in sorted(m.items())
             if k not in known and not k.endswith(("_ci_lo", "_ci_hi", "_ci_lo_ms", "_ci_hi_ms"))]
    for name, value in rows:
        if value is not None:
            table.add_row(name, value)
    if table.row_count:
        parts.append(table)

    if result.phases_ms:
        phases = Table(show_header=True, header_style="bold")
        phases.add_column("phase")
        phases.add_column("ms/step", justify="right")
        phases.add_column("share", justify="right")
        total = sum(v for v in result.phases_ms.values() if math.isfinite(v)) or 1.0
        ordered = [p for p in PHASE_ORDER if p in result.phases_ms]
        ordered += sorted(p for p in result.phases_ms if p not in PHASE_ORDER)
        for p in ordered:
            v = result.phases_ms[p]
            phases.add_row(p, fmt_num(v), f"{100 * v / total:.0f}%" if math.isfinite(v) else "-")
        parts.append(phases)

    for note in (result.extra or {}).get("notes") or []:  # what the runner says its figures do not mean
        parts.append(Text(f"note: {note}", style="yellow"))
    if not result.ok:
        parts.append(Text(f"failure ({result.failure_kind}): {result.reason or 'no reason given'}", style="red"))
    return Group(*parts)


def interval_line(result: Result) -> str | None:
    """A configuration's throughput as every view shows it (``cubic run``, ``cubic trials show``;
    the campaign's lines, summary, answer and report show the same cubic.core.stats.estimate): the
    median with the 95% interval of what a fresh run measures and what it rests on."""
    p = (result.extra or {}).get("pooled")
    est = (p or {}).get("estimates", {}).get("examples_per_s")
    if not p or not est:
        return None
    if result.source == "simulated":  # a zero-width "95% interval" of a model would claim what nothing measured
        note = (result.extra or {}).get("note") or "SIMULATED"  # the simulator's SIM_NOTE: what it was checked on
        return f"examples/s {est['value']:,.0f}, no interval: the model gives the same figure on every run; {note}"
    cont = p["n_contended"]
    how = "" if not cont else (f", {cont} contended (all used)" if p["contended"]
                               else f", {cont} contended (excluded)")
    basis = est.get("basis") or f"{p['n_used']} repeat{'s' if p['n_used'] != 1 else ''}"
    return (f"examples/s {est['value']:,.0f}, 95% interval of a fresh run [{est['lo']:,.0f}, {est['hi']:,.0f}] "
            f"({basis}){how}")


def print_result(result: Result, console: Console | None = None, **kw: Any) -> None:
    from cubic.cli.common import stdout_console

    (console or stdout_console()).print(result_renderable(result, **kw))


def trials_table(trials: Iterable[Any], title: str | None = None,
                 campaign_names: dict[int, str] | None = None) -> Table:
    """One row per stored trial (:class:`cubic.core.store.Trial`); campaigns by name when given."""
    names = campaign_names or {}
    table = Table(title=title, header_style="bold")
    for col, justify in (("id", "right"), ("created (UTC)", "left"), ("workload", "left"), ("source", "left"),
                         ("status", "left"), ("examples/s", "right"), ("step ms", "right"),
                         ("NE end", "right"), ("config", "left"), ("campaign", "left"), ("reason", "left")):
        table.add_column(col, justify=justify, overflow="fold")
    for t in trials:
        m = t.result.metrics
        status = Text("ok", style="green") if t.status == "ok" else Text(f"failed:{t.failure_kind}", style="red")
        table.add_row(
            str(t.id),
            t.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            t.workload,
            source_label(t.source),
            status,
            fmt_num(m.get("examples_per_s")),
            fmt_num(m.get("step_time_median_ms")),
            fmt_num(m.get("ne_end")),
            _config_cell(t),
            "-" if t.campaign_id is None else names.get(t.campaign_id, str(t.campaign_id)),
            (t.reason or "")[:60],
        )
    return table


def _config_cell(t: Any) -> str:
    """A trial's config: its hash; a user's job (--objective): the values filled into its command
    line, and the job's own figures (what the examples/s, step ms and NE columns cannot name)."""
    if (t.config or {}).get("kind") != "job":
        return t.config_hash
    values = " ".join(f"{k}={v}" for k, v in sorted((t.config.get("values") or {}).items()))
    shown = {"examples_per_s", "step_time_median_ms", "ne_end", "wall_time_s", "peak_rss_bytes"}
    figures = ", ".join(f"{k} {fmt_num(v)}" for k, v in sorted(t.result.metrics.items())
                        if k not in shown and not k.endswith(("_ci_lo", "_ci_hi")))[:200]
    return f"job {values or '(no values)'}" + (f" -> {figures}" if figures else "")


def arch_summary(w: Workload) -> str:
    a = w.dense_arch
    if a.kind == "dlrm":
        return f"dlrm bottom={a.bottom_mlp} top={a.top_mlp}"
    if a.kind == "wukong":
        return f"wukong layers={a.num_layers} d={a.emb_dim} lcb={a.num_emb_lcb} fmb={a.num_emb_fmb} k={a.rank_fmb}"
    return f"dmt towers={a.num_towers} tower_dim={a.tower_dim} top={a.top_mlp}"


def workload_summary(w: Workload) -> dict[str, Any]:
    return {
        "name": w.name,
        "tables": len(w.tables),
        "table_bytes_fp32": sum(t.bytes_fp32() for t in w.tables),
        "dense_arch": w.dense_arch.kind,
        "dense_arch_summary": arch_summary(w),
        "batch_size": w.batch_size,
        "world_size": w.topology.world_size,
        "device": w.topology.device,
        "description": w.description,
    }


def workloads_table(workloads: Iterable[Workload]) -> Table:
    table = Table(header_style="bold")
    for col, justify in (("name", "left"), ("tables", "right"), ("table bytes (fp32)", "right"),
                         ("dense arch", "left"), ("batch/rank", "right"), ("topology", "left")):
        table.add_column(col, justify=justify, overflow="fold")
    for w in workloads:
        s = workload_summary(w)
        table.add_row(s["name"], str(s["tables"]), fmt_bytes(s["table_bytes_fp32"]), s["dense_arch_summary"],
                      str(s["batch_size"]), f"{s['world_size']} x {s['device']}")
    return table
