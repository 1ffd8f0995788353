"""`shard plan --device h100` plans on the GPU lookup model and says so; the learned CPU model warns on
another machine; `shard train` writes to the user's data directory, not the package."""

import json

import numpy as np

from cubic.cli.app import main
from cost_models.gpu_embedding import lookup_time_s, rank_lookup_ms
from cost_models.hardware import H100_SXM, H200_SXM
from cubic.core.spec import Table
from sharding.estimate import GpuEstimator, machine_mismatch, shard_vector, rank_features_from_sums


def test_rank_model_is_the_lookup_model_on_one_shard():
    t = Table(name="t", rows=100_000, dim=64, pooling_factor=10.0)
    v = shard_vector(t, t.rows, t.dim, 1024)
    X = rank_features_from_sums(v[None], np.array([v[2]]), 1024)
    f, b, u = lookup_time_s(v[1], 64, 1024, 0.0, v[5], H100_SXM.hbm_bw)
    got = float(rank_lookup_ms(X[:, 0], X[:, 1], X[:, 2], X[:, 3], X[:, 5], H100_SXM.hbm_bw)[0])
    assert abs(got - (f + b + u + 20e-6) * 1e3) < 1e-9
    # more HBM bandwidth, less time
    assert GpuEstimator("h200").model.predict(X)[0] < GpuEstimator("h100").model.predict(X)[0]
    assert H200_SXM.hbm_bw > H100_SXM.hbm_bw


def test_plan_on_h100_says_modelled_for_h100(capsys):
    assert main(["shard", "plan", "--tables", "dlrm-small", "--world-size", "8", "--ranks-per-node", "4",
                 "--memory-gb", "2", "--device", "h100", "--time-budget", "0.3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    d = doc["predicted"]["details"]
    assert doc["predicted"]["source"] == "modelled" and "h100" in d["compute"].lower() and d["device"] == "h100"
    assert doc["predicted"]["max_ms"] < 5.0  # an H100 step's lookups take well under the CPU model's ms


def test_unknown_device_is_one_line_exit_2(capsys):
    code = main(["shard", "plan", "--tables", "dlrm-small", "--world-size", "2", "--memory-gb", "2", "--device", "tpu9"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "unknown device" in err and len(err.splitlines()) == 1


def test_machine_mismatch_names_both_machines_and_the_fix():
    from cubic.core.fingerprint import fingerprint

    here = fingerprint("cpu")
    assert machine_mismatch({"fingerprint": here}) is None
    other = {**here, "cpu_model": "Some Other CPU", "cpu_count": 999}
    why = machine_mismatch({"fingerprint": other})
    assert "Some Other CPU" in why and "cubic shard collect" in why and "cubic shard train" in why


def test_train_writes_to_the_user_data_dir(tmp_path, monkeypatch, capsys):
    from cost_models.sharding_cost import ShardingCostModel
    from cubic.core.store import TrialStore
    from sharding import collect as collect_mod
    from sharding.estimate import DEFAULT_MODEL_PATH, RANK_FEATURES, cost_model_path

    monkeypatch.setenv("CUBIC_HOME", str(tmp_path / "home"))
    rng = np.random.default_rng(0)
    X = rng.uniform(1, 100, size=(60, len(RANK_FEATURES)))
    y = X[:, 1] * 0.01 + 0.1
    monkeypatch.setattr(collect_mod, "samples_from_store", lambda store: list(range(60)))
    monkeypatch.setattr(collect_mod, "features_and_labels", lambda samples: (X, y))
    before = DEFAULT_MODEL_PATH.read_bytes()
    TrialStore(f"sqlite:///{tmp_path}/t.db")  # shard train reads a store that exists (it does not make one)
    assert main(["shard", "train", "--store", f"sqlite:///{tmp_path}/t.db"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["wrote"] == str(tmp_path / "home" / "sharding_cost_model.json")
    assert DEFAULT_MODEL_PATH.read_bytes() == before
    assert cost_model_path() == tmp_path / "home" / "sharding_cost_model.json"
    assert ShardingCostModel.load(cost_model_path()).meta_["fingerprint"]["cpu_model"]


def test_memory_per_rank_beyond_the_gpus_hbm_is_refused_naming_the_flag(capsys, tmp_path):
    """`--memory-gb 200 --device h100` planned and placed 173.7 GiB in one rank's "HBM" of an 80 GB H100."""
    base = ["shard", "plan", "--tables", "dlrm-small", "--world-size", "2", "--device", "h100", "--time-budget", "0"]
    for flags, named, sizes in ((["--memory-gb", "200"], "--memory-gb", ("200 GB", "80 GB")),
                                (["--memory-gib", "100"], "--memory-gib", ("100 GiB", "74.51 GiB")),
                                (["--memory-gb", "300", "--hbm-gb", "90"], "--hbm-gb", ("90 GB", "80 GB"))):
        code = main([*base, *flags])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and f"{named}:" in err, err
        assert all(size in err for size in sizes) and "h100" in err
    # a workload file's own memory per rank, on its own GPU: named as the file's field
    wl = tmp_path / "wl.yaml"
    wl.write_text("name: wl\nbatch_size: 64\ntables: [{name: t, rows: 1000, dim: 16, pooling_factor: 2}]\n"
                  "dense_arch: {kind: dlrm, bottom_mlp: [16], top_mlp: [8, 1]}\n"
                  "topology: {device: h100, world_size: 2, memory_per_rank_gb: 200}\n")
    code = main(["shard", "plan", "--tables", str(wl), "--time-budget", "0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "topology.memory_per_rank_gb" in err and str(wl) in err and "200 GB" in err
    # within the device's HBM, or more memory as HBM + host under --hbm-gb, or on cpu: planned
    for flags in (["--memory-gib", "74.5"], ["--memory-gb", "300", "--hbm-gb", "80"]):
        assert main([*base, *flags]) == 0, capsys.readouterr().err
    assert main(["shard", "plan", "--tables", "dlrm-small", "--world-size", "2", "--memory-gb", "200",
                 "--time-budget", "0", "--no-check"]) == 0
    capsys.readouterr()
