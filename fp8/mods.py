"""Mods: module transforms that make sites FP8-friendly, and which Probe statistics call for them.

Each transform takes a model and site names (dotted ``nn.Linear`` names), replaces those sites in
place and returns the model. The replaced site keeps an inner ``nn.Linear`` named ``<site>.linear``
so FP8 conversion still finds it. Function-preserving unless said otherwise:

- :func:`pad_dims`: pad K and N to multiples of 16 (zeros; FP8 tensor-core GEMMs require it);
- :func:`normalize_rows`: divide each input row by its RMS before the GEMM and multiply the output
  back (a normalization moved in front of the FP8 cast): one tensor scale then fits every row;
- :func:`smooth_channels`: SmoothQuant-style migration of per-channel input outliers into the
  weight (``x / s``, ``W * s``), for inputs whose columns differ in scale;
- :func:`clamp_outliers`: a learned symmetric clamp (PACT, Choi et al. 2018) before the GEMM,
  initialised at a high percentile of |x|; *changes* the function on the clipped outliers;
- :func:`keep_first_last`: the first and last FP8 sites (in execution order) go back to high
  precision (the usual FP8 training practice for input and output layers).

:func:`suggest_mods` maps a site's Probe statistics to the mods that address them.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from fp8.kernels import Fp8Linear

CUDA_FP8_MULTIPLE = 16


def cuda_fp8_shape_problem(k: int, n: int) -> str | None:
    """Why cuBLASLt FP8 cannot run a [*, k] x [k, n] GEMM as is (None: it can)."""
    if k % CUDA_FP8_MULTIPLE or n % CUDA_FP8_MULTIPLE:
        return f"k={k} and n={n} must be multiples of {CUDA_FP8_MULTIPLE}"
    return None


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    modules = dict(model.named_modules())
    parent_name, _, child = name.rpartition(".")
    setattr(modules[parent_name] if parent_name else model, child, new)


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
        self.in_features, self.out_features = k, n
        self.linear = nn.Linear(kp, np_, bias=linear.bias is not None, device=linear.weight.device)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.weight[:n, :k] = linear.weight
            if linear.bias is not None:
                self.linear.bias.zero_()
                self.linear.bias[:n] = linear.bias
        # zero pads get zero gradients (zero inputs, sliced outputs), so they stay zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = self.linear.in_features - self.in_features
        if pad:
            x = nn.functional.pad(x, (0, pad))
        return self.linear(x)[..., : self.out_features]


def pad_dims(model: nn.Module, sites: Iterable[str], multiple: int = CUDA_FP8_MULTIPLE) -> nn.Module:
    for name in list(sites):
        lin = _linear(model, name)
        if lin.in_features % multiple or lin.out_features % multiple:
            _replace(model, name, PaddedLinear(lin, multiple))
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
        _replace(model, name, RowNormalizedLinear(_linear(model, name)))
    return model


class SmoothedLinear(nn.Module):
    """``(x / s) (W * s)^T``: per-input-channel factors move activation outliers into the weight."""

    def __init__(self, linear: nn.Linear, x_col_amax: torch.Tensor, alpha: float = 0.5):
        super().__init__()
        w_col_amax = linear.weight.detach().abs().amax(dim=0).clamp_min(1e-8)
        s = (x_col_amax.clamp_min(1e-8) ** alpha / w_col_amax ** (1 - alpha)).clamp_min(1e-8)
        self.register_buffer("s", s.to(linear.weight.device))
        with torch.no_grad():
            linear.weight.mul_(self.s)
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x / self.s)


def smooth_channels(model: nn.Module, col_amax: dict[str, torch.Tensor], alpha: float = 0.5) -> nn.Module:
    """``col_amax``: site -> per-input-channel amax of its input (e.g. from a calibration batch)."""
    for name, amax in col_amax.items():
        _replace(model, name, SmoothedLinear(_linear(model, name), amax, alpha))
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
        _replace(model, name, ClampedLinear(_linear(model, name), alpha))
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
        _replace(model, name, plain)
    return model


def suggest_mods(site: dict) -> list[str]:
    """Mods a probed site's statistics call for (``site`` from ``Probe.summary()``)."""
    x = site["stats"]["x"]
    out = []
    if cuda_fp8_shape_problem(site["k"], site["n"]):
        out.append("pad_dims")
    if x.get("row_spread_log2", 0.0) > 6.0:
        out.append("normalize_rows")
    if x.get("col_spread_log2", 0.0) > 5.0:
        out.append("smooth_channels")
    if x.get("outlier_frac", 0.0) > 1e-4 and x.get("dynamic_range_log2", 0.0) > 16.0:
        out.append("clamp_outliers")
    return out
