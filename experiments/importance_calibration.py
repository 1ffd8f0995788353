"""Does the answer's "which knobs mattered" survive a second look? (issue 22)

The answer shows each knob's fANOVA share with a 95% interval over bootstrap resamples of the runs
(their ``PERCENTILES``, 0.5-99.5) and calls "which knob mattered most" resolved only when one knob
ranks first in 97.5% of the resamples (``RESOLVED_SHARE``; both in :mod:`cubic.codesign.importance`).
This checks both claims against a truth they were not fitted to: campaigns on a job whose variance
decomposition is known exactly.

The job (MODELLED, no training): three float knobs x1..x3 in [0, 1], sampled uniformly (a random
search), throughput ``1 + w1 x1 + w2 x2 + w3 x3`` times lognormal noise of sigma 0.17 (this
machine's between-repeat noise in make run's campaign: 15.8-18.9%). The objective spans 2x over
the space, as batch size does there. Additive, so each knob's true share of the variance is
``w_i^2 / sum w^2`` (what fANOVA's normalised main effects estimate). Two regimes:

- ``clear``: w = (0.8, 0.4, 0.2), shares 0.76 / 0.19 / 0.05: x1 truly matters most;
- ``tie``: w = (0.6, 0.6, 0.2), shares 0.47 / 0.47 / 0.05: no knob matters most, so every
  "resolved" claim is wrong; the answer before this check ranked them anyway;
- ``graded``: w = (0.6, 0.45, 0.3), shares 0.55 / 0.31 / 0.14: x1 first by less.

The percentiles were chosen (stop 63) from campaigns of this job: seeds 0-39 of ``clear`` and
1000-1039 of ``tie``, where the usual 2.5-97.5 held the true share in 86-89% of pairs. So this run
uses fresh seeds (from ``SEED_BASE``) and ``graded``, a regime not looked at when choosing, and
records both ranges: the answer's and the 2.5-97.5 it replaced.

Each at 12 runs (make run's campaign) and 40. Per campaign: the bootstrap intervals (do they hold
the true share?) and the resolved verdict. Targets: in a tie, "resolved" in at most 5% of campaigns
(any such claim is false); where x1 is first, at most 5% of "resolved" claims name another knob;
each cell's intervals hold the true share for at least 90% of knobs x campaigns (nominal 95%).

    .venv/bin/python experiments/importance_calibration.py [--quick] [--campaigns N]

(``--quick`` writes results/importance_calibration_quick.json, never the full result.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import optuna  # noqa: E402

from cubic.codesign.importance import PERCENTILES, RESAMPLES, knob_importance  # noqa: E402
from cubic.core.stats import rate_interval  # noqa: E402
from experiments.common import png_path, run_context, write_result  # noqa: E402

NAME = "importance_calibration"
NOISE_SIGMA = 0.17
REGIMES = {"clear": (0.8, 0.4, 0.2), "tie": (0.6, 0.6, 0.2), "graded": (0.6, 0.45, 0.3)}
HELD_OUT = {"graded"}  # not looked at when PERCENTILES was chosen
SEED_BASE = 5000  # PERCENTILES was chosen on seeds 0-39 and 1000-1039: these campaigns are fresh
NARROW = (2.5, 97.5)  # the bootstrap's usual 95% range, the answer's interval before stop 63
RUNS = (12, 40)
KNOBS = ("x1", "x2", "x3")
COVERAGE_TARGET = 0.90  # of (campaign, knob) pairs: the interval holds the true share (nominal 95%)
WRONG_RESOLVED_TARGET = 0.05  # false "resolved": of tie campaigns, and of claims where one knob is first

optuna.logging.set_verbosity(optuna.logging.WARNING)


def true_shares(w: tuple[float, ...]) -> dict[str, float]:
    v = np.square(w)  # Var(w x) for x ~ U(0, 1) is w^2 / 12: the 12 cancels in the share
    return {k: float(s) for k, s in zip(KNOBS, v / v.sum())}


def campaign(w: tuple[float, ...], runs: int, seed: int, resamples: int) -> dict:
    rng = np.random.default_rng(seed)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=seed))

    def objective(t):
        x = [t.suggest_float(k, 0.0, 1.0) for k in KNOBS]
        return (1.0 + float(np.dot(w, x))) * float(rng.lognormal(0.0, NOISE_SIGMA))

    study.optimize(objective, n_trials=runs)
    imp = knob_importance(study, study.trials, [], resamples=resamples)
    narrow = np.percentile(np.array(imp.draws), NARROW, axis=0)  # per knob, in the order of imp.knobs
    return {"seed": seed, "first": imp.first, "first_share": imp.first_share, "resolved": imp.resolved,
            "knobs": {n: [k.value, k.lo, k.hi] for n, k in imp.knobs.items()},
            "narrow": {n: [float(narrow[0, j]), float(narrow[1, j])] for j, n in enumerate(imp.knobs)}}


def cell_figures(regime: str, rows: list[dict]) -> dict:
    truth = true_shares(REGIMES[regime])
    truly_first = max(truth, key=truth.get) if regime != "tie" else None
    held = [lo <= truth[n] <= hi for r in rows for n, (_, lo, hi) in r["knobs"].items()]
    held_narrow = [lo <= truth[n] <= hi for r in rows for n, (lo, hi) in r["narrow"].items()]
    resolved = [r for r in rows if r["resolved"]]
    wrong = [r for r in resolved if r["first"] != truly_first]
    ranked_wrong = [r for r in rows if r["first"] != truly_first]  # what the answer's order said before
    cov, lo, hi = rate_interval(sum(held), len(held))
    return {"campaigns": len(rows), "true_shares": truth, "truly_first": truly_first or "none (a tie)",
            "held_out": regime in HELD_OUT,
            "coverage": cov, "coverage_ci95": [lo, hi], "held": sum(held), "intervals": len(held),
            "coverage_narrow": sum(held_narrow) / len(held_narrow),
            "resolved_claims": len(resolved), "wrong_resolved_claims": len(wrong),
            "mean_estimate": {n: float(np.mean([r["knobs"][n][0] for r in rows])) for n in KNOBS},
            "missed_above": {n: sum(r["knobs"][n][1] > truth[n] for r in rows) for n in KNOBS},
            "missed_below": {n: sum(r["knobs"][n][2] < truth[n] for r in rows) for n in KNOBS},
            "ranked_first_wrongly_share": len(ranked_wrong) / len(rows),
            "median_interval_width": {n: float(np.median([r["knobs"][n][2] - r["knobs"][n][1] for r in rows]))
                                      for n in KNOBS}}


def _coverage_reason(c: dict) -> str:
    """Where the missed intervals lie: fANOVA's bias toward equal shares shows as intervals above a
    small true share and below a large one."""
    est, truth = c["mean_estimate"], c["true_shares"]
    above = ", ".join(f"{n} {k}" for n, k in c["missed_above"].items() if k)
    below = ", ".join(f"{n} {k}" for n, k in c["missed_below"].items() if k)
    return (f"the brackets hold the true share in {c['held']} of {c['intervals']} knob x campaign pairs; "
            f"missed above the truth: {above or 'none'}; below: {below or 'none'}. Mean estimates "
            + ", ".join(f"{n} {est[n]:.2f} (true {truth[n]:.2f})" for n in KNOBS)
            + ": fANOVA over few noisy runs pulls the shares toward equal, and a bootstrap centred on the "
              "estimate inherits that, more than the widened percentiles allow for here")


def targets(cells: dict) -> dict:
    label = "MODELLED job (known truth), importance measured on its runs"
    out = {}
    for key, c in cells.items():
        lo, hi = c["coverage_ci95"]
        met = c["coverage"] >= COVERAGE_TARGET
        seen = "a regime not seen when choosing the percentiles" if c["held_out"] else "fresh seeds"
        what = f"the answer's 95% intervals hold the true share (>= {COVERAGE_TARGET:.0%} of knobs x campaigns)"
        out[f"{key}: {what}"] = {
            "measured": c["coverage"], "target": COVERAGE_TARGET, "met": met, "ci95": [lo, hi],
            "resolved": lo >= COVERAGE_TARGET if met else hi < COVERAGE_TARGET, "label": label,
            "checked_on": seen, "narrow_range_measured": c["coverage_narrow"],
            **({} if met else {"reason": _coverage_reason(c)})}
    # where no knob matters most, any "resolved" is false: judged per campaign; where one does, per claim
    tie = [c for k, c in cells.items() if k.startswith("tie")]
    clear = [c for k, c in cells.items() if not k.startswith("tie")]
    for what, group, count in (("a tie: 'resolved' claimed though no knob matters most", tie, "campaigns"),
                               ("one knob truly first: 'resolved' names another", clear, "resolved_claims")):
        n = sum(c[count] for c in group)
        wrong = sum(c["wrong_resolved_claims"] for c in group)
        w, lo, hi = rate_interval(wrong, n)
        met = n > 0 and w <= WRONG_RESOLVED_TARGET
        unit = "campaigns" if count == "campaigns" else "claims"
        out[f"{what} (<= {WRONG_RESOLVED_TARGET:.0%} of {unit})"] = {
            "measured": w if n else None, "target": WRONG_RESOLVED_TARGET, "met": met, "ci95": [lo, hi],
            "resolved": bool(n) and hi <= WRONG_RESOLVED_TARGET, unit: n, "wrong": wrong, "label": label,
            **({} if met else {"reason": f"{wrong} of {n} {unit}" if n else "no claim made: nothing to judge"})}
    return out


def plot(cells: dict, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(cells)
    x = np.arange(len(keys))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    cov = [cells[k]["coverage"] for k in keys]
    err = np.array([[c - cells[k]["coverage_ci95"][0], cells[k]["coverage_ci95"][1] - c] for k, c in zip(keys, cov)]).T
    axes[0].bar(x - 0.2, [cells[k]["coverage_narrow"] for k in keys], 0.4, color="#bbb",
                label=f"{NARROW[0]:g}-{NARROW[1]:g} percentiles (before)")
    axes[0].bar(x + 0.2, cov, 0.4, yerr=err, capsize=3, color="#4a8",
                label=f"{PERCENTILES[0]:g}-{PERCENTILES[1]:g} percentiles (the answer's)")
    axes[0].axhline(COVERAGE_TARGET, ls="--", color="k", lw=1, label=f"target {COVERAGE_TARGET:.0%}")
    axes[0].set_ylim(0, 1.05)
    axes[0].set_title("intervals that hold the true share (* held-out regime)")
    axes[1].bar(x - 0.2, [cells[k]["ranked_first_wrongly_share"] for k in keys], 0.4, color="#c66",
                label="first in fANOVA's order, but not truly first (the old answer's ranking)")
    axes[1].bar(x + 0.2, [cells[k]["wrong_resolved_claims"] / cells[k]["campaigns"] for k in keys], 0.4, color="#46a",
                label="called resolved, but not truly first (the answer now)")
    axes[1].axhline(WRONG_RESOLVED_TARGET, ls="--", color="k", lw=1)
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("wrong 'mattered most' claims, share of campaigns")
    for ax in axes:
        ax.set_xticks(x, [k + (" *" if cells[k]["held_out"] else "") for k in keys], rotation=20, fontsize=8)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Importance claims against a known truth (MODELLED job, noise sigma {NOISE_SIGMA}; "
                 f"fANOVA measured on its runs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path(name), dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 campaigns per cell, 10 resamples: a smoke run")
    ap.add_argument("--campaigns", type=int, default=40, help="campaigns per regime x runs cell")
    args = ap.parse_args(argv)
    if args.campaigns < 1:
        ap.error("--campaigns: at least 1")
    n, resamples = (2, 10) if args.quick else (args.campaigns, RESAMPLES)
    ctx = run_context("mixed")
    t0 = time.perf_counter()
    cells, raw = {}, {}
    for regime, w in REGIMES.items():
        for runs in RUNS:
            key = f"{regime}, {runs} runs"
            base = SEED_BASE + 1000 * list(REGIMES).index(regime)  # each regime its own runs and noise
            raw[key] = [campaign(w, runs, base + seed, resamples) for seed in range(n)]
            cells[key] = cell_figures(regime, raw[key])
            c = cells[key]
            print(f"{key}: coverage {c['coverage']:.0%} ({c['coverage_narrow']:.0%} with {NARROW}), "
                  f"resolved {c['resolved_claims']}/{n} ({c['wrong_resolved_claims']} wrongly), "
                  f"fANOVA's first wrong {c['ranked_first_wrongly_share']:.0%}",
                  flush=True)
    name = NAME + ("_quick" if args.quick else "")
    payload = {**ctx, "benchmark": NAME, "quick": args.quick, "targets": targets(cells),
               "labels": {"job": "MODELLED (known variance decomposition)",
                          "importance": "measured: cubic.codesign.importance on the job's runs"},
               "settings": {"campaigns_per_cell": n, "resamples": resamples, "noise_sigma": NOISE_SIGMA,
                            "percentiles": list(PERCENTILES), "narrow_percentiles": list(NARROW),
                            "seed_base": SEED_BASE, "held_out_regimes": sorted(HELD_OUT),
                            "regimes": {k: list(v) for k, v in REGIMES.items()}, "runs": list(RUNS),
                            "sampler": "optuna RandomSampler (uniform: fANOVA's truth is the uniform-domain "
                                       "decomposition; a proxy-guided campaign samples the good region more)"},
               "cells": cells, "campaigns": raw, "runtime_s": time.perf_counter() - t0}
    write_result(name, payload)
    plot(cells, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
