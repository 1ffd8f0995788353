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
from cubic.codesign.importance import Importance
from cubic.codesign.trials import MEMORY_METRICS, NE_METRICS, is_throughput, trial_observation
from search.space import Space
from search.strategies import objective_value


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


def ratio_ci(lo: float, hi: float, sep: str = "–") -> str:
    """A ratio's interval for people, with digits enough that a bound excluding 1 never prints as 1
    ("1.00-1.07x" beside "separated" read as not excluding 1; the bound was 1.0028)."""
    a, b = fmt(lo), fmt(hi)
    for digits in range(3, 7):
        if not ((lo > 1 and float(a) <= 1) or (hi < 1 and float(b) >= 1)):
            break
        a, b = f"{lo:.{digits}f}", f"{hi:.{digits}f}"
    return f"{a}{sep}{b}"


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


def interval_text(x: dict[str, Any]) -> str:
    """One configuration's figure as every view shows it: value [95% interval of a fresh run] and
    what the interval rests on ("2 repeats", "1 repeat + this machine's noise floor 6.5%")."""
    basis = x.get("basis") or f"{x.get('repeats', '?')} repeats"
    if x.get("deterministic"):  # a model's figure: a zero-width bracket would read as evidence
        return f"{fmt(x['value'])} ({basis})"
    return f"{fmt(x['value'])} [{fmt(x['lo'])}, {fmt(x['hi'])}] ({basis})"


def confirm_lines(c: dict[str, Any]) -> list[str]:
    """The confirm step in a few lines: the winner and runner-up with their intervals, the verdict
    (separated by between-process evidence, or tied within the repeat budget), the speedup."""
    sp = c.get("speedup")
    if c.get("deterministic"):
        return _model_lines(c)
    # measurement_noise: between passes 10 minutes apart every configuration moved 12.4% alike, so an
    # absolute interval holds for a run close in time; a ratio measured in pairs holds beyond that
    when = ("a fresh run close in time; the machine's drift moves absolute figures, the paired speedup below "
            "cancels it" if sp and sp.get("paired") else "a fresh run close in time")
    out = [f"confirmed {c['metric']} (95% interval of {when}): winner {interval_text(c['winner'])} "
           f"at {c['winner']['point']}"]
    if c.get("runner_up"):
        out.append(f"runner-up {interval_text(c['runner_up'])} at {c['runner_up']['point']}")
    lead = c.get("lead")
    verdict = c.get("verdict") or {True: "separated", False: "NOT separated", None: "no runner-up"}[c["separated"]]
    out.append(verdict + (f" (winner / runner-up {fmt(lead['ratio'])}x, "
                          f"95% CI {ratio_ci(lead['lo'], lead['hi'], '-')}x)"
                          if lead else ""))
    if sp and sp.get("winner_is_baseline"):
        out.append("over the baseline: the winner is the baseline configuration (nothing the campaign tried beat it)")
    elif sp:
        how = (f"{sp['pairs']} back-to-back pairs with the baseline"
               + (", run on a loaded machine (CONTENDED)" if sp.get("pairs_contended") else "") if sp.get("paired") else
               f"UNPAIRED, baseline {sp['baseline_repeats']} repeats: a drift of the machine between them is not in it")
        out.append(f"over the baseline: {fmt(sp['ratio'])}x (95% CI {ratio_ci(sp['lo'], sp['hi'], '-')}x; {how})"
                   + ("" if sp["beats_baseline"] else ": does NOT beat the baseline by the evidence"))
    return out + against_prior_lines(c.get("against_prior"))


