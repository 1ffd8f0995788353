"""The pending file: a trial row the store could not write is appended to it (``$CUBIC_PENDING`` or
``<cwd>/.cubic/pending.jsonl``) and imported by the next command whose store works
(:meth:`cubic.core.store.TrialStore.import_pending`). A line is read back like user input
(:func:`check_pending_line`); a bad one is quarantined beside the file. Split from
:mod:`cubic.core.store`, which re-exports these names."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from cubic.core.config import Config, JobConfig
from cubic.core.result import Result
from cubic.core.store_schema import Source, finite_or_null, restore_nonfinite, utcnow

PENDING_ENV = "CUBIC_PENDING"
_log = logging.getLogger("cubic.store")


def pending_path() -> Path:
    env = os.environ.get(PENDING_ENV)
    return Path(env) if env else Path.cwd() / ".cubic" / "pending.jsonl"


class PendingRow(BaseModel):
    """One trial row as :meth:`TrialStore._row` writes it to the pending file, read back strictly."""

    model_config = ConfigDict(extra="forbid", strict=True)

    workload: str = Field(max_length=200)
    workload_hash: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    config_hash: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    config: dict[str, Any]
    fingerprint_hash: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    fingerprint: dict[str, Any]
    seed: int
    source: Source
    status: Literal["ok", "failed"]
    failure_kind: str | None = Field(default=None, max_length=16)
    reason: str | None = None
    metrics: dict[str, float | None]
    result: dict[str, Any]
    code_version: str = Field(max_length=64)
    attempt: int = Field(ge=1)
    steps: int | None = Field(default=None, ge=0)
    warmup: int | None = Field(default=None, ge=0)
    created_at: AwareDatetime = Field(strict=False)  # written as an ISO string
    contended: bool | None = None
    campaign: str | int | None = None


def check_pending_line(line: str) -> tuple[str, dict[str, Any]]:
    """A pending-file line checked like user input: (the store it is meant for, the row ready to
    insert). ValueError says, in one line, what is wrong with it."""
    from pydantic import ValidationError

    try:
        entry = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg}, a line torn by a crash?)") from None
    if not isinstance(entry, dict):
        raise ValueError(f"a JSON {type(entry).__name__}, not an object with 'store' and 'row'")
    store, row = entry.get("store"), entry.get("row")
    if not isinstance(store, str):
        raise ValueError("no 'store' (the store the row is meant for)")
    if not isinstance(row, dict):
        raise ValueError("no 'row' object")
    try:
        r = PendingRow.model_validate(row)
        result = Result.model_validate(restore_nonfinite(r.result))
        config = (JobConfig if r.config.get("kind") == "job" else Config).model_validate(r.config)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ()))
        raise ValueError(f"row field {where!r}: {err.get('msg')}") from None
    if (result.status, result.source) != (r.status, r.source):
        raise ValueError(f"row 'status'/'source' ({r.status}/{r.source}) disagree with its result's "
                         f"({result.status}/{result.source})")
    if config.content_hash() != r.config_hash:
        raise ValueError("row 'config_hash' is not the hash of its config")
    if isinstance(config, JobConfig) and config.job_hash() != r.workload_hash:
        raise ValueError("row 'workload_hash' is not the hash of its job's command line")
    out = r.model_dump()
    out["metrics"] = finite_or_null({k: (float("nan") if v is None else v) for k, v in r.metrics.items()})
    return store, out


def pending_for(store: str, path: Path | None = None) -> bool:
    """Whether the pending file holds a well-formed result for ``store`` (its redacted URL): then a
    command that only reads still opens, and so creates, that store, to import it."""
    path = path or pending_path()
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    except OSError:
        return False
    for ln in lines:
        try:
            if ln.strip() and check_pending_line(ln)[0] == store:
                return True
        except ValueError:
            continue
    return False


def _quarantine(path: Path, line_no: int, line: str, why: str) -> None:
    """Move a bad pending line beside the file (``<file>.quarantine``), with one warning."""
    q = path.with_name(path.name + ".quarantine")
    try:
        with open(q, "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(json.dumps({"file": str(path), "line": line_no, "why": why, "text": line[:100_000]}) + "\n")
        where = f"moved to {q}"
    except OSError as e:
        where = f"dropped ({q} could not be written: {e.strerror})"
    _log.warning("cubic: warning: %s line %d is not a pending result (%s): %s, not imported",
                 path, line_no, why[:200], where)


def _keep_pending(row: dict[str, Any], store: str) -> str:
    """Append a trial row that could not be written to the pending file; says where (or that it could not)."""
    path = pending_path()
    entry = {"id": uuid.uuid4().hex, "store": store, "written_at": utcnow().isoformat(), "row": row}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(json.dumps(entry, default=str) + "\n")
        return f"the result is kept in {path} and will be imported by the next command whose store works"
    except OSError as e:
        return f"and the pending file {path} could not be written either ({e.strerror}): the result is only " \
               "in this command's output"


