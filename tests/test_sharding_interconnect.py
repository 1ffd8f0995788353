"""The user's interconnect reaches the planner on every device: flags and topology fields select the
bandwidth model (cpu included), a calibration file is honoured and a foreign one is labelled, and
the plan records the model it was priced with."""

import json

import pytest

from cost_models.comm import CommModel, calibrate  # noqa: F401  (calibrate: the CLI's writer)
from cubic.cli.app import main
from cubic.core.fingerprint import fingerprint, fingerprint_hash
from cubic.core.spec import Topology


def write_csv(tmp_path):
    p = tmp_path / "tables.csv"
    p.write_text("name,rows,dim,pooling_factor,zipf_alpha\n"
                 + "".join(f"t{i},{1000 * (i + 1)},{8 * (1 + i % 4)},{1 + i},1.1\n" for i in range(6)))
    return p


def write_calibration(path, fp, alpha_peer=3e-4, beta=2e-9):
    path.write_text(json.dumps({"version": 1, "constants": {"alpha_s": 0.0, "alpha_peer_s": alpha_peer,
                                                            "beta_s_per_byte": beta},
                                "fit_mape": 0.1, "fingerprint": fp, "fingerprint_hash": fingerprint_hash(fp),
                                "measured_at": "2026-01-01T00:00:00Z", "runs": []}))
    return path


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("CUBIC_HOME", str(tmp_path / "home"))  # no user calibration unless a test writes one


def test_bandwidth_flags_are_honoured_on_cpu(tmp_path, capsys):
    csv = write_csv(tmp_path)
    plans = {}
    for bw in ("0.1", "100"):
        out = tmp_path / f"p{bw}.json"
        assert main(["shard", "plan", "--tables", str(csv), "--world-size", "4", "--memory-gb", "1", "--device", "cpu",
                     "--batch-size", "64", "--time-budget", "0.3", "--planner", "lookup_greedy",
                     "--intra-node-bw-gbps", bw, "--intra-node-latency-us", "20", "--out", str(out)]) == 0
        text = capsys.readouterr().out
        assert f"bandwidth model: {float(bw):g} GB/s + 20 us" in text
        plans[bw] = json.loads(out.read_text())
    for bw, doc in plans.items():
        assert doc["comm"]["kind"] == "bandwidth" and doc["comm"]["intra_node_bw_gbps"] == float(bw)
        assert doc["topology"]["comm_model"] == "bandwidth" and doc["predicted"]["details"]["comm"]["kind"] == "bandwidth"
    # same placement, 1000x the bandwidth: the all-to-all is priced lower
    slow = max(r["comm_ms"] for r in plans["0.1"]["predicted"]["per_rank"])
    fast = max(r["comm_ms"] for r in plans["100"]["predicted"]["per_rank"])
    assert slow > 5 * fast and fast >= 3 * 0.020  # three all-to-alls, 20 us each at least


def test_topology_fields_select_the_model():
    t = Topology(world_size=16, ranks_per_node=8, device="h100", intra_node_bw_gbps=400, inter_node_bw_gbps=25,
                 intra_node_latency_us=5, inter_node_latency_us=15)
    m = CommModel.from_topology(t)
    assert m.source == "bandwidth" and m.alpha_s == pytest.approx(5e-6) and m.alpha_inter_s == pytest.approx(15e-6)
    assert m.beta_inter_s_per_byte == pytest.approx(1 / 25e9) and m.describe()["latencies_from"] == "topology"
    # cpu with no calibration anywhere it looks: the bandwidth model (auto), never a silent default
    auto = CommModel.from_topology(Topology(world_size=4, device="cpu", comm_model="bandwidth", intra_node_bw_gbps=10))
    assert auto.source == "bandwidth" and auto.beta_intra_s_per_byte == pytest.approx(1e-10)


def test_calibration_file_here_and_from_another_machine(tmp_path, capsys):
    here = fingerprint("cpu")
    other = {**here, "cpu_model": "Some Other CPU", "cpu_count": 96}
    mine = write_calibration(tmp_path / "mine.json", here, alpha_peer=1e-3)
    theirs = write_calibration(tmp_path / "theirs.json", other)
    m = CommModel.from_topology(Topology(world_size=4, ranks_per_node=4, comm_calibration=str(mine)))
    assert m.source == "calibrated" and m.alpha_peer_s == 1e-3 and m.describe()["this_machine"] is True
    csv = write_csv(tmp_path)
    out = tmp_path / "p.json"
    assert main(["shard", "plan", "--tables", str(csv), "--world-size", "4", "--memory-gb", "1", "--batch-size", "64",
                 "--planner", "dim_greedy", "--comm-calibration", str(theirs), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "FROM ANOTHER MACHINE" in text and "Some Other CPU" in text
    doc = json.loads(out.read_text())
    assert doc["comm"]["kind"] == "calibrated" and doc["comm"]["this_machine"] is False
    assert "cpu_model" in doc["comm"]["foreign_reason"]
    # the user's own calibration (what `cubic shard calibrate-comm` writes) is preferred to the packaged one
    home = tmp_path / "home"
    home.mkdir()
    write_calibration(home / "comm_calibration.json", here, alpha_peer=7e-4)
    m = CommModel.from_topology(Topology(world_size=4, ranks_per_node=4))
    assert m.alpha_peer_s == 7e-4 and m.describe()["this_machine"] is True


@pytest.mark.parametrize("flags,needle", [
    (["--intra-node-bw-gbps", "-1"], "--intra-node-bw-gbps"),
    (["--comm-calibration", "/nonexistent/cal.json"], "--comm-calibration"),
])
def test_bad_interconnect_flags_exit_2(tmp_path, capsys, flags, needle):
    code = main(["shard", "plan", "--tables", str(write_csv(tmp_path)), "--world-size", "2", "--memory-gb", "1", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1


def test_a_broken_calibration_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"constants": {}}')
    code = main(["shard", "plan", "--tables", str(write_csv(tmp_path)), "--world-size", "2", "--memory-gb", "1",
                 "--planner", "dim_greedy", "--comm-calibration", str(bad)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "bad.json" in err and len(err.splitlines()) == 1
