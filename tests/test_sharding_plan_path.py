"""The one plan path (sharding.from_config.plan_for): every runner and the simulator get their plan
from it, `planner: none` means one thing everywhere, out-of-memory is a typed error, the planner
uses the Estimator contract, and the collective model is cost_models.comm's, in ms."""

import numpy as np
import pytest

from cost_models.comm import CommModel
from cost_models.hardware import CLUSTERS
from cubic.core.config import Config, ShardingChoice
from cubic.core.spec import Table, Topology, Workload
from sharding.estimate import Estimator, LearnedEstimator, MeasuredEstimator
from sharding.from_config import DEFAULT_PLANNER, plan_for, planner_name
from sharding.registry import make_planner
from sharding.types import PlanDoesNotFit


def workload(n=8, batch=32):
    return Workload(name="w", tables=[Table(name=f"t{i}", rows=400 * (i + 1), dim=8 * (1 + i % 3),
                                            pooling_factor=1 + i) for i in range(n)], batch_size=batch)


class CountingEstimator(Estimator):
    """Any estimator: the planner must reach it through predict / compute_ms only."""

    source = "modelled"

    def __init__(self):
        self.calls = 0

    def predict(self, X):
        self.calls += 1
        X = np.atleast_2d(X)
        return 1e-3 + 1e-7 * X[:, 2]  # lookup bytes

    def compute_ms(self, ranks, batch):
        from sharding.estimate import rank_features
        return [float(self.predict(rank_features(ws, batch))[0]) for ws in ranks]


def test_none_means_the_same_planner_for_every_runner_and_the_simulator(monkeypatch):
    from cubic.runners.distributed import make_plan
    from cubic.runners.step_model import predict_step
    from cubic.runners.torchrec_runner import TorchRecRunner

    cfg = Config(sharding=ShardingChoice(planner="none"))
    assert planner_name(cfg) == DEFAULT_PLANNER == "greedy"
    for name in ("sim", "sim-greedy", ""):
        assert planner_name(Config(sharding=ShardingChoice(planner=name))) == "greedy"
    wl = workload()
    seen = []
    import sharding.from_config as fc

    real = fc.plan_for
    monkeypatch.setattr(fc, "plan_for", lambda *a, **k: seen.append(k.get("target", "any")) or real(*a, **k))
    assert make_plan(wl, cfg, 2).planner == "greedy"
    assert TorchRecRunner(world_size=2)._plan(wl, cfg, 32).planner == "greedy"
    pred = predict_step(wl, cfg, CLUSTERS["h100"], 4) if "h100" in CLUSTERS else None
    if pred is not None:
        assert pred.plan["planner"] == "greedy" and pred.sharding_plan.planner == "greedy"
    assert seen[:2] == ["any", "torchrec"] and len(seen) == 2 + (pred is not None)


def test_explicit_plan_is_checked_against_the_run():
    wl = workload()
    plan = make_planner("dim_greedy").plan(wl.tables, Topology(world_size=2, ranks_per_node=2), 32)
    cfg = Config(sharding=ShardingChoice(plan=plan.model_dump(mode="json")))
    assert plan_for(wl, cfg, 2).shards == plan.shards
    with pytest.raises(Exception, match="for 2 ranks, the run has 4"):
        plan_for(wl, cfg, 4)


@pytest.mark.parametrize("name", ["greedy", "dim_greedy", "cubic"])
def test_planners_raise_plan_does_not_fit(name):
    tables = [Table(name=f"t{i}", rows=200_000, dim=64) for i in range(6)]  # ~52 MB each
    topo = Topology(world_size=2, ranks_per_node=2, memory_per_rank_gb=0.1)
    kw = {"time_budget_s": 0.3} if name == "cubic" else {}
    with pytest.raises(PlanDoesNotFit):
        make_planner(name, estimator=CountingEstimator(), **kw).plan(tables, topo, 16)


def test_simulator_reports_oom_from_the_typed_error():
    from cubic.runners.step_model import StepModelParams, predict_step

    if "h100" not in CLUSTERS:
        pytest.skip("no h100 cluster")
    wl = Workload(name="big", tables=[Table(name=f"t{i}", rows=30_000_000, dim=256) for i in range(8)], batch_size=64)
    pred = predict_step(wl, Config(), CLUSTERS["h100"], 2, StepModelParams())
    assert pred.oom and pred.oom_reason


def test_cubic_planner_uses_any_estimator_through_the_contract():
    est = CountingEstimator()
    plan = make_planner("cubic", estimator=est, time_budget_s=0.3).plan(workload().tables, Topology(world_size=2), 32)
    assert est.calls > 0 and plan.predicted is not None
    assert LearnedEstimator().can_predict() and not MeasuredEstimator().can_predict()
    with pytest.raises(Exception, match="Estimator.predict"):
        make_planner("cubic", estimator=MeasuredEstimator()).plan(workload().tables, Topology(world_size=2), 32)


def test_greedy_is_a_registered_planner_with_torchrec_shapes():
    wl = workload(12)
    topo = Topology(world_size=4, ranks_per_node=4, memory_per_rank_gb=0.001)
    plan = make_planner("greedy", estimator=CountingEstimator(), target="torchrec").plan(wl.tables, topo, 32)
    from sharding.torchrec_adapter import torchrec_layout

    assert set(torchrec_layout(plan)) == {t.name for t in wl.tables}  # every table maps onto TorchRec's layouts


def test_one_collective_model_in_ms():
    m = CommModel(alpha_s=1e-5, alpha_peer_s=0.0, beta_intra_s_per_byte=1e-9, beta_inter_s_per_byte=1e-8,
                  ranks_per_node=8, source="bandwidth", alpha_inter_s=2e-5)
    # one node of 8, 1 MB: ring 2*7/8*1e6*1e-9 s + 14 latencies
    assert m.all_reduce_ms(8, 1e6) == pytest.approx(1e3 * (2 * 7 / 8 * 1e6 * 1e-9 + 14 * 1e-5))
    # 2 nodes of 8: plus the inter-node leg on 1/8 of the bytes (ring of 2 = tree of 2)
    inter = 1e3 * min(2 * 1 / 2 * 1e6 / 8 * 1e-8 + 2 * 2e-5, 2 * 1e6 / 8 * 1e-8 + 2 * 2e-5)
    assert m.all_reduce_ms(16, 1e6) == pytest.approx(m.all_reduce_ms(8, 1e6) + inter)
    ranks = m.all_to_all_ranks_ms(np.full(4, 1e5), 4)
    assert ranks.shape == (4,) and ranks[0] == pytest.approx(m.all_to_all_ms(4, 3e5, 3e5))
    import cubic.runners.step_model as sm

    assert not hasattr(sm, "allreduce_s") and not hasattr(sm, "greedy_plan")
