"""Inputs checked before work (cubic.cli.app.CubicParser): no abbreviations, "did you mean",
output paths checked or created while parsing, a flag type's own reason for a bad value."""

import argparse

import pytest

from cubic.cli import app


def run_cli(capsys, *argv):
    code = app.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cubic: error:"), err
    return lines[0]


def all_parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from all_parsers(sub)


def test_every_parser_refuses_abbreviations():
    parsers = list(all_parsers(app.build_parser()))
    assert len(parsers) > 20 and all(p.allow_abbrev is False for p in parsers)


@pytest.fixture
def no_runs(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("bad input reached a runner")
    monkeypatch.setattr(app, "_make_runner", refuse)


def test_a_prefix_of_a_flag_is_refused_with_a_suggestion(capsys, no_runs):
    code, _, err = run_cli(capsys, "run", "--workload", "dlrm-small", "--step", "3")
    line = one_line(err)
    assert code == 2 and "--step 3" in line and "did you mean --steps?" in line
    code, _, err = run_cli(capsys, "campaign", "run", "--workload", "dlrm-small", "--name", "x", "--budgte", "3")
    assert code == 2 and "did you mean --budget?" in one_line(err)
    code, _, err = run_cli(capsys, "run", "--workload", "dlrm-small", "--zzzz")
    assert code == 2 and "did you mean" not in one_line(err)  # nothing close: no guess


def test_numeric_flags_keep_their_reason(capsys, no_runs):
    code, _, err = run_cli(capsys, "fp8", "probe", "--workload", "wukong-small", "--budget-sqnr", "-5")
    line = one_line(err)
    assert code == 2 and "--budget-sqnr" in line and "must be > 0" in line and "invalid" not in line
    code, _, err = run_cli(capsys, "run", "--workload", "dlrm-small", "--steps", "0")
    assert code == 2 and "must be >= 1" in one_line(err)


def test_report_folder_created_and_a_file_refused_before_any_work(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path}/c.db"
    # the folder (and its parents) is made only when the report is written (stop 58: it was made
    # while the command line was read, so this refused command left it behind)
    code, _, err = run_cli(capsys, "campaign", "report", "nope", "--out", "reports/x", "--storage", storage)
    assert code == 2 and not (tmp_path / "reports").exists()
    (tmp_path / "taken").write_text("a file")
    code, _, err = run_cli(capsys, "campaign", "run", "--workload", "dlrm-small", "--name", "n",
                           "--report", "taken", "--storage", f"sqlite:///{tmp_path}/d.db")
    assert code == 2 and "taken is a file" in one_line(err)
    assert not (tmp_path / "d.db").exists()  # refused at once: no storage opened, no run
    code, _, err = run_cli(capsys, "run", "--workload", "dlrm-small", "--json", str(tmp_path))
    assert code == 2 and "is a folder" in one_line(err)


def test_no_numeric_flag_takes_a_bare_int_or_float():
    # a bare int/float lets nan, inf, 0 and negatives through to the work (found by hand: --time-budget nan
    # planned, --repeats 0 ended in "no median for empty data", calibrate-comm --repeats 0 in a traceback)
    bare = [f"{p.prog} {a.option_strings[0]}" for p in all_parsers(app.build_parser()) for a in p._actions
            if a.type in (int, float)]
    assert bare == []


HOSTILE = [
    (["shard", "plan", "--tables", "dlrm-small", "--time-budget", "nan"], "--time-budget"),
    (["shard", "plan", "--tables", "dlrm-small", "--memory-gb", "nan"], "--memory-gb"),
    (["shard", "plan", "--tables", "dlrm-small", "--seed", "-1"], "--seed"),
    (["shard", "evaluate", "plan.json", "--repeats", "0"], "--repeats"),
    (["shard", "evaluate", "plan.json", "--warmup", "-1"], "--warmup"),
    (["shard", "collect", "--samples", "-3"], "--samples"),
    (["shard", "collect", "--start", "-2"], "--start"),
    (["shard", "train", "--holdout", "1.5"], "--holdout"),
    (["shard", "calibrate-comm", "--repeats", "0"], "--repeats"),
    (["shard", "calibrate-comm", "--passes", "0"], "--passes"),
    (["sim", "predict", "--sync-interval", "0"], "--sync-interval"),
    (["sim", "calibrate", "--world-size", "0"], "--world-size"),
    (["sim", "calibrate", "--steps", "0"], "--steps"),
    (["fp8", "probe", "--workload", "dlrm-small", "--budget-sqnr", "20", "--warmup-steps", "-1"], "--warmup-steps"),
    (["fp8", "model", "--m", "8", "--k", "8", "--n", "inf"], "--n"),
    (["campaign", "work", "x", "--db-wait", "nan"], "--db-wait"),
    (["campaign", "dashboard", "x", "--port", "70000"], "--port"),
]


@pytest.mark.parametrize("argv,flag", HOSTILE, ids=[" ".join(a[:2] + [f]) for a, f in HOSTILE])
def test_hostile_numbers_are_refused_naming_the_flag(capsys, no_runs, tmp_path, monkeypatch, argv, flag):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, *argv)
    line = one_line(err)
    assert code == 2 and f"argument {flag}:" in line and "Traceback" not in err
    assert not (tmp_path / ".cubic").exists()  # refused while parsing: no store opened


