"""Dispatch: per site, the fastest kernel on the present device whose error meets the site's budget.

Each available kernel of the registry (:data:`fp8.kernels.KERNELS`) is timed on the site's shape
for the whole linear: forward GEMM plus both backward GEMMs, quantization included (what the
layer costs in training). The measurement is built to survive a shared, noisy machine:

- one thread, and the thread's CPU time instead of wall time on the CPU (time the OS gives to
  other jobs is not charged to the kernel; wall time on CUDA, after a synchronize);
- each sample runs the linear enough times to last at least ``min_sample_ms`` (tiny GEMMs take
  tens of microseconds, below the timer's and the scheduler's noise);
- samples are taken in rounds, round-robin over the kernels, so that load drift hits all alike;
  a kernel's time is the median of its samples;
- sequential: after ``repeats`` rounds, the acceptable kernels that a one-sided Mann-Whitney test
  cannot tell apart from the fastest (p >= ``alpha``) get more rounds, up to ``max_repeats``.
  Kernels that remain indistinguishable are a statistical tie: either is "the fastest" here, and
  the tie goes to the more accurate one (fp32, then the higher SQNR lower bound).

Timings are cached by (shape, dtypes, device) in memory and, optionally, in a JSON file; decisions
by that key plus the budget and the set of acceptable kernels.

A kernel is *acceptable* when the Probe's lower confidence bound of its recipe's SQNR meets the
budget (fp32 always is). The decision is the acceptable kernel with the smallest median time.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from scipy import stats as sps

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


def linear_runner(kernel: Kernel, m: int, k: int, n: int, device: torch.device | str = "cpu",
                  seed: int = 0) -> Callable[[], None]:
    """A closure running the three GEMMs of a [m, k] -> [m, n] linear on ``kernel`` (inputs made once)."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(device)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(device)
    dy = (torch.randn(m, n, generator=g) * 1e-3).to(device)
    wt, xt, dyt = w.t().contiguous(), x.t().contiguous(), dy.t().contiguous()

    def once() -> None:
        # each GEMM cast as the kernel's recipe says (cubic.core.recipes)
        kernel.gemm(x, w, role="fwd")
        kernel.gemm(dy, wt, role="grad_input")
        kernel.gemm(dyt, xt, role="grad_weight")

    return once


def _clock(device: torch.device, threads: int | None) -> tuple[Callable[[], float], Callable[[], None]]:
    """(clock in seconds, sync). The thread's CPU time when all work runs on this thread (CPU, one
    torch thread): preemption by other jobs then costs nothing; wall time otherwise."""
    if device.type == "cuda":
        return time.perf_counter, torch.cuda.synchronize
    if threads == 1:
        return time.thread_time, (lambda: None)
    return time.perf_counter, (lambda: None)


