"""A measurement is a distribution: pooling repeated runs of one config into one estimate.

One run of a config on a shared machine is one sample of a noisy quantity (a run measured at
63,910 examples/s re-ran at 102,279 and 99,436). The trial store keeps every repeat; what it serves,
and what a campaign's proxy trains on, is their pooled estimate from :func:`pool`:

- **centre**: the median of the repeats' values (robust to one slow outlier);
- **95% interval: what a FRESH run of this config will measure** (a prediction interval, one
  meaning everywhere: ``cubic run``, ``cubic trials show``, a campaign's progress lines, its
  summary, answer and report all show :func:`estimate`'s). On log(value) (throughput noise is
  multiplicative): mean of the repeats' logs +- t(df) x s x sqrt(1 + 1/n), exponentiated. ``s`` is
  between-PROCESS spread: the config's own between-repeat variance pooled with the machine's
  (:class:`NoiseModel`: the between-repeat variance of log(value) over every config measured on the
  same fingerprint and run length, as one-way ANOVA pools a residual variance), with the degrees of
  freedom of both (three repeats alone would give t(2) = 4.3). With one repeat and no config of the
  machine repeated, the machine's **noise floor** (:class:`NoiseModel` measured by repeating one
  config in fresh processes, stored per machine fingerprint by :mod:`cubic.core.store`) stands in,
  and the estimate's ``basis`` says so ("1 repeat + this machine's noise floor 6.5%"). The timing
  windows inside one process never make an interval on their own (they cannot see between-process
  noise: 283,545 [279,433, 285,243] from windows was [233,668, 344,070] across processes); a
  one-repeat interval is never narrower than them either. Zero width only where the caller passes
  no noise at all (a deterministic source, e.g. the simulator);
- **separated / a ratio** (:func:`ratio_interval`, :func:`separated`): the 95% confidence interval of
  the ratio of two configs' typical (geometric-mean) throughputs, from the difference of their
  log-means with Welch's standard error and degrees of freedom, each side's spread between-process
  as above. "Separated" needs that interval to exclude 1 AND each side to have been measured in at
  least two processes (a second look), so one lucky run never separates;
- **contended repeats are excluded**, not down-weighted, whenever at least one uncontended repeat
  exists: contention only ever slows a run down, so any weight > 0 biases the estimate low, and a
  weight cannot be chosen without knowing how much slower the contended run was. When every repeat
  was contended they are all used and the estimate says ``contended``. Serving from the store
  counts only uncontended repeats as "good", so a contended repeat is in effect re-taken once by the
  next request for that many repeats (:meth:`cubic.core.store.TrialStore.serve`) -- once: with
  2 x R repeats stored the estimate is served even if they were all contended (a machine that
  stays busy would otherwise never serve anything), and says so.

The contention rule (:func:`contention`), on the runner's per-run figures: a repeat is contended
when the 1-minute load average around the run (``load_avg_1m``, or the larger of
``load_avg_1m_start`` / ``load_avg_1m_end``) exceeded the cores available to the run (more runnable
threads than cores: some waited) -- unless the run's own threads fill the cores (a distributed run of
W ranks x threads >= cores keeps the load above them by itself, so the load cannot tell; measured:
W=2 on 2 idle cores, load 2.0-3.0 in 265 of 339 runs) --, or when ``cpu_util`` (process CPU time /
wall time / intra-op threads over the timed steps, as cubic.runners.local reports it: 1.0 = every thread busy) shows
the run's threads kept fewer than half of the cores they could use (min(threads, cores)) busy:
``cpu_util x threads < 0.5 x min(threads, cores)`` -- it was descheduled for half its time --, or
when more than half of its timed steps were preempted (``steps_preempted_frac``: another process
took one of the run's cores during the step; :func:`cubic.core.train.window_stats` times a run from
its unpreempted steps, and when most were preempted the few left are not a fair sample: the faster
steps are the ones that escaped). The load average alone misses this: it is a one-minute average,
and a run lasts seconds. Not (yet) a rule: the machine itself running slower for a while (another
tenant of the host; ``speed_probe_ms`` and ``others_busy_frac`` in the runner's metrics record it),
which slows a run without preempting it.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

CONFIDENCE = 0.95
CPU_UTIL_FLOOR = 0.5  # of min(threads, cores): below it the run spent half its time descheduled
PREEMPTED_STEPS_MAX = 0.5  # share of timed steps in which another process took one of the run's cores
# the two pooled figures with named intervals; every other metric is pooled by its median
INTERVAL_METRICS = {"examples_per_s": ("examples_per_s_ci_lo", "examples_per_s_ci_hi"),
                    "step_time_median_ms": ("step_time_ci_lo_ms", "step_time_ci_hi_ms")}


def ci_names(metric: str) -> tuple[str, str]:
    """The metric names of ``metric``'s interval bounds."""
    return INTERVAL_METRICS.get(metric, (f"{metric}_ci_lo", f"{metric}_ci_hi"))


