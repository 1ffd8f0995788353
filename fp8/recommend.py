"""From a workload to a placement: train and probe, predict speed, dispatch kernels, decide per site."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cost_models.gpu_gemm import block_speedup
from cost_models.hardware import load_device
from cubic.core.config import Config, FP8Choice
from cubic.core.recipes import HIGH_PRECISION, recipe_set
from cubic.core.spec import SpecError, Workload, call_user_code
from fp8.dispatch import Dispatcher
from fp8.kernels import kernels_for_recipe
from fp8.mods import cuda_fp8_shape_problem, site_mods, suggest_mods
from fp8.placement import Placement, combined_sqnr_db, decide_site, noise_power, parse_placement, safe_but_slow, sqnr_of
from fp8.probe import Probe
from fp8.recipes import ALL_RECIPES, FP8_RECIPES


# the held-out NE cost (relative) an FP8 placement's forward may add: a fifth of the 0.1% quality
# target, leaving the rest to what training in FP8 adds, which no single trained model shows
DEFAULT_BUDGET_NE_REL = 0.0002


def probe_workload(workload: Workload, config: Config | None = None, *, warmup_steps: int = 30,
                   recipes: tuple[str, ...] = ("bf16",) + FP8_RECIPES, ci_halfwidth_db: float = 1.0,
                   min_batches: int = 4, max_batches: int = 24, device: str = "cpu", stride: int = 1,
                   mods: dict[str, list] | None = None, ne_examples: int = 16384) -> tuple[Probe, Any]:
    """Train ``warmup_steps`` in fp32 (statistics of a trained model, not of the init), then keep
    training with the Probe attached, measuring one step in ``stride``, until every site's
    intervals are narrow.

    ``mods`` (site -> Mod entries, :func:`fp8.mods.apply_site_mods`): the model is built with those
    Mods on from step 0, as the runner builds it from a placement, and only those sites are probed
    (their inner GEMM, reported under the site's name).

    ``ne_examples``: then each site's held-out NE cost per recipe (:meth:`fp8.probe.Probe.measure_ne`)
    on that many examples no run trains on; 0 skips it."""
    from cubic.core.train import TrainSession
    from fp8.mods import apply_site_mods

    bad = [r for r in recipes if r not in ALL_RECIPES]
    if bad:
        raise SpecError(f"unknown recipe {bad[0]!r} (known: {', '.join(ALL_RECIPES)})", field="recipes")
    where: dict[str, str] = {}

    def transform(model):  # before the optimizer is built, so a Mod's new parameters train too
        where.update(apply_site_mods(model, mods or {}))
        return model

    trainer = TrainSession(workload, config, device=device, transform=transform if mods else None)
    trainer.train(warmup_steps)
    probe = Probe(trainer.model, recipes, ci_halfwidth_db=ci_halfwidth_db, min_batches=min_batches,
                  max_batches=max_batches, stride=stride, sites=list(mods) if mods else None,
                  aliases={inner: site for site, inner in where.items()})
    probe.run(trainer.step, start_step=warmup_steps)
    if ne_examples:
        probe.measure_ne(lambda model: trainer.held_out_losses(ne_examples, model))
    return probe, trainer


def suggested_mods(probe: Probe) -> dict[str, list[dict[str, Any]]]:
    """Site -> the Mod entries its Probe statistics call for (:func:`fp8.mods.site_mods`), for the
    sites where one of them changes the numerics (``pad_dims`` alone adds zeros: nothing to probe)."""
    out = {}
    for name, s in probe.summary().items():
        entries = site_mods(s)
        if any(e["name"] != "pad_dims" for e in entries):
            out[name] = entries
    return out


def probe_mods(workload: Workload, probe: Probe, config: Config | None = None, *, warmup_steps: int = 30,
               device: str = "cpu") -> Probe | None:
    """Probe ``workload`` again with each site's suggested Mods on (same recipes, interval target,
    batches and stride as ``probe``); None when no site calls for a Mod."""
    mods = suggested_mods(probe)
    if not mods:
        return None
    modded, _ = probe_workload(workload, config, warmup_steps=warmup_steps, recipes=probe.recipes,
                               ci_halfwidth_db=probe.ci_halfwidth_db, min_batches=probe.min_batches,
                               max_batches=probe.max_batches, device=device, stride=probe.stride, mods=mods)
    return modded


def _finite(x: float) -> float:
    return x if math.isfinite(x) else (200.0 if x > 0 else -200.0)


def _clean_errors(errors: dict) -> dict:
    """A Probe summary's per-recipe errors as the placement stores them (finite numbers)."""
    return {
        r: {k: (_finite(v) if isinstance(v, float) else v) for k, v in e.items() if not k.startswith("per_gemm")}
        | {k: {g: _finite(v) for g, v in e[k].items()} for k in ("per_gemm_sqnr_db", "per_gemm_ci_low_db") if k in e}
        for r, e in errors.items()
    }


