"""Cluster files a user can write (docs/clusters.md), the simulator's shared default config, and the
one unit convention (memory in GiB) of the simulated outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_models.hardware import CLUSTERS, DEVICES, ClusterSpec, DeviceSpec, load_cluster
from cubic.cli.app import main
from cubic.core.units import GIB
from cubic.runners.sim import SimulatedRunner

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "clusters" / "h100_4x8.yaml"
DOC = ROOT / "docs" / "clusters.md"


def test_the_example_cluster_file_expands_its_device_shorthand_and_gives_its_size():
    r = SimulatedRunner.from_spec(str(EXAMPLE))
    assert r.world_size == 32 and r.cluster.ranks_per_node == 8
    assert r.cluster.device == DEVICES["h100"]  # the full datasheet spec, sources included
    assert SimulatedRunner.from_spec(f"{EXAMPLE}x64").world_size == 64  # xN overrides the file


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_every_known_device_is_a_shorthand_and_a_full_mapping_still_works(tmp_path, name):
    short = tmp_path / "short.yaml"
    short.write_text(f"name: c\ndevice: {name}\nnvlink_bw: 4.5e11\nnetwork_bw: 5.0e10\n")
    full = tmp_path / "full.json"
    full.write_text(json.dumps({"name": "c", "device": DEVICES[name].model_dump(mode="json"),
                                "nvlink_bw": 4.5e11, "network_bw": 5.0e10}))
    assert load_cluster(str(short)) == load_cluster(str(full))
    assert isinstance(load_cluster(str(short)).device, DeviceSpec)


def test_an_unknown_device_is_one_line_naming_file_and_field(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: c\ndevice: tpu9\nnvlink_bw: 4.5e11\nnetwork_bw: 5.0e10\nworld_size: 8\n")
    store = f"sqlite:///{tmp_path}/t.db"
    for argv in (["sim", "predict", "--simulate", str(bad)],
                 ["run", "--workload", "dlrm-small", "--simulate", f"{bad}x8", "--store", store]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(bad) in err and "device" in err and "tpu9" in err
        assert all(n in err for n in DEVICES)
    if (tmp_path / "t.db").exists():  # nothing recorded
        assert main(["trials", "list", "--store", store, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == []
    nosize = tmp_path / "nosize.yaml"
    nosize.write_text("name: c\ndevice: h100\nnvlink_bw: 4.5e11\nnetwork_bw: 5.0e10\n")
    assert main(["sim", "predict", "--simulate", str(nosize)]) == 2
    assert "world_size" in capsys.readouterr().err


def test_a_known_clusters_fingerprint_does_not_carry_the_new_world_size_field():
    fp = SimulatedRunner(CLUSTERS["h100"], 64).fingerprint()
    assert "world_size" not in fp["cluster"] and fp["world_size"] == 64


def test_the_docs_describe_every_field_and_the_example():
    doc = DOC.read_text()
    for field in [*ClusterSpec.model_fields, *DeviceSpec.model_fields]:
        assert f"`{field}`" in doc, field
    assert EXAMPLE.read_text().split("\n", 3)[3].strip().splitlines()[0] in doc  # the example's first field
    for name in DEVICES:
        assert f"`{name}`" in doc


@pytest.mark.parametrize("cluster", ["h100x64", str(EXAMPLE)])
def test_run_simulate_and_sim_predict_predict_the_same(tmp_path, capsys, cluster):
    out = tmp_path / "r.json"
    assert main(["run", "--workload", "wukong-large", "--simulate", cluster, "--json", str(out),
                 "--store", f"sqlite:///{tmp_path}/t.db"]) == 0
    run = json.loads(out.read_text())
    capsys.readouterr()
    assert main(["sim", "predict", "--workload", "wukong-large", "--simulate", cluster, "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert run["metrics"]["examples_per_s"] == pytest.approx(pred["examples_per_s"], rel=1e-12)
    assert run["metrics"]["peak_mem_bytes"] / GIB == pytest.approx(pred["peak_mem_gib"], rel=1e-12)
    assert pred["cluster"]["hbm_gib_per_gpu"] == pytest.approx(80e9 / GIB)


def test_memory_is_shown_in_gib(tmp_path, capsys):
    assert main(["sim", "predict", "--workload", "wukong-large", "--simulate", "h100x64"]) == 0
    text = capsys.readouterr().out
    assert "GiB" in text and " GB" not in text
    assert main(["sim", "predict", "--workload", "wukong-large", "--simulate", "h100x8"]) == 1  # OOM
    text = capsys.readouterr().out
    assert "74.5 GiB HBM" in text and " GB" not in text
    assert main(["sim", "scale", "--workload", "wukong-large", "--gpus", "64", "--group-sizes", "32"]) == 0
    text = capsys.readouterr().out
    assert "mem GiB" in text and "results/scaling.json, robustness" in text  # said under the table, not only in a note
    assert main(["run", "--workload", "wukong-large", "--simulate", "h100x64", "--store",
                 f"sqlite:///{tmp_path}/t.db"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "peak memory" in line)
    assert "GiB" in row
