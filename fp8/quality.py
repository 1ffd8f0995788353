"""End-to-end quality check: train N steps with FP8 variants and in full precision from the same
seed, and compare NE and loss on the workload's held-out eval batch."""

from __future__ import annotations

import math
import statistics
import time

from cubic.core.config import Config, FP8Choice
from cubic.core.spec import Workload
from fp8.kernels import Fp8Linear


def train_variant(workload: Workload, fp8: FP8Choice | None, steps: int, seed: int = 0,
                  track_error: bool = False, error_from_step: int = 0, model_hook=None, device: str = "cpu") -> dict:
    """Train ``steps`` steps and evaluate; with ``track_error``, each FP8 site's per-GEMM SQNR
    measured during training (mean over steps from ``error_from_step``) is returned under
    ``site_sqnr_db``. ``model_hook(model)`` may transform the model before training. ``device``:
    where it trains (the FP8 sites run their recipes' kernels for that device)."""
    from cubic.core.train import TrainSession
    from fp8.runtime import apply_fp8

    def transform(model):
        if fp8 is not None and fp8.policy != "off":
            model = apply_fp8(model, fp8, model.workload, track_error=track_error)
        if model_hook is not None:
            model = model_hook(model) or model
        return model

    t0 = time.perf_counter()
    tr = TrainSession(workload, Config(seed=seed), device=device, transform=transform)
    losses = tr.train(steps)
    out = {"steps": len(losses), "train_loss_last10": statistics.fmean(losses[-10:]) if losses else math.nan,
           "finite": all(math.isfinite(v) for v in losses)}
    out.update(tr.evaluate() if out["finite"] else {"loss": math.nan, "ne": math.nan})
    if track_error:
        sites = {}
        for name, mod in tr.model.named_modules():
            if isinstance(mod, Fp8Linear) and mod.error_log is not None:
                logs = {g: v[error_from_step:] for g, v in mod.error_log.sqnr.items()}
                per = {g: statistics.fmean(v) for g, v in logs.items() if v}
                worst = [min(vals) for vals in zip(*[logs[g] for g in per])] if per else []
                sites[name] = {"per_gemm_sqnr_db": per,
                               "sqnr_db": statistics.fmean(worst) if worst else math.nan,
                               "steps": len(worst)}
        out["site_sqnr_db"] = sites
    out["wall_s"] = time.perf_counter() - t0
    return out


def compare(workload: Workload, variants: dict[str, FP8Choice], steps: int, seed: int = 0,
            track_error: bool = False, error_from_step: int = 0, device: str = "cpu") -> dict:
    """Full precision plus each variant, same seed; NE/loss differences relative to full precision."""
    from cubic.core.fingerprint import check_device

    device = str(check_device(device, "device"))
    base = train_variant(workload, None, steps, seed, device=device)
    out = {"full_precision": base}
    for name, choice in variants.items():
        r = train_variant(workload, choice, steps, seed, track_error=track_error, error_from_step=error_from_step,
                          device=device)
        r["ne_rel_diff"] = (r["ne"] - base["ne"]) / base["ne"]
        r["loss_diff"] = r["loss"] - base["loss"]
        out[name] = r
    return out


def paired_check(workload: Workload, variants: dict[str, FP8Choice], steps: int, seeds: list[int],
                 device: str = "cpu") -> dict:
    """:func:`compare` on each seed, and each variant's NE cost relative to full precision over the
    seeds as a paired mean with its Student-t 95% interval (one seed: no interval, ``ci`` None): a
    single seed's difference cannot be told from the seed's own noise."""
    from cubic.core.stats import mean_interval

    runs = [compare(workload, variants, steps, seed=s, device=device) for s in seeds]
    summary = {}
    for name in variants:
        diffs = [r[name]["ne_rel_diff"] for r in runs]
        mean, lo, hi = mean_interval(diffs)
        finite = len(diffs) > 1 and math.isfinite(lo) and math.isfinite(hi)
        summary[name] = {"mean": mean, "ci": [lo, hi] if finite else None, "seeds": len(diffs)}
    return {"source": "measured", "device": device, "workload": workload.name, "steps": steps, "seeds": seeds,
            "ne_rel_diff": summary, "runs": runs}
