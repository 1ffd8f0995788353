"""GPU checks, for a machine with CUDA (none was available where this was written): measured.

1. the runner's CUDA path on the default workloads (full precision, and every site in FP8
   tensorwise / rowwise), a few steps each: status, step time, NE;
2. ``torch._scaled_mm`` (tensorwise, rowwise) and bf16 ``torch.mm`` timings over a shape grid
   (M, K, N in 1024..16384), CUDA-event timed, median of repeats;
3. torchao's LN -> Linear -> Sigmoid fwd+bwd block (tensorwise, rowwise, rowwise_with_gw_hp;
   torch.compile), bf16 vs float8, when torchao is installed;
4. the FP8 paths on CUDA (:func:`fp8_checks`, also alone with ``--only-fp8``, ~1 min): the Probe and
   recommend() with ``device="cuda"``, Dispatch's timings of every kernel, cubic's Linear vs
   torchao's Float8Linear per recipe (bf16), a placement exported to torchao and applied, and
   training steps with it and with cubic's runtime; each with a target in ``targets``;
5. whole training steps with FP8 placed one site at a time (:func:`site_step_rows`, torchao's
   export filtered to one Linear; a host-bound and a GPU-bound tower, compiled): what a placement's
   per-site *fast* verdict predicts, seen in the step it changes.

Writes results/gpu_checks.json labelled "measured on <device name>"; experiments/h100_model_fit.py
reads its ``gemms`` and ``blocks`` rows when present. Each check is a section: one that fails is
recorded with its error (``sections``) and the others run; the file is rewritten after each section,
so a run cut off by a lent machine's lease keeps what it measured. ``--budget-s`` bounds the run:
the runner, the torchao blocks and the site steps leave out (and name) what would start after it. Without CUDA it
prints one line ("no CUDA device") and writes a results file that says so (no rows; its target
missed, with why). CUBIC_CODE_VERSION names the commit the tree was copied from (a lent machine's
.git can be a stale copy).

    .venv/bin/python experiments/gpu_checks.py [--quick] [--only-fp8] [--budget-s S] [--sections S,...] [--out NAME]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import re
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

# each check and the keys of the results file it writes (a re-measured section replaces all of them)
SECTION_KEYS = {"fp8": ("fp8", "targets"), "gemms": ("gemms",), "runner": ("runner",),
                "blocks": ("blocks", "blocks_left_out"), "sharding_uvm_caching": ("sharding_uvm_caching",),
                "site_steps": ("site_steps", "site_steps_left_out")}
SECTIONS = tuple(SECTION_KEYS)
GRID = (1024, 4096, 16384)
QUICK_GRID = (1024, 4096)
BLOCK_SHAPES = ((1024, 2048, 1024), (4096, 8192, 16384), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
                (8192, 8192, 8192), (16384, 4096, 1024), (1024, 4096, 16384), (16384, 16384, 16384))


def cuda_time_s(fn, repeats: int = 20, warmup: int = 5, back_to_back: bool = True) -> float:
    """Median seconds per call, timed with CUDA events. ``back_to_back``: each timed window holds
    enough calls in a row (about 1 ms of them, at most 100) that the GPU is fed as in a training step,
    where the next kernel is queued while one runs; else each call is synchronised on its own, which
    adds the host's launch and sync time to every call (what a small shape costs alone)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    inner = 1
    if back_to_back:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        inner = max(1, min(100, math.ceil(1e-3 / max(start.elapsed_time(end) / 1e3, 1e-7))))
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(out)


def _times(fn) -> dict:
    # time_s (calls back to back: the regime of a training step, which the H100 model predicts) and
    # time_s_synced (each call alone), so the host's share at small shapes is on the record
    return {"time_s": cuda_time_s(fn), "time_s_synced": cuda_time_s(fn, back_to_back=False)}


def gemm_rows(grid: tuple[int, ...]) -> list[dict]:
    rows = []
    e4m3 = torch.float8_e4m3fn
    for m, k, n in itertools.product(grid, repeat=3):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        rows.append({"precision": "bf16", "recipe": None, "m": m, "k": k, "n": n, **_times(lambda: torch.mm(a, b.t()))})
        qa, qb = a.to(e4m3), b.to(e4m3)
        one = torch.ones((), device="cuda")
        rows.append({"precision": "fp8", "recipe": "tensorwise", "m": m, "k": k, "n": n,
                     **_times(lambda: torch._scaled_mm(qa, qb.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))})
        sa, sb = torch.ones(m, 1, device="cuda"), torch.ones(1, n, device="cuda")
        rows.append({"precision": "fp8", "recipe": "rowwise", "m": m, "k": k, "n": n,
                     **_times(lambda: torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))})
        del a, b, qa, qb
    return rows


