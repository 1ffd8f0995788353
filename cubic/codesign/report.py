"""A campaign's report: one self-contained HTML page with interactive plotly figures (plotly.js
inlined: it opens without a network), and the winning config as a job config.

Figures: best-so-far against the number of real runs (with the best's 95% band and the baseline
campaigns), the objective against memory (or the second objective) with the Pareto front, every
run (hover: its config, result, NE, memory, measured/served), the proxy's prediction at proposal
time against the run (with Kendall tau and its one-sided p), and parameter importance
(optuna.importance, fANOVA, with its bootstrap interval: :mod:`cubic.codesign.importance`).
Every figure says whether its runs were measured or SIMULATED; a figure with nothing to show is
not drawn and the page says why in one line. The answer (cubic.codesign.answer: the winner
against the baseline) comes first. The winner is
written as ``winner.json`` (point, metrics, and the cubic Config with the sharding plan and FP8
placement the run used when the run reported them) and ``winner.yaml`` (that Config alone, which
``cubic run --config`` takes unchanged; a user's job: its parameter values).
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from cubic.codesign.against_prior import against_order
from cubic.codesign.answer import campaign_answer, feasible_best, fmt, interval_text, write_answer
from cubic.codesign.importance import PERCENTILES, knob_importance
from cubic.codesign.storage import load_meta, open_storage
from cubic.codesign.trials import MEMORY_METRICS, NE_METRICS, first_metric, is_run, is_throughput, trial_observation
from cubic.core.units import GIB
from search.space import Space
from search.strategies import objective_value
from search.strategy_names import BASELINES


def _load(storage, name: str):
    meta = load_meta(storage, name)
    study = optuna.load_study(study_name=name, storage=storage)
    trials = [t for t in study.get_trials(deepcopy=False) if is_run(t)]  # not a lost worker's attempt
    return meta, study, trials


def _best_curve(space: Space, trials, context) -> list[float]:
    return [v for v, _, _ in _best_curve_with_interval(space, trials, context)]


def _best_curve_with_interval(space: Space, trials, context) -> list[tuple[float, float, float]]:
    """(best-so-far value, its 95% interval lo, hi) after each run: the interval is the best run's
    pooled interval over its repeats (cubic.core.stats), the value itself where a run has none."""
    from cubic.core.stats import ci_names

    out, best, lo, hi = [], math.nan, math.nan, math.nan
    m = space.primary.metric
    lo_name, hi_name = ci_names(m)
    for t in trials:
        o = trial_observation(t, context)
        v = o.metrics.get(m) if o.feasible else None
        if v is not None and objective_value(space, o) is not None:
            better = v > best if space.primary.direction == "maximize" else v < best
            if math.isnan(best) or better:
                best, lo, hi = v, o.metrics.get(lo_name, v), o.metrics.get(hi_name, v)
        out.append((best, lo, hi))
    return out


def _source_label(trials) -> str:
    sources = {t.user_attrs.get("source", "measured") for t in trials}
    return "SIMULATED" if sources == {"simulated"} else ("measured" if sources <= {"measured"} else "mixed")


def winner_job_config(space: Space, meta: dict[str, Any], trials, store_url: str | None = None) -> dict[str, Any] | None:
    """The best feasible run as a job config: Config + the plan/placement its run used, if reported."""
    ctx = meta.get("context", {})
    best = feasible_best(space, trials, ctx)
    if best is None:
        return None
    doc: dict[str, Any] = {"version": 1, "campaign": meta["name"], "workload": ctx.get("workload"),
                           "point": dict(best.params), "metrics": best.user_attrs.get("metrics", {}),
                           "source": best.user_attrs.get("source", "measured")}
    try:
        config = space.to_config(best.params)
    except Exception:  # a space that is not about cubic Configs (generic API): the point is the job
        return doc
    cfg = config.model_dump(mode="json")
    extra = _stored_result_extra(best, store_url or ctx.get("store"))
    if cfg["sharding"].get("plan") is None and isinstance(extra.get("plan"), dict):
        cfg["sharding"]["plan"] = extra["plan"]  # the plan the run actually used
    if cfg["fp8"].get("placement") is None and isinstance(extra.get("placement"), dict):
        cfg["fp8"]["placement"] = extra["placement"]
    doc["config"] = cfg
    doc["notes"] = []
    if cfg["sharding"].get("plan") is None:
        doc["notes"].append("no sharding plan: the run used the workload's single-rank layout "
                            f"(planner {cfg['sharding']['planner']!r})")
    if cfg["fp8"]["policy"] != "off" and cfg["fp8"].get("placement") is None:
        doc["notes"].append(f"FP8 policy {cfg['fp8']['policy']!r} without an explicit placement: "
                            "`cubic fp8 probe` makes one")
    return doc


def stored_run(trial, store):
    """The trial store's record of an Optuna trial's run, joined by content hashes -- workload,
    config and machine fingerprint, as the run's Result carried them (the newest such record) --
    not by an integer id, which means nothing in another database. None when the run is not in the
    store (a generic campaign, or a store that was reset)."""
    ex = trial.user_attrs.get("extra") or {}
    key = (ex.get("workload_hash"), ex.get("config_hash"), ex.get("fingerprint_hash"))
    if not all(key):
        return None
    rows = [t for t in store.trials(workload=ex.get("workload"))
            if (t.workload_hash, t.config_hash, t.fingerprint_hash) == key]
    return max(rows, key=lambda t: (t.created_at, t.id)) if rows else None


def _stored_result_extra(trial, store_url: str | None) -> dict[str, Any]:
    """What the winning run reported beyond its metrics (the plan and placement it used). A store
    that cannot be opened is an error (one line), not an empty answer."""
    if not (trial.user_attrs.get("extra") or {}).get("config_hash"):
        return {}  # not a run of cubic's RunnerEvaluate: nothing to join
    from cubic.core.spec import SpecError
    from cubic.core.store import TrialStore

    if store_url and "***" in store_url:  # the campaign stored its store's URL without the password
        raise SpecError("the campaign's trial store needs a password, which is never stored: pass --store URL",
                        field="--store")

    with (TrialStore(store_url, origin="--store") if store_url else TrialStore()) as store:
        t = stored_run(trial, store)
    return dict(t.result.extra) if t is not None else {}


def _pareto_mask(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-dominated points when maximizing a and minimizing b."""
    n = len(a)
    mask = np.ones(n, dtype=bool)
    for i in range(n):
        dominated = (a >= a[i]) & (b <= b[i]) & ((a > a[i]) | (b < b[i]))
        mask[i] = not dominated.any()
    return mask


