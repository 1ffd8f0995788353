"""``cubic run``: repeats pooled from fresh runs, --remeasure, the Result out before any store
write, store failures as store errors with the result kept pending, unstorable configs rejected at
load, interrupts recorded as killed."""

import json

import pytest

from cubic.cli import app as cli
from cubic.cli import common as cli_common
from cubic.core.result import Result, RunInterrupted
from cubic.core.store import TrialStore


pytestmark = pytest.mark.usefixtures("isolated")  # tests/conftest.py: a fresh directory and store


class Noisy:
    """A runner whose throughput is each repeat's next value: a fresh 'process' per run."""

    source = "measured"

    def __init__(self, *values):
        self.values = list(values)
        self.calls = 0

    def fingerprint_hash(self):
        return "fake-fp"

    def run(self, workload, config, *, steps=50, warmup=5, progress=None):
        self.calls += 1
        v = self.values.pop(0) if self.values else 1000.0
        if isinstance(v, Result):
            return v.model_copy(update={"config_hash": config.content_hash()})
        if isinstance(v, BaseException):
            raise v
        return Result(status="ok", metrics={"examples_per_s": v, "step_time_median_ms": 64e3 / v,
                                            "load_avg_1m": 0.0},
                      fingerprint={"cpu_count": 2}, fingerprint_hash="fake-fp", config_hash=config.content_hash(),
                      wall_time_s=1.0)


def use(monkeypatch, runner):
    monkeypatch.setattr(cli_common, "local_runner", lambda timeout_s, device, threads=None: runner)
    return runner


