"""Dispatch: per site, the fastest kernel on the present device whose error meets the site's budget.

Each available kernel of the registry (:data:`fp8.kernels.KERNELS`) is timed on the site's shape
for the whole linear: forward GEMM plus both backward GEMMs, quantization included (what the
layer costs in training). Times are medians over repeats, taken round-robin over the kernels, on one thread (the machine is shared;
one thread keeps other jobs from skewing the comparison). Timings are cached by
(shape, dtypes, device) in memory and, optionally, in a JSON file; decisions by that key plus the
budget and the set of acceptable kernels.

A kernel is *acceptable* when the Probe's lower confidence bound of its recipe's SQNR meets the
budget (fp32 always is). The decision is the acceptable kernel with the smallest median time.
"""

from __future__ import annotations

import json
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from fp8.kernels import KERNELS, Kernel, skipped_kernels


@contextmanager
def _threads(n: int | None):
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def time_linear(kernel: Kernel, m: int, k: int, n: int, device: torch.device | str = "cpu", *,
                repeats: int = 7, warmup: int = 1, seed: int = 0) -> list[float]:
    """Wall times (ms) of the three GEMMs of a [m, k] -> [m, n] linear on ``kernel``."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(device)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(device)
    dy = (torch.randn(m, n, generator=g) * 1e-3).to(device)
    wt, xt, dyt = w.t().contiguous(), x.t().contiguous(), dy.t().contiguous()

    def once() -> None:
        kernel.gemm(x, w, "e4m3", "e4m3")
        kernel.gemm(dy, wt, "e5m2", "e4m3")
        kernel.gemm(dyt, xt, "e5m2", "e4m3")

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        once()
    sync()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


@dataclass(frozen=True)
class Decision:
    kernel: str
    time_ms: float
    acceptable: tuple[str, ...]
    times_ms: dict[str, float]
    reason: str


class Dispatcher:
    """Times kernels per (shape, dtypes, device) and picks the fastest acceptable one."""

    def __init__(self, kernels: dict[str, Kernel] | None = None, *, device: str = "cpu", repeats: int = 7,
                 threads: int | None = 1, cache_path: str | Path | None = None):
        self.kernels = dict(kernels or KERNELS)
        self.device = torch.device(device)
        self.repeats = repeats
        self.threads = threads
        self.cache_path = Path(cache_path) if cache_path else None
        self.timings: dict[str, dict[str, float]] = {}
        self.decisions: dict[str, Decision] = {}
        self.measurements = 0  # kernel timings actually run (cache misses)
        if self.cache_path and self.cache_path.is_file():
            self.timings = json.loads(self.cache_path.read_text()).get("timings", {})

    def key(self, m: int, k: int, n: int, dtype: torch.dtype = torch.float32) -> str:
        dev = self.device.type if self.device.type != "cuda" else f"cuda:{torch.cuda.get_device_name(self.device)}"
        return f"{m}x{k}x{n}|{str(dtype).replace('torch.', '')}|{dev}"

    def unavailable(self, m: int, k: int, n: int) -> dict[str, str]:
        out = {name: why for name, kern in self.kernels.items() if (why := kern.unavailable(self.device, m, k, n))}
        out.update(skipped_kernels())
        return out

    def times(self, m: int, k: int, n: int) -> dict[str, float]:
        """Median ms per available kernel for this shape (measured once, then cached)."""
        key = self.key(m, k, n)
        cached = self.timings.setdefault(key, {})
        skip = self.unavailable(m, k, n)
        todo = [name for name in self.kernels if name not in cached and name not in skip]
        samples: dict[str, list[float]] = {name: [] for name in todo}
        with _threads(self.threads):
            for name in todo:  # warm-up pass
                time_linear(self.kernels[name], m, k, n, self.device, repeats=1, warmup=0)
            # round-robin over kernels: load from other jobs on a shared machine hits all of them alike
            for _ in range(self.repeats):
                for name in todo:
                    samples[name] += time_linear(self.kernels[name], m, k, n, self.device, repeats=1, warmup=0)
        for name in todo:
            cached[name] = statistics.median(samples[name])
            self.measurements += 1
        self._save()
        return {n_: t for n_, t in cached.items() if n_ in self.kernels}

    def decide(self, m: int, k: int, n: int, recipe_sqnr_low: dict[str, float], budget_db: float | None,
               allowed: set[str] | None = None) -> Decision:
        """Fastest kernel whose recipe's SQNR lower bound >= ``budget_db`` (fp32 is always acceptable).

        ``recipe_sqnr_low``: recipe -> lower confidence bound of its SQNR at this site (from the Probe).
        ``allowed``: optional restriction of the candidate kernels (e.g. one recipe's implementations).
        """
        acceptable = []
        for name, kern in self.kernels.items():
            if allowed is not None and name not in allowed:
                continue
            if kern.recipe == "fp32" or budget_db is None or recipe_sqnr_low.get(kern.recipe, -1e9) >= budget_db:
                acceptable.append(name)
        dkey = f"{self.key(m, k, n)}|{budget_db}|{','.join(sorted(acceptable))}"
        if dkey in self.decisions:
            return self.decisions[dkey]
        times = self.times(m, k, n)
        ranked = sorted((times[a], a) for a in acceptable if a in times)
        if not ranked:
            raise ValueError(f"no acceptable kernel can run {m}x{k}x{n} on {self.device}")
        t, best = ranked[0]
        rejected = sorted(set(times) - set(acceptable))
        reason = f"fastest of {len(ranked)} acceptable kernels" + (
            f"; over budget: {', '.join(rejected)}" if rejected else "")
        d = Decision(best, t, tuple(acceptable), dict(times), reason)
        self.decisions[dkey] = d
        return d

    def _save(self) -> None:
        if self.cache_path:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            self.cache_path.write_text(json.dumps({"version": 1, "timings": self.timings}, indent=1))
