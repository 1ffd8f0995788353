"""Real runs needed to reach 98% of the best known throughput: cubic's loop vs direct Optuna TPE
vs random search, several seeds, side by side, on two spaces:

1. **real CPU space** (MEASURED, replayed): the default space of the embedded CPU workload(s).
   Every configuration of the space is measured once with cubic's LocalRunner (short runs, one
   intra-op thread so that the shared machine's noise hurts less), cached in a trial store
   (``.cubic/search_benchmark.db``; a re-run of this script re-uses it), and each method x seed
   then replays against those measurements: a method's "real run" is a look-up of a measured
   result. This is what makes 5 seeds x 3 methods affordable on 2 shared cores; the JSON says so.
2. **simulated cluster space** (SIMULATED): wukong-large on a simulated 64-GPU H100 cluster
   (cubic.runners.sim) over the default simulated space (cubic/data/space-sim-default.yaml: batch
   size, sharding planner and 2D group size, dense dtype, FP8 policy and recipe). Every
   configuration is simulated once (exhaustively: that defines "best known").
3. **simulated space with a binding memory limit** (SIMULATED): the same table, with the memory
   constraint lowered to the 40th percentile of the configurations' peak memory, so that most
   configurations are infeasible; the target is that at most 20% of cubic's runs are.

4. **hard real space** (MEASURED, tabular; ``--hard``): wukong-small over batch size, embedding
   kernel, dense dtype, FP8 policy and recipe (60 configurations), where the step-model prior's first
   pick is checked against the measured best (``prior_first_pick``; the space counts as hard only
   below 98%). Every configuration is run ``--passes`` times (default 2: the test-retest tau), then
   cubic, TPE, random, cubic-noprior and CubicSampler through ``study.optimize`` replay the table
   (median runs to 98% over seeds). Logic: experiments/_search_tabular.py. A configuration slower
   than ``--hard-timeout`` is a timeout failure in the table (data, as in a campaign).
   ``--hard-world-size W``: the same on W local gloo processes (DistributedRunner) over the
   distributed default space (cubic/data/space-sharding-cpu.yaml: batch, sharding planner, dense
   dtype, FP8 policy), whose prior is the step model with the gloo calibration's links: the
   section ``hard:<workload> xW processes``.
5. **public problems** (MEASURED; ``--public``): regret at 25/50/100 evaluations through Optuna's
   ``study.optimize`` (CubicSampler, TPE, GPSampler, random): experiments/_search_public.py.
6. **Ray Tune** (MEASURED; ``--tune``): the same problems through ``Tuner.fit`` with CubicSearcher,
   two trials at a time, against (5)'s CubicSampler and TPE: experiments/_search_tune.py.
7. **early stopping** (MEASURED; ``--early-stop``): real ``cubic campaign run --objective`` campaigns
   over a user script with intermediate lines, ``--prune none|median|halving``: the jobs' wall time
   saved and the final quality it costs: experiments/_search_early_stop.py. The second look:
   ``--early-stop-curves crossing`` (the same final losses on paths that cross, which the pruners and
   the credit of stopped runs were not tuned on), and with ``--early-stop-warmup STEP``; each its own
   section. ``--rescore WHY`` recomputes their regrets from their stored runs when the problem's
   optimum or random median changes and the script's losses do not (the section says so).
   (5)-(7) are merged into the JSON by their own invocations, each with its own context; a full run
   keeps them.

``targets`` in the JSON: each target, what it was measured as, and whether it is met. Today's
figures (best-of-5 passes, 5 seeds) are the bar: no figure may be worse.

Also: the proxy's Kendall tau on held-out configurations after 40 runs (all configurations not
in the training set are held out).

    .venv/bin/python experiments/search_benchmark.py            # full
    .venv/bin/python experiments/search_benchmark.py --quick    # smoke run: 2 seeds, small budgets,
                                                                # simulated spaces only (minutes)
    .venv/bin/python experiments/search_benchmark.py --measure-only   # fill the measured table only
    .venv/bin/python experiments/search_benchmark.py --replay-real    # the real table from the JSON, re-searched
    .venv/bin/python experiments/search_benchmark.py --hard --steps 6 --warmup 1 --hard-timeout 20
                                                        # the hard space only (~60 runs x 2 passes)
    .venv/bin/python experiments/search_benchmark.py --hard --hard-world-size 2 --steps 16 --warmup 2 \
        --hard-timeout 90 --hard-store .cubic/search_benchmark_hard_look3.db
                                                        # the distributed hard space (96 runs x 2 passes, ~20 min;
                                                        # earlier looks kept and their tables re-searched)
    .venv/bin/python experiments/search_benchmark.py --public   # then --public --public-early-seeds 20
    .venv/bin/python experiments/search_benchmark.py --tune     # after --public; then --tune --tune-early-seeds 20
    .venv/bin/python experiments/search_benchmark.py --early-stop   # then --early-stop-curves crossing [--early-stop-warmup 5]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from cubic.codesign.campaign import Campaign  # noqa: E402
from cubic.codesign.prior import cubic_featurizer  # noqa: E402
from cubic.core.result import Result  # noqa: E402
from cubic.runners.step_model import DEFAULT_PARAMS  # noqa: E402
from cubic.core.workloads import DEFAULT_WORKLOADS  # noqa: E402
from experiments.common import png_path, retarget_stamp, run_context, write_result  # noqa: E402
from experiments._search_tables import log, measure_pooled, measure_table  # noqa: E402
from experiments._search_merged import MERGED, merged_targets, run_merged  # noqa: E402
from experiments import _search_tabular as tab  # noqa: E402
from experiments._search_tabular import hard_targets  # noqa: E402
from search.space import Space, load_space  # noqa: E402
from search.strategies import Observation, ProxyGuided, objective_value, prior_columns  # noqa: E402

TARGET = 0.98
HOLDOUT_RUNS = 40  # runs the held-out tau's proxies are fitted on (every other configuration is held out)
METHODS = ("cubic", "tpe", "random", "cubic-noprior")  # the last: ablation without the step-model prior
STORE_PATH = ROOT / ".cubic" / "search_benchmark.db"
HARD_STORE_PATH = ROOT / ".cubic" / "search_benchmark_hard.db"

SIM_SPACE_PATH = ROOT / "cubic" / "data" / "space-sim-default.yaml"
MEMORY_QUANTILE = 0.4  # the binding memory limit: this quantile of the configurations' peak memory
MAX_INFEASIBLE_SHARE = 0.2
# the figures this benchmark stood at before (results/search_benchmark.json of d5fed04): no target
# may be worse; mean real runs to 98% of the best known throughput
BASELINE = {"real:dlrm-small": {"cubic": 1.0, "tpe": 13.2}, "sim:wukong-large@h100x64": {"cubic": 5.0, "tpe": 47.8}}


# The simulated cluster that stands in for real runs is NOT the model cubic's prior uses: a real
# cluster departs from its datasheet. Two departures, both hidden from the campaigns:
# 1. efficiencies: GEMMs reach 70% of the GEMM model, HBM 50%, the network 55% of line rate, only 30%
#    of the dense all-reduce hides behind backward, 3 ms fixed cost per step, 20 us per all-to-all peer
#    (datasheet-model defaults: 100%, 65%, 80%, 80%, 0, 1 us);
# 2. unmodelled effects (stragglers, kernel selection, placement): each configuration's throughput is
#    multiplied by exp(0.15 z), z ~ N(0, 1) drawn once per configuration from its key's hash.
# The JSON reports how well the datasheet model alone ranks this "real" cluster (prior_only_tau).
HIDDEN_CLUSTER = DEFAULT_PARAMS.model_copy(update={
    "gemm_eff": 0.7, "hbm_eff": 0.5, "net_eff": 0.55, "overlap": 0.3, "step_overhead_s": 0.003,
    "a2a_peer_overhead_s": 2e-5})
UNMODELLED_SIGMA = 0.15


def with_unmodelled(space: Space, table: dict[str, Result], salt: str = "") -> dict[str, Result]:
    """The table with each successful configuration's throughput scaled by its unmodelled factor."""
    import hashlib

    out = {}
    for key, e in table.items():
        if e.ok:
            h = int(hashlib.sha256((salt + key).encode()).hexdigest()[:12], 16)
            f = math.exp(UNMODELLED_SIGMA * np.random.default_rng(h).standard_normal())
            m = dict(e.metrics)
            for name in ("examples_per_s", "examples_per_s_per_gpu"):
                if name in m:
                    m[name] *= f
            if "step_time_median_ms" in m:
                m["step_time_median_ms"] /= f
            e = e.model_copy(update={"metrics": m, "extra": {**e.extra, "unmodelled_factor": f}})
        out[key] = e
    return out