def time_linear(kernel: Kernel, m: int, k: int, n: int, device: torch.device | str = "cpu", *,
                repeats: int = 7, warmup: int = 1, seed: int = 0, inner: int = 1,
                clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Times (ms per call) of the three GEMMs of a [m, k] -> [m, n] linear on ``kernel``; each
    sample averages ``inner`` back-to-back calls."""
    device = torch.device(device)
    once = linear_runner(kernel, m, k, n, device, seed)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        once()
    sync()
    out = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(inner):
            once()
        sync()
        out.append((clock() - t0) * 1e3 / inner)
    return out


def slower(a: list[float], b: list[float], alpha: float = 0.05) -> bool:
    """True when samples ``a`` are significantly slower than ``b`` (one-sided Mann-Whitney U)."""
    if len(a) < 3 or len(b) < 3:
        return False
    return bool(sps.mannwhitneyu(a, b, alternative="greater").pvalue < alpha)


@dataclass(frozen=True)
class Decision:
    kernel: str
    time_ms: float
    acceptable: tuple[str, ...]
    times_ms: dict[str, float]
    reason: str
    ties: tuple[str, ...] = ()  # acceptable kernels statistically indistinguishable from the pick


class Dispatcher:
    """Times kernels per (shape, dtypes, device) and picks the fastest acceptable one.

    ``repeats``: rounds for every kernel; ``max_repeats``: rounds at most for the kernels still in
    contention (see the module docstring); ``min_sample_ms``: the shortest sample (calls are
    repeated inside a sample until it lasts that long).
    """

    def __init__(self, kernels: dict[str, Kernel] | None = None, *, device: str = "cpu", repeats: int = 7,
                 max_repeats: int | None = None, min_sample_ms: float = 1.0, alpha: float = 0.05,
                 threads: int | None = 1, cache_path: str | Path | None = None):
        self.kernels = dict(kernels or KERNELS)
        self.device = torch.device(device)
        self.repeats = repeats
        self.max_repeats = max(repeats, max_repeats if max_repeats is not None else 3 * repeats)
        self.min_sample_ms = min_sample_ms
        self.alpha = alpha
        self.threads = threads
        self.cache_path = Path(cache_path) if cache_path else None
        self.timings: dict[str, dict[str, float]] = {}
        self.samples: dict[str, dict[str, list[float]]] = {}  # this process's samples (cache files keep medians)
        self.decisions: dict[str, Decision] = {}
        self.measurements = 0  # kernels timed from scratch (cache misses)
        self.rounds = 0  # extra rounds run for kernels in contention
        self._runners: dict[tuple[str, str], tuple[Callable[[], None], int]] = {}
        if self.cache_path and self.cache_path.is_file():
            self.timings = json.loads(self.cache_path.read_text()).get("timings", {})

    def key(self, m: int, k: int, n: int, dtype: torch.dtype = torch.float32) -> str:
        dev = self.device.type if self.device.type != "cuda" else f"cuda:{torch.cuda.get_device_name(self.device)}"
        return f"{m}x{k}x{n}|{str(dtype).replace('torch.', '')}|{dev}"

    def unavailable(self, m: int, k: int, n: int) -> dict[str, str]:
        out = {name: why for name, kern in self.kernels.items()
               if (why := kern.unavailable(self.device, m, k, n) or kern.untimed(self.device))}
        out.update({name: why for name, why in skipped_kernels().items() if name in self.kernels})
        return out

    def _sample(self, key: str, name: str, shape: tuple[int, int, int]) -> float:
        """One sample (ms per call); the first call for a kernel warms it up and sets its inner count."""
        clock, sync = _clock(self.device, self.threads)
        if (key, name) not in self._runners:
            once = linear_runner(self.kernels[name], *shape, self.device)
            t0 = time.perf_counter()
            once()  # warm-up (allocations, first-call dispatch); also a rough duration
            sync()
            first_ms = (time.perf_counter() - t0) * 1e3
            self._runners[(key, name)] = (once, max(1, min(1000, math.ceil(self.min_sample_ms / max(first_ms, 1e-3)))))
        once, inner = self._runners[(key, name)]
        t0 = clock()
        for _ in range(inner):
            once()
        sync()
        return (clock() - t0) * 1e3 / inner

    def _rounds(self, key: str, names: list[str], shape: tuple[int, int, int], rounds: int) -> None:
        # round-robin over kernels: load from other jobs on a shared machine hits all of them alike
        for _ in range(rounds):
            for name in names:
                self.samples[key].setdefault(name, []).append(self._sample(key, name, shape))

    def times(self, m: int, k: int, n: int, contenders: set[str] | None = None) -> dict[str, float]:
        """Median ms per available kernel for this shape (measured once, then cached). With
        ``contenders``, the ones that cannot yet be told apart from the fastest of them get more
        rounds (up to ``max_repeats``)."""
        key = self.key(m, k, n)
        cached = self.timings.setdefault(key, {})
        samples = self.samples.setdefault(key, {})
        skip = self.unavailable(m, k, n)
        todo = [name for name in self.kernels if name not in cached and name not in skip]
        with _threads(self.threads):
            self._rounds(key, todo, (m, k, n), self.repeats)
            self.measurements += len(todo)
            while contenders:
                live = [c for c in contenders if c in samples]
                if len(live) < 2:
                    break
                best = min(live, key=lambda c: statistics.median(samples[c]))
                tied = [c for c in live if c != best and not slower(samples[c], samples[best], self.alpha)]
                need = [c for c in [best, *tied] if len(samples[c]) < self.max_repeats]
                if not tied or len(need) < 2:
                    break
                self._rounds(key, need, (m, k, n), 1)
                self.rounds += 1
        for name, v in samples.items():
            cached[name] = statistics.median(v)
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
        times = self.times(m, k, n, contenders=set(acceptable))
        ranked = sorted((times[a], a) for a in acceptable if a in times)
        if not ranked:
            raise ValueError(f"no acceptable kernel can run {m}x{k}x{n} on {self.device}")
        t, best = ranked[0]
        samples = self.samples.get(self.key(m, k, n), {})
        ties = tuple(a for _, a in ranked[1:] if a in samples and best in samples
                     and not slower(samples[a], samples[best], self.alpha))
        note = ""
        if ties:
            # kernels this measurement cannot tell apart in speed: the more accurate one costs nothing
            def accuracy(name: str) -> float:
                r = self.kernels[name].recipe
                return math.inf if r == "fp32" else recipe_sqnr_low.get(r, -math.inf)

            pick = max((best, *ties), key=accuracy)
            if pick != best:
                ties = (best, *(a for a in ties if a != pick))
                best, t = pick, times[pick]
                note = "; the tie goes to the more accurate kernel"
        rejected = sorted(set(times) - set(acceptable))
        reason = f"fastest of {len(ranked)} acceptable kernels" + (
            f" (statistically tied with {', '.join(ties)}{note})" if ties else "") + (
            f"; over budget: {', '.join(rejected)}" if rejected else "")
        d = Decision(best, t, tuple(acceptable), dict(times), reason, ties)
        self.decisions[dkey] = d
        return d

    def _save(self) -> None:
        if self.cache_path:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            self.cache_path.write_text(json.dumps({"version": 1, "timings": self.timings}, indent=1))
