"""fp8_benchmark's kernel sections (a library, not a benchmark): Dispatch's quick decision vs an exhaustive
re-measurement (measured, this CPU), the H100 model over a shape grid (modelled), and the Triton kernel's
numerics (measured, interpreter) with its modelled H100 times."""

from __future__ import annotations

import itertools
import statistics

import torch

from cost_models.gpu_gemm import block_speedup
from fp8.dispatch import Dispatcher, slower
from fp8.kernels import KERNELS

DISPATCH_TARGET = 0.95


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
