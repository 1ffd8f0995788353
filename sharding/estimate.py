"""Estimate stage: per-shard and per-rank features, and the cost of a whole plan.

A plan's cost on rank r = compute(r) + comm(r) + sync(r):
- compute: the rank's shards as one fused kernel - predicted by the learned model
  (:class:`LearnedEstimator`) or measured on the real kernel (:class:`MeasuredEstimator`);
- comm: all-to-all volumes under the alpha-beta model (cost_models.comm) - the same for both;
- sync: data-parallel all-reduce and 2D cross-group exchange (cost_models.comm).
Plan cost = max over ranks. Lower bound = max(sum of per-table costs / group, largest indivisible
piece), with per-table costs from the same estimator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cubic.core.spec import Table
from cost_models.comm import (
    CommModel,
    ShardTraffic,
    dp_sync_ms,
    expected_unique_rows,
    group_draws,
    rank_comm_ms,
    rank_sync_ms,
    rank_volumes,
)
from sharding.measure import ROW_CAP, MeasurementCache, ShardWork
from sharding.types import COLUMN_MULTIPLE, Plan, PlanCost, RankCost, ReplicaSync, Storage

DEFAULT_MODEL_PATH = Path(__file__).resolve().parent / "data" / "cost_model.json"
USER_MODEL_NAME = "sharding_cost_model.json"


def user_data_dir() -> Path:
    """Where `cubic shard train` writes (cubic.core.fingerprint.user_data_dir)."""
    from cubic.core.fingerprint import user_data_dir as _dir

    return Path(_dir())


def cost_model_path() -> Path:
    """The user's trained model if there is one, else the packaged one."""
    user = user_data_dir() / USER_MODEL_NAME
    return user if user.is_file() else DEFAULT_MODEL_PATH


def machine_mismatch(meta: dict) -> str | None:
    """Why a learned CPU model's figures may not hold on this machine (None when it was trained here)."""
    from cubic.core.fingerprint import fingerprint, machine_differences

    fp, here = meta.get("fingerprint") or {}, fingerprint("cpu")
    if not fp:
        return "the cost model does not record the machine it was trained on"
    if not machine_differences(fp):
        return None
    return (f"the cost model was trained on {fp.get('cpu_model')} ({fp.get('cpu_count')} cores), this machine is "
            f"{here.get('cpu_model')} ({here.get('cpu_count')} cores): its CPU figures may not hold here; "
            f"`cubic shard collect` then `cubic shard train` fit one for this machine (in {user_data_dir()})")
# additive per-shard quantities (first 7 are the model's sums) + alpha-weighted bytes for the mean
SHARD_FEATURES = ("count", "lookups", "lookup_bytes", "out_bytes", "touched_bytes", "touched_rows",
                  "param_bytes", "alpha_x_lookup_bytes")
LB_CHUNK = 60
RANK_FEATURES = SHARD_FEATURES[:7] + ("mean_alpha", "max_shard_share", "mean_cols")


def shard_vector(table: Table, rows: int, cols: int, batch: int) -> np.ndarray:
    """Additive features of one shard for one step of ``batch`` examples."""
    ids = table.pooling_factor * rows / table.rows
    lookups = batch * ids
    alpha = table.access.effective_alpha()
    phys = min(rows, ROW_CAP)
    touched = min(expected_unique_rows(int(rows), round(alpha, 3), round(lookups)), phys)
    lb = lookups * cols * 4
    return np.array([1.0, lookups, lb, batch * cols * 4.0, touched * cols * 4.0, touched, phys * cols * 4.0,
                     alpha * lb])


