"""A campaign's baseline across stops: a baseline that could not run leaves the name free, a campaign
interrupted before its baseline finished measures it on `campaign resume`, and resume ends as run does
(the answer printed with --report, exit 1 when no run succeeded)."""

import json
import sys

import optuna
import pytest

from cubic.cli.app import main
from experiments import _noisy_job as noisy_job



def _run(tmp_path, objective: str, *extra: str) -> int:
    (tmp_path / "space.yaml").write_text(noisy_job.SPACE)
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
    assert _run(tmp_path, noisy_job.command(noise=0.03)) == 0, capsys.readouterr().err
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
    assert _run(tmp_path, noisy_job.command(noise=0.03)) == 130
    capsys.readouterr()
    monkeypatch.setattr(campaign_cli, "measure_baseline", real)
    storage = f"sqlite:///{tmp_path}/c.db"
    assert "cubic_baseline" not in optuna.load_study(study_name="j", storage=storage).user_attrs
    assert main(["campaign", "list", "--storage", storage, "--json"]) == 0  # not "created": it was stopped
    (row,) = json.loads(capsys.readouterr().out)
    assert row["status"] == "interrupted" and row["runs"] == 0
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


def test_a_resumed_job_campaign_keeps_the_runs_made_before_it(tmp_path, monkeypatch, capsys):
    """An audit (stop 66): a job's repeats lived only in the process, so a resumed campaign's confirm step
    saw none of the runs made before the stop: it confirmed a runner-up and left the best run out."""
    monkeypatch.chdir(tmp_path)
    job = noisy_job.command("clear", 0.03)
    assert _run(tmp_path, job, "--budget", "6", "--batch", "6", "--confirm-repeats", "0") == 0
    capsys.readouterr()
    storage = f"sqlite:///{tmp_path}/c.db"
    # a budget below the runs made would rewrite the record: refused, naming the flag, nothing changed
    assert main(["campaign", "resume", "j", "--storage", storage, "--budget", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--budget" in err and "6 runs" in err
    assert optuna.load_study(study_name="j", storage=storage).user_attrs["cubic_campaign"]["budget"] == 6
    assert main(["campaign", "resume", "j", "--storage", storage, "--confirm-repeats", "2", "--json"]) == 0
    out = capsys.readouterr()
    assert "measured the job's noise floor: its baseline run" in out.err  # from the stored runs: none new
    c = optuna.load_study(study_name="j", storage=storage).user_attrs["confirm"]
    assert c["winner"]["point"] == {"a": 4} and c["winner"]["repeats"] >= 2  # its run before the stop counts
    assert c["speedup"]["paired"] and c["speedup"]["baseline_repeats"] >= 5
    optuna.load_study(study_name="j", storage=storage).enqueue_trial({"a": 2})  # queued: not a run
    assert main(["campaign", "list", "--storage", storage, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["runs"] == 6


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_an_unconfirmed_speedup_says_so_in_the_headline(tmp_path, monkeypatch, capsys):
    """An audit (stop 66): a campaign stopped before its confirm step, reported, read "The winner is 1.76x
    faster than the baseline (95% CI 1.29-2.41x)" with "not confirmed" only in a footnote; --no-baseline
    still claimed a speedup over the space's default point, which README says it does not."""
    monkeypatch.chdir(tmp_path)
    job = noisy_job.command("clear", 0.03)
    assert _run(tmp_path, job, "--budget", "6", "--batch", "6", "--confirm-repeats", "0") == 0
    storage = f"sqlite:///{tmp_path}/c.db"
    optuna.load_study(study_name="j", storage=storage).set_user_attr("confirm", None)  # as after a stop
    capsys.readouterr()
    assert main(["campaign", "report", "j", "--storage", storage, "--out", "rep"]) == 0
    head = (tmp_path / "rep" / "answer.md").read_text().splitlines()[2]
    assert "faster than the baseline" in head and "NOT CONFIRMED" in head, head
    (tmp_path / "c.db").unlink()
    assert _run(tmp_path, job, "--budget", "6", "--batch", "6", "--no-baseline", "--report", "nb") == 0
    head = (tmp_path / "nb" / "answer.md").read_text().splitlines()[2]
    assert "no baseline to compare with" in head, head
    assert _run(tmp_path, job, "--no-baseline", "--baseline", "x.yaml", "--name", "k") == 2
    assert "--no-baseline" in capsys.readouterr().err


def test_resume_runs_the_baselines_a_stop_left_unrun_and_they_measure_no_baseline(tmp_path, monkeypatch, capsys):
    """An audit (stop 66): `campaign resume` of a --baselines campaign never ran NAME-random and NAME-tpe
    when the stop came before them, and a resumed sibling measured a baseline, a noise floor and pairs
    that an uninterrupted sibling never does."""
    monkeypatch.chdir(tmp_path)
    job = noisy_job.command("clear", 0.03)
    assert _run(tmp_path, job, "--baselines", "--confirm-repeats", "0") == 0
    storage = f"sqlite:///{tmp_path}/c.db"
    optuna.delete_study(study_name="j-tpe", storage=storage)  # as if the stop came before it started
    capsys.readouterr()
    assert main(["campaign", "resume", "j", "--storage", storage, "--json"]) == 0
    out = capsys.readouterr()
    names = [s["name"] for s in json.loads(out.out)]
    assert names == ["j", "j-tpe"]  # j-random had finished: left as it was
    tpe = optuna.load_study(study_name="j-tpe", storage=storage)
    assert len(tpe.trials) == 3 and "cubic_baseline" not in tpe.user_attrs
    assert main(["campaign", "resume", "j-random", "--storage", storage]) == 0
    assert not any(line.startswith("baseline (") for line in capsys.readouterr().err.splitlines())
    # --replace without --baselines: the old siblings go too (a report plotted them against the new campaign)
    assert _run(tmp_path, job, "--replace", "--no-baseline", "--confirm-repeats", "0") == 0
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    assert names == {"j"}
