"""Recommendation models built from a workload: an embedding stage and a dense architecture.

``build_model(workload, config=None) -> RecModel``; ``RecModel(batch) -> logits[B]``.

- ``RecModel.embedding`` is an :class:`EmbeddingStage`: FBGEMM's table-batched embedding (TBE,
  ``SplitTableBatchedEmbeddingBagsCodegen``, sum pooling) with the embedding optimizer fused into
  its backward (EXACT_ROWWISE_ADAGRAD, or EXACT_SGD) when ``fbgemm_gpu`` imports and
  ``config.kernels.embedding`` is ``auto``/``fbgemm``; otherwise one ``nn.EmbeddingBag(mode="sum",
  sparse=True)`` per table, updated by :class:`RowWiseAdagrad`. Host placement on CPU, device
  (HBM) placement on CUDA; the same code either way. ``forward(sparse) -> {table: [B, dim]}``.
- ``RecModel.dense`` is :class:`DLRMDense`, :class:`WukongDense` or :class:`DMTDense`. Every GEMM
  is an ``nn.Linear`` with a stable dotted name (e.g. ``dense.bottom.fc.0``,
  ``dense.layers.1.fmb.mlp.fc.0``, ``dense.top.fc.1``); FP8 swaps them by name
  (:func:`gemm_sites` lists them). Batched interaction products (DLRM dot, Wukong FM) are bmm's.
- :func:`build_optimizer` gives Adam (or SGD) over the dense parameters plus the embedding
  optimizer when it is not fused.

Both embedding kernels are initialised identically (``U(-1/sqrt(rows), 1/sqrt(rows))`` from the
config seed), so they compute the same model. Dense weights use PyTorch's default init under the
config seed (``torch.random.fork_rng``: the caller's RNG state is untouched).
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from cubic.core.config import Config
from cubic.core.data import Batch, SparseBatch
from cubic.core.spec import DLRMArch, DMTArch, Table, Workload, WukongArch


def fbgemm_available() -> bool:
    try:
        import fbgemm_gpu  # noqa: F401
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: F401
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception:  # absent or built for another torch
        return False
    return True


# --- embedding stage -------------------------------------------------------------------------


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise AdaGrad for sparse embedding gradients (the update FBGEMM's EXACT_ROWWISE_ADAGRAD does).

    Per touched row r: ``m_r += mean(g_r^2)``; ``w_r -= lr * g_r / (sqrt(m_r / c) + eps)`` with
    ``c = replicas``. One scalar of state per row instead of one per element.

    ``replicas`` = 1 is plain row-wise AdaGrad. ``replicas`` = c > 1 is ``ms_rowwise_adagrad``, the
    momentum-scaled row-wise AdaGrad of arXiv 2508.03854 (2D sparse parallelism), RECONSTRUCTED FROM
    A THIRD-PARTY SUMMARY of the paper ("scales per-row momentum"; the paper's own text was not
    reachable): with c replica groups, a replica that averages weights with the others every N steps
    sees the gradient of 1/c of the global batch, whose squares are larger (noisier) than those of
    the global mean the 1D accumulator sums, so the accumulator is scaled down by c. In a 1D run
    (c = 1) it is exactly row-wise AdaGrad.
    """

    def __init__(self, params, lr: float = 0.05, eps: float = 1e-8, replicas: int = 1):
        super().__init__(params, dict(lr=lr, eps=eps, row_dim=None, reduce=None))
        self.replicas = max(1, int(replicas))

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            if group["row_dim"] is not None:
                self._step_split_rows(group, lr, eps)
                continue
            for p in group["params"]:
                if p.grad is None:
                    continue
                rows, vals = self._rows(p)
                self._update(p, rows, vals, vals.float().pow(2).mean(dim=1), lr, eps)
        return None

    @staticmethod
    def _rows(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = p.grad
        if g.is_sparse:
            g = g.coalesce()
            return g.indices()[0], g.values()
        rows = torch.nonzero(g.abs().sum(dim=1)).flatten()
        return rows, g[rows]

    def _update(self, p, rows, vals, mean_sq, lr: float, eps: float) -> None:
        state = self.state[p]
        if "momentum" not in state:
            state["momentum"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)
        m = state["momentum"]
        m.index_add_(0, rows, mean_sq)
        acc = m[rows] if self.replicas == 1 else m[rows] / self.replicas
        scale = lr / (acc.sqrt() + eps)
        p.index_add_(0, rows, (-scale[:, None] * vals).to(p.dtype))

    def _step_split_rows(self, group, lr: float, eps: float) -> None:
        """A group whose params are column pieces of the same rows (a column-wise sharded table): the
        row's mean square is over its full width ``row_dim``, and ``reduce(sq_sum)`` adds the pieces
        other processes hold (an all-reduce), so the update is the unsharded table's. Every piece
        has a gradient on the same rows in the same order (each receives all of the table's ids)."""
        pieces = [(p, *self._rows(p)) for p in group["params"]]
        sq = sum(vals.float().pow(2).sum(dim=1) for _, _, vals in pieces)
        if group["reduce"] is not None:
            sq = group["reduce"](sq)
        for p, rows, vals in pieces:
            self._update(p, rows, vals, sq / group["row_dim"], lr, eps)


def table_inits(tables: list[Table], seed: int):
    """Each table's initial weights, ``U(-1/sqrt(rows), 1/sqrt(rows))``, in table order from one
    generator seeded by ``seed``: a sharded run slices the same values (one table in memory at a time)."""
    gen = torch.Generator().manual_seed(seed)
    for t in tables:
        yield (torch.rand(t.rows, t.dim, generator=gen) * 2 - 1) / math.sqrt(t.rows)


class EmbeddingStage(nn.Module):
    """All of a workload's tables, pooled by sum. ``kernel`` is ``fbgemm`` or ``torch``."""

    def __init__(self, tables: list[Table], *, kernel: str, optimizer: str, lr: float,
                 device: torch.device, seed: int = 0):
        super().__init__()
        self.table_names = [t.name for t in tables]
        self.dims = [t.dim for t in tables]
        self.kernel = kernel
        self.optimizer_name = optimizer
        self.lr = lr
        inits = table_inits(tables, seed)
        if kernel == "fbgemm":
            from fbgemm_gpu.split_embedding_configs import EmbOptimType
            from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
            from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
                ComputeDevice,
                SplitTableBatchedEmbeddingBagsCodegen,
            )

            on_cuda = device.type == "cuda"
            loc = EmbeddingLocation.DEVICE if on_cuda else EmbeddingLocation.HOST
            comp = ComputeDevice.CUDA if on_cuda else ComputeDevice.CPU
            # ms_rowwise_adagrad in one process (no replicas) is exactly row-wise AdaGrad
            opt = EmbOptimType.EXACT_SGD if optimizer == "sgd" else EmbOptimType.EXACT_ROWWISE_ADAGRAD
            self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
                [(t.rows, t.dim, loc, comp) for t in tables],
                optimizer=opt, learning_rate=lr, eps=1e-8, pooling_mode=PoolingMode.SUM,
                device=device, table_names=self.table_names,
            )
            with torch.no_grad():
                for w, init in zip(self.tbe.split_embedding_weights(), inits):
                    w.copy_(init.to(w.device, w.dtype))
        elif kernel == "torch":
            self.bags = nn.ModuleDict()
            for t, init in zip(tables, inits):
                bag = nn.EmbeddingBag(t.rows, t.dim, mode="sum", sparse=True, device=device)
                with torch.no_grad():
                    bag.weight.copy_(init)
                self.bags[t.name] = bag
        else:
            raise ValueError(f"unknown embedding kernel {kernel!r} (fbgemm or torch)")

    @property
    def fused_optimizer(self) -> bool:
        """True when the embedding update happens inside backward (FBGEMM TBE)."""
        return self.kernel == "fbgemm"

    def make_optimizer(self) -> torch.optim.Optimizer | None:
        """The embedding optimizer, or None when it is fused into the TBE backward."""
        if self.fused_optimizer:
            return None
        params = list(self.bags.parameters())
        if self.optimizer_name in ("rowwise_adagrad", "ms_rowwise_adagrad"):  # one replica: the same rule
            return RowWiseAdagrad(params, lr=self.lr)
        return torch.optim.SGD(params, lr=self.lr)

    def pooled(self, sparse: SparseBatch) -> torch.Tensor:
        """[B, sum of dims]: every table's pooled embedding, concatenated in table order."""
        if self.kernel == "fbgemm":
            indices, offsets = sparse.to_tbe()
            return self.tbe(indices, offsets)
        return torch.cat([self.bags[n](v, o[:-1]) for n, v, o in zip(self.table_names, sparse.values, sparse.offsets)], dim=1)

    def split(self, pooled: torch.Tensor) -> dict[str, torch.Tensor]:
        return dict(zip(self.table_names, torch.split(pooled, self.dims, dim=1)))

    def forward(self, sparse: SparseBatch) -> dict[str, torch.Tensor]:
        return self.split(self.pooled(sparse))


