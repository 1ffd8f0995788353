"""Export a placement for torchao: a Python module a training job imports to apply it.

``cubic fp8 export placement.json --format torchao --out fp8_placement.py`` writes a module holding
the placement's plan (:func:`torchao_plan`: the FP8 sites grouped by recipe, each site's shape and
Mods) and :func:`apply_plan` (its source, copied verbatim, so the job runs the code tested here).
A job adds two lines::

    import fp8_placement
    model = fp8_placement.apply(model)   # before building the optimizer / torch.compile

``apply`` applies the sites' Mods (these need cubic's ``fp8.mods``; a placement without Mods needs
only torch and torchao), then calls ``torchao.float8.convert_to_float8_training`` once per recipe,
with ``Float8LinearConfig.from_recipe_name(recipe)`` and a ``module_filter_fn`` that matches exactly
that recipe's sites. It checks that every site exists with the placement's shape and, after
converting, that the converted modules are exactly the placement's sites: otherwise it raises
``ValueError`` naming the site, and the model is not half-converted silently.

Only torchao's ``Float8Linear`` recipes export (:data:`cubic.core.recipes.TORCHAO_RECIPES`); a site
on ``block128`` or ``mx32`` is refused with a :class:`~cubic.core.spec.SpecError` naming it and the
fix: probe with ``--recipes torchao`` (``recommend(..., recipes="torchao")``), which places each site
in the best recipe torchao runs. The export does not re-decide such a site itself: the budget holds
the FP8 sites together, so swapping one site's recipe needs the recommendation's rule, not a lookup.

A ``split_outliers`` site exports as it runs in cubic: its :class:`fp8.mods.OutlierSplitLinear`
wraps the site, torchao converts the inner ``<site>.linear`` (fed the input with the outlier
channels zeroed), and the outlier channels' GEMM runs in the layer's precision beside it against
the same weight. It picks its outlier channels on the first batch the job runs it on and keeps them
in its ``outlier`` buffer (state_dict), so a job resumed from its own checkpoint (``apply`` first,
then ``load_state_dict``) keeps the same channels.

A job with its own torchao calls uses :func:`placement_filters` instead (one :func:`module_filter_fn`
per recipe, one call each): checked as ``apply`` is (every site by name and shape in the job's
model, only torchao recipes), and refusing what a name filter cannot do (the sites of two recipes in
one call, a site's Mods).
"""

from __future__ import annotations

import inspect
import os
import pprint
import textwrap
from dataclasses import dataclass
from typing import Any

from cubic.core.recipes import TORCHAO_RECIPES
from cubic.core.spec import SpecError
from fp8.placement import Placement, load_placement

PLAN_VERSION = 1


def torchao_plan(placement: Placement, source: str = "placement") -> dict[str, Any]:
    """The placement as torchao applies it: ``{"version", "workload", "recipes": {recipe: [site, ...]},
    "shapes": {site: [k, n]}, "mods": {site: [{"name", "params"}, ...]}}`` (FP8 sites only)."""
    recipes: dict[str, list[str]] = {}
    for name, site in sorted(placement.fp8_sites().items()):
        if site.recipe not in TORCHAO_RECIPES:
            raise SpecError(f"recipe {site.recipe!r} is not a torchao Float8Linear recipe "
                            f"({', '.join(TORCHAO_RECIPES)}): torchao cannot run this site; probe again with "
                            f"--recipes torchao (recommend(..., recipes='torchao'))",
                            source=source, field=f"sites.{name}.recipe")
        recipes.setdefault(str(site.recipe), []).append(name)
    fp8 = placement.fp8_sites()
    return {
        "version": PLAN_VERSION,
        "workload": placement.workload,
        "recipes": recipes,
        "shapes": {n: [s.k, s.n] for n, s in sorted(fp8.items())},
        "mods": {n: [m.model_dump(mode="json") for m in s.applied_mods] for n, s in sorted(fp8.items())
                 if s.applied_mods},
    }


def split_sites(plan: dict[str, Any]) -> list[str]:
    """The plan's sites whose outlier channels run beside torchao's GEMM (the ``split_outliers`` Mod)."""
    return sorted(n for n, ms in plan.get("mods", {}).items() if any(m["name"] == "split_outliers" for m in ms))


