"""First start without a race: processes released at one instant on a new campaign storage and a
new trial store all succeed (schema creation once, under a lock). SQLite always; PostgreSQL where
scripts/start_postgres.sh can start one (skipped with its reason otherwise). The full form (20
tries per backend, and the whole commands) runs in `python -m experiments.reliability`."""

import pytest

from experiments.reliability.concurrency import start_postgres
from experiments.reliability.firststart import first_open, first_start


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_first_opens_on_a_new_sqlite_storage_and_store_never_collide(tmp_path):
    out = first_open(tmp_path, tries=1, processes=3)
    assert out["failures"] == 0, out["details"]


@pytest.mark.slow  # a PostgreSQL server and six processes importing the engine: ~1 min on a loaded machine
def test_first_opens_on_a_new_postgres_database_never_collide(tmp_path):
    url, why = start_postgres()
    if url is None:
        pytest.skip(why)
    out = first_open(tmp_path, tries=1, processes=3, pg_base=url)
    assert out["failures"] == 0, out["details"]


@pytest.mark.slow  # six whole commands at once: ~40 s on a loaded 2-core machine
def test_campaigns_workers_and_runs_started_together_all_succeed(tmp_path):
    out = first_start(tmp_path, tries=1)
    assert out["failures"] == 0, out["details"]


@pytest.mark.slow  # three rounds of six whole commands on PostgreSQL: ~50 s
def test_campaigns_workers_and_runs_started_together_on_postgres_all_succeed(tmp_path):
    # the race the full reliability run found in stop 39 (1 failure in 3 rounds): two workers
    # starting one campaign, the second deleting the first's study mid-creation
    url, why = start_postgres()
    if url is None:
        pytest.skip(why)
    out = first_start(tmp_path, tries=3, pg_base=url)
    assert out["failures"] == 0, out["details"]