def _model_lines(c: dict[str, Any]) -> list[str]:
    """:func:`confirm_lines` of a deterministic source (the simulator): the model's figures and ratios,
    no interval, no verdict of separation (cubic.codesign.confirm.MODEL_FIGURES)."""
    out = [f"SIMULATED {c['metric']}: winner {fmt(c['winner']['value'])} at {c['winner']['point']}"]
    if c.get("runner_up"):
        out.append(f"runner-up {fmt(c['runner_up']['value'])} at {c['runner_up']['point']}")
    lead = c.get("lead")
    out.append(c["verdict"] + (f" (winner / runner-up {fmt(lead['ratio'])}x in the model)" if lead else ""))
    sp = c.get("speedup")
    if sp and sp.get("winner_is_baseline"):
        out.append("over the baseline: the winner is the baseline configuration (nothing the campaign tried beat it)")
    elif sp:
        out.append(f"over the baseline: {fmt(sp['ratio'])}x in the model (SIMULATED, no interval)")
    return out + against_prior_lines(c.get("against_prior"))


def against_order_line(a: dict[str, Any] | None) -> str | None:
    """This campaign's winner against the one its ``--baselines`` sibling found walking the step model's order
    (:func:`cubic.codesign.against_prior.against_order`)."""
    if not a:
        return None
    head = f"against walking the step model's order ({a['campaign']}, {a['runs']} runs)"
    if a["same"]:
        return f"{head}: it found the same winner, at its run {a['run']}"
    theirs = f"its winner {fmt(a['value'])} at {a['point']} (its run {a['run']})"
    if a.get("deterministic"):
        return f"{head}: {theirs}; this campaign's winner is {fmt(a['ratio'])}x it in the model (SIMULATED, no interval)"
    iv = f"95% CI {ratio_ci(a['lo'], a['hi'], '-')}x, " if a.get("lo") is not None else ""
    verdict = "separated" if a.get("separated") else "NOT separated"
    return (f"{head}: {theirs}; this campaign's winner is {fmt(a['ratio'])}x it ({iv}UNPAIRED: the two campaigns "
            f"ran at different moments, so a drift of the machine between them is in it), {verdict} by "
            "between-process evidence")


