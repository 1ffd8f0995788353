"""Is a pooled measurement repeatable? Test-retest of cubic's measurements on the real CPU space.

Two independent measurement passes over every configuration of the real dlrm-small CPU space (the
60 configurations ``experiments/search_benchmark.py`` measures: the default space for the workload,
``load_space().for_workload(wl).enumerate()``). Each pass has its own trial store and takes R
repeats per configuration, each a fresh child process (cubic's LocalRunner, CPU, one intra-op
thread), through cubic's own path (``RunnerEvaluate`` with ``repeats``): the repeats are taken
round-robin, a fresh random order of the configurations per round, so that a burst of load hits
different configurations in different rounds; a contended repeat is re-taken once (the store's
rule). Each pass's estimate of a configuration is its pooled estimate (cubic.core.stats: median of
the uncontended repeats, 95% interval).

How a run is timed (cubic.runners.local, cubic.core.train.window_stats): 5 untimed warm-up steps,
then 20 timed ones; steps during which another process took the run's core (involuntary context
switches) are left out, then leading steps still slower than the run's steady level (a fresh
process settles over 5-10 steps: allocator growth, page faults); the run's figure is the median
over windows of what is left. A run with more than half of its steps preempted is contended.

Reported (every figure measured on this CPU):
- test-retest Kendall tau between the two passes' estimates, pooled over the first k repeats for
  k = 1..R (k = 1 is the single-sample measurement cubic used before; target for k = R: >= 0.9);
- the noise itself: median |log ratio| between two repeats of a configuration, and between passes;
- tau over the pairs of configurations that either pass separates (95 % intervals apart), and how
  many pairs that is: the other pairs are within noise of each other (informational);
- interval widths ((hi - lo) / median) and how often pass 2's estimate falls inside pass 1's interval;
- the fraction of repeats flagged contended and of timed steps preempted;
- the wall-time cost of the repeats (seconds per run; a pass at R repeats against one at 1).

Time: about 3.8 s per run on 2 idle cores (mostly the child's start-up: importing torch and
fbgemm, runner_overhead.json) plus 25 steps of 3-60 ms (about 0.45 s on average over the space),
so the full run -- 60 configurations x 2 passes x R=2 repeats = 240 runs -- takes about 17 min, more
where contended runs are re-taken. Run it on a quiet machine:

    .venv/bin/python experiments/measurement_noise.py            # full, ~17 min on 2 idle cores
    .venv/bin/python experiments/measurement_noise.py --quick    # 5 configurations, 1-2 min
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from cost_models.proxy import kendall_tau  # noqa: E402
from cubic.codesign.evaluate import RunnerEvaluate  # noqa: E402
from cubic.core.stats import Repeat, noise_models, pool  # noqa: E402
from cubic.core.store import TrialStore  # noqa: E402
from cubic.core.workloads import DEFAULT_WORKLOADS  # noqa: E402
from experiments.common import png_path, run_context, write_result  # noqa: E402
from search.space import load_space  # noqa: E402

TARGET_TAU = 0.9
WORK = ROOT / ".cubic" / "measurement_noise"
LABEL = "measured on this CPU"
POOLING = ("cubic.core.stats.pool: median of the uncontended repeats; 95% t-interval on logs with the config's own "
           "spread pooled with the pass's machine noise model (every configuration's first k repeats, chosen as "
           "pooling chooses them), as the store serves it")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def measure_pass(index: int, space, points, workload, runner, repeats: int, steps: int, warmup: int,
                 seed: int, tag: str) -> dict:
    """One pass: its own store, ``repeats`` rounds over ``points`` in a fresh order per round."""
    db = WORK / f"{tag}pass{index}.db"
    db.unlink(missing_ok=True)
    store = TrialStore(f"sqlite:///{db}")
    rng = random.Random(seed)
    t0 = time.time()
    for r in range(1, repeats + 1):
        order = list(points)
        rng.shuffle(order)
        # wanting r repeats of each: one more per configuration, or two where a contended one is re-taken
        ev = RunnerEvaluate(workload, runner, space, steps=steps, warmup=warmup, store=store, repeats=r)
        for j, p in enumerate(order):
            e = ev(p)
            val = f"{e.metrics['examples_per_s']:,.0f}" if e.ok else e.failure_kind
            log(f"  pass {index} round {r}/{repeats} {j + 1}/{len(order)}: {space.key(p)[:10]} -> {val}")
    wall = time.time() - t0
    trials = store.trials()
    out = {"wall_s": wall, "runs": len(trials), "configs": {}}
    for p in points:
        cfg = space.to_config(p)
        rows = [t for t in trials if t.config_hash == cfg.content_hash()]
        ok = [t for t in rows if t.status == "ok"]
        out["configs"][space.key(p)] = {
            "point": p, "ok": bool(ok),
            "failure_kind": None if ok else (rows[-1].failure_kind if rows else "missing"),
            "repeats": [{"examples_per_s": t.metrics.get("examples_per_s"), "contended": bool(t.contended),
                         "steps_preempted_frac": t.metrics.get("steps_preempted_frac"),
                         "timing_steps": t.metrics.get("timing_steps"),
                         "timing_steps_dropped": t.metrics.get("timing_steps_dropped"),
                         "cpu_util": t.metrics.get("cpu_util"),
                         "speed_probe_ms": t.metrics.get("speed_probe_ms"), "steal_frac": t.metrics.get("steal_frac"),
                         "others_busy_frac": t.metrics.get("others_busy_frac"),
                         "load_avg_1m": max((v for v in (t.metrics.get("load_avg_1m"), t.metrics.get("load_avg_1m_end"),
                                                         t.result.extra.get("loadavg_1m")) if v is not None),
                                            default=None),
                         "wall_time_s": t.result.wall_time_s} for t in ok]}
    store.close()
    return out


def pooled_first(reps: list[dict], k: int, noise=None) -> dict | None:
    """The pooled estimate of a configuration from its first k repeats (``noise``: the pass's
    machine noise model from the first k repeats of every configuration, as the store pools it)."""
    use = reps[:k]
    if not use:
        return None
    p = pool([Repeat({"examples_per_s": r["examples_per_s"]}, r["contended"]) for r in use], noise)
    e = p.estimates.get("examples_per_s")
    value = p.metrics["examples_per_s"]
    return {"value": value, "lo": e.lo if e else value, "hi": e.hi if e else value, "n_used": p.n_used}


def estimates_at(one_pass: dict, k: int) -> dict[str, dict | None]:
    """Every configuration's estimate pooled over its first k repeats, with the pass's noise model."""
    cfgs = one_pass["configs"]
    used = ([r for r in c["repeats"][:k] if not r["contended"]] or c["repeats"][:k] for c in cfgs.values())
    noise = noise_models([[{"examples_per_s": r["examples_per_s"]} for r in u] for u in used])
    return {key: pooled_first(c["repeats"], k, noise) for key, c in cfgs.items()}


def median_abs_log_ratio(pairs: list[tuple[float, float]]) -> float | None:
    """Median over pairs of |log(a / b)|: the typical relative difference of two measurements."""
    r = [abs(np.log(a / b)) for a, b in pairs if a and b and a > 0 and b > 0]
    return float(np.median(r)) if r else None


def separated_pairs(ea: list[dict], eb: list[dict]) -> dict:
    """The ranking over pairs of configurations that either pass can tell apart (their 95 % intervals
    do not overlap in that pass): how many there are, and Kendall's tau over them ((concordant -
    discordant) / pairs between the passes' estimates). Pairs within noise of each other in both
    passes are a coin toss for any measurement this precise; they are what holds tau below 1."""
    n = len(ea)
    conc = disc = sep = 0
    for i in range(n):
        for j in range(i + 1, n):
            x1, x2, y1, y2 = ea[i], ea[j], eb[i], eb[j]
            apart = x1["lo"] > x2["hi"] or x2["lo"] > x1["hi"] or y1["lo"] > y2["hi"] or y2["lo"] > y1["hi"]
            if not apart:
                continue
            sep += 1
            sign = (x1["value"] - x2["value"]) * (y1["value"] - y2["value"])
            conc += sign > 0
            disc += sign < 0
    pairs = n * (n - 1) // 2
    return {"pairs": pairs, "separated_pairs": sep, "separated_fraction": sep / pairs if pairs else None,
            "kendall_tau_separated": (conc - disc) / sep if sep else None, "discordant_separated": disc}


def machine_speed(passes: list[dict], keys: list[str], repeats: int) -> dict:
    """Does the machine's own speed explain the noise? Per run: the throughput's deviation from its
    configuration's mean (logs, over every repeat of both passes) against the speed probe's deviation
    from its median (cubic.runners.local.speed_probe, around each run). A strong negative Spearman
    correlation says runs were slow because the machine was, whatever the config. Also tau when each
    repeat is scaled by its probe (exploratory: not cubic's estimate, not the target)."""
    from scipy.stats import spearmanr

    reps = {k: [r for p in passes for r in p["configs"][k]["repeats"]] for k in keys}
    probes = [r["speed_probe_ms"] for v in reps.values() for r in v if r.get("speed_probe_ms")]
    if len(probes) < 4:
        return {}
    ref = float(np.median(probes))
    x, y = [], []
    for v in reps.values():
        ok = [r for r in v if r.get("speed_probe_ms") and r.get("examples_per_s")]
        if len(ok) < 2:
            continue
        m = np.mean([np.log(r["examples_per_s"]) for r in ok])
        x += [np.log(r["examples_per_s"]) - m for r in ok]
        y += [np.log(r["speed_probe_ms"] / ref) for r in ok]
    rho = spearmanr(x, y).statistic if len(x) >= 4 else None

    def scaled(p: dict, k: str) -> float | None:  # the median of the first repeats, in probe_scaled's units
        v = [r["examples_per_s"] for r in p["configs"][k]["repeats"][:repeats]]
        return float(np.median(v)) if v else None

    sp = probe_scaled(passes)
    a = [scaled(sp[0], k) for k in keys]
    b = [scaled(sp[1], k) for k in keys]
    both = [(u, w) for u, w in zip(a, b) if u and w]
    probe_spread = np.percentile(probes, [10, 50, 90]).tolist()
    return {"spearman_throughput_vs_probe_deviation": None if rho is None or not np.isfinite(rho) else float(rho),
            "speed_probe_ms_p10_p50_p90": probe_spread,
            "kendall_tau_probe_scaled": kendall_tau([u for u, _ in both], [w for _, w in both]) if len(both) >= 2
            else None}


def probe_scaled(passes: list[dict]) -> list[dict]:
    """The passes in the machine's speed units: every run's throughput times its speed probe over the
    median probe of all runs (cubic.runners.local.speed_probe, timed around the run: a machine k times
    slower takes k times longer for the probe and does k times fewer examples per second). The
    exponent is 1 by that reasoning, not fitted; a run without a probe is left out."""
    probes = [r["speed_probe_ms"] for p in passes for c in p["configs"].values() for r in c["repeats"]
              if r.get("speed_probe_ms")]
    ref = float(np.median(probes)) if probes else None
    out = []
    for p in passes:
        cfgs = {}
        for k, c in p["configs"].items():
            reps = [{**r, "examples_per_s": r["examples_per_s"] * r["speed_probe_ms"] / ref} for r in c["repeats"]
                    if ref and r.get("speed_probe_ms") and r.get("examples_per_s")]
            cfgs[k] = {**c, "repeats": reps, "ok": c["ok"] and bool(reps)}
        out.append({**p, "configs": cfgs})
    return out


def probe_scaled_analysis(passes: list[dict], repeats: int) -> dict:
    """The interval's second look again, on probe-scaled throughputs (:func:`probe_scaled`): how often the
    other pass falls inside, the ranking, the width, and the shift left between the passes."""
    scaled = probe_scaled(passes)
    if not any(c["ok"] for c in scaled[0]["configs"].values()):
        return {}
    an = analyse(scaled, repeats, nested=False)
    w = an["interval_rel_width_by_repeats"].get(repeats) or {}
    return {"other_pass_inside_interval_by_repeats": an["other_pass_inside_interval_by_repeats"],
            "kendall_tau_by_repeats": an["kendall_tau_by_repeats"], "interval_rel_width_median": w.get("median"),
            "repeat_noise_median_abs_log_ratio": an["repeat_noise_median_abs_log_ratio"],
            "pass_noise_median_abs_log_ratio": an["pass_noise_median_abs_log_ratio"],
            "common_shift": (an["pass_shift"] or {}).get("common_shift"), "configs_compared": an["configs_compared"]}


def pass_shift(passes: list[dict], keys: list[str], repeats: int) -> dict:
    """What moved between the passes: each configuration's pass-to-pass difference of its mean log
    throughput over ``repeats`` repeats, split into the shift common to every configuration (the
    machine's speed: it cancels in a ratio of two configurations measured together) and the spread
    of configurations against each other, beside what repeat noise alone would give that spread
    (sqrt(2 s^2 / R), s the within-pass sd of one run's log throughput). The speedup's pairs
    (cubic.codesign.confirm.SPEEDUP_PAIRS) rest on the second being small."""
    from cubic.core.stats import noise_model

    runs = {k: [[r["examples_per_s"] for r in p["configs"][k]["repeats"][:repeats] if r.get("examples_per_s")]
                for p in passes] for k in keys}
    d = [np.mean(np.log(a)) - np.mean(np.log(b)) for a, b in runs.values() if a and b]
    noise = noise_model(g for pair in runs.values() for g in pair)  # within-pass, pooled over configurations
    if len(d) < 3 or noise is None:
        return {}
    inside = []  # pass 2, its common shift taken out, inside pass 1's interval (and vice versa)
    at_a, at_b = estimates_at(passes[0], repeats), estimates_at(passes[1], repeats)
    shift = float(np.mean(d))
    for k in keys:
        x, y = at_a[k], at_b[k]
        if x and y:
            inside += [x["lo"] <= y["value"] * math.exp(shift) <= x["hi"],
                       y["lo"] <= x["value"] / math.exp(shift) <= y["hi"]]
    return {"common_shift_log": shift, "common_shift": math.expm1(abs(shift)),
            "configs_against_each_other_sd_log": float(np.std(d, ddof=1)),
            "repeat_noise_alone_sd_log": noise.sd * math.sqrt(2 / repeats), "configs": len(d),
            "other_pass_inside_interval_common_shift_removed": float(np.mean(inside)) if inside else None}


def analyse(passes: list[dict], repeats: int, nested: bool = True) -> dict:
    """Every figure of the study from the two passes; ``nested`` adds the machine-speed figures and the
    probe-scaled second analysis (off for that second analysis itself)."""
    a, b = passes
    keys = [k for k in a["configs"] if a["configs"][k]["ok"] and b["configs"][k]["ok"]]
    taus, widths, coverage = {}, {}, {}
    for k in range(1, repeats + 1):
        at_a, at_b = estimates_at(a, k), estimates_at(b, k)
        ea, eb = [at_a[c] for c in keys], [at_b[c] for c in keys]
        both = [(x, y) for x, y in zip(ea, eb) if x and y]
        if len(both) >= 2:
            taus[k] = kendall_tau([x["value"] for x, _ in both], [y["value"] for _, y in both])
        rel = [(x["hi"] - x["lo"]) / x["value"] for x, _ in both] + [(y["hi"] - y["lo"]) / y["value"] for _, y in both]
        widths[k] = {"median": float(np.median(rel)) if rel else None, "max": float(max(rel)) if rel else None}
        if k >= 2:  # does pass 2's estimate fall inside pass 1's 95% interval (and vice versa)?
            inside = [x["lo"] <= y["value"] <= x["hi"] for x, y in both] + [y["lo"] <= x["value"] <= y["hi"]
                                                                             for x, y in both]
            coverage[k] = float(np.mean(inside)) if inside else None
    at_a, at_b = estimates_at(a, repeats), estimates_at(b, repeats)
    both = [(at_a[c], at_b[c]) for c in keys if at_a[c] and at_b[c]]
    separated = separated_pairs([x for x, _ in both], [y for _, y in both]) if len(both) >= 2 else {}
    # the noise itself: two repeats of one config in one pass, and the two passes' pooled estimates
    repeat_pairs = [(c["repeats"][0]["examples_per_s"], c["repeats"][1]["examples_per_s"])
                    for p in passes for c in p["configs"].values() if len(c["repeats"]) >= 2]
    all_reps = [r for p in passes for c in p["configs"].values() for r in c["repeats"]]
    pre = [r["steps_preempted_frac"] for r in all_reps if r.get("steps_preempted_frac") is not None]
    dropped = [r["timing_steps_dropped"] for r in all_reps if r.get("timing_steps_dropped") is not None]
    runs = sum(p["runs"] for p in passes)
    wall = sum(p["wall_s"] for p in passes)
    return {"configs_compared": len(keys), "kendall_tau_by_repeats": taus, "interval_rel_width_by_repeats": widths,
            "other_pass_inside_interval_by_repeats": coverage,
            "contended_fraction": (sum(r["contended"] for r in all_reps) / len(all_reps)) if all_reps else None,
            "repeat_noise_median_abs_log_ratio": median_abs_log_ratio(repeat_pairs),
            "pass_noise_median_abs_log_ratio": median_abs_log_ratio([(x["value"], y["value"]) for x, y in both]),
            "separated": separated,
            "steps_preempted_frac_median": float(np.median(pre)) if pre else None,
            "steps_preempted_frac_p90": float(np.percentile(pre, 90)) if pre else None,
            "timing_steps_dropped_median": float(np.median(dropped)) if dropped else None,
            "machine_speed": machine_speed(passes, keys, repeats) if nested else {},
            "pass_shift": pass_shift(passes, keys, repeats),
            **({"probe_scaled": probe_scaled_analysis(passes, repeats)} if nested else {}),
            "runs": runs, "wall_s": wall, "seconds_per_run": wall / runs if runs else None,
            "wall_s_per_pass_at_1_repeat_est": (wall / runs) * len(a["configs"]) if runs else None,
            "wall_s_per_pass_at_R_repeats": wall / 2}


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    an = res["analysis"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ks = sorted(int(k) for k in an["kendall_tau_by_repeats"])
    ax1.plot(ks, [an["kendall_tau_by_repeats"][k] for k in ks], "o-", label=LABEL)
    ax1.axhline(TARGET_TAU, color="k", ls="--", lw=0.8, label=f"target {TARGET_TAU}")
    ax1.set_xticks(ks)
    ax1.set_xlabel("repeats pooled per configuration (k)")
    ax1.set_ylabel("test-retest Kendall tau between passes")
    ax1.set_title(f"repeatability of the ranking ({LABEL})")
    ax1.legend(fontsize=8)
    a, b = res["passes"]
    R = res["settings"]["repeats"]
    at_a, at_b = estimates_at(a, R), estimates_at(b, R)
    for key in a["configs"]:
        x, y = at_a[key], at_b[key]
        if not (x and y):
            continue
        ax2.errorbar(x["value"], y["value"], xerr=[[x["value"] - x["lo"]], [x["hi"] - x["value"]]],
                     yerr=[[y["value"] - y["lo"]], [y["hi"] - y["value"]]], fmt="o", ms=3, lw=0.6, alpha=0.7)
    lims = ax2.get_xlim()
    ax2.plot(lims, lims, "k--", lw=0.8)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel(f"pass 1 examples/s (median of {R}, 95% interval)")
    ax2.set_ylabel(f"pass 2 examples/s (median of {R}, 95% interval)")
    ax2.set_title(f"dlrm-small CPU space, {res['analysis']['configs_compared']} configs ({LABEL})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _why_tau_missed(an: dict, repeats: int) -> str:
    """The missed tau target's reason, from this run's own figures."""
    sep, speed = an["separated"], an.get("machine_speed") or {}
    p10, _, p90 = (speed.get("speed_probe_ms_p10_p50_p90") or [None] * 3)
    return (f"one repeat's noise is {an['repeat_noise_median_abs_log_ratio']:.1%} (median |log ratio| between two "
            f"repeats of a configuration) with {an['contended_fraction']:.0%} of repeats flagged contended: the "
            "machine itself changes speed"
            + (f" (a fixed speed probe's 10th-90th percentile {p10:.2f}-{p90:.2f} ms; throughput deviation vs probe "
               f"deviation Spearman {speed.get('spearman_throughput_vs_probe_deviation', float('nan')):.2f})"
               if p10 and p90 else "")
            + f"; {sep.get('pairs', 0) - sep.get('separated_pairs', 0)} of {sep.get('pairs')} pairs of configurations "
            f"are within that noise of each other and flip between passes, while the {sep.get('separated_pairs')} "
            f"separated pairs keep their order (tau {sep.get('kendall_tau_separated', float('nan')):.3f}); "
            f"{repeats} repeats cannot resolve the near-ties")


def _coverage(cov: dict, configs: int, repeats: int) -> dict | None:
    """How often the other pass fell inside the interval at ``repeats`` repeats, as a 0.9 target with an
    approximate interval (each configuration counted both ways: the comparisons are not independent)."""
    from cubic.core.stats import rate_interval

    v = cov.get(repeats, cov.get(str(repeats)))
    if v is None:
        return None
    n = 2 * configs
    _, lo, hi = rate_interval(round(v * n), n)
    return {"measured": v, "target": 0.9, "met": bool(v >= 0.9), "ci95_approx": [lo, hi], "over": n}


def _other_pass_target(an: dict, repeats: int) -> dict:
    """A second look at the interval itself: cubic's 95% interval from a pass's R repeats (pooled with
    the pass's noise model, as a campaign's) is meant for what a fresh run measures; how often does the
    other pass, minutes later, fall inside it? Each configuration is counted both ways, so the exact
    interval over the comparisons is approximate (pairs are not independent)."""
    cov = an["other_pass_inside_interval_by_repeats"]
    out = _coverage(cov, an["configs_compared"], repeats)
    if out is None:
        return {"measured": None, "target": 0.9, "met": False, "reason": f"fewer than 2 repeats ({repeats})"}
    if not out["met"]:
        speed = an.get("machine_speed") or {}
        p10, _, p90 = speed.get("speed_probe_ms_p10_p50_p90") or [None] * 3
        out["reason"] = (f"the machine drifts between passes more than between back-to-back repeats (median |log "
                         f"ratio| pass to pass {an['pass_noise_median_abs_log_ratio']:.1%}, repeat to repeat "
                         f"{an['repeat_noise_median_abs_log_ratio']:.1%}"
                         + (f"; a fixed speed probe's 10th-90th percentile {p10:.2f}-{p90:.2f} ms" if p10 else "")
                         + "): the interval covers a fresh run close in time to the repeats it pools (as the confirm "
                           "step's repeats and pairs are), and a pass about 10 minutes later, its figure moved by the "
                           "machine's drift, can fall outside it; more repeats narrow it and lower this figure "
                         + f"({', '.join(f'{k}: {x:.2f}' for k, x in sorted(cov.items(), key=lambda t: int(t[0])))})")
        sh = an.get("pass_shift") or {}
        if sh:
            out["reason"] += (f". The move was common to every configuration: a shift of {sh['common_shift']:.1%}, "
                              "while configurations moved against each other by sd "
                              f"{sh['configs_against_each_other_sd_log']:.3f} "
                              f"(log; repeat noise alone: {sh['repeat_noise_alone_sd_log']:.3f}); with the shift taken "
                              f"out {sh['other_pass_inside_interval_common_shift_removed']:.2f} fall inside, so "
                              "comparisons measured together survive it (the speedup's pairs) where an absolute "
                              "figure does not")
    return out


def _probe_scaled_target(an: dict, repeats: int) -> dict:
    """The same second look on probe-scaled throughputs: does an interval in the machine's speed units
    hold a pass minutes later? Found on stop 48's passes (reanalysed in stop 51: 0.98 at 4 repeats where
    examples/s gave 0.63); a run after that is its check on passes it was not found on."""
    ps = an.get("probe_scaled") or {}
    out = _coverage(ps.get("other_pass_inside_interval_by_repeats") or {}, ps.get("configs_compared", 0), repeats)
    if out is None:
        return {"measured": None, "target": 0.9, "met": False,
                "reason": "no speed probe in the runs (a non-CPU device) or fewer than 2 repeats"}
    out.update({"found_on": ("stop 48's passes (started 2026-11-29T06:05Z, code b063e65), reanalysed in stop 51: "
                             "there the rule was found, not checked; passes measured after it are its check"),
                "shift_left": ps.get("common_shift"),
                "examples_per_s_measured": an["other_pass_inside_interval_by_repeats"].get(repeats)})
    if not out["met"]:
        raw, left = (an.get("pass_shift") or {}).get("common_shift"), ps.get("common_shift")
        moved = (f" (the shift between the passes {raw:.1%} in examples/s, {left:.1%} probe-scaled)"
                 if raw and left else "")
        out["reason"] = ("the probe does not take the machine's drift away" + moved + ": the drift is not only in what "
                         "the probe times (one core's arithmetic), e.g. memory or cache pressure from a neighbour")
    # what the probe costs beside what it buys: the same intervals' widths and one repeat's noise
    w = (an.get("interval_rel_width_by_repeats") or {}).get(repeats) or {}
    out["interval_rel_width_median"] = {"examples_per_s": w.get("median"),
                                        "probe_scaled": ps.get("interval_rel_width_median")}
    out["repeat_noise_median_abs_log_ratio"] = {"examples_per_s": an.get("repeat_noise_median_abs_log_ratio"),
                                                "probe_scaled": ps.get("repeat_noise_median_abs_log_ratio")}
    sh = an.get("pass_shift") or {}
    if sh and abs(sh["common_shift_log"]) <= sh["repeat_noise_alone_sd_log"]:
        out["what_this_run_tests"] = (
            f"not the drift: the passes moved {sh['common_shift']:+.1%} alike, within repeat noise (sd "
            f"{sh['repeat_noise_alone_sd_log']:.3f} in log), so the examples/s interval held the other pass too "
            f"({out['examples_per_s_measured']:.2f}); this run shows what the probe costs where there is no drift to "
            f"take away: intervals {ps.get('interval_rel_width_median', float('nan')):.2f} wide against "
            f"{w.get('median', float('nan')):.2f}, one repeat's noise "
            f"{ps.get('repeat_noise_median_abs_log_ratio', float('nan')):.1%} against "
            f"{an.get('repeat_noise_median_abs_log_ratio', float('nan')):.1%}")
    return out


def finish(res: dict, passes: list[dict], repeats: int, name: str) -> None:
    """Analyse the passes, set the targets, write the JSON and the PNG."""
    res["settings"]["pooling"] = POOLING
    an = analyse(passes, repeats)
    taus = an["kendall_tau_by_repeats"]
    tau_r, tau_1 = taus.get(repeats, taus.get(str(repeats))), taus.get(1, taus.get("1"))
    sep = an["separated"]
    log(f"test-retest Kendall tau by repeats pooled: {taus}; contended fraction {an['contended_fraction']}; "
        f"{an['seconds_per_run']:.1f} s per run")
    log(f"noise: repeat vs repeat median |log ratio| {an['repeat_noise_median_abs_log_ratio']}, pass vs pass "
        f"{an['pass_noise_median_abs_log_ratio']}; separated pairs {sep.get('separated_pairs')}/{sep.get('pairs')}, "
        f"tau over them {sep.get('kendall_tau_separated')}; machine speed {an['machine_speed']}")
    res.update({
        "analysis": an,
        "notes": {"kendall_tau_by_repeats": f"k -> tau between the passes' estimates pooled over their first k "
                                            f"repeats; k=1 is a single sample per configuration ({LABEL})",
                  "interval_rel_width_by_repeats": f"(hi - lo) / median of each estimate's 95% interval ({LABEL}); "
                                                   "k=1 has no repeat to measure a spread from: zero width",
                  "other_pass_inside_interval_by_repeats": "how often one pass's estimate lies in the other's "
                                                           "interval (about 0.95 or more if the intervals are "
                                                           "honest and the machine did not change between passes)",
                  "wall": f"seconds of wall time ({LABEL}); a pass at 1 repeat is estimated from the mean run",
                  "contended_fraction": f"repeats flagged contended ({LABEL}); each is re-taken once",
                  "repeat_noise_median_abs_log_ratio": "median over configurations of |log(repeat 1 / repeat 2)| "
                                                       "within a pass: the noise of one measurement",
                  "pass_noise_median_abs_log_ratio": "median over configurations of |log(pass 1 / pass 2)| of "
                                                     f"the estimates pooled over {repeats} repeats",
                  "separated": "pairs of configurations whose 95% intervals do not overlap in at least one pass, "
                               "and Kendall's tau between the passes over those pairs only; the other pairs are "
                               "within measurement noise of each other, and their order is what a repeat can flip",
                  "steps_preempted_frac": "share of a run's timed steps during which another process took its "
                                          "core (cubic.core.train.window_stats leaves them out)",
                  "machine_speed": "Spearman correlation, over runs, of the throughput's deviation from its "
                                   "configuration's mean against the speed probe's deviation from its median "
                                   "(strongly negative: the machine itself was slow during those runs); tau with "
                                   "every repeat scaled by its probe is exploratory, not the target",
                  "pass_shift": "each configuration's pass-to-pass change of its mean log throughput, split into the "
                                "shift common to all (the machine's speed; it cancels in a ratio of configurations "
                                "measured together, as the speedup's back-to-back pairs are) and the spread of "
                                "configurations against each other, beside what repeat noise alone gives; and the "
                                "other-pass coverage with the common shift taken out (informational, not a target: "
                                "the interval's claim is about a fresh run, shift included)",
                  "probe_scaled": "the same figures with every run's throughput scaled by its speed probe over the "
                                  "median probe (examples/s at the machine's typical speed; exponent 1, not fitted): "
                                  "what an interval in the machine's speed units covers (the second target on it)"},
        "passes": passes,
        "informational": {"kendall_tau_over_separated_pairs": {
            "measured": sep.get("kendall_tau_separated"), "separated_pairs": sep.get("separated_pairs"),
            "pairs": sep.get("pairs"),
            "why_tau_over_all_pairs_can_stay_below_target": "tau over every pair counts pairs whose intervals "
            "overlap in both passes, i.e. configurations within measurement noise of each other (the space has "
            "clusters of configurations a few per cent apart); their order flips between passes by chance. Not a "
            "target: the target stays tau over all pairs"}},
        "targets": {
            f"test_retest_kendall_tau_at_{repeats}_repeats": {
                "measured": tau_r, "target": TARGET_TAU, "met": bool(tau_r is not None and tau_r >= TARGET_TAU),
                **({} if tau_r is not None and tau_r >= TARGET_TAU else {"reason": _why_tau_missed(an, repeats)})},
            "pooled_tau_above_single_sample_tau": {"measured": None if tau_r is None or tau_1 is None
                                                   else tau_r - tau_1, "target": 0.0,
                                                   "met": bool(tau_r is not None and tau_1 is not None
                                                               and tau_r > tau_1),
                                                   **({} if tau_r is not None and tau_1 is not None and tau_r > tau_1
                                                      else {"reason": f"pooling {repeats} repeats gave tau {tau_r} "
                                                                      f"against {tau_1} for a single sample"})},
            f"other_pass_inside_interval_at_{repeats}_repeats": _other_pass_target(an, repeats),
            f"other_pass_inside_probe_scaled_interval_at_{repeats}_repeats": _probe_scaled_target(an, repeats),
        },
    })
    out = write_result(name, res)
    plot(res, png_path(name))
    log(f"wrote {out} and {png_path(name)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 configurations, 2 repeats, short runs (1-2 min)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats per configuration per pass (default 2)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per run (default 20; quick 10)")
    ap.add_argument("--warmup", type=int, default=5,
                    help="untimed steps first (default 5: a fresh process's steps take 5-10 steps to settle)")
    ap.add_argument("--workload", default="dlrm-small")
    ap.add_argument("--reanalyse", action="store_true",
                    help="recompute the analysis, targets and PNG from the repeats in the JSON; run nothing")
    args = ap.parse_args()
    name = "measurement_noise_quick" if args.quick else "measurement_noise"
    if args.reanalyse:
        import json

        from experiments.common import RESULTS

        res = json.loads((RESULTS / f"{name}.json").read_text())
        # the runs are the stored ones (code_version: theirs); the analysis and targets are this code's
        from cubic.core.fingerprint import code_version

        res["reanalysed"] = {"code_version": code_version(), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        finish(res, res["passes"], res["settings"]["repeats"], name)
        return
    repeats = args.repeats or 2
    steps = args.steps or (10 if args.quick else 20)
    from cubic.runners.local import LocalRunner

    wl = DEFAULT_WORKLOADS[args.workload]
    space = load_space().for_workload(wl, shape=True)  # the recorded experiment's space: shape knobs included
    points = space.enumerate()
    if args.quick:
        points = points[:: max(1, len(points) // 5)][:5]
    tag = "quick-" if args.quick else ""
    WORK.mkdir(parents=True, exist_ok=True)
    ctx = run_context("measured")
    runner = LocalRunner(timeout_s=600.0, device="cpu", threads=1, eval_every=steps + args.warmup)
    log(f"{len(points)} configurations x 2 passes x {repeats} repeats, {args.warmup} warm-up + {steps} steps, "
        "1 thread, a fresh process per run")
    passes = [measure_pass(i, space, points, wl, runner, repeats, steps, args.warmup, seed=1000 + i, tag=tag)
              for i in (1, 2)]
    res = {
        **ctx, "benchmark": "measurement_noise", "label": LABEL,
        "settings": {"workload": args.workload, "configs": len(points), "passes": 2, "repeats": repeats,
                     "steps": steps, "warmup": args.warmup, "threads": 1, "device": "cpu", "quick": args.quick,
                     "runner": "LocalRunner (a fresh child process per run) via RunnerEvaluate(repeats=k), "
                               "round-robin over the configurations in a fresh random order per round",
                     "contention_rule": "cubic.core.stats.contention: load average around the run > cores, or "
                                        "cpu_util x threads < 0.5 x min(threads, cores)",
                     "space": "search.space.load_space().for_workload(dlrm-small).enumerate() (the real table of "
                              "experiments/search_benchmark.py)"},
    }
    finish(res, passes, repeats, name)
    if not args.quick:
        shutil.rmtree(WORK, ignore_errors=True)  # the per-pass stores are a work area; the JSON keeps every repeat


if __name__ == "__main__":
    main()
