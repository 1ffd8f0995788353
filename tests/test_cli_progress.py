"""`cubic campaign run|resume|list` piped (not a terminal): a progress line per run on stderr, plain
and never cut; resume reports the true count of runs served from the trial store."""

import json

from cubic.cli.app import main

SPACE = """
version: 1
name: sim-small
objectives: [{metric: examples_per_s}]
parameters:
  - {name: batch_size, type: categorical, choices: [256, 512, 1024, 2048, 4096]}
  - {name: kernels.dense_dtype, type: categorical, choices: [fp32, bf16]}
"""
LONG = "a-campaign-with-a-name-long-enough-to-be-cut-by-any-console-" + "x" * 100


def _env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(SPACE)
    return ["--storage", f"sqlite:///{tmp_path}/c.db", "--store", f"sqlite:///{tmp_path}/t.db"]


def _split(err):
    """(start lines, end lines): a run's line when it starts (its knobs) and when it ends."""
    lines = err.splitlines()
    return [ln for ln in lines if ") starts: " in ln], [ln for ln in lines if ") starts: " not in ln]


def _run(name, common, budget=2, json_out=False):
    return main(["campaign", "run", "--workload", "dlrm-small", "--space", "space.yaml", "--simulate", "h100x8",
                 "--name", name, "--strategy", "random", "--budget", str(budget), "--batch", "2", "--no-baseline",
                 "--confirm-repeats", "0", *(["--json"] if json_out else []), *common])


def test_piped_campaign_prints_a_whole_line_per_run_and_nothing_is_cut(tmp_path, monkeypatch, capsys):
    common = _env(tmp_path, monkeypatch)
    assert _run(LONG, common, budget=3) == 0
    out, err = capsys.readouterr()
    starts, lines = _split(err)
    assert len(lines) == 3 and len(starts) == 3, err
    for i, (start, line) in enumerate(zip(starts, lines), 1):
        assert start.startswith(f"{LONG} run {i}/3 (trial ") and "batch_size=" in start
        assert err.index(start) < err.index(line)  # the start line comes before its end line
        assert line.startswith(f"{LONG} run {i}/3 (trial ") and "batch_size=" in line and "kernels.dense_dtype=" in line
        assert "; SIMULATED |" in line and "examples/s" in line and "best so far" in line
    # the summary on stdout: the whole name and the whole best point on one line
    assert f"{LONG}: 3 runs (0 served from the trial store)" in out.splitlines()[0]
    assert "}" in out.splitlines()[0]
    assert main(["campaign", "list", *common[:2]]) == 0
    listed = capsys.readouterr().out
    assert LONG in listed
    for text in (out, err, listed):
        assert "…" not in text and "..." not in text


def test_resume_counts_the_runs_served_from_the_store(tmp_path, monkeypatch, capsys):
    common = _env(tmp_path, monkeypatch)
    assert _run("first", common) == 0
    assert _run("second", common) == 0  # the same seed proposes the same points: served
    capsys.readouterr()
    assert main(["campaign", "resume", "second", "--budget", "3", "--json", *common]) == 0
    out, err = capsys.readouterr()
    (s,) = json.loads(out)
    assert s["runs"] == 3 and s["served_from_store"] >= 2  # not only this session's (0 or 1)
    starts, ends = _split(err)
    assert len(ends) == 1 and len(starts) == 1 and "second run 3/3" in ends[0]  # only the run this session made
    # "best so far" counts the runs before the resume too (it named the resumed session's own best)
    import optuna

    trials = optuna.load_study(study_name="second", storage=common[1]).get_trials()
    best = max((t for t in trials if t.user_attrs.get("ok") and not t.user_attrs.get("violation")),
               key=lambda t: t.user_attrs["metrics"]["examples_per_s"])
    assert f"(trial {best.number})" in ends[0].split("best so far", 1)[1]
    assert main(["campaign", "resume", "second", *common]) == 0
    out = capsys.readouterr().out
    assert "3 runs (" in out and "0 served" not in out


def test_a_worker_prints_a_line_per_run_it_makes(tmp_path, monkeypatch, capsys):
    from cubic.codesign.campaign import Campaign
    from cubic.core.runspec import RunSpec
    from search.space import load_space

    common = _env(tmp_path, monkeypatch)
    ctx = {"workload": "dlrm-small", "store": None,
           "runner": RunSpec(kind="simulated", simulate="h100x8", steps=2, warmup=0).model_dump(mode="json")}
    Campaign(load_space("space.yaml"), lambda p: {}, name="joined", strategy="random", budget=2, batch_size=2,
             storage=common[1], context=ctx)  # created, never run: the worker coordinates it
    assert main(["campaign", "work", "joined", *common]) == 0
    out, err = capsys.readouterr()
    starts, lines = _split(err)
    assert [ln.split(" (trial")[0] for ln in lines] == ["joined run 1/2", "joined run 2/2"]
    assert [ln.split(" (trial")[0] for ln in starts] == ["joined run 1/2", "joined run 2/2"]
    assert all("; SIMULATED |" in ln for ln in lines)
    assert "2 runs (0 served from the trial store); coordinated" in out