def against_prior_lines(a: dict[str, Any] | None) -> list[str]:
    """What the search added to the step model (:mod:`cubic.codesign.against_prior`): the winner against the
    model's own first pick, by the confirm step's rule, and where the model's order would have put it."""
    if not a:
        return []
    pick, n = a["pick"], a["runs"]
    if a["is_winner"] and n == 1:
        return ["against the step model alone: the winner is its own first pick, the campaign's one run"]
    if a["is_winner"]:
        return [f"against the step model alone: the winner is its own first pick (run {pick['run']} of {n}); the "
                f"search's other {n - 1} runs found nothing better by this campaign's evidence, so the step model "
                "alone would have given this answer"]
    where = (f"; walking the step model's order would have run the winner at #{a['winner_prior_rank']} of "
             f"{a['ranked']}, the campaign ran it at run {a['winner_run']} of {n}" if a.get("winner_prior_rank")
             else f"; the campaign ran the winner at run {a['winner_run']} of {n}")
    knobs = ", ".join(f"{k} {_show(v)}" for k, v in sorted(pick["point"].items()))
    head = f"against the step model alone: its first pick (run {pick['run']}: {knobs})"
    if a.get("ratio") is None:
        return [head + (" failed or broke a constraint" if pick.get("failed") else " has no estimate to compare")
                + where]
    if a.get("deterministic"):
        return [f"{head}: the winner is {fmt(a['ratio'])}x it in the model (SIMULATED, no interval){where}"]
    how = (f"{a['pairs']} pairs of the two run back to back after the winner was chosen"
           + (", on a loaded machine (CONTENDED)" if a.get("pairs_contended") else "") if a.get("paired") else
           "UNPAIRED: each side's runs pooled, the pick's run in the search among them")
    iv = f" (95% CI {ratio_ci(a['lo'], a['hi'], '-')}x, {how})" if a.get("lo") is not None else ""
    verdict = ("separated by between-process evidence: the search found better than the step model's pick"
               if a.get("separated") else
               f"NOT separated: the pick ran in {pick['repeats']} process, separation needs two each"
               if pick.get("repeats", 0) < 2 and not a.get("paired") else
               "NOT separated: the interval reaches 1x, so the evidence does not rank the winner above the step "
               "model's pick")
    return [f"{head}: the winner is {fmt(a['ratio'])}x it{iv}, {verdict}{where}"]


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
    knobs: list[tuple[str, str, str, str]] = field(default_factory=list)  # (name, base, win, importance)
    notes: list[str] = field(default_factory=list)
    command: str | None = None  # a user's job: the winner's command line
    config: dict[str, Any] | None = None  # cubic's campaigns: the winner's Config document
    keep_baseline: bool = False  # nothing beat the baseline by the evidence: winner.yaml is the baseline
    run_command: str | None = None  # the command that runs winner.yaml, as printed (and tested)
    confirm: dict[str, Any] | None = None  # Campaign.confirm's outcome
    quality: str = ""  # the headline's clause when the winner's quality is not known from these runs
    interval_tag: str = ""  # what the headline's interval rests on when it is not clean back-to-back pairs

    @property
    def throughput(self) -> bool:
        return is_throughput(self.metric)

    def headline(self) -> str:
        if self.winner is None:
            return f"No run of {self.runs} met the space's constraints, so there is no winner."
        if self.keep_baseline and ((self.confirm or {}).get("speedup") or {}).get("winner_is_baseline"):
            return (f"Keep the baseline: it is the best configuration the campaign measured on {self.metric}; "
                    f"winner.yaml is the baseline, {self.source}.")
        if self.keep_baseline:
            best = (f"the best, {fmt(self.ratio)}× (95% CI {ratio_ci(*self.interval)}×)"
                    if self.ratio is not None and self.interval else
                    f"the best, {fmt(self.ratio)}× ({self.interval_note})" if self.ratio is not None and
                    self.interval_note else "the best")
            by = "in the model" if self.source == "SIMULATED" else "by the evidence"
            return (f"Keep the baseline: no configuration beats it {by} on {self.metric} ({best}); "
                    f"winner.yaml is the baseline, {self.source}.")
        if self.ratio is None:
            return (f"Best {self.metric}: {fmt(self.winner['metrics'].get(self.metric))} ({self.source}); "
                    "no baseline to compare with.")
        word = ("faster" if self.throughput else "better") if self.ratio >= 1 else \
            ("slower" if self.throughput else "worse")
        size = self.ratio if self.ratio >= 1 else 1 / self.ratio
        tag = f"; {self.interval_tag}" if self.interval_tag else ""
        iv = (f" (95% CI {ratio_ci(*self.interval)}×{tag})" if self.interval
              else f" ({self.interval_note})")
        quality = f"; {self.quality}" if self.quality else ""
        return (f"The winner is {fmt(size)}× {word} than the baseline{iv} on {self.metric}, {self.source}"
                f"{self._tie()}{quality}.")

    def _tie(self) -> str:
        """A runner-up the confirm step could not separate from the winner: named in the headline,
        since winner.yaml holds one of two configurations the evidence ranks alike."""
        c = self.confirm or {}
        if c.get("separated") is not False or not c.get("runner_up") or not c.get("winner"):
            return ""
        w, r = c["winner"]["point"], c["runner_up"]["point"]
        diff = ", ".join(f"{k} {_show(r[k]) if k in r else 'inactive'}" for k in sorted(set(w) | set(r))
                         if w.get(k) != r.get(k))
        return (f"; tied with the runner-up ({diff}) within the repeat budget: the evidence does not rank "
                f"the two, winner.yaml holds the one the search ranked first")

    def markdown(self) -> str:
        out = [f"## Answer: {self.campaign}", "", f"**{self.headline()}**"]
        if self.baseline is not None:
            out += ["", f"Baseline: {self.baseline['label']}."]
        for head, rows in self._tables():
            out += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            out += ["| " + " | ".join(r) + " |" for r in rows]
        if self.confirm and self.confirm.get("winner"):
            out += ["", "Confirm step:"] + [f"- {line}" for line in confirm_lines(self.confirm)]
        if self.command:
            out += ["", f"{'Baseline' if self.keep_baseline else 'Winner'}'s command line: `{self.command}`"]
        if self.run_command:
            out += ["", f"{'Baseline' if self.keep_baseline else 'Winner'}'s job config: `winner.yaml`; run it with "
                        f"`{self.run_command}`."]
        out += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(out).rstrip() + "\n"

    def _tables(self) -> list[tuple[list[str], list[list[str]]]]:
        """The figures and the knobs, without a column that has nothing in it (no baseline: no
        baseline column; no importances: no importance column)."""
        tables = [(["", "baseline", "winner", "change"], [list(r) for r in self.rows]),
                  (["knob", "baseline", "winner", "importance"],
                   [list(k) for k in self.knobs])]
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
        if self.confirm and self.confirm.get("winner"):
            out.append("<p>Confirm step:</p><ul>" + "".join(f"<li>{e(x)}</li>" for x in confirm_lines(self.confirm))
                       + "</ul>")
        if self.command:
            out.append(f"<p>Winner's command line: <code>{e(self.command)}</code></p>")
        if self.run_command:
            out.append(f"<p>Job config: <a href='winner.yaml'>winner.yaml</a> "
                       f"(<code>{e(self.run_command)}</code>).</p>")
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
    if "baseline" in context and context["baseline"] is None:
        return None  # run with --no-baseline: no speedup, as README says (not the default point's trial)
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


