import numpy as np
import pytest

from cost_models.proxy import EnsembleRegressor, FeasibilityClassifier, Proxy, kendall_tau


def _data(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 4))
    y = np.log(1 + 5 * X[:, 0]) + 0.7 * X[:, 1] ** 2 - 0.4 * X[:, 2] * X[:, 3]
    return X, y


@pytest.mark.parametrize("kind", ["xgboost", "mlp", "gp", "ridge"])
def test_each_family_ranks_held_out_points_and_reports_uncertainty(kind):
    X, y = _data(40, 0)
    Xt, yt = _data(200, 1)
    m = EnsembleRegressor(kind, n_members=3).fit(X, y)
    mu, sd = m.predict(Xt, return_std=True)
    assert mu.shape == sd.shape == (200,) and np.all(sd >= 0)
    assert kendall_tau(yt, mu) > 0.6
    assert sd.std() > 0  # the spread differs between points
    if kind != "xgboost":  # (trees extrapolate flat, so their spread cannot grow off the data)
        _, sd_in = m.predict(X, return_std=True)
        _, sd_out = m.predict(X + 3.0, return_std=True)
        assert sd_out.mean() > sd_in.mean()


def test_proxy_selects_by_cross_validated_kendall_tau_and_round_trips_json():
    X, y = _data(30, 2)
    p = Proxy(families=("xgboost", "gp"), n_members=3, cv_folds=3).fit(X, y)
    assert set(p.cv_tau_) == {"xgboost", "gp"}
    assert p.cv_tau_[p.selected_] == max(p.cv_tau_.values())
    Xt, yt = _data(100, 3)
    assert p.score(Xt, yt) > 0.6
    q = Proxy.from_json(p.to_json())
    assert q.selected_ == p.selected_ and np.allclose(q.predict(Xt), p.predict(Xt))


def test_feasibility_classifier_learns_where_runs_fail():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(60, 2))
    ok = X[:, 0] < 0.6  # e.g. OOM above a batch size
    clf = FeasibilityClassifier().fit(X, ok)
    assert clf.predict_proba([[0.1, 0.5]])[0] > 0.8 and clf.predict_proba([[0.95, 0.5]])[0] < 0.2
    only_ok = FeasibilityClassifier().fit(X[:5], [1] * 5)
    assert np.allclose(only_ok.predict_proba(X), 6 / 7)  # Laplace prior until a failure is seen


def test_bad_family_is_rejected():
    with pytest.raises(ValueError, match="unknown proxy family"):
        EnsembleRegressor("forest").fit(np.zeros((3, 1)), np.zeros(3))


def test_proxy_with_a_prior_column_learns_the_residual_and_ranks_from_few_points():
    # y = an analytical prediction (column 2) + a per-category offset the model does not know
    rng = np.random.default_rng(0)

    def data(n):
        cat = rng.integers(0, 2, n)
        prior = rng.uniform(0, 3, n)
        X = np.column_stack([cat == 0, cat == 1, prior]).astype(float)
        return X, prior + 0.5 * (cat == 1)

    X, y = data(4)
    Xt, yt = data(200)
    # trees on 4 points are piecewise constant: alone they cannot rank 200 new points
    with_prior = Proxy(families=("xgboost",), n_members=3, prior_column=2).fit(X, y)
    without = Proxy(families=("xgboost",), n_members=3).fit(X, y)
    assert with_prior.score(Xt, yt) > 0.9
    assert with_prior.score(Xt, yt) > without.score(Xt, yt) + 0.2
    # a gap in the prior (no prediction for that row) is filled, not propagated as NaN
    Xg = Xt[:3].copy()
    Xg[0, 2] = np.nan
    assert np.all(np.isfinite(with_prior.predict(Xg)))
    q = Proxy.from_json(with_prior.to_json())
    assert np.allclose(q.predict(Xt), with_prior.predict(Xt))


