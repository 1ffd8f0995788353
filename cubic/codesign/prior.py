"""cubic's featurizer for its own campaigns: analytic features of a (workload, config) and the step-model
prior (the analytical model's log prediction the proxy fits the residual of).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cubic.core.runspec import RunSpec
from cubic.core.spec import SpecError
from search.space import Space

def analytic_features(workload, config) -> dict[str, float]:
    """What a run's cost scales with, computed without running it: dense GEMM FLOPs per example
    (2 x the weights of every linear site of the dense architecture as the config shapes it),
    embedding bytes read per step, embedding bytes per rank (over the world, and over a 2D group),
    the group size and the step's batch. log-scaled."""
    wl = config.apply(workload)
    batch = wl.batch_size
    dense_flops = _dense_flops_per_example(wl.content_hash(), wl)
    emb_read = sum(t.pooling_factor * t.dim * 4 for t in wl.tables)
    emb_bytes = sum(t.rows * t.dim * 4 for t in wl.tables)
    world = max(1, wl.topology.world_size)
    # 2D sparse parallelism: tables are sharded over a group of G ranks, so each holds ~1/G of them
    group = max(1, min(config.sharding.group_size or world, world))
    return {
        "log_emb_bytes_per_group_rank": math.log1p(emb_bytes / group),
        "log_group_size": math.log(group),
        "log_batch": math.log1p(batch),
        "log_dense_flops_per_example": math.log1p(dense_flops),
        "log_dense_flops_per_step": math.log1p(dense_flops * batch),
        "log_emb_bytes_read_per_step": math.log1p(emb_read * batch),
        "log_emb_bytes_per_rank": math.log1p(emb_bytes / world),
        "fp8": 0.0 if config.fp8.policy == "off" else 1.0,
        "bf16": 1.0 if config.kernels.dense_dtype == "bf16" else 0.0,
    }


_FLOPS_CACHE: dict[str, float] = {}


def _dense_flops_per_example(key: str, wl) -> float:
    if key not in _FLOPS_CACHE:
        import torch

        from cubic.core.models import build_dense

        with torch.device("meta"):  # shapes only: nothing is allocated
            dense = build_dense(wl)
        _FLOPS_CACHE[key] = float(sum(2 * m.in_features * m.out_features for m in dense.modules()
                                      if isinstance(m, torch.nn.Linear)))
    return _FLOPS_CACHE[key]


FEATURE_NAMES = ("log_batch", "log_dense_flops_per_example", "log_dense_flops_per_step",
                 "log_emb_bytes_read_per_step", "log_emb_bytes_per_rank", "log_emb_bytes_per_group_rank",
                 "log_group_size", "fp8", "bf16")


class StepModelPrior:
    """What the analytical step model (cubic.runners.step_model) predicts for a run before it happens:
    log examples/s and log peak memory. The proxy learns the residual, reality minus this model,
    so that it starts from the model's ranking instead of from nothing, and the residual (how a
    machine departs from its description) transfers across cluster sizes in a warm start.

    - simulated runs: the cluster's *datasheet* model (DEFAULT_PARAMS), not the simulator's own
      parameters: a campaign never sees the constants of the machine it searches;
    - local runs on a CPU: this CPU, described by micro-benchmarks (cubic.runners.calibration);
    - distributed runs of W processes on this CPU (gloo): the same CPU per process, its links the gloo
      calibration for W processes (``cpu_gloo_cluster``: the user's, else the packaged one);
    - anything else (a GPU we have no description of): no prior.
    """

    def __init__(self, context: dict[str, Any]):
        self.context = dict(context)
        self._model = None  # (cluster, world_size, params), built on first use (CPU: seconds of benchmarks)

    @staticmethod
    def available(context: dict[str, Any]) -> bool:
        r = RunSpec.from_context(context)
        if r.kind == "simulated":
            return bool(r.simulate)
        if r.ray or not ((r.kind == "local" and _world_size(context) == 1) or r.kind == "distributed"):
            return False  # runs on machines this process has not measured
        return r.resolved_device() == "cpu"

    def _build(self):
        if self._model is None:
            from cubic.runners.step_model import DEFAULT_PARAMS

            r = RunSpec.from_context(self.context)
            if r.kind == "simulated":
                from cubic.runners.sim import SimulatedRunner

                sim = SimulatedRunner.from_spec(r.simulate)
                self._model = (sim.cluster, sim.world_size, DEFAULT_PARAMS)
            elif r.kind == "distributed":
                from cubic.runners.calibration import cpu_device, cpu_gloo_model

                threads, world = int(r.threads or 1), r.ranks
                cluster, params = cpu_gloo_model(cpu_device(threads), world, threads)
                self._model = (cluster, world, params)
            else:
                from cubic.runners.calibration import cpu_cluster, cpu_device, cpu_params

                threads = int(r.threads or 1)
                self._model = (cpu_cluster(cpu_device(threads)), 1, cpu_params(threads))
        return self._model

    def __call__(self, workload, config) -> tuple[float, float]:
        """(log examples/s, log peak bytes); NaN where the model has no answer (a predicted OOM has
        no throughput, an invalid config neither)."""
        from cubic.runners.step_model import predict_step

        cluster, world, params = self._build()
        try:
            pred = predict_step(workload, config, cluster, world, params)
        except (SpecError, ValueError):
            return math.nan, math.nan
        thr = math.log(pred.examples_per_s) if not pred.oom and pred.examples_per_s > 0 else math.nan
        mem = math.log(pred.peak_mem_bytes) if pred.peak_mem_bytes > 0 else math.nan
        return thr, mem


