"""FP8 placement benchmark (issues 4, 14): quality, Mods, Probe accuracy, Dispatch, and the H100 speed model.

Side by side in one run, on the default dlrm-small and wukong-small (heavy-tailed dense features):
- quality (measured on this CPU): full precision vs the recommended placement (Probe, budget on the
  SQNR lower bound, conservative defaults, sites probed again with their suggested Mods on) vs all-FP8
  per recipe (tensorwise, rowwise, rowwise_with_gw_hp) vs bf16 on every site (the noise floor of
  trajectory divergence). Paired by seed (same init, same data): per seed, the relative NE difference
  to full precision on a 65,536-example eval batch; the mean over seeds with a 95% Student-t interval.
  A pilot of a few seeds estimates the per-seed spread; from it, the full run trains as many paired
  seeds as an interval inside +-0.1% needs (:func:`plan_seeds`), within the training budget. The
  target is met only when that interval lies inside +-0.1%; otherwise ``targets`` says why;
- the budget's scope (measured): the recommendation holds the FP8 sites' noise together to the budget
  (fp8.recommend.apply_model_budget); the placement that holds each site to it alone (the earlier
  rule) is trained beside it on a few paired seeds when its sites differ;
- Mods (measured): which sites each Mod made safe or faster (the Probe with and without it), where the
  recommendation applies it, and the NE effect of taking it off those sites (paired seeds); plus each
  Mod on synthetic inputs with the problem it addresses (forward-GEMM SQNR with and without);
- rowwise_with_gw_hp: its quality on every site and per-site error (measured), where the
  recommendation uses it, its modelled H100 speed;
- Probe (measured): predicted per-site SQNR (with its interval and batches) vs the SQNR measured
  in FP8 training on the same sites;
- Dispatch (measured, this CPU): the quick decision vs an exhaustive re-measurement, strict and
  tie-aware; the Triton kernels are registered but not timed here (interpreter);
- Triton kernel: numerics against the torch rowwise kernel on every probed site shape (measured,
  Triton's interpreter: bit-identical or not) and its modelled H100 time next to the eager kernels';
- H100 model (modelled): predicted fwd+bwd block speedups over M, K, N in 1024..32768 per recipe,
  and the share of shapes where FP8 is predicted slower;
- where FP8 pays (issue 25): the production-shaped dlrm-wide probed on this CPU at its batch (256),
  its sites' speeds modelled on an H100 at the production batch (PRODUCTION_BATCH, 16,384); the
  recommendation with require_fast (FP8 only where predicted faster), the dense part's modelled
  speedup, and NE within +-0.1% over paired seeds (full run only);
- Mods rescue (measured): wukong-small's layers.0.lcb.proj probed alone, then with the Mods its
  statistics call for (split_outliers), judged by the recommendation's own rule;
- torchao parity: a hook reporting 'not run' until the parity function of issue 25's recipe table exists.

The JSON's ``targets``: ``{what: {"measured", "target", "met"}}`` plus ``reason`` when missed; the
context records the machine, load average and code version. The full run takes ~45 min on 2 quiet
cores (two training processes; the production workload's 12 paired seeds and the rescue probes add
~10 min to the ~35 before); ``--quick`` is a smoke run (dlrm-small 20 steps, a 2-batch production
probe without training, a 4-batch rescue probe).

    .venv/bin/python experiments/fp8_benchmark.py [--quick] [--workers N]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from cost_models.gpu_gemm import block_speedup, constants_table, linear_block_time_s  # noqa: E402
from cubic.core.config import FP8Choice  # noqa: E402
from cubic.core.workloads import PRODUCTION_BATCH, load_workload  # noqa: E402
from experiments.common import ci_text, png_path, run_context, write_result  # noqa: E402
from experiments.common import paired as _paired  # noqa: E402
from cubic.core.stats import samples_to_resolve  # noqa: E402
from fp8.dispatch import Dispatcher, slower  # noqa: E402
from fp8.kernels import KERNELS, swap_linears  # noqa: E402
from fp8.quality import train_variant  # noqa: E402
from fp8.recommend import probe_mods, probe_workload, recommend  # noqa: E402

NE_TARGET = 1e-3  # recommendation within 0.1% (relative) of full precision
DISPATCH_TARGET = 0.95
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


def _run_tasks(pool, tasks: list[tuple]) -> list[tuple]:
    return list(pool.map(_train_task, tasks)) if pool is not None else [_train_task(t) for t in tasks]


def without_mod(placement: dict, mod: str) -> dict:
    """The placement with ``mod`` taken off every site (same recipes and kernels): its NE effect."""
    doc = copy.deepcopy(placement)
    for s in doc["sites"].values():
        s["applied_mods"] = [m for m in s.get("applied_mods", []) if m["name"] != mod]
    return doc


def plan_seeds(pilot: dict, elapsed_s: float, per_seed_s: float, wall_budget_s: float, max_seeds: int,
               target: float = NE_TARGET) -> dict:
    """How many paired seeds the full run does, from the pilot: enough for the 95% interval's half-width
    to fit inside +-target around the pilot's mean (at least target/2, since that mean is itself noisy)
    if the per-seed spread stays at the pilot's; capped by what the training budget affords."""
    n = pilot["seeds"]
    room = max(target - abs(pilot["mean"]), target / 2)
    needed = samples_to_resolve(pilot["sd"], room, CONFIDENCE) if math.isfinite(pilot["sd"]) else max_seeds
    affordable = n + max(0, int((wall_budget_s - elapsed_s) // max(per_seed_s, 1e-9)))
    return {"pilot_seeds": n, "pilot_mean": pilot["mean"], "pilot_sd": pilot["sd"], "planned_half_width": room,
            "seeds_needed": needed, "seeds_affordable": affordable, "per_seed_wall_s": per_seed_s,
            "seeds_planned": max(n, min(needed, affordable, max_seeds)), "max_seeds": max_seeds,
            "rule": ("seeds_needed: the smallest n with t(0.975, n-1) * pilot_sd / sqrt(n) <= planned_half_width "
                     "= max(0.1% - |pilot mean|, 0.05%); planned = min(needed, affordable in the training wall "
                     "budget, max_seeds)")}


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

    wt = with_eval_batch(w, eval_batch)
    sites = list(summary)
    rec_doc = placement.model_dump(mode="json")
    used_mods = sorted({m.name for s in placement.fp8_sites().values() for m in s.applied_mods} - {"pad_dims"})
    choices: dict[str, FP8Choice | None] = {
        "full_precision": None,
        "recommended": FP8Choice(policy="placement", placement=rec_doc),
        "all_fp8_tensorwise": FP8Choice(policy="all", recipe="tensorwise"),
        "all_fp8_rowwise": FP8Choice(policy="all", recipe="rowwise"),
        "all_fp8_rowwise_with_gw_hp": FP8Choice(policy="all", recipe="rowwise_with_gw_hp"),
        "bf16_noise_floor": None,
    } | {f"recommended_without_{m}": FP8Choice(policy="placement", placement=without_mod(rec_doc, m))
         for m in used_mods}
    same_sites = sorted(site_scope.module_filter) == sorted(placement.module_filter)
    if not same_sites:
        choices["site_budget"] = FP8Choice(policy="placement", placement=site_scope.model_dump(mode="json"))

    def task(vname: str, seed: int) -> tuple:
        track = seed == 0 and vname.startswith("all_fp8")
        return (wt, vname, choices[vname], steps, seed, track, warmup, sites if vname == "bf16_noise_floor" else None)

    runs: dict[str, dict] = {}  # seed 0's full record per variant
    ne: dict[str, dict[int, float]] = {}
    wall: dict[str, list[float]] = {}
    loads: list[float] = []

    def collect(results: list[tuple]) -> None:
        for vname, seed, r in results:
            if seed == 0:
                runs[vname] = r
            ne.setdefault(vname, {})[seed] = r["ne"]
            wall.setdefault(vname, []).append(r["wall_s"])
            loads.append(r["loadavg_1m"])

    t_train = time.perf_counter()
    pilot_tasks = [task(v, s) for s in range(pilot_seeds) for v in ("full_precision", "recommended", "bf16_noise_floor")]
    pilot_tasks += [task(v, s) for s in range(core_seeds) for v in choices if v.startswith("all_fp8")]
    pilot_tasks += [task(v, s) for s in range(mod_seeds) for v in choices if v.startswith("recommended_without_")]
    pilot_tasks += [task("site_budget", s) for s in range(site_seeds) if "site_budget" in choices]
    collect(_run_tasks(pool, pilot_tasks))

    def diffs(vname: str, against: str = "full_precision") -> dict[int, float]:
        return {s: (v - ne[against][s]) / ne[against][s] for s, v in sorted(ne.get(vname, {}).items()) if s in ne[against]}

    pilot = paired(list(diffs("recommended").values()))
    per_seed_s = (statistics.fmean(wall["full_precision"]) + statistics.fmean(wall["recommended"])) / workers
    plan = plan_seeds(pilot, time.perf_counter() - t_train, per_seed_s, wall_budget_s, max_seeds)
    print(f"[{name}] pilot ({pilot_seeds} paired seeds): recommended {100 * pilot['mean']:+.3f}%, per-seed sd "
          f"{100 * pilot['sd']:.3f}% -> {plan['seeds_needed']} seeds needed for +-{100 * plan['planned_half_width']:.3f}%, "
          f"{plan['seeds_affordable']} affordable ({per_seed_s:.0f} s per seed); running {plan['seeds_planned']}",
          flush=True)
    extra = range(pilot_seeds, plan["seeds_planned"])
    collect(_run_tasks(pool, [task(v, s) for s in extra for v in ("full_precision", "recommended")]))
    training_wall_s = time.perf_counter() - t_train

    per_seed = {v: diffs(v) for v in choices if v != "full_precision" and v in ne}
    stats = {v: paired(list(d.values())) | {"seed_ids": list(d)} for v, d in per_seed.items()}
    # the recommendation against bf16 on every site, paired by seed: is FP8 on the chosen sites any worse
    # than the trajectory divergence a far smaller perturbation (bf16, ~50 dB) already causes?
    both = [sd for sd in per_seed["recommended"] if sd in per_seed["bf16_noise_floor"]]
    rec_vs_bf16 = paired([per_seed["recommended"][sd] - per_seed["bf16_noise_floor"][sd] for sd in both])
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

    # per Mod: the sites whose Mods made them safe or faster (Probe evidence), and the NE effect of taking
    # the Mod off those sites (paired with the recommendation on the same seeds; measured)
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

    # Probe's prediction vs the error measured in FP8 training (same window: after the warmup)
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
        "probe_steps": probe.steps, "probe_wall_s": probe_s, "mods_probe_wall_s": mods_probe_s,
        "sites_ci_narrow": sum(s["converged_ci"] for s in summary.values()), "sites": len(summary),
        "note": ("the interval covers batch-to-batch noise within the probe window; the measured value averages "
                 "the whole training run, so drift of the statistics after the window is outside it"),
    }
    print(f"[{name}] probe predicted vs measured-in-training SQNR: MAE {probe_eval['mae_db']:.2f} dB, "
          f"max {probe_eval['max_abs_error_db']:.2f} dB, measured inside the CI "
          f"{100 * probe_eval['share_measured_inside_ci']:.0f}%; batches per site {probe_eval['batches_per_site']}")
    return {
        "workload": name, "budget_sqnr_db": budget, "steps": steps, "eval_batch": eval_batch,
        "label": "measured on this CPU (FP8 numerics via torch._scaled_mm / emulation)",
        "probe_warmup_steps": warmup, "probe_stride": stride, "probe_trained_steps": probe.trained_steps,
        "dense_tail_df": w.data.dense_tail_df, "pilot_seeds": pilot_seeds, "core_seeds": core_seeds,
        "mod_seeds": mod_seeds, "max_seeds": max_seeds, "seed_plan": plan, "workers": workers,
        "wall_budget_s": wall_budget_s, "training_wall_s": training_wall_s,
        "loadavg_1m_during_training": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
        "placement": rec_doc,
        "recommended_sites": placement.module_filter,
        "recommended_sites_with_mods": {n: [m.name for m in s.applied_mods] for n, s in placement.fp8_sites().items()
                                        if s.applied_mods},
        "sites_without_mods": no_mods.module_filter,
        "kept_sites": {n: s.reason for n, s in placement.sites.items() if s.recipe is None},
        "plain_rule_sites": plain.module_filter,
        "budget_scope": placement.budget_scope, "model_sqnr_db": placement.model_sqnr_db,
        "site_budget_sites": site_scope.module_filter, "site_budget_model_sqnr_db": site_scope.model_sqnr_db,
        "site_budget_same_sites": same_sites,
        "budget_ne_rel": placement.budget_ne_rel, "model_ne_rel": placement.model_ne_rel,
        "sqnr_only_sites": sqnr_only.module_filter, "sqnr_only_model_ne_rel": sqnr_only.model_ne_rel,
        "held_out_ne_per_site": {
            n: {r: {k: e[k] for k in ("ne_rel", "ne_rel_ci_low", "ne_rel_ci_high")} for r, e in v["errors"].items()
                if "ne_rel" in e} for n, v in summary.items()},
        "fast_placement_sites": fast_placement.module_filter,
        "site_speedups_h100": {n: s.speedups for n, s in placement.sites.items()},
        "runs": runs, "ne_rel_diff": stats, "probe_eval": probe_eval, "mods": mods_out,
        "recommended_ne_rel_diff": stats["recommended"]["mean"],
        "recommended_ci95": stats["recommended"]["ci95"],
        "recommended_minus_bf16": rec_vs_bf16,
        "target": target,
        "recommended_meets_target": target["met"],
        # degradation beyond trajectory noise: worse than full precision by more than bf16's divergence
        "all_fp8_degrades_beyond_noise": max(stats[v]["mean"] for v in stats if v.startswith("all_fp8"))
        > abs(stats["bf16_noise_floor"]["mean"]),
    }


def step_speedup(sites: dict, recipe_of: dict[str, str | None]) -> dict:
    """Modelled H100 fwd+bwd time of the workload's dense linear layers (each site at its production M)
    in bf16 and with ``recipe_of`` (site -> recipe or None), and their ratio. Embeddings, the interaction
    and the optimizer are not in it: the dense part's speedup, not the whole step's."""
    bf16 = fp8 = 0.0
    for n, s in sites.items():
        kw = dict(norm_before=s["norm_before"], act_after=s["act_after"])
        t16 = linear_block_time_s(s["m_target"], s["k"], s["n"], "bf16", None, **kw)
        bf16 += t16
        r = recipe_of.get(n)
        fp8 += linear_block_time_s(s["m_target"], s["k"], s["n"], "fp8", r, **kw) if r else t16
    return {"bf16_ms": bf16 * 1e3, "placement_ms": fp8 * 1e3, "speedup": bf16 / fp8 if fp8 else math.nan,
            "label": "modelled (H100, cost_models/gpu_gemm.py): fwd+bwd of the dense Linear layers at the production "
                     "batch; embeddings, interaction and optimizer excluded"}


def production(name: str, budget: float, *, warmup: int, max_batches: int, ci_db: float, stride: int, steps: int,
               seeds: int, dispatcher: Dispatcher, pool=None, eval_batch: int = EVAL_BATCH,
               ne_examples: int = 16384) -> dict:
    """Where FP8 pays (issue 25): the production-shaped workload probed on this CPU at its reduced batch,
    speeds from the H100 model at the production batch (``PRODUCTION_BATCH``); the recommendation with
    ``require_fast`` keeps the sites the model predicts faster; ``seeds`` paired seeds (0: not trained)
    train full precision and the recommendation for the NE target."""
    w = load_workload(name)
    prod = PRODUCTION_BATCH[name]
    t0 = time.perf_counter()
    probe, _ = probe_workload(w, warmup_steps=warmup, max_batches=max_batches, ci_halfwidth_db=ci_db, stride=stride,
                              min_batches=min(4, max_batches), ne_examples=ne_examples)
    probe_s = time.perf_counter() - t0
    kw = dict(probe=probe, dispatcher=dispatcher, warmup_steps=warmup, target_batch=prod, mods=False)
    fast = recommend(w, budget, **kw, require_fast=True)
    sites = fast.model_dump(mode="json")["sites"]
    predicted_faster = {n: max(s["speedups"].values()) for n, s in sites.items() if s["speedups"]
                        and max(s["speedups"].values()) > 1.0}
    out = {"workload": name, "probe_batch": w.batch_size, "production_batch": prod, "probe_wall_s": probe_s,
           "probe_batches": probe.steps, "label": {"probe": "measured on this CPU at the probe batch",
                                                    "speedups": "modelled (H100) at the production batch"},
           "sites": {n: {"shape_at_production": [s["m_target"], s["k"], s["n"]], "recipe": s["recipe"],
                         "h100_speedup": s["speedups"], "safe": s["safe"], "reason": s["reason"]}
                     for n, s in sites.items()},
           "recommended_sites": fast.module_filter, "sites_predicted_faster": predicted_faster,
           "fast_sites_not_recommended": {n: sites[n]["reason"] for n in predicted_faster if n not in fast.module_filter},
           "step": step_speedup(sites, {n: s["recipe"] for n, s in sites.items()})}
    out["step_if_every_fast_site"] = step_speedup(
        sites, {n: max(sites[n]["speedups"], key=sites[n]["speedups"].get) for n in predicted_faster})
    if seeds and fast.module_filter:
        wt = with_eval_batch(w, eval_batch)
        rec = FP8Choice(policy="placement", placement=fast.model_dump(mode="json"))
        res = _run_tasks(pool, [(wt, v, c, steps, sd, False, warmup, None) for sd in range(seeds)
                                for v, c in (("full_precision", None), ("recommended", rec))])
        ne: dict[str, dict[int, float]] = {}
        for v, sd, r in res:
            ne.setdefault(v, {})[sd] = r["ne"]
        d = [(ne["recommended"][sd] - ne["full_precision"][sd]) / ne["full_precision"][sd] for sd in range(seeds)]
        st = paired(d)
        out["ne_rel_diff"] = st | {"label": "measured on this CPU, paired seeds", "steps": steps}
        out["target"] = verdict(st)
    else:
        out["ne_rel_diff"] = None
        out["target"] = {"met": False, "text": "not trained" + (" (no site recommended)" if not fast.module_filter
                                                                else " (quick run: no paired seeds)")}
    print(f"[{name}] production batch {prod}: recommended {fast.module_filter}; predicted faster on H100: "
          f"{ {n: round(v, 2) for n, v in predicted_faster.items()} }; dense-part speedup "
          f"{out['step']['speedup']:.2f}x (modelled); NE: {out['target']['text']}", flush=True)
    return out


RESCUE_SITE = ("wukong-small", "dense.layers.0.lcb.proj")  # heavy-tailed dense slot: +0.16% NE in FP8 (issue 25)


def mods_rescue(budget: float, *, warmup: int, max_batches: int, ci_db: float, stride: int, ne_examples: int,
                workload: str = RESCUE_SITE[0], site: str = RESCUE_SITE[1]) -> dict:
    """A real site that fails without a Mod and passes with it (measured): the workload probed (each
    site's SQNR and held-out NE cost per recipe), then probed again with the Mods its statistics call for
    (:func:`fp8.recommend.probe_mods`), both judged by :func:`fp8.recommend.recommend`'s own rule (same
    budgets; conservative end-layer rule off: this is about the site, not its position)."""
    w = load_workload(workload)
    t0 = time.perf_counter()
    # the whole model probed (as recommend sees it); only `site` is judged here
    plain, _ = probe_workload(w, warmup_steps=warmup, max_batches=max_batches, ci_halfwidth_db=ci_db, stride=stride,
                              min_batches=min(4, max_batches), ne_examples=ne_examples)
    modded = probe_mods(w, plain, warmup_steps=warmup)
    rec = recommend(w, budget, probe=plain, mods_probe=modded, require_fast=False, keep_first_last=False,
                    budget_scope="site", warmup_steps=warmup)
    s = rec.model_dump(mode="json")["sites"][site]
    mp = s["mods_probe"]

    def best(errors: dict) -> dict:
        fp8 = {r: e for r, e in errors.items() if r != "bf16"}
        r = min(fp8, key=lambda r: fp8[r].get("ne_rel_ci_high", math.inf))
        return {"recipe": r, **{k: fp8[r].get(k) for k in ("sqnr_db", "ci_low_db", "ne_rel", "ne_rel_ci_low",
                                                           "ne_rel_ci_high")}}

    out = {"workload": workload, "site": site, "label": "measured on this CPU (Probe: SQNR and held-out NE cost of the "
                                                        "site's FP8 forward, per recipe)",
           "budget_sqnr_db": budget, "budget_ne_rel": rec.budget_ne_rel, "wall_s": time.perf_counter() - t0,
           "mods": mp and [m["name"] for m in mp["mods"]],
           "recipe_without_mods": mp and mp["recipe_without_mods"], "recipe_with_mods": mp and mp["recipe_with_mods"],
           "best_without_mods": mp and best(mp["error_without_mods"]), "best_with_mods": mp and best(mp["error_with_mods"]),
           "reason": s["reason"], "settings": {"warmup": warmup, "max_batches": max_batches, "stride": stride,
                                               "ci_halfwidth_db": ci_db, "ne_examples": ne_examples}}
    out["rescued"] = bool(mp and mp["recipe_without_mods"] is None and mp["recipe_with_mods"] is not None)
    print(f"[{workload}] {site}: Mods {out['mods']}: recipe without {out['recipe_without_mods']}, with "
          f"{out['recipe_with_mods']} (best NE cost without {out['best_without_mods']}, with {out['best_with_mods']}); "
          f"rescued: {out['rescued']} (measured)", flush=True)
    return out


def rescue_target(rs: dict) -> dict:
    """The Mods-rescue target: met only when the site is unsafe without its Mods and safe with them."""
    t = {"measured": int(rs["rescued"]), "target": 1, "met": bool(rs["rescued"]), "site": f"{rs['workload']}:{rs['site']}",
         "mods": rs["mods"], "without": rs["best_without_mods"], "with": rs["best_with_mods"],
         "label": "measured on this CPU (Probe)"}
    if not t["met"]:
        t["reason"] = (f"recipe without Mods {rs['recipe_without_mods']}, with {rs['recipe_with_mods']}: " + (
            "already safe without Mods at these probe settings (its held-out NE cost, measured: "
            f"{rs['best_without_mods']})" if rs["recipe_without_mods"] is not None else str(rs["reason"])))
    return t


def torchao_parity() -> dict:
    """HOOK (issue 25, point 1): torchao parity per recipe comes from the other half of the issue (a function
    in fp8/ that compares cubic's emulation of one Linear with torchao's Float8Linear). Until it is on this
    branch this reports 'not run', never a figure."""
    import importlib

    for mod, fn in (("fp8.torchao_parity", "torchao_parity"), ("fp8.torchao_export", "torchao_parity"),
                    ("fp8.recipes", "torchao_parity")):
        try:
            f = getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError):
            continue
        return {"status": "run", "source": f"{mod}.{fn}", "label": "measured on this CPU", "per_recipe": f()}
    return {"status": "not run", "reason": "no torchao parity function on this branch (fp8.torchao_parity."
                                           "torchao_parity expected from the recipe-table work of issue 25)"}