def campaign_answer(space: Space, meta: dict[str, Any], study, trials, *, importance: Importance | None = None,
                    no_importance: str | None = None,
                    winner_doc: dict[str, Any] | None = None, source: str = "measured",
                    against_order: dict[str, Any] | None = None) -> Answer:
    ctx = meta.get("context", {})
    m = space.primary.metric
    ans = Answer(campaign=meta.get("name", ""), metric=m, direction=space.primary.direction, source=source,
                 runs=len(trials))
    best = feasible_best(space, trials, ctx)
    base = _baseline(space, study, trials, ctx)
    ans.baseline = base
    if best is None:
        ans.notes.append(_outcomes(trials))
        return ans
    best, wm = _winner(ans, space, study, trials, best, winner_doc, ctx)
    bm = _speedup(ans, space, base, wm, ctx)
    _quality_rows(ans, space, wm, bm, ctx)
    mem = next((k for k in MEMORY_METRICS if k in wm), None)
    if mem:
        b = bm.get(mem)
        ans.rows.append((f"peak memory (GiB, {mem})", "–" if b is None else fmt(b / GIB), fmt(wm[mem] / GIB),
                         "" if b is None else _pct(wm[mem], b)))
    _knobs(ans, space, dict(best.params), base, importance, no_importance)
    if ctx.get("workload") and ans.config is not None:
        ans.run_command = run_command(ctx)
    from search.curves import early_ranking

    pruning = pruning_note(early_ranking(space, [trial_observation(t, ctx) for t in trials]))
    if pruning:
        ans.notes.append(pruning)
    if order_line := against_order_line(against_order):  # the same budget walking the model's order (--baselines)
        ans.notes.insert(0, order_line)
    return ans


def _outcomes(trials) -> str:
    """Without a feasible winner: how the runs ended, by kind."""
    kinds: dict[str, int] = {}
    for t in trials:
        k = t.user_attrs.get("failure_kind") or ("infeasible" if t.user_attrs.get("ok") else "failed")
        kinds[k] = kinds.get(k, 0) + 1
    return "runs by outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))


