"""Communication cost of a plan: all-to-all volumes per rank under an alpha-beta model.

Per rank r of a model-parallel group of G ranks, per-rank batch B, a step moves (TorchRec's
table-/column-/row-wise pipeline):
- input dist (forward): ids of the local batch go to the owner of each shard (int64), a row-wise
  shard gets only the ids of its row range;
- output dist (forward): pooled embeddings of each shard for every rank's batch (fp32), a row-wise
  shard sends partial sums (reduce-scatter volume);
- backward: the gradients of the pooled embeddings take the reverse route (same volume).
An all-to-all costs ``alpha + alpha_peer*(G-1) + beta*max(bytes sent, bytes received)``: the
collective is bound by the busier direction of the rank's link.
Data-parallel tables all-reduce their dense gradient over every replica (ring: 2(W-1)/W x bytes).
2D sparse parallelism (G < W): each rank keeps its shards in step with the same rank of the other
W/G - 1 groups (:func:`replica_sync_ms`, a rank's pieces in one bucket: :func:`rank_sync_ms`): weights
averaged every few steps, or every step the touched rows' ids all-gathered and their gradients
all-reduced (expected touched rows under the table's Zipf law, :func:`touched_row_sync_bytes`).

The constants come from one of two places (``CommModel.from_topology`` picks by
``Topology.comm_model``, the same rule on every device; ``describe()`` says which, and where from):
- ``CommModel.calibrated(path)``: fitted to real torch.distributed (gloo) all-to-all runs between
  processes on one machine (loopback), stored with that machine's fingerprint (``cubic shard
  calibrate-comm`` writes the user's, in $CUBIC_HOME; ``cost_models/data/comm_calibration.json``
  ships one from another machine). A calibration whose machine is not this one says so.
- the bandwidth model: the Topology's intra/inter-node bandwidths and latencies (latencies default
  to cost_models.hardware's), e.g. a modelled GPU cluster or the user's own network.
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import time
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from cost_models.access import expected_unique_rows  # noqa: F401  (re-exported for the planner)
from cost_models.access import zipf_stats
from cubic.core.spec import SpecError, Table, Topology

DATA_DIR = Path(__file__).resolve().parent / "data"
CALIBRATION_PATH = DATA_DIR / "comm_calibration.json"
ID_BYTES = 8
FP32 = 4
# what a calibrated gloo line and the 2D gradient sync's price have been held to (tests/test_runners_sim.py ties
# both to the results files): said by every calibrated plan's communication line and a 2D plan's legend
LINK_CHECKED = ("fresh gloo calls after compute ran past 1.5x the calibrated line in every layout timed "
                "(experiments/comm_regime.py: results/comm_regime.json)")
GRADIENT_SYNC_CHECKED = ("a 2D gradient sync moved the bytes the model prices but took several times its modelled "
                         "time, its collectives alone over twice it with a core per process too (experiments/two_d.py, "
                         f"4 and 2 gloo processes on 2 cores: results/two_d.json); {LINK_CHECKED}")


USER_CALIBRATION_NAME = "comm_calibration.json"
# what a calibration times: the all-to-all (its constants are the model's base) and the two collectives a
# 2D plan's replica sync makes, each fitted on its own (version 2; a version-1 file fitted the first only)
COLLECTIVES = ("all_to_all", "all_reduce", "all_gather")
_CONSTANTS = ("alpha_s", "alpha_peer_s", "beta_s_per_byte")


def user_calibration_path() -> Path:
    """Where `cubic shard calibrate-comm` writes by default (the user's data directory)."""
    from cubic.core.fingerprint import user_data_dir

    return Path(user_data_dir()) / USER_CALIBRATION_NAME


def calibration_file(path: str | Path, field: str, source: str | None = None) -> Path:
    """A calibration file a user named (``field``: the flag, or the workload field in ``source``), or a
    SpecError naming it. The one existence rule: the CLI's flags, its workload check and the comm
    model all read it here."""
    p = Path(path).expanduser()
    if not p.is_file():
        named = "" if source is None else f" {str(path)!r}"
        raise SpecError(f"no such calibration file{named} (write one with `cubic shard calibrate-comm`)",
                        source=str(path) if source is None else source, field=field)
    return p


def default_calibration_path() -> Path | None:
    """The user's calibration if there is one, else the packaged one (None when neither exists)."""
    for p in (user_calibration_path(), CALIBRATION_PATH):
        if p.is_file():
            return p
    return None


@lru_cache(maxsize=16)
def _read_calibration(path: str, mtime: float) -> tuple[dict, str | None]:
    """(the calibration document, why it is another machine's or None); cached per file version."""
    from cubic.core.fingerprint import machine_differences

    def bad(e: Exception, field: str) -> SpecError:
        return SpecError(f"not a comm calibration ({type(e).__name__}: {e}); write one with `cubic shard "
                         "calibrate-comm`", source=path, field=field)

    try:
        d = json.loads(Path(path).read_text())
        if not isinstance(d, dict):
            raise TypeError("not a JSON object")
    except (OSError, ValueError, TypeError) as e:
        raise bad(e, "constants") from None
    # every fit of the file: the all-to-all's constants and each collective's, of both sets
    for prefix in ("", "oversubscribed.") if "oversubscribed" in d else ("",):
        fits = d[prefix[:-1]] if prefix else d
        fits = fits if isinstance(fits, dict) else {}
        named = fits.get("collectives") or {}
        for field, fit in [("constants", fits.get("constants")),
                           *((f"collectives.{k}", f) for k, f in (named.items() if isinstance(named, dict) else ()))]:
            try:
                if field != "constants" and field.split(".", 1)[1] not in COLLECTIVES[1:]:
                    raise KeyError(f"unknown collective (known: {', '.join(COLLECTIVES[1:])})")
                [float(fit[k]) for k in _CONSTANTS]
            except (ValueError, KeyError, TypeError) as e:
                raise bad(e, prefix + field) from None
    fp = d.get("fingerprint") or {}
    diff = machine_differences(fp)
    foreign = None if not diff else (
        f"measured on another machine ({fp.get('cpu_model', 'unrecorded')}, {fp.get('cpu_count', '?')} cores; "
        f"differs in {', '.join(diff)})")
    return d, foreign


@dataclass(frozen=True)
class CommModel:
    alpha_s: float  # fixed cost of one collective
    alpha_peer_s: float  # per peer in the collective (gloo exchanges pairwise)
    beta_intra_s_per_byte: float
    beta_inter_s_per_byte: float
    ranks_per_node: int = 1 << 30
    source: str = "calibrated"  # calibrated | bandwidth | a caller's name (the step model's cluster)
    alpha_inter_s: float | None = None  # fixed cost of the inter-node leg (default: alpha_s)
    origin: tuple = ()  # (key, value) pairs: where the constants came from (describe() gives them as a dict)
    # ((collective, alpha_s, alpha_peer_s, beta_s_per_byte), ...): a calibration's own fit of a collective,
    # which prices it instead of the constants above (the all-to-all's); inter-node bytes keep the ratio
    fitted: tuple = ()

    @classmethod
    def calibrated(cls, path: str | Path | None = None, processes: int | None = None) -> "CommModel":
        """The alpha-beta constants of a `cubic shard calibrate-comm` file (default: the user's, else
        the packaged one) for a job of ``processes`` on one machine: its fit of the runs with more
        processes than cores when the job has more too (its ``oversubscribed`` set), else the fit of a
        core each. ``origin`` records the file, its machine, whether that machine is this one, and which fit."""
        p = Path(path) if path else default_calibration_path()
        if p is None:
            raise SpecError("no comm calibration (run `cubic shard calibrate-comm`)", field="comm_calibration")
        p = calibration_file(p, "topology.comm_calibration")
        d, foreign = _read_calibration(str(p.resolve()), p.stat().st_mtime)
        fp = d.get("fingerprint") or {}
        cores = d.get("cores") or fp.get("cpu_count")
        over = bool(processes and cores and processes > cores and "oversubscribed" in d)
        fits = d["oversubscribed"] if over else d
        c, by_kind = fits["constants"], fits.get("collectives") or {}
        origin = (("kind", "calibrated"), ("file", str(p)), ("machine", fp.get("cpu_model", "unrecorded")),
                  ("cores", fp.get("cpu_count")), ("fingerprint_hash", d.get("fingerprint_hash")),
                  ("this_machine", foreign is None), ("foreign_reason", foreign), ("fit_mape", fits.get("fit_mape")),
                  ("measured_at", d.get("measured_at")),
                  ("collectives_fitted", ", ".join(("all_to_all", *sorted(by_kind)))),
                  ("fit", f"{processes} processes on {cores} cores (the file's oversubscribed fit)" if over
                   else d.get("runs_fitted", "every run (a version-1 file)")))
        return cls(c["alpha_s"], c["alpha_peer_s"], c["beta_s_per_byte"], c["beta_s_per_byte"], source="calibrated",
                   origin=origin,
                   fitted=tuple((k, *(float(f[n]) for n in _CONSTANTS)) for k, f in sorted(by_kind.items())))

    @classmethod
    def from_topology(cls, topo: Topology) -> "CommModel":
        """The interconnect a plan is for: ``topo.comm_model`` "calibrated" (a calibration file; on
        several nodes the inter-node leg is scaled by the topology's intra/inter bandwidth ratio),
        "bandwidth" (the topology's bandwidths and latencies), or "auto": calibrated on a cpu topology
        when a calibration exists, else bandwidth. The same rule on every device."""
        kind = topo.comm_model
        if kind == "auto":
            has_cal = topo.comm_calibration is not None or default_calibration_path() is not None
            kind = "calibrated" if topo.device == "cpu" and has_cal else "bandwidth"
        if kind == "calibrated":
            # processes on one machine: a node's ranks (the calibration is one machine's loopback)
            cal = cls.calibrated(topo.comm_calibration, processes=min(topo.world_size, topo.ranks_per_node))
            if topo.world_size <= topo.ranks_per_node:
                return cal
            # several nodes: the loopback calibration is the intra-node rate; a byte between nodes
            # costs the topology's intra/inter bandwidth ratio more (modelled, no multi-node calibration)
            ratio = topo.intra_node_bw_gbps / topo.inter_node_bw_gbps
            scaled = ("inter_node", f"scaled by the topology's bandwidth ratio {ratio:.3g}")
            return replace(cal, beta_inter_s_per_byte=cal.beta_intra_s_per_byte * ratio,
                           ranks_per_node=topo.ranks_per_node, origin=cal.origin + (scaled,))
        from cost_models.hardware import ClusterSpec

        lat_intra = (topo.intra_node_latency_us * 1e-6 if topo.intra_node_latency_us is not None
                     else ClusterSpec.model_fields["nvlink_latency_s"].default)
        lat_inter = (topo.inter_node_latency_us * 1e-6 if topo.inter_node_latency_us is not None
                     else ClusterSpec.model_fields["network_latency_s"].default)
        origin = (("kind", "bandwidth"), ("intra_node_bw_gbps", topo.intra_node_bw_gbps),
                  ("inter_node_bw_gbps", topo.inter_node_bw_gbps), ("intra_node_latency_us", lat_intra * 1e6),
                  ("inter_node_latency_us", lat_inter * 1e6), ("ranks_per_node", topo.ranks_per_node),
                  ("latencies_from", "topology" if topo.intra_node_latency_us is not None
                   or topo.inter_node_latency_us is not None else "defaults (cost_models.hardware)"))
        return cls(
            alpha_s=lat_intra,
            alpha_inter_s=lat_inter,
            alpha_peer_s=0.0,  # NCCL all-to-all overlaps peers; latency is per collective
            beta_intra_s_per_byte=1.0 / (topo.intra_node_bw_gbps * 1e9),
            beta_inter_s_per_byte=1.0 / (topo.inter_node_bw_gbps * 1e9),
            ranks_per_node=topo.ranks_per_node,
            source="bandwidth",
            origin=origin,
        )

    def describe(self) -> dict:
        """Which communication model this is and where its constants came from (recorded in plans)."""
        d = dict(self.origin) or {"kind": self.source}
        d.update({"alpha_s": self.alpha_s, "alpha_peer_s": self.alpha_peer_s,
                  "beta_intra_s_per_byte": self.beta_intra_s_per_byte,
                  "beta_inter_s_per_byte": self.beta_inter_s_per_byte,
                  "alpha_inter_s": self.alpha_s if self.alpha_inter_s is None else self.alpha_inter_s})
        if self.ranks_per_node < (1 << 30):
            d["ranks_per_node"] = self.ranks_per_node
        if self.fitted:
            d["collectives"] = {k: dict(zip(_CONSTANTS, c)) for k, *c in self.fitted}
        return d

    def for_collective(self, kind: str) -> "CommModel":
        """The model that prices ``kind``, with no fits of its own: the calibration's fit of ``kind`` where
        there is one (inter-node bytes at this model's inter/intra ratio), else this model's constants."""
        for name, a, a_peer, beta in self.fitted:
            if name == kind:
                ratio = self.beta_inter_s_per_byte / self.beta_intra_s_per_byte if self.beta_intra_s_per_byte else 1.0
                return replace(self, alpha_s=a, alpha_peer_s=a_peer, beta_intra_s_per_byte=beta,
                               beta_inter_s_per_byte=beta * ratio, fitted=())
        return replace(self, fitted=())

    def beta(self, peers: int) -> float:
        """Seconds per byte when a rank's bytes are spread evenly over ``peers`` other ranks."""
        if peers <= 0:
            return 0.0
        intra = min(peers, self.ranks_per_node - 1)
        inter = peers - intra
        return (intra * self.beta_intra_s_per_byte + inter * self.beta_inter_s_per_byte) / peers

    def _legs_s(self, send_intra, recv_intra, send_inter, recv_inter, peers_intra, peers_inter):
        """Seconds of an all-to-all per rank: the intra-node and inter-node legs run concurrently
        (NVLink and the NIC, or loopback and the network), each ``alpha + alpha_peer * peers +
        beta * max(bytes sent, bytes received)``; the rank is done when its slower leg is."""
        a_inter = self.alpha_s if self.alpha_inter_s is None else self.alpha_inter_s
        intra = np.where(peers_intra > 0, self.alpha_s + self.alpha_peer_s * peers_intra
                         + self.beta_intra_s_per_byte * np.maximum(send_intra, recv_intra), 0.0)
        inter = np.where(peers_inter > 0, a_inter + self.alpha_peer_s * peers_inter
                         + self.beta_inter_s_per_byte * np.maximum(send_inter, recv_inter), 0.0)
        return np.maximum(intra, inter)

    def all_to_all_ms(self, group: int, sent, received):
        """One all-to-all in a group of ``group`` ranks where a rank sends ``sent`` and receives
        ``received`` bytes in total, spread evenly over its peers (scalars or arrays, one per rank).
        This and :meth:`all_to_all_ranks_ms` are the one all-to-all model (every collective here is in ms): the planner, the sharding
        evaluator and the simulated cluster's step model all call them."""
        if group <= 1:
            return 0.0 if np.ndim(sent) == 0 and np.ndim(received) == 0 else np.zeros(np.broadcast(sent, received).shape)
        if self.fitted:
            return self.for_collective("all_to_all").all_to_all_ms(group, sent, received)
        local = min(self.ranks_per_node, group)
        p_in, p_out = local - 1, group - local
        f_in = p_in / (group - 1)
        sent, received = np.asarray(sent, dtype=float), np.asarray(received, dtype=float)
        t = self._legs_s(sent * f_in, received * f_in, sent * (1 - f_in), received * (1 - f_in), p_in, p_out)
        return float(1e3 * t) if t.ndim == 0 else 1e3 * t

    def all_to_all_ranks_ms(self, per_peer: np.ndarray, group: int) -> np.ndarray:
        """Per-rank ms of one all-to-all where rank r sends ``per_peer[r]`` bytes to each other
        rank (uneven across ranks); ranks r // ranks_per_node share a node."""
        if group <= 1:
            return np.zeros(group)
        if self.fitted:
            return self.for_collective("all_to_all").all_to_all_ranks_ms(per_peer, group)
        rpn = min(self.ranks_per_node, group)
        node = np.arange(group) // rpn
        v = np.asarray(per_peer, dtype=float)
        node_sum = np.bincount(node, weights=v)
        local_n = np.bincount(node)[node]
        return 1e3 * self._legs_s(v * (local_n - 1), node_sum[node] - v, v * (group - local_n),
                                  v.sum() - node_sum[node], local_n - 1, group - local_n)

    def all_reduce_ms(self, group: int, nbytes: float, members_per_node: int | None = None) -> float:
        """Hierarchical all-reduce of ``nbytes`` over ``group`` ranks, ``members_per_node`` of them per
        node (default: the model's ranks per node): reduce-scatter inside the node (ring of L), an
        all-reduce of nbytes/L across the nodes (the cheaper of a ring and NCCL's double binary
        tree), all-gather inside the node. Each ring step costs a latency plus the per-peer overhead."""
        if group <= 1 or nbytes <= 0:
            return 0.0
        if self.fitted:
            return self.for_collective("all_reduce").all_reduce_ms(group, nbytes, members_per_node)
        L = max(1, min(members_per_node or self.ranks_per_node, group))
        nodes = -(-group // L)
        t = 0.0
        if L > 1:
            t += 2 * (L - 1) / L * nbytes * self.beta_intra_s_per_byte + 2 * (L - 1) * (self.alpha_s + self.alpha_peer_s)
        if nodes > 1:
            a = (self.alpha_s if self.alpha_inter_s is None else self.alpha_inter_s) + self.alpha_peer_s
            n = nbytes / L
            ring = 2 * (nodes - 1) / nodes * n * self.beta_inter_s_per_byte + 2 * (nodes - 1) * a
            tree = 2 * n * self.beta_inter_s_per_byte + 2 * math.ceil(math.log2(nodes)) * a
            t += min(ring, tree)
        return 1e3 * t

    def all_gather_ms(self, group: int, nbytes_each: float, members_per_node: int | None = None) -> float:
        """All-gather of ``nbytes_each`` from each of ``group`` ranks, ``members_per_node`` of them per node
        (default: the model's ranks per node): every rank receives its peers' bytes, the intra- and
        inter-node legs concurrently (:meth:`_legs_s`)."""
        if group <= 1 or nbytes_each <= 0:
            return 0.0
        if self.fitted:
            return self.for_collective("all_gather").all_gather_ms(group, nbytes_each, members_per_node)
        local = max(1, min(members_per_node or self.ranks_per_node, group))
        p_in, p_out = local - 1, group - local
        t = self._legs_s(p_in * nbytes_each, p_in * nbytes_each, p_out * nbytes_each, p_out * nbytes_each,
                         np.asarray(p_in), np.asarray(p_out))
        return float(1e3 * t)


@dataclass(frozen=True)
class ShardTraffic:
    """The per-step quantities of one placed (non-DP) shard that drive communication."""

    rank: int
    cols: int
    ids_per_example: float  # mean ids of the shard's row range per example


def rank_volumes(traffic: list[ShardTraffic], group: int, batch: int) -> dict[str, np.ndarray]:
    """Bytes per rank per step (arrays over the group): ids sent/received in the input all-to-all,
    pooled embeddings sent/received in the forward output all-to-all (the backward reverses them)."""
    cols = np.zeros(group)
    ids = np.zeros(group)
    for t in traffic:
        cols[t.rank] += t.cols
        ids[t.rank] += t.ids_per_example
    tot_cols, tot_ids = cols.sum(), ids.sum()
    return {"ids_sent": batch * (tot_ids - ids) * ID_BYTES, "ids_recv": (group - 1) * batch * ids * ID_BYTES,
            "emb_sent": (group - 1) * batch * cols * FP32, "emb_recv": batch * (tot_cols - cols) * FP32}


def rank_comm_ms(traffic: list[ShardTraffic], group: int, batch: int, model: CommModel) -> list[float]:
    """Forward (ids + pooled) and backward (grads) all-to-all time of every rank of the group, ms."""
    v = rank_volumes(traffic, group, batch)
    t = (model.all_to_all_ms(group, v["ids_sent"], v["ids_recv"])
         + model.all_to_all_ms(group, v["emb_sent"], v["emb_recv"])  # forward pooled embeddings
         + model.all_to_all_ms(group, v["emb_recv"], v["emb_sent"]))  # backward gradients, reversed
    return [float(x) for x in np.broadcast_to(t, (group,))]


def dp_sync_ms(nbytes: float, world: int, model: CommModel) -> float:
    """One bucketed all-reduce of the data-parallel tables' dense gradients over every replica."""
    return model.all_reduce_ms(world, nbytes)


def replica_members_per_node(group: int, replicas: int, ranks_per_node: int) -> int:
    """Replicas of one group rank on the same node: several when groups are smaller than a node."""
    return min(max(1, ranks_per_node // group) if group < ranks_per_node else 1, replicas)


def touched_row_sync_bytes(rows, cols, alpha, draws, replicas: int) -> tuple[np.ndarray, np.ndarray]:
    """Sync ``gradients``: what each replica of a shard exchanges per step, as cubic's 2D runner does it
    (``ShardedEmbedding._sum_touched_rows``): the ids of the rows its group's ``draws`` (Zipf ``alpha``
    over the shard's ``rows``) touched, all-gathered (bytes each replica adds), then the fp32 gradients
    of the union of every replica's touched rows, all-reduced (bytes). Arrays over shards; the planner
    (one shard) and the step model (every shard of a rank) both read this, the one rule."""
    rows, cols, alpha, draws = (np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in (rows, cols, alpha, draws))
    rows, cols, alpha, draws = np.broadcast_arrays(rows, cols, alpha, draws)
    unique, _ = zipf_stats(np.concatenate([draws, draws * replicas]), np.tile(rows, 2), np.tile(alpha, 2))
    n = rows.size
    return unique[:n] * ID_BYTES, unique[n:] * cols * FP32


def _sync_collectives(replicas: int, group: int, model: CommModel, mode: str, interval: int) -> tuple:
    """The collectives of one rank's replica sync per step, each a function of its bytes (ms), in the
    order of :func:`sync_bytes`. ``weights``: the bucket (weights and optimizer state) all-reduced every
    ``interval`` steps (TorchRec's DMPCollection.sync()); ``gradients``: every step, the runner's three
    (``ShardedEmbedding._sum_touched_rows``): the pieces' touched-row counts all-gathered, the touched
    ids all-gathered, the union's gradients all-reduced. The replicas of a group rank sit on other
    nodes unless groups are smaller than a node."""
    members = replica_members_per_node(group, replicas, model.ranks_per_node)
    if mode == "weights":
        return (lambda b: model.all_reduce_ms(replicas, b, members) / interval,)
    gather = lambda b: model.all_gather_ms(replicas, b, members)  # noqa: E731
    return gather, gather, lambda b: model.all_reduce_ms(replicas, b, members)


def sync_bytes(mode: str, *, shard_bytes=0.0, ids_bytes=0.0, grad_bytes=0.0, pieces=1) -> tuple:
    """A bucket's bytes per collective of its sync (:func:`_sync_collectives`' order)."""
    return (shard_bytes,) if mode == "weights" else (pieces * ID_BYTES, ids_bytes, grad_bytes)


def replica_sync_ms(replicas: int, group: int, model: CommModel, *, mode: str, interval: int,
                    shard_bytes: float = 0.0, ids_bytes: float = 0.0, grad_bytes: float = 0.0,
                    pieces: float = 1) -> float:
    """2D sparse parallelism: one rank's replica sync per step, ms, for a bucket of ``pieces`` shards and
    their bytes: one set of collectives per rank, not per piece, as the runner and TorchRec's
    DMPCollection.sync() exchange them (:func:`_sync_collectives`; a rank's bucket: :func:`rank_sync_ms`;
    the gradients' bytes: :func:`touched_row_sync_bytes`)."""
    if replicas <= 1:
        return 0.0
    nbytes = sync_bytes(mode, shard_bytes=shard_bytes, ids_bytes=ids_bytes, grad_bytes=grad_bytes, pieces=pieces)
    return float(sum(f(b) for f, b in zip(_sync_collectives(replicas, group, model, mode, interval), nbytes)))


def rank_sync_ms(rank, group: int, replicas: int, model: CommModel, *, mode: str, interval: int, shard_bytes=None,
                 rows=None, cols=None, alpha=None, draws=None) -> tuple[np.ndarray, np.ndarray]:
    """Each group rank's replica sync per step (ms) and the bytes it exchanges, its pieces in one bucket
    (arrays over the pieces: their ``rank``; ``weights`` reads ``shard_bytes``, ``gradients`` the
    pieces' ``rows``, ``cols``, Zipf ``alpha`` and the group's ``draws`` of them). The plan's estimate
    (sharding.estimate) and the simulated step (cubic.runners.step_model) both read this."""
    rank = np.asarray(rank, dtype=np.int64)
    if replicas <= 1 or rank.size == 0:
        return np.zeros(group), np.zeros(group)
    pieces = np.bincount(rank, minlength=group)
    if mode == "weights":
        held = np.bincount(rank, weights=np.asarray(shard_bytes, dtype=np.float64), minlength=group)
        ms = [replica_sync_ms(replicas, group, model, mode=mode, interval=interval, shard_bytes=b) if n else 0.0
              for b, n in zip(held, pieces)]
        return np.array(ms), held
    ids_b, grad_b = touched_row_sync_bytes(rows, cols, alpha, draws, replicas)
    ids_r = np.bincount(rank, weights=ids_b, minlength=group)
    grad_r = np.bincount(rank, weights=grad_b, minlength=group)
    ms = [replica_sync_ms(replicas, group, model, mode=mode, interval=1, ids_bytes=a, grad_bytes=b, pieces=n)
          if n else 0.0 for a, b, n in zip(ids_r, grad_r, pieces)]
    return np.array(ms), ids_r + grad_r  # the bytes the runner counts (the counts are a few int64)


def group_draws(table: Table, rows, group: int, batch: int):
    """The ids a group's step draws from a piece of ``rows`` rows of ``table``: the group's batch times
    the piece's share of the table's ids."""
    return group * batch * table.pooling_factor * np.asarray(rows, dtype=np.float64) / table.rows


def piece_sync_bytes(table: Table, rows: int, cols: int, group: int, batch: int, replicas: int, *, mode: str,
                     shard_bytes: float) -> tuple:
    """What one piece adds to its rank's sync bucket, per collective (:func:`sync_bytes`)."""
    if mode == "weights":
        return sync_bytes(mode, shard_bytes=shard_bytes)
    ids, grads = touched_row_sync_bytes(rows, cols, table.access.effective_alpha(),
                                        group_draws(table, rows, group, batch), replicas)
    return sync_bytes(mode, ids_bytes=float(ids[0]), grad_bytes=float(grads[0]))


@dataclass(frozen=True)
class SyncLine:
    """A rank's replica sync as a planner adds it up piece by piece: ``fixed_ms`` once per rank, plus
    ``per_byte_ms`` times each piece's bytes per collective. The line touches the bucket's real cost
    (:func:`replica_sync_ms`: collectives' latencies once, a ring or a tree, whichever is cheaper) at
    ``bucket`` (bytes per collective), an even share of the group's, so a rank near it is priced as its
    bucket is."""

    fixed_ms: float
    per_byte_ms: tuple

    @classmethod
    def at(cls, replicas: int, group: int, model: CommModel, *, mode: str, interval: int,
           bucket: tuple) -> "SyncLine":
        if replicas <= 1:
            return cls(0.0, (0.0,) * len(bucket))
        fs = _sync_collectives(replicas, group, model, mode, interval)
        fixed, slopes = 0.0, []
        for f, x in zip(fs, bucket):
            x = max(float(x), 1.0)
            h = 1e-6 * x  # each collective is piecewise linear in its bytes: the slope of x's piece
            slope = (f(x + h) - f(x - h)) / (2 * h)
            slopes.append(slope)
            fixed += f(x) - slope * x
        return cls(fixed, tuple(slopes))

    def piece_ms(self, nbytes: tuple) -> float:
        return float(sum(s * b for s, b in zip(self.per_byte_ms, nbytes)))


# ---------------------------------------------------------------- calibration (real gloo runs)

def collective_ms(model: CommModel, kind: str, world: int, nbytes: float) -> float:
    """One collective among ``world`` ranks of one node as ``model`` prices it, ms: ``all_to_all``,
    ``nbytes`` to each peer; ``all_reduce``, a buffer of ``nbytes``; ``all_gather``, ``nbytes`` from each
    rank. Linear in the model's constants, so the calibration fits them through this (one formula)."""
    if kind == "all_to_all":
        return model.all_to_all_ms(world, nbytes * (world - 1), nbytes * (world - 1))
    if kind == "all_reduce":
        return model.all_reduce_ms(world, nbytes, members_per_node=world)
    if kind == "all_gather":
        return model.all_gather_ms(world, nbytes, members_per_node=world)
    raise ValueError(f"unknown collective {kind!r} (known: {', '.join(COLLECTIVES)})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_collective(dist, kind: str, x, out, outs, group=None) -> None:
    """One call of ``kind`` on the buffers :func:`collective_buffers` made (``group``: its process group)."""
    if kind == "all_to_all":
        dist.all_to_all_single(out, x, group=group)
    elif kind == "all_reduce":
        dist.all_reduce(x, group=group)
    else:
        dist.all_gather(outs, x, group=group)


def collective_buffers(torch, kind: str, world: int, nbytes: int) -> tuple:
    """fp32 buffers of one call among ``world`` ranks (:func:`collective_ms`'s meaning of ``nbytes``)."""
    n = max(1, nbytes // 4)
    x = torch.randn(n * world if kind == "all_to_all" else n)
    return x, torch.empty_like(x), [torch.empty(n) for _ in range(world)]


def _collective_worker(rank: int, world: int, port: int, kinds: list[str], sizes: list[int], repeats: int,
                       out_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = []
    try:
        for nbytes in sizes:
            bufs = {k: collective_buffers(torch, k, world, nbytes) for k in kinds}
            times = {k: [] for k in kinds}
            for i in range(repeats + 2):
                for kind in (kinds if i % 2 == 0 else kinds[::-1]):  # interleaved: drift hits every collective alike
                    dist.barrier()
                    t0 = time.perf_counter()
                    run_collective(dist, kind, *bufs[kind])
                    dt = torch.tensor([time.perf_counter() - t0])
                    dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # the collective ends when the slowest rank does
                    if i >= 2:
                        times[kind].append(float(dt))
            rows += [{"collective": k, "world": world, "bytes": nbytes, "median_s": statistics.median(v),
                      "repeats": repeats} for k, v in times.items()]
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out_path).write_text(json.dumps(rows))


def gloo_processes(worker, world: int, *args) -> list[dict]:
    """Runs ``worker(rank, world, port, *args, out_path)`` in ``world`` fresh local processes (a gloo
    group on a free loopback port) and returns the rows rank 0 wrote to ``out_path`` (JSON)."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.json")
        os.environ["PYTHONSAFEPATH"] = "1"  # spawned children start with "-c": keep the cwd off their sys.path
        mp.start_processes(worker, args=(world, _free_port(), *args, out), nprocs=world, join=True,
                           start_method="spawn")
        return json.loads(Path(out).read_text())


def measure_collectives(world: int, sizes: list[int], repeats: int = 10, kinds=COLLECTIVES) -> list[dict]:
    """Median time of each gloo collective between ``world`` local processes, per size (its meaning
    per collective: :func:`collective_ms`), back to back after a barrier."""
    return gloo_processes(_collective_worker, world, list(kinds), sizes, repeats)


def fit_collective(runs: list[dict]) -> tuple[dict, float]:
    """Non-negative least squares of one collective's runs onto the model's own formula for it
    (:func:`collective_ms` is linear in alpha, alpha_peer and beta), relative errors weighted alike:
    (constants, mean absolute percentage error)."""
    from scipy.optimize import nnls

    units = (CommModel(1.0, 0.0, 0.0, 0.0), CommModel(0.0, 1.0, 0.0, 0.0), CommModel(0.0, 0.0, 1.0, 1.0))
    A = np.array([[collective_ms(u, r["collective"], r["world"], r["bytes"]) / 1e3 for u in units] for r in runs])
    y = np.array([r["median_s"] for r in runs])
    wts = 1.0 / np.maximum(y, 1e-6)  # small messages matter as much as large ones
    coef, _ = nnls(A * wts[:, None], y * wts)
    pred = A @ coef
    return dict(zip(_CONSTANTS, (float(c) for c in coef))), float(np.mean(np.abs(pred - y) / y))


def _fit_set(runs: list[dict]) -> dict:
    """Every collective's fit of ``runs``: the all-to-all's as ``constants`` (the model's base), the
    others under ``collectives``."""
    fits = {k: fit_collective([r for r in runs if r["collective"] == k]) for k in COLLECTIVES}
    return {"constants": fits["all_to_all"][0], "fit_mape": fits["all_to_all"][1],
            "collectives": {k: {**c, "fit_mape": e} for k, (c, e) in fits.items() if k != "all_to_all"}}


def pooled_passes(passes: list[list[dict]]) -> list[dict]:
    """One row per collective, world and size: the median over the passes of each pass's median time
    (``median_s``), each pass's beside it (``passes_s``) and their max/min (``pass_spread``). A gloo
    process group can keep a slow state for its life (a 2-process all-reduce of 4 KB here: 0.3 ms in two
    groups, 2.6 in the third), so fresh groups, pooled, steady a fit that one group would tip."""
    cells: dict = {}
    for rows in passes:
        for r in rows:
            cells.setdefault((r["collective"], r["world"], r["bytes"]), []).append(r)
    out = []
    for rs in cells.values():
        times = [r["median_s"] for r in rs]
        out.append({**rs[0], "median_s": statistics.median(times), "passes_s": times,
                    "pass_spread": max(times) / min(times)})
    return out


def calibrate(worlds=(2, 3, 4), sizes=(256, 4096, 65536, 262144, 1 << 20, 4 << 20), repeats: int = 10,
              path: str | Path | None = CALIBRATION_PATH, passes: int = 3) -> dict:
    """Run gloo all-to-alls, all-reduces and all-gathers in ``passes`` fresh process groups per world,
    pooled (:func:`pooled_passes`); fit each collective's constants through the model's own formula for
    it (:func:`fit_collective`). The all-to-all's are the model's base (``constants``); the others price
    the 2D replica sync (``collectives``, CommModel.for_collective)."""
    from cubic.core.fingerprint import fingerprint, fingerprint_hash

    fp = fingerprint("cpu")
    cores = int(fp.get("cpu_count") or os.cpu_count() or 1)
    measured = [[r for w in worlds for r in measure_collectives(w, list(sizes), repeats)] for _ in range(passes)]
    runs = [{**r, "oversubscribed": r["world"] > cores} for r in pooled_passes(measured)]
    spare, busy = [r for r in runs if not r["oversubscribed"]], [r for r in runs if r["oversubscribed"]]
    fits = _fit_set(spare or busy)
    doc = {
        "version": 2,
        "what": ("alpha-beta constants of torch.distributed gloo collectives between processes on this machine over "
                 "loopback, each timed back to back after a barrier (the slowest rank's time, median; the median "
                 "of that over fresh process groups, ``passes``) and fitted "
                 "through cost_models.comm's formula for it: all_to_all_single t = alpha_s + alpha_peer_s*(P-1) + "
                 "beta_s_per_byte*bytes_sent_per_rank (``constants``, the model's base); all_reduce (ring) and "
                 "all_gather (``collectives``), the collectives of a 2D plan's replica sync. Fitted on the runs "
                 "with a core per process; ``oversubscribed``: the same fits of the runs with more processes than "
                 "cores (a job of more processes than this machine's cores is priced with them)"),
        **fits,
        "runs_fitted": "a core per process" if spare else "more processes than cores (no run had a core each)",
        "cores": cores,
        "passes": passes,
        "pass_spread": {k: statistics.median(r["pass_spread"] for r in runs if r["collective"] == k)
                        for k in COLLECTIVES},
        **({"oversubscribed": {**_fit_set(busy), "worlds": sorted({r["world"] for r in busy})}} if spare and busy
           else {}),
        "runs": runs,
        "fingerprint": fp,
        "fingerprint_hash": fingerprint_hash(fp),
        "loadavg_1m": os.getloadavg()[0],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    print(json.dumps(calibrate(), indent=1)[:2000])
