"""Commands that read or write a user's files leave nothing behind when refused (stop 58's probe):
a command that only reads campaigns made an empty campaign database (and its folder) at a mistyped
--storage; a report folder was made while parsing, so a command refused a moment later left it;
``trials export --out x.xlsx`` wrote CSV under that name."""

import pytest

from cubic.cli import app as cli

pytestmark = pytest.mark.usefixtures("isolated")  # tests/conftest.py: a fresh directory and store


def _one_line(err: str, *needles: str) -> None:
    line = err.strip()
    assert "\n" not in line and line.startswith("cubic: error:"), line
    for n in needles:
        assert n in line, (n, line)


@pytest.mark.parametrize("verb", [["list"], ["report", "c1", "--out", "r"], ["resume", "c1"], ["work", "c1"],
                                  ["dashboard", "c1"]])
def test_reading_campaigns_at_a_missing_storage_creates_nothing(tmp_path, capsys, verb):
    code = cli.main(["campaign", *verb, "--storage", "sqlite:///typo/c.db"])
    err = capsys.readouterr().err
    if verb == ["list"]:
        assert code == 0 and not err  # nothing stored yet: no campaigns
    else:
        assert code == 2
        _one_line(err, "no campaign storage at typo/c.db")
    assert not (tmp_path / "typo").exists() and not (tmp_path / "r").exists()


def test_a_report_folder_is_made_when_written_not_while_parsing(tmp_path, capsys):
    assert cli.main(["campaign", "run", "--workload", "dlrm-small", "--name", "c1", "--simulate", "h100x8",
                     "--budget", "2", "--batch", "1", "--storage", "sqlite:///c.db"]) == 0
    capsys.readouterr()
    # refused after parsing (no such campaign): no folder left behind
    assert cli.main(["campaign", "report", "nope", "--storage", "sqlite:///c.db", "--out", "a/b/r"]) == 2
    _one_line(capsys.readouterr().err, "nope: no such campaign")
    assert not (tmp_path / "a").exists()
    (tmp_path / "f").write_text("a file in the way")
    assert cli.main(["campaign", "report", "c1", "--storage", "sqlite:///c.db", "--out", "f/r"]) == 2
    _one_line(capsys.readouterr().err, "--out", "f is a file")
    # written: the folder and its parents are made then (`--report reports/own`, as the README does)
    assert cli.main(["campaign", "report", "c1", "--storage", "sqlite:///c.db", "--out", "a/b/r"]) == 0
    assert (tmp_path / "a" / "b" / "r" / "index.html").is_file()


def test_trials_export_refuses_a_suffix_it_cannot_write(tmp_path, capsys, isolated):
    from cubic.core.store import TrialStore

    TrialStore(isolated)  # an (empty) store to export from
    assert cli.main(["trials", "export", "--out", "t.xlsx"]) == 2
    _one_line(capsys.readouterr().err, "--out", "'t.xlsx'", ".csv or .parquet")
    assert not (tmp_path / "t.xlsx").exists()
    assert cli.main(["trials", "export", "--out", "t.txt", "--format", "csv"]) == 0
    assert (tmp_path / "t.txt").is_file()


def test_sim_calibrate_save_is_checked_as_an_output_before_the_fit(tmp_path, capsys):
    """--save made its folders, parents and all, after the fit; now checked while parsing, as --out is."""
    assert cli.main(["sim", "calibrate", "--save", "no/such/p.json"]) == 2
    _one_line(capsys.readouterr().err, "--save", "the folder no/such does not exist")
    assert not (tmp_path / "no").exists()


def test_fp8_check_names_the_placement_file_and_says_when_it_has_no_fp8_site(tmp_path, capsys):
    import json

    site = {"m": 512, "k": 16, "n": 16, "recipe": "tensorwise", "kernel": "scaled_mm_tensorwise", "safe": True}
    (tmp_path / "other.json").write_text(json.dumps({"module_filter": ["x.y"], "sites": {"x.y": site}}))
    assert cli.main(["fp8", "check", "--workload", "dlrm-small", "--placement", "other.json", "--steps", "2"]) == 2
    _one_line(capsys.readouterr().err, "other.json: sites.x.y: the model has no linear site of this name")
    (tmp_path / "none.json").write_text(json.dumps({"sites": {}}))
    assert cli.main(["fp8", "check", "--workload", "dlrm-small", "--placement", "none.json", "--steps", "2"]) == 0
    out = capsys.readouterr().out  # not "+0.000%", which reads as a measured finding
    assert "no FP8 sites in none.json" in out and "placement: NE" not in out


@pytest.mark.parametrize("argv", [["trials", "show", "1"], ["trials", "export", "--out", "t.csv"], ["shard", "train"],
                                  ["sim", "calibrate", "--from-store"]])
def test_reading_trials_at_a_missing_store_creates_nothing(tmp_path, capsys, argv):
    assert cli.main([*argv, "--store", "sqlite:///typo/s.db"]) == 2
    _one_line(capsys.readouterr().err, "--store: no trial store at typo/s.db")
    assert not (tmp_path / "typo").exists() and not (tmp_path / "t.csv").exists()


def test_listing_trials_before_any_run_says_so_and_makes_no_store(tmp_path, capsys):
    assert cli.main(["trials", "list", "--store", "sqlite:///typo/s.db"]) == 0
    assert "no trials recorded yet" in capsys.readouterr().out and not (tmp_path / "typo").exists()