def _memory_metric(trials) -> str | None:
    """The memory figure the runs report: the job's own peak, else what the runner saw."""
    for k in MEMORY_METRICS:
        if any(k in (t.user_attrs.get("metrics") or {}) for t in trials):
            return k
    return None


def _axis(metric: str) -> tuple[str, float]:
    """An axis title and scale for a metric: bytes are shown in GiB."""
    return (f"{metric} (GiB)", 1 / GIB) if metric.endswith("_bytes") else (metric, 1.0)


def _runs(space: Space, trials, context, mem: str | None) -> list[dict[str, Any]]:
    """One record per run, in run order, with the hover text a person reads: the run's config,
    its result, the objective (with its interval), NE, memory, and measured/served."""
    from cubic.core.stats import ci_names

    m = space.primary.metric
    lo_name, hi_name = ci_names(m)
    out = []
    for i, t in enumerate(trials, 1):
        a = t.user_attrs
        mt = dict(a.get("metrics") or {})
        o = trial_observation(t, context)
        ok = bool(o.ok)
        feasible = ok and o.feasible and objective_value(space, o) is not None
        v = mt.get(m) if ok else None
        config = _config(t)
        if not ok and a.get("failure_kind") == "pruned":
            result = f"stopped early by the pruner: {str(a.get('reason') or '')[:120]}"
        elif not ok:
            result = f"failed ({a.get('failure_kind') or 'error'}): {str(a.get('reason') or '')[:120]}"
        elif not feasible:
            result = f"breaks a constraint (violation {fmt(float(a.get('violation', 0.0)))})"
        else:
            result = "ok"
        lines = [f"<b>run {i}</b> (trial #{t.number}" + (f", round {a['round']}" if a.get("round") is not None else "")
                 + ")", f"config: {html.escape(config)}", f"result: {html.escape(result)}"]
        if v is not None:
            iv = f" [{fmt(mt[lo_name])}–{fmt(mt[hi_name])}]" if lo_name in mt and hi_name in mt else ""
            lines.append(f"{html.escape(m)}: {fmt(v)}{iv}")
        ne = first_metric(mt, NE_METRICS)
        if ne is not None:
            lines.append(f"NE: {fmt(ne)}")
        if mem and isinstance(mt.get(mem), (int, float)):
            lines.append(f"peak memory: {fmt(mt[mem] / GIB)} GiB")
        lines.append(html.escape(a.get("measured/served")
                                 or ("SIMULATED" if a.get("source") == "simulated" else "measured")))
        out.append({"i": i, "trial": t, "ok": ok, "feasible": feasible, "value": v, "metrics": mt,
                    "lo": mt.get(lo_name, v), "hi": mt.get(hi_name, v), "kind": a.get("failure_kind") or "error",
                    "served": "served" in str(a.get("measured/served", "")), "text": "<br>".join(lines)})
    return out


