"""experiments/fp8_gemm_attribution.py: a --quick run end to end (slow)."""

import json
import sys

import pytest

from tests.benchmark_convention import check_targets


@pytest.mark.slow
def test_quick_run_writes_each_role_with_both_evaluations_and_reasons(tmp_path, monkeypatch):
    import experiments.common as common
    from experiments import fp8_gemm_attribution as fa

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["fp8_gemm_attribution.py", "--quick", "--workers", "1"])
    fa.main()
    out = json.loads((tmp_path / "fp8_gemm_attribution_quick.json").read_text())
    assert set(out["variants"]) == {"fwd_gi", "fwd_only", "gi_only"}
    for v in out["variants"].values():
        assert v["eval_as_trained"]["seeds"] == v["eval_fp32"]["seeds"] == 2
    check_targets(out["targets"])
    assert (tmp_path / "fp8_gemm_attribution_quick.png").is_file()
