"""The campaign's proxy: learned predictors of a run's metrics, with uncertainty, and feasibility.

CubicML (arXiv 2409.04585) replaces most real runs by a learned predictor trained on the runs made
so far. Here:

- :class:`EnsembleRegressor` - one model family as an ensemble whose spread is the uncertainty:
  ``xgboost`` (bootstrapped gradient-boosted trees, one seed per member), ``mlp`` (a small torch
  MLP deep ensemble: members differ by initialisation), ``gp`` (scikit-learn Gaussian process,
  whose posterior std is the uncertainty; exact, so past ``GP_MAX_ROWS`` runs it trains on a
  seeded random subset of them).
  ``ridge`` (scikit-learn Bayesian ridge regression: linear in the features, posterior std; the
  only family that extrapolates a trend from a handful of runs, e.g. "larger batch, faster").
- :class:`Proxy` - picks among families by cross-validated Kendall tau (rank accuracy is what a
  search needs: it only has to order configurations), then refits the winner on all data.
- :class:`FeasibilityClassifier` - P(run succeeds) from configurations that failed (OOM, timeout,
  NaN, violated constraints) and those that did not; XGBoost once both classes are seen.

All follow scikit-learn's API. Persistence is JSON (:meth:`Proxy.to_json`): the training data and
hyperparameters, from which :meth:`Proxy.from_json` refits the identical model (every member is
seeded), so no pickle ever crosses a trust boundary.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from scipy.stats import kendalltau
from sklearn.base import BaseEstimator
from sklearn.preprocessing import StandardScaler

FAMILIES = ("xgboost", "mlp", "gp", "ridge")
GP_MAX_ROWS = 500  # runs an exact GP trains on (a seeded random subset past that)


def kendall_tau(y_true, y_pred) -> float:
    """Kendall's tau-b; 0 where undefined (constant inputs)."""
    if len(y_true) < 2:
        return 0.0
    tau = kendalltau(np.asarray(y_true), np.asarray(y_pred)).statistic
    return 0.0 if tau is None or not np.isfinite(tau) else float(tau)


def rank_agreement(y_true, y_pred) -> tuple[float, float]:
    """Kendall's tau-b and its one-sided p-value against a proxy that ranks no better than chance
    (scipy's test, ``alternative="greater"``): a tau of 0.38 over 8 runs has p ~0.1, so the figure
    alone does not show the proxy ranks. p is 1.0 where the test is undefined (constant inputs)."""
    tau = kendall_tau(y_true, y_pred)
    if len(y_true) < 3:
        return tau, 1.0
    p = kendalltau(np.asarray(y_true), np.asarray(y_pred), alternative="greater").pvalue
    return tau, 1.0 if p is None or not np.isfinite(p) else float(p)


TAU_ALPHA = 0.05  # a proxy's ranking counts as shown when its one-sided p is below this


def rank_verdict(p: float) -> str:
    return ("the proxy ranks better than chance" if p < TAU_ALPHA else
            "not distinguishable from a proxy that ranks at random")


def tau_evidence(tau: float, p: float, n: int) -> str:
    """What a Kendall tau over n runs shows: the figure alone reads as skill at any n."""
    return f"Kendall tau {tau:.2f} over {n} runs, one-sided p {p:.2g}: {rank_verdict(p)}"


def cv_tau_text(fit: dict[str, Any]) -> str:
    """Each family's cross-validated Kendall tau with its one-sided p against a proxy that ranks at
    random, and the verdict on the chosen family (a strategy's ``fit_``: family, cv_tau, cv_p): over a
    dozen runs a tau of 0.3 is often chance."""
    taus, ps = fit.get("cv_tau") or {}, fit.get("cv_p") or {}
    if not taus:
        return "CV Kendall tau: not cross-validated"
    parts = ", ".join((f"{k} {v:.2f}" if isinstance(v, (int, float)) else f"{k} {v}")
                      + (f" (p {ps[k]:.2g})" if isinstance(ps.get(k), (int, float)) else "")
                      for k, v in taus.items())
    p = ps.get(fit.get("family"))
    verdict = f"; {fit.get('family')}: {rank_verdict(p)}" if isinstance(p, (int, float)) else ""
    return f"CV Kendall tau, one-sided p: {parts}{verdict}"  # a store from before p was kept: taus alone