@pytest.mark.parametrize("argv", [["run", "--workload", "dlrm-small", "--steps", "2"],
                                  ["campaign", "run", "--workload", "dlrm-small", "--name", "c", "--budget", "2",
                                   "--storage", "sqlite:///c.db"]], ids=["run", "campaign run"])
def test_a_cuda_device_this_machine_lacks_is_refused_before_anything_is_recorded(capsys, tmp_path, monkeypatch, argv):
    # it was a failed trial in the store ("Torch not compiled with CUDA enabled"); cuda:999 exists nowhere
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, *argv, "--device", "cuda:999")
    line = one_line(err)
    assert code == 2 and "--device" in line and "cuda:999" in line
    assert not (tmp_path / ".cubic").exists() and not (tmp_path / "c.db").exists()


@pytest.mark.parametrize("argv,flag", [
    (["campaign", "run", "--workload", "dlrm-small", "--name", "c", "--storage", "sqlite:///c.db", "--prune", "median"],
     "--prune"),  # was accepted and ignored: cubic's own runs print no intermediate lines
    (["campaign", "run", "--workload", "dlrm-small", "--name", "c", "--storage", "sqlite:///c.db", "--nproc", "2"],
     "--nproc"),
    (["shard", "plan", "--tables", "dlrm-small", "--world-size", "4", "--ranks-per-node", "3", "--no-check"],
     "--ranks-per-node"),  # was planned: no torchrun job has nodes of 3 and 1 ranks
], ids=["prune without a job", "nproc without a job", "uneven nodes"])
def test_flags_that_cannot_apply_are_refused(capsys, tmp_path, monkeypatch, argv, flag):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and one_line(err).startswith(f"cubic: error: {flag}:")
    assert not (tmp_path / "c.db").exists() and not (tmp_path / ".cubic").exists()


def test_a_local_size_that_cannot_hold_the_plans_ranks_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert app.main(["shard", "plan", "--tables", "dlrm-small", "--world-size", "2", "--planner", "size_greedy",
                     "--no-check", "--out", "p.json"]) == 0
    capsys.readouterr()
    for argv in (["shard", "export", "p.json", "--local-size", "3"],
                 ["shard", "evaluate", "p.json", "--backend", "torchrec", "--local-size", "3"]):
        code, _, err = run_cli(capsys, *argv)  # export wrote it; evaluate ran it and failed (exit 1)
        assert code == 2 and "--local-size: must divide the plan's 2 ranks, got 3" in one_line(err)


def test_uneven_nodes_in_a_workload_file_name_the_file_and_field(capsys, tmp_path):
    w = tmp_path / "w.json"
    w.write_text('{"name": "w", "tables": [{"name": "t", "rows": 100, "dim": 8}], '
                 '"topology": {"world_size": 12, "ranks_per_node": 8}}')
    code, _, err = run_cli(capsys, "shard", "plan", "--tables", str(w), "--no-check", "--planner", "size_greedy")
    assert code == 2 and f"{w}: topology.ranks_per_node: 8 ranks per node do not divide 12" in one_line(err)