def _layout(fig, title: str, x: str, y: str, height: int = 420) -> None:
    fig.update_layout(title=dict(text=html.escape(title), x=0.01), template="plotly_white", height=height,
                      margin=dict(l=70, r=20, t=60, b=50), hoverlabel=dict(align="left"),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0))
    fig.update_xaxes(title_text=html.escape(x))
    fig.update_yaxes(title_text=html.escape(y))


def _nan_none(xs):
    return [None if x is None or (isinstance(x, float) and math.isnan(x)) else x for x in xs]


def _fig_best_so_far(go, name, space, own, curves, label):
    m = space.primary.metric
    fig = go.Figure()
    xs = list(range(1, len(own) + 1))
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"]
    banded = any(lo != hi for v, lo, hi in own if not math.isnan(v))
    if banded:  # the band only when some best has repeats; a single sample has no interval to draw
        fig.add_trace(go.Scatter(x=xs, y=_nan_none([c for _, _, c in own]), mode="lines", line=dict(width=0),
                                 showlegend=False, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=xs, y=_nan_none([b for _, b, _ in own]), mode="lines", line=dict(width=0),
                                 fill="tonexty", fillcolor="rgba(31,119,180,0.18)", hoverinfo="skip",
                                 name="95% interval of the best"))
    for i, (lab, cur) in enumerate(curves.items()):
        text = [f"after {x} runs: best {fmt(v)}" + (f" [{fmt(lo)}–{fmt(hi)}]" if i == 0 and banded else "")
                for x, v, (_, lo, hi) in zip(xs, cur, own if i == 0 else [(0, 0, 0)] * len(cur))]
        fig.add_trace(go.Scatter(x=list(range(1, len(cur) + 1)), y=_nan_none(cur), mode="lines+markers",
                                 name=lab, text=text, hovertemplate="%{text}<extra>" + html.escape(lab) + "</extra>",
                                 line=dict(width=3 if i == 0 else 1.5, color=colors[i % len(colors)])))
    _layout(fig, f"{name}: best feasible {m} so far ({label})", f"real runs ({label})", f"best feasible {m}")
    ys = [y for cur in curves.values() for y in cur if not math.isnan(y)]
    if not banded and max(ys) - min(ys) <= 1e-6 * max(abs(y) for y in ys):  # flat: ticks 1e-6 apart say nothing
        fig.update_yaxes(range=[0.9 * min(ys), 1.1 * max(ys)] if min(ys) > 0 else None)
    cap = (f"Best feasible {m} after each real run" + (", against the baselines" if len(curves) > 1 else "")
           + (". The band is the best configuration's 95% interval (cubic.core.stats: pooled over its repeats "
                 "with the machine's noise; one run alone: its within-run interval)" if banded else
              ". No band: the step model gives the same figure every time" if label == "SIMULATED" else
              ". No band: every best so far is a single sample") + f". Runs are {label}.")
    return fig, cap