def cores_available(fingerprint: Mapping[str, Any] | None = None) -> int:
    """Cores a run on this machine may use: the fingerprint's count when given (the run's machine),
    else this process's CPU affinity."""
    if fingerprint and fingerprint.get("cpu_count"):
        return int(fingerprint["cpu_count"])
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def contention(metrics: Mapping[str, float], extra: Mapping[str, Any] | None = None,
               cores: int | None = None) -> str | None:
    """Why a run was contended (see the module docstring), or None when it was not or cannot be told."""
    extra = extra or {}
    cores = int(cores or cores_available())
    load = metrics.get("load_avg_1m")
    if load is None:  # around the run: at its start and end (older runners: in extra)
        seen = [float(v) for v in (metrics.get("load_avg_1m_start"), metrics.get("load_avg_1m_end"),
                                   extra.get("loadavg_1m_start"), extra.get("loadavg_1m")) if v is not None]
        load = max(seen) if seen else None
    threads = extra.get("threads") or metrics.get("threads")
    # a run whose own threads fill the cores (W ranks x threads >= cores) keeps the load above them by
    # itself (its ranks, their gloo helper threads, the launcher): the load cannot tell others from it,
    # so its ranks' CPU utilisation and preempted steps below decide
    own = int(extra.get("world_size") or metrics.get("world_size") or 1) * int(threads or 1)
    if load is not None and math.isfinite(load) and load > cores and own < cores:
        return f"load average {load:.2f} > {cores} cores"
    pre = metrics.get("steps_preempted_frac")
    if pre is not None and math.isfinite(pre) and pre > PREEMPTED_STEPS_MAX:
        return f"{pre:.0%} of the timed steps preempted > {PREEMPTED_STEPS_MAX:.0%}"
    util = metrics.get("cpu_util")
    if util is not None and threads and math.isfinite(util):
        usable = min(int(threads), cores)
        busy = util * int(threads)  # cores' worth of CPU the run used
        if busy < CPU_UTIL_FLOOR * usable:
            return f"cpu_util {util:.2f} x {threads} threads = {busy:.2f} cores busy < {CPU_UTIL_FLOOR:g} x {usable}"
    return None


@dataclass
class NoiseModel:
    """The between-repeat spread of log(metric) on a machine, pooled over its configs."""

    sd: float  # standard deviation of log(value) about each config's mean
    df: int  # degrees of freedom: sum over configs of (repeats - 1)
    label: str = ""  # where it comes from, for an estimate's basis ("this machine's noise floor")


def noise_model(groups: Iterable[Iterable[float]]) -> NoiseModel | None:
    """Pooled between-repeat standard deviation of log(value) over groups (one group per config;
    groups with fewer than two positive values add nothing). None when no group has two."""
    ss, df = 0.0, 0
    for g in groups:
        xs = [math.log(v) for v in g if v is not None and math.isfinite(v) and v > 0]
        if len(xs) < 2:
            continue
        m = sum(xs) / len(xs)
        ss += sum((x - m) ** 2 for x in xs)
        df += len(xs) - 1
    return NoiseModel(math.sqrt(ss / df), df) if df else None


@dataclass
class Estimate:
    """One metric pooled over repeats: centre (median) and the 95% interval of a fresh run."""

    value: float
    lo: float
    hi: float
    n: int  # repeats pooled
    mean_log: float = math.nan  # mean of log(value) (of value for a non-rate), the interval's centre
    sd: float = math.nan  # between-process sd of one run's log(value), pooled with the machine's
    df: int = 0  # its degrees of freedom
    basis: str = ""  # where the spread comes from, in words

    def separated_above(self, other: "Estimate") -> bool:
        """This config's typical value is above ``other``'s by between-process evidence
        (:func:`separated`)."""
        return separated(self, other)

    @property
    def rel_width(self) -> float:
        return (self.hi - self.lo) / abs(self.value) if self.value else math.inf

    @property
    def rel_sd(self) -> float:
        """One run's between-process spread as a fraction (exp(sd) - 1), nan when unknown."""
        return math.expm1(self.sd) if math.isfinite(self.sd) else math.nan


