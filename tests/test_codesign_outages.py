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


def test_a_server_caught_restarting_at_first_attach_is_an_outage_not_bad_input(tmp_path, monkeypatch, capsys):
    # the soak's replacement worker started as the server went down: it exited 2 as if its URL were bad
    import cubic.codesign.storage as storage
    from cubic.core.spec import SpecError

    url = f"sqlite:///{tmp_path}/c.db"
    real, calls = storage._check_campaign_schema, []

    def flaky(u, safe, origin, why="server closed the connection unexpectedly", **kw):
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("select 1", {}, Exception(f"{why} ({u})"))
        return real(u, safe, origin, **kw)

    monkeypatch.setattr(storage, "_check_campaign_schema", flaky)
    st = through_outages(lambda: storage.open_storage(url, heartbeat_s=None), lambda s: s, [url], wait_s=5,
                         on_outage=OutageLog("cubic"), poll_s=0.01)
    assert st is not None and len(calls) == 2 and "re-attached" in capsys.readouterr().err
    # nothing listening (a mistyped port) is still bad input, at once
    calls.clear()
    monkeypatch.setattr(storage, "_check_campaign_schema",
                        lambda u, safe, origin, **kw: flaky(u, safe, origin, why="Connection refused", **kw))
    with pytest.raises(SpecError, match="Connection refused"):
        storage.open_storage(url, heartbeat_s=None)


def test_a_trial_store_caught_restarting_is_an_outage_too(tmp_path, monkeypatch):
    # the worker's attach opens the trial store as well: the same server, the same restart
    from cubic.core.spec import SpecError
    from cubic.core.store import TrialStore

    url, calls = f"sqlite:///{tmp_path}/t.db", []
    real = TrialStore._check_schema

    def flaky(self, conn, why="server closed the connection unexpectedly"):
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("select 1", {}, Exception(why))
        return real(self, conn)

    monkeypatch.setattr(TrialStore, "_check_schema", flaky)
    assert through_outages(lambda: TrialStore(url), lambda s: s, [url], wait_s=5, poll_s=0.01) is not None
    assert len(calls) == 2
    calls.clear()
    monkeypatch.setattr(TrialStore, "_check_schema", lambda self, conn: flaky(self, conn, why="Connection refused"))
    with pytest.raises(SpecError, match="Connection refused"):
        TrialStore(url)
