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

    # this stop's kept dlrm-small run: median +1.8%, the repeats spread from -21% to +36%
    t = overhead_targets({"w": _row([8.22, 9.66, 8.97, 9.11, 8.22], [6.36, 7.11, 9.09, 8.95, 10.41])})
    median = t["runner overhead vs bare loop, w (% per step, measured on this CPU)"]
    resolved = t["runner overhead vs bare loop, w: under 5% resolved (upper 95% bound of the paired mean)"]
    assert median["met"] is True and abs(median["measured"] - 1.79) < 0.05
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
