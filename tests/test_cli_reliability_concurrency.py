"""4 worker processes (python -m cubic.codesign.worker work) on one campaign and one trial store: no lost or
duplicated trials, no "database is locked", one coordinator at a time. SQLite here; PostgreSQL on
loopback via scripts/start_postgres.sh, skipped with the script's reason where it cannot be had."""

import os
import subprocess
import sys
import time

import optuna
import pytest

from cubic.codesign.campaign import Campaign
from cubic.codesign.storage import Lease, LeaseHeld
from cubic.codesign.worker import load_factory
from cubic.core.spec import SpecError
from cubic.testing import make_evaluate, space
from experiments.reliability.common import ROOT
from experiments.reliability.concurrency import (
    concurrent_workers,
    fault_outcome_problems,
    fresh_postgres_database,
    private_postgres,
    start_postgres,
    store_throughput,
)


def _check(out, budget, killed=False):
    codes = out["worker_exit_codes"]
    assert sorted(codes) == ([-9, 0, 0, 0] if killed and out["killed_worker"] else [0, 0, 0, 0]), out["worker_errors"]
    assert out["trials"] == budget and out["lost_trials"] == 0 and out["duplicated_trials"] == 0
    assert out["coordinators"] >= 1
    assert out["store"] == {"store_trials": budget, "lost": 0, "duplicates": 0, "orphans": 0}
    assert out["database_is_locked_failures"] == 0
    if not killed:
        assert sum(int(r.split(": ")[1].split()[0]) for r in out["worker_reports"]) == budget
    else:
        # the run in flight on the killed worker is run again (0: it finished between the check and the kill)
        assert out["retried_after_loss"] in (0, 1)


@pytest.mark.slow  # ~33 s (a worker killed, a 5 s lease to expire); the fast suite has the PostgreSQL form
def test_four_workers_share_one_sqlite_campaign(tmp_path):
    # the coordinating worker is SIGKILLed a third of the way in, a run in flight: another takes
    # the lease once it expires (5 s) and the lost run is retried after the heartbeat's grace period
    out = concurrent_workers(f"sqlite:///{tmp_path}/c.db", f"sqlite:///{tmp_path}/t.db", workers=4, budget=24,
                             kill_one=True, lease_s=5.0)
    assert out["killed_worker"], "the campaign ended before the kill landed: nothing was tested"
    _check(out, 24, killed=True)


def test_store_throughput_counts_every_write(tmp_path):
    tp = store_throughput(f"sqlite:///{tmp_path}/t.db", workers=2, per_worker=10)
    assert tp["stored"] == tp["trials"] == 20 and tp["exit_codes"] == [0, 0] and tp["trials_per_s"] > 0


@pytest.fixture(scope="module")
def postgres_url():
    url, why = start_postgres()
    if url is None:
        pytest.skip(f"PostgreSQL not available: {why}")
    return url


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_four_workers_share_one_postgresql_campaign(postgres_url):
    out = concurrent_workers(fresh_postgres_database(postgres_url), fresh_postgres_database(postgres_url),
                             workers=4, budget=24)
    _check(out, 24)


@pytest.mark.slow  # ~35 s (a 20 s grace period); the fast suite has the in-process form (test_codesign_campaign)
def test_a_stalled_worker_is_retired_after_the_grace_period_and_its_point_run_once_more(postgres_url):
    # SIGSTOP: the worker stops heartbeating, as a cut-off remote host would; its trial goes back
    # after the grace period (20 s), another worker runs it, and once woken the stalled worker's
    # finished run is not told: the study counts that point once. On PostgreSQL, where workers on
    # other hosts are: on SQLite (one host) a process stopped inside a transaction holds the one
    # write lock, and every other process waits for it
    out = concurrent_workers(fresh_postgres_database(postgres_url), fresh_postgres_database(postgres_url),
                             workers=3, budget=12, delay_s=1.0, lease_s=5.0, fault="stall", timeout_s=240)
    f = out["fault"]
    assert f["fault"] == "stall", f
    # the rule the reliability judge applies (experiments/reliability/concurrency.py); it checks that every
    # worker exited 0, not how many there were
    assert fault_outcome_problems(out) == [], (out["fault"], out["store"], out["worker_errors"])
    assert out["worker_exit_codes"] == [0, 0, 0], out["worker_errors"]


