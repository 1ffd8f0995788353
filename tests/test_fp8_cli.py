import json

from cubic.cli import main
from fp8.placement import load_placement


def test_model_cli_prints_modelled_block_times(capsys):
    assert main(["fp8", "model", "--m", "8192", "--k", "8192", "--n", "8192", "--recipe", "rowwise",
                 "--norm-before", "--act-after", "sigmoid", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "modelled" and out["speedup"] == out["bf16_ms"] / out["fp8_ms"] > 1.0
    assert main(["fp8", "model", "--m", "256", "--k", "64", "--n", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["speedup"] < 1.0  # small GEMMs: casts dominate


def test_bad_input_exits_2(capsys, tmp_path):
    assert main(["fp8", "model", "--m", "-3", "--k", "1", "--n", "1"]) == 2
    assert main(["fp8", "probe", "--workload", "nope", "--budget-sqnr", "20"]) == 2
    assert "unknown workload" in capsys.readouterr().err
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"version": 1, "module_filter": ["x"]}))
    assert main(["fp8", "check", "--workload", "dlrm-small", "--placement", str(bad)]) == 2
    assert "module_filter" in capsys.readouterr().err


def test_probe_cli_writes_a_placement(tmp_path, capsys):
    out = tmp_path / "fp8.json"
    assert main(["fp8", "probe", "--workload", "dlrm-small", "--budget-sqnr", "20", "--out", str(out),
                 "--warmup-steps", "2", "--max-batches", "3", "--no-require-fast"]) == 0
    p = load_placement(str(out))
    assert p.version == 1 and p.sites and p.budget_sqnr_db == 20
    for name, s in p.sites.items():
        assert s.error and s.speedups and s.dispatch["kernel"]
        assert (s.recipe is None) == (name not in p.module_filter)
        assert s.recipe is not None or s.reason
    assert "FP8 sites:" in capsys.readouterr().out
