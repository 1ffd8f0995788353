"""search_benchmark ``--held-out``: cubic's search on simulated clusters no design choice was made on
(SIMULATED), merged into results/search_benchmark.json with its own context and targets.

The instances are the development suite's generator (experiments/_search_prior_dev.py) at numbers 12-23: hidden
efficiencies drawn from seeds 7012-7023, which no choice used, on three workloads none was made on. Each hard
instance (the prior's first pick < 98% of the best) is searched by cubic's default campaign, by CubicSampler in
``study.optimize`` and by TPE without the prior, and set against walking the prior's order (every configuration
in the step model's order: what a search that adds nothing to the prior costs). Targets: cubic spends no run
after its first round on configurations the prior gives no throughput (stop 80's fix, found on the suite); cubic
needs at most a third of TPE's runs; cubic needs fewer runs than the prior's order, resolved (the 95% interval of
the per-instance difference below 0): whether the search adds to the step model it starts from; and CubicSampler
matches the campaign (the hard section's rule).
"""

from __future__ import annotations

import time

import numpy as np

from cubic.codesign.prior import cubic_featurizer
from cubic.core.stats import mean_interval
from cubic.core.store import TrialStore
from experiments import _search_tabular as tab
from experiments._search_prior_dev import campaign_curve, judged, runs_or_never
from experiments.search_benchmark import SIM_SPACE_PATH, TARGET
from search.space import load_space

WORKLOADS = ("dmt-small", "dlrm-small", "wukong-small")
INSTANCES = tuple(range(12, 24))
BUDGET, BATCH = 60, 4
PREFIX = "held-out:"


def run_held_out(seeds: list[int], workloads=WORKLOADS, instances=INSTANCES, log=print) -> dict:
    """The section: per workload and hard instance, cubic's and TPE's runs to 98% per seed (budget + 1 where
    a seed never got there), the prior's order, and cubic's runs on configurations without a prior
    throughput after its first round."""
    space = load_space(SIM_SPACE_PATH)
    store = TrialStore("sqlite:///:memory:")
    feat = cubic_featurizer(space)
    rows, t0 = [], time.time()
    for w in workloads:
        for i in instances:
            inst = judged(i, space, store, feat, w, TARGET)
            if not inst["hard"]:
                continue
            spec, table, context, pick, no_prior, target = (inst[k] for k in ("spec", "table", "context", "pick",
                                                                              "no_prior", "target"))
            row = {"workload": w, "instance": i, "cluster": spec, "prior_fraction": pick["fraction_of_best"],
                   "prior_order": pick["runs_in_prior_order_to_target"], "no_prior_throughput": len(no_prior),
                   "runs_without_prior_throughput": []}
            for method, kw in (("cubic", {}), ("tpe", {"strategy": "tpe"})):
                spent = row["runs_without_prior_throughput"] if method == "cubic" else None
                row[method] = runs_or_never([campaign_curve(space, table, context, feat, kw, s, BUDGET, BATCH, target,
                                                            no_prior=no_prior, spent=spent) for s in seeds],
                                            target, BUDGET)
            seen: list[dict] = []  # cubic as Optuna users run it: CubicSampler in study.optimize
            row["cubic-optuna"] = runs_or_never([tab.optuna_cubic_curve(space, table, s, BUDGET, BATCH, feat, context,
                                                                        target, seen=seen) for s in seeds],
                                                target, BUDGET)
            row["cubic-optuna_runs_without_prior_throughput"] = sum(space.key(p) in no_prior for p in seen)
            rows.append(row)
            log(f"  held-out {w} #{i} {spec}: cubic {np.median(row['cubic']):g}, CubicSampler "
                f"{np.median(row['cubic-optuna']):g}, tpe {np.median(row['tpe']):g}, the prior's order "
                f"{row['prior_order']} (median runs to {TARGET:.0%})")
    return {"kind": "SIMULATED (the development suite's generator; nothing trained)",
            "what": __doc__.split("\n\n")[1].replace("\n", " "),
            "workloads": list(workloads), "instances": list(instances), "seeds": list(seeds), "budget": BUDGET,
            "batch_size": BATCH, "never_reached_counts": BUDGET + 1, "rows": rows, "search_wall_s": time.time() - t0}


