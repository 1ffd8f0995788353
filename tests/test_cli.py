import json
import sys
import types

import pandas as pd
import pytest
import yaml

from cubic.cli import app as cli
from cubic.cli import common as cli_common
from cubic.core.result import Result
from cubic.core.spec import Workload
from cubic.core.store import TrialStore
from cubic.core.workloads import DEFAULT_WORKLOADS


@pytest.fixture(autouse=True)
def isolated_store(tmp_path, monkeypatch):
    """Never touch the user's store: every test gets its own, via the environment."""
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path}/trials.db"
    monkeypatch.setenv("CUBIC_STORE", url)
    return url


class FakeRunner:
    """Stands in for LocalRunner: returns queued results, counts runs, reports progress."""

    source = "measured"

    def __init__(self, *results: Result):
        self.queue = list(results)
        self.calls = 0
        self.progress_seen = []

    def fingerprint_hash(self) -> str:
        return "fake-fp"

    def run(self, workload, config, *, steps=50, warmup=5, progress=None):
        self.calls += 1
        for i in range(1, steps + 1):
            if progress is not None:
                progress(i, steps)
                self.progress_seen.append(i)
        r = self.queue.pop(0) if self.queue else ok_result()
        return r.model_copy(update={"workload": workload.name, "config_hash": config.content_hash(),
                                    "seed": config.seed, "fingerprint_hash": "fake-fp"})


def ok_result(**metrics):
    m = {"examples_per_s": 12345.0, "step_time_median_ms": 41.5, "step_time_p90_ms": 44.0,
         "peak_mem_bytes": 3.5e8, "loss_start": 0.69, "loss_end": 0.52, "ne_start": 1.0, "ne_end": 0.81}
    m.update(metrics)
    return Result(status="ok", metrics=m, phases_ms={"embedding_fwd": 5.0, "dense_fwd": 10.0, "optimizer": 2.0})


def use_runner(monkeypatch, runner):
    monkeypatch.setattr(cli_common, "local_runner", lambda timeout_s, device, threads=None: runner)
    return runner


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *needles):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cubic: error:"), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


HELP = [
    [], ["workloads"], ["workloads", "list"], ["workloads", "show"], ["run"], ["trials"],
    ["trials", "list"], ["trials", "show"], ["trials", "export"],
]


@pytest.mark.parametrize("words", HELP, ids=lambda w: " ".join(w) or "cubic")
def test_help_everywhere(capsys, words):
    code, out, _ = run_cli(capsys, *words, "--help")
    assert code == 0 and out.startswith("usage: cubic")


def test_usage_errors_exit_2(capsys):
    assert run_cli(capsys)[0] == 2
    assert run_cli(capsys, "trials")[0] == 2
    code, _, err = run_cli(capsys, "run", "--workload", "dlrm-small", "--steps", "0")
    assert code == 2 and "--steps" in err


def test_workloads_table_and_json(capsys):
    code, out, _ = run_cli(capsys, "workloads")
    assert code == 0
    for name in DEFAULT_WORKLOADS:
        assert name in out
    code, out, _ = run_cli(capsys, "workloads", "list", "--json")
    rows = json.loads(out)
    by_name = {r["name"]: r for r in rows}
    w = DEFAULT_WORKLOADS["dlrm-small"]
    assert by_name["dlrm-small"]["tables"] == len(w.tables)
    assert by_name["dlrm-small"]["table_bytes_fp32"] == sum(t.bytes_fp32() for t in w.tables)
    assert by_name["wukong-small"]["dense_arch"] == "wukong"


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_workloads_show_prints_a_spec_that_loads_back(capsys, tmp_path, fmt):
    code, out, _ = run_cli(capsys, "workloads", "show", "wukong-small", "--format", fmt)
    assert code == 0
    data = yaml.safe_load(out) if fmt == "yaml" else json.loads(out)
    assert Workload.model_validate(data) == DEFAULT_WORKLOADS["wukong-small"]
    # what a user copies and edits is accepted back as a file
    edited = dict(data, name="mine", batch_size=64)
    path = tmp_path / f"mine.{fmt}"
    path.write_text(yaml.safe_dump(edited) if fmt == "yaml" else json.dumps(edited))
    code, out, _ = run_cli(capsys, "workloads", "show", str(path), "--format", "json")
    assert code == 0 and json.loads(out)["batch_size"] == 64


