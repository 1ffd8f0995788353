"""`cubic campaign run --objective` (issue 22, point 5): every run of a user's job goes into the trial
store, keyed by the command line and the values, and shows in `cubic trials list|show`; a run that
timed out is retried at most once, and the progress lines say so; a constrained value is shown
with its limit (`INFEASIBLE: loss 0.71 > 0.6`)."""

import json
import sys

from cubic.cli.app import main
from cubic.core.config import JobConfig
from cubic.core.store import TrialStore, check_pending_line

JOB = """
import argparse, json, time
p = argparse.ArgumentParser()
p.add_argument("--a", type=int)
a = p.parse_args().a
if a == 3:
    time.sleep(60)  # hangs: a timeout
print(json.dumps({"qps": 100.0 * a, "loss": {1: 0.5, 2: 0.71}[a]}))
"""
SPACE = """
version: 1
name: job
objectives: [{metric: qps, direction: maximize}]
constraints: [{name: loss, metric: loss, max: 0.6}]
parameters:
  - {name: a, type: categorical, choices: [1, 2, 3]}
"""


def test_job_runs_are_stored_shown_and_a_timeout_is_retried_once(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "space.yaml").write_text(SPACE)
    store = ["--store", f"sqlite:///{tmp_path}/t.db"]
    rc = main(["campaign", "run", "--objective", f"{sys.executable} job.py --a {{a}}", "--space", "space.yaml",
               "--name", "j", "--strategy", "random", "--budget", "3", "--batch", "3", "--timeout", "3",
               "--no-baseline", "--confirm-repeats", "0", "--storage", f"sqlite:///{tmp_path}/c.db", *store])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "j trial " in err and ": retry 1 of 1 after timeout (no result after 3 s" in err
    assert "retry 2 of" not in err  # a timeout gets one retry, not --retries (2)
    assert "INFEASIBLE: loss 0.710 > 0.600" in err

    trials = TrialStore(f"sqlite:///{tmp_path}/t.db").trials(campaign="j")
    by_a = {}
    for t in trials:
        by_a.setdefault(t.config["values"]["a"], []).append(t)
    assert sorted(by_a) == [1, 2, 3] and len(trials) == 4  # a=3: its run and its one retry
    assert [t.attempt for t in by_a[3]] == [1, 2] and all(t.failure_kind == "timeout" for t in by_a[3])
    assert by_a[1][0].status == "ok" and by_a[1][0].metrics["qps"] == 100.0 and by_a[1][0].workload == "job.py"
    # keyed by the command line (one workload hash for every run) and the values (a config hash each)
    assert len({t.workload_hash for t in trials}) == 1 and len({t.config_hash for t in trials}) == 3
    job = JobConfig.model_validate(by_a[2][0].config)
    assert job.command == f"{sys.executable} job.py --a {{a}}" and job.values == {"a": 2}
    assert (job.job_hash(), job.content_hash()) == (by_a[2][0].workload_hash, by_a[2][0].config_hash)
    assert by_a[1][0].fingerprint_hash and by_a[1][0].fingerprint.get("cpu_count")

    assert main(["trials", "list", "--campaign", "j", *store]) == 0
    listed = capsys.readouterr().out
    assert listed.count("job.py") == 4 and "job a=2 -> loss 0.71" in listed and "failed:timeout" in listed
    assert main(["trials", "show", str(by_a[1][0].id), *store]) == 0
    shown = capsys.readouterr().out
    assert "job.py" in shown and '"command"' in shown and '"values"' in shown and "a run of a user's job" in shown
    # one interval, one meaning: trials show gives a=2 the interval its campaign line gave it
    import re

    line = next(ln for ln in err.splitlines() if ": a=2 -> " in ln)
    interval = re.search(r"qps 200 (\[[^\]]+\])", line).group(1)
    assert main(["trials", "show", str(by_a[2][0].id), *store]) == 0
    shown = capsys.readouterr().out
    assert f"qps 200, 95% interval of a fresh run {interval} (1 run; " in shown, (interval, shown)


def test_a_job_row_in_the_pending_file_is_checked_like_any_other():
    from cubic.core.result import Result
    from cubic.core.store import TrialStore

    store = TrialStore("sqlite:///:memory:")
    job = JobConfig(command="python train.py --lr {lr}", values={"lr": 0.1})
    row = store._row("train.py", job.job_hash(), job, Result(status="ok", metrics={"loss": 0.4}), None, 1,
                     None, None, "fp")
    line = json.dumps({"store": "s", "row": row}, default=str)
    assert check_pending_line(line)[1]["config"]["values"] == {"lr": 0.1}
    assert job.job_hash() == JobConfig(command=job.command, values={"lr": 0.2}).job_hash() != job.content_hash()
    bad = json.dumps({"store": "s", "row": {**row, "workload_hash": "0" * 16}}, default=str)
    try:
        check_pending_line(bad)
    except ValueError as e:
        assert "workload_hash" in str(e)
    else:
        raise AssertionError("a job row with another command line's hash was accepted")
