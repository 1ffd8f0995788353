"""A search space's table for the search benchmark (experiments/search_benchmark.py): every point
measured (or simulated) once per pass, or pooled over repeats, served from the trial store when there,
and where the table's runs came from."""

from __future__ import annotations

import math
import time
from collections import Counter

import numpy as np

from cubic.codesign.evaluate import RunnerEvaluate
from cubic.core.config import Config
from cubic.core.result import Result
from search.space import Space


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def measure_pooled(space: Space, workload, runner, store, steps: int, warmup: int, repeats: int
                   ) -> dict[str, Result]:
    """Every point of a discrete space as cubic's own campaigns see it: ``repeats`` repeats per
    configuration, each a fresh child process, pooled by the store (cubic.core.stats: median of the
    uncontended repeats, 95% interval); repeats already in ``store`` are served, not run again."""
    t0 = time.time()
    ev = RunnerEvaluate(workload, runner, space, steps=steps, warmup=warmup, store=store, repeats=repeats)
    table = {}
    for j, p in enumerate(space.enumerate()):
        e = ev(p)
        table[space.key(p)] = e
        val = e.metrics.get("examples_per_s", float("nan")) if e.ok else e.failure_kind
        log(f"  {workload.name} {j + 1}: {p} -> {val}")
    log(f"  {workload.name}: {len(table)} configs x {repeats} pooled repeats in {time.time() - t0:.0f}s "
        f"({ev.served} served from the store)")
    return table


def provenance(runs: dict[str, list[Result]], store) -> dict:
    """When, on which code, the table's runs were made: a table served from the store mixes runs of
    earlier invocations with fresh ones, and this run's own context names only the fresh ones' time."""
    ids = {i for evs in runs.values() for e in evs
           for i in (e.extra.get("trial_ids") or [e.extra.get("trial_id")]) if i is not None}
    trials = [t for t in map(store.get_trial, sorted(ids)) if t is not None]
    if not trials:
        return {}
    when = sorted(t.created_at for t in trials)
    return {"runs": len(trials), "first_run_at": when[0].isoformat(timespec="seconds"),
            "last_run_at": when[-1].isoformat(timespec="seconds"),
            "code_versions": dict(Counter(t.code_version for t in trials)),
            "served_from_store": sum(bool(e.extra.get("served_from_store")) for evs in runs.values() for e in evs)}


def measure_table(space: Space, workload, runner, store, steps: int, warmup: int,
                  passes: int = 1) -> dict[str, Result]:
    """Every point of a discrete space, run ``passes`` times (served from the store when cached).

    Several passes sweep the whole space again each time (pass i uses data/init seed i, which makes it
    a distinct trial in the store), so that a burst of load on this shared machine hits different
    configurations in different passes; each configuration keeps its fastest successful pass
    (contention only ever slows a run down) and the median NE of its passes."""
    t0 = time.time()
    pts = space.enumerate()
    runs: dict[str, list[Result]] = {space.key(p): [] for p in pts}
    served = 0
    for i in range(passes):
        ev = RunnerEvaluate(workload, runner, space, steps=steps, warmup=warmup, store=store,
                            base_config=Config(seed=i))
        for j, p in enumerate(pts):
            e = ev(p)
            runs[space.key(p)].append(e)
            tag = "cached" if e.extra.get("served_from_store") else "ran"
            val = e.metrics.get("examples_per_s", float("nan")) if e.ok else e.failure_kind
            log(f"  {workload.name} pass {i + 1}/{passes} {j + 1}/{len(pts)} {tag}: {p} -> {val}")
        served += ev.served
    table = {}
    for key, evs in runs.items():
        ok = [e for e in evs if e.ok]
        if not ok:
            table[key] = evs[0]
            continue
        best = max(ok, key=lambda e: e.metrics.get(space.primary.metric, -math.inf))
        m = dict(best.metrics)
        if "ne_end" in m:
            m["ne_end"] = float(np.median([e.metrics["ne_end"] for e in ok if "ne_end" in e.metrics]))
        m["passes_ok"] = float(len(ok))
        vals = sorted((e.metrics[space.primary.metric] for e in ok), reverse=True)
        m["pass_spread"] = vals[0] / vals[-1]  # fastest / slowest pass
        m["top2_spread"] = vals[0] / vals[1] if len(vals) > 1 else 1.0  # the repeatability of the kept value
        table[key] = best.model_copy(update={"metrics": m, "extra": dict(best.extra)})
    log(f"  {workload.name}: {len(pts)} configs x {passes} passes in {time.time() - t0:.0f}s ({served} from the store)")
    record = provenance(runs, store)
    for e in table.values():
        e.extra["provenance"] = record
    if passes > 1:
        # test-retest: how well one pass ranks the configurations the way another pass does. No model
        # can rank held-out configurations much better than the measurement repeats itself.
        from cost_models.proxy import kendall_tau

        both = [[e.metrics[space.primary.metric] for e in evs] for evs in runs.values()
                if len(evs) == passes and all(e.ok for e in evs)]
        taus = {f"{i + 1}v{j + 1}": kendall_tau([b[i] for b in both], [b[j] for b in both])
                for i in range(passes) for j in range(i + 1, passes)}
        for e in table.values():
            e.extra["retest_tau"] = taus
        log(f"  test-retest Kendall tau between passes: {taus}")
    return table
