"""Pooling repeats (cubic.core.stats): median + 95% interval, the contention rule, exclusion."""

import math

import pytest
from scipy import stats as sps

from cubic.core.result import Result
from cubic.core.stats import Repeat, contention, estimate, pool, pool_results


def test_estimate_is_the_median_with_a_prediction_interval_on_logs():
    """The 95% interval is for what a FRESH run will measure: t x s x sqrt(1 + 1/n) on logs."""
    vals = [100.0, 130.0, 90.0, 105.0]
    e = estimate(vals)
    assert e.value == pytest.approx(102.5) and e.n == 4  # the median, not the mean
    logs = [math.log(v) for v in vals]
    m, s = sum(logs) / 4, math.sqrt(sum((x - sum(logs) / 4) ** 2 for x in logs) / 3)
    half = sps.t.ppf(0.975, 3) * s * math.sqrt(1 + 1 / 4)
    assert e.lo == pytest.approx(math.exp(m - half)) and e.hi == pytest.approx(math.exp(m + half))
    # more repeats of the same spread narrow it, but never below one run's own spread
    many = estimate(vals * 25)
    assert many.rel_width < e.rel_width and many.hi / many.lo > math.exp(2 * 1.9 * many.sd)
    assert e.basis == "4 repeats" and e.sd == pytest.approx(s) and e.df == 3


def test_prediction_interval_covers_fresh_runs_at_its_level():
    """Calibration of the meaning: with lognormal noise, a fresh run falls in the interval of n
    earlier repeats (pooled with a machine model) about 95% of the time."""
    import random

    from cubic.core.stats import NoiseModel

    rng = random.Random(3)
    floor = NoiseModel(0.065, 12, "this machine's noise floor")
    hits = 0
    for _ in range(2000):
        reps = [100 * math.exp(rng.gauss(0, 0.065)) for _ in range(rng.choice((1, 2, 4)))]
        e = estimate(reps, noise=floor)
        hits += e.lo <= 100 * math.exp(rng.gauss(0, 0.065)) <= e.hi
    assert 0.92 <= hits / 2000 <= 0.98


def test_one_repeat_takes_the_noise_floor_never_only_its_windows():
    from cubic.core.stats import NoiseModel

    # no noise at all (a deterministic source): zero width, and the basis says so
    assert (estimate([50.0]).lo, estimate([50.0]).hi) == (50.0, 50.0)
    assert "zero width" in estimate([50.0]).basis
    e = estimate([50.0], within=(49.5, 50.5), noise=NoiseModel(0.065, 8, "this machine's noise floor"))
    assert e.lo < 45.0 and e.hi > 56.0  # the floor's between-process spread, not the windows'
    assert e.basis == "1 repeat + this machine's noise floor 6.7%"
    with pytest.raises(ValueError):
        estimate([float("nan")])


def test_separation_needs_between_process_evidence():
    from cubic.core.stats import NoiseModel, ratio_interval, separated

    a, b = estimate([100.0, 101.0, 99.0]), estimate([90.0, 91.0, 89.0])
    assert a.separated_above(b) and not b.separated_above(a)
    noisy = estimate([100.0, 60.0, 95.0])
    assert not noisy.separated_above(b)
    # one run each is never separated, however far apart (no second look)
    floor = NoiseModel(0.01, 20, "this machine's noise floor")
    one_a, one_b = estimate([200.0], noise=floor), estimate([100.0], noise=floor)
    assert not separated(one_a, one_b)
    # the ratio: exp(difference of log-means) with a Welch interval
    r, lo, hi = ratio_interval(a, b)
    assert r == pytest.approx(math.exp(a.mean_log - b.mean_log)) and 1 < lo < r < hi
    va, vb = a.sd ** 2 / 3, b.sd ** 2 / 3
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
    assert hi == pytest.approx(r * math.exp(sps.t.ppf(0.975, df) * math.sqrt(va + vb)))


