"""Files cubic reads back are checked like user input: the pending file (each bad line quarantined
with one warning naming file and line, never imported, never blocking the good lines), stored rows
(a corrupt row skipped with a warning, never a crash of `cubic trials list`), lease rows."""

import json
import logging
import sqlite3

import pytest

from cubic.core.store import TrialStore, check_pending_line, redact_url
from experiments.reliability.readback import PENDING_ATTACKS, _good_row, pending_attacks, stored_row_attacks


def test_every_kind_of_bad_pending_line_is_refused_with_a_reason():
    entry = {"id": "x", "store": "sqlite:///t.db", "row": _good_row(1)}
    store, row = check_pending_line(json.dumps(entry))
    assert store == "sqlite:///t.db" and row["status"] == "ok"
    for kind, make in PENDING_ATTACKS.items():
        with pytest.raises(ValueError) as e:
            check_pending_line(make(entry))
        assert str(e.value) and "\n" not in str(e.value), kind


def test_cli_imports_the_good_lines_and_quarantines_every_bad_one(tmp_path):
    out = pending_attacks(tmp_path)
    n = len(PENDING_ATTACKS)
    assert out["crashes"] == 0, out["stderr_tail"]
    assert out["warnings"] == n and out["warnings_naming_file_and_line"] == n and out["quarantined"] == n
    assert out["good_rows_imported"] == 2 and out["rows_imported_unchecked"] == 0 and out["rows_listed"] == 2
    assert not out["pending_left"] and out["second_run_warnings"] == 0


def test_a_bad_line_for_another_store_is_quarantined_and_its_good_lines_stay(tmp_path, caplog):
    p = tmp_path / "pending.jsonl"
    good = {"id": "x", "store": "sqlite:///elsewhere.db", "row": _good_row(3)}
    p.write_text(json.dumps(good) + "\nnull\n")
    st = TrialStore(f"sqlite:///{tmp_path}/t.db")
    with caplog.at_level(logging.WARNING):
        assert st.import_pending(p) == 0
    assert p.read_text().splitlines() == [json.dumps(good)]
    assert f"{p} line 2 is not a pending result" in caplog.text
    q = json.loads((tmp_path / "pending.jsonl.quarantine").read_text())
    assert q["line"] == 2 and q["text"] == "null" and q["file"] == str(p)


def test_corrupt_stored_rows_never_crash_list_or_export(tmp_path):
    out = stored_row_attacks(tmp_path)
    assert out["crashes"] == 0, out["commands"]
    assert out["good_rows_listed"] == out["good_rows"] == 2
    assert out["commands"]["list"]["skipped_warnings"] == len(out["kinds"])


def test_a_corrupt_lease_row_is_removed_not_trusted(tmp_path, caplog):
    from cubic.codesign.storage import Lease, open_storage

    url = f"sqlite:///{tmp_path}/c.db"
    st = open_storage(url)
    con = sqlite3.connect(tmp_path / "c.db")
    con.execute("INSERT INTO cubic_campaign_leases VALUES ('x', 'someone', 'forever')")
    con.commit()
    con.close()
    lease = Lease(st, "x", "me")
    with caplog.at_level(logging.WARNING):
        assert lease.try_acquire()  # a garbage expiry is a lapsed lease, not a lease held for ever
    assert "lease row of campaign 'x'" in caplog.text and lease.holder_now()[0] == "me"
    lease.release()
