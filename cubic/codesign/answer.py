"""The answer a campaign exists for, first in its report: the winner against the baseline.

:func:`campaign_answer` takes what the report already loaded (the space, the campaign's stored
settings, its Optuna study and finished trials, the fANOVA importances and the winning job config)
and returns an :class:`Answer`: the primary metric of the winner against the baseline (a speedup
for a throughput, with its interval when both runs measured one -- ``<metric>_ci_lo/_ci_hi`` --
else "single sample"), the change in NE and in peak memory, and the knobs that differ and how much
each mattered. It renders as markdown and HTML; sections that do not apply are left out and say
why. :func:`write_answer` writes ``answer.md`` and ``winner.yaml``: for cubic's own campaigns
exactly a :class:`cubic.core.config.Config` document (``cubic run --config winner.yaml`` takes it
unchanged), for a user's job the winning parameter values (``--baseline winner.yaml`` takes them).

The baseline is the run :meth:`cubic.codesign.campaign.Campaign.measure_baseline` stored with the
study (``--baseline FILE``, else the workload's defaults / the space's :func:`default_point`), or
else a campaign run at the default point; without one, the answer says so and shows no speedup.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cubic.core.units import GIB
from cubic.codesign.campaign import BASELINE_KEY
from cubic.codesign.trials import MEMORY_METRICS, NE_METRICS, trial_observation
from search.space import Space
from search.strategies import objective_value

MIN_IMPORTANCE_RUNS = 4  # fANOVA needs a few completed runs (the report computes it from 4)


def fmt(x: float | None) -> str:
    """A number for people: 3 significant digits, thousands separated, no exponent in between."""
    if x is None or not isinstance(x, (int, float)) or isinstance(x, bool):
        return str(x)
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    if mag >= 3:
        return f"{round(x, 2 - mag):,.0f}"
    if mag >= -4:
        return f"{x:.{max(0, 2 - mag)}f}"
    return f"{x:.2e}"


def _pct(new: float, old: float) -> str:
    if not old:
        return ""
    d = (new - old) / abs(old) * 100
    return f"{'+' if d >= 0 else '−'}{fmt(abs(d))}%"


def default_point(space: Space) -> dict[str, Any]:
    """The space's default point for a user's job: each categorical's first choice, the middle of
    each range (geometric when ``log``), snapped to ``step``; conditional parameters as active."""
    point: dict[str, Any] = {}
    for p in space.parameters:
        if not space.active(p, point):
            continue
        if p.type == "categorical":
            point[p.name] = p.choices[0]
            continue
        x = math.sqrt(p.low * p.high) if p.log else (p.low + p.high) / 2
        if p.step:
            x = p.low + round((x - p.low) / p.step) * p.step
        point[p.name] = int(round(x)) if p.type == "int" else float(f"{x:.3g}")
    return point


@dataclass
class Answer:
    campaign: str
    metric: str
    direction: str
    source: str  # measured | SIMULATED | mixed
    runs: int
    winner: dict[str, Any] | None = None  # {number, point, metrics}
    baseline: dict[str, Any] | None = None  # {label, point, ok, metrics, reason}
    ratio: float | None = None  # > 1: the winner is better
    interval: tuple[float, float] | None = None
    interval_note: str = ""
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)  # (what, baseline, winner, change)
    knobs: list[tuple[str, str, str, float | None]] = field(default_factory=list)  # (name, base, win, importance)
    notes: list[str] = field(default_factory=list)
    command: str | None = None  # a user's job: the winner's command line
    config: dict[str, Any] | None = None  # cubic's campaigns: the winner's Config document

    @property
    def throughput(self) -> bool:
        return self.metric.endswith("_per_s") or "throughput" in self.metric

    def headline(self) -> str:
        if self.winner is None:
            return f"No run of {self.runs} met the space's constraints, so there is no winner."
        if self.ratio is None:
            return (f"Best {self.metric}: {fmt(self.winner['metrics'].get(self.metric))} ({self.source}); "
                    "no baseline to compare with.")
        word = ("faster" if self.throughput else "better") if self.ratio >= 1 else \
            ("slower" if self.throughput else "worse")
        size = self.ratio if self.ratio >= 1 else 1 / self.ratio
        iv = (f" (95% interval {fmt(self.interval[0])}–{fmt(self.interval[1])}×)" if self.interval
              else f" ({self.interval_note})")
        return f"The winner is {fmt(size)}× {word} than the baseline{iv} on {self.metric}, {self.source}."

    def markdown(self) -> str:
        out = [f"## Answer: {self.campaign}", "", f"**{self.headline()}**"]
        if self.baseline is not None:
            out += ["", f"Baseline: {self.baseline['label']}."]
        for head, rows in self._tables():
            out += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            out += ["| " + " | ".join(r) + " |" for r in rows]
        if self.command:
            out += ["", f"Winner's command line: `{self.command}`"]
        if self.config is not None:
            out += ["", "Winner's job config: `winner.yaml` (`cubic run --config winner.yaml`)."]
        out += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(out).rstrip() + "\n"

    def _tables(self) -> list[tuple[list[str], list[list[str]]]]:
        """The figures and the knobs, without a column that has nothing in it (no baseline: no
        baseline column; no importances: no importance column)."""
        tables = [(["", "baseline", "winner", "change"], [list(r) for r in self.rows]),
                  (["knob", "baseline", "winner", "importance"],
                   [[n, b, w, "" if i is None else fmt(i)] for n, b, w, i in self.knobs])]
        out = []
        for head, rows in tables:
            if not rows:
                continue
            keep = [j for j in range(len(head)) if j == 0 or any(r[j] not in ("", "–") for r in rows)]
            out.append(([head[j] for j in keep], [[r[j] for j in keep] for r in rows]))
        return out

    def html(self) -> str:
        e = html.escape
        out = [f"<h2>Answer</h2><p><b>{e(self.headline())}</b></p>"]
        if self.baseline is not None:
            out.append(f"<p>Baseline: {e(self.baseline['label'])}.</p>")
        for head, rows in self._tables():
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows]
            out.append("</table>")
        if self.command:
            out.append(f"<p>Winner's command line: <code>{e(self.command)}</code></p>")
        if self.config is not None:
            out.append("<p>Winner's job config: <a href='winner.yaml'>winner.yaml</a> "
                       "(<code>cubic run --config winner.yaml</code>).</p>")
        if self.notes:
            out.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in self.notes) + "</ul>")
        return "\n".join(out)


def feasible_best(space: Space, trials, context) -> Any:
    """The best feasible run's trial (None when no run is feasible): the one rule the answer and the
    winner's job config share."""
    best, best_v = None, -math.inf
    for t in trials:
        o = trial_observation(t, context)
        v = objective_value(space, o) if o.feasible else None
        if v is not None and v > best_v:
            best, best_v = t, v
    return best