TIE_RULE = ("tie: the dispatched kernel is not significantly slower than the exhaustive best in the exhaustive "
            "samples (one-sided Mann-Whitney U, p >= 0.05, over the interleaved repeats): the exhaustive measurement "
            "itself cannot tell them apart, so either is 'the fastest' on this device")


def dispatch_eval(shapes: list[tuple[str, int, int, int, dict]], budget: float, quick_repeats: int,
                  quick_max_repeats: int, exhaustive_repeats: int) -> dict:
    """Dispatch's quick decision vs an exhaustive, independent re-measurement of every kernel."""
    quick = Dispatcher(repeats=quick_repeats, max_repeats=quick_max_repeats)
    fp8_names = {kk for kk, kern in KERNELS.items() if kern.recipe not in ("fp32", "bf16")}
    rows = []
    for site, m, k, n, low in shapes:
        d = quick.decide(m, k, n, low, budget)
        # the closer call: among the FP8 kernels alone (which implementation of an FP8 site runs)
        fp8_ok = [kk for kk in fp8_names if low.get(KERNELS[kk].recipe, -1e9) >= budget]
        d8 = quick.decide(m, k, n, low, budget, allowed=set(fp8_ok)) if fp8_ok else None
        # exhaustive: a fresh, longer measurement of every kernel (fixed repeats, interleaved)
        ex = Dispatcher(repeats=exhaustive_repeats, max_repeats=exhaustive_repeats)
        ex.times(m, k, n)
        samples = ex.samples[ex.key(m, k, n)]
        med = {kk: statistics.median(v) for kk, v in samples.items()}

        def judge(pick: str, acceptable: list[str]) -> dict:
            acc = [kk for kk in acceptable if kk in med]
            best = min(acc, key=med.get)
            return {"pick": pick, "exhaustive_best": best, "strict": pick == best,
                    "tie_aware": pick == best or not slower(samples[pick], samples[best]),
                    "within_5pct": med[pick] <= 1.05 * med[best], "ratio_to_best": med[pick] / med[best]}

        row = {"site": site, "shape": [m, k, n], "dispatch": d.kernel, "dispatch_ties": list(d.ties),
               "dispatch_times_ms": d.times_ms, "exhaustive_median_ms": med, "acceptable": list(d.acceptable),
               "all": judge(d.kernel, list(d.acceptable))}
        row["exhaustive_best"] = row["all"]["exhaustive_best"]
        if d8 is not None:
            row["fp8_only"] = judge(d8.kernel, list(d8.acceptable)) | {"acceptable": list(d8.acceptable)}
        rows.append(row)

    def share(key: str, subset: str) -> tuple[int, int]:
        got = [r[subset][key] for r in rows if subset in r]
        return sum(got), len(got)

    out = {"sites": rows, "tie_rule": TIE_RULE,
           "judged_on": "tie_aware",
           "why_judged_on": ("the target asks for the fastest acceptable kernel; where the exhaustive measurement "
                             "cannot separate two kernels, which of them is 'fastest' is timing noise, not a "
                             "Dispatch error. The strict figure is reported alongside."),
           "quick_repeats": quick_repeats, "quick_max_repeats": quick_max_repeats,
           "quick_extra_rounds": quick.rounds, "exhaustive_repeats": exhaustive_repeats, "threads": 1,
           "clock": "thread CPU time (one torch thread)"}
    for subset in ("all", "fp8_only"):
        res = {}
        for key in ("strict", "tie_aware", "within_5pct"):
            k_, n_ = share(key, subset)
            res[key] = {"agree": k_, "sites": n_, "share": k_ / max(n_, 1)}
        out[subset] = res
    out["share_agree"] = out["all"]["strict"]["share"]
    out["share_tie_aware"] = out["all"]["tie_aware"]["share"]
    out["meets_target"] = out["share_tie_aware"] >= DISPATCH_TARGET
    out["meets_target_strict"] = out["share_agree"] >= DISPATCH_TARGET
    picks: dict[str, int] = {}
    for r in rows:
        picks[r["dispatch"]] = picks.get(r["dispatch"], 0) + 1
    out["picks"] = picks
    a, f = out["all"], out["fp8_only"]
    print(f"dispatch vs exhaustive (measured, this CPU): strict {a['strict']['agree']}/{a['strict']['sites']}, "
          f"tie-aware {a['tie_aware']['agree']}/{a['tie_aware']['sites']} "
          f"({100 * out['share_tie_aware']:.0f}%; target >= {100 * DISPATCH_TARGET:.0f}%, judged tie-aware), "
          f"within 5% {a['within_5pct']['agree']}/{a['within_5pct']['sites']}")
    print(f"dispatch among FP8 kernels only (measured): strict {f['strict']['agree']}/{f['strict']['sites']}, "
          f"tie-aware {f['tie_aware']['agree']}/{f['tie_aware']['sites']}, within 5% "
          f"{f['within_5pct']['agree']}/{f['within_5pct']['sites']}")
    return out