def _load_callable(spec: str, flag: str):
    from cubic.core.spec import load_callable  # the one loader of user code

    return load_callable(spec, flag)


def resolve_loss(loss: str):
    """``mse`` (mean squared error), ``bce`` (binary cross-entropy on logits) or
    ``package.module:fn`` with ``fn(output, target) -> scalar tensor``."""
    import torch.nn.functional as F

    if loss == "mse":
        return F.mse_loss
    if loss == "bce":
        return F.binary_cross_entropy_with_logits
    if ":" in loss:
        return _load_callable(loss, "--loss")
    raise SpecError(f"unknown loss {loss!r} (mse, bce or package.module:fn)", field="--loss")


def probe_module(spec: str, *, recipes: tuple[str, ...] = ("bf16",) + FP8_RECIPES, ci_halfwidth_db: float = 1.0,
                 min_batches: int = 4, max_batches: int = 24, lr: float = 1e-3, loss: str = "mse",
                 ne_batches: int = 16, device: str = "cpu") -> Probe:
    """Probe any model given as ``package.module:factory``.

    ``factory()`` returns ``(model, batch_fn)`` where ``batch_fn(step) -> (inputs, targets)``; the
    Probe trains it with Adam on ``loss`` (:func:`resolve_loss`: ``model(inputs)`` vs ``targets``).
    Then each site's held-out cost (:meth:`fp8.probe.Probe.measure_ne`) is the relative change of
    ``loss`` (NE's, for a log loss) paired over the ``ne_batches`` batches after the trained ones,
    which the Probe never trained on; 0 skips it. ``device``: where the model trains and is probed.
    """
    import torch

    from cubic.core.fingerprint import check_device

    dev = check_device(device)

    loss_fn = resolve_loss(loss)
    factory = _load_callable(spec, "--module")
    model, batch_fn = _checked_factory(factory, spec)
    model = model.to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def batch(i: int):
        got = _user_call(batch_fn, f"batch_fn({i})", i)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise SpecError(f"batch_fn({i}) must return (inputs, targets), got {type(got).__name__}", field="--module")
        return tuple(t.to(dev) if isinstance(t, torch.Tensor) else t for t in got)

    def step(i: int) -> None:
        x, y = batch(i)
        out = _user_call(model, f"the model's forward on batch {i}", x)
        value = _user_call(loss_fn, f"the loss on batch {i}", out, y)
        if not (isinstance(value, torch.Tensor) and value.numel() == 1):
            raise SpecError("the loss must return a scalar tensor", field="--loss")
        if not bool(torch.isfinite(value.detach()).all()):
            raise SpecError(f"the full-precision loss is {value.item()} at training step {i}: fix the model "
                            f"or its batches before probing", field="--module")
        opt.zero_grad()
        value.backward()
        opt.step()

    probe = Probe(model, recipes, ci_halfwidth_db=ci_halfwidth_db, min_batches=min_batches, max_batches=max_batches)
    probe.run(step)
    if ne_batches:
        held_out = [batch(probe.trained_steps + i) for i in range(ne_batches)]

        def losses(m: torch.nn.Module) -> torch.Tensor:
            m.eval()
            try:
                with torch.no_grad():
                    return torch.stack([loss_fn(m(x), y).detach().float().reshape(()) for x, y in held_out])
            finally:
                m.train()

        probe.measure_ne(losses, unit="batches")
    return probe


