"""SIGKILL a running campaign process at random moments and resume it each time.

`make test` runs the reduced form: 2 kills (a campaign of 16 runs); `python -m experiments.reliability`
runs the full form (24 kills by default). At the end every finished run is in the Optuna storage
and in the trial store exactly once, both SQLite files pass PRAGMA integrity_check, and the
campaign equals one that was never interrupted (same seed: same points, same outcomes)."""

import pytest

from experiments.reliability.kill import kill_resume


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_campaign(tmp_path):
    out = kill_resume(tmp_path, kills=2, budget=16, batch=4, max_wait_s=0.5, rng_seed=3)
    assert out["kills"] == 2 and not out["finished_before_all_kills"]
    assert out["trials"] == 16 and out["lost_trials"] == 0 and out["duplicated_trials"] == 0
    assert out["store"] == {"store_trials": 16, "lost": 0, "duplicates": 0, "orphans": 0}
    # what a user reads: exactly the budget's trials, all complete, each point once, no FAIL a kill made
    seen = out["user_view"]
    assert seen["trials"] == 16 and seen["duplicated_points"] == 0 and seen["failed_without_a_run"] == 0, seen
    assert seen["campaign_list_runs"] == 16 and set(seen["states"]) <= {"COMPLETE", "FAIL"}
    assert out["integrity_check"] == {"campaigns.db": "ok", "trials.db": "ok"}
    assert out["equals_uninterrupted"], out["differences"]
    assert out["best_point"] == out["best_point_uninterrupted"] and out["status"] == "finished"
    # a finished run is served from the store on resume, never redone: only runs in flight are
    assert 0 <= out["evaluations_redone_after_kills"] <= out["kills"]


class _Crash(BaseException):
    """Stands in for SIGKILL inside this process: not an Exception, so the campaign cannot catch it."""


@pytest.mark.slow  # fits XGBoost/MLP proxies over several rounds, twice: ~30 s idle, minutes when loaded
def test_proxy_guided_campaign_cut_mid_round_resumes_to_the_same_result(tmp_path):
    from cubic.codesign.campaign import Campaign
    from cubic.testing import FastRunner, space, toy_workload
    from search.strategies import ProxyGuided

    sp, wl, runner = space(), toy_workload(), FastRunner(delay_s=0.0, log="")

    def evaluate(point):
        return runner.run(wl, sp.to_config(point))

    def strategy():
        return ProxyGuided("tpe", n_init=4, n_inner=32, families=("xgboost", "mlp"), reselect_every=2)

    kw = dict(budget=14, batch_size=4, seed=11)
    ref = Campaign(sp, evaluate, name="ref", strategy=strategy(), storage=f"sqlite:///{tmp_path}/ref.db", **kw)
    ref.run()

    url = f"sqlite:///{tmp_path}/cut.db"
    calls = []

    def crashing(point):
        calls.append(point)
        if len(calls) in (6, 11):  # mid-round 1 (after 1 of 4) and mid-round 2 (after 2 of 4)
            raise _Crash()
        return evaluate(point)

    c = Campaign(sp, crashing, name="cut", strategy=strategy(), storage=url, **kw)
    for _ in range(3):
        try:
            c.run()
            break
        except _Crash:
            # a new process: fresh strategy object, state only from the storage
            c = Campaign.resume("cut", crashing, storage=url, strategy=strategy())
    assert len(calls) == 14 + 2  # the two runs in flight at the crashes were redone, nothing else

    def outcome(study):  # the runs cubic told (a crashed run's stale trial is retried as a new one)
        return {t.user_attrs["key"]: (t.state.name, t.user_attrs["round"], t.user_attrs["metrics"].get("examples_per_s"))
                for t in study.trials if "finished_at" in t.user_attrs}

    assert outcome(c.study) == outcome(ref.study)


def _user_sees_exactly_the_budget(out):
    seen = out["user_view"]
    assert seen["trials"] == out["budget"] and seen["duplicated_points"] == 0, seen
    assert seen["failed_without_a_run"] == 0 and seen["campaign_list_runs"] == out["budget"], seen
    assert out["status"] == "finished" and out["integrity_check"] == "ok"


@pytest.mark.slow  # ~18 s; the fast suite keeps the SIGKILL-at-random-moments test
def test_the_real_cli_killed_and_resumed_keeps_exactly_the_budget(tmp_path):
    from experiments.reliability.kill import kill_resume_cli

    out = kill_resume_cli(tmp_path, kills=2, budget=4, batch=2, strategy="tpe", max_wait_s=0.4, rng_seed=1)
    assert out["kills"] == 2 and not out["finished_before_all_kills"]
    _user_sees_exactly_the_budget(out)


@pytest.mark.slow  # the proxy retrains before every round (kills land in it): minutes on 2 cores
def test_the_real_cli_with_its_proxy_killed_at_random_moments(tmp_path):
    from experiments.reliability.kill import kill_resume_cli

    out = kill_resume_cli(tmp_path, kills=5, budget=8, batch=2, strategy="cubic", max_wait_s=3.0, rng_seed=2)
    _user_sees_exactly_the_budget(out)


@pytest.mark.parametrize("crash_at", [1, 3, 4])  # enqueues of round 1: before, inside, after its trials
def test_a_coordinator_killed_while_enqueueing_a_round_goes_on_with_that_round(tmp_path, crash_at):
    """The round and the strategy's state are one write before the round's trials: a coordinator
    killed among the enqueues (or right after them) resumes with the same round and state, so the
    campaign runs what an uninterrupted one runs (it proposed from a partial round before)."""
    import optuna

    from cubic.codesign.campaign import Campaign
    from cubic.testing import FastRunner, space, toy_workload

    sp, wl, runner = space(), toy_workload(), FastRunner(delay_s=0.0, log="")

    def evaluate(point):
        return runner.run(wl, sp.to_config(point))

    kw = dict(budget=12, batch_size=4, seed=5, strategy="random")
    ref = Campaign(sp, evaluate, name="ref", storage=f"sqlite:///{tmp_path}/ref.db", **kw)
    ref.run()

    url = f"sqlite:///{tmp_path}/cut.db"
    c = Campaign(sp, evaluate, name="cut", storage=url, **kw)
    enqueue, calls = optuna.Study.enqueue_trial, []

    def crashing(study, *a, **k):
        calls.append(1)
        if len(calls) == 4 + crash_at:  # round 0 holds the first 4
            raise _Crash()
        return enqueue(study, *a, **k)

    optuna.Study.enqueue_trial = crashing
    try:
        with pytest.raises(_Crash):
            c.run()
    finally:
        optuna.Study.enqueue_trial = enqueue
    c = Campaign.resume("cut", evaluate, storage=url, strategy="random")
    c.run()

    def outcome(study):
        return sorted((t.user_attrs["round"], t.user_attrs["key"], t.state.name) for t in study.trials
                      if "finished_at" in t.user_attrs)

    assert outcome(c.study) == outcome(ref.study)