H100_VARIANTS = [(r, blk, "compile") for r, blk in itertools.product(
    ("tensorwise", "rowwise", "rowwise_with_gw_hp"), ((False, None), (True, "sigmoid")))] + [
    ("rowwise", (True, "sigmoid"), "eager")]


def h100_grid(sizes: list[int]) -> dict:
    out = {}
    for recipe, (norm, act), mode in H100_VARIANTS:
        label = f"{recipe}{'_ln_sigmoid' if norm else ''}{'_eager' if mode == 'eager' else ''}"
        grid = []
        for m, k, n in itertools.product(sizes, sizes, sizes):
            r = block_speedup(m, k, n, recipe, norm_before=norm, act_after=act, mode=mode)
            grid.append({"m": m, "k": k, "n": n, **r})
        slower = sum(g["speedup"] < 1.0 for g in grid) / len(grid)
        out[label] = {"grid": grid, "share_fp8_slower": slower,
                      "speedup_min": min(g["speedup"] for g in grid), "speedup_max": max(g["speedup"] for g in grid),
                      "speedup_median": statistics.median(g["speedup"] for g in grid)}
        print(f"H100 model (modelled) {label:24s}: FP8 slower on {100 * slower:.1f}% of {len(grid)} shapes; "
              f"speedup {out[label]['speedup_min']:.2f}x .. {out[label]['speedup_max']:.2f}x "
              f"(median {out[label]['speedup_median']:.2f}x)")
    return out


