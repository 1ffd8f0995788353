"""The H100 model's look at whole training steps: FP8 placed one site at a time, never fitted to.

A placement calls a site *fast* from the modelled fwd+bwd block speedup (``fp8.recommend`` through
``cost_models.gpu_gemm.block_speedup``). ``gpu_checks.py``'s ``site_steps`` section measures what
that verdict is about: the compiled training step of a tower (forward, backward, SGD) in bf16, and
with FP8 on one Linear at a time (torchao's export filtered to it). Per site and recipe:

- **measured change**: the FP8 step minus the bf16 step (the mean of bf16 timed before and after the
  variants); it is *resolved* when larger than the bf16 step's own drift between those two timings,
  else no model is right or wrong about it;
- **shipped model**: the modelled FP8 block time minus bf16's (GPU time only, as placements use it);
- **candidate host floor**: ``max(modelled FP8 time, FP8 floor) - max(modelled bf16 time, bf16 floor)``,
  the floors fitted on the same run's compiled blocks (``_h100_own_check._fit_floor``), never on these
  steps: whether the per-call host time seen on blocks alone is what FP8 costs a host-bound step.

Targets reuse the block check's bars (``BLOCK_TARGETS``): fast/slow agreement on resolved sites, and
the median relative error of the step change on them.
"""

from __future__ import annotations

import statistics

from cost_models.gpu_gemm import GemmConstants, block_speedup
from experiments._h100_model import BLOCK_TARGETS, _spec, meets

SHIPPED = "whole training step, FP8 on one site; shipped model (GPU time only)"
CANDIDATE = "whole training step, FP8 on one site; candidate host floor fitted on the run's blocks"


def _site_times(r: dict, device: str, c: GemmConstants) -> dict[str, float]:
    # the block as fp8.recommend prices a site: no norm before these Linears, ReLU after all but the last
    return block_speedup(r["m"], r["k"], r["n"], r["recipe"], act_after=r["act_after"], mode="compile",
                         device=_spec(device), constants=c)


def site_rows(run: dict, floors: dict[str, float], c: GemmConstants) -> list[dict]:
    """One row per measured site-step variant (and per all-sites variant): measured and modelled
    step changes in ms (negative: FP8 faster)."""
    steps, device = run["site_steps"], run["device"]
    bf16 = {}
    for r in steps:
        if r["variant"] in ("bf16", "bf16_again"):
            bf16.setdefault((r["tower"], r["recipe"]), []).append(r["step_s"] * 1e3)
    out = []
    for r in steps:
        base = bf16.get((r["tower"], r["recipe"]), [])
        if r["variant"] != "site" or len(base) < 2:
            continue
        t = _site_times(r, device, c)
        shipped = t["fp8_ms"] - t["bf16_ms"]
        with_floor = (max(t["fp8_ms"], floors[r["recipe"]]) - max(t["bf16_ms"], floors["bf16"])
                      if {"bf16", r["recipe"]} <= set(floors) else None)  # no blocks measured: no floors
        measured = r["step_s"] * 1e3 - statistics.fmean(base)
        drift = max(base) - min(base)
        out.append({"tower": r["tower"], "recipe": r["recipe"], "site": r["site"], "m": r["m"], "k": r["k"],
                    "n": r["n"], "bf16_step_ms": round(statistics.fmean(base), 4), "measured_change_ms": round(measured, 4),
                    "bf16_drift_ms": round(drift, 4), "resolved": abs(measured) > drift,
                    "shipped_change_ms": round(shipped, 4), "shipped_block_speedup": round(t["speedup"], 4),
                    "candidate_change_ms": None if with_floor is None else round(with_floor, 4)})
    return out


def all_sites_rows(run: dict, rows: list[dict]) -> list[dict]:
    """Every site in FP8 at once, beside the sum of the one-site changes (measured and modelled):
    whether a placement's per-site changes add up in the step."""
    out = []
    for r in run["site_steps"]:
        if r["variant"] != "all":
            continue
        mine = [x for x in rows if (x["tower"], x["recipe"]) == (r["tower"], r["recipe"])]
        if not mine:
            continue
        out.append({"tower": r["tower"], "recipe": r["recipe"],
                    "measured_change_ms": round(r["step_s"] * 1e3 - mine[0]["bf16_step_ms"], 4),
                    "sum_of_measured_site_changes_ms": round(sum(x["measured_change_ms"] for x in mine), 4),
                    "sum_of_shipped_ms": round(sum(x["shipped_change_ms"] for x in mine), 4),
                    "sum_of_candidate_ms": (None if any(x["candidate_change_ms"] is None for x in mine)
                                            else round(sum(x["candidate_change_ms"] for x in mine), 4))})
    return out


def _score(rows: list[dict], key: str) -> dict:
    res = [r for r in rows if r["resolved"] and r[key] is not None]
    agree = [(r["measured_change_ms"] < 0) == (r[key] < 0) for r in res]
    err = [abs(r[key] - r["measured_change_ms"]) / abs(r["measured_change_ms"]) * 100 for r in res]
    return {"n": len(res), "n_unresolved": len(rows) - len(res),
            "fast_slow_pct": 100.0 * sum(agree) / len(agree) if agree else None,
            "median_change_error_pct": statistics.median(err) if err else None}


