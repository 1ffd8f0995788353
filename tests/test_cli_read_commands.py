"""Commands that read or write a user's files leave nothing behind when refused (stop 58's probe):
a command that only reads campaigns made an empty campaign database (and its folder) at a mistyped
--storage; a report folder was made, parents and all, while parsing, before the command could be
refused; ``trials export --out x.xlsx`` wrote CSV under that name."""

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


def test_a_report_folder_is_made_when_written_in_a_folder_that_exists(tmp_path, capsys):
    assert cli.main(["campaign", "run", "--workload", "dlrm-small", "--name", "c1", "--simulate", "h100x8",
                     "--budget", "2", "--batch", "1", "--storage", "sqlite:///c.db"]) == 0
    capsys.readouterr()
    assert cli.main(["campaign", "report", "c1", "--storage", "sqlite:///c.db", "--out", "a/b/r"]) == 2
    _one_line(capsys.readouterr().err, "--out", "the folder a/b does not exist")
    assert not (tmp_path / "a").exists()
    # refused as bad input after parsing: the report folder is not left behind either
    assert cli.main(["campaign", "report", "nope", "--storage", "sqlite:///c.db", "--out", "r"]) == 2
    assert not (tmp_path / "r").exists()
    assert cli.main(["campaign", "report", "c1", "--storage", "sqlite:///c.db", "--out", "r"]) == 0
    assert (tmp_path / "r" / "index.html").is_file()


def test_trials_export_refuses_a_suffix_it_cannot_write(tmp_path, capsys):
    assert cli.main(["trials", "export", "--out", "t.xlsx"]) == 2
    _one_line(capsys.readouterr().err, "--out", "'t.xlsx'", ".csv or .parquet")
    assert not (tmp_path / "t.xlsx").exists()
    assert cli.main(["trials", "export", "--out", "t.txt", "--format", "csv"]) == 0
    assert (tmp_path / "t.txt").is_file()
