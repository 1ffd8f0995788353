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


def test_write_keeps_the_start_context_and_draws_the_figure(tmp_path, monkeypatch):
    import experiments.common as common
    from experiments.reliability_inputs import write

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    cls = {"variants": 2, "defects": 0, "uncaught_exceptions": 0, "hangs": 0, "data_lost": 0, "max_elapsed_s": 1.0}
    res = {"quick": True, "classes": {c: dict(cls) for c in CLASSES},
           "total": {k: 2 * len(CLASSES) if k == "variants" else 0
                     for k in ("variants", "defects", "uncaught_exceptions", "hangs", "data_lost")}, "outcomes": []}
    payload, path = write(res, True, 3.0, {"started_at": "then"})
    assert payload["context"] == {"started_at": "then"} and path == tmp_path / "reliability_inputs_quick.json"
    assert (tmp_path / "reliability_inputs_quick.png").stat().st_size > 0
