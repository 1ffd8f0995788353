"""A shard's resident state (fp32 weights and its embedding optimizer's per-row state) is one rule."""

import numpy as np


def test_a_shards_state_is_one_rule_for_the_plan_the_step_model_and_the_run(monkeypatch):
    """What a weight average moves and what a rank holds: the planner's storage, the step model's shard
    bytes and a run's resident state all read sharding.types.Storage.parts (they were written three ways)."""
    from cubic.core.config import Config
    from cubic.core.workloads import DEFAULT_WORKLOADS
    from cubic.runners.memory import state_bytes
    from cubic.runners.step_model import _GroupShards
    from sharding import types

    wl = DEFAULT_WORKLOADS["dlrm-small"]
    rows = sum(t.rows for t in wl.tables)
    before = state_bytes(wl, Config())["embedding_optimizer"]
    assert before == 4 * rows and types.Storage.parts(10, 8, "sgd") == (320, 0)
    monkeypatch.setitem(types.ROW_STATE_BYTES, "rowwise_adagrad", 12)  # a state of three fp32 per row
    assert state_bytes(wl, Config())["embedding_optimizer"] == 12 * rows
    assert types.Storage.of(10, 8).total == 320 + 120
    sh = _GroupShards.__new__(_GroupShards)
    sh.rows, sh.cols = np.array([10, 20]), np.array([8, 4])
    assert list(sh.shard_bytes("rowwise_adagrad")) == [320 + 120, 320 + 240]
    assert list(sh.shard_bytes("sgd")) == [320, 320]
