"""Compute kernels and memory tiers per table, as TorchRec's ``EmbeddingComputeKernel``.

- ``fused``: FBGEMM's table-batched embedding, weights and optimizer state in HBM (DRAM on cpu);
- ``fused_uvm_caching``: weights in host memory (UVM), the hottest ``cache_load_factor`` share of
  the rows cached in HBM; a lookup hits the cache with the mass of those rows under the table's
  access distribution (Zipf, ``cost_models.access``), misses cross PCIe;
- ``fused_uvm``: weights in host memory, every lookup over PCIe (the host tier; MTrainS's SSD tier
  has no TorchRec kernel here);
- ``dense``: a data-parallel table's plain torch embedding (TorchRec requires it for DP).

:func:`assign_kernels` keeps a plan's tables in HBM where they fit and moves the coldest (fewest
lookup bytes per stored byte) of an over-full rank to UVM caching with the smallest load factor
that fits, then to UVM. Costs here are MODELLED (datasheet PCIe and HBM bandwidths).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from cubic.core.spec import Frozen, Table

KERNELS = ("fused", "fused_uvm_caching", "fused_uvm", "dense")
TIER = {"fused": "HBM", "fused_uvm_caching": "UVM + HBM cache", "fused_uvm": "host (UVM)", "dense": "HBM (dense)"}
LOAD_FACTORS = (0.05, 0.1, 0.2, 0.3, 0.5)  # TorchRec's default cache load factor is 0.2
PCIE_BPS = 25e9  # host <-> GPU per direction, PCIe Gen4 x16 effective (modelled)


class KernelChoice(Frozen):
    """One table's compute kernel and, for UVM caching, its cache load factor (share of rows in HBM)."""

    compute_kernel: Literal["fused", "fused_uvm_caching", "fused_uvm", "dense"] = "fused"
    cache_load_factor: float | None = Field(default=None, gt=0.0, lt=1.0)
    hit_rate: float | None = Field(default=None, ge=0.0, le=1.0, description="modelled cache hit rate")

    @model_validator(mode="after")
    def _clf_iff_caching(self) -> "KernelChoice":
        if (self.compute_kernel == "fused_uvm_caching") != (self.cache_load_factor is not None):
            raise ValueError("cache_load_factor is given exactly when compute_kernel is fused_uvm_caching")
        return self


def zipf_hit_rate(table: Table, load_factor: float) -> float:
    """Share of lookups that hit a cache of the hottest ``load_factor`` x rows under the table's Zipf
    access law (alpha 0: uniform; the continuous approximation of the generalised harmonic sums)."""
    n = table.rows
    k = max(1.0, load_factor * n)
    a = table.access.effective_alpha()
    if a < 1e-6:
        return min(1.0, k / n)
    if abs(a - 1.0) < 1e-6:
        return min(1.0, math.log(k + 1) / math.log(n + 1))
    e = 1.0 - a
    return min(1.0, ((k + 1) ** e - 1) / ((n + 1) ** e - 1))


def hbm_bytes(weights_bytes: float, optimizer_bytes: float, choice: KernelChoice) -> float:
    """HBM a shard takes under its kernel (the rest lives in host memory)."""
    if choice.compute_kernel == "fused_uvm":
        return 0.0
    if choice.compute_kernel == "fused_uvm_caching":
        return choice.cache_load_factor * (weights_bytes + optimizer_bytes)
    return weights_bytes + optimizer_bytes


def lookup_ms(lookup_bytes: float, choice: KernelChoice, hbm_bps: float, pcie_bps: float = PCIE_BPS) -> float:
    """MODELLED time of moving a shard's looked-up rows: hits from HBM, misses over PCIe."""
    if choice.compute_kernel == "fused_uvm":
        hit = 0.0
    elif choice.compute_kernel == "fused_uvm_caching":
        hit = choice.hit_rate if choice.hit_rate is not None else 0.0
    else:
        hit = 1.0
    return 1e3 * (hit * lookup_bytes / hbm_bps + (1 - hit) * lookup_bytes / pcie_bps)


def assign_kernels(plan, hbm_per_rank_bytes: float) -> dict[str, KernelChoice]:
    """Kernels for a plan's tables so that every rank's HBM use fits ``hbm_per_rank_bytes``: tables
    stay ``fused`` while they fit; on an over-full rank the coldest tables (fewest lookup bytes per
    stored byte) move to UVM caching with the smallest load factor that fits, else to UVM. Only
    table-wise and column-wise tables move (a row-wise table's blocks would need one kernel on every
    rank). Raises ValueError when even host placement of every movable table cannot fit."""
    tables = {t.name: t for t in plan.tables}
    choice: dict[str, KernelChoice] = {
        n: KernelChoice(compute_kernel="dense" if all(s.sharding_type == "data_parallel" for s in plan.shards
                                                      if s.table == n) else "fused") for n in tables}
    for r, ss in enumerate(plan.rank_shards()):
        def used() -> float:
            return sum(hbm_bytes(*_storage(s), choice[s.table]) for s in ss)

        movable = sorted({s.table for s in ss if s.sharding_type in ("table_wise", "column_wise")},
                         key=lambda n: tables[n].pooling_factor / max(tables[n].rows, 1))
        for n in movable:
            if used() <= hbm_per_rank_bytes:
                break
            for lf in LOAD_FACTORS + (None,):
                c = (KernelChoice(compute_kernel="fused_uvm_caching", cache_load_factor=lf,
                                  hit_rate=zipf_hit_rate(tables[n], lf)) if lf else KernelChoice(compute_kernel="fused_uvm"))
                choice[n] = c
                if used() <= hbm_per_rank_bytes:
                    break
        if used() > hbm_per_rank_bytes:
            raise ValueError(f"rank {r} needs {used() / 1e9:.2f} GB of HBM even with its table-wise/column-wise "
                             f"tables in host memory ({hbm_per_rank_bytes / 1e9:.2f} GB available)")
    return {n: c for n, c in choice.items() if c.compute_kernel not in ("fused", "dense")}


def _storage(shard) -> tuple[float, float]:
    st = shard.storage()
    return float(st.weights_bytes), float(st.optimizer_bytes)


def tier_penalty_ms(plan, kernel_batch: int) -> list[float]:
    """MODELLED extra lookup time per rank of the plan's UVM-caching / UVM tables: the missed rows'
    bytes cross PCIe instead of being read from HBM, forward (rows read) and backward (rows updated).
    Zero on a topology whose device is not a modelled GPU (no HBM tier there)."""
    from cost_models.hardware import DEVICES

    out = [0.0] * plan.group_size
    dev = DEVICES.get(plan.topology.device)
    if not plan.kernels or dev is None:
        return out
    tables = {t.name: t for t in plan.tables}
    for s in plan.shards:
        k = plan.kernels.get(s.table)
        if k is None or s.sharding_type == "data_parallel":
            continue
        t = tables[s.table]
        share = s.rows / t.rows if s.sharding_type in ("row_wise", "table_row_wise") else 1.0
        nbytes = kernel_batch * t.pooling_factor * share * s.cols * 4.0
        out[s.rank] += 2 * (lookup_ms(nbytes, k, dev.hbm_bw) - 1e3 * nbytes / dev.hbm_bw)
    return out
