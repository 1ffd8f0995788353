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
    assert all(p["met"] for p in out["rows"]["torchao_parity"].values())  # a CPU: bit-identical or summation order
    assert out["rows"]["export_converted"] == ["2", "4", "6"]
    failed = {k: t for k, t in out["targets"].items() if not t["met"]}
    assert failed == {}, failed
    # a met target carries no reason; a figure above the equality bar says which bound it met
    par = next(t for k, t in out["targets"].items() if k.startswith("cubic's Linear vs torchao"))
    assert "reason" not in par and ("note" in par) == (par["measured"] > par["target"])


def _pretend_cuda(monkeypatch, tmp_path, gpu_checks, calls):
    """gpu_checks.main's CUDA path with every check stubbed: the sections' bookkeeping, not the GPU."""
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Test GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))

    def fp8_checks(device, quick):
        calls.append("fp8")
        return {"rows": {"device": device}, "targets": {"t": {"measured": 1, "target": 1, "met": True}}}

    def gemm_rows(grid):
        calls.append("gemms")
        raise RuntimeError("planted failure")

    monkeypatch.setattr(gpu_checks, "fp8_checks", fp8_checks)
    monkeypatch.setattr(gpu_checks, "gemm_rows", gemm_rows)
    monkeypatch.setattr(gpu_checks, "runner_rows",
                        lambda steps, deadline: calls.append("runner") or [{"workload": "w", "status": "ok"}])
    monkeypatch.setattr(gpu_checks, "block_rows",
                        lambda shapes, deadline: calls.append("blocks") or {"blocks": [{"m": 1}], "blocks_left_out": []})
    monkeypatch.setattr(gpu_checks, "sharding_rows", lambda steps: calls.append("sharding") or [])
    monkeypatch.setattr(gpu_checks, "site_step_rows",
                        lambda deadline: calls.append("site_steps") or {"site_steps": [], "site_steps_left_out": []})


def test_a_failed_section_is_recorded_and_the_others_run(monkeypatch, tmp_path, capsys):
    from experiments import gpu_checks

    calls: list[str] = []
    _pretend_cuda(monkeypatch, tmp_path, gpu_checks, calls)
    monkeypatch.setattr(sys, "argv", ["gpu_checks.py", "--quick"])
    assert gpu_checks.main() == 0
    assert calls == ["fp8", "gemms", "runner", "blocks", "sharding", "site_steps"]
    doc = json.loads((tmp_path / "gpu_checks.json").read_text())
    assert doc["label"] == "measured on Test GPU"
    assert doc["sections"]["gemms"]["status"] == "failed" and "planted failure" in doc["sections"]["gemms"]["error"]
    assert {k: v["status"] for k, v in doc["sections"].items() if k != "gemms"} == dict.fromkeys(
        ("fp8", "runner", "blocks", "sharding_uvm_caching", "site_steps"), "ok")
    assert doc["gemms"] == [] and doc["runner"] == [{"workload": "w", "status": "ok"}]


def test_sections_replace_only_what_they_remeasure(monkeypatch, tmp_path):
    from experiments import gpu_checks

    calls: list[str] = []
    _pretend_cuda(monkeypatch, tmp_path, gpu_checks, calls)
    monkeypatch.setattr(sys, "argv", ["gpu_checks.py", "--quick"])
    gpu_checks.main()
    first = json.loads((tmp_path / "gpu_checks.json").read_text())
    calls.clear()
    monkeypatch.setenv("CUBIC_CODE_VERSION", "second-run")
    monkeypatch.setattr(gpu_checks, "block_rows",
                        lambda shapes, deadline: calls.append("blocks") or {"blocks": [{"m": 2}], "blocks_left_out": []})
    monkeypatch.setattr(sys, "argv", ["gpu_checks.py", "--quick", "--sections", "blocks"])
    from cubic.core.fingerprint import code_version

    code_version.cache_clear()  # read once per process; the second run is another process in real use
    try:
        assert gpu_checks.main() == 0
    finally:
        monkeypatch.delenv("CUBIC_CODE_VERSION")
        code_version.cache_clear()
    assert calls == ["blocks"]
    doc = json.loads((tmp_path / "gpu_checks.json").read_text())
    assert doc["blocks"] == [{"m": 2}] and doc["runner"] == first["runner"] and doc["fp8"] == first["fp8"]
    assert doc["sections"]["blocks"]["code_version"] == "second-run"
    assert doc["sections"]["runner"]["code_version"] == first["sections"]["runner"]["code_version"] != "second-run"


@pytest.mark.parametrize("flags, line_start", [
    (["--sections", "gemms,nope"], "gpu_checks.py: --sections: unknown ['nope']"),
    (["--out", "../elsewhere"], "gpu_checks.py: --out: '../elsewhere'"),
])
def test_a_bad_flag_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys, flags, line_start):
    from experiments import gpu_checks

    _pretend_cuda(monkeypatch, tmp_path, gpu_checks, [])
    monkeypatch.setattr(sys, "argv", ["gpu_checks.py", *flags])
    assert gpu_checks.main() == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(line_start) and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_repeat_without_the_fp8_section_says_so_in_its_targets(monkeypatch, tmp_path, capsys):
    # on the lent H100, `--sections gemms,blocks --out gpu_checks_repeat` stopped on the benchmark
    # convention's check (no targets) after its first section
    from experiments import gpu_checks

    calls: list[str] = []
    _pretend_cuda(monkeypatch, tmp_path, gpu_checks, calls)
    monkeypatch.setattr(sys, "argv", ["gpu_checks.py", "--quick", "--sections", "runner,blocks", "--out", "gpu_checks_repeat"])
    assert gpu_checks.main() == 0
    assert calls == ["runner", "blocks"]
    assert [p.name for p in tmp_path.iterdir()] == ["gpu_checks_repeat.json"]
    doc = json.loads((tmp_path / "gpu_checks_repeat.json").read_text())
    (target,) = doc["targets"].values()
    assert target["met"] is False and "not among --sections runner,blocks" in target["reason"]
    assert doc["blocks"] == [{"m": 1}] and set(doc["sections"]) == {"runner", "blocks"}



def test_site_steps_place_fp8_on_exactly_the_site_they_name():
    # the whole-step section on the CPU, eager and tiny: each row's converted Linears are its variant's
    pytest.importorskip("torchao.float8")
    from experiments.gpu_checks import site_step_rows

    def timer(fn):
        fn()
        return {"time_s": 1.0, "time_s_synced": 2.0}

    out = site_step_rows(device="cpu", towers={"t": (32, (64, 32, 16))}, recipes=("tensorwise",), compile=False,
                         timer=timer)
    got = [(r["variant"], r["site"], r["converted"], (r["m"], r["k"], r["n"]), r["act_after"]) for r in out["site_steps"]]
    assert got == [("bf16", None, [], (None, None, None), None),
                   ("site", "0", ["0"], (32, 64, 32), "relu"), ("site", "2", ["2"], (32, 32, 16), None),
                   ("all", None, ["0", "2"], (None, None, None), None), ("bf16_again", None, [], (None, None, None), None)]
    assert {(r["step_s"], r["step_s_synced"]) for r in out["site_steps"]} == {(1.0, 2.0)}
    late = site_step_rows(deadline=0.0, device="cpu", towers={"t": (32, (64, 32, 16))}, recipes=("rowwise",),
                          compile=False, timer=timer)
    assert late["site_steps"] == [] and [(x["variant"], x["site"]) for x in late["site_steps_left_out"]] == [
        ("bf16", None), ("site", "0"), ("site", "2"), ("all", None), ("bf16_again", None)]