def test_the_gp_trains_on_a_seeded_subset_past_its_row_cap():
    """An exact GP is cubic in its rows: past ``gp_max_rows`` it trains on a seeded random subset
    (so proposals stay seconds at thousands of runs), and still ranks held-out points."""
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(400, 3))
    y = X @ np.array([2.0, -1.0, 0.5]) + 0.05 * rng.normal(size=400)
    a = EnsembleRegressor(kind="gp", gp_max_rows=60).fit(X, y)
    b = EnsembleRegressor(kind="gp", gp_max_rows=60).fit(X, y)
    assert a.members_[0].X_train_.shape[0] == 60
    assert np.array_equal(a.members_[0].X_train_, b.members_[0].X_train_)
    Xt = rng.uniform(size=(50, 3))
    assert kendall_tau(Xt @ np.array([2.0, -1.0, 0.5]), a.predict(Xt)) > 0.8
    assert EnsembleRegressor(kind="gp", gp_max_rows=1000).fit(X[:100], y[:100]).members_[0].X_train_.shape[0] == 100


def test_a_fallback_family_is_kept_unless_cv_shows_another_ranks_clearly_better():
    rng = np.random.default_rng(3)
    X = rng.uniform(size=(40, 3))
    noise = rng.normal(size=40)  # nothing to rank: every CV tau is near 0
    picked = Proxy(families=("ridge", "xgboost", "gp"), fallback="gp").fit(X, noise)
    assert max(picked.cv_tau_.values()) < 0.3 and picked.selected_ == "gp"
    # a step function: trees rank it, the smooth GP less so; the margin is CV's to show
    y = (X[:, 0] > 0.5).astype(float) * 3 + 0.1 * X[:, 1]
    p = Proxy(families=("xgboost", "gp"), fallback="gp").fit(X, y)
    clear = p.cv_tau_["xgboost"] - p.cv_tau_["gp"] >= 0.1 and p.cv_tau_["xgboost"] >= 0.3
    assert p.selected_ == ("xgboost" if clear else "gp")


