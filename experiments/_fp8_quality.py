"""fp8_benchmark's quality section (a library, not a benchmark): paired seeds planned from a pilot, the
recommended placement against full precision, all-FP8 per recipe and the bf16 noise floor, per-Mod NE
effects, and the Probe's predicted vs measured per-site error (all measured on this CPU)."""

from __future__ import annotations

import copy
import math
import os
import statistics
import time
from dataclasses import dataclass, field

import torch

from cubic.core.config import FP8Choice
from cubic.core.stats import samples_to_resolve
from cubic.core.workloads import load_workload
from experiments.common import LEARNS_NE_BAR, ci_text
from experiments.common import paired as _paired
from fp8.dispatch import Dispatcher
from fp8.kernels import swap_linears
from fp8.placement import Placement
from fp8.probe import Probe
from fp8.quality import train_variant
from fp8.recommend import probe_mods, probe_workload, recommend

NE_TARGET = 1e-3  # recommendation within 0.1% (relative) of full precision
CONFIDENCE = 0.95
EVAL_BATCH = 65536  # the workloads' 4,096-example eval batch adds avoidable noise to each paired difference
QUALITY_RULE = ("met when the 95% Student-t interval of the mean paired relative NE difference (recommended "
                "placement vs full precision, same seed: same init and data) lies inside +-0.1%; 'measured' is the "
                "largest |difference| the interval allows")


def paired(diffs: list[float], target: float = NE_TARGET) -> dict:
    """experiments.common.paired against the FP8 quality target by default."""
    return _paired(diffs, target)


def verdict(st: dict, target: float = NE_TARGET) -> dict:
    """The quality target in words: met only when resolved (the interval inside +-target)."""
    ci = ci_text(st)
    if st["ci_inside_target"]:
        text = f"met (resolved): {ci} lies inside +-{100 * target:.1f}%"
    elif st["ci_includes_zero"]:
        text = (f"MISSED (not resolved): mean {100 * st['mean']:+.3f}%, {ci} is wider than +-{100 * target:.1f}% "
                f"and includes 0 (per-seed sd {100 * st['sd']:.2f}%; ~{st['seeds_to_resolve']} seeds would resolve "
                f"it if the spread and a zero mean held)")
    else:
        text = f"MISSED: {ci} excludes 0: measurably {'worse' if st['mean'] > 0 else 'better'} than full precision"
    return {"rule": QUALITY_RULE, "met": st["ci_inside_target"], "met_on_mean": abs(st["mean"]) <= target,
            "difference_detected": not st["ci_includes_zero"], "text": text}


def learns(ne_per_seed: dict[int, float], steps: int) -> dict:
    """Whether the full-precision runs learned: their mean end NE against ``LEARNS_NE_BAR``."""
    vals = [ne_per_seed[s] for s in sorted(ne_per_seed)]
    mean = sum(vals) / len(vals)
    return {"per_seed": vals, "mean": mean, "bar": LEARNS_NE_BAR, "learns": mean <= LEARNS_NE_BAR, "steps": steps,
            "label": "measured on this CPU"}


def judged(target: dict, fp: dict) -> dict:
    """An NE target is judged only on a model that learns: on one that has not, a paired NE difference
    is the spread of early, chaotic trajectories (dlrm-wide at 150 steps, as stop 69's run trained it: end
    NE 0.97-0.99 by hand in stop 75, paired differences of 2.9% sd), not the cost of FP8."""
    if fp is None or fp["learns"]:  # (None: a section from before the record was kept)
        return target
    return {**target, "met": False, "not_judged": True, "text": not_learned(fp) + target["text"]}


def not_learned(fp: dict) -> str:
    """The words of an NE target left unjudged (:func:`learns`' record of the full-precision runs)."""
    return (f"NOT JUDGED: the full-precision model has not learned in {fp['steps']} steps (mean end NE "
            f"{fp['mean']:.3f} over {len(fp['per_seed'])} seed(s) > {fp['bar']}), so its NE differences are not "
            "FP8's cost; as measured: ")


def with_eval_batch(w, n: int):
    return w.model_copy(update={"data": w.data.model_copy(update={"eval_batch_size": n})})