def _user_call(fn, what: str, *args):
    return call_user_code(fn, what, "--module", *args)


def _checked_factory(factory, spec: str):
    """``factory()`` checked before use: it must return ``(nn.Module, batch_fn)`` with a callable
    ``batch_fn`` and a model with at least one ``nn.Linear``."""
    import torch

    made = _user_call(factory, f"the factory {spec}()")
    if not (isinstance(made, tuple) and len(made) == 2):
        raise SpecError(f"the factory must return (nn.Module, batch_fn), got {type(made).__name__}", field="--module")
    model, batch_fn = made
    if not isinstance(model, torch.nn.Module):
        raise SpecError(f"the factory's first value must be an nn.Module, got {type(model).__name__}", field="--module")
    if not callable(batch_fn):
        raise SpecError(f"the factory's second value must be batch_fn(step) -> (inputs, targets), got "
                        f"{type(batch_fn).__name__}", field="--module")
    if not any(isinstance(m, torch.nn.Linear) for m in model.modules()):
        raise SpecError("the model has no nn.Linear: nothing to place in FP8", field="--module")
    return model, batch_fn


@dataclass(frozen=True)
class _SiteRules:
    """What every site of one recommendation is judged by (see :func:`recommend`)."""

    probe: Probe
    budget_db: float | None
    allowed: tuple[str, ...]
    require_fast: bool
    fast_threshold: float
    budget_ne_rel: float | None
    unsure_margin: bool
    batch: int
    target_batch: int | None
    target: Any  # the device the speedups are predicted for
    dispatcher: Dispatcher


# how far up "fast from which batch" looks (powers of two above the batch the speedups are for)
FAST_FROM_MAX_BATCH = 1 << 17


def fast_from_batch(s: dict, recipe: str, rules: _SiteRules) -> int | None:
    """The smallest power-of-two batch above the one the site's speedups are for (``--target-batch``,
    else the probe's), up to FAST_FROM_MAX_BATCH, at which ``recipe`` is predicted fast at this site
    by the same block model (MODELLED); None when it is at none. What a user whose safe sites are
    all too small to pay asks next: at what batch would they?"""
    m = s["m"] or rules.batch
    b = 1 << max(1, rules.target_batch or rules.batch).bit_length()
    while b <= FAST_FROM_MAX_BATCH:
        m_b = max(1, round(m * b / rules.batch))
        if block_speedup(m_b, s["k"], s["n"], recipe, norm_before=s["norm_before"], act_after=s["act_after"],
                         device=rules.target)["speedup"] > rules.fast_threshold:
            return b
        b *= 2
    return None


