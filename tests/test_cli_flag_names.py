"""A refused value is named as the flag the user typed, and a command that only reads a database
changes nothing in it (stop 59's probe): ``sim scale --gpus 99999999999`` and ``sim calibrate
--batches 99999999999`` printed pydantic's multi-part dump ("1 validation error for Topology ...
For further information visit ..."); ``shard plan --memory-gb -1`` named ``topology:
memory_per_rank_gb``; ``sim predict --simulate h100x99999999999`` named ``world_size``; ``sim
calibrate --factors nope`` named ``factors``, after the CPU had been measured; a campaign storage
error named ``storage``; and ``campaign dashboard|resume|work --storage`` at a trial store wrote
Optuna's twelve tables into it and left a ``.lock`` file beside it."""

import sqlite3

import pytest

from cubic.cli import app as cli

pytestmark = pytest.mark.usefixtures("isolated")  # tests/conftest.py: a fresh directory and store


def _one_line(err: str, *needles: str) -> None:
    line = err.strip()
    assert "\n" not in line and line.startswith("cubic: error:"), line
    assert "validation error" not in line and "pydantic.dev" not in line, line
    for n in needles:
        assert n in line, (n, line)


@pytest.mark.parametrize("argv, flag", [
    (["sim", "scale", "--gpus", "8,99999999999"], "--gpus"),
    (["sim", "scale", "--gpus", "8", "--group-sizes", "2000000"], "--group-sizes"),
    (["sim", "calibrate", "--cluster", "cpu", "--batches", "99999999999"], "--batches"),
    (["sim", "predict", "--simulate", "h100x99999999999"], "--simulate"),
    (["shard", "plan", "--tables", "dlrm-small", "--world-size", "4", "--memory-gb", "-1"], "--memory-gb"),
    (["shard", "plan", "--tables", "dlrm-small", "--world-size", "4", "--memory-gb", "1e30"], "--memory-gb"),
    (["shard", "plan", "--tables", "dlrm-small", "--world-size", "4", "--memory-gib", "999999"], "--memory-gib"),
])
def test_a_value_past_its_field_bound_is_named_as_the_flag(capsys, argv, flag):
    assert cli.main(argv) == 2
    _one_line(capsys.readouterr().err, flag)


def test_memory_gib_accepts_its_largest_value():
    from cubic.cli.common import positive_float_at_most
    from cubic.core.spec import MAX_MEMORY_GB, Topology
    from cubic.core.units import GB, GIB

    parse = positive_float_at_most(MAX_MEMORY_GB * GB / GIB)
    top = parse("931322")  # the message's bound (931,322.57) is one a user can type and have accepted
    assert Topology(world_size=1, memory_per_rank_gb=top * GIB / GB).memory_per_rank_gb <= MAX_MEMORY_GB


def test_an_unknown_calibration_factor_is_refused_before_anything_is_measured(capsys, monkeypatch):
    import cubic.runners.calibration as cal

    def measured(*_a, **_k):
        raise AssertionError("the CPU was measured before --factors was read")

    monkeypatch.setattr(cal, "measure_cpu_device", measured)
    assert cli.main(["sim", "calibrate", "--cluster", "cpu", "--factors", "gemm_eff,nope"]) == 2
    _one_line(capsys.readouterr().err, "--factors:", "unknown factor nope")


def test_a_validation_error_reaching_the_cli_is_one_line_naming_its_field():
    from pydantic import ValidationError

    from cubic.core.spec import Topology

    with pytest.raises(ValidationError) as e:
        Topology(world_size=0)
    line = cli._one_line(e.value)
    assert line.startswith("world_size:") and "\n" not in line and "pydantic.dev" not in line, line


def _tables(path):
    with sqlite3.connect(path) as conn:
        return sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'"))


@pytest.mark.parametrize("verb", [["dashboard", "c1", "--port", "0"], ["resume", "c1"], ["work", "c1"],
                                  ["report", "c1", "--out", "r"]])
def test_reading_campaigns_from_a_trial_store_changes_nothing_in_it(tmp_path, capsys, verb):
    from cubic.core.store import TrialStore

    TrialStore(f"sqlite:///{tmp_path / 's.db'}")  # a trial store: cubic_* tables, no Optuna ones
    before = _tables(tmp_path / "s.db")
    assert cli.main(["campaign", *verb, "--storage", "sqlite:///s.db"]) == 2
    _one_line(capsys.readouterr().err, "--storage:", "no campaign storage in sqlite:///s.db")
    assert _tables(tmp_path / "s.db") == before
    assert not (tmp_path / "s.db.lock").exists() and not (tmp_path / "r").exists()
    assert cli.main(["campaign", "list", "--storage", "sqlite:///s.db"]) == 0
    assert "no campaigns stored yet" in capsys.readouterr().out
    assert _tables(tmp_path / "s.db") == before


