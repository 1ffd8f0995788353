"""search_benchmark's hard section (``--hard``): a finite real space measured once per pass and every
search replayed against the table; each fresh table is a look, kept with its machine, and the current
code's searches are replayed on every earlier look's stored table. The pure logic on a table is
:mod:`experiments._search_tabular`; this room measures, replays and writes the section."""

from __future__ import annotations

import time

from cubic.codesign.prior import cubic_featurizer
from cubic.core.workloads import DEFAULT_WORKLOADS
from experiments import _search_tabular as tab
from experiments._search_tables import log, measure_table
from experiments._search_tabular import hard_targets
from experiments.common import png_path, retarget_stamp, run_context
from experiments.search_benchmark import HOLDOUT_RUNS, METHODS, TARGET, holdout_tau, plot, run_method
from search.space import Space, load_space


def run_hard(args) -> None:
    """The hard real space: measured table (every configuration, ``passes`` passes, fastest kept),
    then cubic / TPE / random / cubic-noprior campaigns and CubicSampler through study.optimize
    replayed against it, the prior's first pick, the held-out tau and the test-retest tau."""
    from cubic.core.store import TrialStore
    from experiments.common import stored_result, write_result

    passes = args.passes if args.passes != 5 else 2  # 5 is the old space's default; 2 keeps this one <= ~20 min
    seeds = list(range(args.seeds))
    wl = DEFAULT_WORKLOADS[args.hard_workload]
    space, runner, context, section = _hard_setup(args, wl)
    n = len(space.enumerate())
    store = TrialStore(f"sqlite:///{args.hard_store}")
    log(f"hard space {space.name}: {n} configs x {passes} passes x {args.steps} steps ({context['runner']})")
    t0, ctx_measure = time.time(), run_context("mixed")  # (start time and load: before the measurement)
    table = measure_table(space, wl, runner, store, args.steps, args.warmup, passes=passes)
    measure_wall = time.time() - t0
    if args.measure_only:
        return
    feat = cubic_featurizer(space)
    col = feat.prior_columns[space.primary.metric]
    pick = tab.prior_first_pick(space, table, lambda p: float(feat(p, context)[col]), TARGET)
    log(f"  prior's first pick {pick['point']}: {pick['fraction_of_best']:.3f} of the best "
        f"(the measured best is the prior's #{pick['prior_rank_of_measured_best']})")
    budget, k = n, 2 if n <= 30 else 4
    r = tab.compare_on_table(space, table, _hard_methods(space, table, feat, context, budget, k), seeds, budget,
                             TARGET, log=log)
    r["kind"] = "measured (replayed from a table of real runs: tabular benchmark)"
    r["batch_size"] = k
    r["prior_first_pick"] = pick
    r["holdout_tau"] = holdout_tau(space, table, feat, context, n_train=min(HOLDOUT_RUNS, n - 5), seeds=seeds)
    retest = next(iter(table.values())).extra.get("retest_tau")
    prov = next(iter(table.values())).extra.get("provenance") or {}
    r["measurement"] = {
        "label": "MEASURED", "runner": (f"DistributedRunner: {args.hard_world_size} processes (gloo), 1 intra-op "
                                        "thread each" if args.hard_world_size > 1 else
                                        "LocalRunner (child process), device cpu, 1 intra-op thread"),
        "steps": args.steps, "warmup": args.warmup, "passes": passes, "store": args.hard_store,
        # a table served from the store took no measuring: its runs' own span is in the provenance
        "wall_s": measure_wall if prov.get("served_from_store", 0) < n * passes else None,
        "retest_tau_between_passes": retest, "context": ctx_measure,
        # when and on which code the runs were made (a table served from the store is older than this run)
        "provenance": prov or None,
        "table": {space.key(p): {"point": p, "ok": table[space.key(p)].ok,
                                 "failure_kind": table[space.key(p)].failure_kind,
                                 "metrics": table[space.key(p)].metrics} for p in space.enumerate()},
        "note": ("every configuration run once per pass (fastest successful pass kept, the store records machine "
                 "and code version per trial); every method x seed replays the table, a 'real run' is a look-up")}
    # a restricted grid is a test of the script, not the benchmark: it goes to the quick JSON
    name = "search_benchmark_quick" if args.hard_batch_sizes else "search_benchmark"
    r["grid"] = {"batch_sizes": args.hard_batch_sizes or "all of the space's",
                 "note": "restricted grid: a test of the script, not the benchmark" if args.hard_batch_sizes else
                 "the full grid of the space (no shape knobs)"}
    stored = stored_result(name, {"spaces": {}})
    prev = (stored.get("spaces") or {}).get(section)
    if prev:  # every earlier look's headline stays beside this one, oldest first (a table served again adds none)
        r["previous_looks"] = tab.previous_looks(prev, fresh=_runs_of(prev) != _runs_of(r))
        for look in r["previous_looks"]:  # ... and this code's searches replayed on each table still stored
            _replay_look(look, space, feat, context, seeds, budget, k)
    stored.setdefault("spaces", {})[section] = r
    # this section's targets replace its own (another hard section's stay)
    old = {key: v for key, v in (stored.get("targets") or {}).items() if not key.startswith(f"{section}: ")}
    stored["targets"] = {**old, **hard_targets(section, r, TARGET)}
    path = write_result(name, stored, run=ctx_measure)  # the convention's check; earlier looks kept
    plot(stored, png_path(name))
    log(f"wrote {path}")
    for what, t in stored["targets"].items():
        if what.startswith(f"{section}: "):
            print(f"target {'MET' if t['met'] else 'MISSED'}: {what}: measured {t['measured']:.3g}")


