"""Hand-off labels: every cost column says measured or modelled and for which device, the lower
bound depends on the tables and topology only, `--backend torchrec` reports oversubscription."""

import json

from cubic.cli.app import main
from cubic.cli.shard import oversubscription


def write_csv(tmp_path):
    p = tmp_path / "tables.csv"
    p.write_text("name,rows,dim,pooling_factor,zipf_alpha\n"
                 + "".join(f"t{i},{500 * (i + 1)},{8 * (1 + i % 2)},{1 + i},1.1\n" for i in range(6)))
    return p


def test_evaluate_labels_columns_and_lower_bound_is_the_tables(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUBIC_HOME", str(tmp_path / "home"))
    csv = write_csv(tmp_path)
    lbs = []
    for planner in ("dim_greedy", "size_greedy"):
        out = tmp_path / f"{planner}.json"
        assert main(["shard", "plan", "--tables", str(csv), "--world-size", "2", "--memory-gb", "1",
                     "--batch-size", "32", "--planner", planner, "--out", str(out)]) == 0
        plan_text = capsys.readouterr().out
        assert "lookup ms (modelled, cpu)" in plan_text and "all-to-all ms (modelled, cpu)" in plan_text
        assert "compute kernel" in plan_text and "imbalance (max / mean" in plan_text
        assert main(["shard", "evaluate", str(out), "--repeats", "1"]) == 0
        text = capsys.readouterr().out
        assert "lookup measured, this cpu, communication modelled, cpu" in text.splitlines()[0]
        assert "lookup ms (measured, this cpu)" in text and "fwd/bwd ms" in text and "input KiB" in text
        assert "communication is MODELLED" in text
        assert main(["shard", "evaluate", str(out), "--repeats", "1", "--json"]) == 0
        cost = json.loads(capsys.readouterr().out)
        assert all(r["fwd_compute_ms"] is not None and r["input_bytes"] is not None for r in cost["per_rank"])
        lbs.append(cost["lower_bound_ms"])
    assert lbs[0] == lbs[1]  # two plans of the same tables, one lower bound (no measurement in it)


def test_oversubscription_line():
    o = oversubscription(64)
    assert o["factor"] == 64 / o["cores"] and "OVERSUBSCRIBED" in o["line"] and f"64 processes on {o['cores']}" in o["line"]
    assert "OVERSUBSCRIBED" not in oversubscription(1)["line"]


def test_a_loaded_machine_is_not_called_one_core_per_process(monkeypatch):
    # an audit (stop 65): "2 processes on 2 cores (load 4.8): one core per process at least"
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (4.8, 4.0, 3.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    o = oversubscription(2)
    assert o["loaded"] and "LOADED" in o["line"] and "one core per process" not in o["line"]
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    assert not oversubscription(2)["loaded"] and "one core per process at least" in oversubscription(2)["line"]
