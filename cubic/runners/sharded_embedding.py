"""The model-parallel embedding stage of cubic's distributed runner (one process per rank): this
rank's shards of the workload's tables behind a differentiable all-to-all, and the 2D layout (groups
of G ranks hold the plan's shards; replicas kept in step by gradient or weight sync). See
:mod:`cubic.runners.distributed` for the run around it."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cubic.core.spec import Workload
from sharding.types import Plan, ReplicaSync

SYNC_CALLS_KEPT = 3 * 1024  # the last ~1,000 gradient syncs' collectives (three each)


# -- 2D layout -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TwoD:
    """2D sparse parallelism on this rank: cluster rank r is rank ``r % G`` of model-parallel group
    ``r // G`` (``shard_group``: the ranks ``[g*G, (g+1)*G)``), whose G ranks hold the plan's shards;
    the c = W/G replicas of a shard (``replica_group``: ranks ``r % G + k*G``) are kept in step by
    ``sync``: ``gradients`` (per-step all-reduce of touched-row gradients) or ``weights`` (weights
    and row-wise optimizer state averaged every ``interval`` steps)."""

    group_size: int
    replicas: int
    replica: int  # which group (replica) this rank is in
    shard_group: Any
    replica_group: Any
    sync: str
    interval: int

    @classmethod
    def create(cls, rank: int, world: int, group_size: int, sync: str | None, interval: int | None) -> "TwoD":
        """The process groups (every rank creates every group, in the same order: torch.distributed's rule)."""
        import torch.distributed as dist

        G, c = group_size, world // group_size
        shard = [dist.new_group(list(range(g * G, (g + 1) * G))) for g in range(c)]
        rep = [dist.new_group(list(range(i, world, G))) for i in range(G)]
        # one default for the runners, the step model and the planners, so a 2D config means the same thing
        # measured, simulated and planned
        rs = ReplicaSync.of(sync, interval)
        return cls(G, c, rank // G, shard[rank // G], rep[rank % G], rs.mode, rs.interval)

    def describe(self) -> dict[str, Any]:
        return {"group_size": self.group_size, "replicas": self.replicas, "sync": self.sync,
                "sync_interval": self.interval}


# -- the sharded embedding stage ------------------------------------------------------------------


class _AllToAll(torch.autograd.Function):
    """Differentiable all_to_all_single; the backward is the reverse all-to-all. Time goes to ``owner.comm_s``."""

    @staticmethod
    def forward(ctx, x, out_split, in_split, owner):  # noqa: D102
        import torch.distributed as dist

        ctx.splits, ctx.owner = (out_split, in_split), owner
        out = x.new_empty(sum(out_split))
        t0 = time.perf_counter()
        dist.all_to_all_single(out, x.contiguous(), out_split, in_split, group=owner.group)
        owner.comm_s += time.perf_counter() - t0
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        import torch.distributed as dist

        out_split, in_split = ctx.splits
        gin = grad.new_empty(sum(in_split))
        t0 = time.perf_counter()
        dist.all_to_all_single(gin, grad.contiguous(), in_split, out_split, group=ctx.owner.group)
        ctx.owner.comm_s += time.perf_counter() - t0
        return gin, None, None, None


class ShardedEmbedding(nn.Module):
    """This rank's pieces of the workload's tables (see the module docstring), with the interface of
    :class:`cubic.core.models.EmbeddingStage`: ``pooled``, ``split``, ``forward``, ``make_optimizer``."""

    kernel = "sharded"
    fused_optimizer = False

    def __init__(self, workload: Workload, plan: Plan, rank: int, world: int, *, seed: int, device: torch.device,
                 two_d: "TwoD | None" = None):
        """``rank``/``world``: this rank in its model-parallel group and the group's size (the whole
        world in 1D); ``two_d``: the 2D layout (process groups, replica sync), None in 1D."""
        import torch.distributed as dist

        from cubic.core.models import table_inits

        super().__init__()
        tables = list(workload.tables)
        self.table_names = [t.name for t in tables]
        self.dims = [t.dim for t in tables]
        self.rows = {t.name: t.rows for t in tables}
        self.tindex = {t.name: i for i, t in enumerate(tables)}
        self.rank, self.world, self.device = rank, world, device
        self.two_d = two_d
        self.group = two_d.shard_group if two_d else None  # None: the default (world) group
        self.optimizer_name = workload.optimizers.embedding
        self.lr = workload.optimizers.embedding_lr
        self.comm_s = 0.0
        self.sync_s = 0.0  # seconds in 2D replica sync (also counted in comm_s)
        # sync gradients, summed over syncs: bytes of the ids this rank touched (all-gathered; the wire pads
        # to the longest replica's) and of the union's gradient rows (all-reduced): the volumes
        # cost_models.comm.touched_row_sync_bytes models; and the seconds inside the three collectives
        # (the rest of sync_s is finding and merging the rows)
        self.sync_volume = {"syncs": 0, "ids_bytes": 0, "grad_bytes": 0, "collective_s": 0.0}
        # each sync collective's (start, seconds), the latest few thousand: set beside the replica peers'
        # starts after the run (cubic.runners.distributed._peer_wait), the part of it spent waiting for a peer
        self.sync_calls: deque[tuple[float, float]] = deque(maxlen=SYNC_CALLS_KEPT)
        self.steps_taken = 0
        self._optimizer: torch.optim.Optimizer | None = None
        sharded = [s for s in plan.shards if s.sharding_type != "data_parallel"]
        self.any_sharded = bool(sharded)
        self.owned_by = [[s for s in sharded if s.rank == p] for p in range(world)]  # plan order: both ends agree
        self.mine = self.owned_by[rank]
        self.dp = [n for n in self.table_names
                   if any(s.table == n and s.sharding_type == "data_parallel" for s in plan.shards)]
        self.bags = nn.ModuleList()
        self.dp_bags = nn.ModuleDict()
        weights: dict[int, torch.Tensor] = {}
        for t, init in zip(tables, table_inits(tables, seed)):  # one table's init in memory at a time
            for j, s in enumerate(self.mine):
                if s.table == t.name:
                    weights[j] = init[s.row_offset:s.row_offset + s.rows, s.col_offset:s.col_offset + s.cols].clone()
            if t.name in self.dp:
                bag = nn.EmbeddingBag(t.rows, t.dim, mode="sum", device=device)  # dense grads: all-reduced
                with torch.no_grad():
                    bag.weight.copy_(init)
                self.dp_bags[t.name] = bag
        for j, s in enumerate(self.mine):
            bag = nn.EmbeddingBag(s.rows, s.cols, mode="sum", sparse=True, device=device)
            with torch.no_grad():
                bag.weight.copy_(weights.pop(j))
            self.bags.append(bag)
        # pieces sharing a row range of one table split by columns: their row-wise AdaGrad state is one
        # per row of the whole width, so the owners sum each row's squares (a process group per split)
        self.col_groups: list[tuple[int, list[int], Any]] = []  # (dim, my piece indices, group or None)
        keys = sorted({(self.tindex[s.table], s.row_offset) for s in sharded
                       if s.cols < self.dims[self.tindex[s.table]]})
        replicas = two_d.replicas if two_d else 1
        mine_rep = two_d.replica if two_d else 0
        for ti, row_offset in keys:
            members = [s for s in sharded if self.tindex[s.table] == ti and s.row_offset == row_offset]
            ranks = sorted({s.rank for s in members})
            groups = [dist.new_group([q * world + r for r in ranks]) if len(ranks) > 1 else None
                      for q in range(replicas)]  # every rank calls new_group for every replica, in order
            local = [j for j, s in enumerate(self.mine) if self.tindex[s.table] == ti and s.row_offset == row_offset]
            if local:
                self.col_groups.append((self.dims[ti], local, groups[mine_rep]))

    def replicated_parameters(self) -> list[nn.Parameter]:
        return list(self.dp_bags.parameters())

    def make_optimizer(self) -> torch.optim.Optimizer | None:
        from cubic.core.models import RowWiseAdagrad

        split = {j for _, local, _ in self.col_groups for j in local}
        plain = [self.bags[j].weight for j in range(len(self.bags)) if j not in split] + self.replicated_parameters()
        if self.optimizer_name == "sgd":
            params = [*plain, *(self.bags[j].weight for j in split)]
            self._optimizer = torch.optim.SGD(params, lr=self.lr) if params else None
            return self._optimizer
        groups: list[dict] = [{"params": plain}] if plain else []
        for dim, local, group in self.col_groups:
            groups.append({"params": [self.bags[j].weight for j in local], "row_dim": dim,
                           "reduce": self._reducer(group)})
        # momentum scaling only where replicas train apart (weight averaging); with per-step gradient
        # sync every replica sees the global gradient, as in 1D, and the rule is row-wise AdaGrad
        apart = self.two_d is not None and self.two_d.sync == "weights"
        replicas = self.two_d.replicas if apart and self.optimizer_name == "ms_rowwise_adagrad" else 1
        self._optimizer = RowWiseAdagrad(groups, lr=self.lr, replicas=replicas) if groups else None
        return self._optimizer

    # -- 2D: keeping the replicas in step (TrainSession calls these around the optimizer step) -----

    def before_optimizer(self) -> None:
        """2D, sync ``gradients``: sum each sharded piece's touched-row gradients over its replicas
        (each holds 1/c of the global mean loss's gradient, so the sum is the 1D gradient). Sync
        ``weights``: scale them by c, so that each replica steps on its own group's mean loss."""
        if self.two_d is None or not len(self.bags):
            return
        t0 = time.perf_counter()
        if self.two_d.sync == "gradients":
            self._sum_touched_rows()
        else:
            for b in self.bags:
                if b.weight.grad is not None:
                    b.weight.grad = b.weight.grad * self.two_d.replicas
        self._spent(t0)

    def after_optimizer(self) -> None:
        """2D, sync ``weights``: every ``interval`` steps, average the pieces' weights and row-wise
        optimizer state over the replicas (TorchRec ``DMPCollection.sync()``'s rule)."""
        self.steps_taken += 1
        two_d = self.two_d
        if two_d is None or two_d.sync != "weights" or self.steps_taken % two_d.interval or not len(self.bags):
            return
        import torch.distributed as dist

        t0 = time.perf_counter()
        with torch.no_grad():
            tensors = [b.weight for b in self.bags]
            if self.optimizer_name != "sgd" and self._optimizer is not None:
                for w in [b.weight for b in self.bags]:
                    st = self._optimizer.state[w]
                    if "momentum" not in st:
                        st["momentum"] = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device)
                    tensors.append(st["momentum"])
            flat = torch.cat([t.reshape(-1).float() for t in tensors])
            dist.all_reduce(flat, group=two_d.replica_group)
            flat /= two_d.replicas
            i = 0
            for t in tensors:
                t.copy_(flat[i:i + t.numel()].view_as(t))
                i += t.numel()
        self._spent(t0)

    def _spent(self, t0: float) -> None:
        dt = time.perf_counter() - t0
        self.sync_s += dt
        self.comm_s += dt

    def _collective(self, op, *args, **kwargs) -> None:
        """One collective of the gradient sync, its seconds added to ``sync_volume``, its start and
        seconds kept in ``sync_calls``."""
        t0 = time.perf_counter()  # CLOCK_MONOTONIC on Linux: one clock for every process of a host
        op(*args, **kwargs)
        dt = time.perf_counter() - t0
        self.sync_volume["collective_s"] += dt
        self.sync_calls.append((t0, dt))

    def _sum_touched_rows(self) -> None:
        """All-reduce over the replica group of the gradient rows any replica touched: the union of
        touched row ids (two all-gathers), then one all-reduce of every piece's rows."""
        import torch.distributed as dist

        two_d, dev = self.two_d, self.device
        rows, vals = [], []
        for b in self.bags:
            g = b.weight.grad
            if g is None:
                rows.append(torch.zeros(0, dtype=torch.int64, device=dev))
                vals.append(torch.zeros(0, b.weight.shape[1], device=dev))
                continue
            g = g.coalesce() if g.is_sparse else g.to_sparse().coalesce()
            rows.append(g.indices()[0])
            vals.append(g.values())
        counts = torch.tensor([r.numel() for r in rows], dtype=torch.int64, device=dev)
        all_counts = [torch.empty_like(counts) for _ in range(two_d.replicas)]
        self._collective(dist.all_gather, all_counts, counts, group=two_d.replica_group)
        longest = int(max(int(c.sum()) for c in all_counts))
        pad = torch.full((longest,), -1, dtype=torch.int64, device=dev)
        mine = torch.cat(rows)
        pad[:mine.numel()] = mine
        all_rows = [torch.empty_like(pad) for _ in range(two_d.replicas)]
        self._collective(dist.all_gather, all_rows, pad, group=two_d.replica_group)
        per_rep = [torch.split(r[:int(c.sum())], c.tolist()) for r, c in zip(all_rows, all_counts)]
        unions, bufs = [], []
        for j, b in enumerate(self.bags):
            union = torch.unique(torch.cat([pr[j] for pr in per_rep]))  # sorted: the same order everywhere
            buf = torch.zeros(union.numel(), b.weight.shape[1], dtype=vals[j].dtype, device=dev)
            buf[torch.searchsorted(union, rows[j])] = vals[j]
            unions.append(union)
            bufs.append(buf)
        flat = torch.cat([x.reshape(-1) for x in bufs])
        self._collective(dist.all_reduce, flat, group=two_d.replica_group)
        vol = self.sync_volume
        vol["syncs"] += 1
        vol["ids_bytes"] += mine.numel() * mine.element_size()
        vol["grad_bytes"] += flat.numel() * flat.element_size()
        i = 0
        for b, union, buf in zip(self.bags, unions, bufs):
            n = buf.numel()
            b.weight.grad = torch.sparse_coo_tensor(union.unsqueeze(0), flat[i:i + n].view_as(buf), b.weight.shape)
            i += n

    def _reducer(self, group):
        if group is None:
            return None

        def reduce(sq: torch.Tensor) -> torch.Tensor:
            import torch.distributed as dist

            t0 = time.perf_counter()
            dist.all_reduce(sq, group=group)
            self.comm_s += time.perf_counter() - t0
            return sq

        return reduce

    def split(self, pooled: torch.Tensor) -> dict[str, torch.Tensor]:
        return dict(zip(self.table_names, torch.split(pooled, self.dims, dim=1)))

    def forward(self, sparse) -> dict[str, torch.Tensor]:
        return self.split(self.pooled(sparse))

    def pooled(self, sparse) -> torch.Tensor:
        """[B, sum of dims] for this rank's B examples; every rank must call it with the same B."""
        emb: list[torch.Tensor | None] = [None] * len(self.table_names)
        if self.any_sharded:
            self._sharded_lookup(sparse, emb)
        for n in self.dp:
            v, off = sparse[n]
            emb[self.tindex[n]] = self.dp_bags[n](v, off[:-1])
        return torch.cat(emb, dim=1)  # type: ignore[arg-type]

    def _sharded_lookup(self, sparse, emb: list) -> None:
        import torch.distributed as dist

        W, B, dev, mine = self.world, sparse.batch_size, self.device, self.mine
        i64 = dict(dtype=torch.int64, device=dev)
        # 1. input dist: lengths, then ids, of every piece to its owner
        send_len, send_ids, ids_in_split = [], [], []
        for p in range(W):
            n = 0
            for s in self.owned_by[p]:
                v, off = sparse[s.table]
                lens = off[1:] - off[:-1]
                if s.rows < self.rows[s.table]:  # a row range: only its ids, re-based
                    ex = torch.repeat_interleave(torch.arange(B, device=dev), lens)
                    keep = (v >= s.row_offset) & (v < s.row_offset + s.rows)
                    v = v[keep] - s.row_offset
                    lens = torch.bincount(ex[keep], minlength=B)
                send_len.append(lens)
                send_ids.append(v)
                n += int(v.numel())
            ids_in_split.append(n)
        t0 = time.perf_counter()
        len_out = torch.empty(W * B * len(mine), **i64)
        dist.all_to_all_single(len_out, torch.cat(send_len) if send_len else torch.zeros(0, **i64),
                               [B * len(mine)] * W, [B * len(self.owned_by[p]) for p in range(W)], group=self.group)
        recv_lens = len_out.view(W, len(mine), B)
        per_piece = recv_lens.sum(dim=2)  # [W, pieces]: ids each source sends each of my pieces
        ids_out_split = [int(x) for x in per_piece.sum(dim=1)] if mine else [0] * W
        ids_out = torch.empty(sum(ids_out_split), **i64)
        dist.all_to_all_single(ids_out, torch.cat(send_ids) if send_ids else torch.zeros(0, **i64),
                               ids_out_split, ids_in_split, group=self.group)
        self.comm_s += time.perf_counter() - t0
        # 2. pool each of my pieces over the global batch (examples of source ranks in rank order)
        pooled = []
        if mine:
            per_src = torch.split(ids_out, ids_out_split)
            chunks = [torch.split(per_src[p], [int(x) for x in per_piece[p]]) for p in range(W)]
            for j in range(len(mine)):
                ids = torch.cat([chunks[p][j] for p in range(W)])
                lens = recv_lens[:, j, :].reshape(-1)
                offs = torch.cat([torch.zeros(1, **i64), torch.cumsum(lens, 0)[:-1]])
                pooled.append(self.bags[j](ids, offs))  # [W*B, cols]
        # 3. output dist: rows of source q's examples back to q (the backward returns their gradients)
        if pooled:
            send = torch.cat([torch.cat([pc[q * B:(q + 1) * B] for pc in pooled], dim=1).reshape(-1)
                              for q in range(W)])
        else:  # still part of the graph, so that this rank joins the backward all-to-all
            send = torch.zeros(0, device=dev, requires_grad=torch.is_grad_enabled())
        my_cols = sum(s.cols for s in mine)
        out_split = [B * sum(s.cols for s in self.owned_by[p]) for p in range(W)]
        recv = _AllToAll.apply(send, out_split, [B * my_cols] * W, self)
        # 4. reassemble per table
        for p, block in enumerate(torch.split(recv, out_split)):
            if not self.owned_by[p]:
                continue
            block = block.view(B, -1)
            c = 0
            for s in self.owned_by[p]:
                i = self.tindex[s.table]
                piece = F.pad(block[:, c:c + s.cols], (s.col_offset, self.dims[i] - s.col_offset - s.cols))
                c += s.cols
                emb[i] = piece if emb[i] is None else emb[i] + piece
