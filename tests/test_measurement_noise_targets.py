"""experiments/measurement_noise.py: the second look at the interval itself (does the other pass fall
inside a pass's 95% interval?) as a target, met or missed with the drift named."""


def _analysis(inside_at_4: float) -> dict:
    return {"configs_compared": 60, "other_pass_inside_interval_by_repeats": {"2": 0.96, "3": 0.82, "4": inside_at_4},
            "pass_noise_median_abs_log_ratio": 0.122, "repeat_noise_median_abs_log_ratio": 0.061,
            "machine_speed": {"speed_probe_ms_p10_p50_p90": [0.96, 1.04, 1.14]}}


def test_the_other_pass_inside_the_interval_is_a_target_with_its_reason():
    from experiments.measurement_noise import _other_pass_target

    missed = _other_pass_target(_analysis(0.6333), 4)
    assert missed["met"] is False and missed["target"] == 0.9 and missed["over"] == 120
    lo, hi = missed["ci95_approx"]
    assert lo < 0.6333 < hi < 0.9
    assert "12.2%" in missed["reason"] and "6.1%" in missed["reason"] and "close in time" in missed["reason"]
    assert "2: 0.96, 3: 0.82, 4: 0.63" in missed["reason"]
    met = _other_pass_target(_analysis(0.95), 4)
    assert met["met"] is True and "reason" not in met
    assert _other_pass_target({"configs_compared": 5, "other_pass_inside_interval_by_repeats": {}}, 1)["met"] is False


def test_the_pass_to_pass_move_splits_into_a_common_shift_and_configs_against_each_other():
    """Two passes of three configurations, the second 10% slower for all alike: the shift is common,
    configurations do not move against each other, and the shift taken out every pass is inside."""
    import math

    from experiments.measurement_noise import _other_pass_target, pass_shift

    def rep(v):
        return {"examples_per_s": v, "contended": False}

    vals = {"a": [100.0, 104.0, 96.0, 101.0], "b": [200.0, 190.0, 210.0, 204.0], "c": [50.0, 52.0, 49.0, 51.0]}
    passes = [{"configs": {k: {"ok": True, "repeats": [rep(v * f) for v in vs]} for k, vs in vals.items()}}
              for f in (1.0, 0.9)]
    sh = pass_shift(passes, list(vals), 4)
    assert math.isclose(sh["common_shift_log"], -math.log(0.9)) and math.isclose(sh["common_shift"], 1 / 0.9 - 1)
    assert sh["configs_against_each_other_sd_log"] < 1e-9 < sh["repeat_noise_alone_sd_log"]
    assert sh["other_pass_inside_interval_common_shift_removed"] == 1.0
    missed = _other_pass_target({**_analysis(0.63), "pass_shift": sh}, 4)
    assert "common to every configuration" in missed["reason"] and "11.1%" in missed["reason"]


def test_probe_scaling_takes_out_a_drift_the_probe_saw():
    """Pass 2 runs 10% slower for every configuration and its speed probe takes 10% longer: in the
    machine's speed units (throughput x probe / median probe) the passes agree, the shift is gone and
    the probe-scaled interval holds the other pass, while the examples/s interval does not."""
    import math

    from experiments.measurement_noise import _probe_scaled_target, analyse, probe_scaled

    vals = {"a": [100.0, 104.0, 96.0, 101.0], "b": [200.0, 190.0, 210.0, 204.0], "c": [50.0, 52.0, 49.0, 51.0],
            "d": [80.0, 79.0, 82.0, 81.0]}

    def rep(v, probe):
        return {"examples_per_s": v, "contended": False, "speed_probe_ms": probe}

    passes = [{"runs": 16, "wall_s": 10.0,
               "configs": {k: {"ok": True, "repeats": [rep(v / f, f) for v in vs]} for k, vs in vals.items()}}
              for f in (1.0, 1.1)]
    scaled = probe_scaled(passes)
    # the median probe of all runs is 1.05 ms: pass 1's runs (probe 1.0) scale by 1 / 1.05
    assert all(math.isclose(x["examples_per_s"] * 1.05, v)
               for x, v in zip(scaled[0]["configs"]["a"]["repeats"], vals["a"]))
    an = analyse(passes, 4)
    assert an["pass_shift"]["common_shift"] > 0.09 and an["other_pass_inside_interval_by_repeats"][4] < 0.5
    ps = an["probe_scaled"]
    assert ps["common_shift"] < 1e-9 and ps["other_pass_inside_interval_by_repeats"][4] == 1.0
    t = _probe_scaled_target(an, 4)
    assert t["met"] is True and t["examples_per_s_measured"] < 0.5 and "found_on" in t
    assert "what_this_run_tests" not in t  # a drift the probe took away: this run tests it
    # runs without a probe (a GPU's) leave nothing to scale: the target says so instead of passing
    for p in passes:
        for c in p["configs"].values():
            for r in c["repeats"]:
                r.pop("speed_probe_ms")
    t = _probe_scaled_target(analyse(passes, 4), 4)
    assert t["met"] is False and "no speed probe" in t["reason"]


def test_a_run_without_drift_says_it_does_not_test_the_probe():
    """Two passes that did not move: both intervals hold the other pass, and the probe target says this
    run shows only the probe's cost (its widths and noise beside examples/s'), not a drift taken away."""
    from experiments.measurement_noise import _probe_scaled_target, analyse

    vals = {"a": [100.0, 104.0, 96.0, 101.0], "b": [200.0, 190.0, 210.0, 204.0], "c": [50.0, 52.0, 49.0, 51.0]}
    probes = [1.0, 1.1, 0.95, 1.05]
    passes = [{"runs": 12, "wall_s": 10.0, "configs": {k: {"ok": True, "repeats": [
        {"examples_per_s": v, "contended": False, "speed_probe_ms": q} for v, q in zip(vs, probes)]}
        for k, vs in vals.items()}} for _ in range(2)]
    t = _probe_scaled_target(analyse(passes, 4), 4)
    assert t["examples_per_s_measured"] == 1.0 and "not the drift" in t["what_this_run_tests"]
    assert set(t["interval_rel_width_median"]) == {"examples_per_s", "probe_scaled"}
