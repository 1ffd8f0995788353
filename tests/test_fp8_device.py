"""--device wherever FP8 measures, and the CUDA rules of the recipe table (checked without a GPU)."""

import pytest
import torch

from cubic.cli.app import main
from cubic.core.recipes import Cast
from cubic.core.spec import SpecError
from cubic.core.fingerprint import check_device
from fp8.kernels import KERNELS
from fp8.recipes import gemm_unsupported


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("argv", [
    ["fp8", "probe", "--module", "tests.test_fp8_verdicts:tower_factory", "--budget-sqnr", "20", "--device", "cuda"],
    ["fp8", "kernels", "--m", "16", "--k", "16", "--n", "16", "--device", "cuda:0"],
    ["fp8", "kernels", "--m", "16", "--k", "16", "--n", "16", "--device", "tpu"],
    ["fp8", "check", "--workload", "dlrm-small", "--all", "--steps", "2", "--device", "cuda"],
])
def test_device_flags_refuse_a_device_this_machine_lacks(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--device" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_recommend_and_check_device():
    from fp8.recommend import recommend

    assert check_device("cpu") == torch.device("cpu")
    with pytest.raises(SpecError, match="device: cuda: CUDA is not available"):
        recommend(None, 20.0, device="cuda")


def test_kernels_cli_times_on_the_device_given(capsys):
    assert main(["fp8", "kernels", "--m", "32", "--k", "32", "--n", "32", "--repeats", "1", "--device", "cpu"]) == 0
    assert "measured on cpu" in capsys.readouterr().out


def test_cuda_runs_every_fp8_gemm_of_the_torchao_recipes_for_real(monkeypatch):
    # an H100 (compute capability 9.0): the rowwise backward is e4m3 x e4m3 now, so _scaled_mm takes it
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for name in ("scaled_mm_tensorwise", "scaled_mm_rowwise", "scaled_mm_rowwise_with_gw_hp"):
        assert KERNELS[name].unavailable("cuda", 256, 128, 64) is None, name
    # what cubic ran before (e5m2 gradients under rowwise) is what cuBLASLt refuses
    old = (Cast("e5m2", "rowwise"), Cast("e4m3", "rowwise"))
    assert "e4m3 operands only" in gemm_unsupported("cuda", old, 256, 64, 128)
    assert "multiples of 16" in KERNELS["scaled_mm_rowwise"].unavailable("cuda", 256, 100, 64)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "8.9" in KERNELS["scaled_mm_rowwise"].unavailable("cuda", 256, 128, 64)


def test_kernels_timed_on_another_device_are_not_carried_over():
    # a CPU-timed choice (an emulation was fastest there) is not what a GPU runs, and vice versa
    from fp8.kernels import Fp8Linear
    from fp8.placement import parse_placement
    from fp8.runtime import apply_placement

    def doc(probe_device):
        site = {"m": 64, "k": 32, "n": 32, "recipe": "rowwise", "kernel": "emulated_rowwise"}
        return parse_placement({"probe_device": probe_device, "sites": {"0": site}, "module_filter": ["0"]})

    for probe_device, want in (("cpu", "emulated_rowwise"), ("cuda", "scaled_mm_rowwise")):
        model = apply_placement(torch.nn.Sequential(torch.nn.Linear(32, 32)), doc(probe_device))
        assert isinstance(model[0], Fp8Linear) and model[0].kernel.name == want
