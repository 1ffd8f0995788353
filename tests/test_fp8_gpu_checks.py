"""experiments/gpu_checks.py on a machine without CUDA: one line, exit 0, and a results file that
records the run measured nothing (no rows for the H100 fit; its target missed, with why)."""

import json
import sys

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the checks would run for real")
def test_gpu_checks_without_cuda_records_that_nothing_was_measured(monkeypatch, capsys, tmp_path):
    import experiments.common as common
    from experiments import gpu_checks

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["gpu_checks.py", "--quick"])
    assert gpu_checks.main() == 0
    assert capsys.readouterr().out.strip() == f"no CUDA device; wrote {tmp_path / 'gpu_checks.json'}"
    assert [p.name for p in tmp_path.iterdir()] == ["gpu_checks.json"]
    doc = json.loads((tmp_path / "gpu_checks.json").read_text())
    assert doc["gemms"] == [] and doc["blocks"] == [] and doc["device"] is None
    (target,) = doc["targets"].values()
    assert target["met"] is False and target["measured"] is False and "no CUDA device" in target["reason"]


@pytest.mark.slow  # ~15 s on a shared CPU: the Probe, Dispatch, torchao parity, export and training
def test_the_fp8_gpu_checks_run_here_on_the_cpu():
    # the same code the GPU session runs with device="cuda"; here on the CPU, quick
    pytest.importorskip("torchao.float8")
    from experiments.gpu_checks import fp8_checks

    out = fp8_checks("cpu", quick=True)
    assert out["rows"]["probe"]["probe_device"] == "cpu"
    assert all(p["bit_identical"] for p in out["rows"]["torchao_parity"].values())  # a CPU: bit-identical
    assert out["rows"]["export_converted"] == ["2", "4", "6"]
    failed = {k: t for k, t in out["targets"].items() if not t["met"]}
    assert failed == {}, failed