def _place_site(name: str, s: dict, rules: _SiteRules, modded: dict | None, wanted: list[dict],
                end: str | None) -> dict:
    """One site's entry of the placement: the recipe that meets the bar with the best predicted
    speedup, plain or with its Mods (``modded``: the site probed with ``wanted`` on), the kernel
    Dispatch picks, and why. ``end``: "first (input)" / "last" when keep_first_last holds it back."""
    r = rules
    m = s["m"] or r.batch
    m_target = max(1, round(m * (r.target_batch / r.batch))) if r.target_batch else m
    speedups = {
        rc: block_speedup(m_target, s["k"], s["n"], rc, norm_before=s["norm_before"], act_after=s["act_after"],
                          device=r.target)["speedup"]
        for rc in FP8_RECIPES if rc in s["errors"]
    }

    def decide(probed: dict):
        errors = _clean_errors(probed["errors"])
        # the budget each recipe must clear here: more when the Probe could not narrow the interval
        margin = r.probe.ci_halfwidth_db if r.unsure_margin and not probed.get("converged_ci", True) else 0.0
        budget_here = r.budget_db + margin if r.budget_db is not None else None
        return errors, budget_here, decide_site({"errors": errors, "speedups": speedups}, budget_here,
                                                recipes=r.allowed, require_fast=r.require_fast,
                                                fast_threshold=r.fast_threshold, budget_ne_rel=r.budget_ne_rel,
                                                margin_db=margin, confidence=r.probe.confidence)

    errors, budget_here, dec = decide(s)
    applied: list[dict] = []
    mods_probe_doc = None
    if modded is not None:
        errors_m, budget_m, dec_m = decide(modded)
        take = dec_m["recipe"] is not None and (dec["recipe"] is None or (dec_m["speedup"] or 0.0) >
                                                (dec["speedup"] or 0.0) + 1e-9)
        mods_probe_doc = {"mods": wanted, "error_with_mods": errors_m, "error_without_mods": errors,
                          "recipe_with_mods": dec_m["recipe"], "recipe_without_mods": dec["recipe"],
                          "speedup_with_mods": dec_m["speedup"] if dec_m["recipe"] else None,
                          "speedup_without_mods": dec["speedup"] if dec["recipe"] else None, "chosen": take}
        if take:
            errors, budget_here, dec = errors_m, budget_m, dec_m
            applied = list(wanted)
    recipe, reason = dec["recipe"], dec["reason"]
    if dec["verdict"] == "unsafe" and r.budget_db is not None:
        lows = errors[dec["verdict_recipe"]].get("per_gemm_ci_low_db") or {}
        if lows:
            g = min(lows, key=lows.get)
            reason += f"; binding GEMM: {g} ({lows[g]:.1f} dB lower bound)"
    if end is not None and recipe is not None:
        recipe, reason = None, f"keep_first_last: the {end} layer stays in high precision"
    if recipe is None:
        applied = []  # a high-precision site runs as the model defines it
        if mods_probe_doc is not None:
            mods_probe_doc["chosen"] = False
    elif not any(a["name"] == "pad_dims" for a in applied) and cuda_fp8_shape_problem(s["k"], s["n"]):
        applied = [{"name": "pad_dims", "params": {}}] + applied
    # Dispatch chooses among the allowed recipes' kernels (and high precision)
    low = {rc: e["ci_low_db"] for rc, e in errors.items() if rc in r.allowed or rc in HIGH_PRECISION} | {"fp32": 200.0}
    d = r.dispatcher.decide(m, s["k"], s["n"], low, budget_here)  # the same bar as the site's recipe
    kernel = None
    if recipe is not None:
        impl = {k.name for k in kernels_for_recipe(recipe)}
        kernel = r.dispatcher.decide(m, s["k"], s["n"], low, None, allowed=impl).kernel
    return {
        "m": m, "m_target": m_target, "k": s["k"], "n": s["n"], "norm_before": s["norm_before"], "act_after": s["act_after"],
        "recipe": recipe, "kernel": kernel, "verdict_recipe": dec["verdict_recipe"], "verdict": dec["verdict"],
        "to_decide": dec["to_decide"], "safe": dec["safe"], "fast": dec["fast"], "predicted_speedup": dec["speedup"],
        "error": errors, "speedups": speedups,
        "dispatch": {"kernel": d.kernel, "time_ms": d.time_ms, "times_ms": d.times_ms,
                     "acceptable": list(d.acceptable), "ties": list(d.ties)},
        "mods": suggest_mods(s),
        "applied_mods": applied,
        "mods_probe": mods_probe_doc,
        "reason": reason,
        "fast_from_batch": (fast_from_batch(s, dec["verdict_recipe"], r)
                            if safe_but_slow(dec["safe"], dec["fast"], dec["verdict_recipe"]) else None),
    }


