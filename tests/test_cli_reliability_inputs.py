"""The reduced form of experiments/reliability_inputs.py: one or two variants of every attack class
(hangs, secrets, stray code, unbounded inputs, tracebacks, messages, escapes) through the real CLI."""

import pytest

from experiments.reliability_inputs import CLASSES, run, targets


@pytest.mark.slow  # 25 s: every attack class through the real CLI
def test_every_attack_class_is_one_clean_line():
    res = run(quick=True)
    bad = [f"{o['cls']}: {o['variant']}: {o['why']} | {o['stderr_tail'][-300:]}" for o in res["outcomes"] if not o["ok"]]
    assert not bad, "\n".join(bad)
    assert all(res["classes"][c]["variants"] >= 1 for c in CLASSES)
    assert all(t["met"] for t in targets(res).values()), targets(res)
