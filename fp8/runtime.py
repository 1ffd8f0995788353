"""What the runner calls: ``apply_fp8(model, fp8_choice, workload) -> nn.Module``.

- ``off``: the model unchanged;
- ``all``: every ``nn.Linear`` site in FP8 with ``fp8_choice.recipe``;
- ``placement``: the sites of ``fp8_choice.placement`` (a placement document, see
  :mod:`fp8.placement`), each with its recipe and kernel; a bad document, or a site the model
  does not have, raises :class:`cubic.core.spec.SpecError` naming the field;
- ``budget``: not here: :func:`fp8.recommend.resolve_choice` turns it into a placement first (a
  short Probe on a copy of the model's workload), so this module never imports the Probe.

A site's ``applied_mods`` (fp8.mods) are applied first, in order; then its inner ``nn.Linear``
is converted in place to :class:`fp8.kernels.Fp8Linear`, which shares the original Parameters. A kernel that cannot run on the model's device is replaced by another implementation
of the same recipe (same numerics), e.g. the emulated one; a placement whose kernels were timed on
another device type (``probe_device``) gets its recipes' own kernels on this one.
"""

from __future__ import annotations

import torch
from torch import nn

from cubic.core.config import FP8Choice
from cubic.core.spec import SpecError, Workload
from fp8.kernels import KERNELS, default_kernel, swap_linears
from fp8.mods import apply_site_mods
from fp8.placement import Placement, parse_placement


def _device_of(model: nn.Module):
    p = next(model.parameters(), None)
    return p.device if p is not None else "cpu"


def linear_sites(model: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}


def _runnable(kernel: str, device, shape: tuple[int, int, int]) -> str:
    k = KERNELS[kernel]
    if k.unavailable(device, *shape) is None:
        return kernel
    return default_kernel(k.recipe, device, shape).name


def apply_fp8(model: nn.Module, fp8_choice: FP8Choice, workload: Workload | None = None, *,
              track_error: bool = False, dispatch: bool = False) -> nn.Module:
    """Convert ``model``'s sites to FP8 as ``fp8_choice`` says (in place; returns the model).

    ``dispatch``: placement sites use Dispatch's fastest acceptable kernel recorded in the
    placement instead of the recipe's kernel.
    """
    policy = fp8_choice.policy
    if policy == "off":
        return model
    sites = linear_sites(model)
    device = _device_of(model)
    if policy == "all":
        kernels = {n: default_kernel(fp8_choice.recipe, device, (m.out_features, m.in_features, m.out_features)).name
                   for n, m in sites.items()}
        return swap_linears(model, kernels, track_error)
    if policy == "placement":
        if fp8_choice.placement is None:
            raise SpecError("policy 'placement' needs a placement document", field="fp8.placement")
        placement = parse_placement(fp8_choice.placement, source="fp8.placement")
    elif policy == "budget":  # resolved by fp8.recommend.resolve_choice, which probes the model first
        raise SpecError("policy 'budget' must be resolved to a placement first (fp8.recommend.resolve_choice)",
                        field="fp8.policy")
    else:  # pragma: no cover - FP8Choice validates the literal
        raise SpecError(f"unknown policy {policy!r}", field="fp8.policy")
    return apply_placement(model, placement, track_error=track_error, dispatch=dispatch)


def site_misfit(sites: dict[str, nn.Linear], name: str, site) -> str | None:
    """Why a placement's site does not fit the model's linear sites (None when it does). A site the
    model holds under a longer name (the placement probed on a sub-module) is named: the fix is to
    apply the placement to that sub-module, not to rename."""
    if name not in sites:
        under = sorted(n for n in sites if n.endswith("." + name))
        if under:
            return (f"the model has no linear site of this name, but has {', '.join(map(repr, under[:3]))}: a "
                    "placement probed on a sub-module? apply it to that sub-module")
        near = ", ".join(sorted(sites)[:3]) + (", ..." if len(sites) > 3 else "")
        return f"the model has no linear site of this name ({len(sites)} sites: {near}): a placement for another model?"
    if (sites[name].in_features, sites[name].out_features) != (site.k, site.n):
        return (f"shape mismatch: placement says k={site.k}, n={site.n}; model has "
                f"{sites[name].in_features}, {sites[name].out_features}")
    return None


def workload_linear_sites(workload: Workload) -> dict[str, nn.Linear]:
    """The workload's model's linear sites by the names a placement probed on it carries
    (``dense.<module>``), built on the meta device: no memory, no init."""
    from cubic.core.models import build_dense

    with torch.device("meta"):
        dense = build_dense(workload)
    return {f"dense.{n}": m for n, m in linear_sites(dense).items()}


def placement_misfit(placement: Placement, workload: Workload) -> tuple[str, str] | None:
    """(field, why) for the first site of ``placement`` the workload's model lacks or has in another
    shape (None when every site fits): what :func:`apply_placement` would refuse inside a run, found
    before one starts. The dense part is built on the meta device: no memory, no init."""
    sites = workload_linear_sites(workload)
    for name, site in placement.sites.items():
        if why := site_misfit(sites, name, site):
            return f"sites.{name}", why
    return None


def apply_placement(model: nn.Module, placement: Placement, *, track_error: bool = False,
                    dispatch: bool = False) -> nn.Module:
    sites = linear_sites(model)
    device = _device_of(model)
    timed_here = torch.device(placement.probe_device).type == torch.device(device).type
    kernels: dict[str, str] = {}
    chosen = placement.sites if dispatch else placement.fp8_sites()
    modded = {n: s.applied_mods for n, s in placement.sites.items() if s.applied_mods}
    for name in modded:
        if why := site_misfit(sites, name, placement.sites[name]):
            raise SpecError(why, source="fp8.placement", field=f"sites.{name}")
    inner = apply_site_mods(model, modded)
    sites = linear_sites(model)
    for name, where in inner.items():  # a modded site's GEMM is its inner linear (padded shapes included)
        sites[name] = sites[where]
    for name, site in chosen.items():
        if dispatch and site.recipe is None and not (site.dispatch and site.dispatch.get("kernel") in KERNELS):
            continue
        if name not in inner and (why := site_misfit(sites, name, site)):  # a modded site was checked above
            raise SpecError(why, source="fp8.placement", field=f"sites.{name}")
        mod = sites[name]
        kernel = site.kernel
        if dispatch and site.dispatch and site.dispatch.get("kernel") in KERNELS:
            kernel = site.dispatch["kernel"]
        shape = (max(site.m, 1), mod.in_features, mod.out_features)
        if not timed_here and site.recipe is not None:
            # Dispatch chose this kernel by timings on another device type (e.g. an emulation that was
            # fastest on a CPU): here the recipe's own kernel (same numerics) is the one to run
            kernel = default_kernel(site.recipe, device, shape).name
        kernels[inner.get(name, name)] = _runnable(kernel, device, shape)  # type: ignore[arg-type]
    return swap_linears(model, kernels, track_error)
