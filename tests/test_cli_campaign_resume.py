"""A campaign's baseline across stops: a baseline that could not run leaves the name free, a campaign
interrupted before its baseline finished measures it on `campaign resume`, and resume ends as run does
(the answer printed with --report, exit 1 when no run succeeded)."""

import sys
from pathlib import Path

import optuna

from cubic.cli.app import main

JOB = Path(__file__).resolve().parent.parent / "experiments" / "_noisy_job.py"
SPACE = """
version: 1
name: noisy
objectives: [{metric: qps, direction: maximize}]
parameters:
  - {name: a, type: categorical, choices: [1, 2, 3, 4, 5, 6]}
"""


def _run(tmp_path, objective: str, *extra: str) -> int:
    (tmp_path / "space.yaml").write_text(SPACE)
    return main(["campaign", "run", "--objective", objective, "--space", "space.yaml", "--name", "j",
                 "--strategy", "random", "--budget", "3", "--batch", "3", "--confirm-repeats", "2",
                 "--storage", f"sqlite:///{tmp_path}/c.db", "--timeout", "60", *extra])


def test_a_campaign_whose_baseline_could_not_run_leaves_its_name_free(tmp_path, monkeypatch, capsys):
    """Stop 65 noticed: "fix the job and run again" then said "a campaign of this name exists"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("import sys\nsys.exit('broken job')\n")
    assert _run(tmp_path, f"{sys.executable} job.py --a {{a}}") == 1
    assert "the baseline failed" in capsys.readouterr().err
    names = [s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{tmp_path}/c.db")]
    assert "j" not in names
    assert _run(tmp_path, f"{sys.executable} {JOB} --a {{a}} --noise 0.03") == 0, capsys.readouterr().err
    study = optuna.load_study(study_name="j", storage=f"sqlite:///{tmp_path}/c.db")
    assert study.user_attrs["cubic_baseline"]["ok"]


def test_a_campaign_interrupted_in_its_baseline_measures_it_on_resume(tmp_path, monkeypatch, capsys):
    """Stop 65 noticed: a campaign interrupted while its baseline ran resumed without one: no noise
    floor, and its speedup was "not confirmed: no confirm step compared the winner with the baseline"."""
    import cubic.cli.campaign as campaign_cli

    monkeypatch.chdir(tmp_path)

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    real = campaign_cli.measure_baseline
    monkeypatch.setattr(campaign_cli, "measure_baseline", interrupted)
    assert _run(tmp_path, f"{sys.executable} {JOB} --a {{a}} --noise 0.03") == 130
    capsys.readouterr()
    monkeypatch.setattr(campaign_cli, "measure_baseline", real)
    storage = f"sqlite:///{tmp_path}/c.db"
    assert "cubic_baseline" not in optuna.load_study(study_name="j", storage=storage).user_attrs
    assert main(["campaign", "resume", "j", "--storage", storage, "--report", "rep"]) == 0
    out = capsys.readouterr()
    assert any(line.startswith("baseline (the space's default point") for line in out.err.splitlines())
    assert "measured the job's noise floor" in out.err
    c = optuna.load_study(study_name="j", storage=storage).user_attrs["confirm"]
    assert c["speedup"] is not None and c["speedup"]["paired"]
    # resume prints the answer as run does (it wrote answer.md and printed only the report's path)
    assert (tmp_path / "rep" / "answer.md").read_text() in out.out


def test_a_resumed_campaign_where_no_run_succeeded_exits_1(tmp_path, monkeypatch, capsys):
    """As `campaign run` does (resume exited 0): a script must see that there is nothing to act on."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("import sys\nsys.exit('no metric')\n")
    assert _run(tmp_path, f"{sys.executable} job.py --a {{a}}", "--no-baseline", "--budget", "1") == 1
    capsys.readouterr()
    rc = main(["campaign", "resume", "j", "--storage", f"sqlite:///{tmp_path}/c.db", "--budget", "2"])
    assert rc == 1 and "no run of campaign 'j' succeeded" in capsys.readouterr().err


def test_a_workload_campaign_keeps_its_config_baseline_for_resume(tmp_path, monkeypatch, capsys):
    """The workload campaign's baseline is a Config (the simulator's default here): resume rebuilds it."""
    import cubic.cli.campaign as campaign_cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text("version: 1\nname: s\nobjectives: [{metric: examples_per_s}]\nparameters:\n"
                                         "  - {name: batch_size, type: categorical, choices: [256, 1024, 4096]}\n")
    storage = f"sqlite:///{tmp_path}/c.db"

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    real = campaign_cli.measure_baseline
    monkeypatch.setattr(campaign_cli, "measure_baseline", interrupted)
    assert main(["campaign", "run", "--workload", "dlrm-small", "--space", "space.yaml", "--simulate", "h100x8",
                 "--name", "s", "--strategy", "random", "--budget", "2", "--storage", storage]) == 130
    monkeypatch.setattr(campaign_cli, "measure_baseline", real)
    capsys.readouterr()
    assert main(["campaign", "resume", "s", "--storage", storage]) == 0
    doc = optuna.load_study(study_name="s", storage=storage).user_attrs["cubic_baseline"]
    assert doc["ok"] and doc["config"] and "simulator default config" in doc["label"]