def _fig_runs(go, make_subplots, name, space, runs, label):
    m = space.primary.metric
    failed = [r for r in runs if not r["ok"]]
    if failed:
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.78, 0.22], vertical_spacing=0.04)
        where = dict(row=1, col=1)
    else:
        fig, where = go.Figure(), {}
    winner = max((r for r in runs if r["feasible"]), default=None,
                 key=lambda r: r["value"] if space.primary.direction == "maximize" else -r["value"])
    groups = [("measured", lambda r: r["feasible"] and not r["served"], dict(color="#1f77b4", size=9)),
              ("served from the trial store", lambda r: r["feasible"] and r["served"],
               dict(color="#2ca02c", size=9, symbol="diamond")),
              ("breaks a constraint", lambda r: r["ok"] and not r["feasible"] and r["value"] is not None,
               dict(color="#ff7f0e", size=9, symbol="circle-open", line=dict(width=2)))]
    if label == "SIMULATED":
        groups[0] = ("SIMULATED", groups[0][1], groups[0][2])
    for lab, keep, marker in groups:
        rs = [r for r in runs if keep(r)]
        if not rs:
            continue
        err = None
        if any(r["lo"] != r["hi"] for r in rs):
            err = dict(type="data", symmetric=False, array=[r["hi"] - r["value"] for r in rs],
                       arrayminus=[r["value"] - r["lo"] for r in rs], thickness=1, width=3)
        fig.add_trace(go.Scatter(x=[r["i"] for r in rs], y=[r["value"] for r in rs], mode="markers", name=lab,
                                 marker=marker, error_y=err, text=[r["text"] for r in rs],
                                 hovertemplate="%{text}<extra></extra>"), **where)
    if winner is not None:
        fig.add_trace(go.Scatter(x=[winner["i"]], y=[winner["value"]], mode="markers", name="winner",
                                 marker=dict(symbol="star", size=18, color="#d62728",
                                             line=dict(width=1, color="black")),
                                 text=[winner["text"]], hovertemplate="%{text}<extra>winner</extra>"), **where)
    _layout(fig, f"{name}: every run ({label}); hover for its config and result", f"run ({label})", m, height=470)
    if failed:
        fig.add_trace(go.Scatter(x=[r["i"] for r in failed], y=[r["kind"] for r in failed], mode="markers",
                                 name="failed or stopped", marker=dict(symbol="x", size=10, color="#7f7f7f"),
                                 text=[r["text"] for r in failed], hovertemplate="%{text}<extra>%{y}</extra>"),
                      row=2, col=1)
        fig.update_xaxes(title_text="", row=1, col=1)
        fig.update_yaxes(title_text="not ok", type="category", row=2, col=1)
    cap = (f"{m} of each run in the order they ran" + ("; bars: 95% interval over repeats" if any(
        r["lo"] != r["hi"] for r in runs if r["value"] is not None) else "")
           + ("; below, the failed runs and those a pruner stopped, by kind" if failed else "")
           + ". Hover a point: the run's config, result, "
           "NE, memory, and whether it was measured or served from the trial store.")
    return fig, cap


def _fig_pareto(go, name, space, runs, second, sec_dir, label):
    m = space.primary.metric
    xt, scale = _axis(second)
    feas = [r for r in runs if r["feasible"] and isinstance(r["metrics"].get(second), (int, float))]
    if len(feas) < 2:
        return None, f"Pareto front: {len(feas)} feasible runs report both {m} and {second} (needs 2)"
    a = np.array([r["value"] for r in feas], dtype=float)
    b = np.array([r["metrics"][second] for r in feas], dtype=float)
    front = _pareto_mask(a if space.primary.direction == "maximize" else -a, b if sec_dir == "minimize" else -b)
    fig = go.Figure()
    on = sorted((r for r, f in zip(feas, front) if f), key=lambda r: r["metrics"][second])
    off = [r for r, f in zip(feas, front) if not f]
    # runs that break a constraint are not options (the figure of every run shows them)
    for lab, rs, style in (("dominated", off, dict(mode="markers", marker=dict(color="#9aa5b1", size=9))),
                           ("Pareto front", on, dict(mode="lines+markers", marker=dict(color="#d62728", size=10),
                                                     line=dict(color="#d62728")))):
        if rs:
            fig.add_trace(go.Scatter(x=[r["metrics"][second] * scale for r in rs], y=[r["value"] for r in rs],
                                     name=lab, text=[r["text"] for r in rs],
                                     hovertemplate="%{text}<extra>" + lab + "</extra>", **style))
    what = "throughput" if is_throughput(m) else m
    _layout(fig, f"{name}: {what} against {'memory' if second.endswith('_bytes') else second} ({label})",
            f"{xt} ({label})", f"{m} ({label})")
    return fig, (f"{m} against {second} for every feasible run; red: the configurations no other beats on both "
                 f"({len(on)} of {len(feas)}).")


def _fig_predicted(go, space, pairs, agreement, label):
    from cost_models.proxy import tau_evidence

    tau, p_value = agreement
    m = space.primary.metric
    y, p = np.array([q for _, q, _ in pairs], dtype=float), np.array([q for q, _, _ in pairs], dtype=float)
    lo, hi = float(min(p.min(), y.min())), float(max(p.max(), y.max()))
    fig = go.Figure([go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(dash="dash", color="black", width=1),
                                name="prediction = run", hoverinfo="skip"),
                     go.Scatter(x=y, y=p, mode="markers", name="proposal", marker=dict(size=9),
                                text=[r["text"] for _, _, r in pairs], hovertemplate="%{text}<extra></extra>")])
    _layout(fig, f"proxy at proposal time: Kendall tau {tau:.2f} (n={len(pairs)}, one-sided p {p_value:.2g})",
            f"{m} ({label})", f"proxy prediction of {m} (modelled)")
    return fig, (f"Each validated proposal: what the proxy predicted before the run, against the run. "
                 f"{tau_evidence(tau, p_value, len(pairs))}.")


