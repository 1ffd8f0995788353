"""The trained NE check as `cubic fp8 probe` prints it (fp8.checked): the packaged record is the one the
FP8 benchmark derives from the committed results file, so the two cannot drift."""

import json
from pathlib import Path

from fp8.checked import check_line, quality_check, verdict

ROOT = Path(__file__).resolve().parents[1]


def _check(workload, mean, lo, hi, seeds=10, sites=2, **kw):
    return {"workload": workload, "placement": "recommendation", "sites": sites, "mean": mean, "ci95": [lo, hi],
            "seeds": seeds, "met": -0.001 <= lo and hi <= 0.001, "not_judged": False, "full_precision_end_ne": 0.92,
            **kw}


def test_the_packaged_check_is_the_committed_results_files():
    from experiments.fp8_benchmark import quality_check_record

    results = json.loads((ROOT / "results" / "fp8_benchmark.json").read_text())
    assert quality_check() == json.loads(json.dumps(quality_check_record(results)))


def test_each_verdict_says_which_side_of_the_bar_the_interval_lies():
    assert verdict(_check("w", 0.0002, -0.0003, 0.0008)) == "within +-0.1%"
    assert verdict(_check("w", 0.003, 0.0015, 0.0045)) == "costs more than 0.1%"
    assert verdict(_check("w", -0.003, -0.0045, -0.0015)) == "better than full precision by more than 0.1%"
    assert verdict(_check("w", -0.0018, -0.0041, 0.0005)).startswith("not resolved")
    assert verdict(_check("w", 0.0008, -0.0001, 0.0017, not_judged=True, full_precision_end_ne=0.941)).startswith(
        "not judged (full precision ends at NE 0.941")


def test_the_line_leads_with_this_machines_look_and_counts_the_others():
    """Checked on two machines: a placement made on either quotes its own machine's checks in full and the
    other's count; one made on a third says it was never checked there and quotes the last run in full."""
    epyc = {"machine": "AMD EPYC", "code": "855987efb912", "within": 1, "checked": 4}
    rec = {"machine": "Intel Xeon", "code": "16e0691abcde", "within": 2, "checked": 4,
           "checks": [_check("wukong-small", 0.00025, -0.00027, 0.00078, seeds=16, sites=4),
                      _check("dlrm-wide", -0.0018, -0.0041, 0.0005)],
           "other_machines": [epyc]}
    xeon = check_line(rec, here="Intel Xeon")
    assert ("on this machine (Intel Xeon, code 16e0691): wukong-small's recommendation (4 sites in FP8) +0.025% NE "
            "[-0.027, +0.078] over 16 seeds: within +-0.1%; dlrm-wide's recommendation (2 sites in FP8) -0.180% NE "
            "[-0.410, +0.050] over 10 seeds: not resolved") in xeon
    assert "; on AMD EPYC (code 855987e): 1 of 4 within +-0.1%" in xeon
    on_epyc = check_line(rec, here="AMD EPYC")
    assert "on this machine (AMD EPYC, code 855987e): " in on_epyc  # a look kept as counts only: no checks to quote
    assert "on Intel Xeon (code 16e0691): 2 of 4 within +-0.1%" in on_epyc
    elsewhere = check_line(rec, here="Ampere Altra")
    assert elsewhere.count("never checked on this machine (Ampere Altra); on Intel Xeon (code 16e0691): "
                           "wukong-small's recommendation") == 1 and "on AMD EPYC (code 855987e): 1 of 4" in elsewhere
    assert "never checked by training" in check_line(quality_check(ROOT / "none.json"))


def test_the_record_counts_the_newest_earlier_look_of_each_other_machine():
    from experiments.common import run_of
    from experiments.fp8_benchmark import NE_CHECK, quality_check_record

    results = json.loads((ROOT / "results" / "fp8_benchmark.json").read_text())
    ne = [k for k in results["targets"] if NE_CHECK in k]

    def look(machine, started, met):
        return {"machine": machine, "started_at": started, "code_version": f"{machine[:3].lower()}{started[-3:-1]}",
                "targets": {k: {"met": met} for k in ne}}

    here = run_of(results)["machine"]
    doc = {**results, "earlier_looks": [look("Old CPU", "2026-01-01T00:00:01Z", True),
                                        look("Old CPU", "2026-01-02T00:00:02Z", False),
                                        look(here, "2026-01-03T00:00:03Z", True)]}
    rec = quality_check_record(doc)
    assert [r["machine"] for r in rec["other_machines"]] == ["Old CPU"]  # this machine's own older look left out
    assert rec["other_machines"][0] == {"machine": "Old CPU", "code": "old02", "finished_at": None, "within": 0,
                                        "checked": len(ne)}  # the newest
    assert rec["machine"] == here and rec["checked"] == len(ne) == len(rec["checks"])
    assert rec["within"] == sum(c["met"] for c in rec["checks"])


def test_a_bound_just_past_the_bar_is_not_printed_on_it():
    line = check_line({"machine": "M", "code": "abc", "within": 0, "checked": 1,
                       "checks": [_check("wukong-small", 0.00032, -0.00037, 0.0010037, seeds=15, sites=4)]}, here="M")
    assert "[-0.037, +0.1004] over 15 seeds: not resolved" in line
