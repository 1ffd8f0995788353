"""The search benchmark's parts merged into its JSON by their own invocations (``--tune``,
``--early-stop``, ``--held-out``; ``--public`` merges through experiments/_search_public.py): run the part, store it
with its own context, recompute its targets, redraw its figure. Called by
experiments/search_benchmark.py."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from experiments.common import png_path, run_context, write_result


def run_merged(args, log=print) -> None:
    """``--tune`` / ``--early-stop`` / ``--held-out``: run the part, merge it (its own context and targets) into the
    stored JSON, redraw its figure."""
    from experiments._search_public import EARLY, plot_public
    from experiments.common import RESULTS, stored_result

    name = "search_benchmark"
    path = RESULTS / f"{name}.json"
    stored = stored_result(name, {"spaces": {}, "targets": {}})
    if args.rescore:
        return _rescore(stored, args.rescore, path, log)
    started, ctx = time.time(), run_context("mixed")  # (the part's start time and load: before it runs)
    if args.held_out:
        from experiments._search_held_out import run_held_out

        key, doc = "held_out", run_held_out(list(range(args.seeds)), log=log)
    elif args.tune:
        from experiments._search_tune import run_tune

        if not (stored.get("public") or {}).get("problems"):
            print(f"search_benchmark: --tune is set against a stored --public run in {path}: run --public first",
                  file=sys.stderr)
            raise SystemExit(2)
        if args.tune_early_seeds:  # the second look at 25 evaluations, into the stored tune section
            if not stored.get("tune"):
                print(f"search_benchmark: --tune-early-seeds needs a stored --tune run in {path}: run --tune first",
                      file=sys.stderr)
                raise SystemExit(2)
            look = run_tune(args.public_problems, list(range(args.tune_early_seeds)), EARLY, log=log)
            doc = {**stored["tune"], "early_25": {**look, "context": ctx}}
            doc.pop("stale_sections_note", None)
            key = "tune"
        else:
            key, doc = "tune", run_tune(args.public_problems, list(range(args.seeds)), args.public_budget, log=log)
    else:
        from experiments._search_early_stop import run_early_stop, section_key

        curves, warmup = args.early_stop_curves, args.early_stop_warmup
        if warmup and curves == "ordered":  # (no section for it: the ordered script's pruners stop no winner)
            print("search_benchmark: --early-stop-warmup goes with --early-stop-curves crossing", file=sys.stderr)
            raise SystemExit(2)
        key = section_key(curves, warmup)
        doc = run_early_stop(list(range(args.seeds)), args.early_stop_budget, args.epoch_s, log=log, curves=curves,
                             warmup=warmup)
    if not args.tune_early_seeds:  # the look keeps the section's own context and wall time
        doc = {**doc, "context": ctx, "wall_s": time.time() - started}
    stored[key] = doc
    replace_targets(stored, key)
    write_result(name, stored, run=ctx)
    if key == "tune":
        plot_public(stored, png_path(name + "_public"))
    elif key == "held_out":
        from experiments._search_held_out import plot_held_out

        plot_held_out(stored[key], png_path(name + "_held_out"))
    else:
        plot_early_stop(stored[key], _early_stop_png(key))
    log(f"wrote {path}")
    for what, t in stored["targets"].items():
        if what.startswith(MERGED[key]):  # measured None: nothing to measure (a seed set that never got there)
            print(f"target {'MET' if t['met'] else 'MISSED'}: {what}: measured "
                  + ("none" if t["measured"] is None else f"{t['measured']:.3g}"))


def _rescore(stored: dict, why: str, path: Path, log=print) -> None:
    """``--rescore WHY``: each stored early-stopping section's regrets recomputed from its runs
    (experiments/_search_early_stop.rescore), its targets and figure redone; nothing re-run."""
    from experiments._search_early_stop import rescore
    from experiments.common import code_version, write_result

    keys = [k for k in MERGED if k.startswith("early_stopping") and stored.get(k)]
    if not keys:
        print(f"search_benchmark: --rescore needs a stored --early-stop section in {path}", file=sys.stderr)
        raise SystemExit(2)
    for key in keys:
        stored[key] = rescore(stored[key], code_version(), why)
        replace_targets(stored, key)
        plot_early_stop(stored[key], _early_stop_png(key))
        log(f"rescored {key}")
    write_result("search_benchmark", stored)
    log(f"wrote {path}")


def replace_targets(stored: dict, key: str) -> None:
    """A merged section's targets, recomputed from its figures, in place of the ones it had."""
    stored["targets"] = {k: v for k, v in stored.get("targets", {}).items() if not k.startswith(MERGED[key])}
    stored["targets"].update(merged_targets(stored, key))