def recommend(workload: Workload | None, budget_db: float | None, *, config: Config | None = None,
              probe: Probe | None = None, require_fast: bool = True, target_device: str = "h100",
              target_batch: int | None = None, fast_threshold: float = 1.0, dispatcher: Dispatcher | None = None,
              warmup_steps: int = 30, max_batches: int = 24, ci_halfwidth_db: float = 1.0,
              keep_first_last: bool = True, unsure_margin: bool = True, probe_stride: int = 1,
              label: str | None = None, mods: bool = True, mods_probe: Probe | None = None,
              budget_scope: str = "model", budget_ne_rel: float | None = DEFAULT_BUDGET_NE_REL,
              device: str = "cpu", recipes: str | tuple[str, ...] = "all") -> Placement:
    """A placement for ``workload`` under an SQNR budget (see :mod:`fp8.placement` for the schema).

    ``target_batch`` rescales each site's M (rows) from the probed batch to the production batch
    for the speed prediction. Conservative by default, where the Probe's evidence is weakest:

    - ``keep_first_last``: the Mod of that name; the input layers (sites reading the model's raw
      inputs, whose input needs no gradient; else the first executed site) and the last executed
      site stay in high precision whatever the Probe says (the first see the raw, heaviest-tailed
      features, the last writes the logits; the usual FP8 training practice);
    - ``unsure_margin``: a site whose interval did not narrow to ``ci_halfwidth_db`` within the
      Probe's batches (a t-interval over few, drifting batches is the least trustworthy) is safe
      only if its lower bound clears the budget by that half-width (the Probe's target).

    ``mods``: sites whose statistics call for Mods (:func:`suggested_mods`) are probed again with
    those Mods on (``mods_probe``, else :func:`probe_mods` when the workload is given), and each
    such site takes whichever of the two (plain, with its Mods) has a recipe that meets the bar
    with the higher predicted speedup (ties: plain, as the Mods' own elementwise work is not in the
    speed model); the chosen Mods are the site's ``applied_mods`` and ``error`` is then measured
    with them on. An FP8 site whose K or N is not a multiple of 16 also gets ``pad_dims`` (zeros:
    same numerics), since the H100 speed prediction assumes padded shapes.

    ``budget_scope``: ``"model"`` (default) also holds the FP8 sites *together* to the budget (see
    :func:`apply_model_budget`): a per-site bar alone let 17 sites of wukong-small through at
    >= 24 dB each, and their noise together cost +0.22% NE (fp8_benchmark, paired seeds).
    ``"site"``: each site on its own, as before.

    ``budget_ne_rel``: where the Probe measured held-out NE costs (:meth:`fp8.probe.Probe.measure_ne`),
    a recipe is safe at a site only when the upper end of that cost's interval is at most this
    (relative NE; 0.0002 = +0.02%), and with scope ``"model"`` the FP8 sites measured *together*
    must meet it too (:func:`apply_model_ne_budget`). SQNR alone let wukong-small's
    ``layers.0.lcb.proj`` through at 29 dB; its FP8 forward costs +0.16% [+0.10%, +0.23%] held-out NE.
    None: not checked.

    ``device``: where the Probe trains and measures and Dispatch times kernels (``cpu``, ``cuda``,
    ``cuda:N``); the placement records it as ``probe_device``.

    ``recipes``: the FP8 recipes a site may be placed in (:func:`cubic.core.recipes.recipe_set`):
    ``"torchao"`` for a placement a torchao job applies (``cubic fp8 export --format torchao`` refuses
    ``block128`` and ``mx32``, which torchao's Float8Linear does not run); the Probe still measures
    every recipe, and each site's speedups list them all. The placement records it as ``probe.recipes``.
    """
    device, allowed = _checked_options(device, recipes, budget_scope)
    target = load_device(target_device)  # before the Probe, which can run for minutes
    probe, mods_probe = _probes(workload, probe, config, mods=mods, mods_probe=mods_probe, warmup_steps=warmup_steps,
                                max_batches=max_batches, ci_halfwidth_db=ci_halfwidth_db, probe_stride=probe_stride,
                                device=device)
    modded = mods_probe.summary() if mods and mods_probe is not None else {}
    wanted = suggested_mods(probe) if modded else {}
    dispatcher = dispatcher or Dispatcher(device=device)
    batch = _probed_batch(workload, probe, config)
    summary = probe.summary()
    order, ends = _site_order(summary)
    rules = _SiteRules(probe, budget_db, allowed, require_fast, fast_threshold, budget_ne_rel, unsure_margin,
                       batch, target_batch, target, dispatcher)
    sites = _place_sites(summary, rules, modded, wanted, order, ends, keep_first_last)
    model_ne = _apply_model_budgets(sites, rules, budget_scope)
    doc = _placement_doc(workload, label, rules, sites, summary, budget_scope=budget_scope, model_ne=model_ne,
                         target_device=target_device, warmup_steps=warmup_steps, keep_first_last=keep_first_last,
                         order=order, ends=ends, modded=modded, mods_probe=mods_probe)
    return parse_placement(doc, source="recommend")


