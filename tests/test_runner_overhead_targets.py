"""experiments/runner_overhead.py's targets: a median under the 5% bar is not called resolved when the
paired repeats' 95% interval reaches past it (the second look a fresh re-measurement gave)."""

import statistics

from cubic.core.stats import mean_interval


def _row(runner_ms, bare_ms):
    paired = [100 * (r / b - 1) for r, b in zip(runner_ms, bare_ms)]
    mean, lo, hi = mean_interval(paired)
    s = sorted(paired)
    return {"runner_step_ms": runner_ms, "bare_step_ms": bare_ms, "failures": [], "overhead_pct": s[len(s) // 2],
            "overhead_pct_iqr": [s[1], s[-2]], "met_target": s[len(s) // 2] <= 5.0,
            "overhead_pct_mean": mean, "overhead_pct_ci95": [lo, hi], "overhead_pct_sd": statistics.stdev(paired)}


def test_a_noisy_median_under_the_bar_is_met_but_not_resolved():
    from experiments.runner_overhead import overhead_targets

    # repeats as noisy as this machine's (paired figures from -16% to +25%), median -1.2%, mean -0.4%
    t = overhead_targets({"w": _row([8.0, 10.0, 8.0, 9.0, 8.5], [9.0, 8.0, 9.5, 8.9, 8.6])})
    median = t["runner overhead vs bare loop, w (% per step, measured on this CPU)"]
    resolved = t["runner overhead vs bare loop, w: under 5% resolved (upper 95% bound of the paired mean)"]
    assert median["met"] is True and abs(median["measured"] + 1.16) < 0.05
    assert resolved["met"] is False and resolved["measured"] > 5.0
    assert "unresolved" in resolved["reason"] and "repeats would resolve it" in resolved["reason"]


def test_tight_repeats_under_the_bar_are_resolved():
    from experiments.runner_overhead import overhead_targets

    t = overhead_targets({"w": _row([10.1, 10.2, 10.15, 10.12, 10.18], [10.0, 10.0, 10.0, 10.0, 10.0])})
    resolved = t["runner overhead vs bare loop, w: under 5% resolved (upper 95% bound of the paired mean)"]
    assert resolved["met"] is True and resolved["measured"] <= 5.0 and "reason" not in resolved


def test_a_workload_without_a_comparison_is_missed_with_its_failures():
    from experiments.runner_overhead import overhead_targets

    t = overhead_targets({"w": {"failures": ["runner: crash"]}})
    (only,) = t.values()
    assert only["met"] is False and only["measured"] is None and "crash" in only["reason"]


def test_a_mean_above_the_bar_is_not_promised_to_resolve_with_more_repeats():
    from experiments.runner_overhead import overhead_targets

    t = overhead_targets({"w": _row([10.9, 10.4, 10.8, 10.2, 10.7], [10.0, 10.0, 10.0, 10.0, 10.0])})
    resolved = t["runner overhead vs bare loop, w: under 5% resolved (upper 95% bound of the paired mean)"]
    assert resolved["met"] is False and "above the 5% bar" in resolved["reason"] and "repeats would" not in resolved["reason"]
