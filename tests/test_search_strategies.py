"""search.strategies: the Strategy surface, and feasibility in every pick of cubic's loop."""

import math

import numpy as np
import pytest

from cubic.core.result import Result
from search.space import Space
from search.strategies import (
    GP_ONLY_BELOW,
    Observation,
    Prediction,
    ProxyGuided,
    RandomSearch,
    SearchContext,
    Strategy,
    Surrogate,
    acquisition,
    log_expected_improvement,
    one_factor_design,
    select_batch,
)

SPACE = Space.model_validate({
    "objectives": [{"metric": "tput", "direction": "maximize"}],
    "constraints": [{"name": "memory", "metric": "mem", "max": 10.0}],
    "parameters": [{"name": "b", "type": "int", "low": 1, "high": 20},
                   {"name": "k", "type": "categorical", "choices": ["a", "b"]}]})


def _toy(p):
    """Throughput rises with b; memory = b, so b > 10 breaks the limit and b > 14 runs out of memory."""
    b = p["b"]
    if b > 14:
        return Observation(p, Result.failed("oom", "out of memory", metrics={"mem": float(b)}))
    return Observation(p, Result(status="ok", metrics={"tput": b * (1.2 if p["k"] == "b" else 1.0), "mem": float(b)}),
                       violation=max(0.0, b - 10.0))


def test_strategy_is_abstract_and_must_be_bound():
    with pytest.raises(TypeError):
        Strategy()
    with pytest.raises(RuntimeError, match="bind"):
        RandomSearch().propose([], 2)
    props = RandomSearch().bind(SearchContext(SPACE, seed=3)).propose([], 4)
    assert len({SPACE.key(p.point) for p in props}) == 4


def test_fit_is_read_only_and_state_round_trips():
    s = ProxyGuided(n_init=4, n_inner=32, families=("ridge",)).bind(SearchContext(SPACE, seed=1))
    hist = [_toy(p) for p in (dict(b=b, k=k) for b in (2, 5, 8, 12, 16) for k in "ab")]
    s.propose(hist, 2)
    assert s.fit_["family"] == "ridge" and s.fit_["n_train"] == 8
    with pytest.raises(AttributeError):
        s.fit_ = {}
    t = ProxyGuided(n_init=4, n_inner=32, families=("ridge",))
    t.load_state_dict(s.state_dict())
    assert t.fit_ == s.fit_ and t.state_dict() == s.state_dict()


def test_ooms_train_the_feasibility_model_whatever_they_report():
    """An OOM that reports its peak memory was dropped from the feasibility model before; now every
    failure is a negative example, and an OOM without a memory figure still teaches the memory model."""
    hist = [_toy(dict(b=b, k=k)) for b in range(1, 21) for k in "ab"]
    hist += [Observation(dict(b=b, k="a"), Result.failed("oom", "out of memory")) for b in (17, 19)]  # no metric at all
    sur = Surrogate(SPACE, families=("ridge",)).fit(hist)
    ok_pred = sur.predict([dict(b=3, k="a")], {}).p_feasible[0]
    oom_pred = sur.predict([dict(b=19, k="b")], {}).p_feasible[0]
    assert ok_pred > 0.5 > oom_pred
    # the classifier alone (without the memory model) already says the OOM region fails
    X = sur.features([dict(b=19, k="b")], [{}])
    assert sur.feasibility_.predict_proba(X)[0] < 0.5
    (c, mem_model, _), = sur.constraints_
    assert len(mem_model.y_train_) == len(hist)  # the two OOMs without a memory figure included


def test_log_ei_is_finite_where_ei_underflows():
    mu, sd = np.array([-60.0, -40.0, 0.0]), np.array([1.0, 1.0, 1.0])
    lei = log_expected_improvement(mu, sd, best=0.0)
    assert np.all(np.isfinite(lei)) and lei[0] < lei[1] < lei[2]
    from scipy.stats import norm

    z = -3.0
    assert math.isclose(log_expected_improvement(np.array([z]), np.array([1.0]), 0.0)[0],
                        math.log(z * norm.cdf(z) + norm.pdf(z)), rel_tol=1e-9)