def _fig_importance(go, space, importance):
    names = list(importance.knobs)[::-1]
    k = importance.knobs
    above = [max(0.0, k[n].hi - k[n].value) for n in names]
    below = [max(0.0, k[n].value - k[n].lo) for n in names]
    fig = go.Figure(go.Bar(x=[k[n].value for n in names], y=names, orientation="h",
                           error_x=dict(type="data", symmetric=False, array=above, arrayminus=below),
                           hovertemplate="%{y}: %{x:.2f}<extra></extra>"))
    _layout(fig, "which knobs mattered (fANOVA, 95% interval over bootstrap resamples of the runs)",
            f"importance for {space.primary.metric}", "", height=max(220, 40 * len(names) + 120))
    return fig, (f"How much of the variance of the objective each parameter explains (fANOVA over the "
                 f"{importance.runs} completed runs); the bars' whiskers: 95% interval over "
                 f"{importance.resamples} bootstrap resamples of the runs ({PERCENTILES[0]:g}-{PERCENTILES[1]:g} "
                 f"percentiles, checked: results/importance_calibration.json); {importance.first} ranks first in "
                 f"{importance.first_share:.0%} of them ({'resolved' if importance.resolved else 'not resolved'}).")


def _plotly():
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError as e:  # a dependency of cubic (pyproject.toml): an old environment lacks it
        raise ImportError("the campaign report draws its figures with plotly, which is not installed: "
                          "pip install plotly (or `make`)") from e
    return go, make_subplots


def _best_so_far_curves(storage, name: str, space: Space, trials, ctx, baselines: list[str],
                        existing: set[str]) -> tuple[list[tuple[float, float, float]], dict[str, list[float]]]:
    """This campaign's best so far (with its 95% band), and the best-so-far curve of it and of each
    baseline campaign in the storage, by legend label."""
    own = _best_curve_with_interval(space, trials, ctx)
    curves = {name: [v for v, _, _ in own]}
    for b in baselines:
        if b in existing:
            bm, _, bt = _load(storage, b)
            curves[f"{b} ({bm['strategy']})"] = _best_curve(space, bt, bm.get("context", {}))
    return own, curves


def _add_pareto(go, name: str, space: Space, runs, mem: str | None, label: str, figures: list,
                skipped: list[str]) -> None:
    """The objective against the second objective, else memory: drawn into ``figures``, or why not into
    ``skipped``."""
    m = space.primary.metric
    second = space.objectives[1].metric if len(space.objectives) > 1 else mem
    sec_dir = space.objectives[1].direction if len(space.objectives) > 1 else "minimize"
    if second is None:
        skipped.append(f"Pareto front: no run reports a memory figure ({', '.join(MEMORY_METRICS)})")
    else:
        fig, cap = _fig_pareto(go, name, space, runs, second, sec_dir, label)
        if fig is None:
            skipped.append(cap)
        else:
            figures.append(("pareto", "Throughput against memory" if second == mem and is_throughput(m)
                            else "Pareto front", fig, cap))


def _proposal_pairs(space: Space, trials, runs) -> list[tuple[float, float, dict[str, Any]]]:
    """(the proxy's prediction at proposal time, the run's value, the run) for each successful run the
    proxy predicted."""
    m = space.primary.metric
    return [(t.user_attrs["predicted"].get(m), r["value"], r) for t, r in zip(trials, runs)
            if t.user_attrs.get("predicted") and r["ok"] and t.user_attrs["predicted"].get(m) is not None
            and r["value"] is not None]


def _write_winner(out: Path, space: Space, winner: dict[str, Any] | None, confirm: dict[str, Any] | None,
                  ci: tuple[str, str]) -> None:
    """Adds the 95% interval of a fresh run (and the confirm step's) to ``winner`` and writes it as
    ``winner.json``; removes a stale one when there is no winner."""
    m = space.primary.metric
    lo_name, hi_name = ci
    if winner is not None:
        wm = winner.get("metrics", {})
        winner["interval_95"] = {"metric": m, "value": wm.get(m), "lo": wm.get(lo_name, wm.get(m)),
                                 "hi": wm.get(hi_name, wm.get(m)), "repeats": wm.get("repeats", 1.0),
                                 "meaning": "what a fresh run measures"}
        if confirm:
            winner["confirm"] = confirm
            cw = confirm.get("winner")
            if cw and confirm.get("metric") == m and space.key(cw["point"]) == space.key(winner.get("point") or {}):
                # the one interval of this configuration: the confirm step's estimate over every repeat
                winner["interval_95"].update(value=cw["value"], lo=cw["lo"], hi=cw["hi"], repeats=cw["repeats"],
                                             basis=cw.get("basis"))
        (out / "winner.json").write_text(json.dumps(winner, indent=2, default=str) + "\n")
    else:
        (out / "winner.json").unlink(missing_ok=True)  # a stale winner of an earlier report must not pass for this one