def triton_eval(shapes: list[tuple[str, int, int, int, dict]]) -> dict:
    """The Triton kernel on every probed site shape: numerics vs the torch rowwise kernel (measured,
    interpreter on CPU) and modelled H100 times of the rowwise implementations."""
    import importlib.util

    from fp8.kernels import modelled_h100_ms

    if importlib.util.find_spec("triton") is None:
        return {"available": False, "reason": "Triton is not installed"}
    rows = []
    for label, m, k, n, _ in shapes:
        g = torch.Generator().manual_seed(0)
        x, w, dy = torch.randn(min(m, 512), k, generator=g), torch.randn(n, k, generator=g), torch.randn(min(m, 512), n, generator=g)
        same = all(torch.equal(KERNELS["triton_rowwise"].gemm(a, b, fa, "e4m3", role),
                               KERNELS["scaled_mm_rowwise"].gemm(a, b, fa, "e4m3", role))
                   for a, b, fa, role in ((x, w, "e4m3", "fwd"), (dy, w.t().contiguous(), "e5m2", "grad_input"),
                                          (dy.t().contiguous(), x.t().contiguous(), "e5m2", "grad_weight")))
        rows.append({"site": label, "m": m, "k": k, "n": n, "bit_identical_to_scaled_mm_rowwise": same,
                     "modelled_h100_ms": {kn: modelled_h100_ms(kn, m, k, n) for kn in
                                          ("bf16", "scaled_mm_rowwise", "triton_rowwise", "triton_rowwise_with_gw_hp")}})
    ok = sum(r["bit_identical_to_scaled_mm_rowwise"] for r in rows)
    print(f"Triton kernel: bit-identical to scaled_mm_rowwise on {ok}/{len(rows)} site shapes (measured, interpreter)")
    return {"available": True, "labels": {"numerics": "measured (Triton interpreter, this CPU)",
                                          "modelled_h100_ms": "modelled (cost_models/gpu_gemm.py)"}, "sites": rows}


