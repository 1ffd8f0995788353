"""experiments/sharding_rescale.py: the evidence for warning, not re-planning, when a plan's compute check fails."""

import json

import numpy as np
import pytest

from experiments import common
from experiments import sharding_rescale as sr
from sharding.estimate import LearnedEstimator, ScaledEstimator


def test_the_scaled_model_keeps_the_ranking_and_scales_every_figure():
    base = LearnedEstimator()
    X = np.abs(np.random.default_rng(0).normal(size=(5, 10))) * 1e4
    scaled = ScaledEstimator(base, 0.5)
    assert np.allclose(scaled.predict(X), 0.5 * base.predict(X)) and scaled.can_predict()
    assert "scaled x0.5" in scaled.describe()
    with pytest.raises(ValueError):
        ScaledEstimator(base, float("nan"))
    # the re-plan rule of `shard plan --rescale` and of the benchmark: the model at the check's scale
    from sharding.estimate import ComputeCheck

    check = ComputeCheck(ratio=2.0, rank_ratios=(2.0,), spearman=None, slowest_predicted=0, slowest_measured=0)
    assert ScaledEstimator.at_check(base, check).scale == 0.5


def _cell(model, gain):
    return {"model": model, "gap_as_is": 0.0, "gap_rescaled": gain, "gain": gain, "ratio": 1.5, "same_plan": False}


def test_a_gain_is_met_only_when_resolved_past_one_point():
    clear = [_cell("a", g) for g in (-0.03, -0.025, -0.035, -0.03)]
    noisy = [_cell("b", g) for g in (-0.08, 0.05, -0.04, 0.02)]
    summary, targets = sr.targets_of(clear + noisy, {"a": None, "b": None})
    (ka, ta), (kb, tb) = targets.items()
    assert ta["met"] is True and "reason" not in ta and ka.startswith("a model: ")
    assert ta["model"].startswith("trained on ")  # where it was trained: a field, so looks match by name
    assert tb["met"] is False and "not a resolved gain" in tb["reason"] and tb["ci95"][1] > sr.HELPS
    assert summary["a"]["cells"] == 4 and abs(summary["a"]["gain_mean"] + 0.03) < 1e-9


def test_each_model_is_named_by_where_it_was_trained_against_this_machine():
    from types import SimpleNamespace

    from cubic.core.fingerprint import fingerprint

    def est(fp):
        return SimpleNamespace(model=SimpleNamespace(meta_={"fingerprint": fp}))

    here = fingerprint("cpu")
    assert sr.model_origin(est(here)) == (f"trained on a machine of this fingerprint ({here['cpu_model']}, "
                                          f"{here['cpu_count']} cores)")
    other = {**fingerprint("cpu"), "cpu_model": "Some Other CPU"}
    assert sr.model_origin(est(other)) == "trained on another machine (Some Other CPU)"
    _, targets = sr.targets_of([_cell("x", -0.02)] * 3, {"x": est(other)})
    # where the model was trained is the target's field, not its name: a look on another machine matches it
    name, t = next(iter(targets.items()))
    assert name.startswith("x model: re-planning") and t["model"] == "trained on another machine (Some Other CPU)"


def test_a_short_real_run_writes_the_result(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    assert sr.main(["--quick", "--other-model", ""]) == 0
    out = json.loads((tmp_path / "sharding_rescale_quick.json").read_text())
    assert (tmp_path / "sharding_rescale_quick.png").exists() and list(out["models"]) == ["packaged"]
    assert len(out["cells"]) == 3 and all(c["ratio"] > 0 and len(c["gap_as_is_per_look"]) == 1 for c in out["cells"])
    assert not common.target_defects(out["targets"])