def _confirmed_text(x: dict[str, Any]) -> str:
    """A configuration the confirm step re-measured: its 95% interval at its point."""
    point = ", ".join(f"{k}={fmt(v) if isinstance(v, float) else v}" for k, v in x["point"].items())
    return f"{interval_text(x)} at {point}"


def _summary(name: str, meta: dict[str, Any], study, trials, runs, ctx, label: str,
             tau: tuple[float, float, int] | None,
             winner: dict[str, Any] | None, confirm: dict[str, Any] | None, m: str) -> dict[str, Any]:
    """The campaign in a few lines (the page's summary table and summary.json)."""
    from cost_models.proxy import tau_evidence

    summary = {"campaign": name, "workload": ctx.get("workload"), "strategy": meta["strategy"],
               "runs": len(trials), "budget": meta["budget"], "status": study.user_attrs.get("status"),
               "stop_reason": study.user_attrs.get("stop_reason"), "runs are": label,
               "failed runs": sum(1 for r in runs if not r["ok"] and r["kind"] != "pruned"),
               "runs stopped early by the pruner": sum(1 for r in runs if not r["ok"] and r["kind"] == "pruned") or None,
               "proxy Kendall tau at proposal time": None if tau is None else round(tau[0], 3),
               "proxy ranking, tested": None if tau is None else tau_evidence(*tau),
               "warm start from": ", ".join(meta.get("warm_start") or []) or "-"}
    if winner is not None:
        iv = winner["interval_95"]
        summary[f"best {m} (95% interval of a fresh run, repeats)"] = (
            f"{fmt(iv['value'])} [{fmt(iv['lo'])}, {fmt(iv['hi'])}] ({iv.get('basis') or format(iv['repeats'], '.0f')})"
            if iv["lo"] != iv["hi"] else f"{fmt(iv['value'])} (deterministic source: no interval)")
    if confirm and confirm.get("winner"):
        summary["confirmed winner (95% interval)"] = _confirmed_text(confirm["winner"])
        summary["confirmed runner-up (95% interval)"] = (_confirmed_text(confirm["runner_up"])
                                                         if confirm.get("runner_up") else "-")
        # the verdict names the repeats spent where they matter (it said them twice here before)
        verdict = (confirm.get("verdict")
                   or f"after {confirm['repeats_spent']} of {confirm['repeat_budget']} extra repeats")
        separated = {True: "yes", False: "no", None: "-"}[confirm["separated"]]
        summary["winner separated from runner-up"] = f"{separated} ({verdict})"
    return summary


def _against_order(storage, name: str, space: Space, confirm, baselines: list[str], existing: set[str]):
    """The campaign's winner against its sibling's that walked the step model's order, where it ran."""
    sib = f"{name}-prior-order"
    if sib not in baselines or sib not in existing:
        return None
    _, study, trials = _load(storage, sib)
    return against_order(space, confirm, sib, study.user_attrs.get("confirm"), trials)