def _early_stop_png(key: str) -> Path:
    return png_path("search_benchmark" + key.replace("early_stopping", "_early_stop"))


# section -> its targets' prefix; early stopping: on the script whose curves keep their order, on the
# one whose curves cross (the second look), and that with a later --prune-warmup
MERGED = {"public": "public:", "tune": "tune:", "early_stopping": "early stop:",
          "early_stopping_crossing": "early stop, crossing curves:",
          "early_stopping_crossing_warmup": "early stop, crossing curves, --prune-warmup", "held_out": "held-out:"}


def merged_targets(stored: dict, key: str) -> dict:
    """A merged section's targets, from its stored figures: the one rule for ``--public``, ``--tune``,
    ``--early-stop``, ``--held-out`` and ``--retarget``. None for a public part that has not run all four methods on
    every problem (a comparison against arms not yet run), nor for a tune part without it."""
    pub = stored.get("public") or {}
    complete = bool(pub.get("problems")) and all(len(p["methods"]) == 4 for p in pub["problems"].values())
    if key == "public":
        if not complete:
            return {}
        from experiments._search_public import public_targets

        return public_targets(pub["problems"], pub["budget"], pub.get("overhead_200"), pub.get("early_25"))
    if key == "tune":
        if not (stored.get("tune") and pub.get("problems")):
            return {}
        from experiments._search_tune import tune_targets

        return tune_targets(stored["tune"], pub["problems"], pub.get("early_25"))
    if key == "held_out":
        from experiments._search_held_out import held_out_targets

        return held_out_targets(stored[key])
    from experiments._search_early_stop import early_stop_targets

    return early_stop_targets(stored[key])


def plot_early_stop(es: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments._search_early_stop import ARMS

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    colours = dict(zip(ARMS, ("tab:gray", "tab:blue", "tab:orange")))
    for c in es["campaigns"]:  # quality so far against the jobs' wall time spent: where each arm gets
        spent = np.cumsum(c["jobs_wall_s_per_run"])
        reg = [np.nan if r is None else max(r, 1e-4) for r in c["regret_so_far"]]
        a.step(spent, reg, where="post", color=colours[c["arm"]], alpha=0.7,
               label=f"--prune {c['arm']}" if c["seed"] == es["seeds"][0] else None)
    a.set_yscale("log")
    a.set_xlabel("jobs' wall time spent, s (MEASURED)")
    a.set_ylabel("best relative regret so far (floor 1e-4)")
    a.legend(fontsize=7)
    for i, arm in enumerate(ARMS[1:]):
        per = es["arms"][arm]["equal_quality"]["jobs_wall_saved_per_seed"]
        b.scatter([i] * len(per), [-1.0 if x is None else x for x in per], color=colours[arm])
    b.axhline(0.0, color="k", lw=0.5)
    b.set_xticks(range(len(ARMS) - 1), [f"--prune {arm}" for arm in ARMS[1:]])
    b.set_ylabel("jobs' wall time saved at equal final quality\n(per seed; -1: never reached)", fontsize=8)
    warmup = f", --prune-warmup {es['prune_warmup']}" if es.get("prune_warmup") else ""
    fig.suptitle(f"early stopping: {es['budget']} runs unpruned, {es['pruned_budget']} pruned, {len(es['seeds'])} seeds "
                 f"(user script, {es['epochs']} epochs of {es['epoch_s']} s, curves "
                 f"{es.get('script_curves', 'ordered')}{warmup})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