def apply_plan(model, plan):
    """Apply a :func:`torchao_plan` to ``model`` in place with torchao; returns the model.

    Self-contained (its source is copied into exported modules): imports torch and torchao, and
    cubic's ``fp8.mods`` only when the plan has Mods.
    """
    from torch import nn
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def linears():
        return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}

    found = linears()
    for site, (k, n) in plan["shapes"].items():
        mod = found.get(site)
        if mod is None:
            under = sorted(name for name in found if name.endswith("." + site))[:3]
            raise ValueError(f"FP8 placement site {site!r}: the model has no nn.Linear of this name" + (
                f", but has {', '.join(map(repr, under))}: apply the placement to that sub-module" if under else ""))
        if (mod.in_features, mod.out_features) != (k, n):
            raise ValueError(f"FP8 placement site {site!r}: the placement says in={k}, out={n}; the model has "
                             f"in={mod.in_features}, out={mod.out_features}")
    inner = {}
    if plan.get("mods"):
        from fp8.mods import apply_site_mods  # cubic's Mods (pip install cubic)

        inner = apply_site_mods(model, plan["mods"])
    converted = {}
    for recipe, sites in plan["recipes"].items():
        names = frozenset(inner.get(s, s) for s in sites)
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                                   module_filter_fn=lambda mod, fqn, names=names: fqn in names)
        converted.update({name: recipe for name in names})
    now = {n: m for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    for name, recipe in converted.items():
        if name not in now:
            raise ValueError(f"FP8 placement site {name!r} was not converted by torchao ({recipe})")
    extra = sorted(set(now) - set(converted))
    if extra:
        raise ValueError(f"torchao converted modules outside the placement: {', '.join(extra)}")
    return model


def apply_placement_torchao(model, placement: Placement, source: str = "placement"):
    """Apply ``placement`` to ``model`` with torchao (in place; see the module docstring)."""
    return apply_plan(model, torchao_plan(placement, source))


@dataclass(frozen=True)
class SiteFilter:
    """torchao's ``module_filter_fn(module, fqn) -> bool`` for one ``convert_to_float8_training``
    call: exactly the placement's FP8 sites in ``recipe`` (None: a placement with no FP8 site)."""

    recipe: str | None
    sites: frozenset[str]

    def __call__(self, module, fqn: str) -> bool:
        return fqn in self.sites

    def config(self):
        """torchao's ``Float8LinearConfig`` for this recipe (the config the call must be given)."""
        from torchao.float8 import Float8LinearConfig

        # no FP8 site: any config converts nothing
        return Float8LinearConfig.from_recipe_name(self.recipe or "tensorwise")


def module_filter_fn(placement: Placement, recipe: str | None = None, *, model,
                     source: str = "placement") -> SiteFilter:
    """The module filter for one ``convert_to_float8_training(model, config=f.config(),
    module_filter_fn=f)`` call: the FP8 sites of ``recipe`` (may be omitted when the placement has one).

    Checked before torchao runs, the whole placement at every call (so the first call refuses, before
    any module is converted), each a :class:`~cubic.core.spec.SpecError` naming the file and field,
    because a name filter fails silently: a site the model lacks (the placement probed on a
    sub-module, or for another model) or has in another shape; sites of several recipes in one call
    (torchao would run them all in the one config given); a site with Mods (a filter cannot apply
    them: use ``cubic fp8 export --format torchao``); a recipe torchao does not run. ``model`` is
    required: a filter that matches nothing converts nothing, without a word.
    """
    from fp8.runtime import linear_sites, site_misfit

    plan = torchao_plan(placement, source)
    recipes = plan["recipes"]
    counts = ", ".join(f"{r}: {len(s)}" for r, s in recipes.items())
    if recipe is None and len(recipes) > 1:
        raise SpecError(f"the FP8 sites are in {len(recipes)} recipes ({counts}) and torchao converts one recipe per "
                        "call: one filter per recipe, each with its .config(), is placement_filters(placement, "
                        "model=model); or apply the export (cubic fp8 export --format torchao)",
                        source=source, field="sites")
    recipe = recipe if recipe is not None else next(iter(recipes), None)
    if recipe is not None and recipe not in recipes:
        raise SpecError(f"no FP8 site is in recipe {recipe!r} (the placement's: {counts or 'none'})",
                        source=source, field="sites")
    # every FP8 site, not only this recipe's: the first call refuses, before any module is converted
    # (a converted Float8Linear is still an nn.Linear of the same shape, so later calls pass again)
    if plan["mods"]:
        name, mods = next(iter(plan["mods"].items()))
        raise SpecError(f"site {name!r} carries Mods ({', '.join(m['name'] for m in mods)}) that a module filter "
                        "cannot apply: apply the export (cubic fp8 export --format torchao)",
                        source=source, field=f"sites.{name}.applied_mods")
    linears = linear_sites(model)
    for name in plan["shapes"]:
        if why := site_misfit(linears, name, placement.sites[name]):
            raise SpecError(why, source=source, field=f"sites.{name}")
    return SiteFilter(recipe, frozenset(recipes.get(recipe, [])))


def placement_filters(placement: Placement | str | os.PathLike, *, model) -> list[SiteFilter]:
    """One checked :func:`module_filter_fn` per recipe of ``placement`` (a :class:`Placement`, or a
    file read with :func:`fp8.placement.load_placement`, then named in every error)::

        for f in placement_filters("fp8.json", model=model):
            convert_to_float8_training(model, config=f.config(), module_filter_fn=f)
    """
    source = "placement"
    if not isinstance(placement, Placement):
        source = str(placement)
        placement = load_placement(source)
    return [module_filter_fn(placement, r, model=model, source=source) for r in placement.recipes()]


def export_module(placement: Placement, source: str = "placement") -> str:
    """The text of a Python module that applies ``placement`` with torchao (``apply(model)``)."""
    plan = torchao_plan(placement, source)
    counts = ", ".join(f"{len(v)} {k}" for k, v in plan["recipes"].items()) or "none"
    needs = "torch, torchao and cubic (for its Mods)" if plan["mods"] else "torch and torchao"
    split = split_sites(plan)
    if split:
        needs += (f". split_outliers at {', '.join(split)}: torchao converts each one's inner .linear; the "
                  "outlier input channels (picked on the first batch the job runs, kept in the state_dict) run "
                  "in high precision beside it; a checkpoint saved after apply(model) loads after apply(model)")
    head = textwrap.fill(f"FP8 sites: {counts} (of {len(placement.sites)} linear sites). Needs {needs}. "
                         "In the training job:", 100)
    return f'''"""FP8 placement for {placement.workload or source!s}, exported by `cubic fp8 export --format torchao`.

{head}

    import <this module>
    model = <this module>.apply(model)   # before building the optimizer / torch.compile
"""

PLAN = {pprint.pformat(plan, sort_dicts=True)}


{inspect.getsource(apply_plan)}

def apply(model):
    """Convert ``model``'s placement sites in place with torchao (one convert_to_float8_training per recipe)."""
    return apply_plan(model, PLAN)
'''
