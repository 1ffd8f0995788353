"""cubic.core.train: the one training step, its phase clock, and per-run timing statistics."""

import math

import numpy as np
import pytest
import torch

from cubic.core.config import Config, Kernels
from cubic.core.data import SyntheticData
from cubic.core.models import RowWiseAdagrad
from cubic.core.spec import DataSpec, DLRMArch, Table, Workload, WukongArch
from cubic.core.train import (NonFiniteLoss, PhaseClock, TrainSession, median_ci, slice_batch, steady_start,
                              window_stats)

TINY = Workload(
    name="tiny",
    tables=[Table(name="a", rows=500, dim=8, pooling_factor=2.0), Table(name="b", rows=2000, dim=8, pooling_factor=1.0)],
    dense_arch=DLRMArch(bottom_mlp=[16, 8], top_mlp=[16, 1]),
    batch_size=128,
    data=DataSpec(num_dense_features=4, eval_batch_size=512),
)


@pytest.mark.parametrize("kernel", ["torch", "fbgemm"])
def test_session_trains_and_ne_falls(kernel):
    s = TrainSession(TINY, Config(kernels=Kernels(embedding=kernel)))
    before = s.evaluate()
    losses = s.train(60)
    after = s.evaluate()
    assert len(losses) == 60 and all(math.isfinite(v) for v in losses)
    assert after["ne"] < before["ne"] - 0.05, (before, after)
    assert np.mean(losses[-10:]) < np.mean(losses[:10])


def test_wukong_session_trains():
    wl = TINY.model_copy(update={"dense_arch": WukongArch(num_layers=1, emb_dim=8, num_emb_lcb=2, num_emb_fmb=2,
                                                          rank_fmb=2, mlp_width=16, fmb_mlp_layers=1, top_mlp=[8, 1])})
    s = TrainSession(wl, Config())
    before = s.evaluate()["ne"]
    s.train(40)
    assert s.evaluate()["ne"] < before


def test_phase_split_is_the_same_step():
    # the timed path (backward split at the pooled embeddings) computes what model(batch) does
    a, b = TrainSession(TINY, Config(seed=1)), TrainSession(TINY, Config(seed=1))
    clock = PhaseClock(torch.device("cpu"))
    for step in range(5):
        clock.start()
        la, lb = a.step(step, clock=clock), b.step(step)
        assert la == pytest.approx(lb, rel=1e-6)
    assert set(clock.ms) >= {"embedding_fwd", "dense_fwd", "dense_bwd", "embedding_bwd", "optimizer", "communication"}
    assert all(v >= 0 for v in clock.ms.values()) and clock.step_ms > 0
    assert clock.ms["communication"] == 0.0
    assert sum(clock.ms.values()) == pytest.approx(clock.step_ms, rel=1e-6)


def test_transform_applied_before_the_optimizer():
    seen = []

    def transform(model):
        seen.append(model)
        model.dense.top.fc[-1].weight.requires_grad_(False)  # frozen: the optimizer must not move it
        return model

    s = TrainSession(TINY, Config(), transform=transform)
    w0 = s.model.dense.top.fc[-1].weight.detach().clone()
    s.train(3)
    assert seen == [s.model]
    assert torch.equal(w0, s.model.dense.top.fc[-1].weight)


def test_non_finite_loss_raises_and_train_stops():
    s = TrainSession(TINY, Config())
    s.loss_hook = lambda step, loss: loss * float("nan") if step == 2 else loss
    with pytest.raises(NonFiniteLoss, match="step 2"):
        for step in range(4):
            s.step(step)
    s2 = TrainSession(TINY, Config())
    s2.loss_hook = s.loss_hook
    assert len(s2.train(10)) == 3 and math.isnan(s2.losses[-1])


def test_unchecked_steps_catch_a_nan_at_the_next_check_naming_its_step():
    s = TrainSession(TINY, Config())
    s.loss_hook = lambda step, loss: loss * float("inf") if step == 3 else loss
    for step in range(6):
        s.step_unchecked(step)  # no read-back: nothing raised yet
    assert s.losses == []
    with pytest.raises(NonFiniteLoss, match="step 3") as e:
        s.check_losses()
    assert e.value.step == 3 and len(s.losses) == 3 and all(math.isfinite(v) for v in s.losses)
    ok = TrainSession(TINY, Config())
    for step in range(4):
        ok.step_unchecked(step)
    ok.check_losses()
    ref = TrainSession(TINY, Config())
    assert ok.losses == [ref.step(step) for step in range(4)]  # the same losses as checked steps


def test_slices_of_a_batch_make_the_batch():
    b = SyntheticData(TINY).batch(0)
    parts = [slice_batch(b, lo, lo + 32) for lo in range(0, 128, 32)]
    assert torch.equal(torch.cat([p.dense for p in parts]), b.dense)
    for i in range(2):
        assert torch.equal(torch.cat([p.sparse.values[i] for p in parts]), b.sparse.values[i])
        assert all(p.sparse.offsets[i][0] == 0 and p.sparse.batch_size == 32 for p in parts)