def finite_column_means(X: np.ndarray) -> np.ndarray:
    """Per column, the mean of its finite entries (0 for a column with none): what fills a gap,
    i.e. a feature an analytical model could not give (e.g. no throughput for a predicted OOM)."""
    finite = np.isfinite(X)
    return np.where(finite, X, 0.0).sum(axis=0) / np.maximum(finite.sum(axis=0), 1)


def fill_gaps(X: np.ndarray, means: np.ndarray | None = None) -> np.ndarray:
    """X with non-finite entries set to ``means`` (default: X's own finite column means)."""
    bad = ~np.isfinite(X)
    if not bad.any():
        return X
    return np.where(bad, (finite_column_means(X) if means is None else means)[None, :], X)


class EnsembleRegressor(BaseEstimator):
    """One model family as an ensemble; ``predict(X, return_std=True)`` gives mean and spread."""

    def __init__(self, kind: str = "xgboost", n_members: int = 5, random_state: int = 0,
                 mlp_hidden: int = 64, mlp_epochs: int = 200, xgb_estimators: int = 100,
                 gp_max_rows: int = GP_MAX_ROWS):
        self.kind = kind
        self.n_members = n_members
        self.random_state = random_state
        self.mlp_hidden = mlp_hidden
        self.mlp_epochs = mlp_epochs
        self.xgb_estimators = xgb_estimators
        # an exact GP costs O(rows^3) per step of its hyperparameter fit: past this many runs it
        # trains on a seeded random subset of them (the other families see every run), so a
        # campaign of thousands of runs still proposes in seconds (10,000 runs did not within 300 s)
        self.gp_max_rows = gp_max_rows

    def fit(self, X, y) -> "EnsembleRegressor":
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if X.ndim != 2 or len(X) != len(y) or len(y) == 0:
            raise ValueError(f"X must be 2-D with one row per target (got {X.shape} and {y.shape})")
        if self.kind not in FAMILIES:
            raise ValueError(f"unknown proxy family {self.kind!r} (known: {', '.join(FAMILIES)})")
        self.x_scaler_ = StandardScaler().fit(X)  # constant columns keep scale 1
        self.y_mean_ = float(y.mean())
        self.y_std_ = float(y.std()) or 1.0
        Xs, ys = self.x_scaler_.transform(X), (y - self.y_mean_) / self.y_std_
        self.members_ = getattr(self, f"_fit_{self.kind}")(Xs, ys)
        self.n_features_in_ = X.shape[1]
        return self

    def _fit_xgboost(self, X, y):
        import xgboost as xgb

        members = []
        for i in range(self.n_members):
            rng = np.random.default_rng(self.random_state * 1009 + i)
            # bootstrap rows so that members disagree where data is thin: that spread is the uncertainty
            idx = rng.integers(0, len(y), len(y)) if self.n_members > 1 else np.arange(len(y))
            m = xgb.XGBRegressor(n_estimators=self.xgb_estimators, max_depth=4, learning_rate=0.08,
                                 subsample=0.8, colsample_bytree=0.8, min_child_weight=1.0, reg_lambda=1.0,
                                 # exact: fastest on tens of rows; histograms past a thousand
                                 tree_method="exact" if len(y) <= 1000 else "hist",
                                 random_state=self.random_state * 1009 + i, n_jobs=1)
            m.fit(X[idx], y[idx])
            members.append(m)
        return members

    def _fit_mlp(self, X, y):
        import torch

        # all members train at once as one batched network (weights [members, in, out]): on tiny
        # data the cost is per-step overhead, so M members cost about as much as one
        M, d, h = self.n_members, X.shape[1], self.mlp_hidden
        Xt = torch.as_tensor(X, dtype=torch.float32).expand(M, -1, -1)
        yt = torch.as_tensor(y, dtype=torch.float32).expand(M, -1)
        gen = torch.Generator().manual_seed(self.random_state)

        def init(fan_in, fan_out):
            bound = 1.0 / fan_in ** 0.5
            w = (torch.rand(M, fan_in, fan_out, generator=gen) * 2 - 1) * bound
            b = (torch.rand(M, 1, fan_out, generator=gen) * 2 - 1) * bound
            return w.requires_grad_(), b.requires_grad_()

        params = [*init(d, h), *init(h, h), *init(h, 1)]
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny GEMMs: threading only adds overhead on a shared machine
        try:
            opt = torch.optim.Adam(params, lr=1e-2, weight_decay=1e-3)
            for _ in range(self.mlp_epochs):  # full batch: tens to hundreds of rows
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(_mlp_forward(params, Xt), yt)
                loss.backward()
                opt.step()
        finally:
            torch.set_num_threads(threads)
        return [tuple(p.detach() for p in params)]
    def _fit_gp(self, X, y):
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        kernel = ConstantKernel(1.0) * Matern(length_scale=np.ones(X.shape[1]), nu=2.5,
                                              length_scale_bounds=(1e-2, 1e3)) + WhiteKernel(1e-2, (1e-6, 1.0))
        gp = GaussianProcessRegressor(kernel=kernel, normalize_y=False, n_restarts_optimizer=1,
                                      random_state=self.random_state,
                                      optimizer=MapHyperparameters())
        if len(y) > self.gp_max_rows:
            rows = np.random.default_rng(self.random_state).choice(len(y), self.gp_max_rows, replace=False)
            X, y = X[rows], y[rows]
        with warnings.catch_warnings():  # convergence chatter on tiny data sets
            warnings.simplefilter("ignore")
            gp.fit(X, y)
        return [gp]

    def _fit_ridge(self, X, y):
        from sklearn.linear_model import BayesianRidge

        return [BayesianRidge().fit(X, y)]

    def predict(self, X, return_std: bool = False):
        X = self.x_scaler_.transform(np.asarray(X, dtype=np.float64))
        if self.kind in ("gp", "ridge"):
            mu, sd = self.members_[0].predict(X, return_std=True)
        else:
            preds = np.concatenate([np.atleast_2d(self._member_predict(m, X)) for m in self.members_])
            mu, sd = preds.mean(axis=0), preds.std(axis=0)
        mu = mu * self.y_std_ + self.y_mean_
        sd = sd * self.y_std_
        return (mu, sd) if return_std else mu

    def _member_predict(self, m, X):
        if self.kind == "mlp":
            import torch

            M = m[0].shape[0]
            with torch.no_grad():
                out = _mlp_forward(m, torch.as_tensor(X, dtype=torch.float32).expand(M, -1, -1))
            return out.double().numpy()  # [members, rows]
        return m.predict(X)


