"""The benchmark convention (README, "Benchmark convention"), checked the same way by every experiment
test that reads a results document: the one rule experiments.common.write_result enforces."""

from experiments.common import target_defects


def check_targets(targets: dict) -> None:
    """A non-empty ``targets`` object: each entry has ``measured``, ``target`` and a boolean ``met``,
    and a missed one says why (``reason``)."""
    assert not target_defects(targets), target_defects(targets)