def test_contention_rule():
    assert contention({"load_avg_1m": 3.5}, {}, cores=2).startswith("load average 3.50 > 2")
    assert contention({"load_avg_1m": 1.9}, {}, cores=2) is None
    # the runner's load around the run: the larger of start and end
    assert contention({"load_avg_1m_start": 0.5, "load_avg_1m_end": 2.5}, {}, cores=2) is not None
    assert contention({"load_avg_1m_start": 0.5, "load_avg_1m_end": 1.5}, {}, cores=2) is None
    # cpu_util (CPU time / wall / threads) x threads below half of the usable cores (min(threads, cores))
    assert "cpu_util" in contention({"load_avg_1m": 0.5, "cpu_util": 0.3}, {"threads": 1}, cores=2)
    assert contention({"load_avg_1m": 0.5, "cpu_util": 0.9}, {"threads": 1}, cores=2) is None
    assert contention({"cpu_util": 0.15}, {"threads": 8}, cores=2) is None  # 1.2 cores busy of 2 usable
    assert contention({"cpu_util": 0.1}, {"threads": 8}, cores=2) is not None  # 0.8 of 2
    # a distributed run whose ranks fill the cores (2 ranks x 1 thread on 2): its own load is above them
    # (measured 2.0-3.0 on idle cores), so the ranks' CPU utilisation decides, not the load
    dist = {"load_avg_1m_start": 2.4, "load_avg_1m_end": 2.6, "world_size": 2.0}
    assert contention({**dist, "cpu_util": 0.8}, {"threads": 1}, cores=2) is None
    assert "cpu_util" in contention({**dist, "cpu_util": 0.3}, {"threads": 1}, cores=2)
    assert contention({**dist, "cpu_util": 0.8}, {"threads": 1}, cores=4) is None  # 2.6 of 4: room left
    assert contention({**dist, "load_avg_1m_end": 4.5, "cpu_util": 0.8}, {"threads": 1}, cores=4) is not None
    assert contention({**dist, "world_size": 1.0, "cpu_util": 0.8}, {"threads": 1}, cores=2) is not None  # one rank
    # runners without the per-run figures: the load average at start/end of the run, in extra
    assert contention({}, {"loadavg_1m_start": 0.2, "loadavg_1m": 4.0}, cores=2) is not None
    assert contention({}, {}, cores=2) is None
    # most timed steps preempted by another process (the load average lags a run of seconds)
    assert "preempted" in contention({"load_avg_1m": 0.5, "cpu_util": 0.9, "steps_preempted_frac": 0.6}, {"threads": 1},
                                     cores=2)
    assert contention({"load_avg_1m": 0.5, "cpu_util": 0.9, "steps_preempted_frac": 0.2}, {"threads": 1}, cores=2) is None


def test_contended_repeats_are_excluded_while_clean_ones_exist():
    reps = [Repeat({"examples_per_s": 100.0, "step_time_median_ms": 10.0}),
            Repeat({"examples_per_s": 104.0, "step_time_median_ms": 9.6}),
            Repeat({"examples_per_s": 30.0, "step_time_median_ms": 33.0}, contended=True)]
    p = pool(reps)
    assert p.n == 3 and p.n_used == 2 and p.n_contended == 1 and not p.contended and p.good == 2
    assert p.metrics["examples_per_s"] == pytest.approx(102.0)
    assert p.metrics["examples_per_s_ci_lo"] < 102.0 < p.metrics["examples_per_s_ci_hi"]
    assert p.metrics["step_time_ci_lo_ms"] < p.metrics["step_time_median_ms"] < p.metrics["step_time_ci_hi_ms"]
    assert p.metrics["repeats"] == 2 and p.metrics["repeats_contended"] == 1
    # all contended: all used, and the estimate says so
    q = pool([Repeat({"examples_per_s": 30.0}, True), Repeat({"examples_per_s": 40.0}, True)])
    assert q.contended and q.n_used == 2 and q.good == 0 and q.metrics["examples_per_s"] == 35.0