class MapHyperparameters:
    """The GP's hyperparameters by maximum a posteriori instead of maximum likelihood, under the
    priors of Optuna's GPSampler (``optuna._gp.prior.default_log_prior``, re-expressed for
    scikit-learn's kernel ``C * Matern(l) + White(n)``): log p = -(0.1 / lambda + 0.1 lambda) on each
    inverse squared length scale lambda, Gamma(2, 1) on the kernel scale C, Gamma(1.1, 30) on the
    noise n. Optuna's mode is length 1 on a [0, 1] input; the inputs here are standardized, so
    the mode is sqrt(12), length 1 on a feature of uniform spread (std 1/sqrt(12)), and it follows
    the runs' spread. Why: with tens of runs the likelihood alone sends length scales to their
    bounds (on hartmann6 with 8 runs two of six went to 1e3, and the GP ranked unseen points at
    Kendall tau 0.15; 0.27 with the priors). A scikit-learn ``optimizer`` callable."""

    MODE = 12 ** 0.5

    def __call__(self, obj_func, initial_theta, bounds):
        from scipy.optimize import minimize

        def neg_log_posterior(theta):
            nll, grad = obj_func(theta, eval_gradient=True)  # -log marginal likelihood and its gradient
            c, n = math.exp(theta[0]), math.exp(theta[-1])
            r2 = (np.exp(theta[1:-1]) / self.MODE) ** 2  # squared length scales over the mode's
            grad = np.array(grad, dtype=np.float64)
            grad[0] += c - 1.0
            grad[1:-1] += 0.2 * r2 - 0.2 / r2
            grad[-1] += 30.0 * n - 0.1
            return nll + (c - theta[0]) + float(np.sum(0.1 * r2 + 0.1 / r2)) + (30.0 * n - 0.1 * theta[-1]), grad

        res = minimize(neg_log_posterior, initial_theta, jac=True, method="L-BFGS-B", bounds=bounds)
        return res.x, float(res.fun)


def _mlp_forward(params, X):
    import torch

    w1, b1, w2, b2, w3, b3 = params
    h = torch.nn.functional.silu(torch.baddbmm(b1, X, w1))
    h = torch.nn.functional.silu(torch.baddbmm(b2, h, w2))
    return torch.baddbmm(b3, h, w3).squeeze(-1)


