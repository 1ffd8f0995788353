"""Proposal strategies: given a space and the runs so far, propose the next batch of k points.

- :class:`ProxyGuided` - cubic's loop (CubicML): fit the proxy on every run so far, search it with
  Optuna (TPE, GP or NSGA-II for several objectives) and return k diverse, uncertainty-aware
  points: constrained expected improvement (EI x P(feasible) x P(constraints met)), picked greedily
  with a local penalty around each pick so that a batch is not k copies of one guess.
- :class:`DirectOptuna` - baseline: an Optuna sampler (TPE or GP) asked directly, every proposal
  a real run.
- :class:`RandomSearch` - baseline.

Every strategy proposes from (seed, round, history) alone, so a campaign resumed after SIGKILL
proposes from its stored history. (The one thing :class:`ProxyGuided` keeps between rounds is which
proxy family cross-validation chose, to skip re-running CV every round; a resumed campaign simply
re-runs CV.) Points already run,
including failed and infeasible ones, are never proposed again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import optuna
from scipy.stats import norm

from search.space import Space

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass
class Observation:
    """One finished run as the search sees it."""

    point: dict[str, Any]
    ok: bool
    metrics: dict[str, float] = field(default_factory=dict)
    failure_kind: str | None = None
    violation: float = 0.0  # > 0: ran, but broke a constraint (memory, quality)
    context: dict[str, Any] = field(default_factory=dict)  # e.g. {"workload": ...}; differs for warm starts

    @property
    def feasible(self) -> bool:
        return self.ok and self.violation <= 0.0


@dataclass
class Proposal:
    point: dict[str, Any]
    predicted: dict[str, float] | None = None  # the proxy's view at proposal time, kept for the report


Featurizer = Callable[[dict[str, Any], dict[str, Any]], np.ndarray]


def objective_value(space: Space, obs: Observation, i: int = 0) -> float | None:
    """The i-th objective as a number to maximize (log of a positive metric: ratios matter)."""
    o = space.objectives[i]
    v = obs.metrics.get(o.metric)
    if v is None or not math.isfinite(v):
        return None
    v = math.log(v) if v > 0 else v
    return v if o.direction == "maximize" else -v


def _seed(seed: int, round_index: int, salt: int = 0) -> int:
    return (seed * 1_000_003 + round_index * 7919 + salt) % (2**31 - 1)


def _fresh(space: Space, taken: set[str], rng: np.random.Generator, k: int) -> list[dict[str, Any]]:
    """k random points not in ``taken`` (exhaustively for small discrete spaces)."""
    out: list[dict[str, Any]] = []
    for _ in range(50 * k):
        if len(out) == k:
            return out
        p = space.sample(rng)
        key = space.key(p)
        if key not in taken:
            taken.add(key)
            out.append(p)
    size = space.size()
    if size is not None and size <= 100_000:
        rest = [p for p in space.enumerate() if space.key(p) not in taken]
        rng.shuffle(rest)
        for p in rest[: k - len(out)]:
            taken.add(space.key(p))
            out.append(p)
    return out


class Strategy:
    name = "strategy"

    def propose(self, space: Space, history: list[Observation], k: int, *, seed: int, round_index: int,
                featurize: Featurizer | None = None, warm: list[Observation] = (),
                context: dict[str, Any] | None = None) -> list[Proposal]:
        raise NotImplementedError


class RandomSearch(Strategy):
    name = "random"

    def propose(self, space, history, k, *, seed, round_index, featurize=None, warm=(), context=None):
        taken = {space.key(o.point) for o in history}
        rng = np.random.default_rng(_seed(seed, round_index))
        return [Proposal(p) for p in _fresh(space, taken, rng, k)]


def _sampler(kind: str, seed: int, n_startup: int, multivariate: bool = True):
    # constraints reach the samplers as trial constraints (Optuna 5: create_trial/set_constraint)
    if kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup, multivariate=multivariate,
                                          constant_liar=True)
    if kind == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup)
    if kind == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {kind!r} (known: tpe, gp, nsga2, random)")


class DirectOptuna(Strategy):
    """Optuna on real runs, no proxy. The study is rebuilt from the history each round (so the
    proposal depends only on seed, round and history); failed runs enter as infeasible trials
    at the worst observed value, which is how Optuna's samplers learn to avoid them."""

    def __init__(self, sampler: str = "tpe", n_startup: int = 8):
        self.sampler = sampler
        self.n_startup = n_startup
        self.name = f"optuna-{sampler}"

    def propose(self, space, history, k, *, seed, round_index, featurize=None, warm=(), context=None):
        study = optuna.create_study(direction="maximize",
                                    sampler=_sampler(self.sampler, _seed(seed, round_index), self.n_startup))
        values = [objective_value(space, o) for o in history]
        known = [v for v in values if v is not None]
        worst = (min(known) - 1.0) if known else 0.0
        for o, v in zip(history, values):
            dists = {p.name: p.distribution() for p in space.parameters if p.name in o.point}
            bad = (not o.feasible) or v is None
            study.add_trial(optuna.trial.create_trial(
                params=o.point, distributions=dists, value=worst if v is None else v,
                constraints={"feasible": (1.0 + o.violation) if bad else 0.0}))
        taken = {space.key(o.point) for o in history}
        rng = np.random.default_rng(_seed(seed, round_index, 1))
        out: list[Proposal] = []
        for _ in range(20 * k):
            if len(out) == k:
                break
            trial = study.ask()
            p = space.suggest(trial)
            key = space.key(p)
            if key in taken:
                # already run: tell the sampler it is worthless so it moves on, and ask again
                trial.set_constraint("feasible", 1.0)
                study.tell(trial, worst)
                continue
            taken.add(key)
            out.append(Proposal(p))
        out += [Proposal(p) for p in _fresh(space, taken, rng, k - len(out))]
        return out


