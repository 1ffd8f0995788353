"""Trial store and campaign storage against hostile databases: timeouts on a server that never
answers, no password piece in any message, schema checks that say what they found, corrupt rows
skipped with a warning naming them."""

import sqlite3
import time

import pytest

from cubic.core.config import Config
from cubic.core.result import Result
from cubic.core.spec import SpecError, Workload
from cubic.core.store import TrialStore, engine_options, redact_url, scrub_error, storage_error_line
from cubic.testing import silent_server




def test_engine_options_set_timeouts_unless_the_url_does():
    pg = engine_options("postgresql+psycopg2://u:p@h/db")["connect_args"]
    assert pg["connect_timeout"] >= 1 and "statement_timeout=" in pg["options"]
    assert "connect_timeout" not in engine_options("postgresql+psycopg2://u:p@h/db?connect_timeout=2")["connect_args"]
    assert engine_options("sqlite:///x.db")["connect_args"]["timeout"] > 0


def test_silent_server_times_out_in_seconds(monkeypatch):
    pytest.importorskip("psycopg2")
    import cubic.core.store_db as store_db  # where the driver timeouts are read (re-exported by cubic.core.store)

    monkeypatch.setattr(store_db, "CONNECT_TIMEOUT_S", 2.0)
    with silent_server() as port:
        t0 = time.monotonic()
        with pytest.raises(SpecError, match=r"--store: .*timeout") as e:
            TrialStore(f"postgresql+psycopg2://u:Pw12345@127.0.0.1:{port}/db", origin="--store")
        assert time.monotonic() - t0 < 20
        assert "Pw12345" not in str(e.value)


@pytest.mark.parametrize("url, secret", [
    ("postgresql+psycopg2://bob:a@TopSecretPart/x9@127.0.0.1:1/db", "TopSecretPart"),
    ("postgresql+psycopg2://bob:p:Hidd3nBit@127.0.0.1:1/db", "Hidd3nBit"),
    ("postgresql+psycopg2://bob:z/Conf1dential#@127.0.0.1:1/db", "Conf1dential"),
])
def test_no_piece_of_a_password_is_printed(url, secret):
    assert secret not in redact_url(url)
    echoed = Exception(f'could not translate host name "{secret}" to address; FATAL: password for {secret}')
    assert secret not in scrub_error(echoed, url)
    try:
        TrialStore(url, origin="--store")
    except SpecError as e:
        assert secret not in str(e)


def test_an_at_sign_in_a_password_is_refused_before_connecting():
    with pytest.raises(SpecError, match="more than one '@'.*%40"):
        TrialStore("postgresql+psycopg2://bob:a@TopSecretPart/x9@127.0.0.1:1/db", origin="--store")


def test_storage_error_line_unwraps_optuna_and_knows_nothing_else():
    import optuna
    from sqlalchemy.exc import OperationalError

    try:
        try:
            raise OperationalError("INSERT", {}, sqlite3.OperationalError("database or disk is full"))
        except OperationalError as inner:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from inner
    except optuna.exceptions.StorageInternalError as e:
        assert "disk is full" in storage_error_line(e)
    assert storage_error_line(KeyError("x")) is None


def _store_with_trials(path, n=3):
    w = Workload.model_validate({"name": "w", "tables": [{"name": "t", "rows": 10, "dim": 4}]})
    store = TrialStore(f"sqlite:///{path}")
    for seed in range(n):
        store.record(w, Config(seed=seed), Result(status="ok", workload="w", metrics={"examples_per_s": 1.0 + seed}))
    return store


def test_corrupt_row_is_skipped_with_a_warning_naming_it(tmp_path, caplog):
    db = tmp_path / "t.db"
    _store_with_trials(db).close()
    with sqlite3.connect(db) as c:
        c.execute("UPDATE cubic_trials SET result = '{not json' WHERE id = 2")
        c.execute("UPDATE cubic_trials SET config = '' WHERE id = 3")
    store = TrialStore(f"sqlite:///{db}")
    with caplog.at_level("WARNING", logger="cubic.store"):
        assert [t.id for t in store.trials()] == [1]
        assert len(store.to_dataframe()) == 1
    assert "skipped trial 2" in caplog.text and "skipped trial 3" in caplog.text
    with pytest.raises(SpecError, match="trial 2 .* corrupt"):
        store.get_trial(2)
    assert store.count() == 3  # nothing deleted


def test_an_optuna_storage_and_the_trial_store_share_one_database(tmp_path):
    import optuna

    db = tmp_path / "c.db"
    optuna.storages.RDBStorage(f"sqlite:///{db}")
    optuna_tables = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    TrialStore(f"sqlite:///{db}").close()  # cubic's tables are cubic_*: nothing of Optuna's is touched
    tables = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert optuna_tables < tables and {"cubic_trials", "cubic_campaigns"} <= tables


def test_foreign_trials_table_is_refused(tmp_path):
    db = tmp_path / "f.db"
    sqlite3.connect(db).execute("CREATE TABLE cubic_trials (id INTEGER PRIMARY KEY, x TEXT)")
    with pytest.raises(SpecError, match="table 'cubic_trials' that is not cubic's"):
        TrialStore(f"sqlite:///{db}")


def test_campaign_storage_checks_say_what_they_found(tmp_path):
    import optuna

    from cubic.codesign.storage import open_storage

    old = tmp_path / "old.db"  # a trial store of the layout before the cubic_ prefix
    with sqlite3.connect(old) as c:
        c.execute("CREATE TABLE campaigns (id INTEGER PRIMARY KEY)")
        c.execute("CREATE TABLE trials (id INTEGER PRIMARY KEY)")
    with pytest.raises(SpecError, match="is a cubic trial store of the old layout"):
        open_storage(f"sqlite:///{old}")
    sqlite3.connect(tmp_path / "s.db").execute("CREATE TABLE studies (x INTEGER)")
    with pytest.raises(SpecError, match="'studies' table that is not Optuna's"):
        open_storage(f"sqlite:///{tmp_path / 's.db'}")
    optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}")
    with sqlite3.connect(tmp_path / "o.db") as c:
        c.execute("UPDATE version_info SET schema_version = 99, library_version = '9.9.9'")
    with pytest.raises(SpecError, match=r"another Optuna version \(schema 99, set up by optuna 9\.9\.9"):
        open_storage(f"sqlite:///{tmp_path / 'o.db'}")