def test_run_records_prints_and_serves_the_repeat_from_the_store(capsys, monkeypatch, tmp_path, isolated_store):
    runner = use_runner(monkeypatch, FakeRunner())
    code, out, _ = run_cli(capsys, "run", "--workload", "dlrm-small", "--steps", "7", "--json", "r.json")
    assert code == 0 and runner.calls == 1 and runner.progress_seen == list(range(1, 8))
    for text in ("12,345", "41.5", "44.0", "0.326 GiB", "0.69 -> 0.52", "1.00 -> 0.81", "dense_fwd", "trial #1"):
        assert text in out, text
    assert Result.model_validate_json((tmp_path / "r.json").read_text()).metrics["examples_per_s"] == 12345.0

    code, out, _ = run_cli(capsys, "run", "--workload", "dlrm-small", "--steps", "7")
    assert code == 0 and runner.calls == 1  # served, not run
    assert "served from the trial store" in out and "trial #1" in out

    code, out, _ = run_cli(capsys, "run", "--workload", "dlrm-small", "--steps", "8")
    assert runner.calls == 2  # another run length is another measurement
    code, out, _ = run_cli(capsys, "run", "--workload", "dlrm-small", "--steps", "7", "--force")
    assert runner.calls == 3 and "served" not in out and "trial #3" in out
    assert len(TrialStore(isolated_store).trials()) == 3


def test_run_with_config_file_and_explicit_store(capsys, monkeypatch, tmp_path):
    runner = use_runner(monkeypatch, FakeRunner())
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("batch_size: 128\nseed: 4\nmodel:\n  bottom_mlp: [32, 16]\n")
    url = f"sqlite:///{tmp_path}/other.db"
    code, out, _ = run_cli(capsys, "run", "--workload", "dlrm-small", "--config", str(cfg), "--steps", "2",
                           "--store", url)
    assert code == 0 and runner.calls == 1
    (t,) = TrialStore(url).trials()
    assert t.seed == 4 and t.config["batch_size"] == 128 and t.steps == 2 and t.warmup == 5
    assert TrialStore().trials() == []  # the env store was not touched


def test_failed_run_exits_1_is_recorded_and_not_retried_unless_transient(capsys, monkeypatch, isolated_store):
    runner = use_runner(monkeypatch, FakeRunner(
        Result.failed("timeout", "exceeded 5 s"),
        Result.failed("oom", "CUDA out of memory. Tried to allocate 2.00 GiB"),
    ))
    code, out, _ = run_cli(capsys, "run", "--workload", "dlrm-small", "--steps", "3")
    assert code == 1 and "FAILED (timeout)" in out and "exceeded 5 s" in out
    code, out, _ = run_cli(capsys, "run", "--workload", "dlrm-small", "--steps", "3")
    assert code == 1 and runner.calls == 2 and "out of memory" in out  # a timeout is worth retrying
    code, out, _ = run_cli(capsys, "run", "--workload", "dlrm-small", "--steps", "3")
    assert code == 1 and runner.calls == 2 and "served from the trial store" in out  # an OOM is not
    kinds = [t.failure_kind for t in TrialStore(isolated_store).trials()]
    assert kinds == ["timeout", "oom"]


def test_bad_input_exits_2_with_one_line_naming_file_and_field(capsys, monkeypatch, tmp_path, isolated_store):
    runner = use_runner(monkeypatch, FakeRunner())
    run_cli(capsys, "run", "--workload", "dlrm-small", "--steps", "1")  # one trial already recorded

    code, _, err = run_cli(capsys, "run", "--workload", "no-such-workload")
    assert_one_line_error(code, err, "no-such-workload", "unknown workload")

    bad = DEFAULT_WORKLOADS["dlrm-small"].model_dump(mode="json")
    bad["tables"][1]["dim"] = 0
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    code, _, err = run_cli(capsys, "run", "--workload", "bad.json")
    assert_one_line_error(code, err, "bad.json", "tables.1.dim")

    (tmp_path / "cfg.json").write_text(json.dumps({"batch_size": -1}))
    code, _, err = run_cli(capsys, "run", "--workload", "dlrm-small", "--config", "cfg.json")
    assert_one_line_error(code, err, "cfg.json", "batch_size")

    (tmp_path / "knob.json").write_text(json.dumps({"model": {"no_such_knob": 3}}))
    code, _, err = run_cli(capsys, "run", "--workload", "dlrm-small", "--config", "knob.json")
    assert_one_line_error(code, err, "model.no_such_knob")

    (tmp_path / "broken.yaml").write_text("batch_size: [1,\n")
    code, _, err = run_cli(capsys, "run", "--workload", "dlrm-small", "--config", "broken.yaml")
    assert_one_line_error(code, err, "broken.yaml")

    code, _, err = run_cli(capsys, "run", "--workload", "dlrm-small", "--config", "missing.json")
    assert_one_line_error(code, err, "missing.json", "no such file")

    code, _, err = run_cli(capsys, "run", "--workload", "dlrm-small", "--json", "nodir/r.json")
    assert_one_line_error(code, err, "nodir", "--json")

    code, _, err = run_cli(capsys, "run", "--workload", "dlrm-small", "--store", "nosuchdb://x")
    assert_one_line_error(code, err, "--store")

    code, _, err = run_cli(capsys, "trials", "show", "999")
    assert_one_line_error(code, err, "999")

    assert runner.calls == 1  # no bad input reached the runner
    assert len(TrialStore(isolated_store).trials()) == 1  # and nothing recorded was lost