class ProxyGuided(Strategy):
    """cubic's loop: the proxy stands in for real runs inside an Optuna search; k picks per round."""

    def __init__(self, sampler: str = "tpe", n_init: int | None = None, n_inner: int = 160,
                 families: tuple[str, ...] = ("xgboost", "mlp", "gp", "ridge"), reselect_every: int = 3,
                 xi: float = 0.0, exhaustive_below: int = 5000, exploit_share: float = 0.5):
        self.sampler = sampler
        self.n_init = n_init
        self.n_inner = n_inner
        self.families = families
        self.reselect_every = reselect_every
        self.xi = xi
        self.exhaustive_below = exhaustive_below
        self.exploit_share = exploit_share  # share of each batch picked by predicted value alone
        self.name = f"cubic-{sampler}"
        self.last_fit: dict[str, Any] = {}  # for reports: which family, its CV tau

    def _features(self, space: Space, featurize, obs_points, contexts) -> np.ndarray:
        rows = []
        for p, c in zip(obs_points, contexts):
            f = space.features(p)
            if featurize is not None:
                f = np.concatenate([f, np.asarray(featurize(p, c), dtype=np.float64)])
            rows.append(f)
        return np.asarray(rows)

    @staticmethod
    def _prior_columns(space: Space, featurize) -> dict[str, int]:
        """metric -> column of the feature row holding an analytical model's log prediction of it
        (a featurizer names them in ``prior_columns``, relative to its own output)."""
        cols = getattr(featurize, "prior_columns", None) or {}
        if not cols:
            return {}
        offset = len(space.features(space.sample(np.random.default_rng(0))))
        return {m: offset + j for m, j in cols.items()}

    def _prior_design(self, space, featurize, context, taken, rng, k, prior_cols) -> list[Proposal]:
        """The first round when an analytical model predicts the objective: part of the batch is
        the model's best predictions (spread out by the same local penalty as every batch), the
        rest random, so that the proxy also sees where the model may be wrong."""
        from cost_models.proxy import fill_gaps

        size = space.size()
        if size is not None and size <= self.exhaustive_below:
            cands = [p for p in space.enumerate() if space.key(p) not in taken]
        else:
            cands = _fresh(space, set(taken), np.random.default_rng(rng.integers(2**31)), 4 * self.n_inner)
        if not cands:
            return []
        X = self._features(space, featurize, cands, [context] * len(cands))
        prior = X[:, prior_cols[space.primary.metric]]
        ok = np.isfinite(prior)  # no predicted throughput: the model predicts an OOM or an invalid config
        for c in space.constraints:
            if c.metric in prior_cols and c.max is not None and c.max > 0:
                mem = X[:, prior_cols[c.metric]]
                ok &= ~(np.isfinite(mem) & (mem > math.log(c.max)))
        n_exploit = max(1, int(round(self.exploit_share * k)))
        if not ok.any():
            return [Proposal(p) for p in _fresh(space, taken, rng, k)]
        picks = _diverse_batch(fill_gaps(X), np.zeros((len(cands), 1)), min(n_exploit, int(ok.sum())), False,
                               exploit=np.where(ok, prior, -np.inf), n_exploit=n_exploit)
        m = space.primary.metric
        out = [Proposal(cands[j], {"objective": float(prior[j]), m: float(math.exp(prior[j])),
                                   "source": "step-model prior"}) for j in picks]
        taken = taken | {space.key(p.point) for p in out}
        return out + [Proposal(p) for p in _fresh(space, taken, rng, k - len(out))]

    def propose(self, space, history, k, *, seed, round_index, featurize=None, warm=(), context=None):
        from cost_models.proxy import FeasibilityClassifier, Proxy, fill_gaps

        context = context or {}
        taken = {space.key(o.point) for o in history}
        rng = np.random.default_rng(_seed(seed, round_index))
        train = list(warm) + list(history)
        ok = [o for o in train if o.ok and objective_value(space, o) is not None]
        n_init = self.n_init if self.n_init is not None else max(k, 4)
        prior_cols = self._prior_columns(space, featurize)
        if len(train) < n_init or len(ok) < 2:  # initial design: n_init runs, whatever their outcome
            if space.primary.metric in prior_cols and space.primary.direction == "maximize":
                return self._prior_design(space, featurize, context, taken, rng, k, prior_cols)
            return [Proposal(p) for p in _fresh(space, taken, rng, k)]

        X_all = self._features(space, featurize, [o.point for o in train], [o.context for o in train])
        ok_mask = np.array([o.ok and objective_value(space, o) is not None for o in train])
        X_ok = X_all[ok_mask]
        # the family is re-chosen by cross-validation every few rounds (CV is the costly part)
        families = self.families
        if round_index % self.reselect_every and self.last_fit.get("family") in self.families:
            families = (self.last_fit["family"],)
        proxies = []
        for i in range(len(space.objectives)):
            y = np.array([objective_value(space, o, i) for o in train if o.ok and objective_value(space, o) is not None])
            y = np.nan_to_num(y.astype(float), nan=float(np.nanmin(y)) if np.isfinite(y).any() else 0.0)
            o = space.objectives[i]
            proxies.append(Proxy(families=families if i == 0 else (self.last_fit.get("family") or families[0],),
                                 random_state=_seed(seed, round_index, i),
                                 prior_column=prior_cols.get(o.metric) if o.direction == "maximize" else None
                                 ).fit(X_ok, y))
        best_prev = self.last_fit.get("cv_tau", {})
        self.last_fit = {"family": proxies[0].selected_, "cv_tau": proxies[0].cv_tau_ or best_prev,
                         "n_train": int(len(X_ok)), "n_warm": len(warm)}
        # constraint metrics (memory per device, quality) get a proxy each: P(bound met) from mean/std.
        # Failed runs count too when they report the metric (a simulated OOM reports its memory).
        cons_models = []
        for c in space.constraints:
            rows = [(x, o.metrics[c.metric]) for x, o in zip(X_all, train) if c.metric in o.metrics
                    and math.isfinite(o.metrics[c.metric])]
            if len(rows) >= 4 and len({v for _, v in rows}) > 1:
                vals = np.array([r[1] for r in rows], dtype=float)
                bounds = [b for b in (c.max, c.min) if b is not None]
                use_log = bool(np.all(vals > 0) and all(b > 0 for b in bounds))  # memory: ratios matter
                model = Proxy(families=("ridge", "xgboost"), n_members=4, cv_folds=3, random_state=seed,
                              prior_column=prior_cols.get(c.metric) if use_log else None).fit(
                    np.array([r[0] for r in rows]), np.log(vals) if use_log else vals)
                cons_models.append((c, model, use_log))
        # an OOM whose memory the memory model already explains is not a second, separate failure
        # signal: the classifier learns the failures no constraint model accounts for
        covered = {c.metric for c, _, _ in cons_models}
        explained = [o.ok or (o.failure_kind == "oom" and any(m in o.metrics for m in covered)) for o in train]
        feas = FeasibilityClassifier(random_state=seed).fit(X_all, explained)
        y_best = [max(v for o in history if o.feasible and (v := objective_value(space, o, i)) is not None)
                  if any(o.feasible and objective_value(space, o, i) is not None for o in history)
                  else max(proxies[i].y_train_) for i in range(len(space.objectives))]

        def score(points: list[dict[str, Any]]):
            X = self._features(space, featurize, points, [context] * len(points))
            p_ok = feas.predict_proba(X)
            for c, model, use_log in cons_models:
                mu, sd = model.predict(X, return_std=True)
                sd = np.maximum(sd, 0.02 if use_log else 1e-9 + 0.02 * np.abs(mu))
                f = math.log if use_log else float
                if c.max is not None:
                    p_ok = p_ok * norm.cdf((f(c.max) - mu) / sd)
                if c.min is not None:
                    p_ok = p_ok * norm.cdf((mu - f(c.min)) / sd)
            acq, mus, sds = [], [], []
            for i, px in enumerate(proxies):
                mu, sd = px.predict(X, return_std=True)
                sd = np.maximum(sd, 1e-6)
                z = (mu - y_best[i] - self.xi) / sd
                ei = (mu - y_best[i] - self.xi) * norm.cdf(z) + sd * norm.pdf(z)
                acq.append(ei * p_ok)
                mus.append(mu)
                sds.append(sd)
            return X, np.stack(acq, axis=1), mus, sds, p_ok

        # inner search: Optuna over the proxy, in batches so that the models predict many rows at once
        multi = len(space.objectives) > 1
        sampler = _sampler("nsga2" if multi else self.sampler, _seed(seed, round_index, 2),
                           n_startup=min(32, self.n_inner // 4), multivariate=False)
        # (independent TPE inside: the proxy is cheap but multivariate TPE's own cost is not)
        study = optuna.create_study(directions=["maximize"] * len(space.objectives), sampler=sampler)
        pool: dict[str, dict[str, Any]] = {}
        size = space.size()
        if size is not None and size <= self.exhaustive_below:
            # a small discrete space: the proxy is cheap enough to score every untried point too
            pool.update((space.key(p), p) for p in space.enumerate() if space.key(p) not in taken)
        for p in _fresh(space, set(taken), rng, min(64, self.n_inner // 4)):
            pool[space.key(p)] = p  # random candidates keep the pool broad beyond the sampler's focus
        batch = 32
        for _ in range(max(1, self.n_inner // batch)):
            trials = [study.ask() for _ in range(batch)]
            pts = [space.suggest(t) for t in trials]
            _, acq, *_ = score(pts)
            for t, p, a in zip(trials, pts, acq):
                key = space.key(p)
                already = key in taken
                study.tell(t, [float(-1.0 if already else v) for v in a])
                if not already:
                    pool[key] = p
        if not pool:
            return []
        cands = list(pool.values())
        X, acq, mus, sds, p_ok = score(cands)
        # one exploiting pick per batch (the best predicted among likely-feasible points), the rest
        # by acquisition with local penalization
        likely = p_ok >= 0.5
        exploit = np.where(likely, mus[0], -np.inf) if likely.any() else acq[:, 0]
        picks = _diverse_batch(fill_gaps(X), acq, k, multi, exploit=None if multi else exploit,
                               n_exploit=max(1, int(round(self.exploit_share * k))))
        out = []
        for j in picks:
            pred = {"objective": float(mus[0][j]), "objective_std": float(sds[0][j]),
                    "p_feasible": float(p_ok[j]), "acquisition": float(acq[j, 0]),
                    "family": proxies[0].selected_}
            m = space.objectives[0]
            if cands[j] and m.direction == "maximize":
                pred[m.metric] = float(math.exp(mus[0][j]))  # objective_value took a log
            out.append(Proposal(cands[j], pred))
        if len(out) < k:
            taken |= {space.key(c) for c in cands}
            out += [Proposal(p) for p in _fresh(space, taken, rng, k - len(out))]
        return out


def _diverse_batch(X: np.ndarray, acq: np.ndarray, k: int, multi: bool, exploit: np.ndarray | None = None,
                   n_exploit: int = 1) -> list[int]:
    """Greedy picks with local penalization: after each pick, candidates near it (in normalized
    feature space) have their acquisition scaled down by 1 - exp(-d^2 / r^2), r^2 half the median
    squared distance between candidates (so a point differing in one parameter is penalized)."""
    n = len(X)
    span = X.max(axis=0) - X.min(axis=0)
    span[span < 1e-12] = 1.0
    Z = (X - X.min(axis=0)) / span
    if multi:
        # several objectives: sum of per-objective ranks (a cheap stand-in for Pareto layers)
        ranks = np.argsort(np.argsort(-acq, axis=0), axis=0).sum(axis=1).astype(float)
        base = 1.0 / (1.0 + ranks)
    else:
        base = acq[:, 0].astype(float)
        if not np.any(base > 1e-12):
            base = np.full(n, 1e-12)
    base = np.maximum(base, 1e-300)
    sample = Z[np.random.default_rng(0).choice(n, size=min(n, 200), replace=False)]
    d2s = ((sample[:, None, :] - sample[None, :, :]) ** 2).sum(axis=-1)
    r2 = max(0.5 * float(np.median(d2s[np.triu_indices(len(sample), 1)])) if len(sample) > 1 else 1.0, 1e-6)
    penalty = np.ones(n)
    picks: list[int] = []
    for _ in range(min(k, n)):
        if exploit is not None and len(picks) < n_exploit:
            score = np.where(exploit > -np.inf, exploit - exploit[np.isfinite(exploit)].min() + 1e-9, 0.0) * penalty
            score[picks] = -1.0
            j = int(np.argmax(score))
        else:
            score = base * penalty
            score[picks] = -1.0
            j = int(np.argmax(score))
        picks.append(j)
        d2 = ((Z - Z[j]) ** 2).sum(axis=1)
        penalty *= 1.0 - np.exp(-d2 / r2)
    return picks


def make_strategy(name: str, **kw) -> Strategy:
    """By name: ``cubic`` / ``cubic-tpe`` / ``cubic-gp`` / ``cubic-nsga2``, ``tpe`` / ``gp`` (direct), ``random``."""
    if name in ("cubic", "cubic-tpe"):
        return ProxyGuided("tpe", **kw)
    if name in ("cubic-gp", "cubic-nsga2"):
        return ProxyGuided(name.split("-")[1], **kw)
    if name in ("tpe", "gp", "optuna-tpe", "optuna-gp"):
        return DirectOptuna(name.split("-")[-1], **kw)
    if name == "random":
        return RandomSearch()
    raise ValueError(f"unknown strategy {name!r} (known: cubic, cubic-gp, cubic-nsga2, tpe, gp, random)")