def _baseline(space: Space, study, trials, context) -> dict[str, Any] | None:
    stored = study.user_attrs.get(BASELINE_KEY) if study is not None else None
    if stored:
        return dict(stored)
    if context.get("workload"):
        return None  # the workload's defaults are not a point of the space: only a measured baseline counts
    key = space.key(default_point(space))
    for t in trials:
        if space.key(dict(t.params)) == key:
            a = t.user_attrs
            return {"label": f"the space's default point (run #{t.number} of the campaign)", "point": dict(t.params),
                    "ok": bool(a.get("ok")), "metrics": dict(a.get("metrics") or {}), "reason": a.get("reason"),
                    "source": a.get("source", "measured")}
    return None


def _interval(metric: str, direction: str, win: dict[str, float], base: dict[str, float]):
    lo, hi = f"{metric}_ci_lo", f"{metric}_ci_hi"
    w = (win.get(lo), win.get(hi)) if lo in win and hi in win else None
    b = (base.get(lo), base.get(hi)) if lo in base and hi in base else None
    if w is None and b is None:
        return None, "single sample"
    wv, bv = win[metric], base[metric]
    w = w or (wv, wv)
    b = b or (bv, bv)
    if min(*w, *b) <= 0:
        return None, "single sample"
    iv = (w[0] / b[1], w[1] / b[0]) if direction == "maximize" else (b[0] / w[1], b[1] / w[0])
    note = "" if (lo in win and lo in base) else "interval of one side only: the other is a single sample"
    return iv, note