# --- dense architectures ---------------------------------------------------------------------


class MLP(nn.Module):
    """Linear layers ``fc.0 .. fc.{n-1}`` with ReLU between (and after the last unless ``last_act=False``)."""

    def __init__(self, in_dim: int, widths: list[int], last_act: bool = True):
        super().__init__()
        dims = [in_dim, *widths]
        self.fc = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.last_act = last_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.fc):
            x = layer(x)
            if self.last_act or i < len(self.fc) - 1:
                x = F.relu(x)
        return x


def _projections(tables: list[Table], width: int) -> nn.ModuleDict:
    # a table whose dim differs from the common width gets a bias-free projection
    return nn.ModuleDict({t.name: nn.Linear(t.dim, width, bias=False) for t in tables if t.dim != width})


class DLRMDense(nn.Module):
    """DLRM: bottom MLP over dense features -> d; pairwise dot interaction (upper triangle) of the
    bottom output and every table's embedding (projected to d where needed); top MLP."""

    def __init__(self, arch: DLRMArch, tables: list[Table], num_dense: int):
        super().__init__()
        self.names = [t.name for t in tables]
        d = arch.bottom_mlp[-1]
        self.bottom = MLP(num_dense, arch.bottom_mlp) if num_dense else None
        self.proj = _projections(tables, d)
        n = len(tables) + (1 if num_dense else 0)
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.register_buffer("tri_rows", rows, persistent=False)
        self.register_buffer("tri_cols", cols, persistent=False)
        self.top = MLP(n * (n - 1) // 2 + (d if num_dense else 0), arch.top_mlp, last_act=False)

    def forward(self, dense: torch.Tensor, embs: dict[str, torch.Tensor]) -> torch.Tensor:
        feats = [self.proj[n](embs[n]) if n in self.proj else embs[n] for n in self.names]
        head = []
        if self.bottom is not None:
            x = self.bottom(dense)
            feats.insert(0, x)
            head = [x]
        t = torch.stack(feats, dim=1)  # [B, n, d]
        z = torch.bmm(t, t.transpose(1, 2))[:, self.tri_rows, self.tri_cols]
        return self.top(torch.cat([*head, z], dim=1)).squeeze(-1)


class FactorizationMachineBlock(nn.Module):
    """Wukong FMB: optimized FM ``X (X^T Y)`` with a learned ``Y`` (n x rank), then LayerNorm and an
    MLP producing ``num_out`` embeddings of width d."""

    def __init__(self, n_in: int, d: int, rank: int, mlp_width: int, mlp_layers: int, num_out: int):
        super().__init__()
        self.d, self.num_out = d, num_out
        self.proj = nn.Linear(n_in, rank, bias=False)  # Y, applied along the embedding axis
        self.norm = nn.LayerNorm(n_in * rank)
        self.mlp = MLP(n_in * rank, [mlp_width] * mlp_layers + [num_out * d], last_act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, n, d]
        xy = self.proj(x.transpose(1, 2))  # [B, d, rank]
        fm = torch.bmm(x, xy).flatten(1)  # [B, n * rank]
        return self.mlp(self.norm(fm)).view(-1, self.num_out, self.d)


class LinearCompressionBlock(nn.Module):
    """Wukong LCB: a linear map over the embedding axis, n_in -> num_out embeddings."""

    def __init__(self, n_in: int, num_out: int):
        super().__init__()
        self.proj = nn.Linear(n_in, num_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.transpose(1, 2)).transpose(1, 2)


class WukongLayer(nn.Module):
    def __init__(self, n_in: int, arch: WukongArch):
        super().__init__()
        d = arch.emb_dim
        self.fmb = FactorizationMachineBlock(n_in, d, arch.rank_fmb, arch.mlp_width, arch.fmb_mlp_layers, arch.num_emb_fmb)
        self.lcb = LinearCompressionBlock(n_in, arch.num_emb_lcb)
        n_out = arch.num_emb_fmb + arch.num_emb_lcb
        self.residual = None if n_out == n_in else nn.Linear(n_in, n_out, bias=False)
        self.norm = nn.LayerNorm(d) if arch.layer_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([self.fmb(x), self.lcb(x)], dim=1)
        res = x if self.residual is None else self.residual(x.transpose(1, 2)).transpose(1, 2)
        return self.norm(y + res)


class WukongDense(nn.Module):
    """Wukong (arXiv 2403.02545): tables projected to ``emb_dim``; dense features projected to
    ``max(1, round(F / 8))`` embeddings; ``num_layers`` interaction layers (FMB + LCB, residual,
    LayerNorm); top MLP over the flattened last layer."""

    def __init__(self, arch: WukongArch, tables: list[Table], num_dense: int):
        super().__init__()
        self.names = [t.name for t in tables]
        d = arch.emb_dim
        self.d = d
        self.num_dense_emb = max(1, round(num_dense / 8)) if num_dense else 0
        self.dense_proj = nn.Linear(num_dense, self.num_dense_emb * d) if num_dense else None
        self.proj = _projections(tables, d)
        n = len(tables) + self.num_dense_emb
        layers = []
        for _ in range(arch.num_layers):
            layers.append(WukongLayer(n, arch))
            n = arch.num_emb_fmb + arch.num_emb_lcb
        self.layers = nn.ModuleList(layers)
        self.top = MLP(n * d, arch.top_mlp, last_act=False)

    def forward(self, dense: torch.Tensor, embs: dict[str, torch.Tensor]) -> torch.Tensor:
        feats = [self.proj[n](embs[n]) if n in self.proj else embs[n] for n in self.names]
        x = torch.stack(feats, dim=1)
        if self.dense_proj is not None:
            x = torch.cat([self.dense_proj(dense).view(-1, self.num_dense_emb, self.d), x], dim=1)
        for layer in self.layers:
            x = layer(x)
        return self.top(x.flatten(1)).squeeze(-1)


class DMTDense(nn.Module):
    """DMT-style towers: feature groups (in order of first appearance) go round-robin to
    ``num_towers`` towers; each tower is an MLP over its tables' concatenated embeddings ->
    ``tower_dim``; tower outputs and a dense bottom projection (-> tower_dim) feed the top MLP."""

    def __init__(self, arch: DMTArch, tables: list[Table], num_dense: int):
        super().__init__()
        groups = list(dict.fromkeys(t.feature_group for t in tables))
        tower_of_group = {g: i % arch.num_towers for i, g in enumerate(groups)}
        members: dict[int, list[Table]] = {}
        for t in tables:
            members.setdefault(tower_of_group[t.feature_group], []).append(t)
        # towers without a group are not built (num_towers > number of groups)
        self.tower_tables = {str(i): [t.name for t in ts] for i, ts in sorted(members.items())}
        self.towers = nn.ModuleDict({
            i: MLP(sum(t.dim for t in members[int(i)]), [*arch.tower_mlp, arch.tower_dim]) for i in self.tower_tables
        })
        self.bottom = MLP(num_dense, [arch.tower_dim]) if num_dense else None
        n = len(self.towers) + (1 if num_dense else 0)
        self.top = MLP(n * arch.tower_dim, arch.top_mlp, last_act=False)

    def forward(self, dense: torch.Tensor, embs: dict[str, torch.Tensor]) -> torch.Tensor:
        outs = [self.towers[i](torch.cat([embs[n] for n in names], dim=1)) for i, names in self.tower_tables.items()]
        if self.bottom is not None:
            outs.insert(0, self.bottom(dense))
        return self.top(torch.cat(outs, dim=1)).squeeze(-1)


# --- the model -------------------------------------------------------------------------------


class RecModel(nn.Module):
    def __init__(self, workload: Workload, embedding: EmbeddingStage, dense: nn.Module, dense_dtype: str = "fp32"):
        super().__init__()
        self.workload = workload
        self.embedding = embedding
        self.dense = dense
        self.dense_dtype = dense_dtype

    def autocast(self, device_type: str):
        """bf16 autocast around the dense part when the config asks for it."""
        if self.dense_dtype == "bf16":
            return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
        return nullcontext()

    def dense_forward(self, dense: torch.Tensor, embs: dict[str, torch.Tensor]) -> torch.Tensor:
        with self.autocast(dense.device.type):
            return self.dense(dense, embs).float()

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.dense_forward(batch.dense, self.embedding(batch.sparse))


def resolve_embedding_kernel(choice: str) -> str:
    """'auto' -> fbgemm where it imports, else torch; 'fbgemm' without fbgemm_gpu falls back to torch."""
    if choice == "torch":
        return "torch"
    return "fbgemm" if fbgemm_available() else "torch"


def build_dense(workload: Workload) -> nn.Module:
    arch, tables, nd = workload.dense_arch, list(workload.tables), workload.data.num_dense_features
    if isinstance(arch, DLRMArch):
        return DLRMDense(arch, tables, nd)
    if isinstance(arch, WukongArch):
        return WukongDense(arch, tables, nd)
    if isinstance(arch, DMTArch):
        return DMTDense(arch, tables, nd)
    raise TypeError(f"unknown dense architecture {type(arch).__name__}")


def build_model(workload: Workload, config: Config | None = None, device: str | torch.device = "cpu",
                embedding: nn.Module | None = None) -> RecModel:
    """The model ``config`` trains: knobs applied (``config.apply``), weights seeded by ``config.seed``.

    ``embedding`` replaces the local :class:`EmbeddingStage` (a sharded stage with the same
    ``pooled``/``split``/``forward``/``make_optimizer`` interface); the dense part is the same.
    """
    config = config or Config()
    w = config.apply(workload)
    device = torch.device(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        dense = build_dense(w).to(device)
    if embedding is None:
        embedding = EmbeddingStage(list(w.tables), kernel=resolve_embedding_kernel(config.kernels.embedding),
                                   optimizer=w.optimizers.embedding, lr=w.optimizers.embedding_lr, device=device,
                                   seed=config.seed)
    return RecModel(w, embedding, dense, config.kernels.dense_dtype)


class RecOptimizer:
    """Dense Adam/SGD plus the (unfused) embedding optimizer, stepped together."""

    def __init__(self, model: RecModel):
        opts = model.workload.optimizers
        params = list(model.dense.parameters())
        self.dense = (torch.optim.Adam(params, lr=opts.dense_lr) if opts.dense == "adam"
                      else torch.optim.SGD(params, lr=opts.dense_lr))
        self.embedding = model.embedding.make_optimizer()

    def zero_grad(self) -> None:
        self.dense.zero_grad(set_to_none=True)
        if self.embedding is not None:
            self.embedding.zero_grad(set_to_none=True)

    def step(self) -> None:
        self.dense.step()
        if self.embedding is not None:
            self.embedding.step()


def build_optimizer(model: RecModel) -> RecOptimizer:
    return RecOptimizer(model)


def gemm_sites(model: nn.Module) -> dict[str, nn.Linear]:
    """Every nn.Linear by dotted module name (the sites FP8 placement works over)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