def run(capsys, *argv):
    code = cli.main(["run", "--workload", "dlrm-small", "--steps", "3", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_repeats_are_all_stored_pooled_and_served(capsys, monkeypatch, isolated, tmp_path):
    r = use(monkeypatch, Noisy(63910.0, 102279.0, 99436.0, 98000.0, 101000.0, 97000.0))
    code, out, _ = run(capsys, "--repeats", "3", "--json", "r.json")
    assert code == 0 and r.calls == 3
    assert "(3 repeats" in out and "99,436" in out
    res = Result.model_validate_json((tmp_path / "r.json").read_text())
    assert res.metrics["examples_per_s"] == 99436.0 and res.metrics["repeats"] == 3
    assert res.metrics["examples_per_s_ci_lo"] < 99436.0 < res.metrics["examples_per_s_ci_hi"]
    rows = TrialStore(isolated).trials()
    assert len(rows) == 3 and len({(t.workload_hash, t.config_hash, t.fingerprint_hash) for t in rows}) == 1

    code, out, _ = run(capsys, "--repeats", "3")
    assert code == 0 and r.calls == 3 and "served from the trial store" in out and "99,436" in out
    code, out, _ = run(capsys, "--repeats", "4")  # one more than stored: only the missing one runs
    assert r.calls == 4 and "(4 repeats" in out
    code, out, _ = run(capsys, "--repeats", "2", "--remeasure")  # fresh repeats added to the stored four
    assert r.calls == 6 and "(6 repeats" in out
    assert len(TrialStore(isolated).trials()) == 6


def test_the_result_is_out_before_the_store_write_and_a_store_failure_is_a_store_error(
        capsys, monkeypatch, isolated, tmp_path):
    import sqlite3

    from sqlalchemy.exc import OperationalError

    import cubic.core.store as store_mod

    TrialStore(isolated)  # the store exists and opens; its writes fail (a full disk)
    real = store_mod.insert

    def disk_full(table):
        if table is store_mod.trials_table:
            raise OperationalError("INSERT", {}, sqlite3.OperationalError("database or disk is full"))
        return real(table)

    use(monkeypatch, Noisy(1234.0))
    with monkeypatch.context() as m:
        m.setattr(store_mod, "insert", disk_full)
        code, out, err = run(capsys, "--json", "r.json")
    assert code == 3 and "1,234" in out  # printed, then the store failed
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cubic: store error:") and "disk is full" in lines[0]
    assert "pending.jsonl" in lines[0] and "Traceback" not in err
    assert Result.model_validate_json((tmp_path / "r.json").read_text()).metrics["examples_per_s"] == 1234.0
    assert (tmp_path / ".cubic" / "pending.jsonl").is_file() and TrialStore(isolated).count() == 0

    # the next command with a working store imports it, and says so in one line
    assert cli.main(["trials", "list"]) == 0
    out, err = capsys.readouterr()
    assert err.strip() == f"cubic: imported 1 pending result from {tmp_path / '.cubic' / 'pending.jsonl'} " \
                          "into the trial store"
    (t,) = TrialStore(isolated).trials()
    assert t.metrics["examples_per_s"] == 1234.0 and t.status == "ok" and t.steps == 3
    assert not (tmp_path / ".cubic" / "pending.jsonl").exists()


def test_a_config_the_store_cannot_hold_is_rejected_when_loaded(capsys, monkeypatch, isolated, tmp_path):
    r = use(monkeypatch, Noisy())
    for body, field in (("seed: 9223372036854775808\n", "seed"),
                        ("seed: -1\n", "seed"),
                        ("model: {bottom_mlp: [64, 99999999999999999999]}\n", "model"),
                        ("sharding: {group_size: 9223372036854775808}\n", "sharding.group_size"),
                        ("fp8: {policy: budget, budget_sqnr_db: .nan}\n", "fp8.budget_sqnr_db")):
        (tmp_path / "c.yaml").write_text(body)
        code, _, err = run(capsys, "--config", "c.yaml")
        assert code == 2, body
        line = err.strip()
        assert line.startswith("cubic: error:") and "c.yaml" in line and field in line and "\n" not in line, line
    assert r.calls == 0 and TrialStore(isolated).count() == 0
    (tmp_path / "c.yaml").write_text("seed: 9223372036854775807\n")  # the largest storable seed runs
    assert run(capsys, "--config", "c.yaml")[0] == 0 and TrialStore(isolated).trials()[0].seed == 2**63 - 1


def test_an_interrupted_run_is_recorded_as_killed_and_retried_with_a_higher_attempt(capsys, monkeypatch, isolated):
    killed = Result.failed("killed", "interrupted (SIGINT) in the parent; child killed", fingerprint_hash="fake-fp")
    r = use(monkeypatch, Noisy(RunInterrupted(killed), Result.failed("timeout", "no result within 5 s",
                                                                     fingerprint_hash="fake-fp"), 500.0))
    code, _, err = run(capsys)
    assert code == 130 and err.strip() == "cubic: interrupted"
    code, out, _ = run(capsys)
    assert code == 1 and "timeout" in out
    code, out, _ = run(capsys)
    assert code == 0 and r.calls == 3
    rows = TrialStore(isolated).trials()
    assert [(t.failure_kind, t.attempt) for t in rows] == [("killed", 1), ("timeout", 2), (None, 3)]
    assert run(capsys)[0] == 0 and r.calls == 3  # now served


def test_a_deterministic_failure_is_served_not_run_again(capsys, monkeypatch, isolated):
    oom = Result.failed("oom", "CUDA out of memory")  # no fingerprint: the runner's expected one is used
    r = use(monkeypatch, Noisy(oom))
    assert run(capsys, "--repeats", "3")[0] == 1 and r.calls == 1  # the first repeat failed: no more
    code, out, _ = run(capsys, "--repeats", "3")
    assert code == 1 and r.calls == 1 and "served from the trial store" in out
    assert TrialStore(isolated).trials()[0].fingerprint_hash == "fake-fp"


def test_one_trial_shows_one_interval_in_run_and_trials_show(capsys, monkeypatch, isolated):
    """The same configuration's interval in `cubic run` and `cubic trials show`: one repeat is
    widened by the machine's between-process noise (an ASSUMED floor, labelled, before one is
    measured), never the run's own timing windows alone, never zero width."""
    r = use(monkeypatch, Noisy(Result(status="ok", metrics={
        "examples_per_s": 283545.0, "examples_per_s_ci_lo": 279433.0, "examples_per_s_ci_hi": 285243.0,
        "step_time_median_ms": 0.2, "load_avg_1m": 0.0}, fingerprint={"cpu_count": 2}, fingerprint_hash="fake-fp",
        wall_time_s=1.0)))
    code, out, _ = run(capsys)
    assert code == 0 and r.calls == 1
    line = next(x for x in out.splitlines() if "95% interval of a fresh run" in x)
    assert "(1 repeat + an ASSUMED noise floor (not yet measured on this machine) 6.5%)" in line
    lo, hi = (float(x.replace(",", "")) for x in line.split("[")[1].split("]")[0].split(", "))
    assert lo < 279433 * 0.95 and hi > 285243 * 1.05
    assert "279,433" not in out  # the windows are not shown as an interval
    tid = TrialStore(isolated).trials()[0].id
    assert cli.main(["trials", "show", str(tid)]) == 0
    shown = capsys.readouterr().out
    assert line in shown.splitlines()