def test_a_campaign_storage_in_use_is_still_read(tmp_path, capsys):
    assert cli.main(["campaign", "run", "--workload", "dlrm-small", "--name", "c1", "--simulate", "h100x8",
                     "--budget", "2", "--batch", "1", "--storage", "sqlite:///c.db"]) == 0
    capsys.readouterr()
    assert cli.main(["campaign", "list", "--storage", "sqlite:///c.db"]) == 0
    assert "c1" in capsys.readouterr().out
    assert cli.main(["campaign", "report", "c1", "--storage", "sqlite:///c.db", "--out", "r"]) == 0
    assert (tmp_path / "r" / "index.html").is_file()


@pytest.mark.parametrize("metric, needle", [("", "cannot be empty"), ("nope", "cannot apply to a simulated runner")])
def test_a_metric_the_runs_cannot_report_is_named_as_the_flag(capsys, metric, needle):
    # an empty --metric fell back to the space's objective; an unknown one was blamed on the space file
    assert cli.main(["campaign", "run", "--workload", "dlrm-small", "--simulate", "h100x8", "--name", "m",
                     "--budget", "1", "--storage", "sqlite:///c.db", "--metric", metric]) == 2
    _one_line(capsys.readouterr().err, "--metric", needle)


def test_a_trial_id_past_the_database_key_and_an_unknown_campaign_are_named(capsys, isolated):
    # `trials show 99999999999999999999` was an OverflowError traceback (exit 1); --campaign named `campaign`
    from cubic.core.store import TrialStore

    TrialStore(isolated)
    assert cli.main(["trials", "show", "99999999999999999999"]) == 2
    _one_line(capsys.readouterr().err, "argument ID", "must be <=")
    for value in ("99999999999999999999", "nope"):
        assert cli.main(["trials", "list", "--campaign", value]) == 2
        _one_line(capsys.readouterr().err, "--campaign:", f"no campaign '{value}'")


def test_workers_past_a_process_s_threads_are_refused(capsys):
    # 100000 workers on a budget of 1 ran for minutes starting threads (a timeout ended it)
    assert cli.main(["campaign", "run", "--workload", "dlrm-small", "--simulate", "h100x8", "--name", "w",
                     "--budget", "1", "--storage", "sqlite:///c.db", "--workers", "100000"]) == 2
    _one_line(capsys.readouterr().err, "--workers", "must be <= 1,024")


def test_a_drain_starts_no_more_threads_than_points_waiting(monkeypatch):
    import cubic.codesign.campaign as campaign_mod
    from cubic.codesign.campaign import Campaign
    from cubic.testing import space

    started, real = [], campaign_mod.ThreadPoolExecutor

    def pool(max_workers):
        started.append(max_workers)
        return real(max_workers=max_workers)

    monkeypatch.setattr(campaign_mod, "ThreadPoolExecutor", pool)
    c = Campaign(space(), lambda p: {"examples_per_s": float(p["batch_size"]), "peak_mem_bytes": 1e9},
                 strategy="random", budget=3, batch_size=3, workers=1000, seed=0)
    s = c.run()
    assert s.runs == 3 and s.best_point is not None
    assert started and max(started) <= 3, started  # was 1000 threads for 3 points


@pytest.mark.parametrize("argv, flag", [
    # `cubic run --world-size 2000000` recorded a failed trial; --threads 5000 and --steps 99999999999 ran
    (["run", "--workload", "dlrm-small", "--world-size", "2000000"], "--world-size"),
    (["run", "--workload", "dlrm-small", "--threads", "5000"], "--threads"),
    (["run", "--workload", "dlrm-small", "--steps", "99999999999"], "--steps"),
    (["run", "--workload", "dlrm-small", "--repeats", "5000"], "--repeats"),
    # the campaign's flags were refused by its run spec, named as its fields (`repeats: Input should be ...`)
    (["campaign", "run", "--workload", "dlrm-small", "--name", "z", "--repeats", "5000"], "--repeats"),
    (["campaign", "run", "--workload", "dlrm-small", "--name", "z", "--threads", "5000"], "--threads"),
    (["campaign", "run", "--workload", "dlrm-small", "--name", "z", "--confirm-repeats", "20000"], "--confirm-repeats"),
    (["campaign", "run", "--workload", "dlrm-small", "--name", "z", "--steps", "99999999999"], "--steps"),
    # fp8's counts ran until interrupted; --target named the device, not the flag
    (["fp8", "probe", "--workload", "dlrm-small", "--budget-sqnr", "20", "--warmup-steps", "99999999999"], "--warmup-steps"),
    (["fp8", "check", "--workload", "dlrm-small", "--all", "--steps", "99999999999"], "--steps"),
    (["fp8", "probe", "--workload", "dlrm-small", "--budget-sqnr", "20", "--target", "nope"], "--target"),
])
def test_a_run_count_past_its_bound_is_refused_at_the_flag_and_records_nothing(capsys, isolated, argv, flag):
    from pathlib import Path

    assert cli.main(argv) == 2
    _one_line(capsys.readouterr().err, flag)
    assert not Path(isolated.removeprefix("sqlite:///")).exists()  # the store (CUBIC_STORE) was not even made


