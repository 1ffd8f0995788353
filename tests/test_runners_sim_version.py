"""Simulated trials are keyed by ``STEP_MODEL_VERSION`` (cubic.runners.sim: it is in the simulated
runner's fingerprint), so a store serves a simulated configuration's stored figures for as long as the
version stands. A change to the step model's physics without a bump is served the old physics' figures
without a word: stop 70's site names and stop 71's norms moved predictions at version 2, and
search_benchmark's store served the old ones. These pins make the bump part of the change: the
predictions of a few fixed cases are pinned with the version they were made at; a change that moves
them fails here until the version is bumped and the pins rewritten::

    python tests/test_runners_sim_version.py --write
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


PINS = Path(__file__).with_name("step_model_pins.json")


def _cases() -> dict[str, dict[str, float]]:
    from cost_models.hardware import CLUSTERS
    from cubic.core.config import Config, FP8Choice, Kernels, ShardingChoice
    from cubic.core.workloads import DEFAULT_WORKLOADS
    from cubic.runners.step_model import predict_step

    bf16 = Kernels(dense_dtype="bf16")
    configs = {"bf16": Config(kernels=bf16, sharding=ShardingChoice(planner="sim")),
               "fp8-rowwise": Config(kernels=bf16, sharding=ShardingChoice(planner="sim"),
                                     fp8=FP8Choice(policy="all", recipe="rowwise")),
               "fp32-2d": Config(sharding=ShardingChoice(planner="sim", group_size=4))}
    cases = [(wname, w, 64 if wname == "wukong-large" else 8, cname, c)
             for wname, w in sorted(DEFAULT_WORKLOADS.items()) for cname, c in configs.items()]
    # the paths the grid above does not reach: a placement (every other linear site of wukong-small in FP8,
    # batched projections split) and 2D weight averaging or per-step gradient sync across replicas on another node
    from fp8.runtime import workload_linear_sites

    w = DEFAULT_WORKLOADS["wukong-small"]
    sites = {n: {"m": 64, "k": m.in_features, "n": m.out_features, "recipe": "rowwise", "kernel": "scaled_mm_rowwise"}
             for n, m in list(workload_linear_sites(w).items())[::2]}
    doc = {"version": 1, "workload": w.name, "sites": sites, "module_filter": sorted(sites)}
    cases.append(("wukong-small", w, 8, "placement", configs["bf16"].model_copy(
        update={"fp8": FP8Choice(policy="placement", placement=doc)})))
    cases.append(("dlrm-wide", DEFAULT_WORKLOADS["dlrm-wide"], 64, "weights-sync-2d", Config(
        kernels=bf16, sharding=ShardingChoice(planner="sim", group_size=8, sync="weights", sync_interval=10))))
    cases.append(("dlrm-wide", DEFAULT_WORKLOADS["dlrm-wide"], 64, "gradients-sync-2d", Config(
        kernels=bf16, sharding=ShardingChoice(planner="sim", group_size=8, sync="gradients"))))
    cases = [(*c, "h100") for c in cases]
    # other clusters, recipes, batches and scales: a change confined to one of them moves a pin too
    cases += [
        ("dmt-small", DEFAULT_WORKLOADS["dmt-small"], 16, "bf16", configs["bf16"], "a100"),
        ("dmt-small", DEFAULT_WORKLOADS["dmt-small"], 16, "fp8-tensorwise", Config(
            kernels=bf16, sharding=ShardingChoice(planner="sim"), fp8=FP8Choice(policy="all", recipe="tensorwise")),
         "h200"),
        ("wukong-large", DEFAULT_WORKLOADS["wukong-large"], 512, "2d-g32", Config(
            kernels=bf16, sharding=ShardingChoice(planner="sim", group_size=32)), "h200"),
        ("wukong-large", DEFAULT_WORKLOADS["wukong-large"], 8, "bf16-oom", configs["bf16"], "h100"),
        ("dlrm-small", DEFAULT_WORKLOADS["dlrm-small"], 8, "batch-4096", Config(
            kernels=bf16, batch_size=4096, sharding=ShardingChoice(planner="sim")), "h100"),
    ]
    out = {}
    for wname, w, gpus, cname, c, cluster in cases:
        p = predict_step(w, c, CLUSTERS[cluster], gpus)
        out[f"{wname}@{cluster}x{gpus}/{cname}"] = {"step_s": p.step_s, "peak_mem_bytes": p.peak_mem_bytes}
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6)  # an OOM's step is NaN


def test_a_change_to_the_step_models_predictions_bumps_its_version():
    from cubic.runners.sim import STEP_MODEL_VERSION

    pins = json.loads(PINS.read_text())
    assert pins["step_model_version"] == STEP_MODEL_VERSION, (
        f"STEP_MODEL_VERSION is {STEP_MODEL_VERSION}, the pins are version {pins['step_model_version']}'s: "
        f"rewrite them (python {Path(__file__).relative_to(PINS.parent.parent)} --write)")
    now = _cases()
    assert set(now) == set(pins["cases"])
    moved = [f"{case} {k}: {pins['cases'][case][k]!r} -> {v!r}" for case, figs in now.items()
             for k, v in figs.items() if not _same(v, pins["cases"][case][k])]
    assert not moved, ("the step model's predictions moved at the same STEP_MODEL_VERSION (a store would serve "
                       "the old figures under it): bump it in cubic/runners/sim.py and rewrite the pins; "
                       + "; ".join(moved))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/test_runners_sim_version.py --write")
    sys.path.insert(0, str(PINS.parent.parent))
    from cubic.runners.sim import STEP_MODEL_VERSION

    PINS.write_text(json.dumps({"step_model_version": STEP_MODEL_VERSION, "cases": _cases()}, indent=1) + "\n")
    print(f"wrote {PINS} at STEP_MODEL_VERSION {STEP_MODEL_VERSION}")