class CubicFeaturizer:
    """Features for the proxy from each point's workload (``context["workload"]``) and Config:
    :func:`analytic_features`, the campaign's world size, and the step model's prior
    (:class:`StepModelPrior`) as the last two columns, named in :attr:`prior_columns` so that the
    proxy can learn the residual on them."""

    def __init__(self, space: Space, base_config=None, prior: bool = True):
        self.space, self.base_config, self.prior = space, base_config, prior
        self._workloads: dict[str, Any] = {}
        self._priors: dict[str, StepModelPrior] = {}
        self._memo: dict[tuple, np.ndarray] = {}
        n = len(FEATURE_NAMES) + 1
        self.prior_columns = {"examples_per_s": n, "peak_mem_bytes": n + 1} if prior else {}

    def __call__(self, point: dict[str, Any], context: dict[str, Any]) -> np.ndarray:
        name = context.get("workload")
        if not name:
            return np.zeros(0)
        ctx_key = _context_key(context)
        key = (name, ctx_key, self.space.key(point))
        if key not in self._memo:  # applying a Config to a 400-table workload is not free
            self._memo[key] = self._featurize(point, name, context, ctx_key)
        return self._memo[key]

    def _featurize(self, point: dict[str, Any], name: str, context: dict[str, Any], ctx_key: str) -> np.ndarray:
        from cubic.core.workloads import load_workload

        if name not in self._workloads:
            self._workloads[name] = load_workload(name)
        wl = self._workloads[name]
        try:
            config = self.space.to_config(point, self.base_config)
            feats = analytic_features(wl, config)
        except (SpecError, ValueError):  # a warm-start point from another space/workload
            config, feats = None, {}
        # where the run happens is a feature too: a warm start may come from another cluster size
        row = [feats.get(n, 0.0) for n in FEATURE_NAMES] + [math.log(_world_size(context))]
        if self.prior:
            prior = None
            if config is not None and StepModelPrior.available(context):
                prior = self._priors.setdefault(ctx_key, StepModelPrior(context))
            row += list(prior(wl, config)) if prior is not None else [math.nan, math.nan]
        return np.array(row, dtype=np.float64)


def _context_key(context: dict[str, Any]) -> str:
    """What a point's features depend on besides the point: where its runs happen."""
    return f"{RunSpec.from_context(context).cache_key()}:{_world_size(context)}"


def cubic_featurizer(space: Space, base_config=None, prior: bool = True) -> CubicFeaturizer:
    """The proxy's features for cubic's own campaigns (see :class:`CubicFeaturizer`)."""
    return CubicFeaturizer(space, base_config, prior)


def _world_size(context: dict[str, Any]) -> int:
    """GPUs (ranks) of the campaign's runs: ``context["world_size"]``, or the simulated cluster's."""
    if context.get("world_size"):
        return int(context["world_size"])
    return RunSpec.from_context(context).ranks