def campaign_answer(space: Space, meta: dict[str, Any], study, trials, *, importance: dict[str, float] | None = None,
                    winner_doc: dict[str, Any] | None = None, source: str = "measured") -> Answer:
    ctx = meta.get("context", {})
    m, direction = space.primary.metric, space.primary.direction
    ans = Answer(campaign=meta.get("name", ""), metric=m, direction=direction, source=source, runs=len(trials))
    best = feasible_best(space, trials, ctx)
    base = _baseline(space, study, trials, ctx)
    ans.baseline = base
    if best is None:
        kinds: dict[str, int] = {}
        for t in trials:
            k = t.user_attrs.get("failure_kind") or ("infeasible" if t.user_attrs.get("ok") else "failed")
            kinds[k] = kinds.get(k, 0) + 1
        ans.notes.append("runs by outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        return ans
    wm = dict(best.user_attrs.get("metrics") or {})
    ans.winner = {"number": best.number, "point": dict(best.params), "metrics": wm}
    if winner_doc and winner_doc.get("config") is not None:
        ans.config = _runnable(space, dict(best.params), winner_doc["config"])
    job = ctx.get("job")
    if job:
        from cubic.runners.command import render

        ans.command = render(job["objective"], dict(best.params), job.get("launcher"), job.get("nproc", 1))
    if base is None:
        ans.notes.append("no baseline was measured (campaign run measures one unless it is given "
                         "--no-baseline), so no speedup is shown")
    elif not base.get("ok"):
        ans.notes.append(f"the baseline run failed ({base.get('failure_kind')}: {base.get('reason')}), so no "
                         "speedup is shown")
    bm = dict(base.get("metrics") or {}) if base and base.get("ok") else {}
    if bm.get(m) is not None and wm.get(m) is not None and bm[m] and wm[m]:
        ans.ratio = wm[m] / bm[m] if direction == "maximize" else bm[m] / wm[m]
        ans.interval, ans.interval_note = _interval(m, direction, wm, bm)
        if ans.interval_note and ans.interval is not None:
            ans.notes.append(ans.interval_note)
        if ans.interval is not None and ans.interval[0] <= 1 <= ans.interval[1]:
            ans.notes.append("the interval includes 1×: the difference may be noise (longer runs narrow it)")
        ans.rows.append((m, fmt(bm[m]), fmt(wm[m]), f"{fmt(ans.ratio)}× {'better' if ans.ratio >= 1 else 'worse'}"))
    elif wm.get(m) is not None:
        ans.rows.append((m, "–", fmt(wm[m]), ""))
    ne = next((k for k in NE_METRICS if k in wm), None)
    if ne:
        if ne in bm:
            ans.rows.append((f"{ne} (lower is better)", fmt(bm[ne]), fmt(wm[ne]), _pct(wm[ne], bm[ne])))
        else:
            ans.rows.append((f"{ne} (lower is better)", "–", fmt(wm[ne]), ""))
    mem = next((k for k in MEMORY_METRICS if k in wm), None)
    if mem:
        b = bm.get(mem)
        ans.rows.append((f"peak memory (GiB, {mem})", "–" if b is None else fmt(b / GIB), fmt(wm[mem] / GIB),
                         "" if b is None else _pct(wm[mem], b)))
    _knobs(ans, space, dict(best.params), base, importance, n_complete=sum(1 for t in trials if t.values))
    return ans


def _runnable(space: Space, point: dict[str, Any], used: dict[str, Any]) -> dict[str, Any]:
    """The Config the winning run ran, as ``cubic run --config`` takes it: the point's Config, with
    the plan / placement the run reported only when they are documents (a ``version`` field), not
    a runner's summary of them (the simulated cluster reports a summary)."""
    cfg = space.to_config(point).model_dump(mode="json")
    for part, doc in (("sharding", "plan"), ("fp8", "placement")):
        got = (used.get(part) or {}).get(doc)
        if isinstance(got, dict) and "version" in got:
            cfg[part][doc] = got
    return cfg


def _knobs(ans: Answer, space: Space, win: dict[str, Any], base: dict[str, Any] | None,
           importance: dict[str, float] | None, n_complete: int) -> None:
    bp = dict((base or {}).get("point") or {})
    imp = importance or {}
    rows = []
    for p in space.parameters:
        if p.name not in win and p.name not in bp:
            continue
        w, b = win.get(p.name, "inactive"), bp.get(p.name, "–" if base is None else "default")
        if base is not None and w == b and p.name not in imp:
            continue
        rows.append((p.name, _show(b), _show(w) + (" (unchanged)" if base is not None and w == b else ""),
                     imp.get(p.name)))
    rows.sort(key=lambda r: -(r[3] or 0))
    ans.knobs = rows
    if base is not None and all(r[2].endswith("(unchanged)") for r in rows):
        ans.notes.append("the winner is the baseline configuration: nothing the campaign tried beat it")
    if importance is not None and not imp:  # None: not computed (the report computes it)
        why = (f"only {n_complete} completed runs (fANOVA needs {MIN_IMPORTANCE_RUNS})"
               if n_complete < MIN_IMPORTANCE_RUNS else "fANOVA could not separate the knobs")
        ans.notes.append(f"which knobs mattered is not known: {why}")


def _show(v: Any) -> str:
    return fmt(v) if isinstance(v, float) else str(v)


def write_answer(out_dir: str | Path, ans: Answer) -> None:
    """``answer.md`` and ``winner.yaml`` (a Config document, or the job's winning parameters)."""
    import yaml

    out = Path(out_dir)
    (out / "answer.md").write_text(ans.markdown())
    target = out / "winner.yaml"
    if ans.winner is None:
        target.unlink(missing_ok=True)  # a stale winner of an earlier report must not pass for this one
        return
    m = ans.winner["metrics"].get(ans.metric)
    head = [f"# winner of campaign {ans.campaign}: {ans.metric} {fmt(m)} ({ans.source}), run #{ans.winner['number']}"]
    if ans.config is not None:
        head.append("# a cubic job config: cubic run --workload <workload> --config winner.yaml")
        body = ans.config
    else:
        if ans.command:
            head.append(f"# command line: {ans.command}")
        head.append("# the winning parameter values (campaign run --baseline takes this file)")
        body = ans.winner["point"]
    target.write_text("\n".join(head) + "\n" + yaml.safe_dump(body, sort_keys=False))


def read_baseline_point(path: str, space: Space) -> dict[str, Any]:
    """A user's baseline: parameter values (YAML/JSON; a winner.yaml works), the rest from the
    space's default point; every value checked against the space."""
    from cubic.core.spec import SpecError, read_structured

    data = read_structured(path)
    if not isinstance(data, dict):
        raise SpecError("expected a mapping of parameter values", source=path)
    point = {**default_point(space), **data}
    for k in list(point):  # a value the file sets for an inactive parameter is an error, a default is not
        if k not in data and not any(p.name == k and space.active(p, point) for p in space.parameters):
            point.pop(k)
    return space.validate_point(point, source=path)
