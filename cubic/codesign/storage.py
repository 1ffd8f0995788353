"""A campaign's storage: the Optuna storage (SQLite by default, any SQLAlchemy URL such as PostgreSQL)
opened once per URL with cubic's schema checks, the coordinator's lease row (``cubic_campaign_leases``:
one coordinator per campaign), and the listing of the campaigns a storage holds.

Split out of the campaign engine (cubic.codesign.campaign), which drives the ask/tell loop over it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import optuna

from cubic.core.spec import SpecError

DEFAULT_STORAGE = "sqlite:///.cubic/campaigns.db"

T, R = TypeVar("T"), TypeVar("R")


META_KEY = "cubic_campaign"


HEARTBEAT_S = 5  # a RUNNING trial beats this often ...


GRACE_S = 20  # ... and is failed and re-enqueued once silent this long


LEASE_S = 60.0  # the coordinator's lease; renewed every third of it


INTERRUPTED = "interrupted"  # status of a campaign stopped by Ctrl-C, SIGTERM, or a lapsed lease


DB_WAIT_S = 300.0  # a worker waits this long for its database to come back (a restart, a fail-over)


MAX_OUTAGES = 5  # ... and reattaches at most this often: an error that persists is not an outage


_SCHEMA_LOCK_KEY = 0x637562696301  # pg_advisory_lock key of the campaign storage's first use (and creations)


@contextmanager
def _schema_lock(url: str) -> Iterator[None]:
    """Serialise first use of a storage between processes: two processes creating Optuna's schema
    at once collide on ``UNIQUE constraint failed: alembic_version.version_num`` (SQLite) or on
    ``duplicate key value violates unique constraint "pg_type_typname_nsp_index"`` (PostgreSQL,
    seen with 6 processes on a new database). SQLite: a lock file beside the database;
    PostgreSQL: a session advisory lock on a connection of its own; others: no lock (a retry)."""
    if url.startswith("postgresql"):
        from sqlalchemy import create_engine, text

        from cubic.core.store import engine_options

        engine = create_engine(url, **engine_options(url))
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _SCHEMA_LOCK_KEY})
                conn.commit()
                try:
                    yield
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _SCHEMA_LOCK_KEY})
                    conn.commit()
        finally:
            engine.dispose()
        return
    if not url.startswith("sqlite:///") or url.endswith(":memory:"):
        yield
        return
    import fcntl

    path = Path(url[len("sqlite:///"):]).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def creation_lock(storage: Any) -> Iterator[None]:
    """Serialise the creation of campaigns in one storage between processes (the lock of its first
    use): a study without a campaign's settings is a creation a kill cut short, to be made afresh,
    only if no other process is making it at that moment, which only this lock can tell (two workers
    starting one campaign at once: the second deleted the first's study mid-creation, and the first
    failed with Optuna's "Record does not exist"). In memory: one process, no lock."""
    url = getattr(storage, "url", None)
    if not isinstance(url, str):
        yield
        return
    with _schema_lock(url):
        yield


class RetryUnrecordedRun(optuna.storages.RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a stale trial, except for a run whose result was recorded in full: a
    worker killed between writing the run's attributes ("finished_at" last) and ``tell`` leaves a
    stale trial that already counts as a run (:func:`cubic.codesign.trials.is_run`); enqueueing it again would run the
    point twice and spend the budget on the copy (20 SIGKILLs once gave 2 duplicates, 2 lost)."""

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if "finished_at" in trial.user_attrs:
            return
        super().__call__(study, trial)


class NoStorage(SpecError):
    """A command that reads campaigns was given a SQLite storage file that does not exist."""


def open_storage(url: str | None, origin: str = "storage", *, heartbeat_s: int | None = HEARTBEAT_S,
                 grace_s: int = GRACE_S, max_retry: int = 3, create: bool = True):
    """Optuna storage for a URL (None: in memory), with Optuna's heartbeat: a RUNNING trial whose
    worker is silent for ``grace_s`` is failed and re-enqueued (at most ``max_retry`` times).
    Creates the SQLite file and its directory (``create``; a command that only reads campaigns passes
    False: a missing file is :class:`NoStorage`, and a typo leaves no empty database behind); connect
    and statement timeouts; refuses, before Optuna
    creates anything, a database that holds something else (a pre-``cubic_`` trial store, a foreign
    ``studies`` table) and says what it found. A trial store with ``cubic_*`` tables may share the
    database. First use is serialised under a file lock (SQLite) or an advisory lock (PostgreSQL), retried otherwise."""
    if url is None:
        return optuna.storages.InMemoryStorage()
    if isinstance(url, optuna.storages.BaseStorage):
        return url
    from sqlalchemy.exc import IntegrityError, ProgrammingError, SQLAlchemyError

    from cubic.core.store import check_url, engine_options, redact_url, scrub_error, server_in_transition

    parsed = check_url(url, origin)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        path = Path(parsed.database).expanduser()
        if not create and not path.is_file():
            raise NoStorage(f"no campaign storage at {path} (`cubic campaign run` creates it)", field=origin)
        path.parent.mkdir(parents=True, exist_ok=True)
    safe = redact_url(url)
    kw: dict[str, Any] = {}
    if heartbeat_s:
        with experimental_ok():
            kw = dict(heartbeat_interval=heartbeat_s, grace_period=grace_s,
                      heartbeat_stale_trial_callback=RetryUnrecordedRun(max_retry=max_retry))
    for attempt in range(5):
        try:
            # a reader finds the schema or nothing: it makes neither tables nor the lock file
            with (_schema_lock(url) if create else nullcontext()), experimental_ok():
                _check_campaign_schema(url, safe, origin, must_exist=not create)
                st = optuna.storages.RDBStorage(url, engine_kwargs=engine_options(url), **kw)
                if st.engine.dialect.name == "sqlite":
                    # every transaction BEGIN IMMEDIATE (pysqlite's default runs the SELECT of Optuna's
                    # WAITING -> RUNNING compare-and-set outside the transaction: two workers could
                    # both take one trial); WAL and a busy timeout, as the trial store does
                    from cubic.core.store import configure_sqlite

                    configure_sqlite(st.engine)
                    st.engine.update_execution_options(cubic_write=True)
                    st.engine.dispose()  # connections made before the listeners: closed
                _LEASES.metadata.create_all(st.engine, checkfirst=True)  # cubic's one table here
                return st
        except SpecError:
            raise
        except (IntegrityError, ProgrammingError) as e:  # another machine created the schema at that moment
            if attempt == 4:
                raise SpecError(f"cannot open the campaign storage {safe}: {scrub_error(e, url)}", field=origin) from None
            time.sleep(0.2 * (attempt + 1))
        except (SQLAlchemyError, ImportError, ValueError, RuntimeError, optuna.exceptions.StorageInternalError) as e:
            # one line, and never the URL's password; RuntimeError: storage of another Optuna version
            cause = e.__cause__ if isinstance(e, optuna.exceptions.StorageInternalError) and e.__cause__ else e
            if server_in_transition(cause):  # an outage, not bad input: through_outages waits for it
                raise
            raise SpecError(f"cannot open the campaign storage {safe}: {scrub_error(cause, url)}", field=origin) from None


def _check_optuna_version(conn: Any, safe: str, origin: str) -> None:
    """Optuna reads a storage of another schema version without complaint and fails later, mid-run."""
    from sqlalchemy import text

    try:
        from optuna.storages._rdb.models import SCHEMA_VERSION
    except ImportError:  # a private module: where it moved, leave the check to Optuna
        return
    row = conn.execute(text("SELECT schema_version, library_version FROM version_info")).first()
    if row is not None and row[0] != SCHEMA_VERSION:
        raise SpecError(f"{safe} holds campaigns of another Optuna version (schema {row[0]}, set up by optuna "
                        f"{row[1]}; this is optuna {optuna.__version__}, schema {SCHEMA_VERSION})", field=origin)


def _check_campaign_schema(url: str, safe: str, origin: str, must_exist: bool = False) -> None:
    from sqlalchemy import create_engine, inspect

    from cubic.core.store import engine_options

    engine = create_engine(url, **engine_options(url))
    try:
        with engine.connect() as conn:
            insp = inspect(conn)
            names = set(insp.get_table_names())
            if names & {"schema_version", "campaigns"}:  # cubic's tables before the cubic_ prefix
                raise SpecError(f"{safe} is a cubic trial store of the old layout (tables "
                                f"{', '.join(sorted(names)[:6])}): open it once as a trial store (which renames "
                                "its tables) or give the campaigns a database of their own", field=origin)
            if "studies" in names and "version_info" not in names:
                raise SpecError(f"{safe} has a 'studies' table that is not Optuna's (no version_info table): not "
                                "a campaign storage", field=origin)
            if "version_info" in names:
                _check_optuna_version(conn, safe, origin)
            elif must_exist:  # a database of something else (a trial store, say): opening it would add Optuna's tables
                raise NoStorage(f"no campaign storage in {safe} (no Optuna tables; `cubic campaign run` creates them)",
                                field=origin)
            for table, column in (("studies", "study_name"), ("trials", "study_id")):
                if table in names and column not in {c["name"] for c in insp.get_columns(table)}:
                    raise SpecError(f"{safe} has a {table!r} table without {column!r}: not an Optuna campaign "
                                    "storage", field=origin)
    finally:
        engine.dispose()


class LeaseHeld(RuntimeError):
    """Another process coordinates this campaign."""

    def __init__(self, name: str, holder: str, expires_at: float):
        self.holder, self.expires_at = holder, expires_at
        super().__init__(f"campaign {name!r} is being run by {holder} (lease until "
                         f"{time.strftime('%H:%M:%S', time.localtime(expires_at))}); "
                         f"wait for it, or add workers with `cubic campaign work {name}`")


def _lease_table():
    from sqlalchemy import Column, Float, MetaData, String, Table

    md = MetaData()
    return Table("cubic_campaign_leases", md, Column("campaign", String(512), primary_key=True),
                 Column("holder", String(200), nullable=False), Column("expires_at", Float, nullable=False))


_LEASES = _lease_table()


class Lease:
    """A row (campaign, holder, expires_at); taken by insert, or by a compare-and-set update once
    expired; renewed by a daemon thread; released on exit. No RDB storage (in memory): no lease."""

    def __init__(self, storage, name: str, holder: str, ttl_s: float = LEASE_S):
        self.name, self.holder, self.ttl_s = name, holder, ttl_s
        self.engine = getattr(storage, "engine", None)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.engine is not None:
            _LEASES.metadata.create_all(self.engine, checkfirst=True)  # (open_storage made it; a storage object may not)

    def holder_now(self) -> tuple[str, float] | None:
        """(holder, expiry) of a live lease, or None. The row is read back like input: one whose
        expiry is not a number or whose holder is not text (a foreign write; SQLite keeps any type)
        is removed with a warning, as a lapsed lease, instead of failing or blocking every resume."""
        from sqlalchemy import Text, delete, select, type_coerce

        if self.engine is None:
            return None
        c = _LEASES.c
        with self.engine.connect() as conn:
            row = conn.execute(select(type_coerce(c.holder, Text), type_coerce(c.expires_at, Text))
                               .where(c.campaign == self.name)).first()
        if row is None:
            return None
        try:
            holder, expires = row[0], float(row[1])
            if not isinstance(holder, str) or not holder or expires != expires:
                raise ValueError(f"holder {holder!r}")
        except (TypeError, ValueError) as e:
            import logging

            logging.getLogger("cubic.storage").warning(
                "cubic: warning: the lease row of campaign %r in cubic_campaign_leases is corrupt (%s): removed, "
                "as a lapsed lease", self.name, e)
            with self.engine.begin() as conn:
                conn.execute(delete(_LEASES).where(c.campaign == self.name,
                                                   type_coerce(c.expires_at, Text) == row[1]))
            return None
        return (holder, expires) if expires > time.time() else None

    def try_acquire(self) -> bool:
        from sqlalchemy import or_, update

        if self.engine is None:
            return True
        now = time.time()
        if not self._insert_once(now):
            c = _LEASES.c
            held = self.holder_now()  # (a corrupt row is removed here: then the insert may succeed)
            if held is not None or not self._insert_once(now):
                # free: expired, ours already, or held by a process on this host that no longer exists
                dead = [held[0]] if held and pid_dead(held[0]) else []
                with self.engine.begin() as conn:
                    n = conn.execute(update(_LEASES).where(
                        c.campaign == self.name, or_(c.expires_at < now, c.holder.in_([self.holder] + dead))
                    ).values(holder=self.holder, expires_at=now + self.ttl_s)).rowcount
                if n != 1:
                    return False
        self._stop.clear()
        self.lost.clear()  # (taken again after losing it: held now)
        self._thread = threading.Thread(target=self._renew, daemon=True, name=f"lease:{self.name}")
        self._thread.start()
        return True

    def _insert_once(self, now: float) -> bool:
        """Take a free lease by insert (after :meth:`holder_now` removed a corrupt row)."""
        from sqlalchemy import insert
        from sqlalchemy.exc import IntegrityError

        try:
            with self.engine.begin() as conn:
                conn.execute(insert(_LEASES).values(campaign=self.name, holder=self.holder, expires_at=now + self.ttl_s))
            return True
        except IntegrityError:
            return False

    def acquire(self) -> "Lease":
        if not self.try_acquire():
            held = self.holder_now() or ("another process", time.time())
            raise LeaseHeld(self.name, *held)
        return self

    def _renew(self) -> None:
        from sqlalchemy import update

        c = _LEASES.c
        while not self._stop.wait(self.ttl_s / 3):
            try:
                with self.engine.begin() as conn:
                    n = conn.execute(update(_LEASES).where(c.campaign == self.name, c.holder == self.holder)
                                     .values(expires_at=time.time() + self.ttl_s)).rowcount
            except Exception:  # noqa: BLE001 - the database is away: the lease may lapse
                n = 1
            if n != 1:
                self.lost.set()
                return

    def release(self) -> None:
        from sqlalchemy import delete

        if self.engine is None or self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        c = _LEASES.c
        with self.engine.begin() as conn:
            conn.execute(delete(_LEASES).where(c.campaign == self.name, c.holder == self.holder))

    def __enter__(self) -> "Lease":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


@contextmanager
def experimental_ok() -> Iterator[None]:
    """Optuna 5 still labels its heartbeat and retry callback (since 2.8/2.9) experimental."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def heartbeat_interval(storage) -> int | None:
    """The storage's heartbeat interval (None: no heartbeat, e.g. in memory)."""
    get = getattr(storage, "get_heartbeat_interval", None)
    return get() if get is not None else None


WORKER_ATTR = "cubic_worker"  # the trial system attribute naming the worker whose attempt it is


def take_trial(storage: Any, trial_id: int, worker: str) -> bool:
    """Take a WAITING trial for ``worker``: Optuna's compare-and-set to RUNNING (a new start time) and
    the claim (``WORKER_ATTR``) in ONE transaction on a database. Apart, a worker stopped between
    them could wake after its trial was taken back and re-taken and write its claim over the other
    worker's: both ran, one told. In memory (one process, nothing taken back) they are two writes."""
    engine = getattr(storage, "engine", None)
    if engine is None:
        if not storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.RUNNING):
            return False
        storage.set_trial_system_attr(trial_id, WORKER_ATTR, worker)
        return True
    import json
    from datetime import datetime

    from optuna.storages._rdb import models
    from sqlalchemy import delete, insert, update

    tm, am = models.TrialModel.__table__, models.TrialSystemAttributeModel.__table__
    with engine.begin() as conn:
        taken = conn.execute(update(tm).where(tm.c.trial_id == trial_id, tm.c.state == optuna.trial.TrialState.WAITING)
                             .values(state=optuna.trial.TrialState.RUNNING, datetime_start=datetime.now())).rowcount
        if taken:  # Optuna stores a system attribute as one JSON row per (trial, key)
            conn.execute(delete(am).where(am.c.trial_id == trial_id, am.c.key == WORKER_ATTR))
            conn.execute(insert(am).values(trial_id=trial_id, key=WORKER_ATTR, value_json=json.dumps(worker)))
    return bool(taken)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident() % 100000}"