def _hard_methods(space, table, feat, context, budget: int, k: int) -> dict:
    """The hard section's methods on a table, each ``seed -> best_so_far``: the campaigns of METHODS and
    CubicSampler through study.optimize."""
    target = TARGET * tab.best_known(space, table)
    methods = {m: (lambda seed, m=m: run_method(space, table, m, seed, budget, k, feat, context, 128,
                                                target=target)[0].best_so_far) for m in METHODS}
    methods["cubic-optuna"] = lambda seed: tab.optuna_cubic_curve(space, table, seed, budget, k, feat, context, target)
    return methods


def _replay_look(look: dict, space, feat, context, seeds, budget: int, k: int) -> None:
    """An earlier look's table searched again on this code (its runs as measured then): ``replayed``,
    beside the medians that look's own code measured; a look stored without its table says so."""
    if not look.get("table"):
        look["replayed"] = {"note": "not replayed: this look's summary was stored without its table"}
        return
    table = tab.table_of(space, look["table"])
    col = feat.prior_columns[space.primary.metric]
    rr = tab.compare_on_table(space, table, _hard_methods(space, table, feat, context, budget, k), seeds, budget,
                              TARGET)
    look["replayed"] = {**retarget_stamp(), "label": "MEASURED table, searched again on this code",
                        "median_runs_to_target": {m: v["median_runs_to_target"] for m, v in rr["methods"].items()},
                        "prior_first_pick": tab.prior_first_pick(space, table, lambda p: float(feat(p, context)[col]),
                                                                 TARGET)}
    log(f"  earlier look ({look.get('machine')}) replayed: {look['replayed']['median_runs_to_target']}")


def _runs_of(section: dict) -> tuple:
    """Which runs a hard section's table rests on (served again from the store: the same runs)."""
    p = (section.get("measurement") or {}).get("provenance") or {}
    return p.get("runs"), p.get("first_run_at"), p.get("last_run_at")


def _hard_setup(args, wl):
    """The hard section's space, runner, run context and name: one process (the default space), or
    ``--hard-world-size`` W gloo processes (the distributed default space: planner and dense knobs)."""
    from cubic.cli.campaign import DEFAULT_SPACES

    W = args.hard_world_size
    if W > 1:
        from cubic.runners.distributed import DistributedRunner

        space = load_space(DEFAULT_SPACES["distributed"]).for_workload(wl, shape=False)
        runner = DistributedRunner(world_size=W, timeout_s=args.hard_timeout, verify=False, threads=1)
        run = {"kind": "distributed", "device": "cpu", "threads": 1, "world_size": W}
    else:
        from cubic.runners.local import LocalRunner

        space = load_space().for_workload(wl, shape=False)
        runner = LocalRunner(timeout_s=args.hard_timeout, device="cpu", threads=1, eval_every=args.steps + args.warmup)
        run = {"kind": "local", "device": "cpu", "threads": 1}
    if args.hard_batch_sizes:
        doc = space.to_json()
        for prm in doc["parameters"]:
            if prm["name"] == "batch_size":
                prm["choices"] = list(args.hard_batch_sizes)
        space = Space.model_validate(doc)
    section = f"hard:{wl.name}" + (f" x{W} processes" if W > 1 else "")
    return space, runner, {"workload": wl.name, "runner": run}, section


def keep_hard(results: dict, name: str) -> None:
    """The hard space is measured by its own invocation (``--hard``, its context in its section): a
    full run keeps the stored one, as it keeps the merged sections, so a re-run does not drop its targets."""
    from experiments.common import stored_result

    stored = stored_result(name, {"spaces": {}}).get("spaces") or {}
    results["spaces"].update({k: v for k, v in stored.items() if k.startswith("hard:")})
