"""The one training step every runner uses: model, optimizers, data, loss, NaN check.

``TrainSession(workload, config, device, transform=None)`` builds the model
(:func:`cubic.core.models.build_model`), its optimizers (:func:`cubic.core.models.build_optimizer`:
Adam over the dense part, row-wise AdaGrad for embeddings -- fused into FBGEMM's backward or
:class:`cubic.core.models.RowWiseAdagrad`), and the data (:class:`cubic.core.data.SyntheticData`, data
seed from the workload, so every config of a workload sees the same batches and eval batch).

- ``step(step, batch=None, clock=None) -> loss``: forward, BCE-with-logits, backward, optimizer
  step; raises :class:`NonFiniteLoss` when the loss is not finite. ``step_unchecked`` is the same
  step keeping the loss as a tensor, so that nothing waits for the device; ``check_losses()`` later
  checks every loss kept since the last check at once (one transfer) and raises
  :class:`NonFiniteLoss` naming the first bad step. Without a clock the forward is
  ``model(batch)`` (so forward hooks on the model see it: the FP8 Probe). With a
  :class:`PhaseClock` the same computation runs with the backward split exactly at the pooled
  embeddings (detached: the dense part runs backward to them, then the embedding stage from their
  gradient), so the clock can time ``embedding_fwd``, ``dense_fwd`` (dense forward and loss),
  ``dense_bwd``, ``embedding_bwd`` (with FBGEMM including the fused update) and ``optimizer``;
  time inside collectives is moved to ``communication``.
- ``evaluate() -> {loss, ne}`` on the workload's held-out eval batch.
- ``transform(model) -> model``: applied once after building (the runners pass FP8 conversion,
  ``fp8.runtime.apply_fp8``; this base layer never imports fp8), before the optimizers are built.
- ``.model`` is the live model (the FP8 Probe hooks it).

Data parallelism (``world_size > 1``, a process group initialised by the caller): batch ``step`` is
the *global* batch (``workload.batch_size`` examples); this rank trains on its contiguous slice
``[rank * B, (rank + 1) * B)``, ``B = batch / world_size``. The backward runs on ``loss / W``; the
replicated parameters (dense, and what the embedding stage lists in ``replicated_parameters()``)
have their gradients summed over ranks (one flat all-reduce), which is the gradient of the global
mean loss, i.e. the average of the per-rank gradients; a sharded embedding stage receives the same
scale through its reverse all-to-all. The returned loss is the global batch's mean loss, so a run on
W ranks and a one-process run of the same global batch give the same numbers up to float summation
order. ``evaluate`` runs the whole eval batch on every rank (identical results on every rank).

Embedding optimizer (``workload.optimizers.embedding``, or a config's ``optimizers.embedding``
override): ``rowwise_adagrad``, ``sgd``, or ``ms_rowwise_adagrad`` -- momentum-scaled row-wise
AdaGrad of arXiv 2508.03854, reconstructed from a third-party summary of the paper (its text was
not reachable; see :class:`cubic.core.models.RowWiseAdagrad`): in one process, and in 2D runs that
sync gradients every step, it is row-wise AdaGrad; in 2D runs that average weights, its row
accumulator is divided by the number of replicas. 2D embedding stages (``cubic.runners.distributed``)
expose ``before_optimizer()`` / ``after_optimizer()``, which the step calls around the optimizer
step (replica gradient sync, periodic weight and optimizer-state averaging).
"""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cubic.core.config import Config
from cubic.core.data import Batch, SparseBatch, SyntheticData, normalized_entropy
from cubic.core.models import build_model, build_optimizer
from cubic.core.spec import Workload

HELD_OUT_STEP = 2**40  # the held-out batch's step: no run trains this far
TIMED_PHASES = ("embedding_fwd", "dense_fwd", "dense_bwd", "embedding_bwd", "optimizer")


class NonFiniteLoss(FloatingPointError):
    """The training loss is NaN or infinite: the run stops (a ``nan`` failure)."""

    def __init__(self, step: int, value: float):
        super().__init__(f"training loss is {value} at step {step}")
        self.step, self.value = step, value