def rank_features_from_sums(sums: np.ndarray, max_lb: np.ndarray, batch: int) -> np.ndarray:
    """[n_ranks, 8] sums and [n_ranks] largest lookup_bytes -> [n_ranks, 10] model features."""
    sums = np.atleast_2d(sums)
    lb = np.maximum(sums[:, 2], 1e-9)
    n = np.maximum(sums[:, 0], 1e-9)
    mean_alpha = sums[:, 7] / lb
    share = np.atleast_1d(max_lb) / lb
    mean_cols = sums[:, 3] / (4.0 * batch * n)
    return np.concatenate([sums[:, :7], mean_alpha[:, None], share[:, None], mean_cols[:, None]], axis=1)


def rank_features(works: list[ShardWork], batch: int) -> np.ndarray:
    if not works:
        return np.zeros(len(RANK_FEATURES))
    vs = np.stack([shard_vector(w.table, w.rows, w.cols, batch) for w in works])
    return rank_features_from_sums(vs.sum(axis=0), vs[:, 2].max(), batch)[0]


class Estimator(ABC):
    """Compute cost of each rank's shard set (ms per step).

    The contract the planners use: :meth:`compute_ms` (shard sets -> ms), and :meth:`predict`
    (rank feature rows, ``RANK_FEATURES`` -> ms) for the search's batched scoring; an estimator that
    cannot score features (a measured one) says so with :meth:`can_predict`."""

    source: str

    def predict(self, X: np.ndarray) -> np.ndarray:
        """ms per row of rank features (``rank_features_from_sums``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot score rank features")

    def can_predict(self) -> bool:
        return type(self).predict is not Estimator.predict

    @abstractmethod
    def compute_ms(self, ranks: list[list[ShardWork]], batch: int) -> list[float]: ...

    def compute_split_ms(self, ranks: list[list[ShardWork]], batch: int) -> list[tuple[float, float]] | None:
        """(forward, backward + optimizer) ms per rank, where the estimator knows the split (None otherwise)."""
        return None


class LearnedEstimator(Estimator):
    source = "modelled"

    def __init__(self, model=None, path: str | Path | None = None):
        if model is None:
            path = path or cost_model_path()
            from cost_models.sharding_cost import ShardingCostModel

            model = ShardingCostModel.load(path)
        self.model, self.path = model, (Path(path) if path else None)

    def compute_ms(self, ranks, batch):
        X = np.stack([rank_features(ws, batch) for ws in ranks])
        return [float(x) for x in self.model.predict(X)]

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(self.model.predict(np.atleast_2d(X)), dtype=float)

    def describe(self) -> str:
        meta = getattr(self.model, "meta_", None) or {}
        fp = meta.get("fingerprint") or {}
        where = fp.get("cpu_model", "an unrecorded machine")
        # which model and how well it held on its own held-out samples: two models read alike without it
        which = ("the packaged model" if self.path == DEFAULT_MODEL_PATH else
                 f"the model at {self.path}" if self.path else "a model given in code")
        fit = (f"{meta['samples']} samples, held-out MAPE {100 * meta['holdout_mape']:.1f}% on {meta['holdout_n']}"
               if all(isinstance(meta.get(k), (int, float)) for k in ("samples", "holdout_mape", "holdout_n"))
               else "no held-out error recorded")
        return (f"modelled for CPU: learned FBGEMM CPU TBE model ({which}; {fit}) trained on {where} "
                f"({fp.get('cpu_count', '?')} cores)")


class GpuLookupModel:
    """Rank features -> ms of the rank's fused TBE on a GPU: cost_models.gpu_embedding's HBM model
    (MODELLED, datasheet bandwidth x efficiency), in the planner's feature layout (RANK_FEATURES)."""

    def __init__(self, device):
        self.device = device

    def predict(self, X: np.ndarray) -> np.ndarray:
        from cost_models.gpu_embedding import rank_lookup_ms

        X = np.atleast_2d(X)
        # count, lookups, lookup_bytes, out_bytes, _, touched_rows = RANK_FEATURES[:6]
        return rank_lookup_ms(X[:, 0], X[:, 1], X[:, 2], X[:, 3], X[:, 5], self.device.hbm_bw)