def _bumps(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    # a 6-D sum of four narrow Gaussian bumps (hartmann6's shape): few runs see little of it
    brng = np.random.default_rng(11)
    A, P, a = brng.uniform(1, 15, size=(4, 6)), brng.uniform(size=(4, 6)), np.array([1.0, 1.2, 3.0, 3.2])
    X = rng.uniform(size=(n, 6))
    return X, (a * np.exp(-(A[None] * (X[:, None, :] - P[None]) ** 2).sum(-1))).sum(-1)


def test_the_gp_fits_its_hyperparameters_under_priors_and_ranks_better_from_few_runs():
    """With a handful of runs the likelihood alone sends length scales to their bounds; the GP
    family fits them by MAP under Optuna GPSampler's priors, and ranks unseen points better."""
    from sklearn.gaussian_process import GaussianProcessRegressor

    lo, hi = np.log(1e-2), np.log(1e3)
    taus_map, taus_ml = [], []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        X, y = _bumps(10, rng)
        Xt, yt = _bumps(300, rng)
        m = EnsembleRegressor(kind="gp").fit(X, y)
        theta = m.members_[0].kernel_.theta[1:-1]  # log length scales (standardized inputs)
        assert np.all((theta > lo + 0.05) & (theta < hi - 0.05)), theta
        taus_map.append(kendall_tau(yt, m.predict(Xt)))
        ml = GaussianProcessRegressor(kernel=m.members_[0].kernel, n_restarts_optimizer=1, random_state=0)
        ml.fit(m.x_scaler_.transform(X), (y - m.y_mean_) / m.y_std_)
        taus_ml.append(kendall_tau(yt, ml.predict(m.x_scaler_.transform(Xt))))
    assert np.mean(taus_map) > np.mean(taus_ml) + 0.05, (taus_map, taus_ml)


def test_rank_agreement_tests_tau_against_a_proxy_that_ranks_at_random():
    from cost_models.proxy import rank_agreement
    from cost_models.proxy import tau_evidence

    y = np.arange(10.0)
    tau, p = rank_agreement(y, y + 0.1)
    assert tau == pytest.approx(1.0) and p < 1e-5
    assert tau_evidence(tau, p, 10).endswith("the proxy ranks better than chance")
    # a moderate tau over few runs: the figure alone would read as skill
    tau, p = rank_agreement([1, 2, 3, 4, 5, 6, 7, 8], [2, 1, 5, 3, 4, 8, 6, 7][::-1])
    assert tau < 0 and p > 0.5
    tau, p = rank_agreement([1, 2, 3, 4, 5, 6, 7, 8], [5, 1, 3, 2, 8, 4, 7, 6])
    assert 0.3 < tau < 0.7 and p > 0.05
    assert "not distinguishable from a proxy that ranks at random" in tau_evidence(tau, p, 8)
    assert rank_agreement([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) == (0.0, 1.0)  # undefined: no evidence
    assert rank_agreement([1.0, 2.0], [1.0, 2.0])[1] == 1.0  # two runs test nothing


def test_cross_validated_taus_carry_their_p_and_the_listing_says_whether_the_chosen_family_ranks():
    from cost_models.proxy import cv_tau_text

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(12, 2))
    p = Proxy(families=("ridge", "gp"), n_members=2).fit(X, X[:, 0] + 0.01 * rng.normal(size=12))
    assert set(p.cv_p_) == set(p.cv_tau_) == {"ridge", "gp"}
    assert p.cv_p_["ridge"] < 0.05  # a linear signal under little noise: shown, not only a figure
    assert Proxy.from_json(p.to_json()).cv_p_ == p.cv_p_
    line = cv_tau_text({"family": "gp", "cv_tau": {"gp": 0.3, "ridge": 0.9}, "cv_p": {"gp": 0.12, "ridge": 1e-4}})
    assert line == ("CV Kendall tau, one-sided p: gp 0.30 (p 0.12), ridge 0.90 (p 0.0001); "
                    "gp: not distinguishable from a proxy that ranks at random")
    assert cv_tau_text({"family": "gp", "cv_tau": {"gp": 0.3}}) == "CV Kendall tau, one-sided p: gp 0.30"
    assert cv_tau_text({"family": "ridge"}) == "CV Kendall tau: not cross-validated"


def test_one_failure_among_few_runs_marks_its_neighbourhood_when_local():
    """Stop 65 noticed: with 8 runs and 1 crash XGBoost cannot split (each leaf needs a hessian of 1), so
    P(feasible) was the base rate everywhere and a search proposed the crashed point again and again."""
    X = np.array([[4.412, 2.211], [3.109, 1.604], [0.372, 0.846], [3.187, 1.408], [4.29, 0.0],
                  [3.536, 0.0], [3.422, 5.0], [4.02, 1.142], [5.0, 1.124]]) / 5.0
    ok = [1] * 8 + [0]
    clf = FeasibilityClassifier(local=True).fit(X, ok)
    assert clf.predict_proba([[5.0 / 5, 1.126 / 5]])[0] < 0.4  # a hair from the crash
    assert clf.predict_proba([[3.1 / 5, 1.6 / 5]])[0] > 0.7  # among successes: as before
    assert np.all(clf.near_failures(X[:8]) <= 1.0) and clf.near_failures([[0.62, 0.5]])[0] == 1.0
    # off by default (a space with constraints learns failures from their metrics): XGBoost's answer alone
    plain = FeasibilityClassifier().fit(X, ok)
    np.testing.assert_array_equal(plain.predict_proba(X), plain.model_.predict_proba(X)[:, 1])


def test_the_kernel_weighs_only_the_rows_it_is_given():
    X = np.array([[0.0], [0.3], [0.6], [1.0]])
    ok = [1, 1, 1, 0]
    both = FeasibilityClassifier(local=True).fit(X, ok)
    stopped = FeasibilityClassifier(local=True).fit(X, ok, kernel_rows=[True, True, True, False])
    assert both.near_failures([[0.99]])[0] < 0.5 and stopped.near_failures([[0.99]])[0] == 1.0