def _checked_options(device: str, recipes: str | tuple[str, ...], budget_scope: str) -> tuple[str, tuple[str, ...]]:
    """:func:`recommend`'s ``device`` (as a string) and allowed FP8 recipes, its options checked before
    any probing, so that a bad one fails at once."""
    from cubic.core.fingerprint import check_device

    device = str(check_device(device, "device"))
    try:
        allowed = recipe_set(recipes)
    except ValueError as e:
        raise SpecError(str(e), field="recipes") from None
    if budget_scope not in ("site", "model"):
        raise SpecError(f"unknown budget scope {budget_scope!r} (site or model)", field="budget_scope")
    return device, allowed


def _probes(workload: Workload | None, probe: Probe | None, config: Config | None, *, mods: bool,
            mods_probe: Probe | None, warmup_steps: int, max_batches: int, ci_halfwidth_db: float,
            probe_stride: int, device: str) -> tuple[Probe, Probe | None]:
    """The Probe :func:`recommend` decides from (``probe``, else one run on ``workload``) and, with
    ``mods``, the one with each site's suggested Mods on (``mods_probe``, else :func:`probe_mods`
    when the workload is given; None when neither)."""
    if probe is None:
        if workload is None:
            raise SpecError("give a workload or a probe", field="workload")
        probe, _ = probe_workload(workload, config, warmup_steps=warmup_steps, max_batches=max_batches,
                                  ci_halfwidth_db=ci_halfwidth_db, stride=probe_stride, device=device)
    if mods and mods_probe is None and workload is not None:
        mods_probe = probe_mods(workload, probe, config, warmup_steps=warmup_steps, device=device)
    return probe, mods_probe


def _probed_batch(workload: Workload | None, probe: Probe, config: Config | None) -> int:
    """The batch the Probe ran at (the M that ``target_batch`` rescales): the config's, else the
    workload's, else the most rows any site saw."""
    return (config.batch_size if config and config.batch_size else None) or (
        workload.batch_size if workload is not None else max(1, max((r.rows for r in probe.sites.values()), default=1)))


def _site_order(summary: dict[str, dict]) -> tuple[list[str], set[str]]:
    """The sites in execution order (unordered ones last), and the ends ``keep_first_last`` holds
    back: the input layers and the last layer."""
    order = sorted(summary, key=lambda n: (summary[n].get("order", -1) < 0, summary[n].get("order", -1)))
    # input layers: sites reading the model's raw inputs (their input needs no gradient), e.g. the dense
    # features' projection, which a multi-input model may run after the embedding projections;
    # the first executed site when none does. The last layer is the last executed site (the logits).
    inputs_ = [n for n in order if not summary[n].get("grad_input_used", True)] or order[:1]
    return order, {*inputs_, *order[-1:]}


def _place_sites(summary: dict[str, dict], rules: _SiteRules, modded: dict[str, dict],
                 wanted: dict[str, list[dict[str, Any]]], order: list[str], ends: set[str],
                 keep_first_last: bool) -> dict[str, dict]:
    """Each site's entry of the placement (:func:`_place_site`), on its own: the model budgets come
    after. A site probed with its Mods on also weighs that probe; an end is held back by name."""
    last = order[-1] if order else None
    return {name: _place_site(name, site, rules, modded.get(name) if name in wanted else None, wanted.get(name, []),
                              end=(("last" if name == last else "first (input)")
                                   if keep_first_last and name in ends else None))
            for name, site in summary.items()}


