"""Where does an FP8 placement's NE cost come from? Per GEMM role, and at training or at evaluation.

fp8_benchmark found wukong-small's placement under the SQNR rule alone (3 of 20 sites, each >= 24 dB,
together >= 24 dB) measurably worse than full precision; the held-out NE check (fp8.probe.ne_cost)
now keeps one of them, ``layers.0.lcb.proj``, out of the recommendation. This takes the SQNR-only
placement's sites from ``results/fp8_benchmark.json`` (``sqnr_only_sites``) and trains wukong-small
with FP8 (rowwise, real ``torch._scaled_mm``) on only some of their GEMMs, bf16 on the rest
(MEASURED on this CPU, paired seeds):

- ``fwd_gi``: forward and grad-input in FP8, grad-weight bf16 (the placement's rowwise_with_gw_hp);
- ``fwd_only``: only the forward GEMM in FP8;
- ``gi_only``: only the grad-input GEMM (the gradient that reaches the embedding tables) in FP8.

Every trained model is evaluated twice on the same 65,536-example eval batch: as trained (its FP8
forward also at evaluation, as a torchao Float8Linear model evaluates) and with its sites switched to
fp32 for the evaluation only (the weights FP8 training produced, served in high precision). The
difference says whether the cost is in the weights or in the evaluation's rounding.

    .venv/bin/python experiments/fp8_gemm_attribution.py [--seeds 20] [--workers 2] [--quick]

Writes results/fp8_gemm_attribution.json and .png (~10 min on 2 quiet cores).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from experiments.common import png_path, run_context, write_result  # noqa: E402
from experiments.common import ci_text  # noqa: E402
from experiments._fp8_quality import NE_TARGET, paired, with_eval_batch  # noqa: E402

WORKLOAD, STEPS, FIRST_SEED = "wukong-small", 150, 1000  # seeds apart from fp8_benchmark's 0..59
ROLES = {"fwd_gi": ("fwd", "grad_input"), "fwd_only": ("fwd",), "gi_only": ("grad_input",)}


class RoleKernel:
    """Rowwise FP8 on some of a linear's three GEMMs, bf16 on the others (``Fp8Linear`` calls
    ``gemm(a, b, fmt_a, fmt_b, role=...)``; an experiment-only stand-in for a registry kernel)."""

    def __init__(self, fp8_roles: tuple[str, ...]):
        self.fp8_roles, self.name = fp8_roles, "rowwise on " + "+".join(fp8_roles)

    def gemm(self, a, b, fmt_a="e4m3", fmt_b="e4m3", role="fwd", hp="bf16"):
        from fp8.recipes import role_matmul, scaled_matmul

        if role in self.fp8_roles:
            return scaled_matmul(a, b, "rowwise", fmt_a, fmt_b, real=True)
        return role_matmul(a, b, hp)


def _run(task: tuple) -> tuple:
    variant, seed, sites, eval_batch = task
    torch.set_num_threads(1)
    from cubic.core.config import Config
    from cubic.core.train import TrainSession
    from cubic.core.workloads import load_workload
    from fp8.kernels import KERNELS, swap_linears

    w = with_eval_batch(load_workload(WORKLOAD), eval_batch)

    def transform(model):
        if variant != "full_precision":
            swap_linears(model, {s: "bf16" for s in sites})
            mods = dict(model.named_modules())
            for s in sites:
                mods[s].kernel = RoleKernel(ROLES[variant])
        return model

    tr = TrainSession(w, Config(seed=seed), transform=transform)
    tr.train(STEPS)
    out = {"ne": tr.evaluate()["ne"]}
    if variant != "full_precision":
        mods = dict(tr.model.named_modules())
        for s in sites:
            mods[s].kernel = KERNELS["fp32"]
        out["ne_eval_fp32"] = tr.evaluate()["ne"]
    return variant, seed, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--eval-batch", type=int, default=65536)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 seeds, a 4,096-example eval batch")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.eval_batch = 2, 4096
    if args.seeds < 2 or args.workers < 1:
        ap.error("--seeds must be >= 2 and --workers >= 1")
    bench = json.loads((Path(__file__).resolve().parent.parent / "results" / "fp8_benchmark.json").read_text())
    q = next(x for x in bench["quality"] if x["workload"] == WORKLOAD)
    sites = q["sqnr_only_sites"]  # the placement whose cost this explains (the recommendation before the NE check)
    ctx = run_context("measured")
    t0 = time.perf_counter()
    seeds = range(FIRST_SEED, FIRST_SEED + args.seeds)
    tasks = [(v, s, sites, args.eval_batch) for s in seeds for v in ("full_precision", *ROLES)]
    with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
        results = list(pool.map(_run, tasks))
    ne: dict[str, dict[int, dict]] = {}
    for v, s, r in results:
        ne.setdefault(v, {})[s] = r
    base = ne["full_precision"]
    rows = {}
    for v in ROLES:
        rows[v] = {
            "fp8_roles": list(ROLES[v]),
            "eval_as_trained": paired([ne[v][s]["ne"] / base[s]["ne"] - 1 for s in seeds]),
            "eval_fp32": paired([ne[v][s]["ne_eval_fp32"] / base[s]["ne"] - 1 for s in seeds]),
        }
        for k in ("eval_as_trained", "eval_fp32"):
            st = rows[v][k]
            print(f"{v:9s} {k:16s} NE vs full precision {100 * st['mean']:+.3f}%, {ci_text(st)} (measured)")
    fwd, gi = rows["fwd_only"]["eval_as_trained"], rows["gi_only"]["eval_as_trained"]
    rec_hp = rows["fwd_gi"]["eval_fp32"]
    attributed = bool((not fwd["ci_includes_zero"] and gi["ci_inside_target"])
                      or (not gi["ci_includes_zero"] and fwd["ci_inside_target"]))
    targets = {
        "the placement's cost is attributed to one GEMM role (its CI excludes 0, the other's lies inside +-0.1%)": {
            "measured": attributed, "target": True, "met": attributed, "label": "measured on this CPU"},
        "the placement's trained weights, evaluated in fp32, within +-0.1% of full precision (95% CI)": {
            "measured": max(abs(rec_hp["ci95"][0]), abs(rec_hp["ci95"][1])), "target": NE_TARGET,
            "met": bool(rec_hp["ci_inside_target"]), "label": "measured on this CPU"},
    }
    reasons = [f"forward only {ci_text(fwd)}, grad-input only {ci_text(gi)}: neither role's cost is resolved "
               f"against the other's at this many seeds",
               f"the placement's weights evaluated in fp32: {ci_text(rec_hp)} (as trained, FP8 forward at "
               f"evaluation: {ci_text(rows['fwd_gi']['eval_as_trained'])})"]
    for (k, t), why in zip(targets.items(), reasons):
        if not t["met"]:
            t["reason"] = why
    payload = {
        "context": ctx, "label": "measured on this CPU (FP8 numerics via torch._scaled_mm rowwise)",
        "what": __doc__.split("\n\n")[1].replace("\n", " "),
        "workload": WORKLOAD, "steps": STEPS, "sites": sites, "seeds": list(seeds), "eval_batch": args.eval_batch,
        "source_placement": "results/fp8_benchmark.json (quality[wukong-small].sqnr_only_sites)",
        "variants": rows, "targets": targets, "wall_s": time.perf_counter() - t0,
        "loadavg_1m_at_end": os.getloadavg()[0],
    }
    name = "fp8_gemm_attribution" + ("_quick" if args.quick else "")
    payload["quick"] = args.quick
    path = write_result(name, payload)
    _plot(rows, png_path(name))
    print(f"wrote {path}")
    for k, t in targets.items():
        print(f"  [{'met' if t['met'] else 'MISSED'}] {k}: {t['measured']}")


def _plot(rows: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for j, k in enumerate(("eval_as_trained", "eval_fp32")):
        xs = [i + 0.38 * j for i in range(len(rows))]
        st = [rows[v][k] for v in rows]
        ax.bar(xs, [100 * s["mean"] for s in st], 0.36,
               yerr=[[100 * (s["mean"] - s["ci95"][0]) for s in st], [100 * (s["ci95"][1] - s["mean"]) for s in st]],
               capsize=3, label=k.replace("_", " "))
    ax.axhline(100 * NE_TARGET, color="k", ls="--", lw=1)
    ax.axhline(-100 * NE_TARGET, color="k", ls="--", lw=1)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xticks([i + 0.19 for i in range(len(rows))], list(rows))
    ax.set_ylabel("NE vs full precision (% rel), paired seeds, 95% CI")
    ax.set_title(f"{WORKLOAD}: FP8 GEMM roles of the SQNR-only placement's sites (measured, this CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