def held_out_targets(sec: dict) -> dict:
    """The section's targets from its stored rows."""
    rows = sec["rows"]
    if not rows:
        return {}
    cubic = [x for r in rows for x in r["cubic"]]
    tpe = [x for r in rows for x in r["tpe"]]
    spent = sum(sum(r["runs_without_prior_throughput"]) for r in rows)
    n = f"{len(rows)} hard instances x {len(sec['seeds'])} seeds"
    diff = [float(np.mean(r["cubic"])) - r["prior_order"] for r in rows]
    mean, lo, hi = mean_interval(diff)
    ahead = sum(d < 0 for d in diff)
    behind = sum(d > 0 for d in diff)
    resolved = {"measured": mean, "target": 0.0, "met": bool(hi < 0), "ci95": [lo, hi],
                "cubic_mean": float(np.mean(cubic)),
                "prior_order_mean": float(np.mean([r["prior_order"] for r in rows])),
                "instances_ahead": ahead, "instances_behind": behind}
    if not resolved["met"]:
        resolved["reason"] = (
            f"cubic {resolved['cubic_mean']:.1f} runs against the prior's order {resolved['prior_order_mean']:.1f} "
            f"(mean over {n}); per instance {mean:+.1f} runs [{lo:+.1f}, {hi:+.1f}]: ahead on {ahead}, behind on "
            f"{behind}: the search is not shown to add to the step model it starts from on these clusters")
    out = {  # (names without counts: a later look with more instances compares by name)
        f"{PREFIX} cubic's runs after its first round on configurations the prior gives no throughput = 0":
            {"measured": spent, "target": 0, "met": spent == 0, "over": n},
        f"{PREFIX} cubic mean runs to 98% <= a third of TPE's (TPE without the prior)":
            {"measured": float(np.mean(cubic)), "target": float(np.mean(tpe)) / 3.0,
             "met": bool(np.mean(cubic) <= np.mean(tpe) / 3.0), "tpe": float(np.mean(tpe)),
             "tpe_short_of_98pct": sum(x > sec["budget"] for x in tpe), "over": n},
        f"{PREFIX} cubic needs fewer runs to 98% than walking the prior's order (95% interval of the per-instance "
        "difference below 0)": {**resolved, "over": n},
    }
    if all("cubic-optuna" in r for r in rows):  # (a section stored before the sampler was run has none)
        sampler = float(np.mean([x for r in rows for x in r["cubic-optuna"]]))
        out[f"{PREFIX} CubicSampler via study.optimize matches cubic's campaign (mean runs to 98% within "
            f"max({tab.MATCH_RUNS:g}, {tab.MATCH_SHARE:.0%}))"] = {"measured": sampler, "target": float(np.mean(cubic)),
                               "met": tab.matches(float(np.mean(cubic)), sampler), "over": n,
                               "sampler_runs_without_prior_throughput":
                                   sum(r["cubic-optuna_runs_without_prior_throughput"] for r in rows)}
    return out


def plot_held_out(sec: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sec["rows"]
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = np.arange(len(rows))
    ax.scatter(xs, [r["prior_order"] for r in rows], marker="_", s=200, color="k", label="the prior's order")
    ax.scatter(xs, [np.median(r["cubic"]) for r in rows], color="tab:blue", label="cubic (median of seeds)")
    ax.scatter(xs, [np.median(r["tpe"]) for r in rows], color="tab:orange", marker="x", label="TPE (median of seeds)")
    ax.set_xticks(xs, [f"{r['workload'].split('-')[0]} #{r['instance']}" for r in rows], rotation=70, fontsize=7)
    ax.set_ylabel(f"runs to {TARGET:.0%} of the best (>{sec['budget']}: never)")
    ax.set_title(f"held-out simulated clusters (SIMULATED): {len(rows)} hard instances x {len(sec['seeds'])} seeds",
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
