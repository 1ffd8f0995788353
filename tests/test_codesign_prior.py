"""The step-model prior: where it exists (one CPU process, W gloo processes on this CPU, a simulated
cluster) and that a distributed run's prior prices the plan's communication on the gloo links."""

from __future__ import annotations

import math

import pytest

from cost_models.hardware import DeviceSpec
from cubic.codesign.prior import StepModelPrior
from cubic.core.config import Config
from cubic.core.workloads import DEFAULT_WORKLOADS

CPU_DEVICE = DeviceSpec(name="cpu", peak_flops_fp32=1e11, peak_flops_bf16=5e10, peak_flops_fp8=2e10,
                        hbm_bw=2e10, hbm_bytes=64e9)


def _ctx(**runner):
    return {"workload": "wukong-small", "runner": runner}


def test_the_prior_exists_where_cubic_has_measured_the_machine():
    assert StepModelPrior.available(_ctx(kind="local", device="cpu"))
    assert StepModelPrior.available(_ctx(kind="distributed", device="cpu", world_size=2))
    assert not StepModelPrior.available(_ctx(kind="distributed", device="cuda", world_size=2))  # no description
    assert not StepModelPrior.available(_ctx(kind="local", device="cpu", ray=True))  # another machine
    assert not StepModelPrior.available({"workload": "wukong-small", "world_size": 4,
                                         "runner": {"kind": "local", "device": "cpu"}})


@pytest.fixture()
def no_micro_benchmarks(monkeypatch):
    from cubic.runners import calibration

    monkeypatch.setattr(calibration, "cpu_device", lambda threads=1, **k: CPU_DEVICE)


def test_a_distributed_prior_prices_the_plan_and_its_all_to_alls(no_micro_benchmarks):
    wl = DEFAULT_WORKLOADS["wukong-small"]
    one = StepModelPrior(_ctx(kind="local", device="cpu", threads=1))
    two = StepModelPrior(_ctx(kind="distributed", device="cpu", threads=1, world_size=2))
    cfg = {p: Config(batch_size=1024, sharding={"planner": p}) for p in ("size_greedy", "random")}
    thr_one = one(wl, Config(batch_size=1024))[0]
    thr = {p: two(wl, c)[0] for p, c in cfg.items()}
    assert all(math.isfinite(v) for v in [thr_one, *thr.values()])
    # two processes each train a batch of 1024 (the global batch is 2048), and pay for the all-to-alls
    # the one process does not: not the one process's throughput, and not twice it either
    assert thr_one < max(thr.values()) < thr_one + math.log(2.0)
    assert thr["size_greedy"] != thr["random"]  # the planner's plan, not only the batch, is priced
    # the dense knobs still matter, as in one process
    bf16 = Config(batch_size=1024, sharding={"planner": "random"}, kernels={"dense_dtype": "bf16"})
    assert two(wl, bf16)[0] != thr["random"]