def _t(df: float, confidence: float) -> float:
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2, df))


def describe_basis(n: int, own_df: int, noise: NoiseModel | None) -> str:
    """Where an interval's spread comes from, in words ("3 repeats", "1 repeat + this machine's
    noise floor 6.5%")."""
    head = f"{n} repeat{'s' if n != 1 else ''}"
    if noise is None or noise.df <= 0:
        return head if own_df else head + " (no between-process spread known: zero width)"
    label = noise.label or "this machine's between-repeat noise"
    return f"{head} + {label} {math.expm1(noise.sd):.1%}"


def estimate(values: Iterable[float], within: tuple[float, float] | None = None,
             noise: NoiseModel | None = None, confidence: float = CONFIDENCE) -> Estimate:
    """Median and the 95% interval of a fresh run from one metric's repeats (see the module
    docstring); ``noise`` is the machine's :class:`NoiseModel` for this metric (or its noise floor),
    pooled into the repeats' own spread."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        raise ValueError("no finite values to pool")
    vals.sort()
    n = len(vals)
    mid = vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])
    within = within if within is not None and all(map(math.isfinite, within)) else None
    positive = min(vals) > 0
    if positive:
        xs, back = [math.log(v) for v in vals], math.exp
    else:  # not a rate: an additive interval, and no machine model (it is on logs)
        xs, back, noise = vals, (lambda x: x), None
    mean = sum(xs) / n
    ss, df = sum((x - mean) ** 2 for x in xs), n - 1
    own_df = df
    if noise is not None and noise.df > 0:
        ss, df = ss + noise.df * noise.sd ** 2, df + noise.df
    basis = describe_basis(n, own_df, noise if positive else None)
    if df == 0:
        lo, hi = within or (mid, mid)
        return Estimate(mid, min(lo, mid), max(hi, mid), 1, mean, 0.0, 0, basis)
    sd = math.sqrt(ss / df)
    half = _t(df, confidence) * sd * math.sqrt(1 + 1 / n)  # a fresh run: its own spread + the mean's
    lo, hi = back(mean - half), back(mean + half)
    if n == 1 and within is not None:
        lo, hi = min(lo, within[0]), max(hi, within[1])
    return Estimate(mid, min(lo, mid), max(hi, mid), n, mean, sd, df, basis)


def ratio_interval(a: Estimate, b: Estimate, confidence: float = CONFIDENCE) -> tuple[float, float, float] | None:
    """(ratio, low, high): ``a``'s typical value over ``b``'s (geometric means: exp of the
    difference of log-means) with the 95% confidence interval of that ratio (Welch: each side's
    between-process variance over its repeats, Welch-Satterthwaite degrees of freedom). None when a
    side has no log-mean (a non-positive metric or an old stored estimate)."""
    if not (math.isfinite(a.mean_log) and math.isfinite(b.mean_log)):
        return None
    r = math.exp(a.mean_log - b.mean_log)
    va = (a.sd ** 2 / a.n) if math.isfinite(a.sd) else math.nan
    vb = (b.sd ** 2 / b.n) if math.isfinite(b.sd) else math.nan
    if not (math.isfinite(va) and math.isfinite(vb)):
        return None
    v = va + vb
    if v == 0:
        return r, r, r
    parts = [x ** 2 / d for x, d in ((va, a.df), (vb, b.df)) if x > 0]
    if any(d <= 0 for x, d in ((va, a.df), (vb, b.df)) if x > 0):
        return None
    df = v ** 2 / sum(parts)
    half = _t(df, confidence) * math.sqrt(v)
    return r, r * math.exp(-half), r * math.exp(half)


def separated(a: Estimate, b: Estimate, confidence: float = CONFIDENCE) -> bool:
    """``a``'s typical value is above ``b``'s by between-process evidence: each measured in at least
    two processes and the 95% interval of their ratio (:func:`ratio_interval`) wholly above 1."""
    if a.n < 2 or b.n < 2:
        return False
    iv = ratio_interval(a, b, confidence)
    return iv is not None and iv[1] > 1.0


@dataclass
class Repeat:
    """One stored repeat as pooling sees it."""

    metrics: dict[str, float]
    contended: bool = False
    trial_id: int | None = None


@dataclass
class Pooled:
    """Repeats of one config pooled: every metric's median, intervals of the throughput figures."""

    metrics: dict[str, float]
    estimates: dict[str, Estimate]
    n: int  # ok repeats offered
    n_used: int  # pooled (the uncontended ones, or all when every one was contended)
    n_contended: int
    contended: bool  # the estimate rests on contended repeats only
    trial_ids: list[int] = field(default_factory=list)

    @property
    def good(self) -> int:
        """Uncontended repeats: what counts towards a requested repeat count."""
        return self.n - self.n_contended

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "n_used": self.n_used, "n_contended": self.n_contended, "contended": self.contended,
                "trial_ids": self.trial_ids, "estimates": {k: asdict(v) for k, v in self.estimates.items()}}


