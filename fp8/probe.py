"""Probe: learn per-site statistics and FP8 error online, during real training steps.

Hooks on every ``nn.Linear`` site see its input ``x`` and weight ``w`` in the forward pass and its
output gradient ``dy`` in the backward pass (a tensor hook on the output). For each site and batch:

- statistics of ``x``, ``w`` and ``dy`` (:class:`TensorStats`): amax, |x| percentiles (p50, p99,
  p99.9), outlier fraction (share of |x| above 6 standard deviations), dynamic range
  (log2 of amax over the 1st percentile of nonzero |x|), per-row spread (log2 of the largest row
  amax over the median row amax) and the same across columns (channel outliers);
- the error of each recipe on the three GEMMs of the layer (forward, grad-input, grad-weight),
  computed for real (``torch._scaled_mm`` where it runs) against fp32: SQNR in dB and relative error.
  A site whose input needs no gradient (a first layer) never runs its grad-input GEMM in training,
  so that GEMM is left out of its error;
- the order in which sites execute in the forward pass (first and last layers), and whether a
  normalization feeds a site and an activation follows it, read from the autograd graph of the
  first step (functional ``F.relu`` / ``F.layer_norm`` calls count, not only modules).

Sampling is sequential: a site keeps being measured until, for every recipe, the 95% confidence
interval (Student t over batches) of its worst-GEMM SQNR is narrower than ``ci_halfwidth_db`` on
each side (at least ``min_batches``, at most ``max_batches``). The interval and the number of
batches each site needed are reported; a site is *safe* for a recipe when the interval's lower
end meets the budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch import nn

from cubic.core.spec import SpecError
from cubic.core.stats import t_half_width
from fp8.kernels import default_kernel, swapped
from fp8.recipes import FP8_RECIPES, RECIPES, linear_gemm_errors

GEMMS: tuple[str, ...] = ("fwd", "grad_input", "grad_weight")
SQNR_CAP_DB = 200.0  # exact results (inf) are capped so that means and intervals stay finite
NORMS = (nn.LayerNorm, nn.BatchNorm1d, nn.GroupNorm, nn.RMSNorm)
ACTS = {nn.Sigmoid: "sigmoid", nn.ReLU: "relu", nn.GELU: "gelu", nn.SiLU: "silu"}
# the same, read from the autograd graph (so functional calls such as F.relu are seen too): node name prefixes
GRAPH_ACTS = {"SigmoidBackward": "sigmoid", "ReluBackward": "relu", "GeluBackward": "gelu", "SiluBackward": "silu"}
GRAPH_NORMS = ("NativeLayerNormBackward", "NativeBatchNormBackward", "CudnnBatchNormBackward",
               "NativeGroupNormBackward", "FusedRmsNormBackward", "RmsNormBackward")
# shape-only ops looked through between a norm / activation and the linear
GRAPH_PASS = ("ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward", "TransposeBackward", "PermuteBackward",
              "SqueezeBackward", "UnsqueezeBackward", "CloneBackward", "NativeDropoutBackward", "TBackward")


class Welford:
    """Running mean and variance (Welford 1962): numerically stable, one pass."""

    def __init__(self) -> None:
        self.n, self.mean, self._m2 = 0, 0.0, 0.0

    def add(self, x: float) -> None:
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self._m2 += d * (x - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self._m2 / (self.n - 1)) if self.n > 1 else math.inf

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """Student-t confidence interval of the mean (infinite with fewer than two samples)."""
        if self.n < 2:
            return (-math.inf, math.inf)
        if self._m2 == 0.0:
            return (self.mean, self.mean)
        h = t_half_width(self.std, self.n, confidence)
        return (float(self.mean - h), float(self.mean + h))


@dataclass
class TensorStats:
    """Online statistics of one tensor role (x, w or dy) at one site; means over batches, amax max."""

    batches: int = 0
    amax: float = 0.0
    sums: dict[str, float] = field(default_factory=dict)

    KEYS = ("p50", "p99", "p999", "outlier_frac", "dynamic_range_log2", "row_spread_log2", "col_spread_log2")

    @torch.no_grad()
    def add(self, t: torch.Tensor, max_samples: int = 1 << 14) -> None:
        t = t.detach().float().reshape(-1, t.shape[-1])
        a = t.abs()
        flat = a.flatten()
        if flat.numel() > max_samples:  # quantiles of a fixed random subsample bound the cost
            idx = torch.randint(0, flat.numel(), (max_samples,), generator=torch.Generator().manual_seed(self.batches))
            flat = flat[idx.to(flat.device)]
        q = torch.quantile(flat, torch.tensor([0.5, 0.99, 0.999], device=flat.device)).tolist()
        amax = a.amax().item()
        std = t.std().item() if t.numel() > 1 else 0.0
        nz = flat[flat > 0]
        p1 = torch.quantile(nz, 0.01).item() if nz.numel() else 0.0
        row = a.amax(dim=1)
        col = a.amax(dim=0)

        def spread(v: torch.Tensor) -> float:
            med = v.median().item()
            return math.log2(v.max().item() / med) if med > 0 else 0.0

        vals = {
            "p50": q[0], "p99": q[1], "p999": q[2],
            "outlier_frac": (a > 6 * std).float().mean().item() if std > 0 else 0.0,
            "dynamic_range_log2": math.log2(amax / p1) if p1 > 0 else 0.0,
            "row_spread_log2": spread(row),
            "col_spread_log2": spread(col),
        }
        self.batches += 1
        self.amax = max(self.amax, amax)
        for k, v in vals.items():
            self.sums[k] = self.sums.get(k, 0.0) + v

    def summary(self) -> dict[str, float]:
        out = {"amax": self.amax}
        out.update({k: self.sums.get(k, 0.0) / max(self.batches, 1) for k in self.KEYS})
        return out


@dataclass
class SiteRecord:
    """Everything the Probe learned about one site."""

    name: str
    in_features: int
    out_features: int
    rows: int = 0  # M: rows of the flattened input (batch x any leading dims)
    norm_before: bool = False
    act_after: str | None = None
    stats: dict[str, TensorStats] = field(default_factory=lambda: {r: TensorStats() for r in ("x", "w", "dy")})
    sqnr: dict[str, dict[str, Welford]] = field(default_factory=dict)  # recipe -> gemm|worst -> running
    rel: dict[str, dict[str, Welford]] = field(default_factory=dict)
    batches: int = 0
    converged: bool = False
    grad_input_used: bool = True  # False for a first layer: its input needs no gradient, the GEMM never runs
    order: int = -1  # position in the forward pass (first executed site = 0)
    ne: dict[str, dict[str, float]] = field(default_factory=dict)  # recipe -> held-out NE cost (Probe.measure_ne)

    def error(self, recipe: str, confidence: float = 0.95) -> dict:
        w = self.sqnr[recipe]["worst"]
        lo, hi = w.interval(confidence)
        gemms = [g for g in GEMMS if self.sqnr[recipe][g].n]
        out = {
            "sqnr_db": w.mean, "ci_low_db": lo, "ci_high_db": hi, "batches": w.n, "sd_db": w.std,
            "rel_error": self.rel[recipe]["worst"].mean,
            "per_gemm_sqnr_db": {g: self.sqnr[recipe][g].mean for g in gemms},
            "per_gemm_ci_low_db": {g: self.sqnr[recipe][g].interval(confidence)[0] for g in gemms},
        }
        if recipe in self.ne:
            ne = self.ne[recipe]
            out |= {"ne_rel": ne["mean"], "ne_rel_ci_low": ne["ci_low"], "ne_rel_ci_high": ne["ci_high"],
                    "ne_rel_sd": ne.get("sd"), "ne_samples": ne.get("examples"), "ne_unit": ne.get("unit", "examples")}
        return out


class Probe:
    """Attach to a model, run training steps, and read :attr:`sites` (see the module docstring)."""

    def __init__(self, model: nn.Module, recipes: Iterable[str] = ("bf16",) + FP8_RECIPES, *,
                 sites: Iterable[str] | None = None, ci_halfwidth_db: float = 1.0, confidence: float = 0.95,
                 min_batches: int = 4, max_batches: int = 24, real: bool = True, max_rows: int = 4096,
                 seed: int = 0, stride: int = 1, aliases: dict[str, str] | None = None):
        # aliases: module name -> reported site name (a Mod moves a site's GEMM to "<site>.linear")
        self.model = model
        # measure every `stride`-th training step: the batches then span stride x max_batches steps,
        # so the interval also covers the statistics' drift over that part of training
        self.stride = max(1, int(stride))
        self._measuring = True
        self.recipes = tuple(recipes)
        self.ci_halfwidth_db = ci_halfwidth_db
        self.confidence = confidence
        self.min_batches = min_batches
        self.max_batches = max_batches
        self.real = real
        self.max_rows = max_rows
        self._gen = torch.Generator().manual_seed(seed)
        linears = {(aliases or {}).get(n, n): m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        wanted = set(sites) if sites is not None else set(linears)
        unknown = wanted - set(linears)
        if unknown:
            raise KeyError(f"not linear sites of the model: {', '.join(sorted(unknown))}")
        empty = [n for n in sorted(wanted) if 0 in (linears[n].in_features, linears[n].out_features)]
        if empty:
            m = linears[empty[0]]
            raise SpecError(f"site {empty[0]!r} is a zero-width nn.Linear (in_features={m.in_features}, "
                            f"out_features={m.out_features}): there is no GEMM to probe", field="model")
        self.modules = {n: m for n, m in linears.items() if n in wanted}
        self.sites: dict[str, SiteRecord] = {
            n: SiteRecord(n, m.in_features, m.out_features) for n, m in self.modules.items()
        }
        for rec in self.sites.values():
            rec.sqnr = {r: {g: Welford() for g in (*GEMMS, "worst")} for r in self.recipes}
            rec.rel = {r: {g: Welford() for g in (*GEMMS, "worst")} for r in self.recipes}
        self._handles: list = []
        self._pending: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._next_order = 0
        self._graph_io: dict[str, tuple] = {}
        self._dataflow_done = False
        self.steps = 0
        self.losses: Callable[[nn.Module], torch.Tensor] | None = None  # held-out losses (measure_ne)

    # -- hooks -----------------------------------------------------------------------------
    def attach(self) -> "Probe":
        self._detect_neighbours()
        for name, mod in self.modules.items():
            self._handles.append(mod.register_forward_hook(self._forward_hook(name)))
        self._handles.append(self.model.register_forward_hook(self._model_hook))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._pending.clear()

    def __enter__(self) -> "Probe":
        return self.attach()

    def __exit__(self, *exc) -> None:
        self.detach()

    def _forward_hook(self, name: str):
        def hook(mod: nn.Module, inputs, output):
            rec = self.sites[name]
            if not self._measuring or rec.converged or not torch.is_grad_enabled() or not output.requires_grad:
                return
            x = inputs[0]
            _check_finite(x, name, "input", self.steps)
            _check_finite(output, name, "output", self.steps)
            if self.steps == 0:  # the nodes around this site in the autograd graph, for _dataflow
                self._graph_io[name] = (x.grad_fn, output.grad_fn)
            rec.grad_input_used = bool(x.requires_grad)
            if rec.order < 0:
                rec.order = self._next_order
                self._next_order += 1
            x = x.detach()
            self._pending[name] = (x.reshape(-1, x.shape[-1]), mod.weight.detach().clone())
            output.register_hook(self._grad_hook(name))
        return hook

    def _grad_hook(self, name: str):
        def hook(dy: torch.Tensor):
            pending = self._pending.pop(name, None)
            if pending is not None:
                _check_finite(dy, name, "output gradient", self.steps)
                self._measure(name, pending[0], pending[1], dy.detach().reshape(-1, dy.shape[-1]))
        return hook

    @torch.no_grad()
    def _measure(self, name: str, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> None:
        rec = self.sites[name]
        rec.rows = x.shape[0]
        for role, t in (("x", x), ("w", w), ("dy", dy)):
            rec.stats[role].add(t)
        if x.shape[0] > self.max_rows:
            # a fixed-size random subset of rows (the same rows of x and dy) bounds the cost
            idx = torch.randperm(x.shape[0], generator=self._gen)[: self.max_rows].to(x.device)
            x, dy = x[idx], dy[idx]
        all_errs = linear_gemm_errors(x, w, dy, self.recipes, real=self.real)
        for recipe in self.recipes:
            errs = all_errs[recipe]
            if not rec.grad_input_used:  # training never runs this GEMM: its error is not the site's
                errs = {g: v for g, v in errs.items() if g != "grad_input"}
            worst_s, worst_r = SQNR_CAP_DB, 0.0
            for g, (s, r) in errs.items():
                s = min(s, SQNR_CAP_DB)
                rec.sqnr[recipe][g].add(s)
                rec.rel[recipe][g].add(r)
                worst_s, worst_r = min(worst_s, s), max(worst_r, r)
            rec.sqnr[recipe]["worst"].add(worst_s)
            rec.rel[recipe]["worst"].add(worst_r)
        rec.batches += 1
        rec.converged = self._narrow(rec) or rec.batches >= self.max_batches

    def _narrow(self, rec: SiteRecord) -> bool:
        if rec.batches < self.min_batches:
            return False
        for recipe in self.recipes:
            lo, hi = rec.sqnr[recipe]["worst"].interval(self.confidence)
            if (hi - lo) / 2 > self.ci_halfwidth_db:
                return False
        return True

    def _detect_neighbours(self) -> None:
        """Which sites follow a norm module / precede an activation module, from execution order
        (the fallback when the autograd graph cannot be read, see :meth:`_dataflow`)."""
        order: list[nn.Module] = []
        leaves = [m for m in self.model.modules() if not list(m.children())]
        hs = [m.register_forward_pre_hook(lambda m, i: order.append(m)) for m in leaves]
        self._order_hooks = hs
        self._leaf_order = order

    def _model_hook(self, mod: nn.Module, inputs, output) -> None:
        if self._measuring and self.steps == 0 and not self._dataflow_done:
            self._dataflow(output)

    def _dataflow(self, output) -> None:
        """norm_before / act_after from the first step's autograd graph: what produced each site's
        input and what consumes its output, looking through shape-only ops. Unlike module order, this
        sees functional calls (``F.relu``, ``torch.sigmoid``, ``F.layer_norm``) and only real data flow."""
        roots = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
        if not roots or not self._graph_io:
            return
        consumers: dict = {}
        seen, stack = set(), list(roots)
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            for nxt, _ in node.next_functions:
                if nxt is not None:
                    consumers.setdefault(nxt, []).append(node)
                    stack.append(nxt)
        for name, (in_fn, out_fn) in self._graph_io.items():
            rec = self.sites[name]
            rec.act_after = _find_act(out_fn, consumers)
            rec.norm_before = _find_norm(in_fn)
        self._dataflow_done = True

    def note_order(self) -> None:
        """After the first probed step: norm_before / act_after from the autograd graph, or (when it
        could not be read) from the leaf modules' execution order."""
        order = getattr(self, "_leaf_order", [])
        for h in getattr(self, "_order_hooks", []):
            h.remove()
        self._order_hooks = []
        self._graph_io.clear()
        if self._dataflow_done:
            return
        ids = {id(m): n for n, m in self.modules.items()}
        for i, m in enumerate(order):
            name = ids.get(id(m))
            if name is None:
                continue
            rec = self.sites[name]
            rec.norm_before = i > 0 and isinstance(order[i - 1], NORMS)
            if i + 1 < len(order):
                rec.act_after = next((v for k, v in ACTS.items() if isinstance(order[i + 1], k)), None)

    # -- driving ---------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return all(r.converged for r in self.sites.values())

    def run(self, step_fn: Callable[[int], None], start_step: int = 0) -> "Probe":
        """Call ``step_fn(step)`` (one training step: forward, backward, optimizer) until every
        site's intervals are narrow or ``max_batches`` steps have been measured (one in every
        ``stride`` steps; the others train without the Probe looking)."""
        with self:
            step = start_step
            self.trained_steps = 0
            while not self.done and self.steps < self.max_batches:
                for _ in range(self.stride - 1):
                    self._measuring = False
                    step_fn(step)
                    step += 1
                    self.trained_steps += 1
                self._measuring = True
                step_fn(step)
                if self.steps == 0:
                    self.note_order()
                self.steps += 1
                self.trained_steps += 1
                step += 1
        return self

    def measure_ne(self, losses: Callable[[nn.Module], torch.Tensor], recipes: Iterable[str] | None = None,
                   unit: str = "examples") -> "Probe":
        """Each site's held-out NE cost per recipe (:func:`ne_cost`): the trained model with that
        site alone in the recipe's forward. SQNR averages the noise over a tensor; this sees what it
        does to the predictions: on wukong-small a site at 29 dB (``layers.0.lcb.proj``, whose rows mix
        the dense features' heavy-tailed projection with the embeddings) costs +0.16% [+0.10%, +0.23%]
        NE, from a per-example tail that a tensor-wide SQNR cannot show. ``losses(model)``: its
        per-example (or per-batch) losses on held-out data, kept as :attr:`losses` for measuring
        sites together (:func:`ne_cost`). ``unit``: what one of the losses is (``examples``, or
        ``batches`` when each is a batch's loss), for the number of them that would decide a site."""
        self.losses = losses
        self.ne_unit = unit
        base = losses(self.model)
        bad = ~torch.isfinite(base)
        if bool(bad.any()):
            raise SpecError(f"the full-precision held-out loss is not finite ({base[bad][0].item()}, held-out "
                            f"{unit[:-1]} {int(bad.nonzero()[0, 0])} after {getattr(self, 'trained_steps', 0)} training steps): "
                            f"nothing to compare FP8 against", field="model")
        for name, rec in self.sites.items():
            by_fwd: dict = {}  # recipes whose forward GEMMs round alike (the table's casts) share it
            for recipe in recipes or self.recipes:
                fwd = (RECIPES[recipe].fwd, RECIPES[recipe].pow2_scales) if recipe in RECIPES else recipe
                if fwd not in by_fwd:
                    kern = default_kernel(recipe, base.device, (max(rec.rows, 1), rec.in_features, rec.out_features))
                    by_fwd[fwd] = ne_cost(self.model, losses, {self._inner(name): kern.name}, base, self.confidence)
                    by_fwd[fwd]["unit"] = unit
                rec.ne[recipe] = by_fwd[fwd]
        return self

    def _inner(self, site: str) -> str:
        """The module name of a site's GEMM (differs from the site's name when a Mod wraps it)."""
        mod = self.modules[site]
        return next(n for n, m in self.model.named_modules() if m is mod)

    def summary(self) -> dict[str, dict]:
        out = {}
        for name, rec in self.sites.items():
            out[name] = {
                "m": rec.rows, "k": rec.in_features, "n": rec.out_features,
                "norm_before": rec.norm_before, "act_after": rec.act_after,
                "order": rec.order, "grad_input_used": rec.grad_input_used,
                "batches": rec.batches, "converged_ci": self._narrow(rec),
                "stats": {role: s.summary() for role, s in rec.stats.items()},
                "errors": {r: rec.error(r, self.confidence) for r in self.recipes},
            }
        return out


