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
      "module_filter": ["<module name>", ...]   # the FP8 sites (torchao's module_filter_fn per recipe:
                                                # fp8.torchao_export.module_filter_fn)
    }
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from cubic.core.spec import Frozen, SpecError, parse_model, read_structured
from fp8.kernels import KERNELS
from fp8.recipes import FP8_RECIPES

PLACEMENT_VERSION = 1
MAX_SQNR_DB = 200.0  # the SQNR of a noise power at float32's floor: a budget above it no site could meet


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
    # spreads behind the intervals (for the samples that would decide an inconclusive site)
    sd_db: float | None = None
    ne_rel_sd: float | None = None
    ne_samples: int | None = None
    ne_unit: str | None = None  # what one NE sample is: "examples" or "batches" (--module)


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


def safe_but_slow(safe: bool, fast: bool, verdict_recipe: str | None) -> bool:
    """The one rule for a site that FP8 would not hurt but would not speed up at the placement's batch:
    safe under the recipe its verdict used, not predicted fast. Such a site is told from which batch it
    would pay (fast_from_batch) and is listed under the probe table."""
    return bool(safe and not fast and verdict_recipe)


class SitePlacement(Frozen):
    m: int = Field(ge=0, description="M (rows of the flattened input) as probed")
    m_target: int | None = Field(default=None, ge=1, description="M at the placement's target batch "
                                 "(probe.target_batch): the shape the speed prediction is for")
    k: int = Field(ge=1)
    n: int = Field(ge=1)
    norm_before: bool = False
    act_after: str | None = None
    recipe: Literal[FP8_RECIPES] | None = None  # type: ignore[valid-type]
    kernel: str | None = None
    # the recipe whose numbers the decision used (the placed one, else the one nearest to placement),
    # its verdict alone at this site, and for an inconclusive one the samples that would decide it
    verdict_recipe: Literal[FP8_RECIPES] | None = None  # type: ignore[valid-type]
    verdict: Literal["safe", "unsafe", "inconclusive"] | None = None
    to_decide: dict[str, Any] | None = None
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
    fast_from_batch: int | None = Field(default=None, ge=1, description=(
        "a safe site predicted slow: the smallest power-of-two batch (up to 131,072) at which its verdict "
        "recipe is predicted fast on the target device (MODELLED, fp8.recommend.fast_from_batch)"))

    @property
    def safe_but_slow(self) -> bool:
        """Safe under its verdict recipe but predicted slower in FP8 (see :func:`safe_but_slow`)."""
        return safe_but_slow(self.safe, self.fast, self.verdict_recipe)

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
    budget_sqnr_db: float | None = Field(default=None, gt=0.0, le=MAX_SQNR_DB)
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

    def recipes(self) -> list[str]:
        """The FP8 sites' recipes: one torchao ``convert_to_float8_training`` call each."""
        return sorted({str(s.recipe) for s in self.fp8_sites().values()})

    def kernels(self) -> dict[str, str]:
        return {n: s.kernel for n, s in self.fp8_sites().items()}  # type: ignore[misc]


def parse_placement(data: Any, source: str = "placement") -> Placement:
    """Validate a placement document (dict); errors are one-line SpecErrors naming the field."""
    return parse_model(Placement, data, source=source)


def load_placement(path: str) -> Placement:
    return parse_placement(read_structured(path), source=str(path))


def noise_power(sqnr_db: float) -> float:
    """Noise power relative to the signal, ``10^(-dB/10)``: what adds across sites."""
    return 10.0 ** (-sqnr_db / 10.0)


def sqnr_of(total_noise: float) -> float:
    """The SQNR (dB, at most 200) of a relative noise power: the inverse of :func:`noise_power`."""
    return MAX_SQNR_DB if total_noise <= 1e-20 else min(MAX_SQNR_DB, -10.0 * math.log10(total_noise))


def combined_sqnr_db(lows_db: list[float]) -> float | None:
    """SQNR of several sites' noise together, modelled as additive noise powers (first order: the
    sites' relative errors are independent and weigh alike on the loss); None for no site."""
    return sqnr_of(sum(noise_power(x) for x in lows_db)) if lows_db else None


VERDICTS: tuple[str, ...] = ("safe", "inconclusive", "unsafe")


