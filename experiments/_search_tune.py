"""The search benchmark's Ray Tune part: cubic's search as Tune users run it,
``Tuner(trainable, tune_config=TuneConfig(search_alg=CubicSearcher(...)))``, on the public problems
of the ``--public`` part (experiments/_public_problems.py), the same seeds and budget, two trials
at a time on a local Ray (the machine's two cores). Each trial reports its problem's value once;
the regret after n evaluations is over the first n trials the searcher proposed. Set beside the
``--public`` part's CubicSampler (``study.optimize``: the same algorithm without Tune) and TPE
(multivariate). Also measured: the searcher's own time per trial (``suggest`` plus
``on_trial_complete``, in the driver) and Tune's wall time per trial.
Called by ``experiments/search_benchmark.py --tune`` (merged into the JSON).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from experiments._public_problems import problems, random_median
from experiments._search_public import CHECKPOINTS, EARLY, regrets_at

ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = 2
# "matches cubic's own search": the searcher's mean over problems of the median regret at each
# checkpoint is within this much (relative regret) of CubicSampler's through study.optimize
MATCH_REGRET = 0.05


def distributions(name: str) -> dict:
    """The problem's Optuna distributions, taken from its own suggest (one record of the space)."""
    import optuna

    study = optuna.create_study()
    trial = study.ask()
    problems()[name].suggest(trial)
    return dict(trial.distributions)


def trainable(config: dict, problem: str) -> None:
    from ray import tune

    tune.report({"value": problems()[problem].value(config)})


def _searcher(seed: int, name: str):
    from search.tune import CubicSearcher

    class Timed(CubicSearcher):  # the searcher's own time, in the driver where Tune calls it
        spent = 0.0

        def suggest(self, trial_id):
            t0 = time.perf_counter()
            try:
                return super().suggest(trial_id)
            finally:
                Timed.spent += time.perf_counter() - t0

        def on_trial_complete(self, trial_id, result=None, error=False):
            t0 = time.perf_counter()
            try:
                super().on_trial_complete(trial_id, result, error)
            finally:
                Timed.spent += time.perf_counter() - t0

    Timed.spent = 0.0
    return Timed(distributions(name), metric="value", mode="min", seed=seed, batch_size=4), Timed


def run_tune(names, seeds, budget: int, log=print) -> dict:
    import ray
    from ray import tune

    ray.init(num_cpus=CONCURRENCY, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}})
    out = {}
    try:
        for name in names:
            pb = problems()[name]
            med = random_median(pb)
            rows = []
            for seed in seeds:
                searcher, timed = _searcher(seed, name)
                with tempfile.TemporaryDirectory(prefix="cubic-tune-") as tmp:
                    t0 = time.perf_counter()
                    grid = tune.Tuner(
                        tune.with_resources(tune.with_parameters(trainable, problem=name), {"cpu": 1}),
                        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=budget,
                                                    max_concurrent_trials=CONCURRENCY, metric="value", mode="min",
                                                    reuse_actors=True),
                        run_config=tune.RunConfig(storage_path=tmp, name="cubic", verbose=0)).fit()
                    wall = time.perf_counter() - t0
                values = [t.value for t in sorted(searcher.study.trials, key=lambda t: t.number) if t.value is not None]
                if grid.num_errors or len(values) != budget:
                    raise RuntimeError(f"tune {name} seed {seed}: {grid.num_errors} errors, {len(values)} of "
                                       f"{budget} values")
                reg = regrets_at(values, pb.optimum, med, [n for n in CHECKPOINTS if n <= budget])
                rows.append({"seed": seed, "regret": reg, "searcher_s_per_trial": timed.spent / budget,
                             "tune_wall_s_per_trial": wall / budget})
                log(f"  tune {name} seed {seed}: regret {[round(r, 3) for r in reg.values()]}, searcher "
                    f"{rows[-1]['searcher_s_per_trial']:.3f} s/trial, Tune {rows[-1]['tune_wall_s_per_trial']:.2f} "
                    "s/trial")
            out[name] = {"per_seed": rows,
                         "median_regret": {n: float(np.median([r["regret"][n] for r in rows])) for n in rows[0]["regret"]},
                         "searcher_s_per_trial_mean": float(np.mean([r["searcher_s_per_trial"] for r in rows])),
                         "tune_wall_s_per_trial_mean": float(np.mean([r["tune_wall_s_per_trial"] for r in rows]))}
    finally:
        ray.shutdown()
    return {"kind": "MEASURED on this machine (Tuner.fit on a local Ray, formula problems)",
            "budget": budget, "seeds": list(seeds), "concurrency": CONCURRENCY, "problems": out,
            "note": ("CubicSearcher(batch_size=4) with Tune's default FIFO scheduler (each trial reports once, "
                     "so there is nothing for ASHA to stop here; the early-stopping part measures pruning); "
                     "regret at n = over the first n trials proposed")}