def _apply_model_budgets(sites: dict[str, dict], rules: _SiteRules, budget_scope: str) -> dict[str, float] | None:
    """With scope ``"model"``, hold the FP8 sites together to the SQNR budget, then to the held-out
    NE budget (in place). Returns the kept FP8 sites' held-out NE cost together; None where the
    Probe measured no held-out losses."""
    if budget_scope == "model" and rules.budget_db is not None:
        apply_model_budget(sites, rules.budget_db, rules.require_fast)
    if rules.probe.losses is None:
        return None
    if budget_scope == "model" and rules.budget_ne_rel is not None:
        return apply_model_ne_budget(sites, rules.probe, rules.budget_ne_rel, rules.require_fast)
    # scope "site" (or no NE budget): nothing is dropped, but the placement still records its cost
    return placement_ne_cost(rules.probe, sites, [n for n, s in sites.items() if s["recipe"]])


def _placement_doc(workload: Workload | None, label: str | None, rules: _SiteRules, sites: dict[str, dict],
                   summary: dict[str, dict], *, budget_scope: str, model_ne: dict[str, float] | None,
                   target_device: str, warmup_steps: int, keep_first_last: bool, order: list[str],
                   ends: set[str], modded: dict[str, dict], mods_probe: Probe | None) -> dict[str, Any]:
    """The placement document :func:`recommend` returns, before :func:`fp8.placement.parse_placement`
    checks it: the sites, the budgets, and how the Probe ran (so a placement says what it rests on)."""
    probe = rules.probe
    fp8_lows = [s["error"][s["recipe"]]["ci_low_db"] for s in sites.values() if s["recipe"] is not None]
    return {
        "version": 1, "workload": workload.name if workload is not None else (label or ""),
        "workload_hash": workload.content_hash() if workload is not None else "",
        "budget_sqnr_db": rules.budget_db, "budget_scope": budget_scope, "model_sqnr_db": combined_sqnr_db(fp8_lows),
        "budget_ne_rel": rules.budget_ne_rel if probe.losses is not None else None, "model_ne_rel": model_ne,
        "target_device": target_device, "probe_device": str(rules.dispatcher.device),
        "require_fast": rules.require_fast,
        "probe": {"steps": probe.steps, "ci_halfwidth_db": probe.ci_halfwidth_db, "confidence": probe.confidence,
                  "min_batches": probe.min_batches, "max_batches": probe.max_batches, "stride": probe.stride,
                  "warmup_steps": warmup_steps, "target_batch": rules.target_batch or rules.batch,
                  "recipes": list(rules.allowed),
                  "conservative": {"keep_first_last": keep_first_last, "unsure_margin": rules.unsure_margin},
                  "order": order, "kept_ends": sorted(ends),
                  "mods_probed": sorted(modded), "mods_probe_steps": mods_probe.steps if modded else 0,
                  "stats": {n: s["stats"] for n, s in summary.items()}},
        "sites": sites,
        "module_filter": [n for n, s in sites.items() if s["recipe"] is not None],
    }


def apply_model_budget(sites: dict[str, dict], budget_db: float, require_fast: bool) -> list[str]:
    """Keep the FP8 sites whose noise together stays within the budget (in place); returns the
    sites sent back to high precision.

    Each site's noise power is ``10^(-L/10)`` with ``L`` its recipe's SQNR lower bound; the powers
    add (:func:`fp8.placement.combined_sqnr_db`) and must not exceed ``10^(-budget/10)``. A greedy
    knapsack: with ``require_fast`` the sites with the highest predicted speedup are kept first (the
    time saved is the value); otherwise the quietest first (as many sites in FP8 as the budget
    allows). A site that does not fit is skipped, and smaller ones may still fit after it.
    """
    room = noise_power(budget_db)
    used, dropped = 0.0, []
    for n in _sites_in_order(sites, require_fast):
        s = sites[n]
        low = s["error"][s["recipe"]]["ci_low_db"]
        if used + noise_power(low) <= room * (1 + 1e-9):
            used += noise_power(low)
            continue
        _to_high_precision(s, f"model budget: with it, the FP8 sites' combined SQNR lower bound would be "
                              f"{sqnr_of(used + noise_power(low)):.1f} dB < budget {budget_db:.1f} dB (this site "
                              f"{low:.1f} dB with {s['recipe']}; noise powers add)")
        dropped.append(n)
    return dropped


