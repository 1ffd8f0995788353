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