def _winner(ans: Answer, space: Space, study, trials, best, winner_doc: dict[str, Any] | None,
            ctx: dict[str, Any]) -> tuple[Any, dict[str, float]]:
    """The winning trial and its metrics into ``ans`` (the confirm step's winner and interval when it
    ran: it re-ranked on re-measured estimates), with its runnable config or job command."""
    m = space.primary.metric
    confirm = study.user_attrs.get("confirm") if study is not None else None
    ans.confirm = confirm if confirm and confirm.get("winner") else None
    if ans.confirm:
        key = space.key(confirm["winner"]["point"])
        best = next((t for t in trials if space.key(dict(t.params)) == key), best)
    wm = dict(best.user_attrs.get("metrics") or {})
    if ans.confirm and confirm.get("metric") == m:  # the one interval: the confirm step's estimate
        from cubic.core.stats import ci_names

        lo, hi = ci_names(m)
        wm.update({m: confirm["winner"]["value"], lo: confirm["winner"]["lo"], hi: confirm["winner"]["hi"]})
    ans.winner = {"number": best.number, "point": dict(best.params), "metrics": wm}
    if winner_doc and winner_doc.get("config") is not None:
        ans.config = _runnable(space, dict(best.params), winner_doc["config"])
    job = ctx.get("job")
    if job:
        from cubic.runners.command import render

        ans.command = render(job["objective"], dict(best.params), job.get("launcher"), job.get("nproc", 1))
    return best, wm


def _speedup(ans: Answer, space: Space, base: dict[str, Any] | None, wm: dict[str, float],
             ctx: dict[str, Any]) -> dict[str, float]:
    """The primary metric's row: the winner against the baseline, with the confirm step's
    between-process interval, else a conservative one from the two runs' intervals; the baseline is
    kept when the evidence does not show the winner better. Returns the baseline's metrics."""
    m, direction = space.primary.metric, space.primary.direction
    if base is None:
        ans.notes.append("no baseline was measured (campaign run measures one unless it is given "
                         "--no-baseline), so no speedup is shown")
    elif not base.get("ok"):
        ans.notes.append(f"the baseline run failed ({base.get('failure_kind')}: {base.get('reason')}), so no "
                         "speedup is shown")
    bm = dict(base.get("metrics") or {}) if base and base.get("ok") else {}
    confirm = ans.confirm or {}
    sp = confirm.get("speedup")
    if sp and sp.get("winner_is_baseline") and base is not None and base.get("ok"):  # a ratio of 1 by definition
        bm[m], ans.ratio = sp["baseline_value"], 1.0
        _keep_baseline(ans, space, base, ctx)
    elif sp and base is not None and base.get("ok"):  # the ratio of typical values, between-process interval
        bm[m], ans.ratio = sp["baseline_value"], sp["ratio"]
        if sp.get("deterministic"):  # the simulator's: the model's ratio, no interval
            ans.interval_note = "SIMULATED: the step model's ratio, no interval"
            ans.notes.append(f"the speedup is {sp['method']}")
        else:
            ans.interval = (sp["lo"], sp["hi"])
            # the confirm lines say it too, but the headline is what is read and quoted
            ans.interval_tag = ("UNPAIRED" if not sp.get("paired") else
                                "from pairs run on a loaded machine" if sp.get("pairs_contended") else "")
            ans.notes.append(f"the speedup is the ratio of typical {m}, every run in a fresh process; its 95% CI: "
                             f"{sp['method']}")
        if not sp["beats_baseline"]:
            _keep_baseline(ans, space, base, ctx)
    elif bm.get(m) is not None and wm.get(m) is not None and bm[m] and wm[m]:
        ans.ratio = wm[m] / bm[m] if direction == "maximize" else bm[m] / wm[m]
        ans.interval, ans.interval_note = _interval(m, direction, wm, bm)
        # in the headline too (it read as a confirmed speedup when a stop cut the confirm step short)
        ans.interval_tag = "NOT CONFIRMED: from the two runs' own intervals, unpaired"
        ans.notes.append("not confirmed: no confirm step compared the winner with the baseline (the interval "
                         "is from the two runs' intervals of a fresh run, conservative)")
        if ans.interval_note and ans.interval is not None:
            ans.notes.append(ans.interval_note)
        if ans.ratio < 1 or (ans.interval is not None and ans.interval[0] <= 1):
            _keep_baseline(ans, space, base, ctx)
    if bm.get(m) is not None and wm.get(m) is not None and bm[m] and wm[m]:
        if ans.interval is not None and ans.interval[0] <= 1 <= ans.interval[1]:
            ans.notes.append("the interval includes 1×: the difference may be noise (longer runs narrow it)")
        ans.rows.append((m, fmt(bm[m]), fmt(wm[m]), f"{fmt(ans.ratio)}× {'better' if ans.ratio >= 1 else 'worse'}"))
    elif wm.get(m) is not None:
        ans.rows.append((m, "–", fmt(wm[m]), ""))
    return bm