def run_method(space, table, method, seed, budget, k, featurize, context, n_inner, storage=None, warm=(),
               target=None):
    cubic = method.startswith("cubic")
    strategy = ProxyGuided(n_inner=n_inner, reselect_every=4) if cubic else method  # the campaign's default inner search
    if method == "cubic-noprior":
        featurize = cubic_featurizer(space, prior=False)

    def evaluate(point):
        return table[space.key(point)]

    c = Campaign(space, evaluate, strategy=strategy, budget=budget, batch_size=k, seed=seed,
                 featurize=featurize if cubic else None, context=context,
                 name=f"{method}-{seed}{'-warm' if warm else ''}", storage=storage, warm_start=warm,
                 target=target)  # stopping at the target changes nothing before it, and saves time
    t0 = time.time()
    s = c.run()
    return s, c, time.time() - t0


def holdout_tau(space, table, featurize, context, n_train: int, seeds) -> list[dict]:
    """Proxy fit on n_train random configurations, Kendall tau on all the others (held out)."""
    from cost_models.proxy import Proxy, kendall_tau

    pts = space.enumerate()
    prior_col = prior_columns(space, featurize).get(space.primary.metric)
    rows = []
    for seed in seeds:
        rng = np.random.default_rng(1000 + seed)
        order = rng.permutation(len(pts))
        n = min(n_train, len(pts) - 5)
        tr, te = order[:n], order[n:]

        def xy(idx):
            X, y = [], []
            for i in idx:
                e = table[space.key(pts[i])]
                o = Observation(pts[i], e)
                v = objective_value(space, o)
                if v is None:
                    continue
                f = space.features(pts[i])
                if featurize is not None:
                    f = np.concatenate([f, featurize(pts[i], context)])
                X.append(f)
                y.append(v)
            return np.array(X), np.array(y)

        Xtr, ytr = xy(tr)
        Xte, yte = xy(te)
        p = Proxy(random_state=seed, prior_column=prior_col).fit(Xtr, ytr)
        rows.append({"seed": seed, "n_train": int(len(ytr)), "n_held_out": int(len(yte)),
                     "family": p.selected_, "cv_tau": p.cv_tau_, "held_out_tau": kendall_tau(yte, p.predict(Xte)),
                     # the step model alone on the same held-out configs: what the 40 runs added
                     "prior_only_tau": kendall_tau(yte, Xte[:, prior_col]) if prior_col is not None else None})
        log(f"  holdout tau seed {seed}: {rows[-1]['held_out_tau']:.3f} ({p.selected_}, n_train={len(ytr)}; "
            f"step model alone {rows[-1]['prior_only_tau']})")
    return rows


