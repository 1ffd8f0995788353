"""Placement documents: which sites run in FP8 (recipe, kernel), with the error and speed evidence.

Schema (JSON, ``version`` 1)::

    {
      "version": 1,
      "workload": "wukong-small", "workload_hash": "...",
      "budget_sqnr_db": 25.0,            # a site is safe when its SQNR lower bound meets this
      "budget_scope": "model",           # "model": the FP8 sites' noise powers together meet it too
                                         # ("site": each site on its own; documents without the field)
      "model_sqnr_db": 25.3,             # the FP8 sites' combined SQNR lower bound (modelled: noise
                                         # powers 10^(-dB/10) add); null when no site is in FP8
      "budget_ne_rel": 0.0002,           # a site is safe only when the upper end of its held-out NE
                                         # cost's interval meets this too (with scope "model": the FP8
                                         # sites together, measured together); null: not checked
      "model_ne_rel": {"mean", "ci_low", "ci_high", "examples"},
                                         # the FP8 sites' held-out NE cost, measured together (forward
                                         # only, on the Probe's trained model); null when not measured
      "target_device": "h100",           # device of the speed prediction (modelled)
      "probe_device": "cpu",             # device the kernels were timed on (measured)
      "require_fast": true,              # FP8 only where also predicted faster on the target
      "probe": {"batches": 12, "ci_halfwidth_db": 0.5, "confidence": 0.95, "warmup_steps": 30},
      "sites": {
        "<module name>": {
          "m": 512, "k": 256, "n": 256, "norm_before": false, "act_after": null,
          "recipe": "rowwise" | null,    # FP8 recipe (tensorwise, rowwise, rowwise_with_gw_hp, block128,
                                         # mx32), null = kept in high precision
          "kernel": "scaled_mm_rowwise" | null,
          "safe": true, "fast": false,   # for the chosen recipe (else the best candidate)
          "predicted_speedup": 0.61,     # H100 fwd+bwd block, bf16 time / fp8 time (modelled)
          "error": {"<recipe>": {"sqnr_db", "ci_low_db", "ci_high_db", "rel_error", "batches",
                                  "per_gemm_sqnr_db": {"fwd", "grad_input", "grad_weight"},
                                  "per_gemm_ci_low_db": {...},     # grad_input absent when it never runs
                                  "ne_rel", "ne_rel_ci_low", "ne_rel_ci_high"}},
                                         # held-out NE cost of the recipe's forward at this site alone
          "speedups": {"<recipe>": 0.61},
          "dispatch": {"kernel": "bf16", "time_ms": 0.4, "times_ms": {...}, "acceptable": [...]},
          "mods": ["pad_dims", ...],     # Mods the site's statistics suggest (fp8.mods.suggest_mods)
          "applied_mods": [{"name": "clamp_outliers", "params": {"alpha": 8.0}}, ...],
                                         # Mods applied to the site, in order, before FP8 conversion
                                         # (fp8.mods.apply_site_mods; the runner and `cubic fp8 check`);
                                         # "error" is then the error measured with them on
          "mods_probe": {"mods": [...], "error_with_mods": {...}, "error_without_mods": {...},
                         "recipe_with_mods": "tensorwise" | null, "recipe_without_mods": null,
                         "speedup_with_mods": 1.3, "speedup_without_mods": null, "chosen": true}
                                         # the site probed again with its suggested Mods on
                                         # (fp8.recommend.probe_mods); null when not probed
          "reason": "why it is kept in high precision" | null
        }
      },
      "module_filter": ["<module name>", ...]   # the FP8 sites: torchao's module_filter_fn
    }
"""

from __future__ import annotations

import math
from typing import Any, Callable, Literal

from pydantic import Field, model_validator

from cubic.core.spec import Frozen, SpecError, parse_model, read_structured
from fp8.kernels import KERNELS
from fp8.recipes import FP8_RECIPES

PLACEMENT_VERSION = 1


class SiteError(Frozen):
    sqnr_db: float
    ci_low_db: float
    ci_high_db: float
    rel_error: float = Field(ge=0.0)
    batches: int = Field(ge=0)
    per_gemm_sqnr_db: dict[str, float] = Field(default_factory=dict)
    per_gemm_ci_low_db: dict[str, float] = Field(default_factory=dict)
    # held-out NE cost of this recipe's forward at the site alone (fp8.probe.ne_cost; relative, e.g.
    # 0.0002 = +0.02%) and its interval; absent in documents from before it was measured
    ne_rel: float | None = None
    ne_rel_ci_low: float | None = None
    ne_rel_ci_high: float | None = None


