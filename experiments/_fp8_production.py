"""fp8_benchmark's "where FP8 pays" section (a library, not a benchmark): the production-shaped workload
probed on this CPU at its batch, its sites' speeds modelled on an H100 at the production batch, and the
NE of the recommendation over paired seeds."""

from __future__ import annotations

import math
import time

from cost_models.gpu_gemm import linear_block_time_s
from cubic.core.config import FP8Choice
from cubic.core.workloads import PRODUCTION_BATCH, load_workload
from experiments._fp8_quality import EVAL_BATCH, judged, learns, run_tasks, paired, verdict, with_eval_batch
from fp8.dispatch import Dispatcher
from fp8.recommend import probe_workload, recommend


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


def judge_section(out: dict) -> None:
    """The section's two NE verdicts (the recommendation's, the torchao-restricted one's) from its stored
    figures, each judged only on a model that learns; ``--retarget`` recomputes them with this code."""
    fp, ta = out.get("ne_full_precision"), out.get("torchao")
    if out.get("ne_rel_diff"):
        out["target"] = judged(verdict(out["ne_rel_diff"]), fp)
    if ta is None:  # a section from before the torchao restriction existed
        return
    if ta.get("ne_rel_diff"):
        ta["target"] = judged(verdict(ta["ne_rel_diff"]), fp)
    elif "target" not in ta:
        ta["target"] = {"met": False, "text": "no site recommended" if not ta["recommended_sites"]
                        else out["target"]["text"]}


def production(name: str, budget: float, *, warmup: int, max_batches: int, ci_db: float, stride: int, steps: int,
               seeds: int, dispatcher: Dispatcher, pool=None, eval_batch: int = EVAL_BATCH,
               ne_examples: int = 16384) -> dict:
    """Where FP8 pays (issue 25): the production-shaped workload probed on this CPU at its reduced batch,
    speeds from the H100 model at the production batch (``PRODUCTION_BATCH``); the recommendation with
    ``require_fast`` keeps the sites the model predicts faster; ``seeds`` paired seeds (0: not trained)
    train full precision and the recommendation for the NE target. Beside it, the recommendation
    restricted to torchao's recipes (``recipes="torchao"``: what ``cubic fp8 probe --recipes torchao``
    gives a torchao job, since torchao runs neither block128 nor mx32), trained on the same seeds
    when it differs."""
    w = load_workload(name)
    prod = PRODUCTION_BATCH[name]
    t0 = time.perf_counter()
    probe, _ = probe_workload(w, warmup_steps=warmup, max_batches=max_batches, ci_halfwidth_db=ci_db, stride=stride,
                              min_batches=min(4, max_batches), ne_examples=ne_examples)
    probe_s = time.perf_counter() - t0
    kw = dict(probe=probe, dispatcher=dispatcher, warmup_steps=warmup, target_batch=prod, mods=False)
    fast = recommend(w, budget, **kw, require_fast=True)
    ta = recommend(w, budget, **kw, require_fast=True, recipes="torchao")
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
    ta_recipes = {n: s.recipe for n, s in ta.fp8_sites().items()}
    same = ta_recipes == {n: s.recipe for n, s in fast.fp8_sites().items()}
    out["torchao"] = {"recommended_sites": ta.module_filter, "recipes": ta_recipes, "same_as_recommended": same,
                      "changed": {n: [sites[n]["recipe"], ta_recipes.get(n)] for n in sites
                                  if sites[n]["recipe"] != ta_recipes.get(n)},
                      "step": step_speedup(sites, ta_recipes),
                      "what": "the recommendation restricted to torchao's recipes (cubic fp8 probe --recipes torchao): "
                              "the placement `cubic fp8 export --format torchao` accepts"}
    variants = {"recommended": fast} | ({} if same or not ta.module_filter else {"recommended_torchao": ta})
    if seeds and fast.module_filter:
        wt = with_eval_batch(w, eval_batch)
        choices = [("full_precision", None)] + [(v, FP8Choice(policy="placement", placement=p.model_dump(mode="json")))
                                                for v, p in variants.items()]
        res = run_tasks(pool, [(wt, v, c, steps, sd, False, warmup, None) for sd in range(seeds) for v, c in choices])
        ne: dict[str, dict[int, float]] = {}
        for v, sd, r in res:
            ne.setdefault(v, {})[sd] = r["ne"]
        st = {v: paired([(ne[v][sd] - ne["full_precision"][sd]) / ne["full_precision"][sd] for sd in range(seeds)])
              for v in variants}
        out["ne_rel_diff"] = st["recommended"] | {"label": "measured on this CPU, paired seeds", "steps": steps}
        out["ne_full_precision"] = learns(ne["full_precision"], steps)
        ta_st = st["recommended" if same else "recommended_torchao"] if ta.module_filter else None
    else:
        out["ne_rel_diff"] = ta_st = None
        out["target"] = {"met": False, "text": "not trained" + (" (no site recommended)" if not fast.module_filter
                                                                else " (quick run: no paired seeds)")}
    out["torchao"]["ne_rel_diff"] = ta_st and ta_st | {"label": "measured on this CPU, paired seeds", "steps": steps}
    judge_section(out)
    print(f"[{name}] production batch {prod}: recommended {fast.module_filter}; predicted faster on H100: "
          f"{ {n: round(v, 2) for n, v in predicted_faster.items()} }; dense-part speedup "
          f"{out['step']['speedup']:.2f}x (modelled); NE: {out['target']['text']}", flush=True)
    print(f"[{name}] restricted to torchao's recipes: {ta_recipes} (changed: {out['torchao']['changed']}); "
          f"dense-part speedup {out['torchao']['step']['speedup']:.2f}x (modelled); NE: "
          f"{out['torchao']['target']['text']}", flush=True)
    return out