def verdict(error: dict, budget_db: float | None, budget_ne_rel: float | None, *, margin_db: float = 0.0,
            confidence: float = 0.95) -> dict[str, Any]:
    """One recipe at one site against the budgets, from its intervals (the numbers shown for it):

    - SQNR (``budget_db``, which includes ``margin_db``): passes when the interval's lower end
      meets it, fails when the upper end is below it;
    - held-out NE cost (``budget_ne_rel``, where measured): passes when the upper end is at most
      the budget, fails when the lower end is above it;
    - ``unsafe`` if a check fails, ``safe`` if all pass, else ``inconclusive`` (an interval straddles
      a budget), with ``to_decide``: the samples (Probe batches, or held-out examples / batches) a
      Student-t interval would need to exclude the budget if the spread stayed as measured
      (:func:`cubic.core.stats.samples_to_resolve`).

    Returns ``{"verdict", "checks": [text, ...], "to_decide": {"sqnr" | "ne": {"n", "unit", "have"}} | None}``
    (each straddled interval: the samples of its kind that would decide it).
    """
    from cubic.core.stats import samples_to_resolve

    fails, opens, passes = [], [], []
    needs: dict[str, dict] = {}
    if budget_db is not None:
        lo, hi, mean = error["ci_low_db"], error["ci_high_db"], error["sqnr_db"]
        bar = f">= {budget_db - margin_db:.1f} dB" + (f" + {margin_db:.1f} dB (interval still wider than the Probe's "
                                                      f"target)" if margin_db else "")
        text = f"SQNR {mean:.1f} [{lo:.1f}, {hi:.1f}] dB vs budget {bar}"
        if lo >= budget_db:
            passes.append(text)
        elif hi < budget_db:
            fails.append(text)
        else:
            opens.append(text)
            sd = error.get("sd_db")
            if sd is not None and math.isfinite(sd):
                needs["sqnr"] = {"n": samples_to_resolve(sd, abs(mean - budget_db), confidence),
                                 "unit": "Probe batches", "have": error.get("batches")}
    if budget_ne_rel is not None and error.get("ne_rel_ci_high") is not None:
        lo, hi, mean = error["ne_rel_ci_low"], error["ne_rel_ci_high"], error["ne_rel"]
        text = (f"held-out NE cost {100 * mean:+.4f}% [{100 * lo:+.4f}%, {100 * hi:+.4f}%] vs budget "
                f"<= {100 * budget_ne_rel:+.4f}%")
        if hi <= budget_ne_rel:
            passes.append(text)
        elif lo > budget_ne_rel:
            fails.append(text)
        else:
            opens.append(text)
            sd = error.get("ne_rel_sd")
            if sd is not None and math.isfinite(sd):
                needs["ne"] = {"n": samples_to_resolve(sd, abs(mean - budget_ne_rel), confidence),
                               "unit": f"held-out {error.get('ne_unit') or 'examples'}", "have": error.get("ne_samples")}
    if fails:
        return {"verdict": "unsafe", "checks": fails, "to_decide": None}
    if opens:
        return {"verdict": "inconclusive", "checks": opens, "to_decide": needs or None}
    return {"verdict": "safe", "checks": passes, "to_decide": None}


def to_decide_text(needs: dict | None) -> str:
    if not needs:
        return ""
    from cubic.core.stats import samples_to_resolve

    cap = samples_to_resolve.__defaults__[-1]  # the count it stops at: the mean sits (nearly) on the budget
    parts = [(f"more than {cap:,}" if d["n"] >= cap else f"~{d['n']:,}") + f" {d['unit']}"
             + (f" (has {d['have']:,})" if d.get("have") is not None else "") for d in needs.values()]
    return " and ".join(parts) + " would decide it"


def decide_site(site: dict, budget_db: float | None, *, require_fast: bool, fast_threshold: float = 1.0,
                recipes: tuple[str, ...] = FP8_RECIPES, budget_ne_rel: float | None = None,
                margin_db: float = 0.0, confidence: float = 0.95) -> dict[str, Any]:
    """The decision at one probed site (``site``: Probe.summary's ``errors`` plus ``speedups``).

    Each recipe gets a :func:`verdict`; the placed recipe is the safe (and, with ``require_fast``,
    fast) one with the highest predicted speedup (ties: the higher SQNR). When none is placed, the
    recipe shown (``verdict_recipe``) is the one nearest to placement (safe before inconclusive
    before unsafe; then fast; then the higher SQNR lower bound), and the reason quotes its numbers.
    Returns ``{"recipe", "verdict_recipe", "verdict", "to_decide", "safe", "fast", "speedup", "reason"}``.
    """
    errs, speedups = site["errors"], site["speedups"]
    cands = [r for r in recipes if r in errs]
    if not cands:
        raise SpecError("the probe measured no FP8 recipe", field="recipes")
    v = {r: verdict(errs[r], budget_db, budget_ne_rel, margin_db=margin_db, confidence=confidence) for r in cands}
    fast = {r: speedups.get(r, 0.0) > fast_threshold for r in cands}
    ok = [r for r in cands if v[r]["verdict"] == "safe" and (fast[r] or not require_fast)]
    if ok:
        best = max(ok, key=lambda r: (round(speedups.get(r, 0.0), 3), errs[r]["sqnr_db"]))
        shown, reason = best, None
    else:
        best = None
        rank = {k: i for i, k in enumerate(VERDICTS)}
        shown = min(cands, key=lambda r: (rank[v[r]["verdict"]], require_fast and not fast[r], -errs[r]["ci_low_db"]))
        parts = []
        if v[shown]["verdict"] != "safe":
            parts.append(f"{v[shown]['verdict']} ({shown}): " + "; ".join(v[shown]["checks"]))
            if v[shown]["to_decide"]:
                parts.append(to_decide_text(v[shown]["to_decide"]))
        if require_fast and not fast[shown]:
            parts.append(f"slow: predicted block speedup {speedups.get(shown, 0.0):.2f}x ({shown}) "
                         f"<= {fast_threshold:.2f}x on the target")
        if not parts:  # cannot happen: a safe, fast recipe is placed
            parts.append("no recipe is both safe and fast")
        reason = "; ".join(parts)
    vs = v[shown]
    return {"recipe": best, "verdict_recipe": shown, "verdict": vs["verdict"], "to_decide": vs["to_decide"],
            "safe": vs["verdict"] == "safe", "fast": fast[shown], "speedup": speedups.get(shown), "reason": reason}


def choose(site: dict, budget_db: float | None, *, require_fast: bool, fast_threshold: float = 1.0,
           recipes: tuple[str, ...] = FP8_RECIPES,
           budget_ne_rel: float | None = None) -> tuple[str | None, bool, bool, float | None, str | None]:
    """(recipe, safe, fast, speedup, reason) of :func:`decide_site`."""
    d = decide_site(site, budget_db, require_fast=require_fast, fast_threshold=fast_threshold, recipes=recipes,
                    budget_ne_rel=budget_ne_rel)
    return d["recipe"], d["safe"], d["fast"], d["speedup"], d["reason"]