def _sites_in_order(sites: dict[str, dict], require_fast: bool) -> list[str]:
    """The FP8 sites in the order the model budgets keep them: with ``require_fast`` the highest
    predicted speedup first (the time saved is the value), otherwise the quietest first."""
    fp8 = {n: noise_power(s["error"][s["recipe"]]["ci_low_db"]) for n, s in sites.items() if s["recipe"]}
    if require_fast:
        return sorted(fp8, key=lambda n: (-(sites[n]["predicted_speedup"] or 0.0), fp8[n], n))
    return sorted(fp8, key=lambda n: (fp8[n], n))


def _to_high_precision(site: dict, reason: str) -> None:
    site["reason"] = reason
    site["recipe"], site["kernel"], site["applied_mods"] = None, None, []
    if site["mods_probe"] is not None:
        site["mods_probe"]["chosen"] = False


def placement_ne_cost(probe: Probe, sites: dict[str, dict], names: list[str]) -> dict[str, float] | None:
    """Held-out NE cost of ``names`` in FP8 together (their recipes' kernels and applied Mods) on the
    Probe's trained model (:func:`fp8.probe.ne_cost`); None for no site. With Mods, a copy of the
    model gets them (a Mod's own parameters, such as a clamp, start where the Mod initialises them)."""
    import copy

    from fp8.mods import apply_site_mods
    from fp8.probe import ne_cost

    if not names or probe.losses is None:
        return None
    model = probe.model
    modded = {n: sites[n]["applied_mods"] for n in names if sites[n]["applied_mods"]}
    inner: dict[str, str] = {}
    if modded:
        model = copy.deepcopy(model)
        inner = apply_site_mods(model, modded)
    kernels = {inner.get(n, n): sites[n]["kernel"] for n in names}
    return ne_cost(model, probe.losses, kernels, confidence=probe.confidence)


def apply_model_ne_budget(sites: dict[str, dict], probe: Probe, budget_ne_rel: float,
                          require_fast: bool) -> dict[str, float] | None:
    """Keep the FP8 sites whose held-out NE cost, measured together, stays within the budget (in
    place, greedy in :func:`_sites_in_order`): each site joins only if the upper end of the cost
    interval of the sites kept so far plus it is at most ``budget_ne_rel`` (costs need not add:
    errors interact downstream, so they are measured, not summed). Returns the kept sites' cost."""
    kept: list[str] = []
    cost = None
    for n in _sites_in_order(sites, require_fast):
        c = placement_ne_cost(probe, sites, kept + [n])
        if c["ci_high"] <= budget_ne_rel:
            kept.append(n)
            cost = c
            continue
        _to_high_precision(sites[n], (
            f"model NE budget: with it, the FP8 sites' held-out NE cost together would be {100 * c['mean']:+.4f}% "
            f"[{100 * c['ci_low']:+.4f}%, {100 * c['ci_high']:+.4f}%] > budget {100 * budget_ne_rel:.4f}%"))
    return cost


def resolve_choice(fp8_choice: "FP8Choice", workload: Workload) -> "FP8Choice":
    """A ``budget`` choice becomes the placement a short Probe recommends (safety only: no speed
    requirement, because the present device is what runs it); any other choice is returned as is."""
    if fp8_choice.policy != "budget":
        return fp8_choice
    if fp8_choice.budget_sqnr_db is None:
        raise SpecError("policy 'budget' needs budget_sqnr_db", field="fp8.budget_sqnr_db")
    placement = recommend(workload, fp8_choice.budget_sqnr_db, require_fast=False, warmup_steps=20, max_batches=12)
    return fp8_choice.model_copy(update={"policy": "placement", "placement": placement.model_dump(mode="json")})