def test_split_rows_adagrad_equals_the_whole_table():
    # two column pieces of one table, one optimizer group: the same update as the whole table
    torch.manual_seed(0)
    full = torch.nn.EmbeddingBag(50, 8, mode="sum", sparse=True)
    left = torch.nn.EmbeddingBag(50, 3, mode="sum", sparse=True, _weight=full.weight.detach()[:, :3].clone())
    right = torch.nn.EmbeddingBag(50, 5, mode="sum", sparse=True, _weight=full.weight.detach()[:, 3:].clone())
    o_full = RowWiseAdagrad([full.weight], lr=0.1)
    o_split = RowWiseAdagrad([{"params": [left.weight, right.weight], "row_dim": 8}], lr=0.1)
    naive = [torch.nn.EmbeddingBag(50, 3, mode="sum", sparse=True, _weight=left.weight.detach().clone()),
             torch.nn.EmbeddingBag(50, 5, mode="sum", sparse=True, _weight=right.weight.detach().clone())]
    o_naive = RowWiseAdagrad([naive[0].weight, naive[1].weight], lr=0.1)  # per-piece state: another optimizer
    for step in range(3):
        ids = torch.randint(0, 50, (40,))
        offs = torch.arange(0, 40, 4)
        target = torch.randn(10, 8)
        for bags, opt in (([full], o_full), ([left, right], o_split), (naive, o_naive)):
            out = torch.cat([bg(ids, offs) for bg in bags], dim=1)
            ((out - target) ** 2).sum().backward()
            opt.step()
            opt.zero_grad()
    joined = torch.cat([left.weight, right.weight], dim=1)
    assert torch.allclose(joined, full.weight, atol=1e-6)
    assert not torch.allclose(torch.cat([naive[0].weight, naive[1].weight], dim=1), full.weight, atol=1e-4)


def test_median_ci_order_statistics():
    med, lo, hi, cov = median_ci(list(range(1, 11)))
    assert (med, lo, hi) == (5.5, 2, 9) and cov == pytest.approx(0.9785, abs=1e-4)  # the textbook n=10 ranks
    assert median_ci([3.0, 1.0, 2.0])[1:3] == (1.0, 3.0)  # too few values: [min, max], coverage below 95 %
    assert median_ci([3.0, 1.0, 2.0])[3] < 0.95
    # the interval covers the true median of a skewed distribution about 95 % of the time (or more)
    rng = np.random.default_rng(0)
    true = math.log(2.0)  # median of Exp(1)
    hits = sum(lo <= true <= hi for lo, hi in (median_ci(list(rng.exponential(size=20)))[1:3] for _ in range(2000)))
    assert 0.94 <= hits / 2000 <= 0.985


def test_window_stats_names_and_order():
    rng = np.random.default_rng(1)
    ms = list(10 + rng.exponential(size=50))
    m = window_stats(ms, batch=256)
    assert m["timing_steps"] + m["timing_steps_dropped"] == 50 and m["timing_steps_dropped"] <= 25
    assert m["timing_window_steps"] == m["timing_steps"] // 10 and m["timing_windows"] >= 10
    assert m["step_time_ci_lo_ms"] <= m["step_time_median_ms"] <= m["step_time_ci_hi_ms"]
    assert m["examples_per_s_ci_lo"] <= m["examples_per_s"] <= m["examples_per_s_ci_hi"]
    assert m["examples_per_s"] == pytest.approx(256 / (m["step_time_median_ms"] / 1e3))


def test_warmup_transient_is_dropped():
    rng = np.random.default_rng(2)
    steady = list(3.0 + rng.normal(0, 0.03, 24))
    transient = [6.0, 5.4, 4.8, 4.2, 3.8, 3.5]  # a fresh process's first steps
    assert 4 <= steady_start(transient + steady) <= 7
    assert steady_start(steady) <= 1  # stationary: nothing dropped, bar a rare outlier at the start
    m = window_stats(transient + steady, batch=100)
    assert m["step_time_median_ms"] == pytest.approx(3.0, rel=0.03)
    assert steady_start([9.0, 3.0, 3.1]) == 0  # too short to tell


def test_preempted_steps_are_left_out():
    # every other step shared its core with another process (twice as long); the rest are the config's
    ms = [3.0 + 0.01 * (i % 3) if i % 2 else 6.5 for i in range(40)]
    pre = [0 if i % 2 else 2 for i in range(40)]
    m = window_stats(ms, batch=300, preempted=pre)
    assert m["steps_preempted_frac"] == 0.5
    assert m["step_time_median_ms"] == pytest.approx(3.01, abs=0.02)
    assert window_stats(ms, batch=300)["step_time_median_ms"] > 4  # without the flags: the mixture
    # fewer than MIN_CLEAN_STEPS unpreempted: every step is used, and the share says so
    m2 = window_stats([6.5, 6.4, 3.0, 6.6], batch=300, preempted=[1, 1, 0, 1])
    assert m2["steps_preempted_frac"] == 0.75 and m2["step_time_median_ms"] > 6


def test_held_out_losses_are_per_example_on_examples_no_run_trains_on():
    s = TrainSession(TINY, Config())
    s.train(3)
    before = [p.detach().clone() for p in s.model.parameters()]
    losses = s.held_out_losses(256)
    assert losses.shape == (256,) and bool((losses >= 0).all()) and s.model.training
    assert all(torch.equal(a, b) for a, b in zip(before, s.model.parameters()))  # nothing trained
    # not the eval batch (final NE is judged there) and not a training batch
    eval_labels = s.data.eval_batch().labels[:256]
    assert not torch.equal(s._held_out.labels, eval_labels)
    assert not torch.equal(s._held_out.labels[:128], s.data.batch(0).labels)
    assert torch.equal(s.held_out_losses(256), losses)  # the same examples each call