def pid_dead(worker: str | None) -> bool:
    """A worker name of a process on this host that no longer exists."""
    if not worker:
        return False
    host, _, rest = worker.partition(":")
    pid = rest.split(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def load_meta(storage, name: str) -> dict[str, Any]:
    st = open_storage(storage, create=False) if isinstance(storage, str) or storage is None else storage
    try:
        study = optuna.load_study(study_name=name, storage=st)
    except KeyError:
        raise SpecError("no such campaign", field=name) from None
    meta = study.user_attrs.get(META_KEY)
    if not meta:
        raise SpecError("this Optuna study is not a cubic campaign (or its creation was cut short: "
                        "`campaign run` with this name creates it afresh)", field=name)
    return meta


def campaign_status(storage, name: str, stored: str) -> str:
    """The status a person should read: a campaign stored as ``running`` whose coordinator no longer
    holds its lease (lapsed: no renewal for ``LEASE_S``, or its process on this host is gone) was
    killed or cut off, not running: ``interrupted``. Storage without leases (in memory) shows as stored."""
    if stored != "running" or getattr(storage, "engine", None) is None:
        return stored
    held = Lease(storage, name, holder="campaign-list").holder_now()
    return "running" if held and not pid_dead(held[0]) else INTERRUPTED


def list_campaigns(storage: Any = DEFAULT_STORAGE) -> list[dict[str, Any]]:
    try:
        st = open_storage(storage, create=False)
    except NoStorage:  # nothing stored yet: no campaigns, and no empty database made by looking
        return []
    out = []
    for s in optuna.get_all_study_summaries(st, include_best_trial=False):
        meta = s.user_attrs.get(META_KEY)
        if not meta:
            continue
        from cubic.codesign.trials import is_run

        # finished runs, as the campaign counts them: n_trials counted queued and running trials too
        # (an interrupted 3-of-6 campaign listed 6 runs)
        runs = sum(is_run(t) for t in st.get_all_trials(st.get_study_id_from_name(s.study_name), deepcopy=False))
        out.append({"name": s.study_name, "strategy": meta["strategy"], "budget": meta["budget"],
                    "runs": runs, "status": campaign_status(st, s.study_name, s.user_attrs.get("status", "")),
                    "stop_reason": s.user_attrs.get("stop_reason", ""),
                    "workload": meta.get("context", {}).get("workload", ""), "created_at": meta.get("created_at")})
    return out


def database_answers(url: str) -> bool:
    """Whether the database at ``url`` accepts a connection and a trivial query now."""
    from sqlalchemy import create_engine, text

    from cubic.core.store import engine_options

    eng = None
    try:
        eng = create_engine(url, **engine_options(url))
        with eng.connect() as conn:
            conn.execute(text("select 1"))
        return True
    except Exception:  # noqa: BLE001 - any failure means "not yet"
        return False
    finally:
        if eng is not None:
            eng.dispose()


def through_outages(attach: Callable[[], T], body: Callable[[T], R], urls: list[str | None], *,
                    wait_s: float = DB_WAIT_S, on_outage: Callable[[str], None] = lambda line: None,
                    poll_s: float = 1.0) -> R:
    """``body(attach())``, attached again after a database outage (the server restarted, a
    fail-over): when a storage error ends ``body`` and the databases answer again within
    ``wait_s``, the campaign is re-attached and goes on. What the outage interrupted is what a kill
    interrupts: the run in flight goes back to its trial after the heartbeat's grace period, a
    result whose store write failed waits in the pending file, so nothing is lost or counted
    twice. Any other error, one that persists (``MAX_OUTAGES``), or a database that stays away is
    raised as before."""
    from cubic.core.store import storage_error_line

    live = [u for u in urls if isinstance(u, str)]
    outages = 0
    while True:
        try:
            return body(attach())
        except Exception as e:
            line = storage_error_line(e, *live)
            if line is None or outages >= MAX_OUTAGES:
                raise
            deadline = time.monotonic() + wait_s
            while not all(database_answers(u) for u in live):
                if time.monotonic() > deadline:
                    raise
                time.sleep(poll_s)
            outages += 1
            on_outage(line)
