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
    here = dict(CommModel.calibrated(CALIBRATION_PATH).origin)["this_machine"]
    assert ("NOT this machine" in how) == (not here) and "calibration of this machine" not in how


def test_missed_reasons_name_a_model_from_another_machine():
    targets = {"a": {"met": False, "reason": "model error"}, "b": {"met": True}, "c": {"met": False, "reason": "x"}}
    sb.name_foreign_model(targets, "the cost model was trained on AMD EPYC")
    assert targets["a"]["reason"] == "model error; the cost model was trained on AMD EPYC"
    assert "reason" not in targets["b"]
    sb.name_foreign_model(targets, None)  # trained here: nothing added
    assert targets["c"]["reason"] == "x; the cost model was trained on AMD EPYC"