def pool(repeats: list[Repeat], noise: Mapping[str, NoiseModel] | None = None,
         floor: Mapping[str, NoiseModel] | None = None) -> Pooled:
    """Pool ok repeats of one config (see the module docstring). ``repeats`` must be non-empty;
    ``noise`` maps a metric to the machine's :class:`NoiseModel` of it (see :func:`noise_models`),
    ``floor`` to the machine's noise floor, used where ``noise`` has nothing for the metric."""
    if not repeats:
        raise ValueError("nothing to pool")
    clean = [r for r in repeats if not r.contended]
    used = clean or list(repeats)
    keys = sorted(set().union(*(r.metrics for r in used)))
    derived = {n for pair in INTERVAL_METRICS.values() for n in pair}
    metrics: dict[str, float] = {}
    estimates: dict[str, Estimate] = {}
    for k in keys:
        if k in derived or k.endswith("_ci_lo") or k.endswith("_ci_hi"):
            continue
        vals = [r.metrics[k] for r in used if k in r.metrics and math.isfinite(float(r.metrics[k]))]
        if not vals:
            continue
        lo_name, hi_name = ci_names(k)
        within = None
        if len(used) == 1 and lo_name in used[0].metrics and hi_name in used[0].metrics:
            within = (float(used[0].metrics[lo_name]), float(used[0].metrics[hi_name]))
        model = None
        if k in INTERVAL_METRICS:
            model = (noise or {}).get(k) or (floor or {}).get(k)
        est = estimate(vals, within, model)
        metrics[k] = est.value
        if k in INTERVAL_METRICS or within is not None:
            estimates[k] = est
            metrics[lo_name], metrics[hi_name] = est.lo, est.hi
    n_cont = sum(1 for r in repeats if r.contended)
    metrics.update(repeats=float(len(used)), repeats_contended=float(n_cont))
    return Pooled(metrics=metrics, estimates=estimates, n=len(repeats), n_used=len(used), n_contended=n_cont,
                  contended=not clean, trial_ids=[r.trial_id for r in used if r.trial_id is not None])


def noise_models(groups: Iterable[Iterable[Mapping[str, float]]]) -> dict[str, NoiseModel]:
    """:class:`NoiseModel` of each interval metric from groups of repeats' metrics (one group per
    config, uncontended ok repeats only)."""
    groups = [list(g) for g in groups]
    out = {}
    for k in INTERVAL_METRICS:
        m = noise_model([[r[k] for r in g if k in r] for g in groups])
        if m is not None:
            m.label = "this machine's between-repeat noise"
            out[k] = m
    return out


def pool_results(results: list[Any], cores: int | None = None) -> Any:
    """Pool ok :class:`cubic.core.result.Result` repeats into one Result carrying the pooled metrics
    (and, in ``extra["pooled"]``, how: repeats used, contended, intervals). The newest repeat lends
    everything that is not a figure (fingerprint, versions, trajectory)."""
    ok = [r for r in results if r.ok]
    if not ok:
        raise ValueError("no successful repeat to pool")
    reps = [Repeat(dict(r.metrics), contention(r.metrics, r.extra, cores or cores_available(r.fingerprint)) is not None)
            for r in ok]
    return pooled_result(ok, pool(reps))


