"""The second look at the H100 model: cubic's own GPU measurements, never fitted to.

``results/gpu_checks.json`` is the run the shipped model is judged on (the four targets marked "own GPU
measurement, not fitted"). ``results/gpu_checks_repeat.json``, a second run of the same GEMMs and blocks
on the same kind of GPU (``gpu_checks.py --sections fp8,gemms,blocks --out gpu_checks_repeat``), is what
makes two more things checkable:

- **Repeatability of the measurement itself**: a fast/slow verdict the two runs disagree on is not
  resolved by measurement, whatever a model says about it.
- **A candidate host-floor term**: ``time = max(modelled GPU time, floor)`` with one floor per precision
  and recipe (the per-call host time of a small shape called alone from Python), fitted on the first run
  without the shape being predicted and checked on the repeat run at that shape. It is not shipped
  (see ``HOST_FLOOR_NOT_SHIPPED``); it says whether host time explains the shipped model's misses.
"""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
from scipy import optimize

from cost_models.gpu_gemm import GemmConstants
from experiments._h100_model import (BLOCK_TARGETS, TARGETS, fast_slow, meets, metrics, pairs, predict_block,
                                     predict_block_times, predict_gemm)
from experiments._h100_site_steps import across_runs, missing_targets, settled_target, site_step_check
from experiments.common import RESULTS

RUN_FILES = ("gpu_checks.json", "gpu_checks_repeat.json")
# another device the model names (cost_models.hardware), never fitted, the same checks: its leases (each a
# run and its repeat, one machine start), newest first. The newest is the one reported; a verdict counts as
# met only when every lease gives it (leases_check)
OTHER_DEVICE_RUNS = {"h200": (("gpu_checks_h200_run3.json", "gpu_checks_h200_run4.json"),
                              ("gpu_checks_h200.json", "gpu_checks_h200_repeat.json"))}
# a block within this factor of the run's smallest bf16 block time is bound by the host's per-call time
HOST_BOUND_FACTOR = 2.0
HOST_FLOOR_NOT_SHIPPED = (
    "not shipped: the floor is the per-call host time of one compiled block (or one GEMM) called alone from "
    "Python with this torch build; in a training step the host's time is spread over all layers and overlaps "
    "the GPU's. Its per-site form (FP8 floor minus bf16 floor) is checked on whole training steps with FP8 on "
    "one site at a time (the site_step targets, experiments/_h100_site_steps.py): it would ship only if it met them")


def own_runs(files: tuple[str, ...] = RUN_FILES) -> list[dict]:
    """The GPU runs on record in ``files``, first the one the model is judged on; a repeat counts only
    when it ran on the same device."""
    runs = []
    for name in files:
        path = RESULTS / name
        doc = json.loads(path.read_text()) if path.is_file() else {}
        if not doc.get("device") or (runs and doc["device"] != runs[0]["device"]):
            continue
        src = f"results/{name} ({doc['label']})"
        code = {s: v.get("code_version") for s, v in doc.get("sections", {}).items()}
        runs.append({
            "file": f"results/{name}", "label": doc["label"], "device": doc["device"], "code_version": code,
            "gemms": [{"source": src, "device": doc["device"], "precision": r["precision"], "recipe": r.get("recipe"),
                       "m": r["m"], "k": r["k"], "n": r["n"], "time_s": r["time_s"], "split": "heldout"}
                      for r in doc.get("gemms", [])],
            "blocks": [{"source": src, "device": doc["device"], **r} for r in doc.get("blocks", [])],
            "site_steps": doc.get("site_steps", [])})
    return runs


def _shape(r: dict) -> tuple[int, int, int]:
    return r["m"], r["k"], r["n"]


