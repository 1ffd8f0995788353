"""Pre-flight memory: a run whose tables and dense state cannot fit is refused before it starts,
with both sizes in one line; an allocator's bare assert is told as an out-of-memory."""

import pytest

from cubic.core.config import Config
from cubic.core.spec import Workload
from cubic.runners import memory
from cubic.testing import toy_workload


def _big(rows: int = 10**11) -> Workload:
    d = toy_workload().model_dump(mode="json")
    d["tables"] = [dict(d["tables"][0], rows=rows, dim=16)]
    return Workload.model_validate(d)


def test_need_counts_tables_optimizer_state_and_dense_state():
    need = memory.state_bytes(_big(1000), Config())
    assert need["embedding_tables"] == 1000 * 16 * 4 and need["embedding_optimizer"] == 1000 * 4
    sgd = _big(1000).model_copy(update={"optimizers": _big().optimizers.model_copy(update={"embedding": "sgd"})})
    assert memory.state_bytes(sgd, Config())["embedding_optimizer"] == 0
    assert need["dense_params_grads_optimizer"] > 0


def test_a_run_that_cannot_fit_is_refused_before_any_child_starts(monkeypatch):
    from cubic.runners.local import LocalRunner

    def no_child(*a, **k):
        raise AssertionError("a child was started")

    monkeypatch.setattr(LocalRunner, "_run_child", no_child)
    monkeypatch.setattr(LocalRunner, "_stamp", lambda self, r: r)  # (no fingerprint needed here)
    r = LocalRunner().run(_big(), Config(), steps=1, warmup=0)
    assert r.failure_kind == "invalid" and r.reason.startswith("infeasible, not started")
    have, _ = memory.capacity("cpu")
    assert "6,333.0 GiB" in r.reason and memory.fmt_gib(have) in r.reason and "\n" not in r.reason


@pytest.mark.parametrize("name", ["dlrm-small", "wukong-small"])
def test_the_embedded_workloads_are_not_refused(name):
    from cubic.core.workloads import DEFAULT_WORKLOADS

    if name not in DEFAULT_WORKLOADS:
        pytest.skip(f"no {name}")
    assert memory.preflight(DEFAULT_WORKLOADS[name], Config()) is None


def test_a_memory_limit_is_the_bound_when_smaller():
    why = memory.preflight(_big(10**6), Config(), device="cpu", limit_bytes=2**20)
    assert why and "memory limit of" in why


def test_an_allocator_assert_reads_as_out_of_memory_with_sizes():
    kind, reason = memory.explain_oom("error", "RuntimeError: err == 0.", _big(), Config(), device="cpu")
    assert kind == "oom" and "6,333.0 GiB" in reason and "err == 0" in reason
    assert memory.explain_oom("error", "ValueError: x", None, None) == ("error", "ValueError: x")
    assert memory.explain_oom("oom", "CUDA out of memory", None, None)[0] == "oom"
