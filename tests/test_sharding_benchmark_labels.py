"""What sharding_benchmark says about where its models come from: the planners are told the
packaged gloo calibration by name (the judge's), its label says whether it is this machine's, and a
missed target's reason names a compute model trained elsewhere."""

from __future__ import annotations

import pytest

pytest.importorskip("fbgemm_gpu")

from cost_models.comm import CALIBRATION_PATH, CommModel  # noqa: E402
from experiments import sharding_benchmark as sb  # noqa: E402


def test_the_gloo_regime_is_told_the_judges_file_and_says_whose_machine():
    told, _, how = sb.regimes()["gloo-calibrated"]
    assert told["comm_calibration"] == str(CALIBRATION_PATH)  # not a user's calibration, if one exists
    origin = dict(CommModel.calibrated(CALIBRATION_PATH).origin)
    assert ("measured on another machine" in how) == (not origin["this_machine"])
    assert "calibration of this machine" not in how and how.count(origin["machine"]) == 1  # named once


def test_a_calibration_says_whose_machine_once_and_its_file_by_repository_path(tmp_path):
    """two_d's note read 'measured on ANOTHER machine: measured on another machine (AMD EPYC ...)' and
    named the packaged file by the checkout's absolute path."""
    import json

    from experiments.common import calibration_origin

    o = calibration_origin(CALIBRATION_PATH)
    assert o["file"] == "cost_models/data/comm_calibration.json"
    assert o["where"].count("machine") == 1 and o["machine"] in o["where"]
    # another machine's file outside the repository: its full path, the foreign reason as it is
    doc = json.loads(CALIBRATION_PATH.read_text())
    doc["fingerprint"] = {**doc["fingerprint"], "cpu_model": "Some Other CPU"}
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(doc))
    o = calibration_origin(p)
    assert o["file"] == str(p) and not o["this_machine"] and "Some Other CPU" in o["where"]


def test_missed_reasons_name_a_model_from_another_machine():
    targets = {"a": {"met": False, "reason": "model error"}, "b": {"met": True}, "c": {"met": False, "reason": "x"}}
    sb.name_foreign_model(targets, "the cost model was trained on AMD EPYC")
    assert targets["a"]["reason"] == "model error; the cost model was trained on AMD EPYC"
    assert "reason" not in targets["b"]
    sb.name_foreign_model(targets, None)  # trained here: nothing added
    assert targets["c"]["reason"] == "x; the cost model was trained on AMD EPYC"


def _task(name, tables, ms):
    """A judged task as run_task records it: ``ms`` maps method -> judged ms (each predicted at half)."""
    meth = {m: {"measured_ms": v, "predicted_ms": 1.0, "predicted_compute_ms": [v / 2], "measured_compute_ms": [v]}
            for m, v in ms.items()}
    return {"task": name, "tables": tables, "regimes": {"r": {"methods": meth}}}


def test_the_own_model_second_look_joins_the_targets_and_the_shipped_misses_cite_it():
    """--own-model: cubic's planner on a model trained here, judged beside the shipped model's; a
    missed target of the shipped model says what the same planner measured with the own model."""
    from types import SimpleNamespace

    from cubic.core.fingerprint import fingerprint
    from experiments.common import target_defects

    h = {m: 10.0 for m in sb.HEURISTICS}
    families = [("10-26 tables", [_task("small-0", 12, {"cubic": 12.0, sb.OWN: 8.0, **h}),
                                  _task("small-1", 20, {"cubic": 9.0, sb.OWN: 9.5, **h})])]
    methods = ["cubic", sb.OWN, *sb.HEURISTICS]
    _, targets = sb.analyse(families, ["r"], methods)
    own_est = SimpleNamespace(model=SimpleNamespace(meta_={"fingerprint": fingerprint("cpu")}))
    own = sb.own_look(families, ["r"], methods, own_est, targets)
    worst = targets["r: no task > 3% worse than its best heuristic"]
    twin = targets[sb.OWN_PREFIX + "r: no task > 3% worse than its best heuristic"]
    assert worst["measured"] == pytest.approx(0.2) and worst["worst_task"] == "small-0"
    assert twin["measured"] == pytest.approx(-0.05) and twin["met"] and twin["worst_task"] == "small-1"
    assert "trained on this machine: -5.0% (met)" in worst["reason"]
    assert own["machine_mismatch"] is None and own["accuracy"]["r"]["ranks"] == 2
    assert not target_defects(targets)


def test_an_own_model_that_is_not_a_model_is_the_flags_error(tmp_path, capsys):
    bad = tmp_path / "model.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit) as e:
        sb.main(["--own-model", str(bad)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--own-model" in err and str(bad) in err