def repeatability(runs: list[dict]) -> dict:
    """Per block row and per GEMM pair, the measured FP8 speedup in each run, and whether the runs agree
    on fast or slow ("resolved"). MEASURED; needs two runs."""
    def rows_of(items_per_run):
        keys = [k for k in items_per_run[0] if all(k in d for d in items_per_run[1:])]
        out = []
        for k in keys:
            s = [d[k] for d in items_per_run]
            verdict = "fast" if min(s) > 1.0 else "slow" if max(s) < 1.0 else "unresolved"
            out.append({"m": k[0][0], "k": k[0][1], "n": k[0][2], "recipe": k[1], "speedups": [round(x, 4) for x in s],
                        "spread_pct": round(100.0 * (max(s) - min(s)) / statistics.fmean(s), 1), "verdict": verdict})
        return out

    blocks = [{(_shape(b), b["recipe"]): b["speedup"] for b in r["blocks"]} for r in runs]
    gemm = [{(_shape(p), p["recipe"]): p["measured"] for p in pairs(r["gemms"], None)} for r in runs]
    brows, grows = rows_of(blocks), rows_of(gemm)
    floor = min(b["bf16_s"] for b in runs[0]["blocks"])
    bound = {_shape(b): b["bf16_s"] <= HOST_BOUND_FACTOR * floor for b in runs[0]["blocks"]}
    for r in brows:
        r["host_bound"] = bound[(r["m"], r["k"], r["n"])]

    def summary(rows):
        return {"n": len(rows), "resolved": sum(r["verdict"] != "unresolved" for r in rows),
                "median_spread_pct": statistics.median(r["spread_pct"] for r in rows) if rows else None}

    return {"label": f"MEASURED, {len(runs)} runs on {runs[0]['device']}", "runs": [r["file"] for r in runs],
            "host_bound_rule": f"bf16 block time within {HOST_BOUND_FACTOR}x of the run's smallest ({floor * 1e3:.2f} ms)",
            "blocks": {"host_bound": summary([r for r in brows if r["host_bound"]]),
                       "compute_bound": summary([r for r in brows if not r["host_bound"]]), "rows": brows},
            "gemm_pairs": {**summary(grows), "rows": grows}}


def _fit_floor(gpu_s: list[float], meas_s: list[float]) -> float:
    """The floor f minimising the squared log error of max(gpu, f) against the measured times."""
    g, y = np.log(gpu_s), np.log(meas_s)

    def loss(lf: float) -> float:
        return float(np.sum((np.maximum(g, lf) - y) ** 2))

    res = optimize.minimize_scalar(loss, bounds=(math.log(1e-7), math.log(1.0)), method="bounded")
    return float(math.exp(res.x))


def block_floors(blocks: list[dict], c: GemmConstants) -> dict[str, float]:
    """The per-call floors (s) of bf16 and of each recipe, fitted on compiled block rows."""
    gpu = {(_shape(b), b["recipe"]): predict_block_times(b, c) for b in blocks}
    out = {"bf16": _fit_floor([gpu[(_shape(b), b["recipe"])]["bf16_ms"] / 1e3 for b in blocks],
                              [b["bf16_s"] for b in blocks])}
    for recipe in sorted({b["recipe"] for b in blocks}):
        tr = [b for b in blocks if b["recipe"] == recipe]
        out[recipe] = _fit_floor([gpu[(_shape(b), recipe)]["fp8_ms"] / 1e3 for b in tr], [b["fp8_s"] for b in tr])
    return out


def host_floor_candidate(runs: list[dict], c: GemmConstants) -> dict:
    """Leave one shape out: floors fitted on the first run without the shape, checked on the repeat run
    at the shape. MODELLED against MEASURED; the shipped constants are untouched."""
    first, repeat = runs[0], runs[1]
    # blocks: modelled GPU times per row, the variants' floors (bf16 and each recipe)
    gpu = {(_shape(b), b["recipe"]): predict_block_times(b, c) for b in first["blocks"] + repeat["blocks"]}
    shapes = sorted({_shape(b) for b in repeat["blocks"]})
    brows, floors_used = [], {}
    for s in shapes:
        floors = block_floors([b for b in first["blocks"] if _shape(b) != s], c)
        f_bf16 = floors["bf16"]
        for b in (b for b in repeat["blocks"] if _shape(b) == s):
            f8 = floors[b["recipe"]]
            g = gpu[(s, b["recipe"])]
            pred = max(g["bf16_ms"] / 1e3, f_bf16) / max(g["fp8_ms"] / 1e3, f8)
            brows.append({"m": s[0], "k": s[1], "n": s[2], "recipe": b["recipe"], "measured": b["speedup"],
                          "modelled_with_floor": pred, "modelled_shipped": g["speedup"]})
            floors_used[f"{s}"] = {"bf16_s": f_bf16, b["recipe"] + "_s": f8, **floors_used.get(f"{s}", {})}
    # GEMMs: one floor per (precision, recipe)
    grows, gmeas, gpred = [], [], []
    for s in sorted({_shape(r) for r in repeat["gemms"]}):
        fl = {}
        for key in {(r["precision"], r["recipe"]) for r in first["gemms"]}:
            tr = [r for r in first["gemms"] if (r["precision"], r["recipe"]) == key and _shape(r) != s]
            fl[key] = _fit_floor([predict_gemm(r, c) for r in tr], [r["time_s"] for r in tr])
        at = {(r["precision"], r["recipe"]): r for r in repeat["gemms"] if _shape(r) == s}
        for key, r in at.items():
            t = max(predict_gemm(r, c), fl[key])
            gmeas.append(r["time_s"]), gpred.append(t)
            if key[0] == "fp8" and ("bf16", None) in at:
                b = at[("bf16", None)]
                grows.append({"m": s[0], "k": s[1], "n": s[2], "recipe": key[1], "measured": b["time_s"] / r["time_s"],
                              "modelled_with_floor": max(predict_gemm(b, c), fl[("bf16", None)]) / t})
    return {"label": f"MODELLED (candidate host floor, fitted on {first['file']} without the shape) vs MEASURED "
                     f"{repeat['file']} at the shape", "shipped": False, "why_not_shipped": HOST_FLOOR_NOT_SHIPPED,
            "block_speedup": {**metrics([r["measured"] for r in brows], [r["modelled_with_floor"] for r in brows]),
                              **fast_slow([(r["measured"], r["modelled_with_floor"]) for r in brows])},
            "gemm_time": metrics(gmeas, gpred),
            "gemm_fp8_vs_bf16_fast_slow": fast_slow([(r["measured"], r["modelled_with_floor"]) for r in grows]),
            "block_rows": brows, "gemm_pairs": grows, "floors_per_left_out_shape": floors_used}