def _row_rel_err(ref: torch.Tensor, y: torch.Tensor) -> float:
    return float(((y - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)).mean())


def mod_effects(seed: int = 0) -> dict:
    """Each Mod on synthetic inputs with the problem it addresses: forward-GEMM SQNR with and without."""
    from fp8.mods import apply_site_mods
    from fp8.recipes import scaled_matmul, sqnr_db

    g = torch.Generator().manual_seed(seed)
    base = torch.randn(1024, 256, generator=g)
    cases = {
        "normalize_rows": base * torch.logspace(-4, 4, 1024)[:, None],  # rows spanning 8 decades
        "smooth_channels": base * torch.where(torch.rand(256, generator=g) < 0.02, 300.0, 1.0),  # outlier channels
        "clamp_outliers": torch.where(torch.rand(1024, 256, generator=g) < 1e-4, 1e4, 1.0) * base,  # rare huge values
        # a few heavy-tailed channels (like wukong's dense-feature embedding slots): Cauchy, 2 of 256
        "split_outliers": torch.cat([base[:, :254], 30 * torch.distributions.Cauchy(0.0, 1.0).sample((1024, 2))], dim=1),
    }
    w0 = torch.randn(128, 256, generator=g) / 16
    out = {}
    for mod, x in cases.items():
        ref = x @ w0.t()
        params = {"alpha": 4 * float(torch.quantile(x.abs().flatten()[:65536], 0.999))} if mod == "clamp_outliers" else {}
        row = {}
        for recipe in ("tensorwise", "rowwise"):
            model = torch.nn.Sequential(torch.nn.Linear(256, 128, bias=False))
            with torch.no_grad():
                model[0].weight.copy_(w0)
            where = apply_site_mods(model, {"0": [{"name": mod, "params": params}]})["0"]
            inner = dict(model.named_modules())[where]
            seen: dict = {}
            h = inner.register_forward_hook(lambda m_, i, o: seen.update(x=i[0].detach(), y=o.detach()))
            with torch.no_grad():
                y_mod = model(x)  # the Mod's first call also calibrates it (smooth_channels)
            h.remove()
            # the GEMM the Mod leaves, in FP8, against the same GEMM in fp32 (the Mod's pre/post-processing is exact)
            y_without, y_with = scaled_matmul(x, w0, recipe), scaled_matmul(seen["x"], inner.weight.detach(), recipe)
            if mod == "split_outliers":  # the split-off channels' GEMM stays exact: judge the whole output
                y_with, seen["y"] = y_with + (y_mod - seen["y"]), ref
            row[recipe] = {"sqnr_db_without": sqnr_db(ref, y_without), "sqnr_db_with": sqnr_db(seen["y"], y_with),
                           # global SQNR is dominated by the largest rows; the mean per-row error is not
                           "row_rel_err_without": _row_rel_err(ref, y_without),
                           "row_rel_err_with": _row_rel_err(seen["y"], y_with),
                           "function_rel_change": float((y_mod - ref).norm() / ref.norm())}
        out[mod] = row
        print(f"Mod {mod:16s} (measured, synthetic): " + ", ".join(
            f"{r} {v['sqnr_db_without']:.1f} -> {v['sqnr_db_with']:.1f} dB, per-row err {v['row_rel_err_without']:.3g} -> "
            f"{v['row_rel_err_with']:.3g}" for r, v in row.items()))
    return {"label": "measured on synthetic inputs (this CPU); SQNR of the forward GEMM the Mod leaves, vs fp32",
            "cases": out}