class SiteMod(Frozen):
    """One Mod applied to a site (fp8.mods): its name and parameters."""

    name: Literal["pad_dims", "normalize_rows", "smooth_channels", "clamp_outliers", "split_outliers"]
    params: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _params(self) -> "SiteMod":
        if self.name == "clamp_outliers" and not self.params.get("alpha", 0.0) > 0.0:
            raise ValueError("clamp_outliers needs params.alpha > 0")
        return self


class SiteModsProbe(Frozen):
    """A site probed with and without its suggested Mods, and which of the two the placement took."""

    mods: list[SiteMod]
    error_with_mods: dict[str, SiteError] = Field(default_factory=dict)
    error_without_mods: dict[str, SiteError] = Field(default_factory=dict)
    recipe_with_mods: str | None = None
    recipe_without_mods: str | None = None
    speedup_with_mods: float | None = None
    speedup_without_mods: float | None = None
    chosen: bool = False


class SitePlacement(Frozen):
    m: int = Field(ge=0, description="M (rows of the flattened input) as probed")
    m_target: int | None = Field(default=None, ge=1, description="M at the placement's target batch "
                                 "(probe.target_batch): the shape the speed prediction is for")
    k: int = Field(ge=1)
    n: int = Field(ge=1)
    norm_before: bool = False
    act_after: str | None = None
    recipe: Literal["tensorwise", "rowwise", "rowwise_with_gw_hp", "block128", "mx32"] | None = None
    kernel: str | None = None
    safe: bool = False
    fast: bool = False
    predicted_speedup: float | None = None
    error: dict[str, SiteError] = Field(default_factory=dict)
    speedups: dict[str, float] = Field(default_factory=dict)
    dispatch: dict[str, Any] | None = None
    mods: list[str] = Field(default_factory=list, description="Mods the Probe statistics suggest (fp8.mods)")
    applied_mods: list[SiteMod] = Field(default_factory=list,
                                        description="Mods applied, in order, before the site's FP8 conversion")
    mods_probe: SiteModsProbe | None = None
    reason: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "SitePlacement":
        if "smooth_channels" in [m.name for m in self.applied_mods][:-1]:
            raise ValueError("applied_mods: smooth_channels must be the last Mod (it rescales the weight it wraps)")
        if self.recipe is not None:
            if self.kernel is None:
                raise ValueError("an FP8 site needs a kernel")
            if self.kernel not in KERNELS:
                raise ValueError(f"unknown kernel {self.kernel!r} (known: {', '.join(KERNELS)})")
            if KERNELS[self.kernel].recipe != self.recipe:
                raise ValueError(f"kernel {self.kernel!r} does not implement recipe {self.recipe!r}")
        elif not self.reason:
            raise ValueError("a site kept in high precision needs a reason")
        return self


class Placement(Frozen):
    version: Literal[1] = PLACEMENT_VERSION
    workload: str = ""
    workload_hash: str = ""
    budget_sqnr_db: float | None = Field(default=None, gt=0.0, le=200.0)
    budget_scope: Literal["site", "model"] = "site"
    model_sqnr_db: float | None = None
    budget_ne_rel: float | None = Field(default=None, gt=0.0, le=1.0)
    model_ne_rel: dict[str, float] | None = None
    target_device: str = "h100"
    probe_device: str = "cpu"
    require_fast: bool = True
    probe: dict[str, Any] = Field(default_factory=dict)
    sites: dict[str, SitePlacement] = Field(default_factory=dict)
    module_filter: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _filter_matches_sites(self) -> "Placement":
        fp8_sites = sorted(n for n, s in self.sites.items() if s.recipe is not None)
        listed = sorted(self.module_filter)
        if self.sites and listed != fp8_sites:
            raise ValueError("module_filter must list exactly the sites with a recipe")
        if not self.sites and self.module_filter:
            raise ValueError("module_filter names sites but 'sites' is empty")
        return self

    def fp8_sites(self) -> dict[str, SitePlacement]:
        return {n: s for n, s in self.sites.items() if s.recipe is not None}

    def kernels(self) -> dict[str, str]:
        return {n: s.kernel for n, s in self.fp8_sites().items()}  # type: ignore[misc]


def parse_placement(data: Any, source: str = "placement") -> Placement:
    """Validate a placement document (dict); errors are one-line SpecErrors naming the field."""
    return parse_model(Placement, data, source=source)