# (target name, its bar, higher is better, where the value is): one list for every branch, so a run
# without a GPU measurement misses the same targets a run with one reports
CHECKS = (("gemm_time_mape_pct", TARGETS["mape_pct"], False, ("gemm_time", "mape_pct")),
          ("gemm_fp8_vs_bf16_fast_slow_pct", TARGETS["fast_slow_pct"], True, ("gemm_fp8_vs_bf16_fast_slow", "agreement_pct")),
          ("block_speedup_mape_pct", BLOCK_TARGETS["mape_pct"], False, ("block_speedup", "mape_pct")),
          ("block_speedup_fast_slow_pct", BLOCK_TARGETS["fast_slow_pct"], True, ("block_speedup", "agreement_pct")))
SHIPPED = "own GPU measurement, not fitted"
CANDIDATE = "own GPU measurement; candidate host floor, leave one shape out, checked on the repeat run"


def _targets(result: dict | None, suffix: str, label: str, note: str, why_none: str) -> dict:
    out = {}
    for what, bar, higher, (part, key) in CHECKS:
        name = f"{what} ({suffix})"
        if result is None:
            out[name] = {"measured": None, "target": bar, "met": False, "reason": why_none}
            continue
        value, n = result[part][key], result[part]["n"]
        met = meets(value, bar, higher)
        out[name] = {"measured": value, "target": bar, "met": met, "n": n, "label": label, "note": note}
        if not met:
            out[name]["reason"] = f"{value} against {bar} ({'at least' if higher else 'at most'}) over {n} measured points"
    return out


def shipped_check(run: dict, c: GemmConstants) -> dict:
    """The shipped model (fitted on published rows) against one run: GEMM time error, FP8-vs-bf16
    fast/slow per shape, block speedup error and fast/slow."""
    gemms, blocks = run["gemms"], run["blocks"]
    gp = pairs(gemms, c)
    bpred = [predict_block(b, c) for b in blocks]
    return {"gemm_time": metrics([r["time_s"] for r in gemms], [predict_gemm(r, c) for r in gemms]),
            "gemm_fp8_vs_bf16_fast_slow": fast_slow([(p["measured"], p["modelled"]) for p in gp]), "gemm_pairs": gp,
            "block_speedup": {**metrics([b["speedup"] for b in blocks], bpred),
                              **fast_slow([(b["speedup"], p) for b, p in zip(blocks, bpred)])},
            "block_rows": [{**b, "modelled": p} for b, p in zip(blocks, bpred)]}


