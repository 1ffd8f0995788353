"""``cubic campaign run --repeats/--remeasure/--confirm-repeats``: the flags reach the campaign,
every repeat is stored, and the confirm phase's outcome is in the JSON summary."""

import json

from cubic.cli.app import main
from cubic.core.store import TrialStore

SPACE = """
version: 1
name: sim-small
objectives: [{metric: examples_per_s}]
parameters:
  - {name: batch_size, type: categorical, choices: [256, 1024, 4096]}
"""


def test_campaign_repeats_and_confirm_phase(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(SPACE)
    common = ["--storage", f"sqlite:///{tmp_path}/c.db", "--store", f"sqlite:///{tmp_path}/t.db"]
    rc = main(["campaign", "run", "--workload", "dlrm-small", "--space", "space.yaml", "--simulate", "h100x8",
               "--name", "c", "--strategy", "random", "--budget", "3", "--batch", "3", "--repeats", "2",
               "--confirm-repeats", "2", "--no-baseline", "--json", *common])
    assert rc == 0
    (s,) = json.loads(capsys.readouterr().out)
    c = s["confirm"]
    assert c["repeat_budget"] == 2 and c["winner"]["point"] == s["best_point"]
    assert c["separated"] is True  # a simulated run repeats exactly: zero-width intervals, no tie here
    assert s["best_metrics"]["repeats"] == 2
    rows = TrialStore(f"sqlite:///{tmp_path}/t.db").trials(campaign="c")
    assert len(rows) == 3 * 2 + c["repeats_spent"]


def test_a_campaign_whose_store_fails_stops_with_a_store_error(tmp_path, monkeypatch, capsys):
    import sqlite3

    from sqlalchemy.exc import OperationalError

    import cubic.core.store as store_mod

    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(SPACE)
    real = store_mod.insert

    def disk_full(table):
        if table is store_mod.trials_table:
            raise OperationalError("INSERT", {}, sqlite3.OperationalError("database or disk is full"))
        return real(table)

    monkeypatch.setattr(store_mod, "insert", disk_full)
    common = ["--storage", f"sqlite:///{tmp_path}/c.db", "--store", f"sqlite:///{tmp_path}/t.db"]
    rc = main(["campaign", "run", "--workload", "dlrm-small", "--space", "space.yaml", "--simulate", "h100x8",
               "--name", "c", "--strategy", "random", "--budget", "3", "--batch", "3", "--workers", "2", *common])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 3 and err[-1].startswith("cubic: store error:") and "disk is full" in err[-1]
    assert "Traceback" not in "\n".join(err)
    kept = (tmp_path / ".cubic" / "pending.jsonl").read_text().splitlines()
    assert kept  # the finished runs are kept, none became a failed trial
    monkeypatch.setattr(store_mod, "insert", real)
    assert main(["campaign", "resume", "c", "--confirm-repeats", "0", "--json", *common]) == 0
    out = capsys.readouterr()
    assert f"imported {len(kept)} pending result" in out.err
    (s,) = json.loads(out.out)
    assert s["runs"] == 3 and s["served_from_store"] >= 1  # the pending runs serve the resumed campaign


JOB_SPACE = """
version: 1
name: noisy
objectives: [{metric: qps, direction: maximize}]
parameters:
  - {name: a, type: categorical, choices: [1, 2, 3, 4, 5, 6]}
"""


def _job_campaign(tmp_path, capsys, table: str, *extra: str):
    import sys
    from pathlib import Path

    job = Path(__file__).resolve().parent.parent / "experiments" / "noisy_job.py"
    (tmp_path / "space.yaml").write_text(JOB_SPACE)
    rc = main(["campaign", "run", "--objective", f"{sys.executable} {job} --a {{a}} --noise 0.03 --table {table}",
               "--space", "space.yaml", "--name", "j", "--strategy", "random", "--budget", "6", "--batch", "6",
               "--confirm-repeats", "6", "--storage", f"sqlite:///{tmp_path}/c.db", "--report", "rep", *extra])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out, (tmp_path / "rep" / "answer.md").read_text()


def test_an_objective_campaign_is_confirmed_by_the_same_rule(tmp_path, monkeypatch, capsys):
    """--objective winners get confirm repeats (not '(single sample)'); separated only with >= 2
    processes each; the speedup has a between-process interval; progress shows intervals."""
    import optuna

    monkeypatch.chdir(tmp_path)
    out, answer = _job_campaign(tmp_path, capsys, "default")
    c = optuna.load_study(study_name="j", storage=f"sqlite:///{tmp_path}/c.db").user_attrs["confirm"]
    assert c["winner"]["repeats"] >= 2 and c["runner_up"]["repeats"] >= 2 and c["repeats_spent"] >= 1
    assert c["winner"]["point"]["a"] in (4, 5) and "single sample" not in answer
    assert c["verdict"].startswith(("separated after", "tied within the repeat budget"))
    assert c["speedup"]["lo"] < c["speedup"]["ratio"] < c["speedup"]["hi"] and c["speedup"]["baseline_repeats"] >= 2
    assert "Confirm step:" in answer and "95% CI" in answer
    assert "measured the job's noise floor" in out.err  # the baseline repeated before the campaign


def test_when_nothing_beats_the_baseline_the_answer_says_keep_it(tmp_path, monkeypatch, capsys):
    import yaml

    monkeypatch.chdir(tmp_path)
    out, answer = _job_campaign(tmp_path, capsys, "baseline_best")
    assert answer.splitlines()[2].startswith("**Keep the baseline")
    assert yaml.safe_load((tmp_path / "rep" / "winner.yaml").read_text()) == {"a": 1}
    assert "--a 1 " in answer  # the baseline's command line