class GpuEstimator(LearnedEstimator):
    """The planner's compute cost on a GPU target (modelled, per device); same interface as the learned one."""

    source = "modelled"

    def __init__(self, device):
        from cost_models.hardware import DeviceSpec, load_device

        dev = device if isinstance(device, DeviceSpec) else load_device(device)
        super().__init__(model=GpuLookupModel(dev))
        self.device = dev

    def describe(self) -> str:
        return f"modelled for {self.device.name}: HBM lookup model (cost_models.gpu_embedding)"


class MeasuredEstimator(Estimator):
    source = "measured"

    def __init__(self, cache: MeasurementCache | None = None):
        self.cache = cache or MeasurementCache()

    def compute_ms(self, ranks, batch):
        return [self.cache.compute(ws, batch)["total_ms"] for ws in ranks]

    def compute_split_ms(self, ranks, batch):
        return [(m["fwd_ms"], m["bwd_ms"]) for m in (self.cache.compute(ws, batch) for ws in ranks)]

    def describe(self) -> str:
        return "measured on this CPU: FBGEMM CPU TBE, single thread"


class ScaledEstimator(Estimator):
    """A modelled estimator times ``scale``: the base model's ranking, at this machine's measured
    scale (so compute is weighed against communication as measured here): `shard plan --rescale`
    and experiments/sharding_rescale.py, which measured what re-planning at that scale buys."""

    source = "modelled"

    def __init__(self, base: Estimator, scale: float):
        if not (scale > 0 and np.isfinite(scale)):
            raise ValueError(f"scale must be positive and finite (got {scale})")
        self.base, self.scale = base, float(scale)

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.base.predict(X) * self.scale

    def can_predict(self) -> bool:
        return self.base.can_predict()

    def compute_ms(self, ranks, batch):
        return [c * self.scale for c in self.base.compute_ms(ranks, batch)]

    def describe(self) -> str:
        return f"{self.base.describe()}, scaled x{self.scale:.3g} to this machine's compute check"

    @classmethod
    def at_check(cls, base: Estimator, check: ComputeCheck) -> ScaledEstimator:
        """``base`` at the scale a compute check measured (its ms divided by the check's ratio): the one
        re-plan rule, for `shard plan --rescale` and the benchmark that measured it."""
        return cls(base, 1.0 / check.ratio)