class PhaseClock:
    """Wall time of each phase of one step, synchronising the device at every boundary.

    ``comm()`` returns the cumulative seconds spent inside collectives so far; what a phase spent
    there is moved from the phase to ``communication``.
    """

    def __init__(self, device: torch.device, comm: Callable[[], float] | None = None):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.comm = comm or (lambda: 0.0)
        self.ms: dict[str, float] = {}

    def start(self) -> None:
        self.sync()
        self.ms = {p: 0.0 for p in (*TIMED_PHASES, "communication")}
        self._t = self._t0 = time.perf_counter()
        self._c = self.comm()

    def mark(self, phase: str) -> None:
        self.sync()
        t, c = time.perf_counter(), self.comm()
        in_comm = c - self._c
        self.ms[phase] += (t - self._t - in_comm) * 1e3
        self.ms["communication"] += in_comm * 1e3
        self._t, self._c = t, c

    @property
    def step_ms(self) -> float:
        return (self._t - self._t0) * 1e3


class _NoClock:
    def mark(self, phase: str) -> None:
        pass


def slice_batch(batch: Batch, lo: int, hi: int) -> Batch:
    """Examples ``[lo, hi)`` of a batch (ids and offsets re-based per table)."""
    values, offsets = [], []
    for v, off in zip(batch.sparse.values, batch.sparse.offsets):
        a, b = int(off[lo]), int(off[hi])
        values.append(v[a:b])
        offsets.append(off[lo:hi + 1] - a)
    return Batch(batch.dense[lo:hi], SparseBatch(list(batch.sparse.tables), values, offsets), batch.labels[lo:hi])