def write_report(name: str, *, storage: Any, out_dir: str | Path, baselines: list[str] | None = None,
                 store_url: str | None = None) -> Path:
    """``index.html`` (one self-contained page: the answer first, then interactive plotly figures,
    plotly.js inlined so it opens without a network), ``answer.md``, ``winner.yaml``,
    ``winner.json`` and ``summary.json`` in ``out_dir``."""
    from cost_models.proxy import rank_agreement
    from cubic.core.stats import ci_names

    go, make_subplots = _plotly()
    storage = open_storage(storage, create=False) if isinstance(storage, str) else storage
    meta, study, trials = _load(storage, name)
    space = Space.model_validate(meta["space"])
    ctx = meta.get("context", {})
    m = space.primary.metric
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    label = _source_label(trials)
    existing = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    if baselines is None:
        baselines = [f"{name}-{b}" for b in BASELINES if f"{name}-{b}" in existing]
    mem = _memory_metric(trials)
    runs = _runs(space, trials, ctx, mem)
    figures: list[tuple[str, str, Any, str]] = []  # (id, heading, plotly figure, caption)
    skipped: list[str] = []  # figures not drawn, and why

    # best so far against real runs, with the baselines
    own, curves = _best_so_far_curves(storage, name, space, trials, ctx, baselines, existing)
    if all(math.isnan(v) for cur in curves.values() for v in cur):
        skipped.append("best so far: no feasible run yet (every run failed or broke a constraint)")
    else:
        figures.append(("best_so_far", "Best so far", *_fig_best_so_far(go, name, space, own, curves, label)))
    _add_pareto(go, name, space, runs, mem, label, figures, skipped)
    if runs:
        figures.append(("runs", "Every run", *_fig_runs(go, make_subplots, name, space, runs, label)))

    # predicted (at proposal time) against measured
    pairs = _proposal_pairs(space, trials, runs)
    tau = None
    if len(pairs) < 5:  # a rank correlation over fewer points says nothing
        if any(t.user_attrs.get("predicted") for t in trials):
            skipped.append(f"predicted vs measured: {len(pairs)} runs with a proxy prediction (needs 5)")
    else:
        agreement = rank_agreement(np.array([y for _, y, _ in pairs]), np.array([p for p, _, _ in pairs]))
        tau = (*agreement, len(pairs))
        figures.append(("predicted_vs_measured", "Proxy prediction against the run",
                        *_fig_predicted(go, space, pairs, agreement, label)))

    n_skipped = len(skipped)
    importance = knob_importance(study, trials, skipped)
    no_importance = skipped[-1] if importance is None and len(skipped) > n_skipped else None
    if importance is not None:
        figures.append(("importance", "Which knobs mattered", *_fig_importance(go, space, importance)))

    winner = winner_job_config(space, meta, trials, store_url)
    confirm = study.user_attrs.get("confirm")
    _write_winner(out, space, winner, confirm, ci_names(m))
    answer = campaign_answer(space, meta, study, trials, importance=importance, no_importance=no_importance,
                             winner_doc=winner, source=label,
                             against_order=_against_order(storage, name, space, confirm, baselines, existing))
    write_answer(out, answer)  # answer.md, and winner.yaml as `cubic run --config` takes it

    summary = _summary(name, meta, study, trials, runs, ctx, label, tau, winner, confirm, m)
    page = out / "index.html"
    page.write_text(_page(name, ctx, label, answer, out, figures, skipped, summary, runs, space, mem))
    (out / "summary.json").write_text(json.dumps({**summary, "confirm": confirm,
                                                  "importance": importance.as_dict() if importance else None,
                                                  "figures": [f for f, *_ in figures], "not_drawn": skipped},
                                                 indent=2, default=str))
    return page


STYLE = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:auto;padding:0 12px;color:#222}"
         "td,th{padding:3px 9px;border-bottom:1px solid #ddd;font-size:13px;text-align:left}"
         "table{border-collapse:collapse;margin:6px 0}"
         "#answer{border:2px solid #2a7;border-radius:6px;padding:4px 16px 10px;background:#f6fbf8}"
         "#answer h2{margin-top:10px} .cap{color:#444;font-size:13px;margin-top:0} .note{color:#666;font-size:13px}"
         "pre{background:#f4f4f4;padding:8px;font-size:12px;overflow-x:auto} h3{margin-bottom:2px}")


