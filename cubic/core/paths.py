"""Names (campaign, workload, job) become paths only here, so that no name escapes cubic's folder.

A name a user typed (``cubic campaign run --name ../../../escaped``, an absolute name, a name with a
NUL byte or a newline) is turned into ONE path component: characters outside ``[A-Za-z0-9._-]``
become ``_``, leading dots are dropped (no ``..``, no hidden file), the length is bounded, and a
name that had to change gets a short hash of the original so that two names never share a folder
(``a/b`` and ``a_b`` stay apart). :func:`under` joins such components below a root and checks the
resolved result is still inside it (a symlink planted in the tree cannot lead out either).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from cubic.core.spec import SpecError

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
MAX_COMPONENT = 80  # well under every file system's 255 bytes, room for suffixes


def safe_name(name: object) -> str:
    """``name`` as one safe path component; unchanged when it already is one."""
    raw = str(name)
    clean = _SAFE.sub("_", raw).lstrip(".") or "_"
    if clean == raw and len(raw) <= MAX_COMPONENT:
        return raw
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{clean[:MAX_COMPONENT - 9]}-{digest}"


def under(root: str | Path, *names: object) -> Path:
    """``root/<safe_name(n)>/...``: each name one component, the resolved path inside ``root``."""
    base = Path(root)
    path = base.joinpath(*(safe_name(n) for n in names))
    top, got = base.resolve(), path.resolve()
    if got != top and top not in got.parents:  # a symlink inside the tree pointing out
        raise SpecError(f"{path} leads outside {base} (a symbolic link?)", field="name")
    return path
