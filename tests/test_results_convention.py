"""Every committed results file keeps the benchmark convention (README): a targets object whose
entries have measured, target and a boolean met, and a reason for each miss -- the rule
experiments.common.write_result enforces on new runs, checked on what is in the repository."""

import json
from pathlib import Path

import pytest

from experiments.common import target_defects

RESULTS = sorted((Path(__file__).resolve().parent.parent / "results").glob("*.json"))


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_results_file_keeps_the_convention(path):
    assert target_defects(json.loads(path.read_text()).get("targets")) == []


def test_write_result_refuses_a_target_that_breaks_it(tmp_path, monkeypatch):
    import numpy as np

    from experiments import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    for bad in ({"x": {"measured": 1, "target": 2, "met": np.bool_(False), "reason": "r"}},
                {"x": {"measured": 1, "target": 2, "met": False}}, {}):
        with pytest.raises(ValueError, match="results/bench.json"):
            common.write_result("bench", {"targets": bad})
    assert not list(tmp_path.iterdir())  # nothing written
    common.write_result("bench", {"targets": {"x": {"measured": 1, "target": 2, "met": False, "reason": "r"}}})
    assert (tmp_path / "bench.json").exists()


def test_write_result_names_a_file_of_the_checkout_by_its_path_in_the_repository(tmp_path, monkeypatch):
    """two_d.json and sharding_benchmark.json recorded /work/bench/cost_models/...: the benchmark
    worktree's path, which no reader has."""
    from experiments import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    inside, outside = str(common.REPO / "cost_models" / "data" / "c.json"), "/home/u/.cubic/c.json"
    common.write_result("bench", {"targets": {"x": {"measured": 1, "target": 1, "met": True}},
                                  "sources": {"a": f"gloo calibration {inside} (this machine: True)", "b": outside}})
    out = json.loads((tmp_path / "bench.json").read_text())
    assert out["sources"] == {"a": "gloo calibration cost_models/data/c.json (this machine: True)", "b": outside}


def _run(started, machine, met):
    return {"started_at": started, "code_version": f"v{started}", "fingerprint": {"cpu_model": machine},
            "targets": {"a": {"measured": 1, "target": 1, "met": met, **({} if met else {"reason": "r"})},
                        "b": {"measured": 2, "target": 1, "met": True}}}


def test_a_run_that_replaces_another_keeps_its_verdicts_and_says_which_moved(tmp_path, monkeypatch, capsys):
    """A figure on one machine and code is one look; the file a later run writes keeps the earlier
    run's verdicts, so a reader sees whether each survived the second look."""
    from experiments import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    common.write_result("bench", _run("t1", "AMD EPYC", True))
    assert "earlier_looks" not in json.loads((tmp_path / "bench.json").read_text())
    common.write_result("bench", _run("t2", "Intel Xeon", False))
    out = json.loads((tmp_path / "bench.json").read_text())
    assert [(lk["started_at"], lk["machine"], lk["targets"]["a"]["met"]) for lk in out["earlier_looks"]] == [
        ("t1", "AMD EPYC", True)]
    assert out["against_last_look"]["verdict_moved"] == {"a": "met -> missed"}
    assert out["against_last_look"]["same_verdict"] == 1
    assert out["against_last_look"]["look"] == {"started_at": "t1", "code_version": "vt1", "machine": "AMD EPYC"}
    assert "bench.json: against the last look (AMD EPYC, code vt1, t1): 1 targets kept their verdict; moved: " \
           "a: met -> missed" in capsys.readouterr().out
    # a re-write of the same run (--retarget, --reanalyse) adds no look
    again = json.loads((tmp_path / "bench.json").read_text())
    again["targets"]["a"] = {"measured": 1, "target": 1, "met": True}
    common.write_result("bench", again)
    out = json.loads((tmp_path / "bench.json").read_text())
    assert [lk["started_at"] for lk in out["earlier_looks"]] == ["t1"]
    assert out["against_last_look"]["verdict_moved"] == {}
    # nor when the re-write was built afresh, without the stored looks
    common.write_result("bench", _run("t2", "Intel Xeon", True))
    assert [lk["started_at"] for lk in json.loads((tmp_path / "bench.json").read_text())["earlier_looks"]] == ["t1"]


def test_earlier_looks_are_bounded_and_read_a_context_block(tmp_path, monkeypatch):
    from experiments import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    for i in range(common.EARLIER_LOOKS_KEPT + 3):
        doc = _run(f"t{i}", "m", i % 2 == 0)
        ctx = {k: doc.pop(k) for k in ("started_at", "code_version", "fingerprint")}
        common.write_result("bench", {"context": ctx, **doc})
    out = json.loads((tmp_path / "bench.json").read_text())
    assert len(out["earlier_looks"]) == common.EARLIER_LOOKS_KEPT
    assert out["earlier_looks"][-1]["started_at"] == f"t{common.EARLIER_LOOKS_KEPT + 1}"
    assert out["earlier_looks"][0]["started_at"] == "t2"