def own_measurement_check(c: GemmConstants, files: tuple[str, ...] = RUN_FILES) -> dict:
    """The second look: the shipped model on the first run; the runs' own repeatability; the shipped
    model on the fast/slow verdicts the runs agree on; the candidate host floor on the repeat run.
    ``files``: the run and its repeat (another device's, ``OTHER_DEVICE_RUNS``, is checked the same way,
    with that device's datasheet spec)."""
    runs = own_runs(files)
    if not runs:
        why = f"no GPU measurement in results/{files[0]} (experiments/gpu_checks.py runs on a lent GPU)"
        return {"label": None, "targets": _targets(None, SHIPPED, "", "", why) | _targets(None, CANDIDATE, "", "", why)
                | missing_targets(why)}
    first = runs[0]
    lab = f"modelled vs {first['label']} (not fitted)"
    note = (f"{first['file']}; the model's constants were fitted on the published rows only. Shapes whose bf16 block "
            "or GEMM time is near the per-call floor are bound by the host's launch time, which the shipped model "
            "does not price")
    out = {"label": lab, **shipped_check(first, c)}
    # whole training steps with FP8 on one site at a time (gpu_checks' site_steps), floors from the same run's blocks
    floors_ms = {k: v * 1e3 for k, v in block_floors(first["blocks"], c).items()} if first["blocks"] else {}
    out["site_steps"] = site_step_check(first, floors_ms, c)
    steps = out["site_steps"].pop("targets")
    if len(runs) < 2:
        why = (f"one GPU run on record: a repeat (gpu_checks.py --sections fp8,gemms,blocks --out "
               f"{files[-1].removesuffix('.json')}) is needed to check a floor fitted on the first run")
        out["targets"] = _targets(out, SHIPPED, lab, note, "") | _targets(None, CANDIDATE, "", "", why) | steps
        return out
    rep = repeatability(runs)
    verdict = {((r["m"], r["k"], r["n"]), r["recipe"]): r["verdict"] for r in rep["blocks"]["rows"]}
    resolved = [b for b in out["block_rows"] if verdict.get((_shape(b), b["recipe"]), "unresolved") != "unresolved"]
    out["repeatability"] = rep
    out["block_fast_slow_on_resolved_rows"] = {
        **fast_slow([(b["speedup"], b["modelled"]) for b in resolved]),
        "note": "the shipped model on the block rows whose fast/slow verdict the runs agree on (the rest are not "
                "resolved by measurement, so no model can be right or wrong on them)"}
    cand = host_floor_candidate(runs, c)
    out["host_floor_candidate"] = cand
    cand_note = f"{cand['label']}; {HOST_FLOOR_NOT_SHIPPED}"
    out["targets"] = (_targets(out, SHIPPED, lab, note, "") | _targets(cand, CANDIDATE, cand["label"], cand_note, "")
                      | steps)
    return out


def leases_check(c: GemmConstants, leases: tuple[tuple[str, ...], ...]) -> dict:
    """``own_measurement_check`` on each lease of a device (newest first), reported on the newest, each
    target with its value in every lease: one met in one lease and missed in another is not met (a second
    machine start did not confirm it). ``across_leases``: the runs' repeatability and the site steps'
    settled verdicts over every run of every lease."""
    checks = [own_measurement_check(c, files) for files in leases]
    out = checks[0]
    for name, t in out["targets"].items():
        seen = [{"runs": [f"results/{f}" for f in files], "measured": chk["targets"][name]["measured"],
                 "met": chk["targets"][name]["met"]} for files, chk in zip(leases, checks)]
        t["every_lease"] = seen
        if len(seen) > 1 and len({s["met"] for s in seen}) > 1:
            on = {ok: "; ".join(", ".join(s["runs"]) for s in seen if s["met"] == ok) for ok in (True, False)}
            t["met"] = False
            t["reason"] = f"met on {on[True]}, missed on {on[False]}: not confirmed by a second machine start"
    runs = [r for files in leases for r in own_runs(files)]
    if runs:
        across = across_runs(runs, c)
        out["across_leases"] = {"runs": [r["file"] for r in runs], "repeatability": repeatability(runs)
                                if len(runs) > 1 else None, "site_steps": across}
        out["targets"] |= settled_target(across)
    out["earlier_leases"] = [{"runs": [f"results/{f}" for f in files], "label": chk.get("label"),
                              "block_speedup": chk.get("block_speedup"),
                              "block_fast_slow_on_resolved_rows": chk.get("block_fast_slow_on_resolved_rows"),
                              "site_steps": chk.get("site_steps") and {
                                  k: chk["site_steps"][k] for k in ("shipped", "candidate_host_floor")}}
                             for files, chk in zip(leases[1:], checks[1:])]
    return out