def block_rows(shapes, deadline: float = math.inf) -> dict:
    """torchao's LN -> Linear -> Sigmoid, fwd+bwd, torch.compile, bf16 vs each float8 recipe:
    ``{"blocks": rows, "blocks_left_out": shapes}``; a shape that would start past ``deadline``
    (time.monotonic) is left out and named, not measured."""
    if importlib.util.find_spec("torchao") is None:
        return {"blocks": [], "blocks_left_out": [list(s) for s in shapes]}
    import copy

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    class LNLinearSigmoid(torch.nn.Module):
        def __init__(self, k: int, n: int):
            super().__init__()
            self.ln = torch.nn.LayerNorm(k, elementwise_affine=False)
            self.fc = torch.nn.Linear(k, n, bias=False)

        def forward(self, x):
            return torch.sigmoid(self.fc(self.ln(x)))

    rows, left_out = [], []
    for m, k, n in shapes:
        if time.monotonic() > deadline:
            left_out.append([m, k, n])
            continue
        base = LNLinearSigmoid(k, n).cuda().bfloat16()
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        go = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)

        def step(model):
            return lambda: model(x).backward(go)

        def compiled(model):
            # every shape and recipe compiles the one forward afresh: past dynamo's recompile limit (8)
            # it would run eager without a word, and the row would time the wrong thing
            torch._dynamo.reset()
            return torch.compile(model)

        t_bf16 = _times(step(compiled(copy.deepcopy(base))))
        for recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
            model = convert_to_float8_training(copy.deepcopy(base), config=Float8LinearConfig.from_recipe_name(recipe))
            t = _times(step(compiled(model)))
            rows.append({"block": "LNLinearSigmoid", "recipe": recipe, "mode": "compile", "m": m, "k": k, "n": n,
                         "bf16_s": t_bf16["time_s"], "fp8_s": t["time_s"], "speedup": t_bf16["time_s"] / t["time_s"],
                         "bf16_s_synced": t_bf16["time_s_synced"], "fp8_s_synced": t["time_s_synced"],
                         "speedup_synced": t_bf16["time_s_synced"] / t["time_s_synced"]})
    return {"blocks": rows, "blocks_left_out": left_out}


# whole training steps with FP8 placed one site at a time: a tower at dlrm-small's scale (bound by the
# host on an H100) and one at production scale (bound by the GPU); (batch, widths): sites are the Linears
SITE_TOWERS = {"small": (2048, (512, 512, 256, 128)), "large": (8192, (2048, 8192, 8192, 2048))}
SITE_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")


