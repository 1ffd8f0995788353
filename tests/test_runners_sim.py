"""SimulatedRunner (cubic/runners/sim.py) and the `cubic sim` CLI: simulated Results, spec parsing, bad input."""

from __future__ import annotations

import json

import pytest

from cost_models.hardware import CLUSTERS
from cubic.cli.app import main
from cubic.core.config import Config, ShardingChoice
from cubic.runners.sim import SimulatedRunner, load_params, scaling_sweep
from cubic.core.spec import SpecError
from cubic.core.workloads import DEFAULT_WORKLOADS

LARGE = DEFAULT_WORKLOADS["wukong-large"]


def test_from_spec_parses_cluster_and_world_size(tmp_path):
    r = SimulatedRunner.from_spec("h100x64")
    assert r.cluster.name == "h100" and r.world_size == 64 and r.source == "simulated"
    assert SimulatedRunner.from_spec("h200x8").cluster.device.hbm_bytes == 141e9
    yaml_file = tmp_path / "mine.yaml"
    yaml_file.write_text(
        "name: mine\nranks_per_node: 4\nnvlink_bw: 2.0e11\nnetwork_bw: 2.5e10\n"
        "device: {name: h100, peak_flops_fp32: 6.7e13, peak_flops_bf16: 9.89e14, peak_flops_fp8: 1.979e15,"
        " hbm_bytes: 8.0e10, hbm_bw: 3.35e12}\n")
    mine = SimulatedRunner.from_spec(f"{yaml_file}x16")
    assert mine.cluster.name == "mine" and mine.world_size == 16 and mine.cluster.ranks_per_node == 4
    assert SimulatedRunner.from_spec(str(yaml_file), world_size=32).world_size == 32


@pytest.mark.parametrize("bad", ["h100", "h100x", "x64", "tpu9x64", "h100x0", "", "nope.yamlx8"])
def test_from_spec_bad_input_is_a_spec_error(bad):
    with pytest.raises(SpecError):
        SimulatedRunner.from_spec(bad)


def test_run_returns_a_simulated_result():
    runner = SimulatedRunner(CLUSTERS["h100"], 64)
    calls = []
    res = runner.run(LARGE, Config(kernels={"dense_dtype": "bf16"}), steps=10, progress=lambda d, t: calls.append((d, t)))
    assert res.ok and res.source == "simulated"
    assert res.extra["simulated_cluster"]["name"] == "h100x64"
    assert "SIMULATED" in res.extra["note"]
    m = res.metrics
    assert m["examples_per_s"] == pytest.approx(LARGE.batch_size * 64 / (m["step_time_median_ms"] / 1e3))
    assert 0 < m["peak_mem_bytes"] < 80e9
    assert set(res.phases_ms) >= {"embedding_fwd", "embedding_bwd", "dense_fwd", "dense_bwd", "optimizer",
                                  "communication"}
    assert sum(res.extra["phases_detail_ms"].values()) == pytest.approx(m["step_time_median_ms"])
    assert res.fingerprint_hash == runner.fingerprint_hash() and res.fingerprint["simulated"] is True
    assert res.workload_hash == LARGE.content_hash() and calls[-1] == (10, 10)
    # a different cluster or world size is a different fingerprint: never served for another
    assert SimulatedRunner(CLUSTERS["h100"], 128).fingerprint_hash() != runner.fingerprint_hash()


def test_run_failures_are_results_not_exceptions():
    oom = SimulatedRunner(CLUSTERS["h100"], 2).run(LARGE, Config())
    assert not oom.ok and oom.failure_kind == "oom" and oom.source == "simulated" and "SIMULATED" in oom.reason
    bad = SimulatedRunner(CLUSTERS["h100"], 64).run(LARGE, Config(sharding=ShardingChoice(group_size=24)))
    assert not bad.ok and bad.failure_kind == "invalid" and "must divide the world size" in bad.reason
    knob = SimulatedRunner(CLUSTERS["h100"], 64).run(LARGE, Config(model={"warp": 3}))
    assert knob.failure_kind == "invalid"