def min_pieces(table: Table, group: int) -> int:
    """How many pieces a table may be cut into at most (column quarters x row pieces up to group)."""
    return max(1, min(group, table.dim // COLUMN_MULTIPLE if table.dim % COLUMN_MULTIPLE == 0 else 1))


def plan_cost(plan: Plan, estimator: Estimator, comm: CommModel, *, lower_bound: bool = False) -> PlanCost:
    """Per-rank compute + comm + sync of a plan, and optionally the lower bound.

    A sharded piece's owner pools it for the whole group's batch (group_size x per-rank batch, the
    ids arrive by all-to-all), so its pieces run as one fused kernel at that batch; data-parallel
    tables run on the rank's own batch (a second kernel) and all-reduce their gradients in one
    bucket per step.
    """
    G, W, B = plan.group_size, plan.world_size, plan.batch_size
    tables = {t.name: t for t in plan.tables}
    works: list[list[ShardWork]] = [[] for _ in range(G)]
    dp_works: list[list[ShardWork]] = [[] for _ in range(G)]
    traffic: list[ShardTraffic] = []
    placed: list = []
    dp_bytes = [0.0] * G
    replicas = W // G
    rsync = plan.sync or ReplicaSync()  # a 2D plan priced before the field: the default sync
    for s in plan.shards:
        t = tables[s.table]
        if s.sharding_type == "data_parallel":
            dp_works[s.rank].append(ShardWork.of(t, s))
            dp_bytes[s.rank] += s.rows * s.cols * 4
        else:
            works[s.rank].append(ShardWork.of(t, s))
            traffic.append(ShardTraffic(s.rank, s.cols, t.pooling_factor * s.rows / t.rows))
            placed.append((s, t))
    # 2D: each rank's pieces kept in step with its replicas in one bucket, as the runner does it
    sync = list(rank_sync_ms([s.rank for s, _ in placed], G, replicas, comm, mode=rsync.mode, interval=rsync.interval,
                             shard_bytes=[Storage.of(s.rows, s.cols).total for s, _ in placed],
                             rows=[s.rows for s, _ in placed], cols=[s.cols for s, _ in placed],
                             alpha=[t.access.effective_alpha() for _, t in placed],
                             draws=[group_draws(t, s.rows, G, B) for s, t in placed])[0])
    for r in range(G):
        sync[r] += dp_sync_ms(dp_bytes[r], W, comm)
    compute = estimator.compute_ms(works, G * B)
    split = estimator.compute_split_ms(works, G * B)
    if any(dp_works):
        compute = [a + b for a, b in zip(compute, estimator.compute_ms(dp_works, B))]
        dp_split = estimator.compute_split_ms(dp_works, B)
        split = split and dp_split and [(a + c, b + d) for (a, b), (c, d) in zip(split, dp_split)]
    if plan.kernels:  # memory tiers: misses of UVM-cached / UVM tables cross PCIe (sharding.kernels, modelled)
        from sharding.kernels import tier_penalty_ms

        compute = [c + p for c, p in zip(compute, tier_penalty_ms(plan, G * B))]
        split = None
    comms = rank_comm_ms(traffic, G, B, comm)
    vol = rank_volumes(traffic, G, B)
    mem = plan.memory_per_rank()
    per_rank = [
        RankCost(rank=r, compute_ms=compute[r], comm_ms=comms[r], sync_ms=sync[r],
                 total_ms=compute[r] + comms[r] + sync[r], memory_bytes=mem[r],
                 fwd_compute_ms=split[r][0] if split else None, bwd_compute_ms=split[r][1] if split else None,
                 input_bytes=float(vol["ids_recv"][r]), output_bytes=float(vol["emb_sent"][r]))
        for r in range(G)
    ]
    lb = None
    if lower_bound:
        lb = table_lower_bound(plan.tables, G, B, estimator, comm)
    describe = getattr(estimator, "describe", None)
    return PlanCost.from_ranks(estimator.source, per_rank, lower_bound_ms=lb,
                               details={"per_rank_batch": B, "kernel_batch": G * B, "comm": comm.describe(),
                                        "compute": describe() if describe else estimator.source,
                                        "device": plan.topology.device})


def table_lower_bound(tables: list[Table], group: int, batch: int, estimator: Estimator, comm: CommModel) -> float:
    """max(total / group, largest indivisible piece) + the all-to-all of a perfectly balanced group.

    total = the tables fused LB_CHUNK at a time (so kernel fusion is credited, unlike a sum of singles);
    the largest indivisible piece = max over tables of its cost alone divided by the most pieces it
    may be cut into (dim/4 column pieces, at most ``group``). Approximate, not a proof: cache
    effects make a rank of 1/group of the tables slightly cheaper than 1/group of all of them.
    """
    works = [ShardWork(t, 0, t.rows, t.dim) for t in tables]
    kernel_batch = group * batch  # a sharded piece is pooled for the whole group's batch
    # fused in chunks of LB_CHUNK tables (a chunk ~ a busy rank): hundreds of tables in one kernel
    # would not fit in memory, and a chunk already amortises the per-kernel overhead
    fused = sum(estimator.compute_ms([works[i:i + LB_CHUNK] for i in range(0, len(works), LB_CHUNK)], kernel_batch))
    # the single costliest tables by lookup bytes bound the indivisible piece; measure the top few
    top = sorted(works, key=lambda w: -w.table.pooling_factor * w.table.dim)[:3]
    singles = estimator.compute_ms([[w] for w in top], kernel_batch)
    indivisible = max(c / min_pieces(w.table, group) for w, c in zip(top, singles))
    tot_cols = sum(t.dim for t in tables)
    tot_ids = sum(t.pooling_factor for t in tables)
    traffic = [ShardTraffic(r, tot_cols / group, tot_ids / group) for r in range(group)]
    balanced_comm = rank_comm_ms(traffic, group, batch, comm)[0] if group > 1 else 0.0
    return max(fused / group, indivisible) + balanced_comm


SCALE_TOLERANCE = 1.25  # a model between 0.8x and 1.25x the measured lookup is taken to hold here
CHECK_REPEATS = 3  # each rank's lookup timed 3 times by a plan's compute check (evaluate's default is 5)


@dataclass(frozen=True)
class ComputeCheck:
    """The second look at a plan's modelled lookup: the same ranks' shard sets measured on this CPU.

    ``ratio`` is the model's scale here (sum of predicted / sum of measured lookup ms over the
    ranks); ``holds`` when it is within ``SCALE_TOLERANCE`` either way. The rank order (Spearman,
    from 3 ranks on) says whether the plan's choices, which rest on the model's ranking, survive
    when its scale does not."""

    ratio: float
    rank_ratios: tuple[float, ...]
    spearman: float | None
    slowest_predicted: int
    slowest_measured: int
    tolerance: float = SCALE_TOLERANCE

    @property
    def holds(self) -> bool:
        return 1 / self.tolerance <= self.ratio <= self.tolerance

    def line(self) -> str:
        rho = f"; rank order Spearman {self.spearman:.2f}" if self.spearman is not None else ""
        same = ("the same" if self.slowest_predicted == self.slowest_measured
                else f"{self.slowest_predicted} by the model, {self.slowest_measured} measured")
        return (f"compute check (the plan's lookup MEASURED on this cpu against the model): the model predicts "
                f"{self.ratio:.2f}x the measured lookup ms (per rank {min(self.rank_ratios):.2f}-"
                f"{max(self.rank_ratios):.2f}x){rho}; slowest lookup rank {same}")

    def warning(self) -> str | None:
        if self.holds:
            return None
        return (f"the cost model's lookup ms are {self.ratio:.2f}x what this machine measures for this plan (outside "
                f"the {1 / self.tolerance:.2f}-{self.tolerance:.2f}x the check allows): its predicted ms are not this "
                "machine's; `cubic shard collect` then `cubic shard train` fit one for this machine (in "
                f"{user_data_dir()}; a model fitted there already: collect more samples and train again)")


def measured_cost(plan: Plan, repeats: int = CHECK_REPEATS, comm: CommModel | None = None) -> PlanCost:
    """The plan's cost with each rank's lookup measured on this CPU's kernel (``repeats`` timings
    each) and communication modelled as its topology says (``comm``, when the caller has built it
    already): the measured side of :func:`compute_check`."""
    return plan_cost(plan, MeasuredEstimator(MeasurementCache(repeats=repeats)),
                     comm or CommModel.from_topology(plan.topology))


def compute_check(predicted: PlanCost, measured: PlanCost) -> ComputeCheck | None:
    """Compare a plan's modelled lookup with its measured one, rank by rank (None: nothing measured)."""
    pairs = [(p.compute_ms, m.compute_ms) for p, m in zip(predicted.per_rank, measured.per_rank)
             if m.compute_ms > 1e-6]
    if not pairs:
        return None
    pred, meas = np.array(pairs).T
    rho = None
    if len(pairs) >= 3 and np.ptp(pred) > 0 and np.ptp(meas) > 0:
        from scipy.stats import spearmanr

        rho = float(spearmanr(pred, meas)[0])
    return ComputeCheck(ratio=float(pred.sum() / meas.sum()), rank_ratios=tuple(float(x) for x in pred / meas),
                        spearman=rho,
                        slowest_predicted=max(predicted.per_rank, key=lambda r: r.compute_ms).rank,
                        slowest_measured=max(measured.per_rank, key=lambda r: r.compute_ms).rank)