def test_store_password_never_printed(capsys):
    code, out, err = run_cli(capsys, "trials", "list", "--store",
                             "postgresql+psycopg2://alice:hunter2@127.0.0.1:1/cubic?connect_timeout=2")
    assert_one_line_error(code, err, "--store", "alice:***@")
    assert "hunter2" not in out + err


def test_interrupt_exits_130(capsys, monkeypatch):
    class Interrupted(FakeRunner):
        def run(self, *a, **kw):
            raise KeyboardInterrupt

    use_runner(monkeypatch, Interrupted())
    code, _, err = run_cli(capsys, "run", "--workload", "dlrm-small")
    assert code == 130 and err.strip() == "cubic: interrupted"


def test_simulate_without_the_simulator_is_bad_input(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cubic.runners.sim", None)  # as if cubic/runners/sim.py did not exist
    code, _, err = run_cli(capsys, "run", "--workload", "wukong-large", "--simulate", "h100x64")
    assert_one_line_error(code, err, "--simulate", "cubic.runners.sim")


def test_simulated_runs_are_labelled_and_kept_apart(capsys, monkeypatch, isolated_store):
    from cubic.runners.sim import SIM_NOTE

    class FakeSim(FakeRunner):
        source = "simulated"

        @classmethod
        def from_spec(cls, spec):
            assert spec == "h100x64"
            return cls(Result(status="ok", source="simulated", metrics={"examples_per_s": 9e6},
                              extra={"note": SIM_NOTE}))

    monkeypatch.setitem(sys.modules, "cubic.runners.sim", types.SimpleNamespace(SimulatedRunner=FakeSim))
    use_runner(monkeypatch, FakeRunner())
    run_cli(capsys, "run", "--workload", "dlrm-small", "--steps", "2")
    code, out, _ = run_cli(capsys, "run", "--workload", "wukong-large", "--steps", "2", "--simulate", "h100x64")
    assert code == 0 and "SIMULATED" in out and "9,000,000" in out
    # a model's figure has no interval of a fresh run (a zero-width one would read as evidence) and says
    # what it was never checked against
    assert "95% interval" not in out and "no interval" in out and "never timed on a GPU cluster" in out
    code, out, _ = run_cli(capsys, "trials", "list")
    assert "SIMULATED" in out and "measured" in out
    code, out, _ = run_cli(capsys, "trials", "list", "--source", "measured", "--json")
    assert [t["source"] for t in json.loads(out)] == ["measured"]
    code, out, _ = run_cli(capsys, "trials", "show", "2")
    assert code == 0 and "SIMULATED" in out


def test_trials_list_show_export(capsys, monkeypatch, tmp_path):
    use_runner(monkeypatch, FakeRunner(ok_result(), Result.failed("nan", "loss is NaN at step 3")))
    run_cli(capsys, "run", "--workload", "dlrm-small", "--steps", "2")
    run_cli(capsys, "run", "--workload", "wukong-small", "--steps", "2")
    code, out, _ = run_cli(capsys, "trials", "list")
    assert code == 0 and "dlrm-small" in out and "wukong-small" in out and "failed:nan" in out
    code, out, _ = run_cli(capsys, "trials", "list", "--workload", "wukong-small", "--json")
    (row,) = json.loads(out)
    assert row["failure_kind"] == "nan" and row["reason"] == "loss is NaN at step 3"
    code, out, _ = run_cli(capsys, "trials", "list", "--status", "ok", "--limit", "5", "--json")
    assert [r["workload"] for r in json.loads(out)] == ["dlrm-small"]
    code, out, _ = run_cli(capsys, "trials", "show", "1", "--json")
    assert json.loads(out)["result"]["metrics"]["examples_per_s"] == 12345.0
    code, out, _ = run_cli(capsys, "trials", "show", "1")
    assert code == 0 and "12,345" in out and "fake-fp" in out

    code, out, _ = run_cli(capsys, "trials", "export", "--format", "csv", "--out", "t.csv")
    assert code == 0 and "wrote 2 trials" in out
    df = pd.read_csv(tmp_path / "t.csv")
    assert list(df["workload"]) == ["dlrm-small", "wukong-small"] and "metrics.examples_per_s" in df
    code, out, _ = run_cli(capsys, "trials", "export", "--out", "t.parquet", "--status", "failed")
    assert code == 0 and "parquet" in out
    assert list(pd.read_parquet(tmp_path / "t.parquet")["failure_kind"]) == ["nan"]
    code, _, err = run_cli(capsys, "trials", "export", "--out", "nodir/t.csv")
    assert_one_line_error(code, err, "nodir")


def test_campaign_filter_by_name_or_id(capsys, isolated_store):
    store = TrialStore(isolated_store)
    cid = store.create_campaign("sweep", {}, "dlrm-small")
    store.record(DEFAULT_WORKLOADS["dlrm-small"], __import__("cubic.core.config").core.config.Config(), ok_result(),
                 campaign="sweep")
    for ref in ("sweep", str(cid)):
        code, out, _ = run_cli(capsys, "trials", "list", "--campaign", ref, "--json")
        assert code == 0 and len(json.loads(out)) == 1
    code, out, _ = run_cli(capsys, "trials", "list")
    assert "sweep" in out
    code, _, err = run_cli(capsys, "trials", "list", "--campaign", "nope")
    assert_one_line_error(code, err, "nope")


def test_plugins_missing_are_skipped_but_broken_ones_surface(tmp_path, monkeypatch):
    import argparse

    (tmp_path / "cubic_test_plugin_ok.py").write_text(
        "def register(sub):\n    p = sub.add_parser('hello')\n    p.set_defaults(func=lambda a: 0)\n")
    (tmp_path / "cubic_test_plugin_broken.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sub = argparse.ArgumentParser().add_subparsers()
    assert cli.register_plugins(sub, ["cubic_test_plugin_absent", "cubic.absent_cli", "cubic_test_plugin_ok"]) == [
        "cubic_test_plugin_ok"]
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        cli.register_plugins(sub, ["cubic_test_plugin_broken"])


TINY = {
    "name": "tiny", "batch_size": 64,
    "tables": [{"name": "a", "rows": 1000, "dim": 8, "pooling_factor": 2},
               {"name": "b", "rows": 500, "dim": 8, "pooling_factor": 1}],
    "dense_arch": {"kind": "dlrm", "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
    "data": {"num_dense_features": 4, "eval_batch_size": 256},
}


def test_real_run_end_to_end_and_cached_repeat(capsys, tmp_path, isolated_store):
    """The real LocalRunner in a child process, on a tiny workload file, then the same run served."""
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    argv = ["run", "--workload", "tiny.yaml", "--steps", "3", "--warmup", "1", "--timeout", "300"]
    code, out, err = run_cli(capsys, *argv, "--json", "r.json")
    assert code == 0, out + err
    r = Result.model_validate_json((tmp_path / "r.json").read_text())
    assert r.ok and r.source == "measured" and r.metrics["examples_per_s"] > 0
    assert "throughput (examples/s)" in out and "NE start -> end" in out and "trial #1" in out
    code, out, _ = run_cli(capsys, *argv)
    if "served from the trial store" not in out:  # the first run was contended (a busy machine): re-taken once
        assert code == 0 and "contended" in out
        code, out, _ = run_cli(capsys, *argv)
    assert code == 0 and "served from the trial store" in out
    t = TrialStore(isolated_store).trials()[0]
    assert t.fingerprint_hash == r.fingerprint_hash and t.steps == 3 and t.workload == "tiny"
