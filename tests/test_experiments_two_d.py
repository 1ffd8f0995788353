"""experiments/two_d.py, a thin study over DistributedRunner: NE cost pairing by seed against 1D
row-wise AdaGrad, the quality table it writes (read back by cost_models.two_d_quality), the study's
plans and configs, and (slow) a real short run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cost_models import two_d_quality  # noqa: E402
from experiments import two_d  # noqa: E402


def run(variant, opt, seed, ne, losses=(0.5, 0.4)):
    return {"variant": variant, "optimizer": opt, "seed": seed, "ne": ne, "losses": list(losses),
            "step_ms_median": 10.0, "sync_ms_mean": 1.0}


def test_ne_cost_is_paired_by_seed_with_1d_rowwise_adagrad(tmp_path):
    runs = [run("1d", "rowwise_adagrad", 0, 1.0), run("1d", "rowwise_adagrad", 1, 0.5),
            run("avg-10", "rowwise_adagrad", 0, 1.01), run("avg-10", "rowwise_adagrad", 1, 0.51),
            run("grad", "rowwise_adagrad", 0, 1.0, (0.5000001, 0.4)), run("grad", "rowwise_adagrad", 1, 0.5),
            run("avg-10", "ms_rowwise_adagrad", 0, 0.99), run("avg-10", "ms_rowwise_adagrad", 1, 0.5)]
    s = two_d.summarise(runs)
    avg = s["rowwise_adagrad"]["avg-10"]["ne_cost_rel"]
    # +1% and +2% relative to each seed's own 1D NE (unpaired, the NE means would differ by 1.35%)
    assert avg["per_seed"] == pytest.approx([0.01, 0.02]) and avg["mean"] == pytest.approx(0.015)
    assert s["rowwise_adagrad"]["grad"]["early_loss_max_rel_diff_vs_1d"] == pytest.approx(2e-7, rel=1e-3)
    ms = s["ms_rowwise_adagrad"]["avg-10"]
    assert ms["baseline"] == "1d/rowwise_adagrad" and ms["ne_cost_rel"]["per_seed"] == pytest.approx([-0.01, 0.0])

    payload = {"quick": True, "started_at": "2026-01-01T00:00:00Z", "code_version": "test", "workload": "two-d-study",
               "steps": 2, "seeds": [0, 1], "ne_end_1d_mean": 0.75}
    path = tmp_path / "two_d_quality.json"
    path.write_text(json.dumps(two_d.quality_doc(s, payload)))
    got = two_d_quality.ne_cost("rowwise_adagrad", "weights", 10, path=path)
    assert got.kind == "measured" and got.ne_cost_rel == pytest.approx(0.015) and "QUICK" in got.source
    assert two_d_quality.ne_cost("rowwise_adagrad", "gradients", 1, path=path).ne_cost_rel == pytest.approx(0.0)


def test_an_unresolved_cost_says_whether_its_interval_excludes_zero():
    st = {"seeds": 80, "half_width": 0.0014, "seeds_to_resolve": 156, "ci95": [-0.0036, -0.0008]}
    assert "excludes 0 (measurably better than 1D" in two_d.unresolved_reason(st)
    assert "measurably worse" in two_d.unresolved_reason({**st, "ci95": [0.0006, 0.0034]})
    straddles = two_d.unresolved_reason({**st, "ci95": [-0.0024, 0.0004]})
    assert "excludes" not in straddles and straddles.startswith("80 seeds leave a half-width of 0.140%")
    # narrower than the band but off centre: which side holds, and no "would resolve it" that is false
    narrow = {"seeds": 185, "half_width": 0.00088, "mean": -0.00049, "sd": 0.0061, "seeds_to_resolve": 144,
              "ci95": [-0.00137, 0.00039]}
    why = two_d.unresolved_reason(narrow)
    assert why.startswith("the 95% CI [-0.137%, +0.039%] crosses the -0.1% edge: 185 seeds give a half-width")
    assert "no cost above +0.039% (the +0.1% side holds)" in why and "would resolve it" not in why
    assert "would bring it inside if the mean held (--extend-to 5" in why


def _speed_row(case, measured, predicted):
    return {"case": case, "measured_step_ms": measured, "measured_step_ms_ci95": [measured - 1, measured + 1],
            "measured_sync_ms_mean": 1.0, "predicted_step_ms": predicted,
            "measured_ratio_vs_1d": measured / 30.0, "predicted_ratio_vs_1d": predicted / 5.0}


def test_reanalyse_rebuilds_the_targets_from_the_stored_runs_and_keeps_their_context(tmp_path, monkeypatch, capsys):
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    runs = []
    for seed, (ne, grad, avg) in enumerate([(0.90, 0.905, 0.897), (0.88, 0.879, 0.878), (0.91, 0.912, 0.906)]):
        runs += [run("1d", "rowwise_adagrad", seed, ne), run("grad", "rowwise_adagrad", seed, grad),
                 run("avg-100", "rowwise_adagrad", seed, avg)]
    speed = {"rows": [_speed_row("1d", 30.0, 5.0), _speed_row("2D grad", 36.0, 4.0)]}
    ctx = {"kind": "measured", "fingerprint": {"cpu_model": "X"}, "fingerprint_hash": "h", "versions": {},
           "code_version": "measured-on", "started_at": "2026-01-01T00:00:00Z", "loadavg_1m_at_start": 0.5}
    stored = two_d.result_payload(ctx, False, 800, [0, 1, 2], [], runs, speed, 12.0)
    stored["targets"] = {"an older analysis's target": {"measured": 1.0, "target": 0.0, "met": False, "reason": "x"}}
    common.write_result("two_d", stored)
    assert two_d.main(["--reanalyse", "--no-quality-file"]) == 0
    out = json.loads((tmp_path / "two_d.json").read_text())
    assert out["code_version"] == "measured-on" and out["reanalysed"]["code_version"]
    assert out["finished_at"] == stored["finished_at"] and out["runs"] == runs
    assert "an older analysis's target" not in out["targets"]
    grad = out["targets"]["per-step gradient sync: |NE cost vs 1D| inside +-0.1% (measured, 95% CI)"]
    assert grad["met"] is False and grad["reason"].startswith("3 seeds leave a half-width of")
    assert grad["reason"].endswith("see the early-loss target)") and (tmp_path / "two_d.png").exists()
    # a file written before a field this analysis reads: one line naming the file and field, exit 2
    del stored["resolve_seeds"]
    common.write_result("two_d", stored)
    assert two_d.main(["--reanalyse", "--no-quality-file"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("--reanalyse: ") and "two_d.json: no field 'resolve_seeds'" in err and "\n" not in err


def test_speed_measures_the_speed_section_again_and_keeps_the_quality_runs(tmp_path, monkeypatch):
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(two_d, "QUALITY_FILE", tmp_path / "q.json")
    runs = []
    for seed, (ne, grad, avg) in enumerate([(0.90, 0.905, 0.897), (0.88, 0.879, 0.878), (0.91, 0.912, 0.906)]):
        runs += [run("1d", "rowwise_adagrad", seed, ne), run("grad", "rowwise_adagrad", seed, grad),
                 run("avg-100", "rowwise_adagrad", seed, avg)]
    ctx = {"kind": "measured", "fingerprint": {"cpu_model": "X"}, "fingerprint_hash": "h", "versions": {},
           "code_version": "measured-on", "started_at": "2026-01-01T00:00:00Z", "loadavg_1m_at_start": 0.5}
    old = {"rows": [_speed_row("1d", 30.0, 5.0), _speed_row("2D grad", 36.0, 4.0)]}
    common.write_result("two_d", two_d.result_payload(ctx, False, 800, [0, 1, 2], [], runs, old, 12.0))
    fresh = {"rows": [_speed_row("1d", 30.0, 5.0), {**_speed_row("2D grad", 36.0, 6.0), "predicted_sync_ms": 0.5,
                                                    "sync_bytes_modelled_over_measured": 0.94}]}
    monkeypatch.setattr(two_d, "run_speed", lambda steps, log=print, looks=0: json.loads(json.dumps(fresh)))
    assert two_d.main(["--speed", "--speed-steps", "5"]) == 0
    out = json.loads((tmp_path / "two_d.json").read_text())
    assert out["runs"] == runs and out["code_version"] == "measured-on" and out["reanalysed"]["code_version"]
    assert out["speed"]["rows"] == fresh["rows"] and out["speed"]["measured"]["label"].startswith("the speed section")
    assert out["speed"]["measured"]["fingerprint_hash"] != "h"  # this machine's, beside the quality runs' machine
    ratio = next(t for k, t in out["targets"].items() if k.startswith("step model: 2D/1D"))
    assert ratio["measured"] == pytest.approx(abs((6.0 / 5.0) / (36.0 / 30.0) - 1.0))
    assert not (tmp_path / "q.json").exists()  # no quality run, so the packaged table is left alone
    assert two_d.main(["--speed", "--speed-looks", "-1"]) == 2


def test_the_ratio_target_is_judged_over_fresh_looks_too():
    """Met on the first look, missed on the mean over looks: the verdict does not survive a re-measurement."""
    def speed(first_2d, later_2d):
        one = {**_speed_row("1d", 30.0, 5.0), "looks_measured_ratio_vs_1d": [1.0] * 4}
        two = {**_speed_row("2D grad", first_2d, 6.0), "looks_measured_ratio_vs_1d": [first_2d / 30.0]
               + [x / 30.0 for x in later_2d]}
        return {"looks": 4, "rows": [one, two]}

    (key, t), = two_d.speed_target(speed(36.0, [25.0, 26.0, 27.0])).items()  # modelled 1.2, later 0.83-0.90
    assert key.startswith("step model: 2D/1D") and t["measured"] == pytest.approx(0.0)
    assert t["met"] is False and t["reason"].startswith("met on the first look (0%) but not over 4 looks")
    assert t["over_looks"]["per_look"][0] == pytest.approx(0.0) and t["over_looks"]["looks"] == 4
    (_, held), = two_d.speed_target(speed(36.0, [35.0, 37.0, 36.5])).items()
    assert held["met"] is True and "reason" not in held and held["over_looks"]["mean"] < 0.05
    (_, old), = two_d.speed_target({"rows": [_speed_row("1d", 30.0, 5.0), _speed_row("2D", 36.0, 6.0)]}).items()
    assert old["met"] is True and "over_looks" not in old  # a stored file of one look reads as before


def test_a_ratio_miss_says_what_a_core_per_process_measured():
    """The 4-process miss's reason cites the same check on 2 processes, a core each, and says which way it
    went: the sharing-cores explanation is measured, not assumed."""
    def speed(measured_2d, processes, cores):
        one = {**_speed_row("1d", 30.0, 5.0), "looks_measured_ratio_vs_1d": [1.0, 1.0]}
        two = {**_speed_row("2D grad", measured_2d, 6.0), "looks_measured_ratio_vs_1d": [measured_2d / 30.0] * 2}
        return {"processes": processes, "cores": cores, "looks": 2, "rows": [one, two]}

    for core_2d, holds in ((36.0, True), (60.0, False)):  # modelled ratio 1.2: measured 1.2, or 2.0
        sp = {**speed(50.0, 4, 2), "one_core_each": speed(core_2d, 2, 2)}
        (_, t), = two_d.speed_target(sp).items()
        assert t["met"] is False and t["one_core_each"]["holds"] is holds
        assert t["one_core_each"]["ratio_error_first_look"] == pytest.approx(abs(1.2 / (core_2d / 30.0) - 1))
        assert "with a core per process (2 processes on 2 cores)" in t["reason"]
        assert ("within the bar" in t["reason"]) is holds and ("does not explain" in t["reason"]) is (not holds)
        assert "descheduled peer" not in t["reason"]
    (_, stored), = two_d.speed_target(speed(50.0, 4, 2)).items()  # a file from before the look: as before
    assert "one_core_each" not in stored and "descheduled peer" in stored["reason"]


def test_extend_to_adds_seeds_measured_here_after_the_last_stored_seed_comes_back(tmp_path, monkeypatch, capsys):
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(two_d, "QUALITY_FILE", tmp_path / "q.json")
    nes = {"1d": 0.90, "grad": 0.901, "avg-100": 0.898}

    def fake_quality(seeds, steps, log=print, variants=two_d.VARIANTS, keep_losses=None):
        return [run(v, o, seed, nes[v] + seed * 1e-3) for seed in seeds for v, o, _, _ in variants]

    monkeypatch.setattr(two_d, "run_quality", fake_quality)
    runs = fake_quality([0, 1, 2], 800, variants=two_d.RESOLVE_VARIANTS)
    speed = {"rows": [_speed_row("1d", 30.0, 5.0), _speed_row("2D grad", 36.0, 4.0)]}
    ctx = common.run_context("measured") | {"code_version": "measured-on"}
    common.write_result("two_d", two_d.result_payload(ctx, False, 800, [0, 1], [2], runs, speed, 12.0))
    assert two_d.main(["--extend-to", "3"]) == 2  # fewer than two more seeds: no interval of their own
    assert "--extend-to 3" in capsys.readouterr().err
    assert two_d.main(["--extend-to", "6"]) == 0
    out = json.loads((tmp_path / "two_d.json").read_text())
    assert out["resolve_seeds"] == [2, 3, 4, 5] and out["code_version"] == "measured-on"
    assert out["summary"]["rowwise_adagrad"]["grad"]["ne_cost_rel"]["seeds"] == 6
    ext = out["extensions"][0]
    assert ext["seeds"] == [3, 5] and ext["reproduced"]["seed"] == 2
    assert [(x["stored_ne"], x["ne_now"]) for x in ext["reproduced"]["runs"]] == [(0.902, 0.902), (0.903, 0.903),
                                                                                   (0.9, 0.9)]
    assert ext["added_seeds_alone"]["grad/rowwise_adagrad"]["seeds"] == 3 and ext["code_version"] != "measured-on"
    assert "equal to the stored" in capsys.readouterr().out and (tmp_path / "q.json").exists()
    # the packaged table names the added seeds' own measurement, not only the first run's
    extended = json.loads((tmp_path / "q.json").read_text())["provenance"]["extended"]
    assert extended == [{"code_version": ext["code_version"], "started_at": ext["started_at"], "seeds": [3, 5]}]
    cited = two_d_quality.ne_cost("rowwise_adagrad", "gradients", 1, path=tmp_path / "q.json").source
    assert f"seeds 3..5 added {ext['started_at']}, code {ext['code_version']}" in cited
    assert two_d.main(["--reanalyse", "--no-quality-file"]) == 0  # a re-analysis keeps the additions' record
    assert json.loads((tmp_path / "two_d.json").read_text())["extensions"] == out["extensions"]

    def not_reproduced(seeds, steps, log=print, variants=two_d.VARIANTS, keep_losses=None):
        return [run(v, o, seed, nes[v] + 0.5) for seed in seeds for v, o, _, _ in variants]

    monkeypatch.setattr(two_d, "run_quality", not_reproduced)  # the last seed no longer comes back: nothing added
    assert two_d.main(["--extend-to", "9"]) == 2
    assert "seed 5 run again does not give the stored NE (1d/rowwise_adagrad 0.905000 -> 1.400000" in \
        capsys.readouterr().err
    assert json.loads((tmp_path / "two_d.json").read_text())["resolve_seeds"] == [2, 3, 4, 5]

    elsewhere = json.loads((tmp_path / "two_d.json").read_text())
    elsewhere["fingerprint"] = {**elsewhere["fingerprint"], "cpu_model": "another CPU"}
    common.write_result("two_d", elsewhere)
    assert two_d.main(["--extend-to", "9"]) == 2
    assert "measured on another machine (cpu_model differ)" in capsys.readouterr().err
    assert json.loads((tmp_path / "two_d.json").read_text())["resolve_seeds"] == [2, 3, 4, 5]  # nothing recorded


def test_study_plans_and_configs_are_1d_and_2d():
    wl = two_d.study_workload(3)
    assert wl.data.seed == 1003 and max(t.rows for t in wl.tables) <= 1000
    p1, p2 = two_d.make_plan(wl, 2, 2), two_d.make_plan(wl, 2, 1)
    assert (p1.group_size, p2.group_size, p2.world_size) == (2, 1, 2)
    cfg = two_d.variant_config(p2, 3, "ms_rowwise_adagrad", "weights", 10)
    assert cfg.sharding.sync == "weights" and cfg.sharding.sync_interval == 10 and cfg.seed == 3
    assert cfg.apply(wl).optimizers.embedding == "ms_rowwise_adagrad"


@pytest.mark.slow  # 21 DistributedRunner runs (2 and 4 gloo processes), a few steps each: minutes on 2 cores
def test_a_short_real_run_writes_the_result_and_grad_sync_matches_1d(tmp_path, monkeypatch):
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(two_d, "QUALITY_FILE", tmp_path / "q.json")
    assert two_d.main(["--quick", "--steps", "12", "--seeds", "1", "--resolve-seeds", "2", "--speed-steps", "3"]) == 0
    out = json.loads((tmp_path / "two_d_quick.json").read_text())
    assert out["targets"] and (tmp_path / "two_d_quick.png").exists()
    # the resolution seed runs only the resolved targets' variants and keeps its first EARLY_STEPS losses
    extra = [(r["variant"], r["optimizer"], len(r["losses"])) for r in out["runs"] if r["seed"] == 1]
    assert extra == [("1d", "rowwise_adagrad", 10), ("grad", "rowwise_adagrad", 10), ("avg-100", "rowwise_adagrad", 10)]
    ra = out["summary"]["rowwise_adagrad"]
    assert ra["grad"]["ne_cost_rel"]["seeds"] == 2 and ra["avg-10"]["ne_cost_rel"]["seeds"] == 1
    grad = ra["grad"]
    assert grad["early_loss_max_rel_diff_vs_1d"] <= 1e-4
    assert len(out["speed"]["rows"]) == 3 and all(r["predicted_step_ms"] > 0 for r in out["speed"]["rows"])
    # whose machine the model's links were measured on is said, not assumed to be this one
    links = out["speed"]["links"]
    assert ("another machine" in out["speed"]["note"]) == (not links["this_machine"])
    from experiments.common import REPO  # the packaged file by its repository path, not the checkout's

    assert out["speed"]["note"].count("another machine") <= 1 and not links["file"].startswith(str(REPO))
    assert not (tmp_path / "q.json").exists()  # a quick run leaves the packaged table alone
    assert two_d.main(["--quick", "--reanalyse"]) == 0  # the stored runs give the same targets back
    again = json.loads((tmp_path / "two_d_quick.json").read_text())
    assert again["targets"] == out["targets"] and again["reanalysed"] and not (tmp_path / "q.json").exists()
    # more resolution seeds on this machine: the stored last seed comes back to the digit first
    assert two_d.main(["--quick", "--extend-to", "4"]) == 0
    more = json.loads((tmp_path / "two_d_quick.json").read_text())
    ext = more["extensions"][0]
    assert more["resolve_seeds"] == [1, 2, 3] and ext["seeds"] == [2, 3] and len(ext["reproduced"]["runs"]) == 3
    assert all(x["stored_ne"] == x["ne_now"] for x in ext["reproduced"]["runs"])
    assert more["summary"]["rowwise_adagrad"]["grad"]["ne_cost_rel"]["seeds"] == 4
    # the speed section alone measured again: the runner's count of a gradient sync's bytes beside the rule's
    assert two_d.main(["--quick", "--speed", "--speed-steps", "3"]) == 0
    sped = json.loads((tmp_path / "two_d_quick.json").read_text())
    assert sped["runs"] == more["runs"] and sped["speed"]["measured"]
    grad_row = next(r for r in sped["speed"]["rows"] if r["sync"] == "gradients")
    assert 0.8 < grad_row["sync_bytes_modelled_over_measured"] < 1.2 and grad_row["predicted_sync_ms"] > 0
    (tmp_path / "q.json").write_text(json.dumps(two_d.quality_doc(out["summary"], out)))
    assert two_d_quality.load(tmp_path / "q.json")["provenance"]["quick"] is True