def load_placement(path: str) -> Placement:
    return parse_placement(read_structured(path), source=str(path))


def module_filter_fn(placement: Placement) -> Callable[[Any, str], bool]:
    """torchao's ``module_filter_fn(module, fqn) -> bool``: convert exactly the placement's FP8 sites."""
    names = set(placement.module_filter)
    return lambda module, fqn: fqn in names


def noise_power(sqnr_db: float) -> float:
    """Noise power relative to the signal, ``10^(-dB/10)``: what adds across sites."""
    return 10.0 ** (-sqnr_db / 10.0)


def sqnr_of(total_noise: float) -> float:
    """The SQNR (dB, at most 200) of a relative noise power: the inverse of :func:`noise_power`."""
    return 200.0 if total_noise <= 1e-20 else min(200.0, -10.0 * math.log10(total_noise))


def combined_sqnr_db(lows_db: list[float]) -> float | None:
    """SQNR of several sites' noise together, modelled as additive noise powers (first order: the
    sites' relative errors are independent and weigh alike on the loss); None for no site."""
    return sqnr_of(sum(noise_power(x) for x in lows_db)) if lows_db else None


def ne_within(error: dict, budget_ne_rel: float | None) -> bool:
    """Whether a recipe's held-out NE cost interval ends at or below the budget (True when either is
    unknown: documents and probes from before it was measured)."""
    hi = error.get("ne_rel_ci_high")
    return budget_ne_rel is None or hi is None or hi <= budget_ne_rel


def choose(site: dict, budget_db: float | None, *, require_fast: bool, fast_threshold: float = 1.0,
           recipes: tuple[str, ...] = FP8_RECIPES,
           budget_ne_rel: float | None = None) -> tuple[str | None, bool, bool, float | None, str | None]:
    """(recipe, safe, fast, speedup, reason) for one probed site (``site`` from Probe.summary
    plus ``speedups``). Safe: the SQNR lower bound meets ``budget_db`` and the held-out NE cost's
    upper bound meets ``budget_ne_rel``. The recipe is the safe (and, with ``require_fast``, fast)
    one with the highest predicted speedup; ties go to the higher SQNR."""
    errs, speedups = site["errors"], site["speedups"]
    cands = [r for r in recipes if r in errs]
    if not cands:
        raise SpecError("the probe measured no FP8 recipe", field="recipes")
    quiet = {r: budget_db is None or errs[r]["ci_low_db"] >= budget_db for r in cands}
    safe = {r: quiet[r] and ne_within(errs[r], budget_ne_rel) for r in cands}
    fast = {r: speedups.get(r, 0.0) > fast_threshold for r in cands}
    ok = [r for r in cands if safe[r] and (fast[r] or not require_fast)]
    if ok:
        best = max(ok, key=lambda r: (round(speedups.get(r, 0.0), 3), errs[r]["sqnr_db"]))
        return best, True, fast[best], speedups.get(best), None
    # kept in high precision: report the most accurate candidate and why it failed
    best = max(cands, key=lambda r: errs[r]["ci_low_db"])
    reasons = []
    if not any(quiet.values()):
        reasons.append(f"unsafe: best SQNR lower bound {errs[best]['ci_low_db']:.1f} dB ({best}) "
                       f"< budget {budget_db:.1f} dB")
    elif not any(safe.values()):
        r = min((r for r in cands if quiet[r]), key=lambda r: errs[r]["ne_rel_ci_high"])
        e = errs[r]
        reasons.append(f"unsafe: held-out NE cost of its FP8 forward {100 * e['ne_rel']:+.4f}% "
                       f"[{100 * e['ne_rel_ci_low']:+.4f}%, {100 * e['ne_rel_ci_high']:+.4f}%] ({r}, the "
                       f"lowest of the recipes meeting the SQNR budget) > budget {100 * budget_ne_rel:.4f}%")
        best = r
    if require_fast:
        safe_r = [r for r in cands if safe[r]]
        pool = safe_r or cands
        fastest = max(pool, key=lambda r: speedups.get(r, 0.0))
        if not any(fast[r] for r in pool):
            reasons.append(f"slow: predicted block speedup {speedups.get(fastest, 0.0):.2f}x ({fastest}) "
                           f"<= {fast_threshold:.2f}x on the target")
        best = fastest if safe_r else best
    if not reasons:  # safe recipes exist, fast ones exist, but no recipe is both
        reasons.append("no recipe is both safe and fast")
    return None, safe[best], fast[best], speedups.get(best), "; ".join(reasons)
