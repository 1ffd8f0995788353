"""Planner inputs: tables from a workload (embedded name or YAML/JSON file) or a CSV.

CSV columns (header row required): ``name, rows, dim, pooling_factor, zipf_alpha`` and optionally
``feature_group``. Every error is a one-line SpecError naming the file, the table and the field.
"""

from __future__ import annotations

import csv
from pathlib import Path

from pydantic import ValidationError

from cost_models.hardware import load_device
from cubic.core.spec import (AccessStats, SpecError, Table, Topology, Workload, check_input_file,
                              spec_error_from_validation)
from cubic.core.units import GB, GIB
from cubic.core.workloads import load_workload

CSV_REQUIRED = ("name", "rows", "dim", "pooling_factor")
CSV_OPTIONAL = ("zipf_alpha", "feature_group")


def read_tables_csv(path: str | Path) -> list[Table]:
    p = Path(path)
    check_input_file(p)
    try:
        return _read_tables_csv(p)
    except (csv.Error, UnicodeDecodeError) as e:  # NUL bytes, oversized fields, not UTF-8
        raise SpecError(f"not a readable CSV: {' '.join(str(e).split())}", source=str(p)) from None


def _read_tables_csv(p: Path) -> list[Table]:
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        cols = [c.strip() for c in (reader.fieldnames or [])]
        missing = [c for c in CSV_REQUIRED if c not in cols]
        if missing:
            raise SpecError(f"missing column(s) {', '.join(missing)} (need {', '.join(CSV_REQUIRED)}; "
                            f"optional {', '.join(CSV_OPTIONAL)})", source=str(p))
        tables, seen = [], set()
        for i, raw in enumerate(reader, start=2):
            row = {k.strip(): (v or "").strip() for k, v in raw.items() if k}
            name = row.get("name") or f"line {i}"
            where = f"line {i} (table {name!r})"
            try:
                rows, dim = int(row["rows"]), int(row["dim"])
                pf = float(row["pooling_factor"])
                alpha = float(row["zipf_alpha"]) if row.get("zipf_alpha") else 1.05
            except ValueError as e:
                raise SpecError(f"not a number: {e}", source=str(p), field=where) from None
            if rows <= 0:
                raise SpecError(f"rows must be positive, got {rows}", source=str(p), field=f"{where}.rows")
            if name in seen:
                raise SpecError(f"duplicated table name {name!r}", source=str(p), field=where)
            seen.add(name)
            try:
                tables.append(Table(name=name, rows=rows, dim=dim, pooling_factor=pf,
                                    access=AccessStats(zipf_alpha=alpha),
                                    feature_group=row.get("feature_group") or "default"))
            except ValidationError as e:
                raise spec_error_from_validation(e, f"{p}: {where}") from None
    if not tables:
        raise SpecError("no tables (only a header?)", source=str(p))
    return tables


def load_tables(spec: str) -> tuple[list[Table], Workload | None]:
    """Tables (and the workload, when the input is one) from a CSV, a workload file or an embedded name."""
    if spec.lower().endswith(".csv"):
        return read_tables_csv(spec), None
    wl = load_workload(spec)
    return list(wl.tables), wl


def topology_for(args_world: int | None, memory_gb: float | None, workload: Workload | None,
                 ranks_per_node: int | None = None, device: str | None = None, comm: dict | None = None) -> Topology:
    """The workload's topology (or a one-node cpu one) with the user's flags over it; ``comm``: the
    interconnect fields given (Topology's *_bw_gbps, *_latency_us, comm_model, comm_calibration)."""
    base = workload.topology if workload else Topology(device="cpu")
    data = base.model_dump()
    data.update({k: v for k, v in (comm or {}).items() if v is not None})
    if args_world is not None:
        data["world_size"] = args_world
    if memory_gb is not None:
        data["memory_per_rank_gb"] = memory_gb
    if ranks_per_node is not None:
        data["ranks_per_node"] = ranks_per_node
    elif args_world is not None and workload is None:
        data["ranks_per_node"] = args_world  # a CSV says nothing about nodes: one node
    if device is not None:
        data["device"] = device
    try:
        return Topology.model_validate(data)
    except ValidationError as e:
        raise spec_error_from_validation(e, "topology") from None


def check_device_hbm(device: str, hbm_gb: float, field: str, source: str | None = None, gib_flag: bool = False) -> None:
    """Per-rank HBM (``hbm_gb``, decimal GB, as ``field`` gave it) beyond what a modelled GPU ``device`` has is
    bad input: a plan would place more in a rank's HBM than the device holds and call it fitting.
    ``gib_flag``: the flag was in GiB, so the message is too. No check on cpu (DRAM: no device figure)."""
    if device == "cpu":
        return
    dev = load_device(device)
    if hbm_gb * GB <= dev.hbm_bytes * (1 + 1e-9):  # the tolerance: a GiB flag converted to GB
        return
    given = f"{hbm_gb * GB / GIB:g} GiB" if gib_flag else f"{hbm_gb:g} GB"
    has = f"{dev.hbm_bytes / GIB:.4g} GiB = {dev.hbm_bytes / GB:g} GB" if gib_flag else f"{dev.hbm_bytes / GB:g} GB"
    tiers = ("" if field == "--hbm-gb" else "; to plan HBM plus host memory, give --hbm-gb (HBM) and --memory-gb "
             "(HBM + host)")
    raise SpecError(f"{given} of HBM per rank is more than {dev.name}'s HBM ({has}){tiers}", source=source, field=field)
