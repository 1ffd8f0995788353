"""The soak (issue 27 point 6), in the slow suite: 8 workers on PostgreSQL (a server of its own),
1,000 trials of the stand-in, workers and the coordinator SIGKILLed at random and restarted, one
server restart; the study holds exactly the budget, each point once, nothing lost. And the
proposal time of cubic's search on a synthetic history (the coordinator's cost per round)."""

import pytest

from experiments.reliability.concurrency import fresh_postgres_database, private_postgres
from experiments.reliability.soak import proposal_time, soak


@pytest.mark.slow
def test_soak_eight_workers_a_thousand_trials_kills_and_a_restart():
    with private_postgres(55435, "soak") as pg:
        if pg.url is None:
            pytest.skip(f"PostgreSQL not available: {pg.why}")
        out = soak(fresh_postgres_database(pg.url), fresh_postgres_database(pg.url), workers=8, budget=1000,
                   kills=6, restart_db=pg.restart, timeout_s=2400)
    assert not out["timed_out"] and out["kills"] == 6 and out["db_restarts"] == 1, out["events"]
    assert out["finished_runs"] == 1000 and out["lost_trials"] == 0 and out["duplicated_points"] == 0, out
    assert out["failed_without_a_run"] == 0 and out["store"]["lost"] == 0, out
    assert not out["worker_errors"], out["worker_errors"]


def test_proposal_time_is_measured_on_a_synthetic_history():
    r = proposal_time(40, k=4, strategy="tpe")
    assert r["trials"] == 40 and r["first_s"] > 0 and r["refit_s"] > 0