class Proxy(BaseEstimator):
    """Model selection by cross-validated Kendall tau over families, then a refit on all data."""

    def __init__(self, families: tuple[str, ...] = FAMILIES, n_members: int = 5, cv_folds: int = 4,
                 random_state: int = 0, mlp_epochs: int = 200, prior_column: int | None = None,
                 fallback: str | None = None, fallback_margin: float = 0.1, min_cv_tau: float = 0.3):
        self.families = families
        self.n_members = n_members
        self.cv_folds = cv_folds
        self.random_state = random_state
        self.mlp_epochs = mlp_epochs
        # a family kept unless CV shows another ranks: the best family must reach ``min_cv_tau`` and
        # beat the fallback's tau by ``fallback_margin``; CV taus from a few dozen runs are noisy,
        # and a noisy pick of a family that extrapolates (ridge to a corner, trees flat) costs runs
        self.fallback = fallback
        self.fallback_margin = fallback_margin
        self.min_cv_tau = min_cv_tau
        # a column of X holding an analytical model's prediction of y (e.g. the step model's log
        # throughput): the families then learn the residual y - prior, and predict prior + residual,
        # so that with little data the proxy ranks like the model and data corrects it where it errs
        self.prior_column = prior_column

    def _make(self, kind: str) -> EnsembleRegressor:
        return EnsembleRegressor(kind=kind, n_members=self.n_members, random_state=self.random_state,
                                 mlp_epochs=self.mlp_epochs)

    def _prior(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(X with gaps filled by the training means, the prior per row; zeros without a prior)."""
        X = fill_gaps(X, self.fill_)
        return X, (X[:, self.prior_column] if self.prior_column is not None else np.zeros(len(X)))

    def fit(self, X, y) -> "Proxy":
        from sklearn.model_selection import KFold

        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        self.fill_ = finite_column_means(X)
        self.X_train_, self.y_train_ = X, y  # as given (to_json refits from them)
        X, prior = self._prior(X)
        y = y - prior
        self.cv_tau_: dict[str, float] = {}
        self.cv_p_: dict[str, float] = {}  # each tau's one-sided p against a proxy that ranks at random
        folds = min(self.cv_folds, len(y))
        if len(self.families) > 1 and len(y) >= 6:
            kf = KFold(n_splits=folds, shuffle=True, random_state=self.random_state)
            for kind in self.families:
                oof = np.zeros_like(y)
                for tr, te in kf.split(X):
                    oof[te] = self._make(kind).fit(X[tr], y[tr]).predict(X[te])
                # rank of the target, not the residual
                self.cv_tau_[kind], self.cv_p_[kind] = rank_agreement(y + prior, oof + prior)
            # ties go to the earlier family in `families`
            self.selected_ = max(self.families, key=lambda k: (self.cv_tau_[k], -self.families.index(k)))
            fb = self.fallback
            if fb in self.cv_tau_ and (self.cv_tau_[self.selected_] < self.min_cv_tau
                                       or self.cv_tau_[self.selected_] - self.cv_tau_[fb] < self.fallback_margin):
                self.selected_ = fb
        else:
            self.selected_ = self.families[0]
            if "ridge" in self.families and len(y) < 6:
                self.selected_ = "ridge"  # from a handful of points only a linear trend is identifiable
        self.model_ = self._make(self.selected_).fit(X, y)
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X, return_std: bool = False):
        X, prior = self._prior(np.asarray(X, dtype=np.float64))
        if not return_std:
            return self.model_.predict(X) + prior
        mu, sd = self.model_.predict(X, return_std=True)
        return mu + prior, sd

    def score(self, X, y) -> float:
        """Kendall tau of predictions against ``y`` (what the campaign selects by)."""
        return kendall_tau(y, self.predict(X))

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "params": {**self.get_params(), "families": list(self.families)},
                "selected": self.selected_, "cv_tau": self.cv_tau_, "cv_p": self.cv_p_,
                "X": self.X_train_.tolist(), "y": self.y_train_.tolist()}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Proxy":
        params = dict(doc["params"])
        params["families"] = (doc["selected"],)  # refit only the family chosen at save time
        p = cls(**params).fit(np.asarray(doc["X"]), np.asarray(doc["y"]))
        p.cv_tau_ = doc.get("cv_tau", {})
        p.cv_p_ = doc.get("cv_p", {})
        return p


class FeasibilityClassifier(BaseEstimator):
    """P(a configuration runs and meets the constraints). Until both outcomes have been seen the
    prior is the observed success rate (Laplace-smoothed), the same for every configuration.

    ``local=True``: once a run has failed, XGBoost's answer is scaled down near each failure by a
    kernel estimate (:meth:`near_failures`). With few runs XGBoost cannot split (each leaf needs a
    hessian of 1, a run gives p(1-p) <= 0.25), so P(feasible) is the base rate everywhere, and a
    search whose only signal of failure is the failure itself (an Optuna study's FAIL trials)
    proposed points a hair from one that had just crashed, round after round. Off by default: where
    a space declares constraints, their metrics (a memory model) say where runs fail, and the
    kernel marked down configurations one category from an OOM (stop 66's search benchmark:
    memory-bound space 50% of cubic's runs infeasible, 2.25% without it)."""

    def __init__(self, random_state: int = 0, local: bool = False, width: float = 0.05,
                 prior_weight: float = 0.5):
        self.random_state = random_state
        self.local = local
        self.width = width  # RMS distance per feature (features scaled by the runs' range) where a run weighs e^-1/2
        self.prior_weight = prior_weight  # pseudo-runs at the base rate in every neighbourhood

    def fit(self, X, ok, kernel_rows=None) -> "FeasibilityClassifier":
        """``kernel_rows``: a mask of the runs the kernel estimate weighs (default all; a search leaves
        out runs a pruner stopped: stopped for their curve, not failed at their configuration)."""
        import xgboost as xgb

        X = np.asarray(X, dtype=np.float64)
        ok = np.asarray(ok, dtype=np.int64)
        self.prior_ = (ok.sum() + 1.0) / (len(ok) + 2.0)
        self.model_ = None
        if 0 < ok.sum() < len(ok):
            self.model_ = xgb.XGBClassifier(n_estimators=60, max_depth=3, learning_rate=0.2,
                                            random_state=self.random_state, n_jobs=1)
            self.model_.fit(X, ok)
        if self.local:  # the runs the kernel weighs, scaled by their range
            self.lo_ = X.min(axis=0) if len(X) else np.zeros(X.shape[1])
            self.span_ = np.maximum((X.max(axis=0) - self.lo_) if len(X) else 1.0, 1e-12)
            keep = np.ones(len(X), bool) if kernel_rows is None else np.asarray(kernel_rows, bool)
            self.Z_, self.ok_ = ((X - self.lo_) / self.span_)[keep], ok[keep].astype(np.float64)
        self.n_features_in_ = X.shape[1]
        return self

    def near_failures(self, X) -> np.ndarray:
        """Per row, in (0, 1]: the kernel-weighted success rate around it (shrunk to the base rate by
        ``prior_weight`` pseudo-runs) over the base rate, capped at 1: 1 far from every failure and
        near successes, below 1 near failures. A lift, so it never raises what XGBoost says."""
        Z = (np.asarray(X, dtype=np.float64) - self.lo_) / self.span_
        d = max(Z.shape[1], 1)
        runs_sq = (self.Z_ * self.Z_).sum(1)[None, :]
        out = np.empty(len(Z))
        for i in range(0, len(Z), 256):  # candidates x runs in blocks: 10,000 runs stay ~20 MB
            z = Z[i:i + 256]
            sq = (z * z).sum(1)[:, None] + runs_sq - 2.0 * z @ self.Z_.T
            w = np.exp(-np.maximum(sq, 0.0) / d / (2.0 * self.width ** 2))
            out[i:i + 256] = (w @ self.ok_ + self.prior_weight * self.prior_) / (w.sum(1) + self.prior_weight)
        return np.minimum(1.0, out / self.prior_)

    def predict_proba(self, X) -> np.ndarray:
        """P(feasible) per row (a 1-D array, unlike scikit-learn's two columns: there is one class of interest)."""
        X = np.asarray(X, dtype=np.float64)
        if self.model_ is None:
            return np.full(len(X), self.prior_)
        p = self.model_.predict_proba(X)[:, 1]
        return p * self.near_failures(X) if self.local else p

    def predict(self, X) -> np.ndarray:
        return (self.predict_proba(X) >= 0.5).astype(np.int64)
