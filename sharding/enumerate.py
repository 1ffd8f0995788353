"""Enumerate stage: how a table may be cut under the rank memory limit (column pieces with widths
multiples of 4, row blocks, the fewest row blocks that fit), and the input checks that turn
impossible requests into one-line SpecErrors naming the table and the shortfall.
"""

from __future__ import annotations

import math

from cubic.core.spec import SpecError, Table
from cubic.core.units import fmt_gib
from sharding.types import COLUMN_MULTIPLE, PlanDoesNotFit, Storage



def column_pieces(dim: int, k: int) -> list[tuple[int, int]] | None:
    """(offset, cols) of k column blocks, each a multiple of 4 (the last may take the remainder)."""
    if k == 1:
        return [(0, dim)]
    if dim % COLUMN_MULTIPLE or dim // COLUMN_MULTIPLE < k:
        return None
    quads = dim // COLUMN_MULTIPLE
    sizes = [quads // k + (1 if i < quads % k else 0) for i in range(k)]
    out, off = [], 0
    for s in sizes:
        out.append((off, s * COLUMN_MULTIPLE))
        off += s * COLUMN_MULTIPLE
    return out


def row_pieces(rows: int, k: int) -> list[tuple[int, int]] | None:
    """(offset, rows) of k contiguous row blocks (TorchRec's even row-wise split)."""
    if k > rows:
        return None
    block = -(-rows // k)
    out = []
    for i in range(k):
        off = i * block
        n = min(block, rows - off)
        if n <= 0:
            return None
        out.append((off, n))
    return out


def torchrec_row_blocks(rows: int, n: int) -> list[tuple[int, int]]:
    """(offset, rows) of TorchRec's even row-wise split over n ranks, empty trailing blocks included.

    TorchRec's row-wise input distribution sends id i to rank i // ceil(rows / n), so a row-wise
    (or table-row-wise, with n = ranks per node) table can only be cut this way: rows
    ceil(rows/n) per rank, the remainder on the next rank, 0 after (torchrec.distributed.
    sharding_plan._calculate_rw_shard_sizes_and_offsets; tests check the two agree).
    """
    block = -(-rows // n)
    out, off = [], 0
    for _ in range(n):
        k = min(block, rows - off)
        out.append((off, k))
        off += k
    return out


def min_row_pieces(table: Table, memory_bytes: float) -> int:
    """Fewest row blocks such that each fits in one rank's memory."""
    per_row = Storage.of(1, table.dim).total
    return max(1, math.ceil(table.rows * per_row / memory_bytes))


def check_inputs(tables: list[Table], group: int, memory_bytes: float, allow_split: bool = True) -> None:
    """Raise SpecError for duplicated names, a table no split can fit, or too little total memory."""
    seen: set[str] = set()
    for t in tables:
        if t.name in seen:
            raise SpecError(f"duplicated table name {t.name!r}", field=f"tables.{t.name}")
        seen.add(t.name)
    total = 0
    for t in tables:
        need = Storage.of(t.rows, t.dim).total
        total += need
        if need <= memory_bytes:
            continue
        if not allow_split:
            raise PlanDoesNotFit(f"needs {fmt_gib(need)} but a rank has {fmt_gib(memory_bytes)} "
                            f"(short by {fmt_gib((need - memory_bytes))}) and splitting is not allowed",
                            field=f"tables.{t.name}")
        k = min_row_pieces(t, memory_bytes)
        if k > group:
            raise PlanDoesNotFit(f"needs {fmt_gib(need)}; even split row-wise over all {group} ranks a piece needs "
                            f"{fmt_gib(need / group)} > {fmt_gib(memory_bytes)} per rank "
                            f"(short by {fmt_gib((need / group - memory_bytes))})", field=f"tables.{t.name}")
    if total > group * memory_bytes:
        raise PlanDoesNotFit(f"tables need {fmt_gib(total)} in all but {group} ranks hold "
                        f"{fmt_gib(group * memory_bytes)} (short by {fmt_gib((total - group * memory_bytes))})",
                        field="tables")