def _train_task(task: tuple) -> tuple:
    """One training run in a worker process: (workload, variant, choice, steps, seed, track_error,
    error_from_step, bf16_sites) -> (variant, seed, result). Picklable for a process pool."""
    w, vname, choice, steps, seed, track, from_step, bf16_sites = task
    torch.set_num_threads(1)
    hook = (lambda m: swap_linears(m, {s: "bf16" for s in bf16_sites})) if bf16_sites else None
    r = train_variant(w, choice, steps, seed=seed, track_error=track, error_from_step=from_step, model_hook=hook)
    r["loadavg_1m"] = os.getloadavg()[0]
    return vname, seed, r


def run_tasks(pool, tasks: list[tuple]) -> list[tuple]:
    return list(pool.map(_train_task, tasks)) if pool is not None else [_train_task(t) for t in tasks]


def without_mod(placement: dict, mod: str) -> dict:
    """The placement with ``mod`` taken off every site (same recipes and kernels): its NE effect."""
    doc = copy.deepcopy(placement)
    for s in doc["sites"].values():
        s["applied_mods"] = [m for m in s.get("applied_mods", []) if m["name"] != mod]
    return doc


def plan_seeds(basis: dict, elapsed_s: float, per_seed_s: float, wall_budget_s: float, max_seeds: int,
               target: float = NE_TARGET, stage: str = "pilot") -> dict:
    """How many paired seeds the run does, from the seeds it has (``basis``, a :func:`paired` result: the
    pilot, or at the second look the seeds the pilot's plan ran): enough for the 95% interval's half-width
    to fit inside +-target around their mean (at least target/2, since that mean is itself noisy) if the
    per-seed spread stays at theirs; capped by what the training budget affords."""
    n = basis["seeds"]
    room = max(target - abs(basis["mean"]), target / 2)
    needed = samples_to_resolve(basis["sd"], room, CONFIDENCE) if math.isfinite(basis["sd"]) else max_seeds
    affordable = n + max(0, int((wall_budget_s - elapsed_s) // max(per_seed_s, 1e-9)))
    return {"stage": stage, "from_seeds": n, "from_mean": basis["mean"], "from_sd": basis["sd"],
            "planned_half_width": room, "seeds_needed": needed, "seeds_affordable": affordable,
            "per_seed_wall_s": per_seed_s, "seeds_planned": max(n, min(needed, affordable, max_seeds)),
            "max_seeds": max_seeds,
            "rule": ("seeds_needed: the smallest n with t(0.975, n-1) * from_sd / sqrt(n) <= planned_half_width "
                     "= max(0.1% - |from_mean|, 0.05%); planned = min(needed, affordable in the training wall "
                     "budget, max_seeds)")}


def decided(st: dict, target: float = NE_TARGET) -> bool:
    """The interval answers the question either way: inside +-target, or wholly outside it."""
    lo, hi = st["ci95"]
    return st["ci_inside_target"] or lo > target or hi < -target


def last_stage(plan: dict) -> dict:
    """The seed plan the run ended on: the second look's when it re-planned, else the pilot's."""
    return plan.get("second_look") or plan


def plan_coverage(mean: float, sd: float, plan: dict, sims: int = 2000, seed: int = 0,
                  target: float = NE_TARGET) -> dict:
    """MODELLED: how often the final 95% interval of this two-look seed plan (pilot -> plan -> one re-plan
    from the seeds that ran) covers the true mean, simulated on normal per-seed differences with the run's
    mean and sd and the seed caps the run had. A rule that looks at the data twice could cover less than
    its nominal 95%: this says by how much."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n0 = plan["from_seeds"]
    cap1 = min(plan["seeds_affordable"], plan["max_seeds"])
    cap2 = min(last_stage(plan)["seeds_affordable"], plan["max_seeds"])
    covered, lengths = 0, []
    for _ in range(sims):
        x = list(rng.normal(mean, sd, n0))
        p = plan_seeds(paired(x, target), 0.0, 1.0, float(cap1), cap1, target)  # affordable: the run's cap
        x += list(rng.normal(mean, sd, p["seeds_planned"] - len(x)))
        st = paired(x, target)
        if not decided(st, target):
            p = plan_seeds(st, 0.0, 1.0, float(cap2), cap2, target)
            x += list(rng.normal(mean, sd, p["seeds_planned"] - len(x)))
            st = paired(x, target)
        covered += st["ci95"][0] <= mean <= st["ci95"][1]
        lengths.append(len(x))
    return {"coverage": covered / sims, "nominal": CONFIDENCE, "sims": sims, "true_mean": mean, "true_sd": sd,
            "median_seeds": float(np.median(lengths)), "caps": [cap1, cap2],
            "label": "modelled: the seed plan's rule simulated on normal per-seed differences"}


@dataclass
class _Recommendations:
    """The Probe (plain, then with the suggested Mods on) and the placements recommend makes from it."""
    probe: Probe
    probe_s: float
    mods_probe_s: float
    summary: dict[str, dict]  # the Probe's per-site summary
    placement: Placement  # the conservative defaults: the placement the quality runs train
    plain: Placement  # the plain rule (CI lower bound only)
    no_mods: Placement
    fast: Placement  # safe and predicted faster on an H100
    site_scope: Placement  # the budget on each site alone
    sqnr_only: Placement  # the rule before the held-out NE check


def _probe_and_recommend(w, name: str, budget: float, warmup: int, max_batches: int, ci_db: float,
                         dispatcher: Dispatcher, stride: int) -> _Recommendations:
    """Probe the workload (plain, then with the suggested Mods on) and recommend from it: the conservative
    defaults beside the plain rule, no Mods, require_fast, the per-site budget and SQNR alone (printed)."""
    t0 = time.perf_counter()
    # the Probe measures one step in `stride` from `warmup` on, so its batches span the training window
    # the quality runs are judged over (per-site SQNR drifts by 1-4 dB over a run; a window right after
    # the warmup over-estimates it late in training)
    probe, _ = probe_workload(w, warmup_steps=warmup, max_batches=max_batches, ci_halfwidth_db=ci_db, stride=stride)
    probe_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    mods_probe = probe_mods(w, probe, warmup_steps=warmup)  # the suggested Mods on, same batches and stride
    mods_probe_s = time.perf_counter() - t1
    kw = dict(probe=probe, mods_probe=mods_probe, require_fast=False, dispatcher=dispatcher, warmup_steps=warmup)
    placement = recommend(w, budget, **kw)
    # the plain rule (CI lower bound only): its sites are reported next to the conservative defaults' ones
    plain = recommend(w, budget, **kw, keep_first_last=False, unsure_margin=False)
    no_mods = recommend(w, budget, **(kw | {"mods": False}))
    fast_placement = recommend(w, budget, **(kw | {"require_fast": True}))
    # the budget on each site alone (the rule before the model budget): trained on `site_seeds` seeds so
    # the NE cost of letting every individually-safe site through is measured beside the recommendation
    site_scope = recommend(w, budget, **(kw | {"budget_scope": "site"}))
    # the rule before the held-out NE check (SQNR alone), for comparison: which sites it would have let through
    sqnr_only = recommend(w, budget, **(kw | {"budget_ne_rel": None}))
    summary = probe.summary()
    print(f"[{name}] probe: {probe.steps} batches over steps {warmup}..{warmup + probe.trained_steps}, {probe_s:.0f} s; "
          f"with Mods: {len(placement.probe['mods_probed'])} sites, {mods_probe_s:.0f} s; recommended: "
          f"{len(placement.module_filter)}/{len(placement.sites)} sites in FP8 (budget {budget} dB, conservative) "
          f"{placement.module_filter} (without Mods: {len(no_mods.module_filter)}); plain CI rule: "
          f"{len(plain.module_filter)}; budget per site instead of per model: {len(site_scope.module_filter)}; "
          f"SQNR alone (no NE check): {sqnr_only.module_filter}; "
          f"safe-and-fast on H100: {len(fast_placement.module_filter)}", flush=True)
    return _Recommendations(probe, probe_s, mods_probe_s, summary, placement, plain, no_mods, fast_placement,
                            site_scope, sqnr_only)


def _variants(rec: _Recommendations) -> tuple[dict, dict[str, FP8Choice | None], list[str], bool]:
    """The recommendation as a placement document, the trained variants by name, the Mods the
    recommendation applies (pad_dims aside: a layout change, not a numerics one) and whether the
    per-site budget picks the recommendation's sites."""
    rec_doc = rec.placement.model_dump(mode="json")
    used_mods = sorted({m.name for s in rec.placement.fp8_sites().values() for m in s.applied_mods} - {"pad_dims"})
    choices: dict[str, FP8Choice | None] = {
        "full_precision": None,
        "recommended": FP8Choice(policy="placement", placement=rec_doc),
        "all_fp8_tensorwise": FP8Choice(policy="all", recipe="tensorwise"),
        "all_fp8_rowwise": FP8Choice(policy="all", recipe="rowwise"),
        "all_fp8_rowwise_with_gw_hp": FP8Choice(policy="all", recipe="rowwise_with_gw_hp"),
        "bf16_noise_floor": None,
    } | {f"recommended_without_{m}": FP8Choice(policy="placement", placement=without_mod(rec_doc, m))
         for m in used_mods}
    same_sites = sorted(rec.site_scope.module_filter) == sorted(rec.placement.module_filter)
    if not same_sites:
        choices["site_budget"] = FP8Choice(policy="placement", placement=rec.site_scope.model_dump(mode="json"))
    return rec_doc, choices, used_mods, same_sites


@dataclass
class _Training:
    """What the paired runs measured, gathered as they come back."""
    runs: dict[str, dict] = field(default_factory=dict)  # seed 0's full record per variant
    ne: dict[str, dict[int, float]] = field(default_factory=dict)
    wall: dict[str, list[float]] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)

    def collect(self, results: list[tuple]) -> None:
        for vname, seed, r in results:
            if seed == 0:
                self.runs[vname] = r
            self.ne.setdefault(vname, {})[seed] = r["ne"]
            self.wall.setdefault(vname, []).append(r["wall_s"])
            self.loads.append(r["loadavg_1m"])

    def diffs(self, vname: str, against: str = "full_precision") -> dict[int, float]:
        """Per seed, ``vname``'s NE relative to ``against``'s on the same seed."""
        ne = self.ne
        return {s: (v - ne[against][s]) / ne[against][s] for s, v in sorted(ne.get(vname, {}).items())
                if s in ne[against]}


def _next_stage(name: str, tr: _Training, basis: dict, t_train: float, wall_budget_s: float, max_seeds: int,
                workers: int, stage: str) -> dict:
    """Plan the next seeds from ``basis`` (printed): the per-seed wall time from the runs so far."""
    per_seed_s = (statistics.fmean(tr.wall["full_precision"]) + statistics.fmean(tr.wall["recommended"])) / workers
    plan = plan_seeds(basis, time.perf_counter() - t_train, per_seed_s, wall_budget_s, max_seeds, stage=stage)
    print(f"[{name}] {stage} ({basis['seeds']} paired seeds): recommended {100 * basis['mean']:+.3f}%, per-seed sd "
          f"{100 * basis['sd']:.3f}% -> {plan['seeds_needed']} seeds needed for +-{100 * plan['planned_half_width']:.3f}%, "
          f"{plan['seeds_affordable']} affordable ({per_seed_s:.0f} s per seed); running {plan['seeds_planned']}",
          flush=True)
    return plan


def _train_paired(name: str, wt, choices: dict[str, FP8Choice | None], steps: int, warmup: int, sites: list[str],
                  pilot_seeds: int, core_seeds: int, mod_seeds: int, site_seeds: int, max_seeds: int,
                  wall_budget_s: float, pool, workers: int) -> tuple[_Training, dict, float]:
    """The pilot, then full precision and the recommendation on the seeds it plans: what they measured,
    the seed plan and the training wall time."""
    def task(vname: str, seed: int) -> tuple:
        track = seed == 0 and vname.startswith("all_fp8")
        return (wt, vname, choices[vname], steps, seed, track, warmup, sites if vname == "bf16_noise_floor" else None)

    tr = _Training()
    t_train = time.perf_counter()
    pilot_tasks = [task(v, s) for s in range(pilot_seeds) for v in ("full_precision", "recommended", "bf16_noise_floor")]
    pilot_tasks += [task(v, s) for s in range(core_seeds) for v in choices if v.startswith("all_fp8")]
    pilot_tasks += [task(v, s) for s in range(mod_seeds) for v in choices if v.startswith("recommended_without_")]
    pilot_tasks += [task("site_budget", s) for s in range(site_seeds) if "site_budget" in choices]
    tr.collect(run_tasks(pool, pilot_tasks))

    pilot = paired(list(tr.diffs("recommended").values()))
    plan = _next_stage(name, tr, pilot, t_train, wall_budget_s, max_seeds, workers, "pilot")
    tr.collect(run_tasks(pool, [task(v, s) for s in range(pilot_seeds, plan["seeds_planned"])
                                for v in ("full_precision", "recommended")]))
    # the second look: one re-plan from the spread the planned seeds showed (a 4-seed pilot's sd can be far
    # off: dlrm-small's 0.14% was 0.49% over 35 seeds), within what the budget still affords. One look
    # only, so the interval's coverage stays what plan_coverage says
    first = paired(list(tr.diffs("recommended").values()))
    if not decided(first):
        plan["second_look"] = _next_stage(name, tr, first, t_train, wall_budget_s, max_seeds, workers, "second look")
        tr.collect(run_tasks(pool, [task(v, s) for s in range(first["seeds"], plan["second_look"]["seeds_planned"])
                                    for v in ("full_precision", "recommended")]))
    return tr, plan, time.perf_counter() - t_train


def _ne_stats(name: str, choices: dict[str, FP8Choice | None], tr: _Training,
              placement: Placement) -> tuple[dict[str, dict], dict, dict]:
    """Each variant's paired NE difference to full precision, the recommendation's against the bf16 noise
    floor, and the verdict on the quality target (printed as they are known)."""
    per_seed = {v: tr.diffs(v) for v in choices if v != "full_precision" and v in tr.ne}
    stats = {v: paired(list(d.values())) | {"seed_ids": list(d)} for v, d in per_seed.items()}
    # the recommendation against bf16 on every site, paired by seed: is FP8 on the chosen sites any worse
    # than the trajectory divergence a far smaller perturbation (bf16, ~50 dB) already causes?
    both = [sd for sd in per_seed["recommended"] if sd in per_seed["bf16_noise_floor"]]
    rec_vs_bf16 = paired([per_seed["recommended"][sd] - per_seed["bf16_noise_floor"][sd] for sd in both])
    runs = tr.runs
    for vname, st in stats.items():
        if vname in runs:
            runs[vname]["ne_rel_diff"] = st["mean"]
            runs[vname]["loss_diff"] = runs[vname]["loss"] - runs["full_precision"]["loss"]
        print(f"[{name}] {vname:34s} NE vs full precision: mean {100 * st['mean']:+.3f}% rel, 95% CI "
              f"[{100 * st['ci95'][0]:+.3f}%, {100 * st['ci95'][1]:+.3f}%] over {st['seeds']} seed(s) (measured)")
    target = verdict(stats["recommended"])
    if not placement.module_filter:
        target["text"] += " (no site in FP8: the recommendation is full precision)"
    print(f"[{name}] target: {target['text']}", flush=True)
    return stats, rec_vs_bf16, target


def _mods_evidence(placement: Placement) -> dict[str, dict]:
    """Per Mod: the sites whose Mods made them safe or faster (Probe evidence) and where it is applied."""
    mods_out: dict[str, dict] = {}
    for sname, s in placement.sites.items():
        mp = s.mods_probe
        if mp is None:
            continue
        effect = ("made safe" if mp.recipe_without_mods is None and mp.recipe_with_mods is not None else
                  "made faster" if mp.recipe_with_mods is not None and (mp.speedup_with_mods or 0) > (mp.speedup_without_mods or 0)
                  else "no gain")
        for m in mp.mods:
            if m.name == "pad_dims":
                continue
            row = mods_out.setdefault(m.name, {"sites_probed": [], "sites_made_safe": [], "sites_made_faster": [],
                                               "sites_applied": []})
            row["sites_probed"].append({"site": sname, "group": [x.name for x in mp.mods], "effect": effect,
                                        "recipe_without": mp.recipe_without_mods, "recipe_with": mp.recipe_with_mods,
                                        "best_ci_low_db_without": max(e.ci_low_db for r, e in mp.error_without_mods.items() if r != "bf16"),
                                        "best_ci_low_db_with": max(e.ci_low_db for r, e in mp.error_with_mods.items() if r != "bf16"),
                                        "chosen": mp.chosen})
            if effect == "made safe":
                row["sites_made_safe"].append(sname)
            elif effect == "made faster":
                row["sites_made_faster"].append(sname)
            if mp.chosen:
                row["sites_applied"].append(sname)
    return mods_out


def _mods_section(name: str, placement: Placement, used_mods: list[str],
                  ne: dict[str, dict[int, float]]) -> dict[str, dict]:
    """Per Mod: the Probe's evidence, and the NE effect of taking the Mod off the sites it is applied on
    (paired with the recommendation on the same seeds; measured)."""
    mods_out = _mods_evidence(placement)
    for m in used_mods:
        d = {sd: ne[f"recommended_without_{m}"][sd] / ne["recommended"][sd] - 1
             for sd in ne.get(f"recommended_without_{m}", {}) if sd in ne["recommended"]}
        mods_out[m]["ne_effect_of_removing"] = paired(list(d.values())) | {
            "what": f"NE of the recommendation with {m} taken off its sites (same recipes) relative to the "
                    f"recommendation, paired by seed (measured; > 0: the Mod helps)"}
    for m, row in mods_out.items():
        eff = row.get("ne_effect_of_removing")
        print(f"[{name}] Mod {m}: probed on {len(row['sites_probed'])} sites, made safe {row['sites_made_safe']}, "
              f"faster {row['sites_made_faster']}, applied {row['sites_applied']}" + (
                  f"; removing it: NE {100 * eff['mean']:+.3f}% [{100 * eff['ci95'][0]:+.3f}%, "
                  f"{100 * eff['ci95'][1]:+.3f}%] over {eff['seeds']} seeds" if eff else ""))
    return mods_out


def _probe_eval(name: str, rec: _Recommendations, runs: dict[str, dict]) -> dict:
    """The Probe's prediction vs the error measured in FP8 training (same window: after the warmup)."""
    summary = rec.summary
    pred_vs_meas = []
    for recipe, vname in (("tensorwise", "all_fp8_tensorwise"), ("rowwise", "all_fp8_rowwise"),
                          ("rowwise_with_gw_hp", "all_fp8_rowwise_with_gw_hp")):
        measured = runs[vname].get("site_sqnr_db", {})
        for site, m in measured.items():
            e = summary[site]["errors"][recipe]
            pred_vs_meas.append({
                "site": site, "recipe": recipe, "predicted_sqnr_db": e["sqnr_db"], "ci_low_db": e["ci_low_db"],
                "ci_high_db": e["ci_high_db"], "batches": e["batches"], "measured_sqnr_db": m["sqnr_db"],
                "measured_steps": m["steps"], "abs_error_db": abs(e["sqnr_db"] - m["sqnr_db"]),
                "measured_inside_ci": e["ci_low_db"] <= m["sqnr_db"] <= e["ci_high_db"],
                "measured_below_ci_low": m["sqnr_db"] < e["ci_low_db"],
            })
    errs = [p["abs_error_db"] for p in pred_vs_meas if math.isfinite(p["abs_error_db"])]
    batches = [s["batches"] for s in summary.values()]
    probe_eval = {
        "pairs": pred_vs_meas,
        "mae_db": statistics.fmean(errs) if errs else math.nan,
        "max_abs_error_db": max(errs) if errs else math.nan,
        "share_measured_inside_ci": statistics.fmean(p["measured_inside_ci"] for p in pred_vs_meas) if pred_vs_meas else math.nan,
        "share_measured_below_ci": statistics.fmean(p["measured_below_ci_low"] for p in pred_vs_meas) if pred_vs_meas else math.nan,
        "batches_per_site": {"min": min(batches), "median": statistics.median(batches), "max": max(batches)},
        "probe_steps": rec.probe.steps, "probe_wall_s": rec.probe_s, "mods_probe_wall_s": rec.mods_probe_s,
        "sites_ci_narrow": sum(s["converged_ci"] for s in summary.values()), "sites": len(summary),
        "note": ("the interval covers batch-to-batch noise within the probe window; the measured value averages "
                 "the whole training run, so drift of the statistics after the window is outside it"),
    }
    print(f"[{name}] probe predicted vs measured-in-training SQNR: MAE {probe_eval['mae_db']:.2f} dB, "
          f"max {probe_eval['max_abs_error_db']:.2f} dB, measured inside the CI "
          f"{100 * probe_eval['share_measured_inside_ci']:.0f}%; batches per site {probe_eval['batches_per_site']}")
    return probe_eval


def quality_and_probe(name: str, budget: float, steps: int, warmup: int, max_batches: int, ci_db: float,
                      dispatcher: Dispatcher, pilot_seeds: int, core_seeds: int, mod_seeds: int, max_seeds: int,
                      wall_budget_s: float, eval_batch: int = EVAL_BATCH, stride: int = 1, pool=None,
                      workers: int = 1, site_seeds: int = 0) -> dict:
    """Probe (plain, then the suggested Mods on), recommend, then train paired seeds. A pilot of
    ``pilot_seeds`` trains full precision, the recommendation and bf16 on every site (the noise floor);
    all-FP8 per recipe on the first ``core_seeds``; the recommendation without each of its Mods on the
    first ``mod_seeds``. The pilot's spread says how many seeds resolve +-0.1% (:func:`plan_seeds`); the
    full run then trains full precision and the recommendation on that many (within ``wall_budget_s``)."""
    w = load_workload(name)
    rec = _probe_and_recommend(w, name, budget, warmup, max_batches, ci_db, dispatcher, stride)
    placement, site_scope, sqnr_only, summary = rec.placement, rec.site_scope, rec.sqnr_only, rec.summary
    rec_doc, choices, used_mods, same_sites = _variants(rec)
    tr, plan, training_wall_s = _train_paired(
        name, with_eval_batch(w, eval_batch), choices, steps, warmup, list(summary), pilot_seeds, core_seeds,
        mod_seeds, site_seeds, max_seeds, wall_budget_s, pool, workers)
    stats, rec_vs_bf16, target = _ne_stats(name, choices, tr, placement)
    st = stats["recommended"]
    coverage = plan_coverage(st["mean"], st["sd"], plan) if math.isfinite(st["sd"]) else None
    mods_out = _mods_section(name, placement, used_mods, tr.ne)
    probe_eval = _probe_eval(name, rec, tr.runs)
    loads = tr.loads
    return {
        "workload": name, "budget_sqnr_db": budget, "steps": steps, "eval_batch": eval_batch,
        "label": "measured on this CPU (FP8 numerics via torch._scaled_mm / emulation)",
        "probe_warmup_steps": warmup, "probe_stride": stride, "probe_trained_steps": rec.probe.trained_steps,
        "dense_tail_df": w.data.dense_tail_df, "pilot_seeds": pilot_seeds, "core_seeds": core_seeds,
        "mod_seeds": mod_seeds, "max_seeds": max_seeds, "seed_plan": plan, "seed_plan_coverage": coverage,
        "workers": workers,
        "wall_budget_s": wall_budget_s, "training_wall_s": training_wall_s,
        "loadavg_1m_during_training": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
        "placement": rec_doc,
        "recommended_sites": placement.module_filter,
        "recommended_sites_with_mods": {n: [m.name for m in s.applied_mods] for n, s in placement.fp8_sites().items()
                                        if s.applied_mods},
        "sites_without_mods": rec.no_mods.module_filter,
        "kept_sites": {n: s.reason for n, s in placement.sites.items() if s.recipe is None},
        "plain_rule_sites": rec.plain.module_filter,
        "budget_scope": placement.budget_scope, "model_sqnr_db": placement.model_sqnr_db,
        "site_budget_sites": site_scope.module_filter, "site_budget_model_sqnr_db": site_scope.model_sqnr_db,
        "site_budget_same_sites": same_sites,
        "budget_ne_rel": placement.budget_ne_rel, "model_ne_rel": placement.model_ne_rel,
        "sqnr_only_sites": sqnr_only.module_filter, "sqnr_only_model_ne_rel": sqnr_only.model_ne_rel,
        "held_out_ne_per_site": {
            n: {r: {k: e[k] for k in ("ne_rel", "ne_rel_ci_low", "ne_rel_ci_high")} for r, e in v["errors"].items()
                if "ne_rel" in e} for n, v in summary.items()},
        "fast_placement_sites": rec.fast.module_filter,
        "site_speedups_h100": {n: s.speedups for n, s in placement.sites.items()},
        "runs": tr.runs, "ne_rel_diff": stats, "probe_eval": probe_eval, "mods": mods_out,
        "recommended_ne_rel_diff": stats["recommended"]["mean"],
        "recommended_ci95": stats["recommended"]["ci95"],
        "recommended_minus_bf16": rec_vs_bf16,
        "target": target,
        "recommended_meets_target": target["met"],
        # degradation beyond trajectory noise: worse than full precision by more than bf16's divergence
        "all_fp8_degrades_beyond_noise": max(stats[v]["mean"] for v in stats if v.startswith("all_fp8"))
        > abs(stats["bf16_noise_floor"]["mean"]),
    }


def quality_reason(st: dict, plan: dict, loads: dict) -> str:
    """Why a quality target is missed, in one line (what the figures say, not a guess), from the seed plan
    the run ended on (the second look's when it re-planned)."""
    ci = ci_text(st)
    last = last_stage(plan)
    if not st["ci_includes_zero"] and abs(st["mean"]) > NE_TARGET:
        return f"measurably {'worse' if st['mean'] > 0 else 'better'} than full precision: {ci} excludes 0"
    planned = (f"the {last['stage']}'s per-seed sd {100 * last['from_sd']:.3f}% over {last['from_seeds']} seeds "
               f"needs ~{last['seeds_needed']} paired seeds for a +-{100 * last['planned_half_width']:.3f}% half-width")
    if st["seeds"] < last["seeds_needed"]:
        return (f"not resolved in the time budget: {planned}; the training budget afforded {last['seeds_affordable']} "
                f"({last['per_seed_wall_s']:.0f} s per seed, load average {loads['median']:.1f} on {os.cpu_count()} "
                f"cores); {ci}")
    return (f"the planned {st['seeds']} seeds ran, but the interval is wider than planned ({ci}; per-seed sd "
            f"{100 * st['sd']:.3f}% where {planned})")


def gw_hp_summary(quality: list[dict], grid: dict) -> dict:
    """The rowwise_with_gw_hp recipe across the benchmark: quality with it on every site (measured), its
    per-site error next to rowwise's (Probe, measured), where the recommendation uses it, its H100 speed
    (modelled)."""
    out: dict = {"label": {"quality": "measured on this CPU", "probe": "measured on this CPU",
                           "h100": "modelled (cost_models/gpu_gemm.py)"}, "workloads": {}}
    for q in quality:
        st = q["ne_rel_diff"].get("all_fp8_rowwise_with_gw_hp")
        sites = q["placement"]["sites"]
        out["workloads"][q["workload"]] = {
            "all_fp8_ne_rel_diff": st and {k: st[k] for k in ("mean", "ci95", "seeds")},
            "all_fp8_rowwise_ne_rel_diff": {k: q["ne_rel_diff"]["all_fp8_rowwise"][k] for k in ("mean", "ci95", "seeds")},
            "per_site_sqnr_db": {n: {r: s["error"][r]["sqnr_db"] for r in ("rowwise", "rowwise_with_gw_hp")
                                     if r in s["error"]} for n, s in sites.items()},
            "recommended_sites": [n for n, s in sites.items() if s["recipe"] == "rowwise_with_gw_hp"],
            "h100_speedup": {n: s["speedups"].get("rowwise_with_gw_hp") for n, s in sites.items()},
        }
    out["h100_share_fp8_slower"] = {k: v["share_fp8_slower"] for k, v in grid.items() if k.startswith("rowwise_with_gw_hp")}
    return out
