"""Which look of a packaged check was made on this machine.

A check cubic quotes to a user (the planner's edge under ``cubic shard plan``, a placement's NE cost
trained under ``cubic fp8 probe``) is a record of the last benchmark run with the newest look of each
other machine under ``other_machines`` (``experiments.common.newest_look_per_machine``). What was
measured on one CPU held there; the line a user reads leads with the look made on the CPU they run on,
matched on the CPU's model name as ``experiments.common.run_of`` records a look's machine.
"""

from __future__ import annotations

from typing import Any


def this_machine() -> str | None:
    """The CPU model a check is matched on."""
    from cubic.core.fingerprint import fingerprint

    return fingerprint("cpu").get("cpu_model")


def split_looks(check: dict[str, Any], here: str | None = None) -> tuple[str | None, dict[str, Any] | None,
                                                                         list[dict[str, Any]]]:
    """(this machine's CPU model, the look made on it or None, the other looks, the last run's first)."""
    here = this_machine() if here is None else here
    looks = [check, *(check.get("other_machines") or [])]
    ours = next((r for r in looks if r.get("machine") == here), None)
    return here, ours, [r for r in looks if r is not ours]
