"""A user's own job as the objective: cubic.runners.command and `cubic campaign run --objective`."""

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
import yaml

from cubic.cli.app import main
from cubic.core.spec import SpecError
from cubic.runners.command import CommandRunner, classify_exit, last_metrics

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tune_own_job"

# a job that does what its --mode says (no torch: these tests are about the runner, not training)
JOB = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    args = sys.argv[1:]
    mode = args[args.index("--mode") + 1]
    if mode == "argv":
        print(json.dumps({"n": len(args), "score": 1.0}))
    elif mode == "lines":
        print('{"score": 1.0, "ne": 0.9}'); print("log line {not json"); print('{"score": 2.5, "ne": 0.8}')
        print('{"other": 7}')
    elif mode == "file":
        json.dump({"score": 3.0}, open(args[args.index("--out") + 1], "w")); print('{"score": 1.0}')
    elif mode == "fail":
        print("Traceback ...", file=sys.stderr); print("ValueError: bad lr", file=sys.stderr); sys.exit(1)
    elif mode == "cuda-oom":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB", file=sys.stderr); sys.exit(1)
    elif mode == "exit137":
        sys.exit(137)
    elif mode == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    elif mode == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open(args[args.index("--out") + 1], "w").write(str(child.pid)); time.sleep(60)
    elif mode == "nometric":
        print('{"loss": 0.3}')
    elif mode == "nan":
        print('{"score": NaN}')