def test_a_part_measured_again_keeps_the_file_as_it_stood(tmp_path, monkeypatch):
    """A section measured again in its own invocation (two_d --speed, search_benchmark --public, --hard)
    replaces some of the file's figures: the file as it stood is kept as a look, under the part's run;
    the part's later rows and a --retarget after it add none; the next full run keeps the part's look."""
    from experiments import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    common.write_result("bench", _run("t1", "Intel Xeon", True))
    doc = json.loads((tmp_path / "bench.json").read_text())
    doc["targets"]["a"] = {"measured": 0, "target": 1, "met": False, "reason": "r"}
    part = {"started_at": "p1", "code_version": "vp1", "fingerprint": {"cpu_model": "AMD EPYC"}}
    for _ in range(2):  # a part that writes after each row
        common.write_result("bench", doc, run=part)
        doc = json.loads((tmp_path / "bench.json").read_text())
    assert [(lk["started_at"], lk["machine"]) for lk in doc["earlier_looks"]] == [("t1", "Intel Xeon")]
    assert doc["last_run"]["machine"] == "AMD EPYC" and doc["last_run"]["part"] is True
    assert doc["against_last_look"]["verdict_moved"] == {"a": "met -> missed"}
    common.write_result("bench", doc)  # --retarget: measured nothing
    assert len(json.loads((tmp_path / "bench.json").read_text())["earlier_looks"]) == 1
    common.write_result("bench", _run("t2", "Intel Xeon", True))  # a full run afresh
    out = json.loads((tmp_path / "bench.json").read_text())
    assert [(lk["started_at"], lk["machine"], lk.get("part")) for lk in out["earlier_looks"]] == [
        ("t1", "Intel Xeon", None), ("p1", "AMD EPYC", True)]
    assert "last_run" not in out
    assert out["against_last_look"]["verdict_moved"] == {"a": "missed -> met"}


def test_a_file_from_before_parts_said_so_names_its_newest_part(tmp_path, monkeypatch):
    """two_d.json: quality runs on a Xeon, its speed section measured again on an EPYC (speed.measured);
    the look the next --speed keeps is the EPYC's, where those speed verdicts came from."""
    from experiments import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    epyc = {"started_at": "t5", "code_version": "v5", "fingerprint": {"cpu_model": "AMD EPYC"}}
    legacy = {**_run("t1", "Intel Xeon", False), "speed": {"measured": epyc}}
    (tmp_path / "bench.json").write_text(json.dumps(legacy))
    common.write_result("bench", json.loads(json.dumps(legacy)))  # --retarget: the same run, no look
    assert "earlier_looks" not in json.loads((tmp_path / "bench.json").read_text())
    again = json.loads(json.dumps(legacy))
    again["speed"]["measured"] = {"started_at": "t6", "code_version": "v6", "fingerprint": {"cpu_model": "Intel Xeon"}}
    common.write_result("bench", again, run=again["speed"]["measured"])
    looks = json.loads((tmp_path / "bench.json").read_text())["earlier_looks"]
    assert [(lk["started_at"], lk["machine"], lk["part"]) for lk in looks] == [("t5", "AMD EPYC", True)]


def test_a_file_says_which_verdicts_differ_from_the_newest_look_on_each_other_machine(tmp_path, monkeypatch, capsys):
    """Looks on two machines: each target's newest verdict per machine, and the ones that differ, so a
    reader sees which claims held on one machine only; a look on the same machine replaces its older one."""
    from experiments import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    common.write_result("bench", _run("t1", "AMD EPYC", True))
    common.write_result("bench", _run("t2", "AMD EPYC", False))
    assert "across_machines" not in json.loads((tmp_path / "bench.json").read_text())  # one machine so far
    common.write_result("bench", _run("t3", "Intel Xeon", True))
    out = json.loads((tmp_path / "bench.json").read_text())
    across = out["across_machines"]
    assert across["machines"] == {"AMD EPYC": {"code_version": "vt2", "started_at": "t2"},
                                  "Intel Xeon": {"code_version": "vt3", "started_at": "t3"}}
    assert across["differ"] == {"a": {"AMD EPYC": "missed", "Intel Xeon": "met"}}  # t2's verdict, not t1's
    assert across["compared"] == 2 and across["same_on_every_machine"] == 1
    assert "on 2 machines (AMD EPYC, Intel Xeon), the newest look on each: 1 of 2 targets the same verdict on " \
           "all; 1 differ" in capsys.readouterr().out
    renamed = _run("t4", "Intel Xeon", True)  # a target renamed: nothing to set against, said so
    renamed["targets"] = {"c": renamed["targets"]["a"]}
    common.write_result("bench", renamed)
    assert "no target of this run in all of them by its name" in capsys.readouterr().out


def test_relook_re_derives_the_look_fields_and_keeps_every_figure_and_stamp(tmp_path, monkeypatch, capsys):
    """``python -m experiments.common relook``: a file written before ``across_machines`` gains it, its
    figures, looks and stamps unchanged (no finished_at or load added); a name with no file is refused
    before any file is written."""
    from experiments import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    common.write_result("bench", _run("t1", "AMD EPYC", True))
    common.write_result("bench", _run("t2", "Intel Xeon", False))
    stored = json.loads((tmp_path / "bench.json").read_text())
    for k in ("across_machines", "finished_at", "loadavg_1m_at_end"):
        stored.pop(k)
    (tmp_path / "bench.json").write_text(json.dumps(stored))
    with pytest.raises(FileNotFoundError, match="no results file"):
        common.relook(["bench", "none"])
    assert "across_machines" not in json.loads((tmp_path / "bench.json").read_text())
    capsys.readouterr()
    common.relook(["bench"])
    out = json.loads((tmp_path / "bench.json").read_text())
    assert out["across_machines"]["differ"] == {"a": {"AMD EPYC": "met", "Intel Xeon": "missed"}}
    assert {k: v for k, v in out.items() if k != "across_machines"} == stored
    assert "against the last look" not in capsys.readouterr().out  # the same run: no new look