def test_the_flags_and_the_run_spec_share_one_bound():
    from cubic.core.runspec import RunSpec
    from cubic.core.spec import MAX_REPEATS, MAX_STEPS, MAX_THREADS

    RunSpec(steps=MAX_STEPS, warmup=MAX_STEPS, repeats=MAX_REPEATS, threads=MAX_THREADS)  # the flags' largest values
    for field, value in (("steps", MAX_STEPS + 1), ("repeats", MAX_REPEATS + 1), ("threads", MAX_THREADS + 1)):
        with pytest.raises(ValueError):
            RunSpec(**{field: value})


@pytest.mark.parametrize("var, value", [("CUBIC_DB_CONNECT_TIMEOUT_S", "abc"), ("CUBIC_DB_CONNECT_TIMEOUT_S", "-5"),
                                        ("CUBIC_DB_STATEMENT_TIMEOUT_S", "nan")])
def test_a_database_timeout_from_the_environment_is_named_as_the_variable(tmp_path, var, value):
    # 'abc' was a ValueError traceback at import, before any command; -5 and nan were taken as timeouts
    import os
    import subprocess
    import sys
    from pathlib import Path

    from cubic.core.store import TrialStore

    TrialStore(f"sqlite:///{tmp_path / 't.db'}")  # a store to open (a missing one is said before any engine)
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, var: value, "PYTHONPATH": str(repo)}
    env.pop("CUBIC_STORE", None)
    proc = subprocess.run([sys.executable, "-c", "import sys; from cubic.cli.app import main; sys.exit(main())",
                           "trials", "list", "--store", f"sqlite:///{tmp_path / 't.db'}"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-500:]
    _one_line(proc.stderr, f"{var}:", repr(value))


def test_the_campaign_storage_from_the_environment_is_named_so_and_leaves_no_trial_store(tmp_path, capsys,
                                                                                          monkeypatch):
    monkeypatch.setenv("CUBIC_CAMPAIGNS", "nonsense")
    assert cli.main(["campaign", "list"]) == 2
    _one_line(capsys.readouterr().err, "CUBIC_CAMPAIGNS:", "not a database URL")
    assert cli.main(["campaign", "run", "--workload", "dlrm-small", "--simulate", "h100x8", "--name", "c",
                     "--budget", "1"]) == 2
    _one_line(capsys.readouterr().err, "CUBIC_CAMPAIGNS:")
    monkeypatch.delenv("CUBIC_CAMPAIGNS")
    assert cli.main(["campaign", "run", "--workload", "dlrm-small", "--simulate", "h100x8", "--name", "c",
                     "--budget", "1", "--storage", "nonsense"]) == 2
    _one_line(capsys.readouterr().err, "--storage:")
    assert not (tmp_path / "trials.db").exists() and not (tmp_path / ".cubic").exists()  # was an empty store


def test_a_default_output_folder_that_cannot_be_made_is_named_before_the_work(tmp_path, capsys, monkeypatch):
    import cost_models.comm as comm

    def measured(*_a, **_k):
        raise AssertionError("the all-to-alls were measured before the output was checked")

    monkeypatch.setattr(comm, "calibrate", measured)
    (tmp_path / "f").write_text("a file where a folder should be")
    monkeypatch.setenv("CUBIC_HOME", str(tmp_path / "f"))
    assert cli.main(["shard", "calibrate-comm", "--repeats", "1"]) == 2
    _one_line(capsys.readouterr().err, "CUBIC_HOME:", "is a file", "give --out FILE")
    assert cli.main(["shard", "train"]) == 2
    _one_line(capsys.readouterr().err, "CUBIC_HOME:")


@pytest.mark.parametrize("host, port, needle", [("999.1.1.1", "0", "--host: cannot resolve"),
                                                ("8.8.8.8", "0", "--host: cannot serve on 8.8.8.8"),
                                                ("", "0", "argument --host: not an address"),
                                                ("127.0.0.1", "BUSY", "--port: cannot serve on")])
def test_the_dashboard_names_an_address_it_cannot_serve_on(capsys, host, port, needle):
    # each was OSError's text alone ("Name or service not known"); an empty host served every interface
    import socket

    import optuna

    pytest.importorskip("optuna_dashboard")
    from cubic.codesign.storage import META_KEY

    study = optuna.create_study(study_name="d", storage="sqlite:///c.db")
    study.set_user_attr(META_KEY, {"version": 1, "name": "d"})
    capsys.readouterr()  # Optuna's line about the study it made
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1]) if port == "BUSY" else port
        assert cli.main(["campaign", "dashboard", "d", "--storage", "sqlite:///c.db", "--host", host,
                         "--port", port]) == 2
    _one_line(capsys.readouterr().err, needle)