def compare(space, table, *, seeds, budget, k, featurize, context, n_inner, label):
    best = tab.best_known(space, table)
    target = TARGET * best
    out = {"methods": {}, "best_known": best, "target": target, "space_size": len(table), "budget": budget,
           "batch_size": k}
    for method in METHODS:
        rows = []
        for seed in seeds:
            s, c, wall = run_method(space, table, method, seed, budget, k, featurize, context, n_inner,
                                    target=target)
            n = tab.runs_to_target(s.best_so_far, target)
            rows.append({"seed": seed, "runs_to_target": n, "reached": n is not None,
                         "best": s.best_metrics.get(space.primary.metric) if s.best_metrics else None,
                         "best_so_far": s.best_so_far, "search_wall_s": wall, "proxy": s.proxy})
            log(f"  {label} {method} seed {seed}: runs to {TARGET:.0%} = {n} (budget {budget}), wall {wall:.0f}s")
        # a seed that never reached the target counts as budget + 1 (a lower bound), flagged
        ns = [r["runs_to_target"] if r["reached"] else budget + 1 for r in rows]
        out["methods"][method] = {"per_seed": rows, "mean_runs_to_target": float(np.mean(ns)),
                                  "median_runs_to_target": float(np.median(ns)),
                                  "reached": sum(r["reached"] for r in rows), "seeds": len(rows)}
    cm, tm = out["methods"]["cubic"]["mean_runs_to_target"], out["methods"]["tpe"]["mean_runs_to_target"]
    out["cubic_over_tpe_runs"] = cm / tm
    return out


def memory_bound(space: Space, table: dict[str, Result], *, seeds, budget, featurize, context,
                 n_inner) -> dict:
    """The simulated space with its memory limit lowered to bind (MEMORY_QUANTILE of the configs'
    peak memory): runs to target per method, and the share of each method's runs that were
    infeasible (failed or over the limit) in campaigns that spend the whole budget."""
    mems = sorted(e.metrics["peak_mem_bytes"] for e in table.values() if "peak_mem_bytes" in e.metrics)
    limit = float(mems[int(MEMORY_QUANTILE * (len(mems) - 1))])
    doc = space.to_json()
    doc["name"] = f"{space.name}-memory-bound"
    doc["constraints"] = [{"name": "memory per device (binding)", "metric": "peak_mem_bytes", "max": limit}]
    bound = Space.model_validate(doc)
    r = compare(bound, table, seeds=seeds, budget=budget, k=4, featurize=featurize, context=context,
                n_inner=n_inner, label="sim-mem")
    r["kind"] = "SIMULATED (as the simulated space, with a binding memory limit)"
    r["memory_limit_bytes"] = limit
    cols = featurize.prior_columns
    # the prior's order among the points its memory model expects to fit, as cubic's first round orders them
    r["prior_first_pick"] = tab.prior_first_pick(
        bound, table, lambda p: float(featurize(p, context)[cols[bound.primary.metric]]), TARGET,
        feasible=lambda p: not float(featurize(p, context)[cols["peak_mem_bytes"]]) > math.log(limit))
    r["configs_over_the_limit_or_failed"] = sum(
        1 for e in table.values() if not e.ok or max(c.violation(e.metrics) for c in bound.constraints) > 0) / len(table)
    shares = {}
    for method in ("cubic", "tpe", "random"):
        per = []
        for seed in seeds:
            s, c, _ = run_method(bound, table, method, seed, budget, 4, featurize, context, n_inner)
            obs = c.observations()
            per.append(sum(not o.feasible for o in obs) / max(1, len(obs)))
        shares[method] = {"per_seed": per, "mean": float(np.mean(per))}
        log(f"  sim-mem {method}: infeasible share of runs {np.mean(per):.2f} (budget {budget}, no early stop)")
    r["infeasible_share_of_runs"] = shares
    return r


# a bar set on an earlier version of the problem: why the figure moved (found by bisecting the same
# search on the same seeds over the commits since the bar was set)
REGRESSION_WHY = {
    "sim:wukong-large@h100x64": (
        "the simulated problem changed under this bar, not the search: bisecting the same campaign (Optuna TPE "
        "inside, 5 seeds) from the bar's commit 8a94e4f finds b661984 first (one plan path: the simulator plans "
        "with the registered greedy planner and prices with the device's HBM model), where runs to 98% went "
        "[5, 5, 5, 5, 5] -> [7, 7, 13, 7, 5], and the later merges of issues 22-27 to [36, 41, 13, 17, 11]; this "
        "stop's local inner search gives the same runs as the TPE inner search ([36, 41, 13, 17, 11] both). "),
}