# (target name, the score's key, its bar, higher is better): the block check's bars, per model
CHECKS = (("site_step_fast_slow_pct", "fast_slow_pct", BLOCK_TARGETS["fast_slow_pct"], True),
          ("site_step_change_error_pct", "median_change_error_pct", BLOCK_TARGETS["mape_pct"], False))


def _targets(scores: dict[str, dict | None], label: str, why_none: str) -> dict:
    out = {}
    for model, score in scores.items():
        for what, key, bar, higher in CHECKS:
            value = score[key] if score else None
            met = meets(value, bar, higher)
            t = {"measured": value, "target": bar, "met": met, "n": score["n"] if score else 0, "label": label}
            if not met:
                t["reason"] = why_none if value is None else (
                    f"{value:.1f} against {bar} ({'at least' if higher else 'at most'}) over {score['n']} resolved "
                    f"sites ({score['n_unresolved']} unresolved by the step's drift)")
            out[f"{what} ({model})"] = t
    return out


def missing_targets(why: str) -> dict:
    """The targets of a run without site steps: missed, with why."""
    return _targets({SHIPPED: None, CANDIDATE: None}, "", why)


def across_runs(runs: list[dict], c: GemmConstants) -> dict:
    """The site steps of every run that has them (each a fresh process; leases apart on another day): a
    site's change is *settled* when every run resolves it by its own drift, with one sign. A verdict one run
    resolves and another contradicts is noise, whatever a model says; the shipped model is scored on the
    settled sites (``fast_slow_pct``), the target ``SETTLED`` names."""
    with_steps = [r for r in runs if r["site_steps"]]
    per: dict[tuple, list[dict]] = {}
    for run in with_steps:
        for r in site_rows(run, {}, c):
            per.setdefault((r["tower"], r["recipe"], r["site"]), []).append(r)
    rows = []
    for (tower, recipe, site), rs in sorted(per.items()):
        if len(rs) < len(with_steps):
            continue
        change = [r["measured_change_ms"] for r in rs]
        settled = all(r["resolved"] for r in rs) and len({x < 0 for x in change}) == 1
        shipped = rs[0]["shipped_change_ms"]
        rows.append({"tower": tower, "recipe": recipe, "site": site, "measured_change_ms": change,
                     "resolved": [r["resolved"] for r in rs], "settled": settled, "shipped_change_ms": shipped,
                     "shipped_right": ((change[0] < 0) == (shipped < 0)) if settled else None})
    right = [r["shipped_right"] for r in rows if r["settled"]]
    return {"label": f"MEASURED in {len(with_steps)} runs ({', '.join(r['file'] for r in with_steps)}) vs MODELLED "
                     "(shipped, GPU time only)",
            "runs": [r["file"] for r in with_steps], "n_sites": len(rows), "n_settled": len(right),
            # a model right on settled sites of one kind only (say every one FP8-faster) is checked on that kind only
            "n_settled_fp8_faster": sum(r["settled"] and r["measured_change_ms"][0] < 0 for r in rows),
            "fast_slow_pct": 100.0 * sum(right) / len(right) if right else None, "rows": rows}


SETTLED = "whole training step, FP8 on one site; shipped model, on the sites every run settles"


def settled_target(across: dict) -> dict:
    """The shipped model's fast/slow agreement on the settled sites, against the block check's bar."""
    value, bar = across["fast_slow_pct"], BLOCK_TARGETS["fast_slow_pct"]
    n, fast = across["n_settled"], across["n_settled_fp8_faster"]
    t = {"measured": value, "target": bar, "met": meets(value, bar, True), "n": n, "label": across["label"],
         "note": f"{fast} of the {n} settled sites FP8-faster, {n - fast} slower"
                 + ("; every one of one kind, so the model is checked on that kind only"
                    if n and fast in (0, n) else "")}
    if not t["met"]:
        t["reason"] = ("no site settled" if value is None else f"{value:.1f} against {bar} (at least)") + (
            f" over {across['n_settled']} of {across['n_sites']} sites settled in {len(across['runs'])} runs "
            "(resolved by each run's drift, with one sign)")
    return {f"site_step_fast_slow_pct ({SETTLED})": t}


def site_step_check(run: dict, floors: dict[str, float], c: GemmConstants) -> dict:
    """The shipped model and the candidate host floor against the run's site steps, with targets."""
    rows = site_rows(run, floors, c)
    shipped, cand = _score(rows, "shipped_change_ms"), _score(rows, "candidate_change_ms")
    label = f"MODELLED vs MEASURED ({run['file']}, {run['label']}; sites the bf16 step's drift resolves)"
    why = (f"no resolved site in {run['file']}'s site_steps (the section did not run there, or every change was "
           "within the step's drift)")
    return {"label": f"MODELLED vs {run['label']} ({run['file']} site_steps; not fitted)",
            "floors_ms": {k: round(v, 4) for k, v in floors.items()},
            "shipped": shipped, "candidate_host_floor": cand, "rows": rows, "all_sites": all_sites_rows(run, rows),
            "targets": _targets({SHIPPED: shipped, CANDIDATE: cand}, label, why)}