def test_the_dashboard_line_never_prints_the_storage_password(capsys, monkeypatch):
    import optuna

    pytest.importorskip("optuna_dashboard")
    import optuna_dashboard

    import cubic.codesign.storage as storage_mod
    from cubic.cli import dashboard

    class Server:  # serves nothing: the line is what is tested
        server_port = 1

        def serve_forever(self):
            pass

        def shutdown(self):
            pass

        def server_close(self):
            pass

    monkeypatch.setattr(storage_mod, "load_meta", lambda *a: {})
    monkeypatch.setattr(optuna, "load_study", lambda **k: type("S", (), {"_study_id": 1})())
    monkeypatch.setattr(optuna_dashboard, "wsgi", lambda storage: None)
    monkeypatch.setattr(dashboard, "_serve", lambda *a: Server())
    url = "postgresql+psycopg2://u:s3cr3t@db.example/c"
    assert cli.main(["campaign", "dashboard", "d", "--storage", url, "--port", "0"]) == 0
    out = capsys.readouterr().out
    assert "optuna-dashboard for campaign 'd'" in out and "s3cr3t" not in out and "u:***@db.example" in out, out


@pytest.mark.parametrize("argv, needle", [
    # a factory of the wrong signature was a TypeError traceback
    (["--evaluate", "json:loads"], "--evaluate: the factory json:loads(space, store_url) raised TypeError"),
    # a factory returning no callable failed every run of the budget and exited 0
    (["--evaluate", "cubic.testing:stand_in_runner"], "returned a StandInRunner, not evaluate(point)"),
    # plain int/float flags: a negative lease, a batch of 0, an unknown strategy, a budget of 1e11 were taken
    (["--evaluate", "cubic.testing:make_evaluate", "--lease", "-5"], "argument --lease: must be > 0"),
    (["--evaluate", "cubic.testing:make_evaluate", "--batch", "0"], "argument --batch: must be >= 1"),
    (["--evaluate", "cubic.testing:make_evaluate", "--strategy", "nope"], "argument --strategy: invalid choice"),
    (["--evaluate", "cubic.testing:make_evaluate", "--budget", "99999999999"], "argument --budget: must be <="),
])
def test_the_campaign_worker_refuses_a_bad_factory_or_flag_in_one_line(tmp_path, capsys, argv, needle):
    from cubic.codesign import worker

    space = str(__import__("pathlib").Path(cli.__file__).resolve().parent.parent / "data" / "space-sim-default.yaml")
    try:
        code = worker.main(["run", "--storage", "sqlite:///w.db", "--name", "w", "--space", space, "--budget", "1",
                            *argv])
    except SystemExit as e:  # argparse's exit
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and needle in err, err
    assert not (tmp_path / "w.db").exists()  # refused before the campaign storage is made


def test_a_folder_or_a_device_given_as_a_document_is_said_to_be_one(tmp_path, capsys):
    # each was "no such file", which sent the user looking for a typo in a path that exists
    import os

    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "pipe")
    for argv, needle in ((["run", "--workload", "d"], "d: is a folder, not a file"),
                         (["run", "--workload", "dlrm-small", "--config", "/dev/zero"], "/dev/zero: not a regular file"),
                         (["run", "--workload", "pipe"], "pipe: not a regular file"),
                         (["shard", "plan", "--tables", "d", "--world-size", "2"], "d: is a folder"),
                         (["run", "--workload", "nope.yaml"], "nope.yaml: no such file")):
        assert cli.main(argv) == 2, argv
        _one_line(capsys.readouterr().err, needle)


def test_a_sync_interval_with_per_step_gradient_sync_is_refused(capsys):
    # it changed nothing, without a word (a config's sync_interval with sync: gradients is refused at load)
    assert cli.main(["sim", "scale", "--sync-interval", "5", "--emb-sync", "gradients"]) == 2
    _one_line(capsys.readouterr().err, "--sync-interval:", "--emb-sync weights")
    assert cli.main(["sim", "predict", "--workload", "dlrm-small", "--sync-interval", "5", "--json"]) == 0