def ne_cost(model: nn.Module, losses: Callable[[nn.Module], torch.Tensor], kernels: dict[str, str],
            base: torch.Tensor | None = None, confidence: float = 0.95) -> dict[str, float]:
    """Relative NE cost of running ``kernels`` (module name -> FP8 kernel) in ``model``'s forward,
    paired on the same held-out examples: mean of ``(loss_fp8 - loss) / mean(loss)`` with its
    Student-t interval over the examples (NE is the log loss over the labels' base-rate entropy, so
    on the same labels the relative NE and loss differences are equal). Forward only, on one
    trained model: training in FP8 adds its own cost on top, which only paired training runs
    measure (fp8.quality)."""
    with torch.no_grad():
        base = losses(model) if base is None else base
        with swapped(model, kernels):
            q = losses(model)
        d = ((q - base) / base.mean()).double().reshape(-1)
    n = d.numel()
    mean = float(d.mean())
    sd = float(d.std()) if n > 1 else math.inf
    h = t_half_width(sd, n, confidence)
    return {"mean": mean, "ci_low": mean - h, "ci_high": mean + h, "examples": n, "sd": sd}


def _check_finite(t, site: str, what: str, step: int) -> None:
    """Stop the Probe at the first non-finite tensor (one line naming the site and the step): NaN
    statistics would otherwise read as an exact, safe site (SQNR capped at 200 dB)."""
    if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
        kind = "NaN" if bool(torch.isnan(t).any()) else "inf"
        raise SpecError(f"non-finite {what} ({kind}) at site {site!r} in probed step {step}: the model or its "
                        f"batches produce {kind}; fix them before probing", field="model")


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _name(node) -> str:
    return type(node).__name__


def _find_act(out_fn, consumers: dict, depth: int = 4) -> str | None:
    frontier = [out_fn] if out_fn is not None else []
    for _ in range(depth):
        nxt = []
        for node in frontier:
            for c in consumers.get(node, []):
                name = _name(c)
                act = next((v for k, v in GRAPH_ACTS.items() if name.startswith(k)), None)
                if act:
                    return act
                if name.startswith(GRAPH_PASS):
                    nxt.append(c)
        frontier = nxt
    return None


def _find_norm(in_fn, depth: int = 4) -> bool:
    node = in_fn
    for _ in range(depth):
        if node is None:
            return False
        name = _name(node)
        if name.startswith(GRAPH_NORMS):
            return True
        if not name.startswith(GRAPH_PASS):
            return False
        node = next((n for n, _ in node.next_functions if n is not None), None)
    return False