def _site_tower(widths: tuple[int, ...]) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i, (k, n) in enumerate(zip(widths, widths[1:])):
        layers.append(torch.nn.Linear(k, n, bias=False))
        if i < len(widths) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def site_step_rows(deadline: float = math.inf, device: str = "cuda", towers: dict = SITE_TOWERS,
                   recipes: tuple[str, ...] = SITE_RECIPES, compile: bool = True, timer=None) -> dict:
    """Whole training steps (forward, backward, SGD step; torch.compile) of each tower in bf16, with
    one site in FP8 (torchao's ``convert_to_float8_training`` filtered to that Linear), and with every
    site in FP8, per recipe: what a placement changes in the step, the second look at the per-site
    *fast* verdict that blocks timed alone cannot give. bf16 is timed before and after each recipe's
    variants, so the step's own drift is on the record. A variant that would start past ``deadline``
    is left out and named. ``{"site_steps": rows, "site_steps_left_out": [...]}``; MEASURED."""
    import copy

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    timer = timer or _times
    rows, left_out = [], []
    for recipe in recipes:
        for tower, (batch, widths) in towers.items():
            torch.manual_seed(0)
            base = _site_tower(widths).to(device=device, dtype=torch.bfloat16)
            x = torch.randn(batch, widths[0], device=device, dtype=torch.bfloat16)
            sites = [str(i) for i, mod in enumerate(base) if isinstance(mod, torch.nn.Linear)]
            variants = [("bf16", None)] + [("site", s) for s in sites] + [("all", None), ("bf16_again", None)]
            for kind, site in variants:
                if time.monotonic() > deadline:
                    left_out.append({"tower": tower, "recipe": recipe, "variant": kind, "site": site})
                    continue
                model = copy.deepcopy(base)
                if kind in ("site", "all"):
                    model = convert_to_float8_training(
                        model, config=Float8LinearConfig.from_recipe_name(recipe),
                        module_filter_fn=lambda mod, fqn, site=site: site is None or fqn == site)
                opt = torch.optim.SGD(model.parameters(), lr=1e-4)
                if compile:
                    torch._dynamo.reset()  # each variant compiles afresh (dynamo's recompile limit, as in blocks)
                    fwd = torch.compile(model)
                else:
                    fwd = model

                def step(fwd=fwd, opt=opt):
                    fwd(x).float().square().mean().backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                lin = base[int(site)] if site is not None else None
                rows.append({"tower": tower, "batch": batch, "widths": list(widths), "recipe": recipe,
                             "variant": kind, "site": site,
                             "m": batch if lin is not None else None, "k": lin.in_features if lin is not None else None,
                             "n": lin.out_features if lin is not None else None,
                             "act_after": ("relu" if site is not None and int(site) < len(base) - 1 else None),
                             # what torchao converted, so a row cannot claim a placement it did not run
                             "converted": [f for f, mod in model.named_modules() if type(mod).__name__ == "Float8Linear"],
                             **{k.replace("time", "step"): v for k, v in timer(step).items()}})
                del model, opt, fwd
    return {"site_steps": rows, "site_steps_left_out": left_out}