def _quality_rows(ans: Answer, space: Space, wm: dict[str, float], bm: dict[str, float],
                  ctx: dict[str, Any]) -> None:
    """The NE row: at the equal training budget where the runs have it (with the one-update caveat),
    else at the end, saying when equal steps are not an equal budget; a speed winner with no NE
    says so in the headline."""
    ne = next((k for k in NE_METRICS if k in wm and (not bm or k in bm)), None) or \
        next((k for k in NE_METRICS if k in wm), None)
    ne_caveat = None
    if ne == "ne_at_budget":
        from cubic.codesign.evaluate import examples_text

        ne_caveat = _one_update_caveat(wm, bm, ctx)
        ans.notes.append(f"NE is compared at an equal training budget: {examples_text(wm.get('examples_budget'))} examples "
                         "seen (the space's smallest batch x the run's steps), read from each run's evaluation "
                         "trajectory, so a larger batch is not credited for having seen more examples; shape "
                         "tuning's NE ceiling uses the same rule (a sanity floor stays on each run's end NE)")
        if ne_caveat:
            ans.notes.append(ne_caveat)
    elif ne == "ne_end" and wm.get("batch_size") and bm.get("batch_size") and wm["batch_size"] != bm["batch_size"]:
        ans.notes.append("NE after equal STEPS with different batch sizes: not an equal training budget (the "
                         "larger batch saw more examples)")
    elif ne and (knobs := _batch_knobs_differ(ans)):  # a user's job: cubic cannot see how long it trained
        ne_caveat = (f"NE as the job reports it, with {knobs} different: if the job runs a fixed number of steps, "
                     "the larger batch saw more examples, so the NE row is not an equal training budget")
        ans.notes.append(ne_caveat)
    if ne_caveat and ne == "ne_at_budget":  # a speed headline whose quality cost these runs cannot show
        ans.quality = "its NE is not compared: under one update within the equal budget at this run length (below)"
    elif ne_caveat:
        ans.quality = "its NE may not be an equal training budget (a batch knob differs; below)"
    if ne is None and ans.throughput:  # silence beside a speedup would read as "no quality cost"
        ans.quality = _unmeasured_quality(space, wm)
    if ans.source == "SIMULATED":  # the simulator's throughput has no quality beside it but 2D's measured cost
        ans.quality = "loss and NE are not simulated"
        ans.notes.append("loss and NE are not simulated: a batch size's or FP8's quality cost is in no figure of "
                         "this answer (ne_cost_rel, where shown, is 2D's NE cost taken from measured runs)")
    if ne:
        if ne in bm:
            change = _pct(wm[ne], bm[ne]) + ((" (not comparable: under one update, below)" if ne == "ne_at_budget" else
                                              " (not an equal budget if the job runs fixed steps, below)")
                                             if ne_caveat else "")
            ans.rows.append((f"{ne} (lower is better)", fmt(bm[ne]), fmt(wm[ne]), change))
        else:
            ans.rows.append((f"{ne} (lower is better)", "–", fmt(wm[ne]), ""))


