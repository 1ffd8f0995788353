"""Live progress of a campaign: the engine tells a listener, the listener prints one line per run
(trial, varying knobs, result, measured/served/simulated, the strategy's prediction)."""

import dataclasses
import io

from cubic.codesign.campaign import Campaign, RunEvent
from cubic.codesign.evaluate import RunnerEvaluate
from cubic.core.result import Result
from cubic.codesign.progress import ProgressLines, format_run
from cubic.core.store import TrialStore
from cubic.testing import FastRunner, recording_listener, space, toy_workload


class MeasuredRunner(FastRunner):
    """The stand-in, labelled as a measurement (what a local run reports)."""

    source = "measured"

    def run(self, workload, config, **kw) -> Result:
        return super().run(workload, config, **kw).model_copy(update={"source": "measured"})


def _campaign(name, store, stream, budget=4):
    sp = space()
    ev = RunnerEvaluate(toy_workload(), MeasuredRunner(delay_s=0.0), sp, steps=1, warmup=0, store=store)
    c = Campaign(sp, ev, name=name, strategy="random", budget=budget, batch_size=2, seed=3,
                 listener=ProgressLines(sp, stream=stream))
    ev.attach(c)
    return c


def test_one_line_per_run_labelled_measured_then_served_from_the_store(tmp_path):
    store = TrialStore(f"sqlite:///{tmp_path}/t.db")
    first = io.StringIO()  # not a terminal: plain lines, no bar
    s = _campaign("first", store, first).run()
    every = first.getvalue().splitlines()
    starts = [x for x in every if " starts: " in x]
    lines = [x for x in every if " starts: " not in x]
    assert s.runs == 4 and s.served == 0 and len(lines) == 4 and len(starts) == 4
    for line in starts:  # a line when a run starts: its knobs
        assert line.startswith("first run ") and "batch_size=" in line and "seed=" in line
    for i, line in enumerate(lines, 1):
        head, tail = line.split(" | ")
        assert head.startswith(f"first run {i}/4 (trial ") and head.endswith("; measured")
        assert "batch_size=" in head and "kernels.dense_dtype=" in head and "seed=" in head
        assert "examples/s " in head or "FAILED oom" in head
        if "examples/s " in head:  # the interval says what it rests on: one run + the machine's noise
            assert "(1 repeat + " in head
        # best so far, runs left, ETA
        assert tail.startswith("best so far ") and f"; {4 - i} runs left" in tail and ("ETA" in tail) == (i < 4)
    # the same points again (same seed): every one is served from the trial store, and counted
    again = io.StringIO()
    s2 = _campaign("again", store, again).run()
    lines = [x.split(" | ")[0] for x in again.getvalue().splitlines() if " starts: " not in x]
    assert s2.served == 4 and len(lines) == 4
    assert all(line.endswith("; served from the trial store") for line in lines)


def test_failed_runs_say_their_kind_and_the_engine_itself_prints_nothing(capsys):
    sp = space()
    rec = recording_listener()
    c = Campaign(sp, lambda p: Result.failed("oom", "stand-in: out of\nmemory"), strategy="random", budget=2,
                 batch_size=2, listener=rec)
    c.run()
    assert capsys.readouterr() == ("", "")  # no listener of the terminal's: silence
    assert rec.events[0] == ("started", (c.name, 0, 2)) and rec.events[-1] == ("stopped", (c.name, "budget"))
    events = [args[0] for args in rec.heard("finished_run")]
    assert [e.runs for e in events] == [1, 2] and all(isinstance(e, RunEvent) for e in events)
    line = format_run(events[0], sp)
    assert "-> FAILED oom: stand-in: out of memory; measured" in line and "\n" not in line


def test_a_line_shows_the_interval_and_the_prediction():
    sp = space()
    ev = Result(status="ok", metrics={"examples_per_s": 1234.5, "examples_per_s_ci_lo": 1200.0, "examples_per_s_ci_hi": 1260.0,
                             "ne_end": 0.91234, "peak_mem_bytes": 7.5e9})
    e = RunEvent(campaign="c", trial=7, round=2, point={"batch_size": 512, "kernels.embedding": "torch",
                                                         "kernels.dense_dtype": "bf16", "seed": 1},
                 evaluation=ev, attempts=1, violation=0.25,
                 predicted={"examples_per_s": 1100.0, "p_feasible": 0.93, "family": "gbm"}, runs=3, budget=12)
    line = format_run(e, sp)
    assert line.startswith("c run 3/12 (trial 7): batch_size=512 kernels.embedding=torch kernels.dense_dtype=bf16 seed=1")
    assert "examples/s 1,230 [1,200, 1,260]" in line and "NE 0.9123" in line and "peak memory 6.98 GiB" in line
    # constrained values shown with their limit: 7.5 GB > the space's 6 GB
    assert "INFEASIBLE: peak_mem_bytes 6.98 GiB > 5.59 GiB (memory per device)" in line
    assert line.endswith("; measured; predicted examples/s 1,100 by the proxy (gbm, P(feasible) 0.93)")
    # NE read at the campaign's equal budget says at how many examples
    at = ev.model_copy(update={"metrics": {**ev.metrics, "ne_at_budget": 1.8796, "examples_budget": 3072.0}})
    assert "NE 1.8796 at 3,072 examples" in format_run(dataclasses.replace(e, evaluation=at), sp)