def pooled_result(ok: list[Any], p: Pooled) -> Any:
    """The Result that stands for ok repeats ``ok`` (oldest first) pooled as ``p``."""
    newest = ok[-1]
    phases = {}
    for k in newest.phases_ms:
        vals = [r.phases_ms[k] for r in ok if k in r.phases_ms]
        phases[k] = estimate(vals).value if vals else newest.phases_ms[k]
    extra = dict(newest.extra)
    extra.pop("step_times_ms", None)  # one repeat's raw samples would pose as the pooled ones
    extra["pooled"] = p.to_json()
    return newest.model_copy(update={"metrics": p.metrics, "phases_ms": phases, "extra": extra,
                                     "wall_time_s": sum(r.wall_time_s for r in ok)})


# --- one Student-t interval of a mean, for every caller (fp8's NE costs, paired seeds, experiments) ---

def t_half_width(sd: float, n: int, confidence: float = CONFIDENCE) -> float:
    """Half-width of the Student-t interval of a mean of ``n`` samples with standard deviation ``sd``
    (infinite below two samples or with an undefined spread)."""
    if n < 2 or not math.isfinite(sd):
        return math.inf
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)


def mean_interval(values: Iterable[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean, low, high): the Student-t interval of the mean of ``values`` (one sample: infinite)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = math.fsum(xs) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else math.inf
    h = 0.0 if sd == 0.0 else t_half_width(sd, n, confidence)
    return mean, mean - h, mean + h


def paired_ratio(log_ratios: Iterable[float], confidence: float = CONFIDENCE) -> tuple[float, float, float] | None:
    """(ratio, low, high) from pairs measured back to back: the geometric mean of the pairs' ratios and
    the Student-t interval over their log ratios, exponentiated (a drift common to both sides of a pair
    cancels in its ratio). None with fewer than two pairs, whose spread is unknown."""
    xs = [float(v) for v in log_ratios]
    if len(xs) < 2:
        return None
    mid, lo, hi = mean_interval(xs, confidence)
    return math.exp(mid), math.exp(lo), math.exp(hi)


def samples_to_resolve(sd: float, half_width: float, confidence: float = CONFIDENCE, cap: int = 100_000) -> int:
    """Samples a Student-t interval of half-width ``half_width`` would take if the spread stayed ``sd``
    (the smallest such n, at most ``cap``)."""
    # the half-width falls monotonically with n: bisect (a linear scan made ~1e5 t.ppf calls for an
    # interval that barely straddles its budget)
    if t_half_width(sd, 2, confidence) <= half_width:
        return 2
    if cap <= 2 or t_half_width(sd, cap, confidence) > half_width:
        return max(cap, 2)
    lo, hi = 2, cap  # half-width(lo) > target >= half-width(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if t_half_width(sd, mid, confidence) > half_width:
            lo = mid
        else:
            hi = mid
    return hi


def rate_interval(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(k/n, low, high): the exact (Clopper-Pearson) interval of a rate seen ``k`` times in ``n``
    trials. A count over a few campaigns pins the true rate loosely: 0 wrong claims in 15 allow up to
    22%, 19 covered in 20 down to 75%; a target on such a rate is resolved only when the interval
    lies on its side. Empty (n = 0): nan."""
    if n <= 0:
        return math.nan, math.nan, math.nan
    from scipy.stats import binomtest

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="exact")
    return k / n, float(ci.low), float(ci.high)


def trials_to_resolve(rate: float, bound: float, above: bool, confidence: float = CONFIDENCE,
                      cap: int = 100_000) -> int | None:
    """Trials a rate's exact interval would take to lie wholly ``above`` (else below) ``bound`` if the
    rate seen stayed ``rate``; None when it cannot (the rate is on the wrong side of the bound, or
    on it) or only past ``cap``."""
    if not math.isfinite(rate) or (rate <= bound if above else rate >= bound):
        return None

    def resolved(n: int) -> bool:
        _, lo, hi = rate_interval(round(rate * n), n, confidence)
        return lo > bound if above else hi < bound

    if not resolved(cap):
        return None
    lo = n = 1  # doubling then bisection: the interval narrows (near enough) monotonically in n
    while not resolved(n):
        lo, n = n, min(cap, 2 * n)
    hi = n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if resolved(mid) else (mid, hi)
    return hi
