"""The simulated cluster as a runner backend: ``SimulatedRunner(cluster, world_size)``.

It answers ``run(workload, config)`` like a real runner, but from the analytical step model
(``cubic/runners/step_model.py``) instead of training: every Result has ``source="simulated"`` and
``extra["simulated_cluster"]`` describing the cluster, so the store and reports keep simulated
trials apart from measured ones. A step that does not fit in HBM is ``Result.failed("oom")``; a
config the cluster cannot run (group size not dividing the world size, bad plan) is ``invalid``.

``SimulatedRunner.from_spec("h100x64")`` parses ``<cluster>x<gpus>``, where ``<cluster>`` is a known
cluster name (``cost_models.hardware.CLUSTERS``) or a YAML/JSON cluster file (``my.yamlx64``); a
cluster file that gives ``world_size`` needs no ``x<gpus>`` (docs/clusters.md).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from cost_models.comm import GRADIENT_SYNC_CHECKED
from cost_models.hardware import CLUSTERS, ClusterSpec, load_cluster
from cubic.runners.step_model import DEFAULT_PARAMS, StepModelParams, predict_step, sync_params
from cubic.core.config import Config
from cubic.core.fingerprint import versions
from cubic.core.result import Result
from cubic.core.runspec import RunSpec
from cubic.core.spec import (MAX_WORLD_SIZE, SpecError, Workload, group_misfit, parse_model, read_structured,
                              stable_hash)
from cubic.core.units import GB, gib

from cubic.runners.base import Runner
from sharding.types import ReplicaSync

# simulated trials are keyed by it (the runner's fingerprint): bump it when predictions move, or a store serves the
# old figures (tests/test_runners_sim_version.py pins them). 2: plans from sharding.from_config (greedy planner,
# one comm model); 3: the dense sites are the real model's (names, Wukong dense embeddings, norms, placements);
# 4: a 2D group's plan is priced with the replica sync the step simulates (sharding.types.ReplicaSync);
# 5: a gradients sync is what the runner exchanges (touched ids all-gathered, the union's rows all-reduced);
# 6: ... the touched-row counts all-gathered too, the runner's third collective, and a rank's pieces priced as one
# bucket by the planners too (cost_models.comm.rank_sync_ms, SyncLine): 2D plans move
STEP_MODEL_VERSION = 6
# what a simulated step has and has not been checked against: said under every simulated figure
SIM_CHECKED = ("SIMULATED by the analytical step model: its collectives were never timed on a GPU cluster (its CPU "
               "calibration times single-process steps); its one multi-process check, 2D against 1D in gloo "
               "processes on a 2-core CPU (experiments/two_d.py), met its 25% bar on the step-time ratio with 4 "
               "processes (it has missed it in other runs), and missed it with a core per process, its 1D steps "
               f"modelled at a fraction of those measured (results/two_d.json); there {GRADIENT_SYNC_CHECKED}")
SCALING_CHECKED = (f"{SIM_CHECKED}; whether 2D keeps scaling where full sharding does not is recomputed over "
                   "perturbed regimes of its efficiency factors and network bandwidth by experiments/scaling.py "
                   "(results/scaling.json, robustness): read the figures as the model's, the verdict as robust "
                   "only within those ranges")
SIM_NOTE = (f"{SIM_CHECKED}; nothing was trained: loss/NE are not simulated (the NE cost of 2D vs full sharding "
            "is taken from measured runs: extra.assumed_quality)")
_SPEC = re.compile(r"^(?P<cluster>.+?)x(?P<gpus>\d+)$")


def assumed_quality(optimizer: str, group_size: int, world_size: int, params: StepModelParams) -> dict[str, Any]:
    """The NE cost (relative to full sharding) the simulator assumes for a config, and where it comes from:
    the measured table of :mod:`cost_models.two_d_quality` for 2D (``params`` carry the replica sync),
    0 for full sharding (the baseline itself)."""
    from cost_models.two_d_quality import DATA, ne_cost

    if group_size >= world_size:
        return {"ne_cost_rel": 0.0, "ci95": [0.0, 0.0], "kind": "baseline",
                "source": "full (1D) sharding: the baseline the 2D NE cost is measured against"}
    rs = ReplicaSync.of(params.emb_sync, params.emb_sync_interval)  # the one rule: gradients sync every step
    sync, interval = rs.mode, rs.interval
    where = {"sync": sync, "interval": interval, "optimizer": optimizer}
    try:
        cost = ne_cost(optimizer, sync, interval)
    except SpecError as e:
        return {"ne_cost_rel": None, "kind": "unavailable", "source": str(e)} | where
    if cost is None:
        return {"ne_cost_rel": None, "kind": "unavailable",
                "source": f"{DATA.name} has no measured NE cost for {optimizer} with sync {sync}"} | where
    return cost.to_json() | where | {
        "assumption": "the relative NE cost measured on the small CPU workload carries over to this workload and scale"}


def _quality_table_hash() -> str:
    """Content hash of the packaged quality table: simulated trials depend on it (``ne_cost_rel``)."""
    from cost_models.two_d_quality import DATA

    try:
        return stable_hash(DATA.read_text())
    except OSError:
        return "absent"


DEFAULT_DENSE_DTYPE = "bf16"  # what H100/H200 users train dense GEMMs in; Config's own default is fp32 (CPU runs)


def default_config() -> Config:
    """The config of a simulated run when none is given: bf16 dense GEMMs (what H100/H200 users train
    with), the default planner of the one plan path (``greedy``), the workload's batch. The one definition: ``cubic run
    --simulate``, ``cubic sim predict|scale`` and a simulated campaign's base config all use it, so
    the same workload and cluster predict the same figures everywhere."""
    return Config(kernels={"dense_dtype": DEFAULT_DENSE_DTYPE})


def simulation_config(config: Config | None = None) -> Config:
    """The config a simulated run uses: :func:`default_config` when none is given; a user's config that
    does not set ``kernels.dense_dtype`` gets the same bf16 (Config's fp32 default made a config holding
    only ``seed: 0`` simulate ~7x slower than none); one that sets it, even to fp32, keeps it. Callers
    apply it before the config is hashed or stored, so the stored config says what was simulated."""
    if config is None:
        return default_config()
    if "dense_dtype" in config.kernels.model_fields_set:
        return config
    return config.model_copy(update={"kernels": config.kernels.model_copy(update={"dense_dtype": DEFAULT_DENSE_DTYPE})})


def dense_precision(config: Config, site_precisions: dict[str, int] | None = None) -> str:
    """The dense GEMMs' precision as every simulated output states it (bf16 vs fp32 is a ~7x step time);
    with a prediction's ``dense["site_precisions"]``, how many GEMM sites ran in FP8."""
    text = f"dense {config.kernels.dense_dtype}"
    f = config.fp8
    if f.policy == "placement":
        # a placement's recipes are its sites' own; fp8.recipe does not apply to them
        sites = (f.placement or {}).get("sites") or {}
        recipes = sorted({str(v["recipe"]) for v in sites.values() if isinstance(v, dict) and v.get("recipe")})
        text += f", FP8 ({', '.join(recipes) or 'no site'}) where the placement puts it"
    elif f.policy != "off":
        text += f", FP8 ({f.recipe}) where fp8.policy {f.policy} puts it"
    if f.policy != "off" and site_precisions is not None:
        text += f": {site_precisions.get('fp8', 0)} of {sum(site_precisions.values())} GEMM sites"
    return text