def test_a_point_predicted_infeasible_is_never_picked_while_likely_feasible_ones_remain():
    rng = np.random.default_rng(0)
    n = 40
    X = rng.uniform(size=(n, 3))
    p_ok = np.where(np.arange(n) < 6, 0.9, 0.05)  # 6 likely feasible, 34 predicted infeasible
    # the infeasible ones look far better by EI -- and EI underflows for the feasible ones
    pred = Prediction(X, mu=np.where(p_ok > 0.5, -80.0, 5.0)[:, None], sd=np.ones((n, 1)), p_feasible=p_ok)
    log_acq = acquisition(pred, best=[0.0])
    picks = select_batch(X, log_acq, 8, p_feasible=p_ok, exploit=np.where(p_ok >= 0.5, pred.mu[:, 0], -np.inf),
                         n_exploit=2)
    assert set(picks[:6]) == set(range(6))  # every likely-feasible candidate before any other
    assert len(set(picks)) == 8
    # and among likely-feasible candidates whose EI is 0 in floating point, P(feasible) still ranks
    p2 = np.array([0.6, 0.99, 0.7, 0.2])
    pred2 = Prediction(X[:4], mu=np.full((4, 1), -100.0), sd=np.ones((4, 1)), p_feasible=p2)
    assert select_batch(X[:4], acquisition(pred2, best=[0.0]), 1, p_feasible=p2)[0] == 1


def test_proxy_guided_on_a_binding_memory_limit_rarely_proposes_infeasible_points():
    s = ProxyGuided(n_init=6, n_inner=64, families=("ridge", "xgboost")).bind(SearchContext(SPACE, seed=2))
    hist = []
    while len(hist) < 24:
        props = s.propose(hist, 3)
        hist += [_toy(p.point) for p in props]
    later = hist[6:]
    assert sum(not o.feasible for o in later) <= 0.2 * len(later)
    assert max(o.metrics.get("tput", 0) for o in hist if o.feasible) == pytest.approx(12.0)  # b=10, k=b


def test_the_local_inner_search_refines_near_the_best_run():
    """On a smooth objective whose optimum is inside the box, the default inner search (random +
    local walks) puts candidates closer to the best run than its random part alone does, and
    proposals are reproducible from seed and history."""
    space = Space.model_validate({
        "objectives": [{"metric": "y", "direction": "maximize", "scale": "linear"}],
        "parameters": [{"name": f"x{i}", "type": "float", "low": 0.0, "high": 1.0} for i in range(4)]})
    rng = np.random.default_rng(0)

    def run(p):
        return Observation(p, Result(status="ok", metrics={"y": -sum((p[f"x{i}"] - 0.3) ** 2 for i in range(4))}))

    hist = [run(space.sample(rng)) for _ in range(20)]
    best = max(hist, key=lambda o: o.result.metrics["y"]).point
    s = ProxyGuided("local", n_inner=64, families=("gp",)).bind(SearchContext(space, seed=0))
    sur = s._fit_surrogate(hist, {})
    taken = {space.key(o.point) for o in hist}
    top = [max(o.result.metrics["y"] for o in hist)]
    pool = s._local_search(sur, top, taken, hist)
    random_part = list(s._candidates(taken, s._rng(hist, 5), 4 * s.n_inner).values())
    assert len(pool) > len(random_part)

    def nearest(points):
        return min(sum((p[f"x{i}"] - best[f"x{i}"]) ** 2 for i in range(4)) for p in points)

    assert nearest(pool) < 0.25 * nearest(random_part)
    a = [p.point for p in s.propose(hist, 4)]
    b = [p.point for p in ProxyGuided("local", n_inner=64, families=("gp",)).bind(
        SearchContext(space, seed=0)).propose(hist, 4)]
    assert a == b and len({space.key(p) for p in a}) == 4 and not ({space.key(p) for p in a} & taken)


