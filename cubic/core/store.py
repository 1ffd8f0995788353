"""The trial store: every run (measured or simulated, ok or failed) persisted with its config,
hashes, metrics, failure reason, fingerprint, seed, code version and time.

SQLAlchemy Core over SQLite by default (``<cwd>/.cubic/trials.db``); any SQLAlchemy URL (e.g.
``postgresql+psycopg2://user:pw@host/db``) via the ``url`` argument or the ``CUBIC_STORE``
environment variable. The store is the only writer of trials; everything else reads from it.

Several worker processes may share one SQLite store: it runs in WAL mode (readers never block the
writer), with a busy timeout, and every write transaction starts with ``BEGIN IMMEDIATE`` so that
two writers queue on the lock instead of failing with "database is locked". Open one
``TrialStore`` per process (an engine must not cross a fork).

A URL's password is never printed: every message and repr goes through :func:`redact_url`.

cubic's tables are named ``cubic_*`` so that the trial store and Optuna's campaign storage (whose
tables are ``studies``, ``trials``...) can share one database URL. A store made before that (tables
``trials``, ``campaigns``, ``schema_version``) is renamed in place when first opened.

Repeats. Every run is one row, also a repeat of a config already stored (same workload, config and
fingerprint hashes); each row says whether its run was ``contended`` (cubic.core.stats). What the
store serves for a config is :meth:`TrialStore.serve`: the pooled estimate of its repeats
(cubic.core.stats.pool), or the newest deterministic failure (oom, nan, error, invalid: a property
of the config on this machine, so it is served like a success and not run again).

No result is lost to the store. A write that fails (disk full, read-only file, the database went
away) raises :class:`StoreError` -- a store error, never a run failure -- after appending the row to
the local pending file (``$CUBIC_PENDING`` or ``<cwd>/.cubic/pending.jsonl``, one JSON object per
line, tagged with the store's redacted URL). The next command whose store works imports the lines
meant for that store (:meth:`TrialStore.import_pending`) and removes them from the file.

Rooms: this module holds the records (Campaign, Trial, Served) and :class:`TrialStore` (writes and
queries); the schema and migrations are in :mod:`cubic.core.store_schema`, the database URL
(redaction, timeouts) and :class:`StoreError` in :mod:`cubic.core.store_db`, the pending file
(validation, quarantine) in :mod:`cubic.core.store_pending`. Their public names are importable
from here, as before.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import BaseModel
from sqlalchemy import create_engine, func, insert, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import (ArgumentError, IntegrityError, NoSuchModuleError, OperationalError, ProgrammingError,
                            SQLAlchemyError)

from cubic.core.config import Config, JobConfig
from cubic.core.fingerprint import code_version as _code_version
from cubic.core.fingerprint import fingerprint_hash as _fingerprint_hash
from cubic.core.result import TRANSIENT_FAILURES, Result
from cubic.core.stats import NoiseModel, Pooled, Repeat, contention, cores_available, noise_models, pool, pooled_result
from cubic.core.spec import SpecError, Workload
# the store's rooms (schema, database URL, pending file); their public names are re-exported here
from cubic.core.store_db import (  # noqa: F401
    CONNECT_TIMEOUT_S, SQLITE_BUSY_TIMEOUT_MS, STATEMENT_TIMEOUT_S, StoreError, check_url, default_url,
    engine_options, redact_url, scrub_error, server_in_transition, storage_error_line)
from cubic.core.store_pending import (  # noqa: F401
    PENDING_ENV, PendingRow, _keep_pending, _quarantine, check_pending_line, pending_for, pending_path)
from cubic.core.store_schema import (  # noqa: F401
    SCHEMA_VERSION, Source, _ADDED_BY_MIGRATION, _JSON_COLUMNS, _SCHEMA_LOCK_KEY, _as_utc, configure_sqlite,
    finite_or_null, _migrate, _rename_old_tables, restore_nonfinite, _select_raw, utcnow, campaigns_table, metadata,
    noise_floors_table, schema_version_table, sharding_samples_table, trials_table)

STORE_ENV = "CUBIC_STORE"
# stale (re-measured by the next campaign): older than this, or measured by another cubic release
NOISE_FLOOR_MAX_AGE_DAYS = 7
# before this machine's floor is measured: the project's measurement_noise study's repeat-to-repeat
# noise (6.5%), labelled as assumed wherever it is used
ASSUMED_NOISE_FLOOR = NoiseModel(0.063, 10, "an ASSUMED noise floor (not yet measured on this machine)")


class Campaign(BaseModel):
    id: int
    name: str
    created_at: datetime
    spec: dict[str, Any]
    status: str
    workload: str


class Trial(BaseModel):
    """One stored trial: the columns, and the full :class:`Result` it recorded."""

    id: int
    campaign_id: int | None
    workload: str
    workload_hash: str
    config_hash: str
    config: dict[str, Any]
    fingerprint_hash: str
    fingerprint: dict[str, Any]
    seed: int
    source: Source  # a stored row read back is checked like input: "weird" is a corrupt row, skipped
    status: Literal["ok", "failed"]
    failure_kind: str | None
    reason: str | None
    metrics: dict[str, float]
    result: Result
    code_version: str
    created_at: datetime
    attempt: int
    steps: int | None
    warmup: int | None
    contended: bool | None = None


@dataclass
class Served:
    """What the store holds for one config (:meth:`TrialStore.serve`)."""

    result: Result | None  # the pooled estimate, the deterministic failure, or None (nothing stored)
    trials: list["Trial"]  # the rows behind it
    pooled: Pooled | None = None  # None for a failure or nothing

    @property
    def good(self) -> int:
        """Uncontended successful repeats stored."""
        return self.pooled.good if self.pooled is not None else 0

    @property
    def failure(self) -> bool:
        return self.result is not None and not self.result.ok

    def satisfies(self, repeats: int) -> bool:
        """Whether this can stand in for ``repeats`` repeats of the run: a deterministic failure, or
        ``repeats`` uncontended repeats -- or, on a machine that stays busy, 2 x ``repeats`` repeats
        of any kind (contended ones are re-taken once, not forever; the estimate says it is contended)."""
        if self.failure:
            return True
        return self.pooled is not None and (self.good >= repeats or self.pooled.n >= 2 * repeats)


class NoStore(SpecError):
    """A command that only reads trials was given a SQLite store file that does not exist."""


class TrialStore:
    """The persistent record of trials and campaigns. See the module docstring."""

    def __init__(self, url: str | None = None, *, origin: str | None = None, create: bool = True):
        if url is None:
            env = os.environ.get(STORE_ENV)
            url, origin = (env, origin or STORE_ENV) if env else (default_url(), origin or "store")
        origin = origin or "store url"
        self._origin = origin
        self.url = url
        self._safe = redact_url(url)
        self.skipped: list[tuple[str, Any]] = []  # corrupt rows passed over by reads, (kind, id)
        self.engine = self._open(url, origin, create)
        self._create_schema()

    # -- set-up ---------------------------------------------------------------------------------

    def _open(self, url: str, origin: str, create: bool = True) -> Engine:
        parsed = check_url(url, origin)
        if parsed.get_backend_name() == "sqlite":
            db = parsed.database
            if db and db != ":memory:" and not db.startswith("file:"):
                if not create and not Path(db).expanduser().is_file() and not pending_for(self._safe):
                    # a command that only reads: a mistyped path is said, not made into an empty store
                    # (unless results wait in the pending file for it: the store is made to hold them)
                    raise NoStore(f"no trial store at {db} (`cubic run` creates it)", field=origin)
                try:
                    Path(db).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise SpecError(f"cannot create the directory for {self._safe}: {e.strerror}",
                                    field=origin) from None
        try:
            engine = create_engine(url, **engine_options(url))
        except (NoSuchModuleError, ArgumentError, ImportError) as e:
            raise SpecError(f"unsupported database URL {self._safe!r}: {self._scrub(e)}", field=origin) from None
        if engine.dialect.name == "sqlite":
            configure_sqlite(engine)
        return engine

    def _create_schema(self) -> None:
        """Create missing tables and the schema_version row; safe when several processes open a
        new store at once (SQLite: BEGIN IMMEDIATE serialises them; PostgreSQL: an advisory lock,
        and a retry should a concurrent CREATE still collide)."""
        last: SQLAlchemyError | None = None
        deadline = time.monotonic() + 60
        for attempt in range(1000):
            try:
                with self._write() as conn:
                    if conn.dialect.name == "postgresql":
                        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK_KEY})
                    _rename_old_tables(conn)
                    self._check_schema(conn)
                    metadata.create_all(conn, checkfirst=True)
                    found = conn.execute(select(func.max(schema_version_table.c.version))).scalar()
                    if found is None:
                        conn.execute(insert(schema_version_table).values(version=SCHEMA_VERSION,
                                                                         applied_at=utcnow()))
                    elif found < SCHEMA_VERSION:
                        _migrate(conn, found)
                    elif found > SCHEMA_VERSION:
                        raise SpecError(
                            f"store schema version {found} is newer than this cubic understands ({SCHEMA_VERSION})",
                            field=self._origin,
                        )
                return
            except (IntegrityError, ProgrammingError) as e:  # lost a creation race: look again
                last = e
                if attempt >= 9:
                    break
                time.sleep(0.05 * (attempt + 1))
            except OperationalError as e:
                last = e
                # SQLite: a lock the busy handler was not asked to wait for (a new file's first
                # writers); wait for it up to a minute as busy_timeout would
                if "locked" not in str(e) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            except SQLAlchemyError as e:
                last = e
                break
        if last is not None and server_in_transition(last):  # an outage, not bad input: through_outages waits
            raise last
        raise SpecError(f"cannot open the trial store {self._safe}: {self._scrub(last)}", field=self._origin) from None

    def _check_schema(self, conn: Any) -> None:
        """Refuse, before creating anything, a database with tables of cubic's names and other
        columns; says what it found. (An Optuna campaign storage is welcome: cubic's tables are
        ``cubic_*``, so the two share one database.)"""
        from sqlalchemy import inspect

        insp = inspect(conn)
        names = set(insp.get_table_names())
        for table in metadata.sorted_tables:
            if table.name not in names:
                continue
            have = {c["name"] for c in insp.get_columns(table.name)}
            missing = sorted(set(table.c.keys()) - have - _ADDED_BY_MIGRATION.get(table.name, set()))
            if missing:
                raise SpecError(f"{self._safe} has a table {table.name!r} that is not cubic's (it lacks "
                                f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''})", field=self._origin)

    def _scrub(self, err: BaseException) -> str:
        return scrub_error(err, self.url)

    def _write(self):
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite: queue for the lock up front)."""
        return self.engine.execution_options(cubic_write=True).begin()

    def _read(self):
        return self.engine.connect()

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "TrialStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TrialStore({self._safe!r})"

    # -- campaigns ------------------------------------------------------------------------------

    def create_campaign(self, name: str, spec: dict[str, Any], workload: str, status: str = "running") -> int:
        """A new campaign row; a name that exists already is an error (campaign names are unique)."""
        try:
            with self._write() as conn:
                return int(conn.execute(
                    insert(campaigns_table).values(
                        name=name, created_at=utcnow(), spec=spec, status=status, workload=workload
                    )
                ).inserted_primary_key[0])
        except IntegrityError:
            raise SpecError(f"campaign {name!r} already exists in {self._safe}", field="campaign.name") from None

    def get_campaign(self, name_or_id: str | int) -> Campaign | None:
        col = campaigns_table.c.id if isinstance(name_or_id, int) else campaigns_table.c.name
        with self._read() as conn:
            row = conn.execute(_select_raw(campaigns_table).where(col == name_or_id)).mappings().first()
        if row is None:
            return None
        campaign = self._decoded(row, self._campaign, "campaign")
        if campaign is None:
            raise SpecError(f"campaign {name_or_id!r} in {self._safe} is corrupt (see the warning above)",
                            field="campaign")
        return campaign

    def campaigns(self) -> list[Campaign]:
        with self._read() as conn:
            rows = conn.execute(_select_raw(campaigns_table).order_by(campaigns_table.c.id)).mappings().all()
        return [c for c in (self._decoded(r, self._campaign, "campaign") for r in rows) if c is not None]

    def set_campaign_status(self, name_or_id: str | int, status: str) -> None:
        self.update_campaign(name_or_id, status=status)

    def update_campaign(self, name_or_id: str | int, *, status: str | None = None,
                        spec: dict[str, Any] | None = None, workload: str | None = None) -> None:
        """Change a campaign row (e.g. its settings when the campaign is replaced); its trials stay."""
        values = {k: v for k, v in (("status", status), ("spec", spec), ("workload", workload)) if v is not None}
        if not values:
            return
        col = campaigns_table.c.id if isinstance(name_or_id, int) else campaigns_table.c.name
        with self._write() as conn:
            n = conn.execute(update(campaigns_table).where(col == name_or_id).values(**values)).rowcount
        if n == 0:
            raise SpecError(f"no campaign {name_or_id!r} in {self._safe}", field="campaign")

    def _decoded(self, row: Any, build: Any, what: str) -> Any:
        """``build(row)`` with the JSON columns decoded here, per row: a corrupt stored row (bad
        JSON, a result that no longer validates) is skipped with a warning naming it, instead of
        failing every query that touches it. None when skipped."""
        d = dict(row)
        column = None
        try:
            for column, value in d.items():
                if column in _JSON_COLUMNS and isinstance(value, (str, bytes)):
                    d[column] = json.loads(value)
                elif column == "created_at" and isinstance(value, str):
                    d[column] = datetime.fromisoformat(value)
            column = None
            return build(d)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            what_col = "JSON" if column in _JSON_COLUMNS else "a timestamp"
            reason = (f"column {column!r} is not {what_col}: " if column else "") + " ".join(str(e).split())[:160]
            _log.warning("cubic: warning: skipped %s %s of %s: its stored row is corrupt (%s)",
                         what, d.get("id", "?"), self._safe, reason)
            self.skipped.append((what, d.get("id")))
            return None

    @staticmethod
    def _campaign(row: Any) -> Campaign:
        d = dict(row)
        d["created_at"] = _as_utc(d["created_at"])
        return Campaign.model_validate(d)

    def _campaign_id(self, conn: Any, campaign: str | int | None) -> int | None:
        if campaign is None:
            return None
        col = campaigns_table.c.id if isinstance(campaign, int) else campaigns_table.c.name
        found = conn.execute(select(campaigns_table.c.id).where(col == campaign)).scalar()
        if found is None:
            raise SpecError(f"no campaign {campaign!r} in {self._safe}", field="campaign")
        return int(found)

    # -- trials ---------------------------------------------------------------------------------

    def record(
        self,
        workload: Workload,
        config: Config,
        result: Result,
        campaign: str | int | None = None,
        attempt: int = 1,
        *,
        steps: int | None = None,
        warmup: int | None = None,
        fingerprint_hash: str | None = None,
    ) -> int:
        """Persist one trial (one repeat) in one transaction; returns its id. Failed results are
        recorded too.

        The cache key is computed here from the objects (``workload.content_hash()``,
        ``config.content_hash()``, and the result's fingerprint hash -- or ``fingerprint_hash``, the
        one the caller expected, for a failure that came back without one), so that :meth:`serve`
        callers can compute it the same way before running. A failed write raises
        :class:`StoreError` after keeping the row in the pending file.
        """
        row = self._row(workload.name, workload.content_hash(), config, result, campaign, attempt, steps, warmup,
                        fingerprint_hash)
        try:
            return self._insert(row)
        except StoreError as e:
            raise StoreError(f"{e}; {_keep_pending(row, self._safe)}") from None

    def record_job(self, job: JobConfig, label: str, result: Result, campaign: str | int | None = None,
                   attempt: int = 1, *, fingerprint_hash: str | None = None) -> int:
        """Persist one run of a user's job (``--objective``): keyed by its command line
        (``job.job_hash()``, the workload hash) and its values (``job.content_hash()``, the config
        hash), named ``label`` (the job's script) in the workload column. As :meth:`record`."""
        row = self._row(label, job.job_hash(), job, result, campaign, attempt, None, None, fingerprint_hash)
        try:
            return self._insert(row)
        except StoreError as e:
            raise StoreError(f"{e}; {_keep_pending(row, self._safe)}") from None

    def _row(self, workload_name: str, workload_hash: str, config: Config | JobConfig, result: Result,
             campaign: str | int | None, attempt: int, steps: int | None, warmup: int | None,
             fingerprint_hash: str | None) -> dict[str, Any]:
        fp_hash = result.fingerprint_hash or fingerprint_hash or _fingerprint_hash(result.fingerprint)
        if not result.fingerprint_hash:
            result = result.model_copy(update={"fingerprint_hash": fp_hash})
        why = contention(result.metrics, result.extra, cores_available(result.fingerprint)) if result.ok else None
        return dict(
            workload=workload_name,
            workload_hash=workload_hash,
            config_hash=config.content_hash(),
            config=config.model_dump(mode="json"),
            fingerprint_hash=fp_hash,
            fingerprint=result.fingerprint,
            seed=config.seed,
            source=result.source,
            status=result.status,
            failure_kind=result.failure_kind,
            reason=result.reason,
            metrics=finite_or_null(result.metrics),
            # JSON columns reject NaN/inf on PostgreSQL: store them as strings via pydantic's JSON mode
            result=json.loads(result.model_dump_json()),
            code_version=result.versions.get("cubic") or _code_version(),
            attempt=attempt,
            steps=steps,
            warmup=warmup,
            created_at=utcnow(),
            contended=(why is not None) if result.ok else None,
            campaign=campaign,
        )

    def _insert(self, row: dict[str, Any]) -> int:
        values = {k: v for k, v in row.items() if k != "campaign"}
        if isinstance(values.get("created_at"), str):  # a pending row: when its run finished
            values["created_at"] = datetime.fromisoformat(values["created_at"])
        try:
            with self._write() as conn:
                values["campaign_id"] = self._campaign_id(conn, row.get("campaign"))
                return int(conn.execute(insert(trials_table).values(**values)).inserted_primary_key[0])
        except SQLAlchemyError as e:
            raise StoreError(f"cannot write to the trial store {self._safe}: {self._scrub(e)}") from None

    def import_pending(self, path: str | Path | None = None) -> int:
        """Record the pending file's rows meant for this store (oldest first) and drop them from the
        file; returns how many. Rows for other stores stay. A row whose campaign this store lacks is
        recorded without one.

        The file is read back like user input (:func:`check_pending_line`): a line that is not a
        well-formed pending row (torn JSON, ``null``, no ``row``, a bad ``created_at``, an unknown
        status, metrics that are not numbers, a config whose hash does not match...) is moved to
        ``<file>.quarantine`` with one warning naming the file and line, never imported, and the
        other lines go on."""
        path = Path(path) if path is not None else pending_path()
        if not path.is_file():
            return 0
        try:
            f = open(path, "r+", encoding="utf-8", errors="replace")
        except OSError as e:
            _log.warning("cubic: warning: %s not read (%s): its results stay there", path, e.strerror)
            return 0
        with f:
            fcntl.flock(f, fcntl.LOCK_EX)  # two commands importing at once must not record a row twice
            lines = [(n, ln) for n, ln in enumerate(f.read().splitlines(), 1) if ln.strip()]
            keep, bad, done = [], [], 0

            def rewrite(rest: list[tuple[int, str]]) -> None:
                f.seek(0)
                f.truncate()
                f.write("".join(x + "\n" for _, x in keep + rest))
                f.flush()

            for i, (n, ln) in enumerate(lines):
                try:
                    store, row = check_pending_line(ln)
                except ValueError as e:
                    bad.append((n, ln, str(e)))
                    _quarantine(path, n, ln, str(e))
                    rewrite(lines[i + 1:])
                    continue
                if store != self._safe:
                    keep.append((n, ln))
                    continue
                with self._read() as conn:
                    try:
                        self._campaign_id(conn, row.get("campaign"))
                    except SpecError:
                        row["campaign"] = None
                self._insert(row)  # a failure stops here: this row and the rest stay in the file
                done += 1
                rewrite(lines[i + 1:])
        if (done or bad) and not keep and path.stat().st_size == 0:
            path.unlink()
        return done

    def repeats(
        self,
        workload_hash: str,
        config_hash: str,
        fingerprint_hash: str,
        source: Source = "measured",
        *,
        steps: int | None = None,
        warmup: int | None = None,
        threads: int | None = None,
    ) -> list[Trial]:
        """Every stored trial that may stand in for a run of this config on this machine, oldest
        first: ok results and deterministic failures (transient ones, timeout and killed, never).
        ``steps``/``warmup``, when given, must match, and so must ``threads`` (the intra-op threads
        the run used, in its ``extra``) where a result says."""
        t = trials_table.c
        q = _select_raw(trials_table).where(
            t.workload_hash == workload_hash,
            t.config_hash == config_hash,
            t.fingerprint_hash == fingerprint_hash,
            t.source == source,
            (t.failure_kind.is_(None)) | (t.failure_kind.not_in(sorted(TRANSIENT_FAILURES))),
        )
        if steps is not None:
            q = q.where(t.steps == steps)
        if warmup is not None:
            q = q.where(t.warmup == warmup)
        with self._read() as conn:
            rows = conn.execute(q.order_by(t.id)).mappings().all()
        out = [tr for tr in map(self._trial_or_none, rows) if tr is not None]  # corrupt rows: skipped, warned
        if threads is not None:
            out = [tr for tr in out if tr.result.extra.get("threads") is None
                   or int(tr.result.extra["threads"]) == int(threads)]
        return out

    def serve(self, workload_hash: str, config_hash: str, fingerprint_hash: str, source: Source = "measured",
              *, steps: int | None = None, warmup: int | None = None, threads: int | None = None) -> Served:
        """What the store holds for this config (see :meth:`repeats` for the key): the newest
        deterministic failure when that is the newest row, else the pooled estimate of the ok
        repeats (cubic.core.stats.pool: median and 95% interval, contended repeats excluded while
        uncontended ones exist). ``Served.satisfies(R)`` says whether it stands in for R repeats."""
        rows = self.repeats(workload_hash, config_hash, fingerprint_hash, source, steps=steps, warmup=warmup,
                            threads=threads)
        if not rows:
            return Served(None, [])
        if rows[-1].status != "ok":
            return Served(rows[-1].result, [rows[-1]])
        ok = [r for r in rows if r.status == "ok"]
        # the machine's noise from the OTHER configs: this one's own repeats are already in its spread
        return Served(*pooled_trials(ok, self.noise(fingerprint_hash, source, steps=steps, warmup=warmup,
                                                    exclude=(workload_hash, config_hash)),
                                     self.floor_for(fingerprint_hash, source)))

    # ---- the machine's noise floor --------------------------------------------------------------
    def record_noise_floor(self, fingerprint_hash: str, values: dict[str, list[float]],
                           how: dict[str, Any]) -> dict[str, NoiseModel]:
        """Store the noise floor of this machine from one config's repeats in fresh processes
        (``values``: metric -> the repeats' values); returns the floors recorded."""
        from cubic import __version__
        from cubic.core.stats import noise_model

        out = {}
        with self._write() as conn:
            for metric, vals in values.items():
                m = noise_model([vals])
                if m is None:
                    continue
                m.label = "this machine's noise floor"
                out[metric] = m
                conn.execute(insert(noise_floors_table).values(
                    fingerprint_hash=fingerprint_hash, metric=metric, sd=m.sd, df=m.df,
                    how={**how, "values": [float(v) for v in vals]}, cubic_version=__version__, created_at=utcnow()))
        return out

    def noise_floor(self, fingerprint_hash: str,
                    now: datetime | None = None) -> tuple[dict[str, NoiseModel], str | None]:
        """(metric -> the newest noise floor of this machine that is not stale, why the floor is
        missing or stale or None). Stale: older than NOISE_FLOOR_MAX_AGE_DAYS days, or measured by
        another cubic release."""
        from cubic import __version__

        t = noise_floors_table.c
        q = select(t.metric, t.sd, t.df, t.cubic_version, t.created_at).where(
            t.fingerprint_hash == fingerprint_hash).order_by(t.id.desc())
        with self._read() as conn:
            rows = conn.execute(q).all()
        if not rows:
            return {}, "no noise floor measured on this machine"
        now = now or utcnow()
        out, why = {}, None
        for metric, sd, df, version, created in rows:
            if metric in out:
                continue
            age = (now - _as_utc(created)).total_seconds() / 86400
            if version != __version__:
                why = why or f"the noise floor was measured by cubic {version}, this is {__version__}"
            elif age > NOISE_FLOOR_MAX_AGE_DAYS:
                why = why or f"the noise floor is {age:.0f} days old (> {NOISE_FLOOR_MAX_AGE_DAYS})"
            else:
                out[metric] = NoiseModel(float(sd), int(df), "this machine's noise floor")
        return out, (None if out else why)

    def floor_for(self, fingerprint_hash: str, source: Source = "measured") -> dict[str, NoiseModel] | None:
        """What widens a one-repeat interval where no config was repeated: the fresh noise floor,
        else the assumed one (labelled so); nothing for a deterministic source (the simulator)."""
        if source != "measured":
            return None
        floors, _ = self.noise_floor(fingerprint_hash)
        from cubic.core.stats import INTERVAL_METRICS

        return {k: floors.get(k, ASSUMED_NOISE_FLOOR) for k in INTERVAL_METRICS}

    def noise(self, fingerprint_hash: str, source: Source = "measured", *, steps: int | None = None,
              warmup: int | None = None, exclude: tuple[str, str] | None = None) -> dict[str, NoiseModel]:
        """The machine's between-repeat noise (cubic.core.stats.NoiseModel of examples/s and step
        time) from every config with two or more ok repeats on this fingerprint (and run length,
        when given), each config's repeats chosen as pooling chooses them (the uncontended ones, or
        all when every one was contended): what a config's own few repeats are pooled with."""
        t = trials_table.c
        q = select(t.workload_hash, t.config_hash, t.metrics, t.contended).where(
            t.fingerprint_hash == fingerprint_hash, t.source == source, t.status == "ok")
        if steps is not None:
            q = q.where(t.steps == steps)
        if warmup is not None:
            q = q.where(t.warmup == warmup)
        groups: dict[tuple[str, str], list[tuple[bool, dict[str, float]]]] = {}
        with self._read() as conn:
            for wh, ch, metrics, contended in conn.execute(q):
                groups.setdefault((wh, ch), []).append(
                    (bool(contended), {k: v for k, v in (metrics or {}).items() if v is not None}))
        groups.pop(exclude, None)  # (workload hash, config hash) whose repeats the caller pools itself
        used = ([m for c, m in g if not c] or [m for _, m in g] for g in groups.values())
        return noise_models(used)

    def next_attempt(self, workload_hash: str, config_hash: str, fingerprint_hash: str, source: Source = "measured",
                     *, steps: int | None = None, warmup: int | None = None) -> int:
        """The attempt number of the next run of this config: 1 + the transient failures (timeout,
        killed) stored since its last run that was not one."""
        t = trials_table.c
        q = select(t.failure_kind).where(
            t.workload_hash == workload_hash, t.config_hash == config_hash, t.fingerprint_hash == fingerprint_hash,
            t.source == source)
        if steps is not None:
            q = q.where(t.steps == steps)
        if warmup is not None:
            q = q.where(t.warmup == warmup)
        with self._read() as conn:
            kinds = [r[0] for r in conn.execute(q.order_by(t.id.desc()).limit(1000))]
        n = 0
        for k in kinds:
            if k not in TRANSIENT_FAILURES:
                break
            n += 1
        return n + 1

    def get_trial(self, trial_id: int) -> Trial | None:
        with self._read() as conn:
            row = conn.execute(_select_raw(trials_table).where(trials_table.c.id == trial_id)).mappings().first()
        if row is None:
            return None
        trial = self._trial_or_none(row)
        if trial is None:
            raise SpecError(f"trial {trial_id} in {self._safe} is corrupt (see the warning above)", field="ID")
        return trial

    def trials(
        self,
        campaign: str | int | None = None,
        workload: str | None = None,
        source: Source | None = None,
        status: str | None = None,
        limit: int | None = None,
    ) -> list[Trial]:
        """Stored trials, oldest first; ``limit`` keeps the newest N. Measured and simulated trials
        are mixed only when ``source`` is None (the caller asked for everything)."""
        return list(self._iter_trials(campaign, workload, source, status, limit))

    def _iter_trials(self, campaign, workload, source, status, limit) -> Iterator[Trial]:
        t = trials_table.c
        q = _select_raw(trials_table)
        with self._read() as conn:
            if campaign is not None:
                q = q.where(t.campaign_id == self._campaign_id(conn, campaign))
            if workload is not None:
                q = q.where(t.workload == workload)
            if source is not None:
                q = q.where(t.source == source)
            if status is not None:
                q = q.where(t.status == status)
            q = q.order_by(t.id.desc())
            if limit is not None:
                q = q.limit(limit)
            rows = conn.execute(q).mappings().all()
        for row in reversed(rows):
            trial = self._trial_or_none(row)
            if trial is not None:
                yield trial

    def _trial_or_none(self, row: Any) -> Trial | None:
        return self._decoded(row, self._trial, "trial")

    def count(self) -> int:
        with self._read() as conn:
            return int(conn.execute(select(func.count()).select_from(trials_table)).scalar() or 0)

    @staticmethod
    def _trial(row: Any) -> Trial:
        d = dict(row)
        d["created_at"] = _as_utc(d["created_at"])
        d["result"] = Result.model_validate(restore_nonfinite(d["result"]))
        d["metrics"] = {k: float(v) for k, v in (d["metrics"] or {}).items() if v is not None}
        return Trial.model_validate(d)

    # -- analysis -------------------------------------------------------------------------------

    def to_dataframe(
        self,
        campaign: str | int | None = None,
        workload: str | None = None,
        source: Source | None = None,
        status: str | None = None,
        limit: int | None = None,
    ):
        """One row per trial: the scalar columns, ``metrics.<name>`` and ``phases_ms.<phase>``
        flattened, and the config as a JSON string (its nesting varies by sharding/FP8 choice)."""
        import pandas as pd

        rows = []
        for tr in self._iter_trials(campaign, workload, source, status, limit):
            row: dict[str, Any] = {
                "id": tr.id,
                "campaign_id": tr.campaign_id,
                "workload": tr.workload,
                "source": tr.source,
                "status": tr.status,
                "failure_kind": tr.failure_kind,
                "reason": tr.reason,
                "seed": tr.seed,
                "attempt": tr.attempt,
                "steps": tr.steps,
                "warmup": tr.warmup,
                "contended": tr.contended,
                "created_at": tr.created_at,
                "code_version": tr.code_version,
                "workload_hash": tr.workload_hash,
                "config_hash": tr.config_hash,
                "fingerprint_hash": tr.fingerprint_hash,
                "config": json.dumps(tr.config, sort_keys=True),
            }
            row.update({f"metrics.{k}": v for k, v in sorted(tr.result.metrics.items())})
            row.update({f"phases_ms.{k}": v for k, v in sorted(tr.result.phases_ms.items())})
            rows.append(row)
        df = pd.DataFrame(rows)
        if df.empty:
            df = pd.DataFrame(columns=["id", "campaign_id", "workload", "source", "status", "failure_kind",
                                       "reason", "seed", "attempt", "steps", "warmup", "contended", "created_at",
                                       "code_version", "workload_hash", "config_hash", "fingerprint_hash",
                                       "config"])
        # nullable integers stay integers when some trials lack them
        for col in ("campaign_id", "steps", "warmup"):
            df[col] = df[col].astype("Int64")
        return df

    def export(self, path: str | Path, format: Literal["csv", "parquet"] = "csv", **filters: Any) -> int:
        """Write :meth:`to_dataframe` (with ``filters``) to ``path``; returns the number of trials."""
        if format not in ("csv", "parquet"):
            raise SpecError(f"unknown export format {format!r} (csv or parquet)", field="format")
        df = self.to_dataframe(**filters)
        out = Path(path)
        if not out.parent.is_dir():
            raise SpecError("the directory does not exist", source=str(out))
        if format == "csv":
            df.to_csv(out, index=False)
        else:
            df.to_parquet(out, index=False)
        return len(df)

    # -- sharding cost-model samples ------------------------------------------------------------

    def record_sharding_sample(self, sample_hash: str, batch_size: int, sample: dict[str, Any],
                               metrics: dict[str, float], fingerprint: dict[str, Any]) -> int:
        """One measured rank sample (sharding.collect); returns its id."""
        with self._write() as conn:
            return int(conn.execute(insert(sharding_samples_table).values(
                sample_hash=sample_hash, batch_size=int(batch_size), sample=sample, metrics=finite_or_null(metrics),
                fingerprint_hash=_fingerprint_hash(fingerprint), fingerprint=fingerprint,
                code_version=_code_version(), created_at=utcnow())).inserted_primary_key[0])

    def sharding_samples(self, fingerprint_hash: str | None = None) -> list[dict[str, Any]]:
        """Stored rank samples (of one machine's fingerprint when given), oldest first."""
        t = sharding_samples_table.c
        q = select(sharding_samples_table).order_by(t.id)
        if fingerprint_hash is not None:
            q = q.where(t.fingerprint_hash == fingerprint_hash)
        with self._read() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]


def pooled_trials(ok: list[Trial], noise: dict[str, NoiseModel] | None = None,
                  floor: dict[str, NoiseModel] | None = None) -> tuple[Result, list[Trial], Pooled]:
    """Pool stored ok trials (repeats of one config): the pooled Result, its rows, the pooling."""
    p = pool([Repeat(dict(t.result.metrics), bool(t.contended), t.id) for t in ok], noise, floor)
    return pooled_result([t.result for t in ok], p), ok, p


_log = logging.getLogger("cubic.store")