def fp8_tower():
    """The FP8 checks' model: a 4-layer tower, dims multiples of 16 (the CUDA FP8 GEMM's rule)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16))
    g = torch.Generator().manual_seed(1)

    def batch(step):
        x = torch.randn(256, 64, generator=g)
        return x, (x[:, :16] > 0).float()

    return model, batch


def fp8_checks(device: str = "cuda", quick: bool = False) -> dict:
    """The FP8 paths on ``device`` (measured): the Probe and recommend(), Dispatch's timings, cubic's
    Linear against torchao's Float8Linear per recipe, the torchao export applied and trained, and a
    training step with cubic's runtime. Returns ``{"rows": {...}, "targets": {...}}``."""
    import warnings

    from torch import nn

    from fp8.dispatch import Dispatcher
    from fp8.kernels import default_kernel
    from fp8.placement import parse_placement
    from fp8.recommend import probe_module, recommend
    from fp8.runtime import apply_placement

    warnings.filterwarnings("ignore", message=".*Enum subclass.*")
    dev = torch.device(device)
    rows: dict = {"device": str(dev)}
    targets: dict = {}
    # 1. Probe + recommend on the device
    probe = probe_module("experiments.gpu_checks:fp8_tower", loss="bce", max_batches=4 if quick else 8, device=device)
    disp = Dispatcher(device=device, repeats=3 if quick else 7)
    placement = recommend(None, 20.0, probe=probe, label="fp8_tower", require_fast=False, dispatcher=disp,
                          device=device)
    rows["probe"] = {"probe_device": placement.probe_device, "sites": len(placement.sites),
                     "fp8_sites": placement.module_filter,
                     "verdicts": {n: [s.verdict_recipe, s.verdict] for n, s in placement.sites.items()},
                     "kernels": {n: s.kernel for n, s in placement.fp8_sites().items()}}
    targets["Probe and recommend() ran on the device"] = {
        "measured": placement.probe_device, "target": str(dev), "met": placement.probe_device == str(dev),
        "reason": f"the placement records probe device {placement.probe_device}"}
    # 2. Dispatch: every kernel timed (or why not) on the device
    shape = (256, 256, 256) if quick else (1024, 1024, 1024)
    times = disp.times(*shape)
    rows["dispatch"] = {"shape": list(shape), "times_ms": times, "unavailable": disp.unavailable(*shape)}
    real = [k for k in ("scaled_mm_tensorwise", "scaled_mm_rowwise", "scaled_mm_rowwise_with_gw_hp") if k in times]
    targets["Dispatch timed the real FP8 kernels of the three torchao recipes"] = {
        "measured": real, "target": 3, "met": len(real) == 3,
        "reason": f"kernels not available here: {rows['dispatch']['unavailable']}"}
    # 3. one Linear, cubic vs torchao Float8Linear, bf16 (a job's dtype): the one parity check (fp8.torchao_parity)
    from fp8.torchao_parity import torchao_parity

    par = torchao_parity(device=str(dev), dtypes=("bf16",), real=(True,), shape=(256, 128, 64), seed=2)
    rows["torchao_parity"] = par["per_recipe"]
    worst = max(v for p in par["per_recipe"].values() for v in p["rel_diff"].values())
    bar = par["target"]["max_rel_diff"]
    parity = {"measured": worst, "target": bar, "met": par["met"], "rule": par["target"],
              "reason": f"worst relative difference {worst:.3g} above {bar}"}
    # met by the rule's bound where the paths differ (fp8.torchao_parity.TARGETS), not by equality
    if par["met"] and worst > bar:
        parity["note"] = f"{worst:.3g} above {bar}, within the rule's bound: {par['target'].get('where_paths_differ')}"
    targets["cubic's Linear vs torchao's Float8Linear (worst relative difference of y, dx, dw, db; bf16)"] = parity
    # 4 + 5. a placement with the three recipes, applied by torchao (export) and by cubic's runtime, trained
    from fp8.torchao_export import apply_placement_torchao

    def site(kk, nn_, recipe=None):
        return {"m": 256, "k": kk, "n": nn_, "recipe": recipe, "reason": None if recipe else "kept",
                "kernel": default_kernel(recipe, dev, (256, kk, nn_)).name if recipe else None}

    doc = {"workload": "fp8_tower", "sites": {"0": site(64, 256), "2": site(256, 256, "rowwise"),
                                             "4": site(256, 128, "rowwise_with_gw_hp"), "6": site(128, 16, "tensorwise")}}
    doc["module_filter"] = ["2", "4", "6"]
    pl = parse_placement(doc)
    losses = {}
    for how in ("torchao_export", "cubic_runtime"):
        model, batch = fp8_tower()
        model = model.to(dev)
        if how == "torchao_export":
            apply_placement_torchao(model, pl)
            converted = sorted(nm for nm, mod in model.named_modules() if type(mod).__name__ == "Float8Linear")
            rows["export_converted"] = converted
            targets["torchao export converts exactly the placement's sites"] = {
                "measured": converted, "target": pl.module_filter, "met": converted == pl.module_filter,
                "reason": f"torchao converted {converted}, the placement names {pl.module_filter}"}
        else:
            apply_placement(model, pl)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        trace = []
        for i in range(3 if quick else 10):
            xb, yb = (t.to(dev) for t in batch(i))
            loss = nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            trace.append(float(loss))
        losses[how] = trace
    rows["training_losses"] = losses
    finite = all(math.isfinite(v) for t in losses.values() for v in t)
    targets["training steps in FP8 (torchao export and cubic's runtime) stay finite"] = {
        "measured": finite, "target": True, "met": finite, "reason": f"losses {losses}"}
    for t in targets.values():  # each reason above is written for the miss; a met target carries none
        if t["met"]:
            t.pop("reason")
    return {"rows": rows, "targets": targets}


def runner_rows(steps: int, device: str = "cuda", deadline: float = math.inf) -> list[dict]:
    """The runner on ``device`` over the default workloads, full precision and every site in FP8; a run
    that would start past ``deadline`` (time.monotonic) is a row that says so, not a measurement."""
    from cubic.core.config import Config, FP8Choice
    from cubic.core.workloads import DEFAULT_WORKLOADS
    from cubic.runners.local import LocalRunner

    out = []
    runner = LocalRunner(device=device)
    for name, w in DEFAULT_WORKLOADS.items():
        for label, fp8 in (("full_precision", FP8Choice()), ("all_tensorwise", FP8Choice(policy="all")),
                           ("all_rowwise", FP8Choice(policy="all", recipe="rowwise"))):
            if time.monotonic() > deadline:
                out.append({"workload": name, "variant": label, "status": "not run", "reason": "past the time budget"})
                continue
            r = runner.run(w, Config(fp8=fp8), steps=steps, warmup=2)
            out.append({"workload": name, "variant": label, "status": r.status, "failure_kind": r.failure_kind,
                        "reason": r.reason, "metrics": r.metrics})
    return out