def _batch_knobs_differ(ans: Answer) -> str | None:
    """The winner's batch knobs (a name with "batch") whose values differ from the baseline's, as text."""
    w, b = (ans.winner or {}).get("point") or {}, (ans.baseline or {}).get("point") or {}
    diff = [f"{k} {_show(b[k])} -> {_show(w[k])}" for k in sorted(w)
            if "batch" in k.lower() and k in b and w[k] != b[k]]
    return ", ".join(diff) or None


def _unmeasured_quality(space: Space, wm: dict[str, float]) -> str:
    """The headline's clause for a throughput winner whose runs report no NE (a user's job that
    prints only its speed): what, if anything, bounded its quality."""
    held = [f"{c.metric} {'<=' if c.max is not None else '>='} {fmt(c.max if c.max is not None else c.min)}"
            for c in space.constraints if c.metric in wm]
    return ("its quality is not compared: the runs report no NE" +
            (f", only the constraint {', '.join(held)} bounded it" if held else ", so a quality cost would not show"))


# the pruning note's opening and its words when the completed curves back the pruner: one record, which
# the search benchmark reads in the printed answer (as a user does) to check the note told the truth
PRUNING_NOTE_HEAD = "the pruner stopped"
PRUNER_BACKED = "the completed curves back its early judgement"


def pruning_note(r: dict[str, Any] | None) -> str | None:
    """What the completed runs' curves say of the pruner's early judgement (``r``:
    search.curves.early_ranking), when a pruner stopped runs: backed, or not (then a stopped run may
    have been the winner). The answer and the CLI's summary print it."""
    from search.curves import MIN_RANKED_RUNS, RANKS_POORLY, RANKS_WELL

    if r is None:
        return None
    head = f"{PRUNING_NOTE_HEAD} {r['stopped']} runs, at step {r['step']:g} in the median"
    if r["spearman"] is None:  # silence would read as consent
        return (f"{head}; {r['runs']} runs it let finish have a curve there, too few (of {MIN_RANKED_RUNS} needed) to "
                "check its early judgement, so a stopped run may have been the winner; a later --prune-warmup lets "
                "more runs finish")
    at = (f"{head}; there the {r['runs']} runs it let finish rank at Spearman {r['spearman']:+.2f} against their "
          "final values")
    if r["spearman"] >= RANKS_WELL:
        return f"{at}: {PRUNER_BACKED}"
    well = r["first_step_ranking_well"]
    hint = (f"--prune-warmup {well:g} (the first step ranking them at {RANKS_WELL} or better)" if well is not None
            else "a later --prune-warmup")
    if r["spearman"] < RANKS_POORLY:
        return (at + ": early values say little of the end here (curves that cross), so a stopped run may have "
                f"been the winner; run again with {hint} or --prune none")
    return at + f": a partial backing; {hint} would judge on better evidence"


def _one_update_caveat(wm: dict[str, float], bm: dict[str, float], ctx: dict[str, Any]) -> str | None:
    """The caveat when the larger batch of the winner and the baseline makes less than one update
    within the equal budget (cubic.codesign.evaluate.one_update_caveat)."""
    from cubic.codesign.evaluate import one_update_caveat

    r = ctx.get("runner") or {}
    sides = [(b, who) for b, who in ((wm.get("batch_size"), "the winner"), (bm.get("batch_size"), "the baseline")) if b]
    if not sides or r.get("steps") is None:
        return None
    batch, who = max(sides, key=lambda s: s[0])
    return one_update_caveat(wm.get("examples_budget"), batch, int(r["steps"]), int(r.get("warmup") or 0), who)