def plot(payload: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(13, 10))
    # (a) quality: mean paired difference with its 95% CI
    a = ax[0, 0]
    names = ["all_fp8_tensorwise", "all_fp8_rowwise", "all_fp8_rowwise_with_gw_hp", "site_budget", "recommended",
             "bf16_noise_floor"]
    wls = [q["workload"] for q in payload["quality"]]
    width = 0.8 / len(names)
    for i, v in enumerate(names):
        sts = [q["ne_rel_diff"].get(v) for q in payload["quality"]]
        xs = [j + i * width for j, st in enumerate(sts) if st]
        mean = [100 * st["mean"] for st in sts if st]
        err = [[100 * (st["mean"] - st["ci95"][0]) for st in sts if st], [100 * (st["ci95"][1] - st["mean"]) for st in sts if st]]
        a.bar(xs, mean, width, yerr=err, capsize=3,
              label=f"{v} (seeds: {', '.join(str(st['seeds']) for st in sts if st)})")
    a.axhline(100 * NE_TARGET, color="k", ls="--", lw=1, label="target +-0.1%")
    a.axhline(-100 * NE_TARGET, color="k", ls="--", lw=1)
    a.axhline(0, color="k", lw=0.5)
    a.set_xticks([j + 0.4 - width / 2 for j in range(len(wls))], wls)
    a.set_ylabel("NE vs full precision (% rel), mean over paired seeds, 95% CI")
    a.set_title("Quality after training (measured)")
    a.legend(fontsize=7)
    # (b) probe predicted vs measured
    b = ax[0, 1]
    for q in payload["quality"]:
        pairs = q["probe_eval"]["pairs"]
        b.errorbar([p["measured_sqnr_db"] for p in pairs], [p["predicted_sqnr_db"] for p in pairs],
                   yerr=[[p["predicted_sqnr_db"] - p["ci_low_db"] for p in pairs],
                         [p["ci_high_db"] - p["predicted_sqnr_db"] for p in pairs]],
                   fmt="o", ms=3, label=q["workload"])
    lims = b.get_xlim()
    b.plot(lims, lims, "k--", lw=1)
    b.set_xlabel("SQNR measured in FP8 training (dB)")
    b.set_ylabel("Probe prediction, 95% CI (dB)")
    b.set_title("Probe: predicted vs measured per-site error (measured)")
    b.legend(fontsize=7)
    # (c) H100 grid: speedup vs M for K = N
    c = ax[1, 0]
    grid = payload["h100"]["tensorwise_ln_sigmoid"]["grid"]
    sizes = sorted({g["m"] for g in grid})
    for kn in sizes:
        c.plot(sizes, [next(g["speedup"] for g in grid if g["m"] == m and g["k"] == kn and g["n"] == kn) for m in sizes],
               marker="o", label=f"K=N={kn}")
    c.axhline(1.0, color="k", lw=1)
    c.set_xscale("log", base=2)
    c.set_xlabel("M")
    c.set_ylabel("bf16 time / FP8 time")
    c.set_title("H100 LN->linear->sigmoid fwd+bwd, tensorwise (modelled)")
    c.legend(fontsize=7)
    # (d) dispatch
    d = ax[1, 1]
    rows = payload["dispatch"]["sites"]
    colors = ["tab:green" if r["all"]["strict"] else "tab:olive" if r["all"]["tie_aware"] else "tab:red" for r in rows]
    d.bar(range(len(rows)), [r["all"]["ratio_to_best"] for r in rows], color=colors)
    d.axhline(1.0, color="k", lw=1)
    d.set_xlabel("site (green: exhaustive best, olive: statistical tie, red: slower)")
    d.set_ylabel("median time of dispatched / fastest acceptable (exhaustive)")
    dd = payload["dispatch"]
    d.set_title(f"Dispatch vs exhaustive, this CPU (measured): {100 * dd['share_agree']:.0f}% strict, "
                f"{100 * dd['share_tie_aware']:.0f}% tie-aware", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def quality_reason(st: dict, plan: dict, loads: dict) -> str:
    """Why a quality target is missed, in one line (what the figures say, not a guess)."""
    ci = ci_text(st)
    if not st["ci_includes_zero"] and abs(st["mean"]) > NE_TARGET:
        return f"measurably {'worse' if st['mean'] > 0 else 'better'} than full precision: {ci} excludes 0"
    if st["seeds"] < plan["seeds_needed"]:
        return (f"not resolved in the time budget: the pilot's per-seed sd {100 * plan['pilot_sd']:.3f}% needs "
                f"~{plan['seeds_needed']} paired seeds for a +-{100 * plan['planned_half_width']:.3f}% half-width; "
                f"the training budget afforded {plan['seeds_affordable']} ({plan['per_seed_wall_s']:.0f} s per seed, "
                f"load average {loads['median']:.1f} on {os.cpu_count()} cores); {ci}")
    return (f"the planned {st['seeds']} seeds ran, but the interval is wider than planned ({ci}; per-seed sd "
            f"{100 * st['sd']:.3f}% vs the pilot's {100 * plan['pilot_sd']:.3f}%)")


def targets(payload: dict) -> dict:
    """The benchmark's targets: ``{what: {"measured", "target", "met"}}`` plus a ``reason`` when missed."""
    out: dict[str, dict] = {}
    for q in payload["quality"]:
        st, plan = q["ne_rel_diff"]["recommended"], q["seed_plan"]
        lo, hi = st["ci95"]
        t = {"measured": max(abs(lo), abs(hi)), "target": NE_TARGET, "met": bool(st["ci_inside_target"]),
             "mean": st["mean"], "ci95": [lo, hi], "seeds": st["seeds"], "seeds_needed": plan["seeds_needed"],
             "fp8_sites": len(q["recommended_sites"]), "rule": QUALITY_RULE, "label": "measured on this CPU"}
        if not q["recommended_sites"]:
            t["met"], t["reason"] = False, "no site in FP8: the recommendation is full precision"
        elif not t["met"]:
            t["reason"] = quality_reason(st, plan, q["loadavg_1m_during_training"])
        out[f"{q['workload']}: recommended placement NE within +-0.1% of full precision, 95% CI over paired "
            f"seeds (measured on this CPU)"] = t
    d = payload["dispatch"]
    t = {"measured": d["share_tie_aware"], "target": DISPATCH_TARGET, "met": d["share_tie_aware"] >= DISPATCH_TARGET,
         "strict": d["share_agree"], "sites": d["all"]["tie_aware"]["sites"], "rule": TIE_RULE,
         "label": "measured on this CPU"}
    if not t["met"]:
        bad = [r["site"] for r in d["sites"] if not r["all"]["tie_aware"]]
        t["reason"] = f"Dispatch picked a measurably slower kernel than the exhaustive best on {', '.join(bad)}"
    out["Dispatch picks the fastest acceptable kernel (tie-aware share of site shapes, measured on this CPU)"] = t
    pr = payload.get("production")
    if pr is not None:
        t = {"measured": pr["ne_rel_diff"] and max(abs(x) for x in pr["ne_rel_diff"]["ci95"]), "target": NE_TARGET,
             "met": bool(pr["target"]["met"]), "fp8_sites": pr["recommended_sites"],
             "predicted_dense_speedup_h100": pr["step"]["speedup"], "label": "NE measured on this CPU; speed modelled (H100)"}
        if not t["met"]:
            t["reason"] = pr["target"]["text"]
        out[f"{pr['workload']} (production-shaped, speeds at batch {pr['production_batch']}): FP8 on the sites predicted "
            f"faster, NE within +-0.1% of full precision, 95% CI over paired seeds"] = t
        fast = pr["sites_predicted_faster"]
        slow = [n for n in pr["recommended_sites"] if n not in fast]
        t = {"measured": len(pr["recommended_sites"]), "target": 1, "met": bool(pr["recommended_sites"]) and not slow,
             "predicted_faster": fast, "label": "modelled (H100) at the production batch"}
        if not pr["recommended_sites"]:
            t["reason"] = "no site recommended: " + str(pr["fast_sites_not_recommended"])
        elif slow:
            t["reason"] = f"recommended sites not predicted faster: {slow}"
        out[f"{pr['workload']}: the recommendation puts FP8 on sites the H100 model predicts faster (modelled)"] = t
    rs = payload.get("mods_rescue")
    if rs is not None:
        out["a Mod widens the safe set: a real site unsafe without its Mods and safe with them (measured)"] = rescue_target(rs)
    ta = payload.get("torchao_parity")
    if ta is not None:
        out["torchao parity per recipe (cubic's emulation vs Float8Linear, measured on this CPU)"] = (
            {"measured": None, "target": "bitwise", "met": False, "reason": ta.get("reason", "not run")}
            if ta.get("status") != "run" else {"measured": ta["per_recipe"], "target": "bitwise", "met": all(
                bool(v.get("bitwise", v.get("ok"))) for v in ta["per_recipe"].values())
                if isinstance(ta["per_recipe"], dict) else False})
    tri = payload["triton"]
    what = "Triton kernel bit-identical to scaled_mm_rowwise on every site shape (measured, Triton interpreter)"
    if tri.get("available"):
        ok = sum(r["bit_identical_to_scaled_mm_rowwise"] for r in tri["sites"])
        t = {"measured": ok / max(len(tri["sites"]), 1), "target": 1.0, "met": ok == len(tri["sites"]),
             "sites": len(tri["sites"]), "label": "measured (interpreter, this CPU)"}
        if not t["met"]:
            t["reason"] = "differs on " + ", ".join(r["site"] for r in tri["sites"]
                                                    if not r["bit_identical_to_scaled_mm_rowwise"])
    else:
        t = {"measured": None, "target": 1.0, "met": False, "reason": tri.get("reason", "Triton unavailable")}
    out[what] = t
    return out


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: dlrm-small only, few steps (a few minutes)")
    ap.add_argument("--budget", type=float, default=24.0, help="SQNR budget in dB (default 24)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                    help="training processes (one torch thread each; default: 2, the cores the budget assumes)")
    ap.add_argument("--rescue-only", action="store_true",
                    help="only the Mods rescue at full probe settings (writes results/fp8_mods_rescue.json, ~15 min)")
    args = ap.parse_args()
    if args.rescue_only:
        torch.set_num_threads(1)
        ctx = run_context("measured")
        rs = mods_rescue(args.budget, warmup=30, max_batches=24, ci_db=1.0, stride=5, ne_examples=16384)
        key = "a Mod widens the safe set: a real site unsafe without its Mods and safe with them (measured)"
        tg = {key: rescue_target(rs)}
        out = write_result("fp8_mods_rescue", {"context": ctx, "label": rs["label"], "mods_rescue": rs, "targets": tg})
        print(f"wrote {out}: {tg[key]}")
        return
    if args.workers < 1:
        ap.error("--workers must be >= 1")
    torch.set_num_threads(1)  # shared machine: one thread is faster and far less noisy
    ctx = run_context("mixed")
    t_start = time.perf_counter()
    # workload: (steps, pilot seeds, core seeds (all-FP8 per recipe), seeds without each Mod, max seeds,
    #            training wall budget in s, Probe warmup steps, Probe stride, seeds of the per-site budget)
    if args.quick:
        wls = {"dlrm-small": (20, 3, 1, 1, 4, 20.0, 5, 2, 2)}
        max_b, ci, sizes, qrep, qmax, erep, eval_batch = 4, 3.0, [1024, 8192, 32768], 3, 6, 5, 4096
    else:
        # dlrm-small trains ~10x faster than wukong-small per step: 600 steps (NE ~0.93, and a per-seed spread
        # of the paired difference ~3x smaller than at 150). The pilot's spread sets the seeds (plan_seeds),
        # within each workload's training budget; the two budgets plus the probes, Dispatch and the rest keep
        # the run within ~35 min on 2 quiet cores. The Probe's batches (up to 24, until its 95% CI is +-1 dB)
        # span the quality runs' window after its warmup (stride x 24 steps).
        # Budgets from the last quiet runs' per-seed spread: dlrm-small's paired difference has sd ~0.3-0.4%
        # even with no rounding at all (fp32 kernel on every site: summation order alone makes the 600-step
        # trajectories diverge), so +-0.1% takes ~150-260 seeds at ~5 s a seed on 2 processes: it gets the
        # larger share (20 min). wukong-small's spread shrinks with its noise (sd ~0.04% with no rounding,
        # ~0.25% with 17 FP8 sites), so the model budget's few sites need few seeds (~15 s a seed).
        # Total ~40 min on 2 quiet cores.
        # With the held-out NE check, wukong-small's sites are embedding projections whose FP8 training
        # still moves the trajectory (sd ~0.15% a seed over 24 seeds): ~30-40 seeds, so 800 s.
        # Dispatch gets up to 30 rounds for kernels it cannot yet tell apart (15 left dlrm top.fc.1's
        # fp32 and bf16, 5.6% apart, tied where the exhaustive re-measurement separated them).
        wls = {"wukong-small": (150, 4, 1, 2, 80, 800.0, 30, 5, 12),
               "dlrm-small": (600, 4, 2, 2, 300, 1200.0, 100, 20, 0)}
        max_b, ci, sizes, qrep, qmax, erep, eval_batch = (24, 1.0, [1024, 2048, 4096, 8192, 16384, 32768],
                                                          5, 30, 15, EVAL_BATCH)
    dispatcher = Dispatcher(repeats=qrep, max_repeats=qmax)
    pool = None
    if args.workers > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn"))
    try:
        quality = [quality_and_probe(w, args.budget, steps, warmup, max_b, ci, dispatcher, pilot, core, mseeds, mx,
                                     wall, eval_batch, stride, pool=pool, workers=args.workers, site_seeds=sseeds)
                   for w, (steps, pilot, core, mseeds, mx, wall, warmup, stride, sseeds) in wls.items()]
    finally:
        if pool is not None:
            pool.shutdown()
    prod_kw = (dict(warmup=2, max_batches=2, ci_db=6.0, stride=1, steps=20, seeds=0, ne_examples=2048) if args.quick else
               dict(warmup=30, max_batches=12, ci_db=1.0, stride=5, steps=150, seeds=12))
    pool2 = None
    if args.workers > 1 and prod_kw["seeds"]:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        pool2 = ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn"))
    try:
        prod = production("dlrm-wide", args.budget, dispatcher=dispatcher, pool=pool2, eval_batch=eval_batch, **prod_kw)
    finally:
        if pool2 is not None:
            pool2.shutdown()
    rescue = mods_rescue(args.budget, **(dict(warmup=30, max_batches=4, ci_db=3.0, stride=1, ne_examples=16384)
                                          if args.quick else
                                          dict(warmup=30, max_batches=24, ci_db=1.0, stride=5, ne_examples=16384)))
    shapes = []
    seen = set()
    for q in quality:
        for site, s in q["placement"]["sites"].items():
            key = (s["m"], s["k"], s["n"])
            if key in seen:
                continue
            seen.add(key)
            low = {r: e["ci_low_db"] for r, e in s["error"].items()}
            shapes.append((f"{q['workload']}:{site}", s["m"], s["k"], s["n"], low))
    disp = dispatch_eval(shapes, args.budget, qrep, qmax, erep)
    disp["triton"] = {"registered": sorted(k for k, kern in KERNELS.items() if kern.backend == "triton"),
                      "timed": False,
                      "why": KERNELS["triton_rowwise"].untimed("cpu") if "triton_rowwise" in KERNELS else None,
                      "label": "Dispatch registers the Triton kernels; on this CPU they run in the interpreter "
                               "(numerics below, measured) and are not timed for speed; their H100 times are "
                               "modelled (triton section)"}
    grid = h100_grid(sizes)
    tri = triton_eval(shapes)
    mods = mod_effects()
    payload = {
        "context": ctx,
        "labels": {"quality": "measured on this CPU (FP8 numerics via torch._scaled_mm / emulation)",
                   "probe_eval": "measured on this CPU", "dispatch": "measured on this CPU",
                   "mods": "measured on this CPU (Probe evidence and paired NE; synthetic cases)",
                   "triton": "numerics measured (Triton interpreter, this CPU); H100 times modelled",
                   "h100": "modelled (cost_models/gpu_gemm.py), H100", "site_speedups_h100": "modelled (H100)",
                   "rowwise_with_gw_hp": "quality and Probe measured on this CPU; speed modelled (H100)"},
        "targets": {},
        "h100_share_fp8_slower": {"label": "modelled (H100): share of the M, K, N grid where FP8 is predicted "
                                           "slower than bf16", **{k: v["share_fp8_slower"] for k, v in grid.items()}},
        "settings": {"quick": args.quick, "budget_sqnr_db": args.budget, "workers": args.workers,
                     "workloads": {w: {"steps": st, "pilot_seeds": p_, "core_seeds": c, "mod_seeds": ms,
                                       "max_seeds": mx, "training_wall_budget_s": wb, "probe_warmup_steps": wu,
                                       "probe_stride": sd, "site_budget_seeds": ss}
                                   for w, (st, p_, c, ms, mx, wb, wu, sd, ss) in wls.items()},
                     "eval_batch": eval_batch, "confidence": CONFIDENCE,
                     "max_batches": max_b, "ci_halfwidth_db": ci, "grid_sizes": sizes,
                     "recommendation": "conservative defaults: keep_first_last, unsure_margin; sites probed again "
                                       "with their suggested Mods on; the budget held by the FP8 sites together "
                                       "(budget_scope model: noise powers add); each site's FP8 forward, and the "
                                       "FP8 sites together, within +0.02% held-out NE cost at the upper 95% bound "
                                       "(budget_ne_rel, measured on the Probe's trained model) (fp8/recommend.py)"},
        "quality": quality,
        "production": prod,
        "mods_rescue": rescue,
        "torchao_parity": torchao_parity(),
        "mods_per_workload": {q["workload"]: q["mods"] for q in quality},
        "rowwise_with_gw_hp": gw_hp_summary(quality, grid),
        "dispatch": disp,
        "h100": grid,
        "h100_constants": constants_table(),
        "triton": tri,
        "mods_synthetic": mods,
        "wall_s": None,
    }
    payload["targets"] = targets(payload)
    payload["wall_s"] = time.perf_counter() - t_start
    name = "fp8_benchmark_quick" if args.quick else "fp8_benchmark"
    out = write_result(name, payload)
    plot(payload, png_path(name))
    for q in quality:
        st = q["ne_rel_diff"]
        print(f"[{q['workload']}] recommended ({len(q['recommended_sites'])}/{len(q['placement']['sites'])} sites in "
              f"FP8): {q['target']['text']}; all-FP8 tensorwise {100 * st['all_fp8_tensorwise']['mean']:+.3f}%, "
              f"rowwise {100 * st['all_fp8_rowwise']['mean']:+.3f}%, rowwise_with_gw_hp "
              f"{100 * st['all_fp8_rowwise_with_gw_hp']['mean']:+.3f}%, bf16 noise floor "
              f"{100 * st['bf16_noise_floor']['mean']:+.3f}% (measured, means over paired seeds)")
    for what, t in payload["targets"].items():
        print(f"target {'met' if t['met'] else 'MISSED'}: {what}: measured {t['measured']}, target {t['target']}"
              + (f" ({t['reason']})" if not t["met"] else ""))
    print(f"wrote {out} and {png_path(name)} in {payload['wall_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
