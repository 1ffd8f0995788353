"""The benchmark convention (README, "Benchmark convention"), checked the same way by every experiment
test that reads a results document: one checker instead of a copy per test."""


def check_targets(targets: dict) -> None:
    """A non-empty ``targets`` object: each entry has ``measured``, ``target`` and ``met``, and a
    missed one says why (``reason``)."""
    assert targets and all(set(t) >= {"measured", "target", "met"} for t in targets.values())
    assert all(t.get("reason") for t in targets.values() if not t["met"])
