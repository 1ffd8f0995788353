import numpy as np
import pytest

from cubic.core.config import Config
from cubic.core.spec import SpecError
from cubic.core.workloads import DEFAULT_WORKLOADS
from search.space import Space, load_space


def _space(params, **kw):
    return Space.model_validate({"name": "t", "parameters": params, **kw})


def test_default_space_per_workload_maps_to_configs_that_apply():
    space = load_space()
    for name in ("dlrm-small", "wukong-small", "dmt-small"):
        w = DEFAULT_WORKLOADS[name]
        sp = space.for_workload(w)
        pts = sp.enumerate()
        assert len({sp.key(p) for p in pts}) == len(pts) == sp.size()
        for p in pts[:: max(1, len(pts) // 7)]:
            cfg = sp.to_config(p)
            assert isinstance(cfg, Config) and cfg.batch_size == p["batch_size"]
            cfg.apply(w)  # knobs exist for this architecture
            assert sp.features(p).shape == (len(sp.feature_names()),)
    assert "model.num_layers" not in space.for_workload(DEFAULT_WORKLOADS["dlrm-small"]).param_names


def test_conditional_parameters_and_features():
    sp = _space([
        {"name": "fp8.policy", "type": "categorical", "choices": ["off", "budget"]},
        {"name": "fp8.budget_sqnr_db", "type": "float", "low": 10, "high": 40, "step": 10,
         "when": {"fp8.policy": ["budget"]}},
        {"name": "batch_size", "type": "int", "low": 64, "high": 4096, "log": True},
    ])
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(50):
        p = sp.sample(rng)
        assert ("fp8.budget_sqnr_db" in p) == (p["fp8.policy"] == "budget")
        assert 64 <= p["batch_size"] <= 4096 and isinstance(p["batch_size"], int)
        seen.add(p["fp8.policy"])
        assert sp.validate_point(p) == p
    assert seen == {"off", "budget"}
    cfg = sp.to_config({"fp8.policy": "budget", "fp8.budget_sqnr_db": 20.0, "batch_size": 128})
    assert cfg.fp8.policy == "budget" and cfg.fp8.budget_sqnr_db == 20.0
    f_off = sp.features({"fp8.policy": "off", "batch_size": 64})
    f_on = sp.features({"fp8.policy": "budget", "fp8.budget_sqnr_db": 40.0, "batch_size": 4096})
    names = sp.feature_names()
    assert f_off[names.index("fp8.budget_sqnr_db?")] == 0 and f_on[names.index("fp8.budget_sqnr_db?")] == 1
    assert f_off[names.index("batch_size")] == 0 and f_on[names.index("batch_size")] == pytest.approx(1)


def test_true_and_1_in_one_categorical_are_two_features():
    """In Python True == 1: a choice list holding both (Optuna's take both) lit both one-hot features
    for either value, so the proxy could not tell them apart."""
    sp = _space([{"name": "flag", "type": "categorical", "choices": [True, 1, "auto"]}])
    names = sp.feature_names()
    assert list(sp.features({"flag": True})) == [1.0, 0.0, 0.0]
    assert list(sp.features({"flag": 1})) == [0.0, 1.0, 0.0]
    assert len(names) == 3 and sp.validate_point({"flag": 1}) == {"flag": 1}


@pytest.mark.parametrize("params, field", [
    ([{"name": "a", "type": "categorical"}], "choices"),
    ([{"name": "a", "type": "int", "low": 5, "high": 2}], "low"),
    ([{"name": "a", "type": "float", "low": 0, "high": 1, "log": True}], "log"),
    ([{"name": "a", "type": "float", "low": 0, "high": 1, "when": {"b": [1]}}], "'b'"),
    ([{"name": "a", "type": "int", "low": 0, "high": 2}, {"name": "a", "type": "int", "low": 0, "high": 2}],
     "duplicated"),
    ([{"name": "a", "type": "bogus", "low": 0, "high": 1}], "parameters.0.type"),
])
def test_bad_space_files_name_the_field(tmp_path, params, field):
    import yaml

    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump({"version": 1, "parameters": params}))
    with pytest.raises(SpecError) as e:
        load_space(p)
    msg = str(e.value)
    assert str(p) in msg and field in msg and "\n" not in msg


def test_points_outside_the_space_and_unknown_config_fields_are_rejected():
    sp = _space([{"name": "batch_size", "type": "int", "low": 1, "high": 8},
                 {"name": "kernels.nope", "type": "categorical", "choices": ["x"]}])
    with pytest.raises(SpecError, match="batch_size"):
        sp.validate_point({"batch_size": 9, "kernels.nope": "x"})
    with pytest.raises(SpecError, match="zzz"):
        sp.validate_point({"batch_size": 2, "kernels.nope": "x", "zzz": 1})
    with pytest.raises(SpecError, match="kernels.nope"):
        sp.to_config({"batch_size": 2, "kernels.nope": "x"})


def test_neighbours_stay_in_the_space_and_stay_near():
    sp = _space([
        {"name": "fp8.policy", "type": "categorical", "choices": ["off", "budget"]},
        {"name": "fp8.budget_sqnr_db", "type": "float", "low": 10, "high": 40, "step": 10,
         "when": {"fp8.policy": ["budget"]}},
        {"name": "batch_size", "type": "int", "low": 64, "high": 4096, "log": True},
        {"name": "lr", "type": "float", "low": 1e-4, "high": 1e-1, "log": True},
        {"name": "width", "type": "categorical", "choices": [512, 64, 128, 256]},
    ])
    rng = np.random.default_rng(0)
    moved = set()
    for _ in range(300):
        p = sp.sample(rng)
        q = sp.neighbour(p, rng, 0.05)
        assert sp.validate_point(q) == q  # in range, on the grid, conditionals honoured
        assert isinstance(q["batch_size"], int)
        moved |= {k for k in q if q[k] != p.get(k)}
        # a small step on a numeric choice moves to an adjacent value by size, not by list position
        if q["width"] != p["width"]:
            order = [64, 128, 256, 512]
            assert abs(order.index(q["width"]) - order.index(p["width"])) == 1
        # a numeric parameter moves little on its log scale
        assert abs(np.log(q["lr"]) - np.log(p["lr"])) <= 6 * 0.05 * np.log(1e3)
    assert moved >= {"fp8.policy", "fp8.budget_sqnr_db", "batch_size", "lr", "width"}