def test_pool_results_gives_a_result_with_pooled_figures():
    def r(eps, load=0.1):
        return Result(status="ok", metrics={"examples_per_s": eps, "step_time_median_ms": 1000 / eps,
                                            "ne_end": 0.8, "load_avg_1m": load},
                      phases_ms={"dense_fwd": 1000 / eps}, fingerprint={"cpu_count": 2}, wall_time_s=2.0)

    out = pool_results([r(100.0), r(110.0), r(20.0, load=9.0), Result.failed("oom", "x")])
    assert out.ok and out.metrics["examples_per_s"] == 105.0 and out.metrics["ne_end"] == 0.8
    assert out.extra["pooled"]["n_contended"] == 1 and out.extra["pooled"]["n_used"] == 2
    assert out.wall_time_s == 6.0  # what the repeats cost


def test_the_machines_noise_is_pooled_into_a_configs_few_repeats():
    from cubic.core.stats import noise_model

    # many configs, each repeated twice, with about 3% multiplicative noise
    groups = [[100.0 * f, 100.0 * f * 1.04] for f in (1, 2, 3, 5, 8, 13, 21, 34)]
    m = noise_model(groups)
    assert m.df == 8 and m.sd == pytest.approx(math.log(1.04) / math.sqrt(2))
    own = estimate([100.0, 104.0])  # t(1) = 12.7: an interval too wide to rank anything
    pooled = estimate([100.0, 104.0], noise=m)  # t(9) with the machine's spread
    assert pooled.rel_width < own.rel_width / 5 and pooled.lo < 100.0 and pooled.hi > 104.0
    one = estimate([100.0], within=(99.0, 101.0), noise=m)  # one repeat: the machine's spread, not the run's
    assert one.lo < 99.0 and one.hi > 101.0 and one.basis.startswith("1 repeat + this machine")
    assert noise_model([[1.0], [2.0]]) is None


def test_a_rate_over_a_few_campaigns_has_an_exact_interval_and_says_what_would_resolve_it():
    """cubic.core.stats.rate_interval / trials_to_resolve: a benchmark's "0 wrong of 15" or "19 of 20
    covered" is a rate with an interval; a target is resolved only when it lies on the target's side."""
    from cubic.core.stats import rate_interval, trials_to_resolve

    r, lo, hi = rate_interval(0, 15)
    assert r == 0 and lo == 0 and hi == pytest.approx(1 - 0.025 ** (1 / 15))  # the exact bound for 0 of n
    r, lo, hi = rate_interval(19, 20)
    assert r == 0.95 and 0.70 < lo < 0.9 < hi < 1  # "met" at 90%, not resolved
    assert all(math.isnan(x) for x in rate_interval(0, 0))
    # 0 of n below 5%: n with (1 - 0.05)^n <= 0.025, i.e. 72; and the interval there does resolve it
    n = trials_to_resolve(0.0, 0.05, above=False)
    assert n == 72 and rate_interval(0, n)[2] < 0.05 <= rate_interval(0, n - 1)[2]
    n = trials_to_resolve(0.975, 0.9, above=True)
    assert rate_interval(round(0.975 * n), n)[1] > 0.9
    assert trials_to_resolve(0.9, 0.9, above=True) is None and trials_to_resolve(0.1, 0.05, above=False) is None


def test_a_paired_ratio_is_the_geometric_mean_of_the_pairs_with_a_t_interval_on_their_logs():
    """cubic.core.stats.paired_ratio: the confirm step's speedup and answer_calibration's second look
    both use it. A drift common to both sides of each pair is gone before it is called (the pairs' log
    ratios), so only the pairs' own spread widens it; one pair has no spread, hence no interval."""
    from cubic.core.stats import paired_ratio

    logs = [math.log(2.0) + d for d in (0.05, -0.05, 0.02, -0.02)]
    ratio, lo, hi = paired_ratio(logs)
    sd = sps.tstd(logs)
    half = sps.t.ppf(0.975, 3) * sd / 2
    assert math.isclose(ratio, 2.0)
    assert math.isclose(lo, 2.0 * math.exp(-half)) and math.isclose(hi, 2.0 * math.exp(half))
    assert paired_ratio(logs[:1]) is None and paired_ratio([]) is None
    assert paired_ratio([math.log(1.5)] * 3) == pytest.approx((1.5, 1.5, 1.5))  # no spread: a zero-width interval
