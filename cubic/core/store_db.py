"""The trial store's database URL: redaction (a password is never printed), checks, driver timeouts,
the default location, and :class:`StoreError` (a failed write). Split from :mod:`cubic.core.store`,
which re-exports every name here."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from cubic.core.spec import SpecError

SQLITE_BUSY_TIMEOUT_MS = 60_000


class StoreError(RuntimeError):
    """The trial store could not be written. Not bad input and not a failed run: the result is kept
    in the pending file (see the module docstring) and the command stops with a store error."""


# greedy to the last "@": an unescaped "@" or "/" inside a password must not leave a piece of it behind
_PASSWORD_IN_URL = re.compile(r"(://[^:/?#@\s]*:)\S*@")
# what may separate the pieces a URL parser (SQLAlchemy, libpq) splits a mistyped password into
_URL_SEPARATORS = re.compile(r"[@/:?#&=;,\s]+")

MAX_TIMEOUT_S = 7 * 86400.0
_BAD_ENV: dict[str, str] = {}  # a variable that is no timeout: named when a database is opened


def _seconds_from_env(name: str, default: float) -> float:
    """A timeout from the environment. Read at import, so a bad value cannot be raised here (it was a
    traceback before any command ran): kept aside and named, with the variable, by :func:`engine_options`."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_TIMEOUT_S:  # NaN fails this too
        _BAD_ENV[name] = text
        return default
    return value


CONNECT_TIMEOUT_S = _seconds_from_env("CUBIC_DB_CONNECT_TIMEOUT_S", 10.0)
STATEMENT_TIMEOUT_S = _seconds_from_env("CUBIC_DB_STATEMENT_TIMEOUT_S", 300.0)
# a process stopped inside a transaction (a cut-off host, SIGSTOP) keeps its row locks until the
# server ends its session: every worker that touches those rows (the lost trial's heartbeat) waits
# with it. Above the heartbeat's grace period (20 s), so a worker is deemed gone before it is cut.
IDLE_TRANSACTION_TIMEOUT_S = _seconds_from_env("CUBIC_DB_IDLE_TRANSACTION_TIMEOUT_S", 30.0)


def redact_url(url: str | None) -> str:
    """The URL with any password replaced by ``***`` -- the one redaction every message uses.

    Everything between ``://user:`` and the LAST ``@`` goes first (a password with an unescaped
    "@" or "/" would otherwise be split by the parser and show up as a host or database), then
    SQLAlchemy renders what is left with ``hide_password``; an unparsable URL keeps the textual
    redaction, and one with an "@" but no "user:" loses everything up to that "@"."""
    if url is None:
        return ""
    url = _PASSWORD_IN_URL.sub(r"\1***@", url)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # unparsable: the textual scrub alone, and nothing of a user part kept
        return re.sub(r"://.*@", "://***@", url) if "://" in url else re.sub(r"^.*@", "***@", url)


def _password_pieces(url: str | None) -> list[str]:
    """The password of ``url`` as typed, as SQLAlchemy parses it, and every piece a parser could
    split it into (what a driver may echo as a host or database name), longest first."""
    if not url:
        return []
    found: set[str] = set()
    try:
        if make_url(url).password:
            found.add(str(make_url(url).password))
    except Exception:
        pass
    m = _PASSWORD_IN_URL.search(url)
    if m:
        typed = m.group(0)[len(m.group(1)):-1]
        found.add(typed)
        found.update(_URL_SEPARATORS.split(typed))
    return sorted((p for p in found if len(p) >= 3), key=len, reverse=True)


def scrub_error(err: BaseException | str, *urls: str | None) -> str:
    """One line of a driver error (or text) with the password of each URL, and its pieces, removed."""
    text = " ".join(str(getattr(err, "orig", None) or err).split())
    for url in urls:
        for piece in _password_pieces(url):
            text = text.replace(piece, "***")
    text = _PASSWORD_IN_URL.sub(r"\1***@", text)
    # a driver echoing a host it split at a password's "@" ("wd@127.0.0.1"): drop what precedes "@"
    # (not a URL, already redacted above: its scheme and user stay)
    text = re.sub(r"(?<=[\s\"'(])[^\s\"'@/]+@", "***@", text)
    hint = f"(no answer within the connect timeout, {CONNECT_TIMEOUT_S:g} s)"
    if ("timeout expired" in text or "timed out" in text) and hint not in text:
        text += " " + hint
    return text[:300]