def _pick_why(sp: dict) -> str:
    """Where the step-model prior's first pick landed in a measured table, and whether the table's
    own noise can tell it from the best (the kept pass against the best's slower pass)."""
    pk = sp.get("prior_first_pick")
    if not pk:
        return ""
    n = pk.get("runs_in_prior_order_to_target")
    # what trusting the prior alone costs here: the bar below it is out of reach of a search that adds to the prior
    floor = "" if n is None else (
        f"a search that ran the configurations in the prior's order would reach {TARGET:.0%} of the best at run {n} "
        f"(the best is the prior's #{pk['prior_rank_of_measured_best']} of {sp.get('space_size')}); ")
    m = sp.get("measurement")
    if m is None:  # a simulated table: one value per configuration, no passes to compare
        rows = [r for r in sp.get("holdout_tau", []) if r.get("prior_only_tau") is not None]
        # whether the runs teach the proxy what the model misses (what a bar below the floor asks of it)
        learned = ""
        if rows:
            held, alone = (float(np.mean([r[k] for r in rows])) for k in ("held_out_tau", "prior_only_tau"))
            learned = (
                f"proxies fitted on {min(r['n_train'] for r in rows)}-{max(r['n_train'] for r in rows)} successful "
                f"runs of {HOLDOUT_RUNS} rank the held-out configurations at Kendall tau {held:.3f}, the step model "
                f"alone at {alone:.3f}: " + ("the runs have not taught the proxy the unmodelled effects that would "
                                             "lift the best above the model's order; " if held <= alone else
                                             "the runs improve on the model's order, but not enough to reach the "
                                             "bar; "))
        return floor + learned + f"the prior's first pick measures {pk['fraction_of_best']:.3f} of the best; "
    slow = pk.get("fraction_of_best_slower_pass", 0.0)
    return floor + (
            f"the prior's first pick {pk['point']} measures {pk['fraction_of_best']:.3f} of the best by the kept "
            f"(fastest of {m.get('passes')}) passes and {slow:.2f} against the best's slower pass"
            + (f", so the two are within this table's pass-to-pass noise (median fastest/slowest pass "
               f"{m.get('pass_spread_median', float('nan')):.2f}) and {TARGET:.0%} asks for an order the "
               "measurements do not give; " if slow >= TARGET else ": measurably slower than the best; "))