def test_without_a_prior_the_gp_alone_is_fitted_until_cv_has_enough_runs():
    """CV over fewer than GP_ONLY_BELOW runs picks a family on noise: the GP alone is fitted then,
    and CV chooses among all families after; a prior lifts the rule."""
    space = Space.model_validate({
        "objectives": [{"metric": "y", "direction": "maximize", "scale": "linear"}],
        "parameters": [{"name": f"x{i}", "type": "float", "low": 0.0, "high": 1.0} for i in range(3)]})
    rng = np.random.default_rng(1)

    def run(p):
        return Observation(p, Result(status="ok", metrics={"y": sum((i + 1) * p[f"x{i}"] for i in range(3))}))

    hist = [run(space.sample(rng)) for _ in range(GP_ONLY_BELOW + 10)]
    families = ("ridge", "gp")
    early = ProxyGuided("local", n_inner=32, families=families).bind(SearchContext(space, seed=0))
    sur = early._fit_surrogate(hist[:GP_ONLY_BELOW - 1], {})
    assert sur.selected_ == "gp" and "ridge" not in (sur.cv_tau_ or {})  # not even cross-validated
    late = ProxyGuided("local", n_inner=32, families=families).bind(SearchContext(space, seed=0))
    assert set(late._fit_surrogate(hist[:GP_ONLY_BELOW], {}).cv_tau_) == set(families)
    prior = ProxyGuided("local", n_inner=32, families=families).bind(SearchContext(space, seed=0))
    assert set(prior._fit_surrogate(hist[:GP_ONLY_BELOW - 1], {"y": 0}).cv_tau_) == set(families)


def test_one_factor_design_changes_one_knob_of_the_priors_pick_each():
    """The prior's best, then per knob its best alternative differing in that knob alone, the knobs
    whose alternative the prior rates closest first; a conditional knob appearing with its parent is
    not a second change, and points the prior expects to fail are never picked."""
    space = Space.model_validate({
        "objectives": [{"metric": "tput", "direction": "maximize"}],
        "parameters": [{"name": "batch", "type": "categorical", "choices": [1, 2, 4]},
                       {"name": "dtype", "type": "categorical", "choices": ["fp32", "bf16"]},
                       {"name": "fp8", "type": "categorical", "choices": ["off", "all"]},
                       {"name": "recipe", "type": "categorical", "choices": ["t", "r"], "when": {"fp8": ["all"]}}]})
    cands = space.enumerate()

    def prior_of(p):  # batch 4 best, bf16 a little better, fp8 much worse, recipe r a hair better than t
        return (math.log(p["batch"]) + 0.05 * (p["dtype"] == "bf16") - 1.0 * (p["fp8"] == "all")
                + 0.01 * (p.get("recipe") == "r"))

    prior = np.array([prior_of(p) for p in cands])
    ok = np.array([not (p["batch"] == 2 and p["dtype"] == "bf16") for p in cands])  # predicted to fail
    picks = [cands[j] for j in one_factor_design(space, cands, prior, ok, 4)]
    assert picks[0] == {"batch": 4, "dtype": "bf16", "fp8": "off"}
    # dtype (0.05 below) before fp8 (1.0 below, recipe r) before batch (its bf16 neighbour at 2 fails: batch 1)
    assert picks[1:] == [{"batch": 4, "dtype": "fp32", "fp8": "off"},
                         {"batch": 4, "dtype": "bf16", "fp8": "all", "recipe": "r"},
                         {"batch": 1, "dtype": "bf16", "fp8": "off"}]
    assert [cands[j] for j in one_factor_design(space, cands, prior, ok, 2)] == picks[:2]
