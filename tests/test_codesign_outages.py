"""cubic.codesign.storage.through_outages with the workers' OutageLog, in-process: a storage error
whose database answers again re-attaches and goes on (one stderr line, a suffix on the closing
line); any other error, a database that stays away, or too many outages is raised."""

import pytest
from sqlalchemy.exc import OperationalError

from cubic.codesign.storage import MAX_OUTAGES, through_outages
from cubic.codesign.worker import OutageLog


def _cut(url: str):
    return OperationalError("select 1", {}, Exception(f"server closed the connection unexpectedly ({url})"))


def test_a_database_that_answers_again_is_re_attached(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/c.db"
    attached, log = [], OutageLog("cubic")

    def body(n):
        if n < 2:
            raise _cut(url)
        return "done"

    assert through_outages(lambda: attached.append(len(attached)) or attached[-1], body, [url], wait_s=5,
                           on_outage=log, poll_s=0.01) == "done"
    assert attached == [0, 1, 2] and len(log.lines) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(e.startswith("cubic: store error: ") and e.endswith("re-attached") for e in err)
    assert log.suffix() == "; re-attached after 2 database outage(s), runs counted since"
    assert OutageLog("cubic").suffix() == ""


def test_other_errors_a_database_that_stays_away_and_too_many_outages_are_raised(tmp_path):
    url = f"sqlite:///{tmp_path}/c.db"
    with pytest.raises(ValueError):  # not a storage error: the worker's error, as before
        through_outages(lambda: 0, lambda _: (_ for _ in ()).throw(ValueError("bug")), [url], wait_s=5)
    away = "postgresql://u:p@127.0.0.1:1/none"  # nothing listens on port 1
    with pytest.raises(OperationalError):
        through_outages(lambda: 0, lambda _: (_ for _ in ()).throw(_cut(away)), [away], wait_s=0.2, poll_s=0.05)
    n = []

    def always(_):
        n.append(1)
        raise _cut(url)

    with pytest.raises(OperationalError):
        through_outages(lambda: 0, always, [url], wait_s=5, poll_s=0.01)
    assert len(n) == MAX_OUTAGES + 1