def sharding_rows(steps: int = 20) -> list[dict]:
    """UVM caching on a real GPU (issue 23): FBGEMM's TBE with EmbeddingLocation.MANAGED_CACHING at
    cubic's cache load factors, Zipf ids from the table's access law; the measured cache statistics
    beside sharding.kernels.zipf_hit_rate (MODELLED) and the step time beside an all-HBM table.
    A failure is a row with its reason (data), never a crash of the other checks."""
    import numpy as np

    from cubic.core.spec import Table
    from sharding.kernels import zipf_hit_rate
    from sharding.measure import ShardWork, shard_inputs

    out = []
    for rows, dim, alpha, lf in ((2_000_000, 64, 1.1, 0.05), (2_000_000, 64, 1.1, 0.2), (2_000_000, 128, 0.8, 0.2)):
        row = {"rows": rows, "dim": dim, "zipf_alpha": alpha, "cache_load_factor": lf}
        try:
            from fbgemm_gpu.split_embedding_configs import EmbOptimType
            from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
            from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
                ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)

            t = Table(name="t", rows=rows, dim=dim, pooling_factor=20.0, access={"zipf_alpha": alpha})
            rng = np.random.default_rng(0)
            batches = []
            for _ in range(steps):
                ids, lens = shard_inputs(ShardWork(t, 0, rows, dim), 4096, rng)
                offs = np.concatenate([[0], np.cumsum(lens)])
                batches.append((torch.from_numpy(ids).long().cuda(), torch.from_numpy(offs).long().cuda()))
            times = {}
            for loc in ("MANAGED_CACHING", "DEVICE"):
                tbe = SplitTableBatchedEmbeddingBagsCodegen(
                    [(rows, dim, getattr(EmbeddingLocation, loc), ComputeDevice.CUDA)],
                    optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01, pooling_mode=PoolingMode.SUM,
                    device=torch.device("cuda"), cache_load_factor=lf, gather_uvm_cache_stats=loc == "MANAGED_CACHING")
                it = iter(range(10 ** 9))

                def step():
                    i, o = batches[next(it) % len(batches)]
                    tbe(i, o).sum().backward()

                times[loc] = cuda_time_s(step, repeats=steps, warmup=3)
                if loc == "MANAGED_CACHING":
                    stats = tbe.get_uvm_cache_stats().tolist()
                    # [calls, requested indices, unique indices, unique misses, conflict unique misses, conflict misses]
                    row["uvm_cache_stats"] = stats
                    row["measured_unique_miss_share"] = stats[3] / max(stats[2], 1)
                del tbe
            row.update({"modelled_hit_rate": zipf_hit_rate(t, lf), "caching_step_s": times["MANAGED_CACHING"],
                        "hbm_step_s": times["DEVICE"], "slowdown": times["MANAGED_CACHING"] / times["DEVICE"],
                        "label": "measured on the GPU; modelled_hit_rate from sharding.kernels"})
        except Exception as e:  # noqa: BLE001  (a failed check is data)
            row["failed"] = f"{type(e).__name__}: {e}"[:500]
        out.append(row)
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller shape grid and fewer runner steps")
    ap.add_argument("--only-fp8", action="store_true",
                    help="only the FP8 checks (Probe, Dispatch, torchao parity and export, training steps)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="seconds the whole run may take (a lent GPU's time is short): the runner's runs and "
                         "the torchao block shapes that would start after it are left out, and named")
    ap.add_argument("--sections", default=None,
                    help=f"comma-separated subset of {','.join(SECTIONS)}: measure only these and replace them in "
                         "the results file of an earlier run on the same device (each section records the commit "
                         "and time that measured it)")
    ap.add_argument("--out", default=None,
                    help="results file name under results/ (default gpu_checks, or gpu_checks_fp8 with --only-fp8): "
                         "a repeat run on another name keeps the first run's record as it was")
    return ap


def main() -> int:
    args = _parser().parse_args()
    from experiments.common import RESULTS, run_context, write_result

    chosen = SECTIONS if args.sections is None else tuple(x.strip() for x in args.sections.split(","))
    if args.only_fp8:
        chosen = ("fp8",)
    bad = [x for x in chosen if x not in SECTIONS]
    if bad:
        print(f"gpu_checks.py: --sections: unknown {bad}; choose from {','.join(SECTIONS)}", file=sys.stderr)
        return 2
    if args.out is not None and not re.fullmatch(r"[A-Za-z0-9_-]+", args.out):
        print(f"gpu_checks.py: --out: {args.out!r} is not a plain file name (letters, digits, _ and - only)",
              file=sys.stderr)
        return 2

    if not torch.cuda.is_available():
        # the run itself is the record: no GPU figures, and the targets say so (h100_model_fit reads no rows)
        why = "no CUDA device on this machine: nothing measured on a GPU; the H100 figures stay modelled"
        out = write_result("gpu_checks", {
            "context": run_context("none (no CUDA device)"), "label": "not run on a GPU", "device": None,
            "gemms": [], "blocks": [], "runner": [], "fp8": {"skipped": why},
            "targets": {"GPU checks measured on a lent GPU": {"measured": False, "target": True, "met": False,
                                                               "reason": why}}})
        print(f"no CUDA device; wrote {out}")
        return 0

    started = time.monotonic()
    deadline = started + args.budget_s if args.budget_s else math.inf
    name = torch.cuda.get_device_name(0)
    result = args.out or ("gpu_checks" + ("_fp8" if args.only_fp8 else ""))
    context = run_context("measured")
    payload: dict = {"context": context, "label": f"measured on {name}", "device": name,
                     "capability": list(torch.cuda.get_device_capability(0)), "torch": torch.__version__,
                     "torchao": context["versions"].get("torchao"), "sections": {}, "fp8": {}, "targets": {}}
    earlier = RESULTS / f"{result}.json"
    if args.sections is not None and earlier.is_file():
        doc = json.loads(earlier.read_text())
        if doc.get("device") == name:  # the other sections stay as that run measured them
            payload = {**doc, **{k: payload[k] for k in ("context", "torch", "torchao")}}
    if "fp8" not in chosen and not payload["targets"]:
        # a file without the FP8 section says so in its targets (the benchmark convention wants one)
        payload["targets"] = {"the FP8 checks ran on the device": {
            "measured": False, "target": True, "met": False,
            "reason": f"not among --sections {args.sections} in this run (results/{result}.json)"}}

    def section(what: str, fn) -> None:
        # each check is a section of its own: one that fails is recorded (data) and the others still run,
        # and the file is rewritten after each, so a run cut off by the lease keeps what it measured
        t0 = time.monotonic()
        stamp = {"code_version": context["code_version"], "started_at": context["started_at"]}
        for key in SECTION_KEYS[what]:  # nothing of an earlier run's section outlives its re-measurement
            payload[key] = {} if key in ("fp8", "targets") else []
        try:
            fn()
            payload["sections"][what] = {"status": "ok", "seconds": round(time.monotonic() - t0, 1), **stamp}
        except Exception as e:  # noqa: BLE001  (a failed check is data)
            payload["sections"][what] = {"status": "failed", "seconds": round(time.monotonic() - t0, 1), **stamp,
                                         "error": f"{type(e).__name__}: {e}"[:500],
                                         "traceback": traceback.format_exc()[-2000:]}
            if what == "fp8":
                payload["targets"]["the FP8 checks ran on the device"] = {
                    "measured": False, "target": True, "met": False, "reason": payload["sections"][what]["error"]}
        print(f"{what}: {payload['sections'][what]['status']} in {payload['sections'][what]['seconds']} s",
              flush=True)
        for k in ("finished_at", "loadavg_1m_at_end"):
            payload.pop(k, None)
        write_result(result, payload)

    def fp8() -> None:
        out = fp8_checks("cuda", args.quick)
        payload["fp8"], payload["targets"] = out["rows"], out["targets"]

    checks = {
        "fp8": fp8,
        "gemms": lambda: payload.__setitem__("gemms", gemm_rows(QUICK_GRID if args.quick else GRID)),
        # the runner may use up to half of what is left, the torchao blocks the rest
        "runner": lambda: payload.__setitem__("runner", runner_rows(
            5 if args.quick else 20, deadline=time.monotonic() + (deadline - time.monotonic()) / 2)),
        "blocks": lambda: payload.update(block_rows(BLOCK_SHAPES[:2] if args.quick else BLOCK_SHAPES, deadline)),
        "sharding_uvm_caching": lambda: payload.__setitem__("sharding_uvm_caching",
                                                            sharding_rows(5 if args.quick else 20)),
        "site_steps": lambda: payload.update(site_step_rows(deadline)),
    }
    for what in SECTIONS:
        if what in chosen:
            section(what, checks[what])
    for what, t in payload["targets"].items():
        print(f"{'met   ' if t['met'] else 'MISSED'} {what}: {t['measured']}")
    print(f"wrote results/{result}.json ({payload['label']}) in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
