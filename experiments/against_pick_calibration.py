"""Does "against the step model alone" survive a second look? (issue 22)

Every campaign whose first round was the step model's pick ends its answer with the winner against that
pick (:mod:`cubic.codesign.against_prior`): since stop 85 the geometric mean of the ratios of SPEEDUP_PAIRS
pairs of the two run back to back after the winner was chosen, with its 95% interval, "separated" where that
interval lies above 1x (before: the ratio of their pooled runs' typical values, the pick's run in the search
among them, "separated" from two or more processes each). This checks that line against a truth it never saw:
campaigns on the known-noise job (experiments/_noisy_job.py: throughput a KNOWN function of its knob times
lognormal noise of sd 5% per process), each started from a step model that is a table of predictions,
right or wrong as set below, so the true ratio of the winner to the model's pick is known.

Step models (predicted qps by knob value; the job's tables put the best at a=4, 100):

- ``right``: picks a=4, the true best (the line should mostly say the pick is the winner);
- ``near``: picks a=5, 97 in ``default`` (a near-tie: the line should rarely call it beaten) and 75 in
  ``clear``;
- ``off``: picks a=3 (92 / 70), with the true best fifth in its order;
- ``wrong``: picks a=6 (70 / 50), the true best last.

Each campaign runs as ``cubic campaign run --objective`` runs one (baseline and its noise floor, the cubic
strategy with the step model as its prior, budget 4 in rounds of 2, confirm with 4 repeats and the
speedup pairs), from fresh stores, through the CLI's own pieces (job_build, measure_baseline,
ensure_noise_floor) with the step model as the campaign's featurizer, which the CLI gives only cubic's
own workloads. Targets, written before the first run:

- the line's 95% interval of winner / pick covers the true ratio in >= 90% of the campaigns where the
  winner is not the pick;
- "separated" against the pick is wrong (the pick truly as fast or faster) in <= 5% of such claims;
- and, said but not a target (it measures the search's budget, not the line's honesty): how often the
  line reports the pick as the winner while the pick is truly >= 20% below the best.

    .venv/bin/python experiments/against_pick_calibration.py [--quick] [--campaigns N]

Writes results/against_pick_calibration.json and .png (``--quick``: 1 campaign per cell, to
against_pick_calibration_quick.*). Nothing is timed: the job's noise is drawn, so a busy machine changes
only the wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from experiments._noisy_job import NOISE as JOB_NOISE, SPACE, command, true_qps  # noqa: E402
from experiments.common import png_path, rate_target, run_context, write_result  # noqa: E402

NAME = "against_pick_calibration"
# predicted qps by knob value: each step model's pick first (the tables' true best is a=4)
PRIORS = {"right": {4: 100, 5: 95, 3: 90, 2: 80, 1: 60, 6: 50},
          "near": {5: 100, 4: 95, 3: 90, 2: 80, 1: 60, 6: 50},
          "off": {3: 100, 2: 95, 5: 90, 1: 80, 4: 60, 6: 50},
          "wrong": {6: 100, 1: 95, 2: 90, 3: 80, 5: 60, 4: 50}}
TABLES = ("default", "clear")  # the job's: a near-tie at the top (100 vs 97), and a clear winner (100 vs 80)
BUDGET, BATCH, CONFIRM_REPEATS = 4, 2, 4
SEED_BASE = 9000  # no other experiment's campaigns used these seeds
FAR_BELOW = 0.8  # a pick at or below this fraction of the best is one the search should have beaten


class TablePrior:
    """A step model that is a table: its log prediction of qps for each knob value, in the column named
    by ``prior_columns`` (the campaign's prior, as cubic's featurizer gives its step model's)."""

    def __init__(self, table: dict[int, float]):
        self.table, self.prior_columns = table, {"qps": 0}

    def __call__(self, point: dict, context: dict) -> np.ndarray:
        return np.array([math.log(self.table[int(point["a"])])])


def one_campaign(prior: str, table: str, seed: int, tmp: Path) -> dict:
    """A campaign from fresh stores, its answer's line against the pick, and the truth it is judged by."""
    from cubic.cli.campaign_baseline import ensure_noise_floor, measure_baseline
    from cubic.cli.campaign_job import job_build
    from cubic.codesign.answer import against_prior_lines, default_point
    from cubic.codesign.campaign import Campaign
    from search.space import load_space

    d = tmp / f"{prior}-{table}-{seed}"
    d.mkdir(parents=True)
    (d / "space.yaml").write_text(SPACE)
    space = load_space(d / "space.yaml")
    cmd = command(table)
    # what `campaign run --objective` stores (cubic.cli.campaign_job.job_context)
    ctx = {"job": {"objective": cmd, "launcher": None, "nproc": 1, "cwd": str(d), "timeout": 60.0,
                   "prune": "none", "prune_warmup": 0}}
    name = f"{prior}-{table}-{seed}"
    evaluate = job_build(name, ctx, space, f"sqlite:///{d}/t.db")
    c = Campaign(space, evaluate, name=name, budget=BUDGET, batch_size=BATCH, seed=seed,
                 storage=f"sqlite:///{d}/c.db", featurize=TablePrior(PRIORS[prior]), context=ctx)
    evaluate.attach(c)
    t0 = time.monotonic()
    with contextlib.redirect_stderr(io.StringIO()):  # the baseline's progress line
        base = measure_baseline(c, evaluate, space, {"label": "the space's default point",
                                                      "point": default_point(space), "config": None})
        ensure_noise_floor(base)
        c.run()
        confirm = c.confirm(CONFIRM_REPEATS, baseline=base[:2] if base[2] else None)
    row = {"prior": prior, "table": table, "seed": seed, "wall_s": time.monotonic() - t0}
    a = (confirm or {}).get("against_prior")
    if not a:
        return {**row, "error": "no line against the pick (no confirmed winner, or no run was the pick)"}
    w, p = confirm["winner"]["point"]["a"], a["pick"]["point"]["a"]
    best = max(true_qps(k, table) for k in PRIORS[prior])
    row.update(pick=p, winner=w, is_winner=a["is_winner"], line=against_prior_lines(a)[0],
               true_ratio=true_qps(w, table) / true_qps(p, table), pick_of_best=true_qps(p, table) / best,
               winner_of_best=true_qps(w, table) / best, pick_repeats=a["pick"].get("repeats"))
    if not a["is_winner"] and a.get("lo") is not None:
        row.update(ratio=a["ratio"], lo=a["lo"], hi=a["hi"], separated=bool(a["separated"]),
                   covered=a["lo"] <= row["true_ratio"] <= a["hi"], paired=bool(a.get("paired")))
        if not row["covered"]:  # which side: a line pulled by a selected run misses on one side
            row["missed"] = "above" if a["lo"] > row["true_ratio"] else "below"
        row["wrong"] = row["separated"] and row["true_ratio"] <= 1.0
    return row


def cell_figures(rows: list[dict]) -> dict:
    """One step model x table: what the line said, and how it held against the truth."""
    done = [r for r in rows if "error" not in r]
    judged = [r for r in done if "covered" in r]
    claims = [r for r in judged if r["separated"]]
    said_pick = [r for r in done if r["is_winner"]]
    return {"campaigns": len(rows), "failed": len(rows) - len(done), "pick_is_winner": len(said_pick),
            "with_interval": len(judged), "covered": sum(r["covered"] for r in judged),
            "separated_claims": len(claims), "wrong_separated_claims": sum(r["wrong"] for r in claims),
            "tied": len(judged) - len(claims),
            # a pick in one process is never called beaten: the confirm step runs it again (a second process
            # in stop 84, the pairs since stop 85), so this counts only picks whose runs failed; stop 83 had 287
            "pick_in_one_process": sum(r.get("pick_repeats") == 1 for r in judged),
            # the line from pairs run after the winner was chosen (since stop 85); else the pooled runs'
            "paired": sum(bool(r.get("paired")) for r in judged),
            "missed_above": sum(r.get("missed") == "above" for r in judged),
            "missed_below": sum(r.get("missed") == "below" for r in judged),
            "pick_far_below_reported_winner": sum(r["pick_of_best"] <= FAR_BELOW for r in said_pick),
            "winner_truly_best": sum(r["winner_of_best"] >= 1.0 for r in done),
            "mean_true_ratio_when_judged": float(np.mean([r["true_ratio"] for r in judged])) if judged else None}


def targets(rows: list[dict], quick: bool) -> dict:
    judged = [r for r in rows if "covered" in r]
    claims = [r for r in judged if r["separated"]]
    out = {"against_pick_interval_covers_true_ratio": rate_target(
               sum(r["covered"] for r in judged), len(judged), 0.9, True, "campaigns",
               "the line's interval of winner / pick missed the true ratio in more than 10% of campaigns"),
           "campaigns": {"measured": len(judged), "target": 10, "met": len(judged) >= 10,
                         **({} if len(judged) >= 10 else
                            {"reason": "a --quick smoke run" if quick else "too few campaigns had a winner other "
                                                                           "than the pick"})}}
    out["wrong_separated_against_pick"] = (
        rate_target(sum(r["wrong"] for r in claims), len(claims), 0.05, False, "separated claims",
                    "more than 5% of the lines that called the pick beaten had the pick truly as fast or faster")
        if claims else {"measured": 0.0, "target": 0.05, "met": True, "reason": "no separated claim was made"})
    return out


def misses_by_side(rows: list[dict]) -> dict:
    """Said, not a target: where the line's interval missed the true ratio, on which side. A 95% interval's
    misses fall on both sides about equally; a line pulled by a selected run misses on one (stop 84's pooled
    line: 23 of its 31 misses above the true ratio)."""
    missed = [r["missed"] for r in rows if "missed" in r]
    return {"above": missed.count("above"), "below": missed.count("below"),
            "label": "MEASURED; informational, no target"}


def plot(cells: dict, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(cells)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    x = np.arange(len(keys))
    bottom = np.zeros(len(keys))
    for what, color in (("pick_is_winner", "tab:gray"), ("separated_claims", "tab:green"), ("tied", "tab:orange")):
        v = np.array([cells[k][what] / max(1, cells[k]["campaigns"]) for k in keys])
        ax.bar(x, v, bottom=bottom, color=color, label={"pick_is_winner": "the pick is the winner",
                                                        "separated_claims": "winner separated above the pick",
                                                        "tied": "winner NOT separated from the pick"}[what])
        bottom += v
    cov = [cells[k]["covered"] / cells[k]["with_interval"] if cells[k]["with_interval"] else np.nan for k in keys]
    ax.plot(x, cov, "kD", label="interval covers the true ratio (share of those with one)")
    ax.axhline(0.9, color="k", lw=0.8, ls=":")
    ax.set_xticks(x, keys, rotation=20, fontsize=8)
    ax.set_ylabel("share of campaigns")
    ax.set_ylim(0, 1.05)
    ax.set_title("MEASURED (known-noise job): the answer's line against the step model's pick, vs the truth")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(png_path(name), dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 campaign per cell: a smoke run")
    # 80 per cell: 640 campaigns. The first run's 40 (stop 83, the confirm code before _paired_winner) gave 235
    # with a winner other than the pick, enough to resolve the coverage, but 32 separated claims, short of the
    # ~59 that 0 wrong needs to bound the wrong rate below 5% (a pick run once was never called beaten then)
    ap.add_argument("--campaigns", type=int, default=80, help="campaigns per step model x table cell")
    args = ap.parse_args(argv)
    if args.campaigns < 1:
        ap.error("--campaigns: at least 1")
    n = 1 if args.quick else args.campaigns
    ctx = run_context("measured")
    t0 = time.perf_counter()
    rows, cells = [], {}
    with tempfile.TemporaryDirectory(prefix="cubic-against-pick-") as tmp:
        for i, (prior, table) in enumerate((p, t) for p in PRIORS for t in TABLES):
            cell = [one_campaign(prior, table, SEED_BASE + 100 * i + s, Path(tmp)) for s in range(n)]
            rows += cell
            cells[f"{prior}, {table}"] = c = cell_figures(cell)
            print(f"{prior}, {table}: pick is winner {c['pick_is_winner']}/{n}, separated {c['separated_claims']} "
                  f"({c['wrong_separated_claims']} wrongly), covered {c['covered']}/{c['with_interval']}",
                  file=sys.stderr, flush=True)
    name = NAME + ("_quick" if args.quick else "")
    payload = {**ctx, "benchmark": NAME, "quick": args.quick, "targets": targets(rows, args.quick),
               "labels": {"job": "MEASURED runs of a MODELLED job (experiments/_noisy_job.py: known medians, "
                                 "lognormal noise drawn per process)",
                          "line": "cubic.codesign.against_prior, as each campaign's answer states it"},
               "settings": {"campaigns_per_cell": n, "priors": {k: {str(a): v for a, v in t.items()}
                                                                for k, t in PRIORS.items()},
                            "tables": {t: {str(a): true_qps(a, t) for a in range(1, 7)} for t in TABLES},
                            "job_noise_sd_log": JOB_NOISE, "budget": BUDGET, "batch": BATCH,
                            "confirm_repeats": CONFIRM_REPEATS, "seed_base": SEED_BASE, "far_below": FAR_BELOW},
               "misses_by_side": misses_by_side(rows), "cells": cells, "campaigns": rows,
               "runtime_s": time.perf_counter() - t0}
    write_result(name, payload)
    plot(cells, name)
    print(f"  misses by side: {payload['misses_by_side']}", file=sys.stderr)
    for k, t in payload["targets"].items():
        print(f"  {k}: {t['measured']:.3f} vs {t['target']}: {'met' if t['met'] else 'MISSED'}"
              + (f", 95% CI [{t['ci95'][0]:.3f}, {t['ci95'][1]:.3f}], "
                 f"{'resolved' if t['resolved'] else 'not resolved'}" if t.get("ci95") else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
