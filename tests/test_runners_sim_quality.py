"""The simulator's assumed quality for 2D sparse parallelism: read from the measured table
(cost_models/data/two_d_quality.json), reported per run, honoured by a campaign's NE constraint,
and stated with its source in the scaling study."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cost_models import two_d_quality
from cost_models.hardware import CLUSTERS
from cubic.core.config import Config
from cubic.core.workloads import DEFAULT_WORKLOADS
from cubic.runners.sim import SimulatedRunner, scaling_sweep
from test_cost_models_two_d_quality import TABLE  # the cost_models tests' sample table (tests/ is on the path)

ROOT = Path(__file__).resolve().parent.parent
WL = DEFAULT_WORKLOADS["dlrm-small"]


@pytest.fixture
def table(tmp_path, monkeypatch):
    path = tmp_path / "two_d_quality.json"
    path.write_text(json.dumps(TABLE))
    monkeypatch.setattr(two_d_quality, "DATA", path)
    return path


def twod(interval=None, sync=None, g=4):
    return Config(sharding={"group_size": g, "sync": sync, "sync_interval": interval})


def test_the_simulator_reads_the_packaged_table():
    doc = two_d_quality.load()
    e = next(e for e in doc["entries"] if e["optimizer"] == "rowwise_adagrad" and e["sync"] == "weights")
    res = SimulatedRunner(CLUSTERS["h100"], 8).run(WL, twod(e["interval"], "weights"), steps=1, warmup=0)
    assert res.ok, res.error
    assert res.metrics["ne_cost_rel"] == e["ne_cost_rel"] and res.metrics["ne_cost_rel_ci_hi"] == e["ci95"][1]
    q = res.extra["assumed_quality"]
    assert q["kind"] == "measured" and "two_d_quality.json" in q["source"] and q["interval"] == e["interval"]


def test_the_config_sync_interval_picks_the_cost_and_the_sync_time(table):
    runner = SimulatedRunner(CLUSTERS["h100"], 8)
    r10, r100 = (runner.run(WL, twod(n, "weights"), steps=1, warmup=0) for n in (10, 100))
    assert (r10.metrics["ne_cost_rel"], r100.metrics["ne_cost_rel"]) == (0.001, 0.02)
    # syncing 10x as often costs step time (the step model's amortized replica sync)
    assert r10.metrics["step_time_median_ms"] > r100.metrics["step_time_median_ms"]
    grads = runner.run(WL, twod(sync="gradients"), steps=1, warmup=0)
    assert grads.metrics["ne_cost_rel"] == 0.0 and grads.extra["assumed_quality"]["sync"] == "gradients"
    full = runner.run(WL, Config(), steps=1, warmup=0)
    assert full.metrics["ne_cost_rel"] == 0.0 and full.extra["assumed_quality"]["kind"] == "baseline"
    # an optimizer the table has nothing for: no figure is invented, and the result says why
    sgd = WL.model_copy(update={"optimizers": WL.optimizers.model_copy(update={"embedding": "sgd"})})
    res = runner.run(sgd, twod(10, "weights"), steps=1, warmup=0)
    assert "ne_cost_rel" not in res.metrics and res.extra["assumed_quality"]["kind"] == "unavailable"


def test_a_campaign_ne_constraint_rejects_a_too_lossy_sync_interval(table):
    from cubic.codesign.campaign import Campaign
    from cubic.codesign.evaluate import RunnerEvaluate
    from search.space import Space

    space = Space.model_validate({
        "name": "sync", "objectives": [{"metric": "examples_per_s", "direction": "maximize"}],
        "constraints": [{"name": "NE cost", "metric": "ne_cost_rel", "max": 0.005}],
        "parameters": [{"name": "sharding.sync_interval", "type": "categorical", "choices": [10, 100]}]})
    ev = RunnerEvaluate(WL, SimulatedRunner(CLUSTERS["h100"], 8), space, steps=1, warmup=0,
                        base_config=Config(sharding={"group_size": 4, "sync": "weights"}))
    c = Campaign(space, ev, strategy="random", budget=4, batch_size=2, seed=0, name="ne-constraint")
    s = c.run()
    obs = {o.point["sharding.sync_interval"]: o for o in c.observations()}
    assert set(obs) == {10, 100}  # both ran
    # interval 100 is faster (fewer syncs) but its measured NE cost 2% breaks the 0.5% bound
    assert obs[100].metrics["examples_per_s"] > obs[10].metrics["examples_per_s"]
    assert not obs[100].feasible and obs[10].feasible
    assert s.best_metrics["ne_cost_rel"] == 0.001


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_scaling_rows_and_the_scaling_json_carry_the_assumed_quality_and_its_source(table, tmp_path, monkeypatch):
    rows = scaling_sweep(WL, CLUSTERS["h100"], [8, 16], [4])
    by = {(r["gpus"], r["strategy"]): r for r in rows if r["status"] == "ok"}
    q2d = by[(16, "2d-g4")]["assumed_quality"]  # the step model's default: weight averaging every 100 steps
    assert (q2d["ne_cost_rel"], q2d["kind"], q2d["interval"]) == (0.02, "measured", 100)
    assert "two_d_quality.json" in q2d["source"]
    assert by[(16, "full")]["assumed_quality"]["kind"] == "baseline"

    sys.path.insert(0, str(ROOT))
    import experiments.common as common
    import experiments.scaling as scaling

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["scaling.py", "--quick", "--no-cpu"])
    scaling.main()
    out = json.loads((tmp_path / "scaling.json").read_text())
    q = out["assumed_quality"]
    sweep = next(v for k, v in q.items() if "weight averaging" in k)
    assert sweep["ne_cost_rel"] == 0.02 and sweep["kind"] == "measured" and str(table.name) in sweep["source"]
    assert q["2D, per-step gradient sync (sensitivity)"]["ne_cost_rel"] == 0.0
    assert out["claim"]["assumed_ne_cost_of_best_2d"]["source"] == sweep["source"]
    assert all("assumed_quality" in r for r in out["rows"] if r["status"] == "ok")
    robust = out["robustness"]  # the claim's second look over perturbed step-model regimes
    assert robust["regimes"] == 8 == len(robust["failed_regimes"]) + robust["held"]
    target = next(v for k, v in out["targets"].items() if "perturbed step-model regimes" in k)
    assert target["measured"] == robust["share_held"] and isinstance(target["met"], bool)


def test_the_scaling_claims_second_look_names_every_regime_where_it_fails():
    sys.path.insert(0, str(ROOT))
    from experiments._scaling_robustness import RANGES, robustness
    from experiments.scaling import _targets, retained

    cfg = Config(kernels={"dense_dtype": "bf16"})
    # a bar no strategy can keep: the claim fails in every regime, and each failure carries its parameters
    r = robustness(WL, CLUSTERS["h100"], cfg, [4], 8, 16, 1.5, retained, regimes=2)
    assert r["held"] == 0 and r["share_held"] == 0.0 and len(r["failed_regimes"]) == 2
    assert all(set(f["params"]) == set(RANGES) for f in r["failed_regimes"])
    t = _targets({}, {"full": 0.5, "2d-g4": 0.95}, "2d-g4", 8, 16, r)
    miss = next(v for k, v in t.items() if "perturbed" in k)
    assert miss["met"] is False and "fails in 2 regimes" in miss["reason"]


def test_a_kept_ratio_above_one_is_named_a_replan():
    """Each scale plans its groups afresh (the planner prices the sync by the replica count), so a 2D
    group size can be faster at 4096 GPUs than at 512: the target says so beside the ratio."""
    sys.path.insert(0, str(ROOT))
    from experiments.scaling import _replanned, _targets

    row = lambda w, ms, sync: {"gpus": w, "strategy": "2d-g32", "status": "ok", "step_ms": ms,  # noqa: E731
                               "embedding_sync_bytes_per_rank": sync, "embedding_imbalance": 1.5}
    rows = [row(512, 57.8, 42.8e9), row(4096, 56.5, 37.6e9)]
    r = _replanned(rows, "2d-g32", 512, 4096)
    assert r["512_gpus"]["embedding_sync_gb_per_rank"] == 42.8
    assert "128 replicas" in r["why_above_1"] and "12% fewer bytes" in r["why_above_1"]
    robust = {"regimes": 1, "held": 1, "share_held": 1.0, "label": "x", "failed_regimes": []}
    t = _targets({"replanned": r}, {"full": 0.3, "2d-g32": 57.8 / 56.5}, "2d-g32", 512, 4096, robust)
    assert t["best 2D keeps >= 90% per-GPU throughput 512->4096 GPUs (SIMULATED)"]["note"] == r["why_above_1"]
    # slower at the larger scale: nothing to explain
    assert "why_above_1" not in _replanned([row(512, 50.0, 1e9), row(4096, 55.0, 1e9)], "2d-g32", 512, 4096)


def test_a_2d_prediction_states_the_ne_cost_it_assumes_and_where_it_comes_from(table, tmp_path, capsys):
    from cubic.cli.app import main

    cfg = tmp_path / "cfg.json"
    cfg.write_text(Config(sharding={"group_size": 8, "sync": "weights", "sync_interval": 10}).model_dump_json())
    args = ["sim", "predict", "--workload", "dlrm-small", "--simulate", "h100x64", "--config", str(cfg)]
    assert main([*args, "--json"]) == 0
    q = json.loads(capsys.readouterr().out)["assumed_quality"]
    assert (q["ne_cost_rel"], q["kind"], q["interval"]) == (0.001, "measured", 10) and table.name in q["source"]
    assert main([*args, "--sync-interval", "55"]) == 0
    out = capsys.readouterr().out
    assert "assumed NE cost vs full sharding" in out and "+0.100%" in out  # the config's interval wins


def test_the_packaged_2d_quality_space_fits_the_simulated_runner():
    from cubic.cli.campaign import DATA, check_space_fits_runner
    from search.space import load_space

    path = DATA / "space-sim-2d-quality.yaml"
    space = load_space(path)
    check_space_fits_runner(space, "simulated", str(path))
    assert any(c.metric == "ne_cost_rel" for c in space.constraints)
    cfg = space.to_config({"sharding.group_size": 8, "sharding.sync": "weights", "sharding.sync_interval": 50})
    assert (cfg.sharding.sync, cfg.sharding.sync_interval) == ("weights", 50)