def storage_error_line(err: BaseException, *urls: str | None) -> str | None:
    """One scrubbed line for a database failure -- SQLAlchemy's, a DB-API driver's, or Optuna's
    storage errors (whose own text is generic: its cause is what says "disk is full") -- or None
    when ``err`` is not one. The CLI and the worker print this instead of a traceback."""
    from sqlalchemy.exc import SQLAlchemyError

    optuna_storage = type(err).__name__ == "StorageInternalError" and type(err).__module__.startswith("optuna")
    driver = type(err).__module__.split(".")[0] in ("sqlite3", "psycopg2", "psycopg", "pymysql", "MySQLdb")
    if isinstance(err, StoreError):  # already one scrubbed line, the pending file named
        return str(err)
    if not (isinstance(err, SQLAlchemyError) or optuna_storage or driver):
        return None
    cause = err.__cause__ if optuna_storage and err.__cause__ is not None else err
    line = scrub_error(cause, *urls)
    if "disk I/O error" in line or "disk is full" in line:  # SQLite's words for a file that cannot grow
        line += " (is the disk full?)"
    return line


# what a PostgreSQL server that is there says while it stops, starts or recovers (a restart, a
# fail-over). "Connection refused" is not here: nothing listening is also what a mistyped port
# gives, and that should fail at once naming the flag, not wait --db-wait seconds.
_TRANSITION = ("server closed the connection unexpectedly", "the database system is starting up",
               "the database system is shutting down", "the database system is in recovery mode",
               "terminating connection due to administrator command")


def server_in_transition(err: BaseException) -> bool:
    """Whether ``err`` is a database server caught restarting (an outage to wait out), not a bad URL."""
    return any(t in str(err) for t in _TRANSITION)


def check_url(url: str, origin: str) -> Any:
    """The parsed URL, or a SpecError naming ``origin`` (the flag or variable) with the URL redacted.

    An "@" after the user part's "@" (before any query) means a password with an unescaped "@":
    SQLAlchemy would connect to part of the password as a host, so it is refused."""
    safe = redact_url(url)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise SpecError(f"not a database URL: {safe!r}", field=origin) from None
    rest = url.split("?", 1)[0].split("://", 1)[-1]
    if not rest.startswith("/") and rest.count("@") > 1:  # (a file path, sqlite:////a@b@c.db, has no user part)
        raise SpecError(f"{safe!r} has more than one '@' before its host: write an '@' in a password as %40",
                        field=origin)
    return parsed


def engine_options(url: str) -> dict[str, Any]:
    """``create_engine`` keyword arguments with connect and statement timeouts for ``url``'s
    driver, so that a server that accepts and never answers fails in seconds instead of hanging.
    Timeouts written in the URL's query win; $CUBIC_DB_CONNECT_TIMEOUT_S (default 10),
    $CUBIC_DB_STATEMENT_TIMEOUT_S (default 300) and, on PostgreSQL, the server's end of a session
    idle inside a transaction, $CUBIC_DB_IDLE_TRANSACTION_TIMEOUT_S (default 30), set them otherwise."""
    for name, text in _BAD_ENV.items():
        raise SpecError(f"must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got {text!r}", field=name)
    parsed = make_url(url)
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    given = set(parsed.query)
    args: dict[str, Any] = {}
    if backend == "sqlite":
        args["timeout"] = SQLITE_BUSY_TIMEOUT_MS / 1000
    elif backend == "postgresql" and driver in ("psycopg2", "psycopg", "psycopg2cffi"):
        args["connect_timeout"] = max(1, round(CONNECT_TIMEOUT_S))
        args["options"] = (f"-c statement_timeout={int(STATEMENT_TIMEOUT_S * 1000)} "
                           f"-c idle_in_transaction_session_timeout={int(IDLE_TRANSACTION_TIMEOUT_S * 1000)}")
    elif backend == "postgresql" and driver == "pg8000":
        args["timeout"] = CONNECT_TIMEOUT_S
    elif backend in ("mysql", "mariadb"):
        args.update(connect_timeout=max(1, round(CONNECT_TIMEOUT_S)), read_timeout=round(STATEMENT_TIMEOUT_S),
                    write_timeout=round(STATEMENT_TIMEOUT_S))
    return {"connect_args": {k: v for k, v in args.items() if k not in given}}


def default_url() -> str:
    return f"sqlite:///{Path.cwd() / '.cubic' / 'trials.db'}"