def _mismatch(tune_doc: dict, pub: dict, names: list[str], n: str, mean: float, sampler: float) -> str:
    per = ", ".join(f"{p} {tune_doc['problems'][p]['median_regret'][n]:.3f} vs "
                    f"{pub[p]['methods']['cubic']['median_regret'][n]:.3f}" for p in names)
    return (f"CubicSearcher {mean:.3f} vs CubicSampler {sampler:.3f} ({'ahead' if mean < sampler else 'behind'}; "
            f"per problem, searcher vs sampler: {per}): with two trials at once under Tune the searcher's "
            f"proposals are not the sequential sampler's, and a median over {len(tune_doc['seeds'])} seeds moves "
            "with one seed (see the 20-seed look beside this target, where it was run)")


def _early_look(tune_doc: dict, pub_early: dict | None) -> dict:
    """The second look at 25 evaluations over more seeds, beside the 5-seed target (which keeps its met)."""
    look = tune_doc.get("early_25")
    if not look or not pub_early:
        return {}
    names = [p for p in look["problems"] if p in pub_early["problems"]]
    searcher = float(np.mean([look["problems"][p]["median_regret"][str(EARLY)] for p in names]))
    sampler = float(np.mean([pub_early["problems"][p]["cubic"]["median_regret"] for p in names]))
    return {f"over_{len(look['seeds'])}_seeds": {"searcher": searcher, "sampler": sampler, "gap": abs(searcher - sampler),
                                                "within_match": bool(abs(searcher - sampler) <= MATCH_REGRET),
                                                "problems": names}}


def tune_targets(tune_doc: dict, pub: dict, pub_early: dict | None = None) -> dict:
    """Against the --public part's figures: the searcher matches CubicSampler (same algorithm) and
    beats TPE multivariate at each checkpoint, on the mean over problems of the median regret."""
    names = [p for p in tune_doc["problems"] if p in pub]
    out = {}
    for n in tune_doc["problems"][names[0]]["median_regret"]:
        mean = float(np.mean([tune_doc["problems"][p]["median_regret"][n] for p in names]))
        ref = {m: float(np.mean([pub[p]["methods"][m]["median_regret"][n] for p in names]))
               for m in ("cubic", "tpe-multivariate")}
        gap = abs(mean - ref["cubic"])
        second = _early_look(tune_doc, pub_early) if n == str(EARLY) else {}
        out[f"tune: CubicSearcher via Tuner.fit matches CubicSampler (|mean median regret @{n} difference| <= "
            f"{MATCH_REGRET})"] = {
            "measured": gap, "target": MATCH_REGRET, "met": bool(gap <= MATCH_REGRET), "searcher": mean,
            "sampler": ref["cubic"], "problems": names, **second,
            **({} if gap <= MATCH_REGRET else {"reason": _mismatch(tune_doc, pub, names, n, mean, ref["cubic"])})}
        ok = mean < ref["tpe-multivariate"]
        per = {p: (tune_doc["problems"][p]["median_regret"][n], pub[p]["methods"]["tpe-multivariate"]["median_regret"][n])
               for p in names}
        out[f"tune: CubicSearcher via Tuner.fit mean median regret @{n} < TPE multivariate's (study.optimize)"] = {
            "measured": mean, "target": ref["tpe-multivariate"], "met": bool(ok), "problems": names,
            **({} if ok else {"reason": "behind TPE multivariate on " + ", ".join(
                f"{p} {c:.3f} vs {t:.3f}" for p, (c, t) in per.items() if c > t)})}
    s = float(np.mean([v["searcher_s_per_trial_mean"] for v in tune_doc["problems"].values()]))
    out["tune: CubicSearcher's own time per trial <= 0.5 s (2 cores)"] = {
        "measured": s, "target": 0.5, "met": bool(s <= 0.5),
        "tune_wall_s_per_trial": float(np.mean([v["tune_wall_s_per_trial_mean"] for v in tune_doc["problems"].values()])),
        **({} if s <= 0.5 else {"reason": "the proxy's fit and inner search per round, as CubicSampler's"})}
    return out