class TrainSession:
    """A workload's model, optimizers and data, trained one step at a time (see the module docstring)."""

    def __init__(self, workload: Workload, config: Config | None = None, device: str | torch.device = "cpu", *,
                 transform: Callable[[nn.Module], nn.Module | None] | None = None,
                 embedding: nn.Module | None = None, rank: int = 0, world_size: int = 1):
        self.config = config or Config()
        self.device = torch.device(device)
        self.workload = self.config.apply(workload)
        if self.workload.batch_size % world_size:
            raise ValueError(f"global batch {self.workload.batch_size} is not divisible by {world_size} ranks")
        self.rank, self.world_size = rank, world_size
        self.local_batch = self.workload.batch_size // world_size
        model = build_model(workload, self.config, device=self.device, embedding=embedding)
        if transform is not None:
            model = transform(model) or model
        self.model = model
        self.optimizer = build_optimizer(model)
        self.data = SyntheticData(self.workload)
        self._tbe = getattr(model.embedding, "kernel", None) == "fbgemm"
        extra = getattr(model.embedding, "replicated_parameters", None)
        self.replicated = list(model.dense.parameters()) + (list(extra()) if extra else [])
        # a 2D embedding stage keeps its replicas in step around the optimizer step (gradient sync
        # before it, weight averaging after it); other stages have neither hook
        self._before_opt = getattr(model.embedding, "before_optimizer", None)
        self._after_opt = getattr(model.embedding, "after_optimizer", None)
        self.comm_s = 0.0  # seconds in this session's own collectives (gradient and loss all-reduce)
        self.loss_hook: Callable[[int, torch.Tensor], torch.Tensor] | None = None  # tests: fault injection
        self.losses: list[float] = []
        self._unchecked: list[tuple[int, torch.Tensor]] = []  # (step, loss) not yet read back
        self._eval: Batch | None = None
        self._held_out: Batch | None = None

    # -- data ---------------------------------------------------------------------------------
    def batch(self, step: int) -> Batch:
        """This rank's part of training batch ``step``, on the device (TBE layout prepared)."""
        b = self.data.batch(step)
        if self.world_size > 1:
            b = slice_batch(b, self.rank * self.local_batch, (self.rank + 1) * self.local_batch)
        return self._prepare(b)

    def _prepare(self, b: Batch) -> Batch:
        b = b.to(self.device)
        if self._tbe:
            b.sparse.to_tbe()  # the flat TBE layout is input preparation, not training
        return b

    def comm_seconds(self) -> float:
        """Cumulative seconds in collectives: the session's and the embedding stage's all-to-alls."""
        return self.comm_s + getattr(self.model.embedding, "comm_s", 0.0)

    # -- training -----------------------------------------------------------------------------
    def step(self, step: int, batch: Batch | None = None, clock: PhaseClock | None = None) -> float:
        """One training step on batch ``step`` (or the given, already prepared one); the loss."""
        self.step_unchecked(step, batch, clock)
        self.check_losses()
        return self.losses[-1]

    def step_unchecked(self, step: int, batch: Batch | None = None, clock: PhaseClock | None = None) -> None:
        """:meth:`step` without reading the loss back: it is kept (a detached tensor) for
        :meth:`check_losses`, so the host never waits for the device inside the step."""
        b = batch if batch is not None else self.batch(step)
        model = self.model
        if not model.training:  # train() walks every module (~25 us a step on dlrm-small): only after eval
            model.train()
        scale = 1.0 / self.world_size
        if clock is None:  # through model(batch), so forward hooks on the model see the step (FP8 Probe)
            loss = F.binary_cross_entropy_with_logits(model(b), b.labels)
            if self.loss_hook is not None:
                loss = self.loss_hook(step, loss)
            (loss * scale if self.world_size > 1 else loss).backward()
        else:  # the same computation with the backward split at the pooled embeddings, for phase times
            pooled = model.embedding.pooled(b.sparse)
            clock.mark("embedding_fwd")
            leaf = pooled.detach().requires_grad_()
            logits = model.dense_forward(b.dense, model.embedding.split(leaf))
            loss = F.binary_cross_entropy_with_logits(logits, b.labels)
            if self.loss_hook is not None:
                loss = self.loss_hook(step, loss)
            clock.mark("dense_fwd")
            (loss * scale if self.world_size > 1 else loss).backward()
            clock.mark("dense_bwd")
            pooled.backward(leaf.grad)
            clock.mark("embedding_bwd")
        clk = clock or _NoClock()
        value = loss.detach()
        if self.world_size > 1:
            value = self._sync(value)
        if self._before_opt is not None:
            self._before_opt()
        self.optimizer.step()
        if self._after_opt is not None:
            self._after_opt()
        self.optimizer.zero_grad()
        clk.mark("optimizer")
        self._unchecked.append((step, value))

    def check_losses(self) -> None:
        """Read back the losses of the steps taken since the last check (one transfer for all) into
        ``losses``; raises :class:`NonFiniteLoss` at the first non-finite one (the losses before it
        are kept, the rest dropped)."""
        if not self._unchecked:
            return
        steps = [s for s, _ in self._unchecked]
        values = torch.stack([v.reshape(()).float() for _, v in self._unchecked]).tolist()
        self._unchecked.clear()
        for s, v in zip(steps, values):
            if not math.isfinite(v):
                raise NonFiniteLoss(s, v)
            self.losses.append(v)

    def _sync(self, loss: torch.Tensor) -> torch.Tensor:
        """Sum the replicated gradients over ranks (one flat buffer) and average the loss."""
        import torch.distributed as dist

        t0 = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.replicated]
        flat = torch.cat([g.reshape(-1) for g in grads] + [loss.reshape(1).float()])
        dist.all_reduce(flat)
        i = 0
        for p, g in zip(self.replicated, grads):
            n = g.numel()
            p.grad = flat[i:i + n].view_as(p).to(g.dtype)
            i += n
        self.comm_s += time.perf_counter() - t0
        return flat[-1] / self.world_size

    def train(self, steps: int, start: int = 0) -> list[float]:
        """``steps`` steps from ``start``; stops early (without raising) at a non-finite loss."""
        for s in range(start, start + steps):
            try:
                self.step(s)
            except NonFiniteLoss as e:
                self.losses.append(e.value)
                break
        return self.losses

    @torch.no_grad()
    def held_out_losses(self, examples: int = 16384, model: nn.Module | None = None) -> torch.Tensor:
        """Per-example log loss (1-D) of ``model`` (default: this session's) on ``examples`` held-out
        examples: a training-stream batch far past any training step (never trained on) and apart
        from the eval batch (which final NE is judged on, so what is tuned on these is not tuned on
        it). The model is left in train mode."""
        model = self.model if model is None else model
        if self._held_out is None or self._held_out.labels.numel() != examples:
            self._held_out = self._prepare(self.data.batch(HELD_OUT_STEP, batch_size=examples))
        model.eval()
        try:
            logits = model(self._held_out).reshape(-1)
            return F.binary_cross_entropy_with_logits(logits, self._held_out.labels.reshape(-1), reduction="none")
        finally:
            model.train()

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Log loss and normalized entropy on the workload's eval batch (the same batch on every rank)."""
        if self._eval is None:
            self._eval = self._prepare(self.data.eval_batch())
        self.model.eval()
        logits = self.model(self._eval)
        loss = F.binary_cross_entropy_with_logits(logits, self._eval.labels).item()
        return {"loss": loss, "ne": normalized_entropy(logits, self._eval.labels)}