def run_command(ctx: dict[str, Any], config_path: str = "winner.yaml") -> str:
    """The ``cubic run`` command that re-measures winner.yaml as the campaign measured its runs
    (workload, run length, threads, simulated cluster or processes): what the answer prints, tested as printed."""
    import shlex

    r = ctx.get("runner") or {}
    parts = ["cubic", "run", "--workload", str(ctx["workload"]), "--config", config_path]
    if r.get("simulate"):
        parts += ["--simulate", str(r["simulate"])]
    if r.get("kind") == "distributed" and int(r.get("world_size") or 1) > 1:  # measured on W processes
        parts += ["--world-size", str(r["world_size"])]
    for flag in ("steps", "warmup", "threads"):
        if r.get(flag) is not None:
            parts += [f"--{flag}", str(r[flag])]
    return shlex.join(parts)


def _keep_baseline(ans: Answer, space: Space, base: dict[str, Any], ctx: dict[str, Any]) -> None:
    """Nothing beat the baseline by the evidence: the answer says keep it, and winner.yaml is it."""
    ans.keep_baseline = True
    job = ctx.get("job")
    if job:
        from cubic.runners.command import render

        ans.command = render(job["objective"], dict(base.get("point") or {}), job.get("launcher"), job.get("nproc", 1))
    elif base.get("config") is not None:
        ans.config = dict(base["config"])


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
           importance: Importance | None, no_importance: str | None) -> None:
    bp = dict((base or {}).get("point") or {})
    imp = importance.knobs if importance is not None else {}
    rows = []
    for p in space.parameters:
        if p.name not in win and p.name not in bp:
            continue
        w, b = win.get(p.name, "inactive"), bp.get(p.name, "–" if base is None else "default")
        if base is not None and w == b and p.name not in imp:
            continue
        k = imp.get(p.name)
        same = " (unchanged)" if base is not None and w == b else ""
        rows.append((k.value if k else -1.0, p.name, _show(b), _show(w) + same,
                     f"{k.value:.2f} [{k.lo:.2f}–{k.hi:.2f}]" if k else ""))
    rows.sort(key=lambda r: -r[0])
    ans.knobs = [r[1:] for r in rows]
    if base is not None and all(r[2].endswith("(unchanged)") for r in ans.knobs):
        ans.notes.append("the winner is the baseline configuration: nothing the campaign tried beat it")
    if importance is not None:
        ans.notes.append(importance.note(ans.metric))
    elif no_importance:  # the report tried: say why there is no importance column
        ans.notes.append(f"which knobs mattered is not known: {no_importance}")


def _show(v: Any) -> str:
    return fmt(v) if isinstance(v, float) else str(v)


def write_answer(out_dir: str | Path, ans: Answer) -> None:
    """``answer.md`` and ``winner.yaml`` (a Config document, or the job's winning parameters)."""
    import yaml

    out = Path(out_dir)
    if ans.run_command:  # the path as the user gave it, so the printed command works from where they are
        ans.run_command = ans.run_command.replace("--config winner.yaml", f"--config {out / 'winner.yaml'}")
    (out / "answer.md").write_text(ans.markdown())
    target = out / "winner.yaml"
    if ans.winner is None:
        target.unlink(missing_ok=True)  # a stale winner of an earlier report must not pass for this one
        return
    m = ans.winner["metrics"].get(ans.metric)
    if ans.keep_baseline:
        head = [f"# campaign {ans.campaign}: KEEP THE BASELINE ({ans.baseline['label']}): no configuration beat it "
                f"by the evidence (best run #{ans.winner['number']}, {ans.metric} {fmt(m)}, {ans.source})"]
    else:
        head = [f"# winner of campaign {ans.campaign}: {ans.metric} {fmt(m)} ({ans.source}), "
                f"run #{ans.winner['number']}"]
    if ans.config is not None:
        shown = ans.run_command or "cubic run --workload <workload> --config winner.yaml"
        head.append(f"# a cubic job config: {shown}")
        body = ans.config
    else:
        if ans.command:
            head.append(f"# command line: {ans.command}")
        head.append("# the parameter values (campaign run --baseline takes this file)")
        body = dict((ans.baseline or {}).get("point") or {}) if ans.keep_baseline else ans.winner["point"]
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