class SimulatedRunner(Runner):
    """A cluster of ``world_size`` GPUs described by ``cluster``, simulated by the step model."""

    source = "simulated"

    def __init__(self, cluster: ClusterSpec, world_size: int, params: StepModelParams | None = None):
        if not isinstance(world_size, int) or isinstance(world_size, bool) or not 1 <= world_size <= MAX_WORLD_SIZE:
            raise SpecError(f"must be an integer in 1..{MAX_WORLD_SIZE}, got {world_size!r}", field="world_size")
        self.cluster = cluster
        self.world_size = world_size
        self.params = params or DEFAULT_PARAMS

    @classmethod
    def from_spec(cls, spec: str, world_size: int | None = None,
                  params: StepModelParams | None = None) -> "SimulatedRunner":
        """``"h100x64"``, ``"cluster.yamlx64"``, or a cluster name/file with ``world_size`` given."""
        text = str(spec).strip()
        m = _SPEC.match(text)
        if world_size is None:
            if not m and Path(text).suffix:  # a cluster file that says its own world_size
                cluster = load_cluster(text)
                if cluster.world_size is None:
                    raise SpecError("no world_size in the cluster file: add `world_size: N` or write FILExN",
                                    source=text, field="world_size")
                return cls(cluster, cluster.world_size, params)
            if not m:
                raise SpecError(f"expected <cluster>x<gpus>, e.g. h100x64 (clusters: {', '.join(CLUSTERS)}; "
                                f"or a YAML cluster file)", source=text or "''", field="--simulate")
            text, world_size = m.group("cluster"), int(m.group("gpus"))
        if text not in CLUSTERS and not Path(text).suffix:
            raise SpecError(f"unknown cluster (known: {', '.join(CLUSTERS)}; or a .yaml/.json cluster file)",
                            source=text, field="--simulate")
        if not 1 <= world_size <= MAX_WORLD_SIZE:  # named as the flag, not as the runner's argument
            raise SpecError(f"the number of GPUs must be in 1..{MAX_WORLD_SIZE:,}, got {world_size}", source=str(spec),
                            field="--simulate")
        return cls(load_cluster(text), world_size, params)

    @staticmethod
    def default_config() -> Config:
        """The config of a run given none (:func:`default_config`, the one definition)."""
        return default_config()

    @staticmethod
    def resolve_config(config: Config | None) -> Config:
        """The config a run of this runner uses (:func:`simulation_config`): what ``cubic run`` hashes and stores."""
        return simulation_config(config)

    # -- identity: what a simulated trial's result depends on -------------------------------------

    def describe(self) -> dict[str, Any]:
        c = self.cluster
        return {
            "name": f"{c.name}x{self.world_size}",
            "cluster": c.name,
            "device": c.device.name,
            "world_size": self.world_size,
            "ranks_per_node": c.ranks_per_node,
            "nodes": -(-self.world_size // c.ranks_per_node),
            "hbm_gib_per_gpu": gib(c.device.hbm_bytes),
            "nvlink_gb_per_s": c.nvlink_bw / GB,
            "network_gb_per_s": c.network_bw / GB,
            "step_model_version": STEP_MODEL_VERSION,
        }

    def fingerprint(self) -> dict[str, Any]:
        return {
            "device": f"simulated:{self.cluster.name}x{self.world_size}",
            "simulated": True,
            # the runner's own world_size counts, not the file's (unset in the known clusters)
            # (a cluster without fitted collectives hashes as before the field existed: stored trials stay found)
            "cluster": self.cluster.model_dump(mode="json", exclude={"world_size"} | (
                set() if self.cluster.collectives else {"collectives"})),
            "world_size": self.world_size,
            "step_model_version": STEP_MODEL_VERSION,
            "step_model_params": self.params.model_dump(mode="json"),
            "two_d_quality_table": _quality_table_hash(),
        }

    def run_spec(self) -> RunSpec:
        return RunSpec(kind="simulated", simulate=f"{self.cluster.name}x{self.world_size}", world_size=self.world_size)

    def fingerprint_hash(self) -> str:
        return stable_hash(self.fingerprint())

    # -- the runner interface ---------------------------------------------------------------------

    def run(self, workload: Workload, config: Config, *, steps: int = 50, warmup: int = 5,
            progress: Callable[[int, int], None] | None = None) -> Result:
        """One simulated step stands for all ``steps`` (the model is deterministic); never raises."""
        t0 = time.perf_counter()
        fp = self.fingerprint()
        common: dict[str, Any] = dict(
            source="simulated", workload=workload.name, workload_hash=workload.content_hash(),
            config_hash=config.content_hash(), seed=config.seed, fingerprint=fp,
            fingerprint_hash=stable_hash(fp), versions=versions(),
        )
        # the precision in the note: it is printed under the run's figures
        extra: dict[str, Any] = {"simulated_cluster": self.describe(), "note": f"{SIM_NOTE}; {dense_precision(config)}",
                                 "dense_dtype": config.kernels.dense_dtype,
                                 "steps_requested": steps, "warmup_requested": warmup}
        if progress:
            progress(0, steps)
        try:
            pred = predict_step(workload, config, self.cluster, self.world_size, self.params)
        except (SpecError, ValueError) as e:
            return Result.failed("invalid", " ".join(str(e).split()), extra=extra,
                                 wall_time_s=time.perf_counter() - t0, **common)
        except Exception as e:  # a model bug is a failed trial, not a crashed campaign
            return Result.failed("error", f"{type(e).__name__}: {e}", extra=extra,
                                 wall_time_s=time.perf_counter() - t0, **common)
        extra["note"] = f"{SIM_NOTE}; {dense_precision(config, pred.dense.get('site_precisions'))}"
        extra.update({
            "plan": pred.plan,
            "dense": pred.dense,
            "memory_bytes": pred.memory,
            "group_size": pred.group_size,
            "batch_per_rank": pred.batch_per_rank,
        })
        if pred.oom:
            return Result.failed("oom", f"SIMULATED ({dense_precision(config)}): {pred.oom_reason}",
                                 metrics={"peak_mem_bytes": pred.peak_mem_bytes}, extra=extra,
                                 wall_time_s=time.perf_counter() - t0, **common)
        step_ms = pred.step_s * 1e3
        quality = assumed_quality(workload.optimizers.embedding, pred.group_size, self.world_size,
                                  sync_params(config, self.params))
        extra["assumed_quality"] = quality
        extra["phases_detail_ms"] = {k: v * 1e3 for k, v in pred.phases_s.items()}
        extra["dominant_phase"] = pred.dominant_phase
        if progress:
            progress(steps, steps)
        return Result(
            status="ok",
            metrics={
                "examples_per_s": pred.examples_per_s,
                "examples_per_s_per_gpu": pred.examples_per_s / self.world_size,
                "step_time_median_ms": step_ms,
                "step_time_p90_ms": step_ms,
                "peak_mem_bytes": pred.peak_mem_bytes,
                # the assumed (measured, see extra.assumed_quality) NE cost vs full sharding: what a
                # campaign's quality constraint reads; absent when nothing was measured for this config
                **({"ne_cost_rel": quality["ne_cost_rel"], "ne_cost_rel_ci_hi": quality["ci95"][1]}
                   if quality["ne_cost_rel"] is not None else {}),
            },
            phases_ms=pred.standard_phases_ms(),
            extra=extra,
            wall_time_s=time.perf_counter() - t0,
            **common,
        )


def load_params(path: str | Path) -> StepModelParams:
    """Step-model parameters from a JSON/YAML file (e.g. written by ``cubic sim calibrate``)."""
    data = read_structured(path)
    if isinstance(data, dict) and "params" in data:
        data = data["params"]
    return parse_model(StepModelParams, data, source=str(path))


def scaling_sweep(workload: Workload, cluster: ClusterSpec, gpus: Sequence[int], group_sizes: Sequence[int] = (),
                  config: Config | None = None, params: StepModelParams | None = None,
                  include_full: bool = True) -> list[dict[str, Any]]:
    """SIMULATED weak scaling (fixed batch per GPU): full model-parallel sharding and 2D sparse
    parallelism at each group size, for each GPU count. Efficiency is per-GPU throughput relative to
    the best per-GPU throughput at the smallest GPU count where any strategy fits."""
    base = simulation_config(config)
    params = params or DEFAULT_PARAMS
    strategies: list[tuple[str, int | None]] = ([("full", None)] if include_full else []) + \
        [(f"2d-g{g}", g) for g in group_sizes]
    rows: list[dict[str, Any]] = []
    for W in gpus:
        for name, G in strategies:
            if G is not None and group_misfit(G, W):
                continue
            cfg = base.model_copy(update={"sharding": base.sharding.model_copy(update={"group_size": G, "plan": None})})
            row: dict[str, Any] = {"gpus": W, "strategy": name, "group_size": G or W}
            try:
                p = predict_step(workload, cfg, cluster, W, params)
            except SpecError as e:
                rows.append(row | {"status": "invalid", "reason": str(e)})
                continue
            if p.oom:
                rows.append(row | {"status": "oom", "reason": p.oom_reason, "peak_mem_gib": gib(p.peak_mem_bytes)})
                continue
            rows.append(row | {
                "status": "ok",
                "step_ms": p.step_s * 1e3,
                "examples_per_s": p.examples_per_s,
                "examples_per_s_per_gpu": p.examples_per_s / W,
                "dominant_phase": p.dominant_phase,
                "phases_ms": {k: v * 1e3 for k, v in p.phases_s.items()},
                "peak_mem_gib": gib(p.peak_mem_bytes),
                "embedding_imbalance": p.plan.get("embedding_imbalance"),
                "sharding_types": p.plan.get("sharding_types"),
                "a2a_output_bytes_per_rank": p.plan.get("a2a_output_bytes_per_rank"),
                "embedding_sync_bytes_per_rank": p.plan.get("embedding_sync_bytes_per_rank"),
                "assumed_quality": assumed_quality(workload.optimizers.embedding, p.group_size, W,
                                                   sync_params(cfg, params)),
            })
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        w0 = min(r["gpus"] for r in ok)
        ref = max(r["examples_per_s_per_gpu"] for r in ok if r["gpus"] == w0)
        for r in ok:
            r["scaling_efficiency"] = r["examples_per_s_per_gpu"] / ref
            r["reference_gpus"] = w0
    return rows