# -- per-run timing as a distribution ---------------------------------------------------------------


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(median, lo, hi, coverage): a distribution-free interval for the median from order statistics.

    The number of values below the true median is Binomial(n, 1/2), so ``[x_(j), x_(n+1-j)]`` covers
    it with probability ``1 - 2 P(Bin <= j-1)``; j is the largest rank with coverage >= ``confidence``
    (no assumption about the shape of the distribution, unlike a t-interval; exact, unlike a
    bootstrap at small n). Fewer than 6 values cannot reach 95 %: the interval is then [min, max]
    and ``coverage`` says what it really is.
    """
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, math.nan, 0.0
    med = xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
    cdf = 0.5**n  # P(Bin(n, 1/2) <= j - 1) for j = 1
    j, coverage = 1, 1.0 - 2 * cdf
    for k in range(1, (n + 1) // 2):  # try j = k + 1
        cdf += math.comb(n, k) * 0.5**n
        if 1 - 2 * cdf < confidence:
            break
        j, coverage = k + 1, 1 - 2 * cdf
    return med, xs[j - 1], xs[n - j], coverage


MIN_CLEAN_STEPS = 3  # unpreempted steps needed to time a run from them alone
STEADY_MIN_STEPS = 6  # steps needed before looking for a warm-up transient


def steady_start(step_ms: list[float]) -> int:
    """How many leading steps are still warming up: the first steps of a fresh process are slower
    (allocator growth, page faults, first use of each kernel) for a number of steps that depends on
    the config, so a fixed warm-up does not cover every one. Leading steps are dropped while they are
    slower than the run's later half by more than its noise (its median plus three robust standard
    deviations, 1.4826 x MAD, and at least 2 %), at most half the steps; a step inside that band ends
    the warm-up, so a stationary run loses nothing but rare outliers at its start."""
    n = len(step_ms)
    if n < STEADY_MIN_STEPS:  # too few to tell a transient from noise
        return 0
    later = step_ms[n // 2:]
    ref = float(np.median(later))
    spread = 1.4826 * float(np.median(np.abs(np.asarray(later) - ref)))
    limit = ref + max(3 * spread, 0.02 * ref)
    d = 0
    while d < n // 2 and step_ms[d] > limit:
        d += 1
    return d


def window_stats(step_ms: list[float], batch: int, window: int | None = None,
                 preempted: list[int] | None = None) -> dict[str, float]:
    """Throughput and step time of one run as the median over windows of ``window`` consecutive steps
    (default ``max(1, n // 10)``: about ten windows), with a 95 % order-statistics interval.

    A window's step time is its mean; windows rather than single steps because neighbouring steps
    share the machine's state (load, caches), so single steps are not independent draws. Which steps:

    - ``preempted`` (per step: involuntary context switches of the run's threads during it): a step
      in which the scheduler gave one of the run's cores to another process took longer by however
      long that process ran, which says nothing about the config and only ever slows it. Such steps
      are left out when at least ``MIN_CLEAN_STEPS`` were not preempted (else every step is used);
      ``steps_preempted_frac`` says how many were (:func:`cubic.core.stats.contention` reads it);
    - then the leading steps still warming up (:func:`steady_start`; ``timing_steps_dropped``).
    """
    out: dict[str, float] = {}
    if preempted is not None:
        clean = [t for t, p in zip(step_ms, preempted) if p == 0]
        out["steps_preempted_frac"] = 1.0 - len(clean) / max(len(step_ms), 1)
        if len(clean) >= MIN_CLEAN_STEPS:
            step_ms = clean
    d = steady_start(step_ms)
    step_ms = step_ms[d:]
    n = len(step_ms)
    k = window or max(1, n // 10)
    means = [sum(step_ms[i:i + k]) / k for i in range(0, n - k + 1, k)] or [sum(step_ms) / max(n, 1)]
    med, lo, hi, cov = median_ci(means)
    return {
        "step_time_median_ms": med, "step_time_ci_lo_ms": lo, "step_time_ci_hi_ms": hi,
        "examples_per_s": batch / (med / 1e3), "examples_per_s_ci_lo": batch / (hi / 1e3),
        "examples_per_s_ci_hi": batch / (lo / 1e3),
        "timing_windows": float(len(means)), "timing_window_steps": float(k), "timing_ci_coverage": cov,
        "timing_steps": float(n), "timing_steps_dropped": float(d), **out,
    }
