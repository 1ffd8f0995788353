"""The trial store's schema: its tables (``cubic_*``), the schema version and migrations, how
rows are selected and decoded (JSON and timestamps as text, non-finite figures as null), and
SQLite's connection settings. Split from :mod:`cubic.core.store`, which re-exports these names."""

from __future__ import annotations

import sqlite3
import time
from datetime import datetime, timezone
from typing import Any, Literal

from sqlalchemy import (JSON, Boolean, Column, DateTime, Float, ForeignKey, Index, Integer, MetaData, String,
                        Table, Text, event, insert, inspect, select, text, type_coerce)
from sqlalchemy.engine import Engine

from cubic.core.store_db import SQLITE_BUSY_TIMEOUT_MS

SCHEMA_VERSION = 2  # 2: trials.contended
_SCHEMA_LOCK_KEY = 0x637562696300  # "cubic": serialises schema creation on PostgreSQL
Source = Literal["measured", "simulated"]

metadata = MetaData()

schema_version_table = Table(
    "cubic_schema_version",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_at", DateTime(timezone=True), nullable=False),
)

campaigns_table = Table(
    "cubic_campaigns",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("spec", JSON, nullable=False),
    Column("status", String(32), nullable=False),
    Column("workload", String(200), nullable=False),
)

trials_table = Table(
    "cubic_trials",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("campaign_id", Integer, ForeignKey("cubic_campaigns.id"), nullable=True, index=True),
    Column("workload", String(200), nullable=False),
    Column("workload_hash", String(64), nullable=False),
    Column("config_hash", String(64), nullable=False),
    Column("config", JSON, nullable=False),
    Column("fingerprint_hash", String(64), nullable=False),
    Column("fingerprint", JSON, nullable=False),
    Column("seed", Integer, nullable=False),
    Column("source", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("failure_kind", String(16), nullable=True),
    Column("reason", Text, nullable=True),
    Column("metrics", JSON, nullable=False),
    Column("result", JSON, nullable=False),
    Column("code_version", String(64), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("attempt", Integer, nullable=False),
    # how long the run was: a 10-step result must not be served for a 300-step request
    Column("steps", Integer, nullable=True),
    Column("warmup", Integer, nullable=True),
    # the run shared its cores (cubic.core.stats.contention); null: rows from before schema 2
    Column("contended", Boolean, nullable=True),
    Index("ix_trials_cache_key", "workload_hash", "config_hash", "fingerprint_hash", "source"),
)

# the sharding cost model's training samples (sharding.collect): a rank's shard set and its
# measured compute time on one machine -- not runs of a workload, so not trials
sharding_samples_table = Table(
    "cubic_sharding_samples",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("sample_hash", String(64), nullable=False),
    Column("batch_size", Integer, nullable=False),
    Column("sample", JSON, nullable=False),  # {"tables": [...], "shards": [...]}
    Column("metrics", JSON, nullable=False),  # compute_ms, fwd_ms, bwd_ms, ...
    Column("fingerprint_hash", String(64), nullable=False, index=True),
    Column("fingerprint", JSON, nullable=False),
    Column("code_version", String(64), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)
# a machine's noise floor (NOISE_FLOOR_*): the between-process spread of one config repeated in
# fresh processes, per machine fingerprint; what a one-repeat interval is widened by when no config
# measured on the machine at that run length has two repeats yet. A new table, created where missing.
noise_floors_table = Table(
    "cubic_noise_floors",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("fingerprint_hash", String(64), nullable=False, index=True),
    Column("metric", String(64), nullable=False),
    Column("sd", Float, nullable=False),  # sd of log(value) between fresh processes
    Column("df", Integer, nullable=False),
    Column("how", JSON, nullable=False),  # workload, config hash, steps, the repeats' values
    Column("cubic_version", String(32), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)
def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _as_utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; everything we write is UTC
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


# the tables of a store from before the cubic_ prefix
_OLD_NAMES = {"schema_version": "cubic_schema_version", "campaigns": "cubic_campaigns", "trials": "cubic_trials"}


def _rename_old_tables(conn) -> None:
    """A store from before the ``cubic_`` prefix: rename its tables (its own ``campaigns`` table
    tells it apart from an Optuna storage, which has ``trials`` but no ``campaigns``)."""
    from sqlalchemy import inspect

    names = set(inspect(conn).get_table_names())
    if "campaigns" in names and "cubic_campaigns" not in names:
        for old, new in _OLD_NAMES.items():
            if old in names:
                conn.exec_driver_sql(f'ALTER TABLE "{old}" RENAME TO "{new}"')


# columns an older cubic store lacks and _migrate adds (not a sign of a foreign table)
_ADDED_BY_MIGRATION = {"cubic_trials": {"contended"}}


def _migrate(conn: Any, found: int) -> None:
    """Bring a store of an older schema up to :data:`SCHEMA_VERSION` (columns added, nothing removed)."""
    cols = {c["name"] for c in inspect(conn).get_columns(trials_table.name)}
    if "contended" not in cols:
        conn.execute(text(f"ALTER TABLE {trials_table.name} ADD COLUMN contended BOOLEAN"))
    conn.execute(insert(schema_version_table).values(version=SCHEMA_VERSION, applied_at=utcnow()))


_JSON_COLUMNS = frozenset(c.name for table in (trials_table, campaigns_table) for c in table.c
                          if isinstance(c.type, JSON))

def _select_raw(table: Table):
    """SELECT of ``table`` with its JSON columns as text, so that each row is decoded by
    :meth:`TrialStore._decoded` (a driver that decodes JSON itself, psycopg2, hands back objects)."""
    # DateTime columns too: SQLite keeps whatever text was written, and SQLAlchemy's own parse of a
    # garbage timestamp would fail the whole query instead of that row
    return select(*(type_coerce(c, Text).label(c.name) if isinstance(c.type, (JSON, DateTime)) else c
                    for c in table.c))


def finite_or_null(metrics: dict[str, float]) -> dict[str, float | None]:
    # JSON has no NaN/inf; a NaN metric (e.g. loss of a diverged run) is stored as null
    import math

    return {k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()}


def restore_nonfinite(result: dict[str, Any]) -> dict[str, Any]:
    """JSON stored a NaN/inf figure as null; give it back as NaN so the Result validates."""
    nan = float("nan")
    out = dict(result)
    for key in ("metrics", "phases_ms"):
        out[key] = {k: (nan if v is None else v) for k, v in (out.get(key) or {}).items()}
    out["trajectory"] = [{k: (nan if v is None else v) for k, v in p.items()} for p in out.get("trajectory") or []]
    return out


def configure_sqlite(engine: Engine) -> None:
    """WAL + busy timeout on every connection, and BEGIN IMMEDIATE for write transactions.

    pysqlite's own transaction handling is switched off (isolation_level None) so that SQLAlchemy
    emits BEGIN itself -- the recipe in SQLAlchemy's SQLite dialect documentation.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # noqa: ANN001
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # switching a new file to WAL takes the lock without always consulting the busy handler:
        # several processes opening one new store at once see "database is locked"; wait instead
        deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                cur.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # noqa: ANN001
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("cubic_write") else "BEGIN")