def targets(results: dict) -> dict:
    """Each target: what it asks, what was measured, met or not."""
    out = {}
    for name, base in BASELINE.items():
        sp = results["spaces"].get(name)
        if sp is None:
            continue  # not run (--quick skips the real space)
        cm, tm = sp["methods"]["cubic"]["mean_runs_to_target"], sp["methods"]["tpe"]["mean_runs_to_target"]
        own_met = cm <= base["cubic"] + 1e-9
        why = (REGRESSION_WHY.get(name) or "") + _pick_why(sp) + (
            f"cubic's mean runs to {TARGET:.0%} over the seeds were {cm:g} against TPE's {tm:g} ({base['tpe']} when "
            "the bar was set); the seeds' spread is in spaces[name].methods")
        out[f"{name}: cubic runs to {TARGET:.0%} <= {base['cubic']} (before)"] = {
            "measured": cm, "target": base["cubic"], "met": own_met, **({} if own_met else {"reason": why})}
        ratio = cm / tm
        ratio_met = ratio <= base["cubic"] / base["tpe"] + 1e-9
        out[f"{name}: cubic/tpe runs <= {base['cubic']}/{base['tpe']} (before)"] = {
            "measured": ratio, "target": base["cubic"] / base["tpe"], "met": ratio_met, "tpe": tm,
            **({} if ratio_met else {"reason": why if not own_met else (
                f"cubic's own bar is met ({cm:g} runs); TPE needed {tm:g} runs this time against {base['tpe']} "
                "when the bar was set, so the ratio moved with TPE's runs, not cubic's")})}
    mb = results["spaces"].get("sim-memory-bound:wukong-large@h100x64")
    if mb is not None:
        share = mb["infeasible_share_of_runs"]["cubic"]["mean"]
        out[f"sim-memory-bound: infeasible share of cubic's runs <= {MAX_INFEASIBLE_SHARE:.0%}"] = {
            "measured": share, "target": MAX_INFEASIBLE_SHARE, "met": share <= MAX_INFEASIBLE_SHARE,
            "tpe": mb["infeasible_share_of_runs"]["tpe"]["mean"],
            "random": mb["infeasible_share_of_runs"]["random"]["mean"],
            **({} if share <= MAX_INFEASIBLE_SHARE else {
                "reason": "the proxy's memory constraint model let through configurations the cluster model "
                          "rejects; per-seed shares in infeasible_share_of_runs"})}
    for name, sp in results["spaces"].items():
        if name.startswith("hard:"):
            out.update(hard_targets(name, sp, TARGET))  # its own targets (the prior's pick, medians, the sampler)
            continue
        t = [row["held_out_tau"] for row in sp.get("holdout_tau", [])]
        if t:
            tau = float(np.mean(t))
            out[f"{name}: proxy Kendall tau after 40 runs >= 0.8"] = {
                "measured": tau, "target": 0.8, "met": tau >= 0.8,
                **({} if tau >= 0.8 else {"reason": f"held-out tau per seed {[round(x, 2) for x in t]}"})}
            if tau < 0.8 and name.startswith("real"):
                out[f"{name}: proxy Kendall tau after 40 runs >= 0.8"]["reason"] = (
                    "the held-out values are themselves measurements at 2 pooled repeats, which rank this space with "
                    "test-retest tau 0.81 on a busy machine and 0.91 on a quiet one (results/measurement_noise.json); "
                    "a model cannot rank held-out configurations much better than their measurement repeats itself")
    for t in out.values():
        t["met"] = bool(t["met"])
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [(n, r) for n, r in results["spaces"].items()]
    fig, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 4.2), squeeze=False)
    for ax, (name, r) in zip(axes[0], parts):
        for method, m in r["methods"].items():
            # a campaign stops at the target: its curve stays flat from there to the budget
            curves = np.array([(row["best_so_far"] + [row["best_so_far"][-1]] * r["budget"])[: r["budget"]]
                               for row in m["per_seed"]], dtype=float) / r["best_known"]
            x = np.arange(1, curves.shape[1] + 1)
            med = np.nanmedian(curves, axis=0)
            ax.plot(x, med, label=f"{method} (mean runs to {TARGET:.0%}: {m['mean_runs_to_target']:.1f})")
            ax.fill_between(x, np.nanmin(curves, axis=0), np.nanmax(curves, axis=0), alpha=0.15)
        ax.axhline(TARGET, color="k", ls="--", lw=0.8)
        n_prior = (r.get("prior_first_pick") or {}).get("runs_in_prior_order_to_target")
        if n_prior is not None:  # what trusting the prior alone costs: the floor a prior-led search is read against
            ax.axvline(n_prior, color="grey", ls=":", lw=1.2,
                       label=f"the prior's order reaches {TARGET:.0%}: run {n_prior}")
        ax.set_ylim(max(0.5, ax.get_ylim()[0]), 1.01)
        ax.set_xlabel("real runs")
        ax.set_ylabel("best feasible throughput / best known")
        import textwrap

        ax.set_title(f"{name}\n" + "\n".join(textwrap.wrap(r["kind"], 70)), fontsize=8)
        ax.legend(fontsize=8)
    fig.suptitle("search_benchmark: median over seeds, band = min..max", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 seeds, small budgets")
    ap.add_argument("--measure-only", action="store_true", help="only fill the measured table")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--replot", action="store_true", help="redraw the PNGs from the JSON, run nothing")
    ap.add_argument("--retarget", action="store_true",
                    help="recompute the targets object from the figures in the JSON (run nothing) and rewrite it")
    ap.add_argument("--real-workloads", nargs="*", default=None,
                    help="real CPU workloads to measure (default dlrm-small; none with --quick); [] skips")
    ap.add_argument("--replay-real", action="store_true",
                    help="replay the real sections' searches on this code from the tables stored in the JSON "
                         "(nothing measured; the runs keep their own provenance)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--passes", type=int, default=5, help="measurements per real configuration (best kept)")
    ap.add_argument("--repeats", type=int, default=0,
                    help="instead of --passes: R pooled repeats per real configuration, as campaigns measure")
    ap.add_argument("--store", default=None, help="trial store of the real table (default .cubic/search_benchmark.db);"
                    " e.g. a measurement_noise pass store, so both benchmarks rest on the same measurements")
    ap.add_argument("--public", action="store_true",
                    help="only the public test problems (regret at 25/50/100 through study.optimize), merged into "
                         "the JSON beside the stored real/simulated sections")
    ap.add_argument("--public-budget", type=int, default=100)
    ap.add_argument("--public-problems", nargs="*", default=["branin", "hartmann6", "mlp-tabular", "levy4"],
                    help="levy4 informed no design choice of the search: its row is a second look")
    ap.add_argument("--public-early-seeds", type=int, default=0,
                    help="with --public: only the second look at 25 evaluations over this many seeds (CubicSampler "
                         "and TPE multivariate), merged into the stored 'public' section and its @25 target")
    ap.add_argument("--tune", action="store_true",
                    help="only the Ray Tune part: CubicSearcher through Tuner.fit on --public-problems (--seeds, "
                         "--public-budget), merged into the JSON beside the stored --public section it is set against")
    ap.add_argument("--tune-early-seeds", type=int, default=0,
                    help="with --tune: only the second look at 25 evaluations over this many seeds (as "
                         "--public-early-seeds for the sampler), merged into the stored 'tune' section")
    ap.add_argument("--early-stop", action="store_true",
                    help="only the early-stopping part: real --objective campaigns over a user script with "
                         "intermediate lines, --prune none/median/halving; merged into the JSON")
    ap.add_argument("--early-stop-budget", type=int, default=24, help="runs per early-stopping campaign")
    ap.add_argument("--epoch-s", type=float, default=0.2, help="seconds per epoch of the early-stopping user script")
    ap.add_argument("--early-stop-curves", choices=("ordered", "crossing"), default="ordered",
                    help="the user script's curves: ordered (early epochs rank as the last does) or crossing (the "
                         "second look: the same final losses on paths that cross); stored in a section of its own")
    ap.add_argument("--early-stop-warmup", type=int, default=None,
                    help="--prune-warmup of the pruned campaigns (with --early-stop-curves crossing)")
    ap.add_argument("--rescore", metavar="WHY", default=None,
                    help="recompute the stored early-stopping sections' regrets from their stored runs against the "
                         "registered problem as it stands (no campaign re-run), WHY kept with them; merged into the JSON")
    ap.add_argument("--held-out", action="store_true",
                    help="run only the held-out simulated clusters (SIMULATED; cubic, TPE and the prior's order on "
                         "instances no design choice used) and merge them into the stored JSON")
    ap.add_argument("--hard", action="store_true",
                    help="only the hard real space (wukong-small, the prior's first pick not the best): measure its "
                         "table (--passes, default here 2) and replay the searches; merged into the JSON")
    ap.add_argument("--hard-workload", default="wukong-small")
    ap.add_argument("--hard-world-size", type=int, default=1,
                    help="W > 1: the hard space measured on W local gloo processes (DistributedRunner), over the "
                         "distributed default space (cubic/data/space-sharding-cpu.yaml: planner and dense knobs)")
    ap.add_argument("--hard-store", default=str(HARD_STORE_PATH))
    ap.add_argument("--hard-batch-sizes", nargs="*", type=int, default=None,
                    help="restrict the hard space's batch sizes (a smaller grid, e.g. to test the script)")
    ap.add_argument("--hard-timeout", type=float, default=60.0,
                    help="per-run timeout (s): a configuration slower than this is a timeout failure in the table")
    return ap.parse_args()


def _replot_or_retarget(args) -> None:
    """``--replot`` / ``--retarget``: run nothing; redraw the PNG from the stored JSON, and with
    ``--retarget`` recompute its targets (the public ones too) from its figures first."""
    name = "search_benchmark_quick" if args.quick else "search_benchmark"
    from experiments.common import RESULTS, stored_result

    if not (RESULTS / f"{name}.json").exists():
        print(f"search_benchmark: {'--retarget' if args.retarget else '--replot'} needs results/{name}.json: "
              "run the benchmark first", file=sys.stderr)
        raise SystemExit(2)
    stored = stored_result(name)
    if args.retarget:  # targets are a function of the stored figures; the run's context stays as it was
        stored["targets"] = targets(stored)
        for key in MERGED:
            if stored.get(key):
                stored["targets"].update(merged_targets(stored, key))
        stored["retargeted"] = retarget_stamp()
        write_result(name, stored)
    plot(stored, png_path(name))
    if (stored.get("public") or {}).get("problems"):
        from experiments._search_public import plot_public

        plot_public(stored, png_path(name + "_public"))


METHOD_NOTE = ("cubic = ProxyGuided: the proxy (ensemble families XGBoost/MLP/GP/ridge picked by "
               "CV Kendall tau) learns the residual of the analytical step model's prediction "
               "(the prior: this CPU from micro-benchmarks, or the cluster's datasheet model), "
               "the first round is the prior's best prediction and its best one-knob alternatives (stop 77; before, "
               "half the prior's best predictions and half random), the residual a GP's below 12 runs, then "
               "a random plus local search over the proxy (SMAC-style), constrained EI with local-penalty batches; "
               "cubic-noprior = the same loop without the prior (ablation); "
               "tpe = Optuna TPESampler directly on runs (multivariate, constant liar); "
               "random = uniform without repeats. A seed that never reaches the target "
               "counts as budget+1 in the means (a lower bound).")


def _real_space(args, wname: str, base: Space, runner, store, seeds, n_inner: int) -> dict | None:
    """Section 1 for one real CPU workload: measure its table (or fill it only, with
    ``--measure-only``: None), then replay the methods and score the proxy on held-out points."""
    wl = DEFAULT_WORKLOADS[wname]
    space = base.for_workload(wl, shape=True)  # the recorded experiment's space: shape knobs included
    stored = _stored_real(wname) if args.replay_real else None
    if stored is not None:
        table = tab.table_of(space, stored["measurement"]["table"])
        log(f"{wname}: replaying the {len(table)} runs stored in the JSON (nothing measured)")
    elif args.repeats:
        table = measure_pooled(space, wl, runner, store, args.steps, args.warmup, args.repeats)
    else:
        log(f"measuring {wname}: {len(space.enumerate())} configs x {args.steps} steps (1 thread)")
        table = measure_table(space, wl, runner, store, args.steps, args.warmup, passes=args.passes)
    if args.measure_only:
        return None
    context = {"workload": wname, "runner": {"kind": "local", "device": "cpu", "threads": 1}}
    feat = cubic_featurizer(space)
    n = len(table)
    r = compare(space, table, seeds=seeds, budget=n, k=2 if n <= 30 else 4, featurize=feat, context=context,
                n_inner=n_inner, label=wname)
    r["kind"] = "measured (replayed from a table of real runs)"
    if stored is not None:  # the runs as measured then; the searches and the proxy's taus on this code
        r["measurement"] = {**stored["measurement"], "replayed": retarget_stamp()}
        return _real_judged(r, space, table, feat, context, seeds, n)
    spreads = [e.metrics.get("pass_spread", 1.0) for e in table.values() if e.ok]
    top2 = [e.metrics.get("top2_spread", 1.0) for e in table.values() if e.ok]
    r["measurement"] = {"runner": "LocalRunner (child process), device cpu, 1 intra-op thread",
                        "steps": args.steps, "warmup": args.warmup, "passes": args.passes,
                        "pooled_repeats": args.repeats or None, "store": str(args.store or STORE_PATH),
                        "pass_spread_median": float(np.median(spreads)) if spreads else None,
                        "pass_spread_max": float(max(spreads)) if spreads else None,
                        "top2_spread_median": float(np.median(top2)) if top2 else None,
                        "retest_tau_between_passes": next(iter(table.values())).extra.get("retest_tau"),
                        # the table's own runs: served ones were made by earlier invocations, maybe on other code
                        "provenance": next(iter(table.values())).extra.get("provenance"),
                        "spread_note": ("pass_spread = fastest/slowest of a config's passes (a pass run "
                                        "while the machine was busy is up to 2-3x slower); top2_spread = "
                                        "fastest/second fastest: how repeatable the kept value is"),
                        "table": {space.key(p): {"point": p, "ok": table[space.key(p)].ok,
                                                 "failure_kind": table[space.key(p)].failure_kind,
                                                 "metrics": table[space.key(p)].metrics}
                                  for p in space.enumerate()},
                        "replay_note": ("each configuration was measured once (with --repeats: its pooled repeats); "
                                        "every method x seed replays those measurements, so a 'real run' is a "
                                        "look-up of a measured result")}
    return _real_judged(r, space, table, feat, context, seeds, n)


def _stored_real(wname: str) -> dict:
    """``--replay-real``: the stored JSON's real section for a workload, which must hold its table."""
    from experiments.common import RESULTS, stored_result

    sec = ((stored_result("search_benchmark") if (RESULTS / "search_benchmark.json").exists() else {})
           .get("spaces", {}).get(f"real:{wname}"))
    if not (sec or {}).get("measurement", {}).get("table"):
        print(f"search_benchmark: --replay-real: results/search_benchmark.json has no stored table for "
              f"real:{wname} (measure it: run without --replay-real)", file=sys.stderr)
        raise SystemExit(2)
    return sec


def _real_judged(r: dict, space: Space, table, feat, context, seeds, n: int) -> dict:
    """The real section's proxy taus on held-out configurations and the prior's first pick."""
    r["holdout_tau"] = holdout_tau(space, table, feat, context, n_train=min(HOLDOUT_RUNS, n - 5), seeds=seeds)
    r["holdout_tau_note"] = (f"proxy trained on {min(40, n - 5)} random configurations of this {n}-point space "
                             "(failed ones included in the 40) and scored on all the others")
    col = feat.prior_columns[space.primary.metric]  # what cubic's first round starts from, as in the hard space
    r["prior_first_pick"] = tab.prior_first_pick(space, table, lambda p: float(feat(p, context)[col]), TARGET)
    return r


def _simulated_space(store, seeds, budget: int, n_inner: int):
    """Section 2: wukong-large on the simulated h100x64 cluster, every configuration simulated
    (that defines the best known); returns the section and what sections 3 and 4 reuse."""
    from cubic.runners.sim import SimulatedRunner

    wl = DEFAULT_WORKLOADS["wukong-large"]
    space = load_space(SIM_SPACE_PATH)
    sim = SimulatedRunner.from_spec("h100x64", params=HIDDEN_CLUSTER)
    log(f"simulating wukong-large on h100x64: {len(space.enumerate())} configs")
    table = with_unmodelled(space, measure_table(space, wl, sim, store, 50, 5))
    context = {"workload": "wukong-large", "runner": {"kind": "simulated", "simulate": "h100x64"}}
    feat = cubic_featurizer(space)
    r = compare(space, table, seeds=seeds, budget=budget, k=4, featurize=feat, context=context, n_inner=n_inner,
                label="sim")
    r["kind"] = ("SIMULATED (cubic.runners.sim step model with hidden efficiencies and unmodelled per-config effects; "
                 "nothing was trained)")
    r["simulated_truth"] = {"hidden_params": {k: getattr(HIDDEN_CLUSTER, k) for k in
                                              ("gemm_eff", "hbm_eff", "net_eff", "overlap", "step_overhead_s",
                                               "a2a_peer_overhead_s")},
                            "unmodelled_sigma": UNMODELLED_SIGMA,
                            "prior": "step model with datasheet parameters (DEFAULT_PARAMS) of h100x64"}
    r["holdout_tau"] = holdout_tau(space, table, feat, context, n_train=HOLDOUT_RUNS, seeds=seeds)
    col = feat.prior_columns[space.primary.metric]
    r["prior_first_pick"] = tab.prior_first_pick(space, table, lambda p: float(feat(p, context)[col]), TARGET)
    feasible = sum(1 for e in table.values() if e.ok)
    r["table_summary"] = {"configs": len(table), "feasible": feasible,
                          "failed": {k: sum(1 for e in table.values() if e.failure_kind == k)
                                     for k in {e.failure_kind for e in table.values() if not e.ok}}}
    return r, space, table, feat, context


def _warm_start(r: dict, space: Space, table, store, seeds, budget: int, feat, context, n_inner: int) -> dict:
    """Section 3: the same search on h100x64, learning first from 40 random runs made on another
    cluster (h100x128, SIMULATED); how many of this campaign's runs does that save?"""
    import optuna

    from cubic.runners.sim import SimulatedRunner

    wl = DEFAULT_WORKLOADS["wukong-large"]
    sim128 = SimulatedRunner.from_spec("h100x128", params=HIDDEN_CLUSTER)
    table128 = with_unmodelled(space, measure_table(space, wl, sim128, store, 50, 5), salt="h100x128")
    warm_rows = []
    for seed in seeds:
        storage = optuna.storages.InMemoryStorage()
        Campaign(space, lambda p: table128[space.key(p)], strategy="random", budget=40, batch_size=8,
                 seed=100 + seed, storage=storage,
                 context={"workload": "wukong-large", "runner": {"kind": "simulated", "simulate": "h100x128"}},
                 name="donor").run()
        s, _, wall = run_method(space, table, "cubic", seed, budget, 4, feat, context, n_inner, storage=storage,
                                warm=["donor"], target=r["target"])
        n = tab.runs_to_target(s.best_so_far, r["target"])
        warm_rows.append({"seed": seed, "runs_to_target": n, "reached": n is not None, "search_wall_s": wall})
        log(f"  sim cubic warm-started seed {seed}: runs to {TARGET:.0%} = {n}")
    ns_warm = [w["runs_to_target"] if w["reached"] else budget + 1 for w in warm_rows]
    cold = r["methods"]["cubic"]["mean_runs_to_target"]
    return {"donor": "40 random runs of the same space on a simulated h100x128 cluster (SIMULATED)",
            "per_seed": warm_rows, "mean_runs_to_target": float(np.mean(ns_warm)),
            "cold_mean_runs_to_target": cold, "runs_saved": cold - float(np.mean(ns_warm))}


def _print_summary(results: dict) -> None:
    for sname, s in results["spaces"].items():
        taus = [t["held_out_tau"] for t in s.get("holdout_tau", [])]
        print(f"{sname} [{s['kind']}]: best known {s['best_known']:,.0f} examples/s; runs to {TARGET:.0%}: "
              + ", ".join(f"{m} {v['mean_runs_to_target']:.1f} (reached {v['reached']}/{v['seeds']})"
                          for m, v in s["methods"].items())
              # (the kept hard space compares medians, in its targets, not this ratio)
              + (f"; cubic/tpe = {s['cubic_over_tpe_runs']:.2f}" if "cubic_over_tpe_runs" in s else "")
              + (f"; held-out tau {np.mean(taus):.3f}" if taus else ""))
    for what, t in results["targets"].items():
        # a target with nothing measured (an early-stop seed set that never reached the quality) says so
        shown = "none" if t["measured"] is None else f"{t['measured']:.3g}"
        print(f"target {'MET' if t['met'] else 'MISSED'}: {what}: measured {shown}")


def main() -> None:
    args = _parse_args()
    if args.public:
        from experiments._search_public import run_public

        return run_public(args, log)
    if args.tune or args.early_stop or args.rescore or args.held_out:
        return run_merged(args, log)
    if args.hard:
        from experiments._search_hard import run_hard

        return run_hard(args)
    if args.replot or args.retarget:
        return _replot_or_retarget(args)
    seeds = list(range(min(2, args.seeds) if args.quick else args.seeds))
    if args.real_workloads is None:
        args.real_workloads = [] if args.quick else ["dlrm-small"]
    n_inner = 64 if args.quick else 128
    ctx_run = run_context("mixed")
    from cubic.runners.local import LocalRunner
    from cubic.core.store import TrialStore

    STORE_PATH.parent.mkdir(exist_ok=True)
    store = TrialStore(f"sqlite:///{args.store or STORE_PATH}")
    # evaluated once, at the end, as measurement_noise runs: so its pass stores can serve this table
    runner = LocalRunner(timeout_s=600.0, device="cpu", threads=1, eval_every=args.steps + args.warmup)
    results = {"context": ctx_run, "target_fraction": TARGET, "seeds": seeds, "spaces": {},
               "method_note": METHOD_NOTE}

    # 1. real CPU space: measured once per config, replayed per method x seed
    base = load_space()
    for wname in args.real_workloads:
        r = _real_space(args, wname, base, runner, store, seeds, n_inner)
        if r is not None:
            results["spaces"][f"real:{wname}"] = r
    if args.measure_only:
        return

    # 2. simulated cluster space, exhaustively simulated; 3. warm-started from another cluster
    budget = 40 if args.quick else 80
    r, space, table, feat, context = _simulated_space(store, seeds, budget, n_inner)
    results["spaces"]["sim:wukong-large@h100x64"] = r
    r["warm_start"] = _warm_start(r, space, table, store, seeds, budget, feat, context, n_inner)

    # 4. the same simulated table under a binding memory limit
    results["spaces"]["sim-memory-bound:wukong-large@h100x64"] = memory_bound(
        space, table, seeds=seeds, budget=budget, featurize=feat, context=context, n_inner=n_inner)

    name = "search_benchmark_quick" if args.quick else "search_benchmark"
    from experiments._search_hard import keep_hard

    keep_hard(results, name)
    results["targets"] = targets(results)
    from experiments._search_public import keep_merged

    keep_merged(results, name, MERGED)
    plot(results, png_path(name))
    path = write_result(name, results)
    log(f"wrote {path} and {png_path(name)}")
    _print_summary(results)


if __name__ == "__main__":
    main()