""")


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return f"python {path}"


def run(job, mode, extra="", **kw):
    r = CommandRunner(f"{job} --mode {{mode}} {extra}".strip(), ["mode"], metric="score", **kw)
    return r({"mode": mode})


def test_values_stay_one_argument_each_and_no_shell_runs_them(job, tmp_path):
    evil = "x; touch pwned $(touch pwned2) --injected"
    r = CommandRunner(f"{job} --mode argv --name {{name}} --pair={{name}}:{{{{lit}}}}", ["name"], metric="score",
                      cwd=tmp_path)
    res = r({"name": evil})
    assert res.ok, res.reason
    assert res.metrics["n"] == 5  # --mode argv --name <value> --pair=<value>:{lit}
    assert r.command({"name": evil})[-3:] == ["--name", evil, f"--pair={evil}:{{lit}}"]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    assert r.command({"name": evil})[0] == sys.executable  # `python` is the interpreter running cubic


def test_metrics_come_from_the_last_json_line_that_has_the_metric(job):
    res = run(job, "lines")
    assert res.ok and res.metrics["score"] == 2.5 and res.metrics["ne"] == 0.8
    assert res.metrics["wall_time_s"] > 0 and res.metrics["peak_rss_bytes"] > 1e6  # measured by the runner
    assert last_metrics('{"score": 1}\n{"score": true}\n', "score") == {"score": 1.0}  # a bool is not a number


def test_a_metrics_file_wins_over_stdout(job):
    res = run(job, "file", "--out {out}")
    assert res.ok and res.metrics["score"] == 3.0


@pytest.mark.parametrize("mode,kind,words", [
    ("fail", "error", "ValueError: bad lr"),
    ("cuda-oom", "oom", "CUDA out of memory"),
    ("exit137", "oom", "137"),
    ("sigterm", "killed", "SIGTERM"),
    ("nometric", "invalid", "'score'"),
    ("nan", "nan", "nan"),
])
def test_failures_map_to_result_kinds(job, mode, kind, words):
    res = run(job, mode)
    assert not res.ok and res.failure_kind == kind and words in res.reason, res.reason


def test_a_timeout_stops_the_whole_process_group(job, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    t0 = time.monotonic()
    r = CommandRunner(f"{job} --mode {{mode}} --out {pid_file}", ["mode"], metric="score", timeout_s=4.0)
    res = r({"mode": "hang"})
    assert res.failure_kind == "timeout" and res.transient and time.monotonic() - t0 < 20
    pid = int(pid_file.read_text())
    for _ in range(50):  # the grandchild the job started goes too
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the job's child outlived the timeout")


def test_classify_exit_reads_launcher_and_shell_codes():
    assert classify_exit(1, "ChildFailedError\n exitcode  : -9 (pid: 12)\n")[0] == "oom"  # torchrun's report
    assert classify_exit(-9, "")[0] == "oom"
    assert classify_exit(139, "")[0] == "killed"  # 128 + SIGSEGV
    assert classify_exit(2, "usage: train.py\n")[0] == "error"


def test_bad_command_lines_are_refused_before_any_run(job, tmp_path):
    with pytest.raises(SpecError, match="unknown placeholder {lrr}"):
        CommandRunner(f"{job} --lr {{lrr}}", ["lr"], metric="score")
    with pytest.raises(SpecError, match="'batch' is not passed"):
        CommandRunner(f"{job} --lr {{lr}}", ["lr", "batch"], metric="score")
    with pytest.raises(SpecError, match="not found on PATH"):
        CommandRunner("no-such-program-xyz --lr {lr}", ["lr"], metric="score")
    with pytest.raises(SpecError, match="--objective"):
        CommandRunner(f"{job} --lr '{{lr}}", ["lr"], metric="score")
    with pytest.raises(SpecError, match="may not be named"):
        CommandRunner(f"{job} --x {{out}}", ["out"], metric="score")


def test_launcher_and_conditional_parameters(job, tmp_path):
    r = CommandRunner(f"{job} --mode argv --opt {{opt}} --mom {{momentum}}", ["opt", "momentum"], metric="score",
                      launcher="env CUBIC_NPROC={nproc}", nproc=3)
    argv = r.command({"opt": "adam"})  # momentum inactive: `--mom {momentum}` goes, flag and all
    assert argv[:2] == [argv[0], "CUBIC_NPROC=3"] and argv[-2:] == ["--opt", "adam"] and "--mom" not in argv
    assert r.command({"opt": "sgd", "momentum": 0.9, "nproc": 2})[1] == "CUBIC_NPROC=2"  # a tuned nproc
    assert r({"opt": "sgd", "momentum": 0.9}).ok
    torchrun = Path(sys.executable).parent / "torchrun"
    if torchrun.exists():
        r = CommandRunner(f"python {tmp_path / 'job.py'} --lr {{lr}}", ["lr"], metric="score",
                          launcher=f"{torchrun} --standalone --nproc-per-node {{nproc}}", nproc=2)
        assert r.command({"lr": 0.1}) == [str(torchrun), "--standalone", "--nproc-per-node", "2",
                                          str(tmp_path / "job.py"), "--lr", "0.1"]  # torchrun runs python itself


@pytest.mark.slow  # the README's example end to end, ~40 s: the campaign CLI's parts have fast tests
def test_cli_tunes_the_example_job_end_to_end(tmp_path, monkeypatch, capsys):
    """The README's example: 3 runs of examples/tune_own_job/train.py and its baseline, a report."""
    monkeypatch.chdir(tmp_path)
    objective = (f"python {EXAMPLE / 'train.py'} --steps 12 --lr {{lr}} --batch-size {{batch_size}} "
                 "--embedding-dim {embedding_dim} --optimizer {optimizer} --metrics-file {out}")
    storage = f"sqlite:///{tmp_path}/c.db"
    rc = main(["campaign", "run", "--objective", objective, "--space", str(EXAMPLE / "space.yaml"),
               "--name", "own", "--budget", "3", "--batch", "3", "--baseline", str(EXAMPLE / "baseline.yaml"),
               "--report", "reports/own", "--storage", storage, "--timeout", "120"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rep = tmp_path / "reports" / "own"
    answer = (rep / "answer.md").read_text()
    assert answer in out and "Baseline: " in answer and "examples_per_s" in answer
    study = optuna.load_study(study_name="own", storage=storage)
    trials = study.get_trials()
    assert len(trials) == 3 and study.metric_names == ["examples_per_s"]
    ok = [t for t in trials if t.user_attrs["ok"]]
    assert ok, [t.user_attrs["reason"] for t in trials]
    assert {"config", "measured/served", "NE", "peak memory GiB"} <= set(ok[0].user_attrs)
    base = study.user_attrs["cubic_baseline"]
    assert base["ok"] and base["point"] == yaml.safe_load((EXAMPLE / "baseline.yaml").read_text())
    assert "faster" in answer or "slower" in answer or "no winner" in answer
    if (rep / "winner.yaml").exists():  # the winner's values are a baseline for the next campaign
        from cubic.codesign.answer import read_baseline_point
        from search.space import load_space

        assert read_baseline_point(str(rep / "winner.yaml"), load_space(EXAMPLE / "space.yaml"))
    # the job's logs are kept per run: the baseline, its 4 repeats for the job's noise floor, the 3
    # runs, the confirm step's repeats and the speedup's pairs at the end (baseline and winner: SPEEDUP_PAIRS)
    from cubic.codesign.confirm import SPEEDUP_PAIRS

    confirm = study.user_attrs.get("confirm") or {}
    spent = confirm.get("repeats_spent", 0)
    planned = confirm["speedup"]["pairs_planned"] if confirm.get("speedup") else 0
    assert planned in (0, SPEEDUP_PAIRS)
    end = 2 * planned
    assert len(list((tmp_path / ".cubic" / "jobs" / "own").iterdir())) == 1 + 4 + 3 + spent + end
    # bad input: a placeholder that is not a parameter, refused before any run
    assert main(["campaign", "run", "--objective", "python x.py --lr {lrr}", "--space", str(EXAMPLE / "space.yaml"),
                 "--name", "bad", "--storage", storage]) == 2
    assert "{lrr}" in capsys.readouterr().err


@pytest.mark.slow  # torchrun starts two gloo workers that import torch: ~10-20 s on a busy machine
def test_the_example_runs_under_torchrun(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this interpreter")
    r = CommandRunner(f"python {EXAMPLE / 'train.py'} --steps 8 --lr {{lr}}", ["lr"], metric="examples_per_s",
                      launcher=f"{torchrun} --standalone --nproc-per-node {{nproc}}", nproc=2, timeout_s=300)
    res = r({"lr": 0.01})
    assert res.ok, res.reason
    assert res.metrics["examples_per_s"] > 0 and res.metrics["ne"] > 0


def test_metric_and_direction_flags_set_the_primary_objective():
    from cubic.cli.campaign_job import with_objective
    from search.space import Space

    space = Space.model_validate({"parameters": [{"name": "x", "type": "float", "low": 0, "high": 1}],
                                  "objectives": [{"metric": "qps"}, {"metric": "ne", "direction": "minimize"}]})
    assert with_objective(space, None, None) is space
    s = with_objective(space, "ne", None)
    assert [(o.metric, o.direction) for o in s.objectives] == [("ne", "minimize")]  # replaces the primary
    s = with_objective(space, None, "minimize")
    assert (s.primary.metric, s.primary.direction) == ("qps", "minimize")
    assert with_objective(space, "loss", "minimize").primary.metric == "loss"


def test_a_misspelled_script_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    """issue 22 point 4: `python mytrian.py --lr {lr}` fails pre-flight naming the file, not every run."""
    with pytest.raises(SpecError, match="'mytrian.py': no such script"):
        CommandRunner("python mytrian.py --lr {lr}", ["lr"], metric="score", cwd=tmp_path)
    with pytest.raises(SpecError, match="no such script"):
        CommandRunner("bash -x run.sh {lr}", ["lr"], metric="score", cwd=tmp_path)
    (tmp_path / "train.py").write_text("print(1)\n")
    CommandRunner("python -u train.py --lr {lr}", ["lr"], metric="score", cwd=tmp_path)
    CommandRunner("python -c 'import sys' {lr}", ["lr"], metric="score", cwd=tmp_path)
    CommandRunner("python {lr}", ["lr"], metric="score", cwd=tmp_path)  # the script is a knob: unchecked
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path}/c.db"
    assert main(["campaign", "run", "--objective", "python mytrian.py --lr {lr} --batch-size {batch_size} "
                 "--embedding-dim {embedding_dim} --optimizer {optimizer}", "--space", str(EXAMPLE / "space.yaml"),
                 "--name", "typo", "--storage", storage]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mytrian.py" in err and "--objective" in err
    assert not (tmp_path / ".cubic" / "jobs" / "typo").exists()  # nothing ran


def test_a_crashing_baseline_stops_the_campaign(tmp_path, monkeypatch, capsys):
    """issue 22 point 4: a baseline that fails deterministically stops with one line and exit 1."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text("import sys\nsys.exit('broken job')\n")
    rc = main(["campaign", "run", "--objective", "python bad.py --lr {lr} --batch-size {batch_size} "
               "--embedding-dim {embedding_dim} --optimizer {optimizer}", "--space", str(EXAMPLE / "space.yaml"),
               "--name", "crash", "--budget", "3", "--baseline", str(EXAMPLE / "baseline.yaml"),
               "--storage", f"sqlite:///{tmp_path}/c.db", "--timeout", "60"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "the baseline failed" in err and "broken job" in err
    assert len(list((tmp_path / ".cubic" / "jobs" / "crash").iterdir())) == 1  # only the baseline ran


def test_a_timeout_is_retried_at_most_once():
    """issue 22 point 4: a value that timed out twice is left to the search as likely infeasible."""
    from cubic.codesign.campaign import _retry_again
    from cubic.core.result import Result

    hung, killed = Result.failed("timeout", "ran past 60 s"), Result.failed("killed", "SIGKILL")
    assert _retry_again(hung, 1, 3) and not _retry_again(hung, 2, 3)
    assert _retry_again(killed, 2, 3) and not _retry_again(killed, 4, 3)
    assert not _retry_again(Result.failed("error", "crash"), 1, 3)


def test_a_campaign_with_no_successful_run_exits_non_zero(tmp_path, monkeypatch, capsys):
    """issue 22 point 4: every run failing (the baseline alone works) is exit 1, not 0."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text("import json, sys\nif sys.argv[2] != '0.0173': sys.exit('broken job')\n"
                                     "print(json.dumps({'examples_per_s': 1.0}))\n")
    rc = main(["campaign", "run", "--objective", "python bad.py --lr {lr} --batch-size {batch_size} "
               "--embedding-dim {embedding_dim} --optimizer {optimizer}", "--space", str(EXAMPLE / "space.yaml"),
               "--name", "none", "--budget", "2", "--batch", "2", "--storage", f"sqlite:///{tmp_path}/c.db"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "no run of campaign 'none' succeeded" in err


def test_job_logs_are_capped_keeping_head_and_tail(tmp_path):
    """issue 27: 1 GiB of output must not keep 1 GiB per run; the head and the metrics line survive."""
    from cubic.runners.command import cap_log

    log = tmp_path / "stdout"
    log.write_bytes(b"START\n" + b"x" * 10_000 + b'\n{"score": 1.5}\n')
    assert cap_log(log, cap=1000)
    text = log.read_text()
    assert text.startswith("START") and text.endswith('{"score": 1.5}\n') and "log capped at 1000 bytes" in text
    assert len(text) < 1200
    assert not cap_log(log, cap=10_000)  # under the cap: left alone
    (tmp_path / "loud.py").write_text("import json, sys\nsys.stdout.write('y' * (5 << 20))\n"
                                      "print(); print(json.dumps({'score': float(sys.argv[1])}))\n")
    r = CommandRunner("python loud.py {lr}", ["lr"], metric="score", cwd=tmp_path, logs_dir=tmp_path / "logs")
    res = r({"lr": 0.5})
    assert res.ok and res.metrics["score"] == 0.5
    kept = [p for p in (tmp_path / "logs").rglob("stdout")]
    assert kept and all(p.stat().st_size < (4 << 20) + 500 for p in kept)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="Linux /proc")
def test_a_child_that_left_the_session_ends_with_the_run(tmp_path):
    """issue 27: a job's child that calls setsid (own session and group) must not outlive the run."""
    import os
    import time

    pidfile = tmp_path / "child.pid"
    (tmp_path / "job.py").write_text(
        "import json, subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "print(json.dumps({'score': float(sys.argv[1])}))\n")
    res = CommandRunner("python job.py {lr}", ["lr"], metric="score", cwd=tmp_path)({"lr": 1.0})
    assert res.ok
    pid = int(pidfile.read_text())
    for _ in range(50):  # SIGKILLed; gone once its (new) parent reaps it
        try:
            st = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            break
        if st == "Z":
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        raise AssertionError("the setsid child outlived the run")


def test_a_stray_brace_and_an_unused_nproc_are_refused_as_typed(job):
    # stop 59's probe: `--lr {lr` was reported as "{lr} is not passed to the job", and --nproc 3 without
    # a {nproc} to fill ran one process per run without a word
    with pytest.raises(SpecError, match="unclosed") as e:
        CommandRunner(f"{job} --lr {{lr", ["lr"], metric="score")
    assert e.value.field == "--objective" and "'{lr'" in e.value.message
    with pytest.raises(SpecError, match="lone") as e:
        CommandRunner(f"{job} --lr {{lr}}", ["lr"], metric="score", launcher="env X=}", nproc=1)
    assert e.value.field == "--launcher"
    assert CommandRunner(f"{job} --lr {{lr}} --j {{{{a}}}}", ["lr"], metric="score").command({"lr": 1})[-1] == "{a}"
    with pytest.raises(SpecError, match="neither --launcher nor --objective has {nproc}") as e:
        CommandRunner(f"{job} --lr {{lr}}", ["lr"], metric="score", nproc=3)
    assert e.value.field == "--nproc"
    assert CommandRunner(f"{job} --lr {{lr}} --n {{nproc}}", ["lr"], metric="score", nproc=3).command({"lr": 1})[-1] == "3"