@pytest.mark.slow
def test_workers_wait_out_a_postgresql_restart_and_lose_nothing():
    # a server of its own: the shared one (55432) is not restarted under other tests
    with private_postgres(55433, "restart") as pg:
        if pg.url is None:
            pytest.skip(f"PostgreSQL not available: {pg.why}")
        out = concurrent_workers(fresh_postgres_database(pg.url), fresh_postgres_database(pg.url), workers=3,
                                 budget=12, delay_s=1.0, lease_s=5.0, fault="db_restart", timeout_s=300,
                                 restart_db=pg.restart)
    assert out["fault"]["fault"] == "db_restart", out["fault"]
    assert fault_outcome_problems(out) == [], (out["fault"], out["store"], out["worker_errors"])
    assert out["worker_exit_codes"] == [0, 0, 0], out["worker_errors"]


def test_a_second_coordinator_is_refused_while_the_lease_is_held_and_takes_an_expired_one(tmp_path):
    sp = space()
    url = f"sqlite:///{tmp_path}/c.db"
    c = Campaign(sp, make_evaluate(sp, None), name="lease", strategy="random", budget=6, batch_size=2, seed=1,
                 storage=url)
    # another host's coordinator, renewing; a long TTL, so that a loaded machine delaying a renewal
    # cannot expire it while the worker below starts
    with Lease(c.storage, "lease", "elsewhere:1", ttl_s=30.0):
        with pytest.raises(LeaseHeld, match="elsewhere:1"):
            Campaign.resume("lease", make_evaluate(sp, None), storage=url).run()
        p = subprocess.run([sys.executable, "-m", "cubic.codesign.worker", "run", "--storage", url, "--name",
                            "lease", "--evaluate", "cubic.testing:make_evaluate"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert p.returncode == 3 and "elsewhere:1" in p.stderr, p.stderr
        time.sleep(0.2)
        assert not optuna.load_study(study_name="lease", storage=url).trials  # nothing ran meanwhile
    # the holder stops renewing (it died): its lease expires and the campaign is taken over
    lease = Lease(c.storage, "lease", "elsewhere:1", ttl_s=0.3)
    assert lease.try_acquire()
    lease._stop.set()
    time.sleep(0.5)
    s = Campaign.resume("lease", make_evaluate(sp, None), storage=url).run()
    runs = [t for t in optuna.load_study(study_name="lease", storage=url).trials if "finished_at" in t.user_attrs]
    assert s.runs == 6 == len(runs) == len({t.user_attrs["key"] for t in runs})


def test_a_worker_whose_lease_lapsed_under_it_works_on_instead_of_exiting(tmp_path):
    """The bug this guards (the soak, stop 66): a worker coordinating when its database was away
    longer than its lease found the lease taken over and exited 3 ("is being run by ...") as if it
    were a second `campaign run`. Now it steps down, runs points, and coordinates again once the
    other's lease is free."""
    from sqlalchemy import create_engine, update

    from cubic.codesign.storage import _LEASES
    from cubic.testing import recording_listener

    sp = space()
    url = f"sqlite:///{tmp_path}/c.db"
    inner = make_evaluate(sp, None)
    eng, stolen = create_engine(url), []

    def evaluate(point):  # the first run: another process takes the lease over (it lapsed meanwhile)
        if not stolen:
            with eng.begin() as conn:
                stolen.append(conn.execute(update(_LEASES).where(_LEASES.c.campaign == "lapse")
                                           .values(holder="elsewhere:1", expires_at=time.time() + 1.5)).rowcount)
            time.sleep(0.5)  # (the lease is renewed every 0.2 s: it sees the loss before the budget ends)
        return inner(point)

    heard = recording_listener()
    Campaign(sp, evaluate, name="lapse", strategy="random", budget=6, batch_size=2, seed=1, storage=url)
    c = Campaign.resume("lapse", evaluate, storage=url, lease_s=0.6, worker="w0", listener=heard)
    rep = c.work(poll_s=0.05)
    eng.dispose()
    runs = [t for t in optuna.load_study(study_name="lapse", storage=url).trials if "finished_at" in t.user_attrs]
    assert stolen == [1] and heard.heard("lease_lost") == [("lapse",)] and rep.coordinated
    assert rep.runs == 6 == len(runs) == len({t.user_attrs["key"] for t in runs})


def test_a_session_stopped_inside_a_transaction_is_ended_by_postgresql(postgres_url, monkeypatch):
    """The bug this guards (CI, stop 66): a worker SIGSTOPped inside its heartbeat's transaction held
    the row lock of its trial's heartbeat; once the trial went back, every worker that took it waited
    on that lock (statement timeout: 300 s), and the campaign stood still until the worker woke.
    PostgreSQL now ends a session idle inside a transaction ($CUBIC_DB_IDLE_TRANSACTION_TIMEOUT_S)."""
    import threading

    from sqlalchemy import create_engine, text

    import cubic.core.store_db as store_db
    from cubic.codesign.storage import open_storage
    from cubic.core.store import engine_options

    monkeypatch.setattr(store_db, "IDLE_TRANSACTION_TIMEOUT_S", 2.0)
    url = fresh_postgres_database(postgres_url)
    st = open_storage(url)
    study = optuna.create_study(storage=st, study_name="idle")
    trial_id = study.ask()._trial_id
    st.record_heartbeat(trial_id)
    stalled = create_engine(url, **engine_options(url)).connect()  # the stopped worker's session
    stalled.begin()
    stalled.execute(text("UPDATE trial_heartbeats SET heartbeat = now() WHERE trial_id = :t"), {"t": trial_id})
    beat = threading.Thread(target=st.record_heartbeat, args=(trial_id,), daemon=True)
    t0 = time.monotonic()
    beat.start()
    beat.join(timeout=60)
    assert not beat.is_alive(), "the other worker's heartbeat still waits on the stopped session's lock"
    assert time.monotonic() - t0 < 30
    with pytest.raises(Exception, match="idle-in-transaction|closed"):  # the stopped worker finds its session ended
        stalled.execute(text("SELECT 1"))
    stalled.invalidate()


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_two_resumes_at_once_run_the_budget_once(tmp_path):
    """The bug this guards: two `campaign resume` at once both drove the campaign (7 trials for a
    budget of 6, 2 points run twice). Now one coordinates; the other exits 3 naming it."""
    sp = space()
    url = f"sqlite:///{tmp_path}/c.db"
    Campaign(sp, make_evaluate(sp, None), name="twice", strategy="random", budget=6, batch_size=2, seed=1,
             storage=url)
    cmd = [sys.executable, "-m", "cubic.codesign.worker", "run", "--storage", url, "--name", "twice",
           "--evaluate", "cubic.testing:make_evaluate"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUBIC_RELIABILITY_DELAY": "0.3"}
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    runs = [t for t in optuna.load_study(study_name="twice", storage=url).trials if "finished_at" in t.user_attrs]
    assert len(runs) == 6 == len({t.user_attrs["key"] for t in runs})
    # either the second came after the first had finished (then it found nothing to do), or it was refused
    assert codes in ([0, 0], [0, 3]), outs
    if codes == [0, 3]:
        assert "is being run by" in [e for _, e in outs if "is being run by" in e][0]


def test_user_code_is_loaded_only_by_explicit_module_factory():
    assert load_factory("cubic.testing:make_evaluate") is make_evaluate
    for bad in ("cubic.testing", "os.system", ":x", "cubic.testing:no_such",
                "no_such_module_xyz:f", "cubic.testing:make_evaluate()"):
        with pytest.raises(SpecError, match="--evaluate"):
            load_factory(bad)


def test_sqlite_store_runs_in_wal_mode_and_writes_begin_immediate(tmp_path):
    """Why 4 writers never see "database is locked": WAL (readers never block the writer), a busy
    timeout, and BEGIN IMMEDIATE (a writer takes the lock up front, so no deadlocked upgrade)."""
    from sqlalchemy import event

    from cubic.core.store import TrialStore

    st = TrialStore(f"sqlite:///{tmp_path}/t.db")
    seen = []
    event.listen(st.engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    with st.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 10_000
    from cubic.testing import FastRunner, toy_workload
    from cubic.core.config import Config

    wl = toy_workload()
    st.record(wl, Config(), FastRunner(delay_s=0.0, log="").run(wl, Config()))
    assert "BEGIN IMMEDIATE" in seen


def test_one_rule_judges_a_fault_run_for_the_tests_and_the_reliability_judge():
    good = {"trials": 12, "budget": 12, "lost_trials": 0, "duplicated_trials": 0, "worker_exit_codes": [0, 0, 0],
            "store": {"lost": 0, "orphans": 0, "duplicates": 1}, "reattached_workers": 0, "lost_runs_not_told": 1,
            "lost_takes": 0, "fault": {"fault": "stall", "worker": "w1", "finished_by": "w2",
                                       "state_when_resumed": "COMPLETE", "interrupted_attempts": 1}}
    assert fault_outcome_problems(good) == []
    told_twice = {**good, "reattached_workers": 1}
    assert fault_outcome_problems(told_twice) == ["the stalled worker reported its attempt once"]
    own = {**good, "fault": {**good["fault"], "finished_by": "w1"}, "worker_exit_codes": [0, 1, 0]}
    assert fault_outcome_problems(own) == ["every worker exited 0", "finished by another worker"]
    restart = {**good, "fault": {"fault": "db_restart", "stopped": True, "started": True}, "reattached_workers": 0}
    assert fault_outcome_problems(restart) == ["a worker re-attached"]
