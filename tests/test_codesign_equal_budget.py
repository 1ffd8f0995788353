"""Fair quality comparisons: NE and loss at an equal training budget (examples seen), not after
equal steps, in the runs' metrics, the campaign's NE constraints and the answer."""

import pytest

from cubic.codesign.evaluate import at_examples, budget_metrics, equal_budget
from cubic.core.result import Result
from cubic.core.workloads import DEFAULT_WORKLOADS
from search.space import Space

SPACE = Space.model_validate({
    "version": 1, "name": "t", "objectives": [{"metric": "examples_per_s"}],
    "constraints": [{"name": "minimum quality", "metric": "ne_end", "max": 1.3},
                    {"name": "memory", "metric": "peak_mem_bytes", "max": 8e9}],
    "parameters": [{"name": "batch_size", "type": "categorical", "choices": [512, 1024, 4096]}]})


def test_ne_is_read_at_the_smallest_batchs_examples_from_the_trajectory():
    # 10 steps of batch 512 = 5,120 examples; batch 4096 reaches that 1.25 steps in
    assert equal_budget(SPACE, DEFAULT_WORKLOADS["dlrm-small"], steps=8, warmup=2) == 5120
    traj = [{"step": 0.0, "ne": 1.0, "loss": 0.7}, {"step": 2.0, "ne": 0.9, "loss": 0.6},
            {"step": 10.0, "ne": 0.5, "loss": 0.4}]
    assert at_examples(traj, 4096, 5120, "ne") == pytest.approx(1.0 - 0.1 * 1.25 / 2)
    assert at_examples(traj, 512, 5120, "ne") == 0.5  # the smallest batch: its end
    assert at_examples(traj, 256, 5120, "ne") is None  # never reached the budget: nothing invented
    big = Result(status="ok", metrics={"ne_end": 0.5}, trajectory=traj)
    m = budget_metrics(big, 4096, 5120)
    assert m["ne_at_budget"] == pytest.approx(0.9375) and m["examples_budget"] == 5120
    assert m["ne_at_budget"] > big.metrics["ne_end"]  # after equal steps the big batch looked 8x better trained


def test_the_campaigns_ne_constraint_uses_the_same_rule():
    from cubic.cli.campaign import REPORTED_METRICS, _at_equal_budget

    ceiling = SPACE.with_ne_ceiling(1.0)  # shape tuning's NE ceiling: a comparison with the default config
    local = _at_equal_budget(ceiling, "local")
    assert [c.metric for c in local.constraints] == ["ne_end", "peak_mem_bytes", "ne_at_budget"]
    assert local.constraints[2].max == ceiling.constraints[2].max and "ne_at_budget" in REPORTED_METRICS["local"]
    # the absolute sanity floor ("did training go wrong") stays on the run's own end NE
    assert _at_equal_budget(SPACE, "local") is SPACE
    assert _at_equal_budget(ceiling, "simulated") is ceiling  # no trajectory there: unchanged


def test_a_runner_evaluate_reports_ne_at_the_budget_and_the_answer_says_the_rule(tmp_path):
    from cubic.codesign.campaign import Campaign
    from cubic.codesign.evaluate import RunnerEvaluate
    from cubic.codesign.report import write_report
    from cubic.core.store import TrialStore

    class Traj:
        source = "measured"

        def fingerprint_hash(self):
            return "fp"

        def run(self, workload, config, *, steps=50, warmup=5, progress=None):
            b = config.batch_size
            traj = [{"step": float(s), "ne": 1.0 - 0.04 * s * b / 512, "loss": 0.7} for s in range(steps + warmup + 1)]
            return Result(status="ok", metrics={"examples_per_s": 10.0 * b, "ne_end": traj[-1]["ne"],
                                                "batch_size": float(b), "load_avg_1m": 0.0},
                          trajectory=traj, fingerprint={"cpu_count": 2}, fingerprint_hash="fp", wall_time_s=0.1)

    space = _space()
    ev = RunnerEvaluate(DEFAULT_WORKLOADS["dlrm-small"], Traj(), space, steps=4, warmup=1,
                        store=TrialStore(f"sqlite:///{tmp_path}/t.db"))
    ev.budget_examples = equal_budget(space, ev.workload, 4, 1)
    storage = f"sqlite:///{tmp_path}/c.db"
    c = Campaign(space, ev, name="nb", strategy="random", budget=3, batch_size=3, storage=storage, seed=1,
                 context={"workload": "dlrm-small", "runner": {"kind": "local", "steps": 4, "warmup": 1}})
    ev.attach(c)
    c.measure_baseline({"batch_size": 512}, "batch 512")
    c.run()
    obs = {o.point["batch_size"]: o.metrics for o in c.observations()}
    # equal budget: every batch's NE at 2,560 examples is the same (the toy learns per example)
    assert len({round(m["ne_at_budget"], 9) for m in obs.values()}) == 1
    assert obs[4096]["ne_end"] < obs[512]["ne_end"]  # what an equal-steps comparison would have credited
    write_report("nb", storage=storage, out_dir=tmp_path / "rep", store_url=f"sqlite:///{tmp_path}/t.db")
    answer = (tmp_path / "rep" / "answer.md").read_text()
    assert "ne_at_budget (lower is better)" in answer and "equal training budget: 2,560 examples" in answer
    # the winner (batch 4096) makes 0.625 of an update within 2,560 examples: the answer says so
    assert "(not comparable: under one update, below)" in answer
    assert "; its NE is not compared: under one update within the equal budget" in answer.splitlines()[2]  # headline
    assert "the winner (batch 4,096) makes 0.62 of one update" in answer and "--steps 79 gives it 10" in answer


def test_a_batch_under_one_update_at_the_budget_is_named_with_the_steps_that_fix_it(capsys):
    from cubic.cli.campaign import _note_budget
    from cubic.codesign.evaluate import batch_sizes, one_update_caveat

    # make run's campaign: batches 256-4096, 10 steps + 2 warm-up: a budget of 3,072 examples
    c = one_update_caveat(256 * 12, 4096, 10, 2, "the winner")
    assert "makes 0.75 of one update" in c and "3,072 examples" in c
    assert "--steps 158 gives it 10 updates" in c  # 256 x (158 + 2) = 10 x 4096
    assert one_update_caveat(256 * 12, 2048, 10, 2, "the winner") is None  # one update and a half
    assert one_update_caveat(None, 4096, 10, 2, "the winner") is None
    assert batch_sizes(SPACE, DEFAULT_WORKLOADS["dlrm-small"]) == (512, 4096)
    _note_budget(SPACE, DEFAULT_WORKLOADS["dlrm-small"], 4, 1)  # 2,560 examples < 4096
    assert capsys.readouterr().err.startswith("cubic: note: the space's largest batch (batch 4,096) makes 0.62")
    _note_budget(SPACE, DEFAULT_WORKLOADS["dlrm-small"], 78, 2)  # 40,960 examples: 10 updates of 4096
    assert capsys.readouterr().err == ""


def _space():
    return Space.model_validate({**SPACE.to_json(), "constraints": [
        {"name": "minimum quality", "metric": "ne_end", "max": 1.3}]})