def _page(name, ctx, label, answer, out: Path, figures, skipped, summary, runs, space, mem) -> str:
    e = html.escape
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>campaign {e(name)}</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>Campaign {e(name)}</h1><p class='note'>"
             + " · ".join(e(str(x)) for x in (ctx.get("workload"), f"{len(runs)} runs", label) if x) + "</p>",
             "<section id='answer'>", answer.html()]
    if (out / "winner.yaml").exists():
        parts.append("<details><summary>winner.yaml</summary><pre>" + e((out / "winner.yaml").read_text())
                     + "</pre></details>")
    parts.append("</section>")
    if figures:
        parts.append("<section id='figures'><h2>Figures</h2><p class='note'>Interactive: hover a point for its run, "
                     "drag to zoom, double-click to reset.</p>")
        for i, (key, head, fig, cap) in enumerate(figures):
            # plotly.js once, inline, with the first figure: the page opens without a network
            div = fig.to_html(include_plotlyjs=i == 0, full_html=False, div_id=f"fig-{key}",
                              config={"displaylogo": False, "responsive": True})
            parts.append(f"<h3>{e(head)}</h3>{div}<p class='cap'>{e(cap)}</p>")
        parts.append("</section>")
    if skipped:
        parts.append("<p class='note'>Not drawn: " + "; ".join(e(s) for s in skipped) + ".</p>")
    parts.append("<section id='campaign'><h2>Campaign</h2><table>")
    parts += [f"<tr><th>{e(k)}</th><td>{e(fmt(v) if isinstance(v, float) else str(v))}</td></tr>"
              for k, v in summary.items() if v not in (None, "-")]
    parts.append("</table></section>")
    parts.append(_top_runs(runs, space, mem, label))
    failed = [r for r in runs if not r["ok"]]
    if failed:
        parts.append("<section id='failed'><h2>Failed runs and runs stopped early</h2><table><tr><th>run</th>"
                     "<th>kind</th><th>reason</th>"
                     "<th>config</th></tr>")
        for r in failed[:30]:
            a = r["trial"].user_attrs
            parts.append(f"<tr><td>{r['i']}</td><td>{e(str(a.get('failure_kind')))}</td>"
                         f"<td>{e(str(a.get('reason'))[:200])}</td><td>{e(_config(r['trial']))}</td></tr>")
        parts.append("</table></section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _config(t) -> str:
    """A run's point for people (its exact values are in winner.yaml and the study)."""
    return ", ".join(f"{k}={fmt(v) if isinstance(v, float) else v}" for k, v in t.params.items())


def _top_runs(runs, space, mem, label) -> str:
    """The best 15 successful runs, without a column no run has anything in."""
    m = space.primary.metric
    sign = -1 if space.primary.direction == "maximize" else 1
    rows = sorted((r for r in runs if r["ok"] and r["value"] is not None), key=lambda r: sign * r["value"])[:15]
    if not rows:
        return ""
    ne = next((k for k in NE_METRICS if any(k in r["metrics"] for r in rows)), None)
    cols = [("run", lambda r: str(r["i"])), (m, lambda r: fmt(r["value"]))]
    if any(r["lo"] != r["hi"] for r in rows):
        cols += [("95% interval", lambda r: f"{fmt(r['lo'])}–{fmt(r['hi'])}"),
                 ("repeats", lambda r: f"{r['metrics'].get('repeats', 1.0):.0f}")]
    if ne:
        cols.append((ne, lambda r: fmt(r["metrics"][ne]) if ne in r["metrics"] else "–"))
    if mem:
        cols.append(("peak memory (GiB)", lambda r: fmt(r["metrics"][mem] / GIB) if mem in r["metrics"] else "–"))
    cols += [("constraints", lambda r: "ok" if r["feasible"] else "broken"),
             ("measured/served", lambda r: str(r["trial"].user_attrs.get("measured/served") or label)),
             ("config", lambda r: _config(r["trial"]))]
    if all(r["feasible"] for r in rows):
        cols = [c for c in cols if c[0] != "constraints"]
    e = html.escape
    out = [f"<section id='top-runs'><h2>Top runs ({e(label)})</h2><table><tr>"
           + "".join(f"<th>{e(c)}</th>" for c, _ in cols) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{e(f(r))}</td>" for _, f in cols) + "</tr>" for r in rows]
    out.append("</table></section>")
    return "\n".join(out)


CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_chromium() -> str | None:
    """A headless-capable Chromium on PATH ($CUBIC_CHROMIUM first), or None."""
    import os
    import shutil

    for name in ((os.environ.get("CUBIC_CHROMIUM") or "",) + CHROMIUM_NAMES):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def render_in_chromium(page: str | Path, *, screenshot: str | Path | None = None, size: tuple[int, int] = (1200, 3000),
                       budget_ms: int = 5000, chromium: str | None = None, timeout_s: float = 120) -> str:
    """The page's DOM after its scripts ran, in headless Chromium (``--dump-dom``), or with
    ``screenshot`` a PNG of the window instead (returns ""). ``--virtual-time-budget`` lets plotly
    draw before the DOM is read; a fresh profile directory keeps parallel calls apart."""
    import subprocess
    import tempfile

    exe = chromium or find_chromium()
    if exe is None:
        raise FileNotFoundError("no Chromium on PATH (" + ", ".join(CHROMIUM_NAMES) + "; or set $CUBIC_CHROMIUM)")
    url = Path(page).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="cubic-chromium-") as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
               f"--virtual-time-budget={budget_ms}"]
        cmd += [f"--screenshot={Path(screenshot).resolve()}", url] if screenshot else ["--dump-dom", url]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{exe} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return "" if screenshot else done.stdout
