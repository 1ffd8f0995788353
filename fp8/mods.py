"""Mods: module transforms that make sites FP8-friendly, and which Probe statistics call for them.

Each transform takes a model and site names (dotted ``nn.Linear`` names), replaces those sites in
place and returns the model. The replaced site keeps an inner ``nn.Linear`` named ``<site>.linear``
so FP8 conversion still finds it. Function-preserving unless said otherwise:

- :func:`pad_dims`: pad K and N to multiples of 16 (zeros; FP8 tensor-core GEMMs require it);
- :func:`normalize_rows`: divide each input row by its RMS before the GEMM and multiply the output
  back (a normalization moved in front of the FP8 cast): one tensor scale then fits every row;
- :func:`smooth_channels`: SmoothQuant-style migration of per-channel input outliers into the
  weight (``x / s``, ``W * s``), for inputs whose columns differ in scale;
- :func:`split_outliers`: the input channels (columns) whose magnitude dwarfs the rest's go through a
  high-precision GEMM of their own, the others through the FP8 GEMM (the outlier decomposition of
  LLM.int8(), Dettmers et al. 2022, applied to FP8): exact in exact arithmetic, and the FP8 casts no
  longer scale every row by the outlier channel's value (cubic's Mod; LoKA's paper names its Mods
  only as "reusable model adaptations" in the abstracts we could read);
- :func:`clamp_outliers`: a learned symmetric clamp (PACT, Choi et al. 2018) before the GEMM,
  initialised at a high percentile of |x|; *changes* the function on the clipped outliers;
- :func:`keep_first_last`: the first and last FP8 sites (in execution order) go back to high
  precision (the usual FP8 training practice for input and output layers).

:func:`suggest_mods` maps a site's Probe statistics to the mods that address them;
:func:`site_mods` turns them into the placement's per-site Mod entries (name + parameters, see
``fp8.placement.SiteMod``); :func:`apply_site_mods` applies such entries to a model and says where
each site's inner ``nn.Linear`` now is (what FP8 conversion and the Probe then use), and
:func:`probe_with_mods` measures the sites with their Mods on.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import torch
from torch import nn

from fp8.kernels import Fp8Linear, replace_module

CUDA_FP8_MULTIPLE = 16


def cuda_fp8_shape_problem(k: int, n: int) -> str | None:
    """Why cuBLASLt FP8 cannot run a [*, k] x [k, n] GEMM as is (None: it can)."""
    if k % CUDA_FP8_MULTIPLE or n % CUDA_FP8_MULTIPLE:
        return f"k={k} and n={n} must be multiples of {CUDA_FP8_MULTIPLE}"
    return None


def _linear(model: nn.Module, name: str) -> nn.Linear:
    mod = dict(model.named_modules()).get(name)
    if not isinstance(mod, nn.Linear):
        raise KeyError(f"{name!r} is not an nn.Linear site of the model")
    return mod


class PaddedLinear(nn.Module):
    def __init__(self, linear: nn.Linear, multiple: int = CUDA_FP8_MULTIPLE):
        super().__init__()
        k, n = linear.in_features, linear.out_features
        kp, np_ = -(-k // multiple) * multiple, -(-n // multiple) * multiple
        self.in_features, self.out_features, self.padded_in = k, n, kp
        self.linear = nn.Linear(kp, np_, bias=linear.bias is not None, device=linear.weight.device)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.weight[:n, :k] = linear.weight
            if linear.bias is not None:
                self.linear.bias.zero_()
                self.linear.bias[:n] = linear.bias
        # zero pads get zero gradients (zero inputs, sliced outputs), so they stay zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = self.padded_in - self.in_features  # (self.linear may be wrapped by a later Mod)
        if pad:
            x = nn.functional.pad(x, (0, pad))
        return self.linear(x)[..., : self.out_features]


def pad_dims(model: nn.Module, sites: Iterable[str], multiple: int = CUDA_FP8_MULTIPLE) -> nn.Module:
    for name in list(sites):
        lin = _linear(model, name)
        if lin.in_features % multiple or lin.out_features % multiple:
            replace_module(model, name, PaddedLinear(lin, multiple))
    return model


class RowNormalizedLinear(nn.Module):
    """``y = rms(x) * ((x / rms(x)) W^T) + b``: the GEMM sees rows of unit RMS."""

    def __init__(self, linear: nn.Linear, eps: float = 1e-12):
        super().__init__()
        self.linear, self.eps = linear, eps
        self.bias = linear.bias
        linear.bias = None  # the bias is added after the rescale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = x.pow(2).mean(dim=-1, keepdim=True).add(self.eps).sqrt()
        y = self.linear(x / r) * r
        return y + self.bias if self.bias is not None else y


def normalize_rows(model: nn.Module, sites: Iterable[str]) -> nn.Module:
    for name in list(sites):
        replace_module(model, name, RowNormalizedLinear(_linear(model, name)))
    return model


class SmoothedLinear(nn.Module):
    """``(x / s) (W * s)^T``: per-input-channel factors move activation outliers into the weight."""

    def __init__(self, linear: nn.Linear, x_col_amax: torch.Tensor | None = None, alpha: float = 0.5):
        super().__init__()
        self.linear, self.alpha = linear, alpha
        # without calibration data the factors come from the first batch seen (then stay fixed)
        self.register_buffer("s", torch.ones(linear.in_features, device=linear.weight.device))
        self.register_buffer("calibrated", torch.tensor(False))
        if x_col_amax is not None:
            self._calibrate(x_col_amax)

    @torch.no_grad()
    def _calibrate(self, x_col_amax: torch.Tensor) -> None:
        w_col_amax = self.linear.weight.detach().abs().amax(dim=0).clamp_min(1e-8)
        s = (x_col_amax.to(w_col_amax).clamp_min(1e-8) ** self.alpha / w_col_amax ** (1 - self.alpha)).clamp_min(1e-8)
        self.s.copy_(s)
        self.linear.weight.mul_(self.s)
        self.calibrated.fill_(True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not bool(self.calibrated):
            self._calibrate(x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0).float())
        return self.linear(x / self.s)


def smooth_channels(model: nn.Module, col_amax: Mapping[str, torch.Tensor | None], alpha: float = 0.5) -> nn.Module:
    """``col_amax``: site -> per-input-channel amax of its input (e.g. from a calibration batch), or
    None to calibrate on the first batch the site sees."""
    for name, amax in col_amax.items():
        replace_module(model, name, SmoothedLinear(_linear(model, name), amax, alpha))
    return model


class OutlierSplitLinear(nn.Module):
    """``y = linear(x * keep) + x[:, out] W[:, out]^T``: the outlier input channels (``out``, chosen on the
    first batch seen: column amax above ``ratio`` x the median column amax, at most ``max_frac`` of K,
    largest first) skip the inner (FP8) GEMM and run in the input's precision against the same weight
    columns; those columns get their gradients from that path (the inner GEMM sees zeros there)."""

    def __init__(self, linear: nn.Linear, ratio: float = 16.0, max_frac: float = 0.125):
        super().__init__()
        self.linear, self.ratio, self.max_frac = linear, float(ratio), float(max_frac)
        self.register_buffer("outlier", torch.zeros(linear.in_features, dtype=torch.bool, device=linear.weight.device))
        self.register_buffer("calibrated", torch.tensor(False))

    @torch.no_grad()
    def calibrate(self, x: torch.Tensor) -> None:
        col = x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
        big = col > self.ratio * col.median().clamp_min(1e-30)
        cap = max(1, int(self.max_frac * col.numel()))
        if int(big.sum()) > cap:
            big = torch.zeros_like(big)
            big[col.topk(cap).indices] = True
        self.outlier.copy_(big)
        self.calibrated.fill_(True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not bool(self.calibrated):
            self.calibrate(x)
        if not bool(self.outlier.any()):
            return self.linear(x)
        keep = (~self.outlier).to(x.dtype)
        idx = self.outlier.nonzero().squeeze(-1)
        w = self.linear.weight  # the same parameter the inner GEMM uses (FP8 conversion keeps it)
        return self.linear(x * keep) + nn.functional.linear(x.index_select(-1, idx), w.index_select(1, idx).to(x.dtype))


def split_outliers(model: nn.Module, sites: Iterable[str], ratio: float = 16.0, max_frac: float = 0.125) -> nn.Module:
    for name in list(sites):
        replace_module(model, name, OutlierSplitLinear(_linear(model, name), ratio, max_frac))
    return model


class ClampedLinear(nn.Module):
    """A learned symmetric clamp ``[-alpha, alpha]`` before the GEMM (alpha gets gradients)."""

    def __init__(self, linear: nn.Linear, alpha: float):
        super().__init__()
        self.linear = linear
        self.alpha = nn.Parameter(torch.tensor(float(alpha), device=linear.weight.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.alpha.abs()
        return self.linear(torch.clamp(x, -a, a))


def clamp_outliers(model: nn.Module, alphas: dict[str, float]) -> nn.Module:
    """``alphas``: site -> initial clamp (e.g. the Probe's p99.9 of |x| times a margin)."""
    for name, alpha in alphas.items():
        replace_module(model, name, ClampedLinear(_linear(model, name), alpha))
    return model


def keep_first_last(model: nn.Module) -> nn.Module:
    """Turn the first and last :class:`Fp8Linear` (module order) back into plain ``nn.Linear``."""
    fp8 = {n: m for n, m in model.named_modules() if isinstance(m, Fp8Linear)}
    ends = list(dict.fromkeys([next(iter(fp8)), list(fp8)[-1]])) if fp8 else []
    for name in ends:
        mod = fp8[name]
        plain = nn.Linear.__new__(nn.Linear)
        nn.Module.__init__(plain)
        plain.in_features, plain.out_features = mod.in_features, mod.out_features
        plain.weight, plain.bias = mod.weight, mod.bias
        replace_module(model, name, plain)
    return model


def suggest_mods(site: dict) -> list[str]:
    """Mods a probed site's statistics call for (``site`` from ``Probe.summary()``)."""
    x = site["stats"]["x"]
    out = []
    if cuda_fp8_shape_problem(site["k"], site["n"]):
        out.append("pad_dims")
    if x.get("col_spread_log2", 0.0) > SPLIT_COL_SPREAD_LOG2:
        # a few channels dwarf the others: split them off (exact). The row spread, dynamic range and
        # outliers the other Mods address were measured with those channels in; they are not stacked
        out.append("split_outliers")
        return out
    if x.get("row_spread_log2", 0.0) > 6.0:
        out.append("normalize_rows")
    if x.get("col_spread_log2", 0.0) > 5.0:
        out.append("smooth_channels")
    if x.get("outlier_frac", 0.0) > 1e-4 and x.get("dynamic_range_log2", 0.0) > 16.0:
        out.append("clamp_outliers")
    return out


MOD_NAMES: tuple[str, ...] = ("pad_dims", "normalize_rows", "smooth_channels", "clamp_outliers", "split_outliers")
APPLY_ORDER: tuple[str, ...] = ("pad_dims", "clamp_outliers", "normalize_rows", "split_outliers", "smooth_channels")
# column spread (log2 of max/median column amax) above which split_outliers replaces the other Mods:
# modelling choice, 2^8 = the outlier channels are 256x the typical one (wukong-small's lcb.proj: 2^11.6)
SPLIT_COL_SPREAD_LOG2 = 8.0
CLAMP_MARGIN = 4.0  # modelling choice: clamp at 4x the Probe's p99.9 of |x| (clips only extreme outliers)


def site_mods(site: dict) -> list[dict[str, Any]]:
    """The placement's Mod entries (``{"name", "params"}``) for a probed site (``Probe.summary()``
    entry): the suggested Mods, with their parameters from the site's statistics."""
    out = []
    # outermost first: the clamp sees the raw input its alpha was set from; the smoothing factors are
    # calibrated on the site's inner nn.Linear, so smooth_channels wraps it directly (last)
    for name in sorted(suggest_mods(site), key=APPLY_ORDER.index):
        params: dict[str, float] = {}
        if name == "clamp_outliers":
            x = site["stats"]["x"]
            params["alpha"] = float(max(CLAMP_MARGIN * x.get("p999", 0.0), 1e-6))
        elif name == "smooth_channels":
            params["alpha"] = 0.5
        elif name == "split_outliers":
            params.update(ratio=16.0, max_frac=0.125)
        out.append({"name": name, "params": params})
    return out


def _entry(m: Any) -> tuple[str, dict]:
    if isinstance(m, str):
        return m, {}
    if isinstance(m, Mapping):
        return m["name"], dict(m.get("params") or {})
    return m.name, dict(m.params)  # fp8.placement.SiteMod


def apply_site_mods(model: nn.Module, mods: Mapping[str, Iterable[Any]]) -> dict[str, str]:
    """Apply each site's Mod entries (names, ``{"name", "params"}`` dicts or SiteMods), in order, in
    place; returns site -> the dotted name of its inner ``nn.Linear`` (the GEMM FP8 converts)."""
    where: dict[str, str] = {}
    for site, entries in mods.items():
        inner = site
        names = [_entry(m)[0] for m in entries]
        if "smooth_channels" in names[:-1]:
            raise ValueError(f"smooth_channels must be the last Mod of site {site!r} (it rescales the weight of "
                             f"the nn.Linear it wraps)")
        for m in entries:
            name, params = _entry(m)
            if name not in MOD_NAMES:
                raise ValueError(f"unknown Mod {name!r} for site {site!r} (known: {', '.join(MOD_NAMES)})")
            lin = _linear(model, inner)
            if name == "pad_dims":
                if not (lin.in_features % CUDA_FP8_MULTIPLE or lin.out_features % CUDA_FP8_MULTIPLE):
                    continue
                replace_module(model, inner, PaddedLinear(lin, int(params.get("multiple", CUDA_FP8_MULTIPLE))))
            elif name == "normalize_rows":
                replace_module(model, inner, RowNormalizedLinear(lin))
            elif name == "smooth_channels":
                replace_module(model, inner, SmoothedLinear(lin, None, float(params.get("alpha", 0.5))))
            elif name == "split_outliers":
                replace_module(model, inner, OutlierSplitLinear(lin, float(params.get("ratio", 16.0)),
                                                                float(params.get("max_frac", 0.125))))
            else:
                if "alpha" not in params:
                    raise ValueError(f"clamp_outliers at {site!r} needs params.alpha")
                replace_module(model, inner, ClampedLinear(lin, float(params["alpha"])))
            inner = f"{inner}.linear"
        where[site] = inner
    return where


def probe_with_mods(model: nn.Module, mods: Mapping[str, Iterable[Any]], step: Callable[[int], None], *,
                    start_step: int = 0, **probe_kwargs: Any):
    """Apply ``mods`` to ``model`` (in place) and probe it while ``step(i)`` trains it: the sites'
    errors and statistics are measured with their Mods on, reported under the original site names."""
    from fp8.probe import Probe

    where = apply_site_mods(model, mods)
    probe = Probe(model, aliases={inner: site for site, inner in where.items()}, **probe_kwargs)
    return probe.run(step, start_step=start_step)