def test_scaling_sweep_rows():
    rows = scaling_sweep(LARGE, CLUSTERS["h100"], [8, 64], [16, 32])
    by = {(r["gpus"], r["strategy"]): r for r in rows}
    assert by[(8, "full")]["status"] == "oom"  # ~470 GB of tables do not fit 8 x 80 GB
    assert (8, "2d-g16") not in by  # a group larger than the cluster is skipped
    assert by[(64, "full")]["status"] == "ok" and by[(64, "full")]["scaling_efficiency"] == pytest.approx(1.0)
    assert all(0 < r["scaling_efficiency"] <= 1.0 + 1e-9 for r in rows if r["status"] == "ok")


def test_cli_sim_scale_json_and_predict(capsys, tmp_path):
    assert main(["sim", "scale", "--gpus", "64,128", "--group-sizes", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["simulated"] is True and {r["strategy"] for r in out["rows"]} == {"full", "2d-g32"}
    assert "never timed on a GPU cluster" in out["checked"]  # what the table was and was not checked against
    # a group size that divides no GPU count is named, not dropped in silence
    assert main(["sim", "scale", "--gpus", "64,128", "--group-sizes", "3,32", "--json"]) == 0
    err = capsys.readouterr().err
    assert "--group-sizes 3 divides none of --gpus 64,128" in err and "--group-sizes 32" not in err
    assert main(["sim", "predict", "--simulate", "h100x64", "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["simulated"] and pred["step_ms"] > 0 and pred["dominant_phase"]
    assert "never timed on a GPU cluster" in pred["checked"]
    assert main(["sim", "predict", "--simulate", "h100x64"]) == 0
    assert "never timed on a GPU cluster" in capsys.readouterr().out
    assert main(["sim", "predict", "--simulate", "h100x64x"]) == 2
    assert "expected <cluster>x<gpus>" in capsys.readouterr().err
    params = tmp_path / "p.json"
    params.write_text(json.dumps({"params": {"net_eff": 0.4}}))
    assert load_params(params).net_eff == 0.4
    assert main(["sim", "predict", "--simulate", "h100x64", "--params", str(params), "--json"]) == 0
    slower = json.loads(capsys.readouterr().out)
    assert slower["step_ms"] > pred["step_ms"]
    params.write_text(json.dumps({"params": {"warp": 1}}))
    assert main(["sim", "predict", "--params", str(params)]) == 2


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_cli_calibrate_from_store_recovers_a_known_factor(tmp_path, capsys):
    from cubic.runners.step_model import StepModelParams, predict_step
    from cubic.core.result import Result
    from cubic.core.store import TrialStore

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    truth = StepModelParams(gemm_eff=0.6)
    with TrialStore(url) as store:
        for b in (512, 1024, 2048, 4096):
            cfg = Config(batch_size=b, kernels={"dense_dtype": "bf16"})
            step = predict_step(LARGE, cfg, CLUSTERS["h100"], 64, truth).step_s
            # stands in for a run measured on a user's H100 cluster
            store.record(LARGE, cfg, Result(status="ok", source="measured", workload=LARGE.name,
                                            metrics={"step_time_median_ms": step * 1e3}))
        # simulated trials are never used as measurements
        store.record(LARGE, Config(batch_size=64), Result(status="ok", source="simulated", workload=LARGE.name,
                                                          metrics={"step_time_median_ms": 1e6}))
    save = tmp_path / "cal.json"
    assert main(["sim", "calibrate", "--cluster", "h100", "--from-store", "--store", url, "--world-size", "64",
                 "--factors", "gemm_eff", "--save", str(save), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["factors"]["gemm_eff"] == pytest.approx(0.6, rel=0.03) and rep["n_samples"] == 4
    assert rep["mape_pct"] < 1.0 < rep["mape_before_pct"] and rep["mape_leave_one_out_pct"] < 2.0
    assert load_params(save).gemm_eff == pytest.approx(0.6, rel=0.03)
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    assert main(["sim", "calibrate", "--cluster", "h100", "--from-store", "--store", empty]) == 2


def test_a_config_silent_on_the_dense_dtype_simulates_as_no_config(capsys, tmp_path):
    """A config holding only ``seed: 0`` got Config's fp32 (241.5 ms) where no config got bf16 (36.6 ms),
    and the header said neither: a config compared with the default read ~7x slower."""
    from cubic.runners.sim import simulation_config

    seed_only, fp32 = tmp_path / "seed.yaml", tmp_path / "fp32.yaml"
    seed_only.write_text("seed: 0\n")
    fp32.write_text("kernels: {dense_dtype: fp32}\n")
    steps = {}
    for name, extra in (("none", []), ("seed", ["--config", str(seed_only)]), ("fp32", ["--config", str(fp32)])):
        assert main(["sim", "predict", "--simulate", "h100x128", *extra, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        steps[name] = (out["step_ms"], out["dense_dtype"])
    assert steps["seed"] == steps["none"] and steps["none"][1] == "bf16"
    assert steps["fp32"][1] == "fp32" and steps["fp32"][0] > 3 * steps["none"][0]  # set explicitly: kept
    for extra, dtype in (([], "bf16"), (["--config", str(fp32)], "fp32")):  # the header says which
        assert main(["sim", "predict", "--simulate", "h100x128", *extra]) == 0
        assert f"batch 2048/GPU, dense {dtype})" in capsys.readouterr().out.splitlines()[0]
    assert main(["sim", "scale", "--gpus", "64", "--group-sizes", "32", "--config", str(seed_only)]) == 0
    assert "dense bf16" in capsys.readouterr().out
    # set elsewhere in kernels but not the dtype: still unset; set in code: kept
    assert simulation_config(Config(kernels={"embedding": "torch"})).kernels.dense_dtype == "bf16"
    assert simulation_config(Config(kernels={"dense_dtype": "fp32"})).kernels.dense_dtype == "fp32"
    assert simulation_config(None) == simulation_config(Config())


def test_cubic_run_simulate_resolves_the_dense_dtype_before_hashing(capsys, isolated, tmp_path):
    """``cubic run --simulate``: the config hashed and stored is the one simulated, so a config silent on
    the dtype is the default's trial (served from it), an explicit fp32 one is another; the note says which."""
    seed_only, fp32 = tmp_path / "seed.yaml", tmp_path / "fp32.yaml"
    seed_only.write_text("seed: 0\n")
    fp32.write_text("kernels: {dense_dtype: fp32}\n")
    base = ["run", "--workload", "wukong-large", "--simulate", "h100x128", "--steps", "2"]
    assert main(base) == 0
    first = capsys.readouterr().out
    assert "dense bf16" in first
    assert main([*base, "--config", str(seed_only)]) == 0
    assert "served from the trial store" in capsys.readouterr().out
    assert main([*base, "--config", str(fp32)]) == 0
    out = capsys.readouterr().out
    assert "served from the trial store" not in out and "dense fp32" in out


def test_the_step_models_one_multi_process_check_is_said_as_it_stands():
    # the note every simulated figure carries names the check and its outcome: it must follow the results file
    import json
    from pathlib import Path

    from cubic.runners.sim import SIM_CHECKED

    doc = json.loads((Path(__file__).resolve().parent.parent / "results" / "two_d.json").read_text())
    (t,) = [t for name, t in doc["targets"].items() if name.startswith("step model: 2D/1D step-time ratio")]
    assert ("met its 25% bar on the step-time ratio with 4 processes" in SIM_CHECKED) == t["met"]
    assert ("missed its 25% bar on the step-time ratio with 4 processes" in SIM_CHECKED) == (not t["met"])
    assert "results/two_d.json" in SIM_CHECKED
    assert ("over fresh looks too" in SIM_CHECKED) == (t.get("over_looks", {}).get("mean", 0) > t["target"])
    assert ("missed it with a core per process" in SIM_CHECKED) == (not t["one_core_each"]["holds"])
    one_1d = doc["speed"]["one_core_each"]["rows"][0]
    fraction = max(r["predicted_step_ms"] / r["measured_step_ms"] for r in (doc["speed"]["rows"][0], one_1d))
    assert ("its 1D steps modelled at a fraction of those measured" in SIM_CHECKED) == (fraction < 0.5)
    (grad,) = [r for r in doc["speed"]["rows"] if r["sync"] == "gradients"]
    moved = 0.85 <= grad["sync_bytes_modelled_over_measured"] <= 1.15
    slower = grad["measured_sync_ms_mean"] > 2 * grad["predicted_sync_ms"]
    from cost_models.comm import GRADIENT_SYNC_CHECKED  # the one record, in SIM_CHECKED and a 2D plan's legend

    assert GRADIENT_SYNC_CHECKED in SIM_CHECKED
    assert ("moved the bytes the model prices but took several times its modelled time" in GRADIENT_SYNC_CHECKED) == (
        moved and slower)
    (own_core,) = [r for r in doc["speed"]["one_core_each"]["rows"] if r["sync"] == "gradients"]
    twice = own_core["measured_sync_collectives_ms_rank0"] > 2 * own_core["predicted_sync_ms"]
    assert ("its collectives alone over twice it with a core per process too" in GRADIENT_SYNC_CHECKED) == twice
    regime = json.loads((Path(__file__).resolve().parent.parent / "results" / "comm_regime.json").read_text())
    after = [t for name, t in regime["targets"].items() if name.endswith("after compute (measured/modelled within "
                                                                         "0.67-1.5x)")]
    from cost_models.comm import LINK_CHECKED

    assert LINK_CHECKED in GRADIENT_SYNC_CHECKED
    assert after and ("fresh gloo calls after compute ran past 1.5x the calibrated line in every layout"
                      in LINK_CHECKED) == all(t["measured"] > 1.5 for t in after)


def test_a_calibration_from_another_cluster_says_so(tmp_path, capsys):
    # an audit (stop 65): `sim calibrate` on the CPU, then --params on an H100 cluster, changed the step without a word
    import json

    from cubic.cli.app import main

    params = tmp_path / "cal.json"
    params.write_text(json.dumps({"params": {"net_eff": 0.5}, "report": {"cluster": "cpu"}}))
    assert main(["sim", "predict", "--simulate", "h100x64", "--params", str(params)]) == 0
    assert "was fitted on cluster 'cpu'; applied here to 'h100'" in capsys.readouterr().err
    params.write_text(json.dumps({"params": {"net_eff": 0.5}, "report": {"cluster": "h100"}}))
    assert main(["sim", "predict", "--simulate", "h100x64", "--params", str(params)]) == 0
    assert "fitted on cluster" not in capsys.readouterr().err


def test_a_simulated_campaign_reads_a_silent_dense_dtype_as_the_simulator_does(capsys, tmp_path, monkeypatch):
    """Stop 65 noticed: a simulated campaign whose --baseline config held only ``seed: 0`` simulated the
    baseline in fp32 (Config's default) where `cubic sim predict --config` of the same file simulates bf16."""
    import optuna

    monkeypatch.chdir(tmp_path)
    (tmp_path / "seed.yaml").write_text("seed: 0\n")
    (tmp_path / "space.yaml").write_text("version: 1\nname: s\nobjectives: [{metric: examples_per_s}]\nparameters:\n"
                                         "  - {name: seed, type: categorical, choices: [0, 1]}\n")
    assert main(["sim", "predict", "--simulate", "h100x8", "--workload", "dlrm-small", "--config", "seed.yaml",
                 "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)
    storage = f"sqlite:///{tmp_path}/c.db"
    assert main(["campaign", "run", "--workload", "dlrm-small", "--space", "space.yaml", "--simulate", "h100x8",
                 "--name", "s", "--strategy", "random", "--budget", "1", "--baseline", "seed.yaml",
                 "--storage", storage]) == 0
    capsys.readouterr()
    base = optuna.load_study(study_name="s", storage=storage).user_attrs["cubic_baseline"]
    assert predicted["dense_dtype"] == "bf16"
    assert base["metrics"]["examples_per_s"] == pytest.approx(predicted["examples_per_s"], rel=1e-9)
