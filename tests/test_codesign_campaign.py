import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import optuna
import pytest

from cubic.codesign.campaign import Campaign
from cubic.codesign.storage import list_campaigns
from cubic.core.result import Result
from cubic.core.spec import SpecError
from search.space import Space
from search.strategies import ProxyGuided

ROOT = Path(__file__).resolve().parent.parent

SPACE = {
    "name": "toy",
    "parameters": [
        {"name": "x", "type": "float", "low": 0, "high": 1},
        {"name": "y", "type": "int", "low": 1, "high": 64, "log": True},
        {"name": "kind", "type": "categorical", "choices": ["a", "b", "c"]},
        {"name": "z", "type": "float", "low": 0, "high": 1, "when": {"kind": ["b"]}},
    ],
    "objectives": [{"metric": "tput"}],
    "constraints": [{"name": "memory", "metric": "mem", "max": 40}],
}


def toy(p):
    """Throughput-like: peaks near x=0.3, grows with y; y > 48 'runs out of memory'."""
    if p["y"] > 48:
        return Result.failed("oom", "out of memory")
    t = 100 * math.exp(-8 * (p["x"] - 0.3) ** 2) * (1 + math.log2(p["y"]) / 6)
    t *= {"a": 1.0, "b": 1.2, "c": 0.8}[p["kind"]] * (1 + 0.3 * p.get("z", 0.0))
    return {"tput": t, "mem": float(p["y"])}


@pytest.mark.parametrize("strategy", ["random", "tpe"])
def test_baselines_spend_the_budget_without_repeating_points(strategy):
    space = Space.model_validate(SPACE)
    seen = []
    c = Campaign(space, lambda p: (seen.append(space.key(p)), toy(p))[1], strategy=strategy,
                 budget=20, batch_size=4, seed=3, name=strategy)
    s = c.run()
    assert s.runs == 20 == len(seen) == len(set(seen))
    assert s.best_metrics["mem"] <= 40  # the best is feasible
    assert all(b2 >= b1 for b1, b2 in zip(s.best_so_far[1:], s.best_so_far[2:]) if not math.isnan(b1))
    kinds = {o.failure_kind for o in c.observations() if not o.ok}
    assert kinds <= {"oom"}


def test_a_trial_holds_one_record_of_its_run_the_result():
    """trial_attrs writes a trial's attributes from the run's Result, trial_result reads the same
    Result back, and what the strategies see (Observation) is that Result."""
    from cubic.codesign.trials import trial_observation, trial_result

    space = Space.model_validate(SPACE)

    def evaluate(p):
        if p["y"] > 48:
            return Result.failed("oom", "out of memory", workload="w", workload_hash="wh", config_hash="ch",
                                 fingerprint_hash="fh", source="simulated")
        return Result(status="ok", metrics=toy(p), workload="w", workload_hash="wh", config_hash="ch",
                      fingerprint_hash="fh", source="simulated", extra={"trial_id": 7, "plan": {"big": 1}})

    c = Campaign(space, evaluate, strategy="random", budget=12, batch_size=4, seed=1)
    c.run()
    runs = [t for t in c.study.trials if "finished_at" in t.user_attrs]
    assert len(runs) == 12 and any(not t.user_attrs["ok"] for t in runs)
    for t in runs:
        point = dict(t.params)
        want = evaluate(point)
        got = trial_result(t)
        assert (got.status, got.failure_kind, got.source, got.metrics) == (want.status, want.failure_kind,
                                                                            want.source, want.metrics)
        assert (got.workload, got.workload_hash, got.config_hash, got.fingerprint_hash) == ("w", "wh", "ch", "fh")
        # the run's bookkeeping notes reach the trial; the rest of Result.extra stays in the trial store
        assert got.extra == ({"trial_id": 7} if want.ok else {})
        o = trial_observation(t, {})
        assert o.result == got and o.ok == want.ok and o.metrics == want.metrics and o.point == point
        assert t.user_attrs["measured/served"] == "SIMULATED"
    # a plain evaluate's dict of metrics has no run identity to join a trial store by
    c2 = Campaign(space, toy, strategy="random", budget=4, batch_size=4, seed=1)
    c2.run()
    assert all(t.user_attrs["extra"] == {} for t in c2.study.trials if "finished_at" in t.user_attrs)


def test_proxy_guided_loop_learns_and_never_reproposes_failures():
    space = Space.model_validate(SPACE)
    calls = []
    strat = ProxyGuided("tpe", n_init=6, n_inner=64, families=("xgboost",))
    c = Campaign(space, lambda p: (calls.append(p), toy(p))[1], strategy=strat, budget=18, batch_size=6, seed=0)
    s = c.run()
    assert s.runs == 18 and len({space.key(p) for p in calls}) == 18
    # proposals after the random start carry the proxy's prediction, kept for the report
    preds = [t.user_attrs["predicted"] for t in c.study.trials if t.user_attrs["round"] > 0]
    assert preds and all(p and "tput" in p and 0 <= p["p_feasible"] <= 1 for p in preds if p)
    assert s.proxy["family"] == "xgboost" and s.proxy["n_train"] >= 6
    assert s.best_metrics["tput"] > 150  # random start alone rarely beats ~150 on this function


def test_transient_failures_are_retried_a_bounded_number_of_times_and_exceptions_are_failed_runs():
    space = Space.model_validate(SPACE)
    attempts = {}

    def flaky(p):
        k = space.key(p)
        attempts[k] = attempts.get(k, 0) + 1
        if p["kind"] == "c":
            raise RuntimeError("boom")
        if p["kind"] == "b":
            return Result.failed("timeout", "slow machine")  # transient: never recovers
        if attempts[k] == 1:
            return Result.failed("killed", "worker lost")  # transient: recovers on retry
        return toy(p)

    c = Campaign(space, flaky, strategy="random", budget=12, batch_size=4, max_retries=2)
    c.run()
    for t in c.study.trials:
        kind = t.params["kind"]
        if kind == "a":
            assert t.state == optuna.trial.TrialState.COMPLETE or t.user_attrs["failure_kind"] == "oom"
            assert t.user_attrs["attempts"] == 2
        elif kind == "b":
            # a timeout gets at most one retry (issue 22: budget went on values that always hang)
            assert t.user_attrs["failure_kind"] == "timeout" and t.user_attrs["attempts"] == 2
        else:
            assert t.user_attrs["failure_kind"] == "error" and "boom" in t.user_attrs["reason"]
            assert t.user_attrs["attempts"] == 1


def test_plateau_stops_early_and_names_are_unique(tmp_path):
    space = Space.model_validate(SPACE)
    url = f"sqlite:///{tmp_path}/c.db"
    s = Campaign(space, lambda p: {"tput": 1.0, "mem": 1.0}, strategy="random", budget=40, batch_size=2,
                 patience=2, storage=url, name="flat").run()
    assert s.stop_reason == "plateau" and s.runs < 40
    with pytest.raises(SpecError, match="exists"):
        Campaign(space, toy, storage=url, name="flat")
    with pytest.raises(SpecError, match="no such campaign"):
        Campaign.resume("nope", toy, storage=url)
    assert [c["name"] for c in list_campaigns(url)] == ["flat"]


def test_warm_start_feeds_the_proxy_with_another_campaigns_trials(tmp_path):
    space = Space.model_validate(SPACE)
    url = f"sqlite:///{tmp_path}/c.db"
    Campaign(space, toy, strategy="random", budget=12, batch_size=4, storage=url, name="old").run()
    strat = ProxyGuided("tpe", n_init=6, n_inner=32, families=("xgboost",))
    c = Campaign(space, toy, strategy=strat, budget=4, batch_size=4, storage=url, name="new", warm_start=["old"])
    s = c.run()
    assert s.warm_start == {"campaigns": ["old"], "trials": 12}
    # with 12 warm trials the very first round is already proxy-guided
    assert all(t.user_attrs["predicted"] for t in c.study.trials)


@pytest.mark.parametrize("design", ["none", "prior", "proxy"])
def test_a_warm_started_campaign_with_a_prior_designs_its_first_round_as_told(tmp_path, design):
    space = Space.model_validate({**SPACE, "parameters": [
        {"name": "y", "type": "categorical", "choices": [1, 2, 4, 8, 16, 32, 40, 64], "log": True},
        {"name": "kind", "type": "categorical", "choices": ["a", "b", "c"]}]})

    def f(p):
        return toy({**p, "x": 0.3})

    url = f"sqlite:///{tmp_path}/c.db"
    Campaign(space, f, strategy="random", budget=8, batch_size=4, storage=url, name="old",
             featurize=_PriorFeaturizer()).run()
    c = Campaign(space, f, strategy=ProxyGuided("local", n_inner=32, warm_design=design), budget=3, batch_size=3,
                 storage=url, name="new", warm_start=["old"], featurize=_PriorFeaturizer())
    c.run()
    first = [t for t in c.study.trials if t.user_attrs["round"] == 0]
    sources = [(t.user_attrs["predicted"] or {}).get("source") for t in first]
    if design == "none":  # the warm runs fill the initial design: the proxy's picks, no design
        assert not any(sources) and all(t.user_attrs["predicted"] for t in first)
    else:
        want = "step-model prior" if design == "prior" else "warm-started proxy"
        assert sources == [want, f"{want}, one knob changed", f"{want}, one knob changed"]
        assert sum(p != q for p, q in zip(first[0].params.values(), first[1].params.values())) == 1


KILL_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from tests.test_codesign_campaign import SPACE, toy
    from search.space import Space
    from cubic.codesign.campaign import Campaign
    space = Space.model_validate(SPACE)
    def ev(p):
        with open({log!r}, "a") as f:
            f.write(space.key(p) + "\\n")
        time.sleep(0.15)
        return toy(p)
    if sys.argv[1] == "run":
        Campaign(space, ev, strategy="tpe", budget=24, batch_size=3, seed=5, storage={url!r}, name="k").run()
    else:
        Campaign.resume("k", ev, storage={url!r}).run()
""")


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_sigkill_then_resume_loses_and_reruns_no_finished_run(tmp_path):
    log, url = tmp_path / "calls.log", f"sqlite:///{tmp_path}/k.db"
    script = tmp_path / "camp.py"
    script.write_text(KILL_SCRIPT.format(root=str(ROOT), log=str(log), url=url))
    proc = subprocess.Popen([sys.executable, str(script), "run"], cwd=tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline and (not log.exists() or len(log.read_text().split()) < 8):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    study = optuna.load_study(study_name="k", storage=url)
    finished_before = {t.user_attrs["key"] for t in study.trials if "finished_at" in t.user_attrs}
    assert 0 < len(finished_before) < 24
    started_before = len(log.read_text().split())
    subprocess.run([sys.executable, str(script), "resume"], cwd=tmp_path, check=True, timeout=300)
    after = log.read_text().split()[started_before:]
    assert not finished_before & set(after)  # nothing finished was run again
    study = optuna.load_study(study_name="k", storage=url)
    keys = [t.user_attrs["key"] for t in study.trials if "finished_at" in t.user_attrs]
    assert len(keys) == 24 == len(set(keys)) and finished_before <= set(keys)
    assert study.user_attrs["status"] == "finished"
    # the same points as a campaign never interrupted (the run in flight at the kill was retried)
    space = Space.model_validate(SPACE)
    whole = Campaign(space, toy, strategy="tpe", budget=24, batch_size=3, seed=5, name="k")
    assert whole.run().runs == 24
    assert set(keys) == {space.key(o.point) for o in whole.observations()}


def test_campaign_stops_once_the_target_is_reached():
    space = Space.model_validate(SPACE)
    s = Campaign(space, toy, strategy="random", budget=40, batch_size=2, seed=1, target=100.0).run()
    assert s.stop_reason == "target" and s.runs < 40
    assert max(v for v in s.best_so_far if not math.isnan(v)) >= 100.0
    assert all(math.isnan(v) or v < 100.0 for v in s.best_so_far[:-2])  # it stopped within the round it got there


def test_several_objectives_search_the_proxy_with_nsga2():
    space = Space.model_validate({**SPACE, "objectives": [{"metric": "tput"},
                                                          {"metric": "mem", "direction": "minimize"}]})
    c = Campaign(space, toy, strategy=ProxyGuided("nsga2", n_inner=64, families=("xgboost",)), budget=12,
                 batch_size=4)
    s = c.run()
    assert s.runs == 12 and len(c.study.directions) == 2 and c.study.best_trials  # a Pareto front
    assert all(t.user_attrs["predicted"] for t in c.study.trials if t.user_attrs["round"] >= 1)


class _PriorFeaturizer:
    """An analytical model that knows the trend in y (the first of its two columns)."""

    prior_columns = {"tput": 0}

    def __call__(self, point, context):
        return np.array([math.log(100 * (1 + math.log2(point["y"]) / 6)), float(point["y"])])


def test_first_round_follows_the_analytical_prior_then_the_proxy_learns_its_residual():
    space = Space.model_validate({**SPACE, "parameters": [
        {"name": "y", "type": "categorical", "choices": [1, 2, 4, 8, 16, 32, 40, 64], "log": True},
        {"name": "kind", "type": "categorical", "choices": ["a", "b", "c"]}]})

    def f(p):
        return toy({**p, "x": 0.3})

    strat = ProxyGuided("tpe", n_inner=64, families=("ridge",), exploit_share=0.5, prior_design="share")
    c = Campaign(space, f, strategy=strat, budget=8, batch_size=4, seed=3, featurize=_PriorFeaturizer())
    s = c.run()
    first = [t for t in c.study.trials if t.user_attrs["round"] == 0]
    from_prior = [t for t in first if (t.user_attrs["predicted"] or {}).get("source") == "step-model prior"]
    assert len(from_prior) == 2  # half the first batch: the prior's best, the rest random
    # the prior's favourite within the memory bound (y=40 is the largest feasible y) is in it
    assert any(t.params["y"] == 64 or t.params["y"] == 40 for t in from_prior)
    assert s.runs == 8 and s.best_metrics is not None


def test_by_default_the_first_round_is_the_priors_pick_and_its_one_knob_alternatives():
    space = Space.model_validate({**SPACE, "parameters": [
        {"name": "y", "type": "categorical", "choices": [1, 2, 4, 8, 16, 32, 40, 64], "log": True},
        {"name": "kind", "type": "categorical", "choices": ["a", "b", "c"]}]})
    c = Campaign(space, lambda p: toy({**p, "x": 0.3}), strategy=ProxyGuided("local", n_inner=64), budget=8,
                 batch_size=3, seed=3, featurize=_PriorFeaturizer())
    c.run()
    first = [t.params for t in c.study.trials if t.user_attrs["round"] == 0]
    # the prior ranks y alone (kind is invisible to it, memory unknown to it): its pick is y=64, then kind
    # changed alone (the prior sees no difference: first), then y changed alone (one step down, y=40)
    assert first[0]["y"] == 64 and len(first) == 3
    assert [(p["y"], p["kind"] != first[0]["kind"]) for p in first[1:]] == [(64, True), (40, False)]
    assert c.strategy.fit_["family"] == "gp"  # the residual over the prior: a GP's, below PRIOR_GP_BELOW runs


def test_trial_store_and_campaign_storage_share_one_database_and_the_report_joins_by_hashes(tmp_path):
    from sqlalchemy import inspect

    from cubic.codesign.evaluate import RunnerEvaluate
    from cubic.codesign.storage import load_meta
    from cubic.codesign.report import stored_run, winner_job_config
    from cubic.core.store import TrialStore
    from cubic.testing import FastRunner, space, toy_workload

    url = f"sqlite:///{tmp_path}/one.db"
    sp = space()
    store = TrialStore(url)
    ev = RunnerEvaluate(toy_workload(), FastRunner(delay_s=0.0, log=""), sp, steps=1, warmup=0, store=store)
    c = Campaign(sp, ev, name="one", strategy="random", budget=6, batch_size=3, storage=url)
    ev.attach(c)
    assert c.run().runs == 6 and store.count() == 6
    names = set(inspect(store.engine).get_table_names())
    assert {"studies", "trials", "cubic_trials", "cubic_campaigns", "cubic_campaign_leases"} <= names
    runs = [t for t in c.study.trials if "finished_at" in t.user_attrs]
    joined = [stored_run(t, store) for t in runs]
    assert [j.config_hash for j in joined] == [sp.to_config(t.params).content_hash() for t in runs]
    doc = winner_job_config(sp, load_meta(url, "one"), runs, store_url=url)
    assert doc["config"]["batch_size"] == doc["point"]["batch_size"]
    # a store that cannot be opened is an error, not an empty join
    with pytest.raises(SpecError):
        winner_job_config(sp, load_meta(url, "one"), runs, store_url="nosuchdialect://x")


@pytest.mark.slow  # ~16 s (three processes); the fast suite has test_cli_reliability_firststart's first opens
def test_two_processes_opening_a_fresh_sqlite_storage_at_once_both_succeed(tmp_path):
    url = f"sqlite:///{tmp_path}/fresh.db"
    code = ("import sys; sys.path.insert(0, {root!r}); from cubic.codesign.campaign import Campaign;"
            "from tests.test_codesign_campaign import SPACE, toy; from search.space import Space;"
            "Campaign(Space.model_validate(SPACE), toy, strategy='random', budget=2, storage={url!r},"
            " name=sys.argv[1]).run()").format(root=str(ROOT), url=url)
    procs = [subprocess.Popen([sys.executable, "-c", code, f"c{i}"], stderr=subprocess.PIPE, text=True)
             for i in range(3)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errs
    assert not any("alembic_version" in e for e in errs)


def test_a_campaign_whose_creation_was_cut_short_can_be_created_again(tmp_path):
    url = f"sqlite:///{tmp_path}/half.db"
    optuna.create_study(study_name="half", storage=url)  # killed before the settings were written
    space = Space.model_validate(SPACE)
    with pytest.raises(SpecError, match="cut short"):
        Campaign.resume("half", toy, storage=url)
    c = Campaign(space, toy, name="half", strategy="random", budget=3, batch_size=3, storage=url)
    assert c.run().runs == 3 and c.study.directions == [optuna.study.StudyDirection.MAXIMIZE]


def test_a_stale_trial_whose_run_was_recorded_is_not_enqueued_again():
    """A worker killed between writing a run's attributes and ``tell``: the stale trial already
    counts as a run, so re-running its point would duplicate it and lose another point's run."""
    import optuna

    from cubic.codesign.storage import RetryUnrecordedRun

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    recorded, lost = study.ask(), study.ask()
    study._storage.set_trial_user_attr(recorded._trial_id, "finished_at", 1.0)
    retry = RetryUnrecordedRun(max_retry=3)
    retry(study, study._storage.get_trial(recorded._trial_id))
    assert len(study.trials) == 2  # nothing enqueued for the recorded run
    retry(study, study._storage.get_trial(lost._trial_id))
    waiting = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    assert len(waiting) == 1 and waiting[0].system_attrs["failed_trial"] == lost.number


def test_a_lost_workers_recorded_run_is_told_as_recorded_not_failed(tmp_path):
    """Killed between writing a run's attributes and ``tell``: on recovery the trial is told with its
    recorded values (COMPLETE, as in an uninterrupted campaign), not failed by the heartbeat."""
    import socket

    from cubic.codesign.trials import trial_attrs
    from cubic.testing import space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sp = space()
    c = Campaign(sp, lambda p: {}, name="lost", strategy="random", budget=4, batch_size=2,
                 storage=f"sqlite:///{tmp_path}/c.db")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    st = c.study._storage
    recorded, unrecorded, stopped = c.study.ask(), c.study.ask(), c.study.ask()
    point = sp.sample(np.random.default_rng(0))
    result = Result(status="ok", metrics={o.metric: 123.0 for o in sp.objectives})
    for t in (recorded, unrecorded, stopped):
        st.set_trial_system_attr(t._trial_id, "cubic_worker", f"{socket.gethostname()}:{dead.pid}:0")
    for k, v in trial_attrs(point, result, attempts=1, violation=0.0, strategy="random").items():
        st.set_trial_user_attr(recorded._trial_id, k, v)
    pruned = Result.failed("pruned", "stopped early at step 2", metrics={"pruned_step": 2.0})
    for k, v in trial_attrs(point, pruned, attempts=1, violation=0.0, strategy="random").items():
        st.set_trial_user_attr(stopped._trial_id, k, v)
    c._recover_lost()
    told = st.get_trial(recorded._trial_id)
    assert told.state == optuna.trial.TrialState.COMPLETE and told.values == [123.0] * len(sp.objectives)
    # a recorded run a pruner stopped is told as it would have been: PRUNED, not FAIL
    assert st.get_trial(stopped._trial_id).state == optuna.trial.TrialState.PRUNED
    lost = st.get_trial(unrecorded._trial_id)  # lost: the same trial waits to be run again, no FAIL, no copy
    assert lost.state == optuna.trial.TrialState.WAITING and lost.system_attrs["cubic_interrupted"] == 1
    assert len(c.study.get_trials()) == 3


def test_which_trials_are_runs():
    """A run is a trial cubic told (COMPLETE, FAIL, or PRUNED: stopped by a pruner) or one plain
    Optuna wrote; a trial cubic enqueued and never told (failed by the heartbeat, or retired PRUNED
    after repeated interruptions) is not a run."""
    from cubic.codesign.trials import is_run

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    S = optuna.trial.TrialState
    cases = {  # (state, cubic's attributes) -> a run?
        (S.COMPLETE, ("round", "finished_at")): True, (S.FAIL, ("round", "finished_at")): True,
        (S.PRUNED, ("round", "finished_at")): True, (S.FAIL, ()): True, (S.PRUNED, ()): True,
        (S.FAIL, ("round",)): False, (S.PRUNED, ("round", "interrupted")): False,
    }
    for (state, attrs), run in cases.items():
        t = study.ask()
        for a in attrs:
            study._storage.set_trial_user_attr(t._trial_id, a, 1)
        study.tell(t, 1.0 if state == S.COMPLETE else None, state=state)
        assert is_run(study._storage.get_trial(t._trial_id)) is run, (state, attrs)


def test_a_run_taken_back_while_its_worker_was_silent_is_not_told(tmp_path):
    """A silent worker's trial is put back after the heartbeat's grace period and taken by another
    worker: when the silent worker's run finishes it is reported lost, not told, and the study
    counts the point once (the other attempt's). In-process; the slow suite stalls a real worker
    process (SIGSTOP) on PostgreSQL."""
    from cubic.testing import space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    listener, lost = _recording("lost_run")

    storage = f"sqlite:///{tmp_path}/c.db"
    sp = space()
    point = sp.sample(np.random.default_rng(0))
    taken_by_other = {}

    def evaluate(p):  # while this worker runs, its trial is taken back and another worker takes it
        c._requeue(mine._trial_id, seen=mine)
        taken_by_other["t"] = other._take()
        return Result(status="ok", metrics={o.metric: 1.0 for o in sp.objectives})

    c = Campaign(sp, evaluate, name="silent", strategy="random", budget=2, storage=storage, worker="a",
                 listener=listener)
    other = Campaign(sp, lambda p: {}, name="silent", strategy="random", budget=2, storage=storage, worker="b",
                     resume=True)
    c.study.enqueue_trial(point)
    mine = c._take()
    assert mine is not None and c._still_ours(mine)
    assert c._run_one(mine) == (point, None) and lost() == [mine.number]
    now = c.study._storage.get_trial(mine._trial_id)  # the other worker's attempt, untouched
    assert now.state == optuna.trial.TrialState.RUNNING and now.system_attrs["cubic_worker"] == "b"
    assert taken_by_other["t"] is not None and taken_by_other["t"].number == mine.number
    assert "values" not in now.user_attrs and now.values is None


def _two_workers(tmp_path, name: str):
    """Workers a (its lost takes recorded) and b on one SQLite campaign with one enqueued point; each
    run appends its worker to ``ran`` (a's objective 1.0, b's 2.0): (a, b, lost takes, ran)."""
    from cubic.testing import space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    listener, lost = _recording("lost_take")
    storage = f"sqlite:///{tmp_path}/c.db"
    sp = space()
    ran: list[str] = []
    a = Campaign(sp, lambda p: ran.append("a") or {o.metric: 1.0 for o in sp.objectives}, name=name,
                 strategy="random", budget=2, storage=storage, worker="a", listener=listener)
    b = Campaign(sp, lambda p: ran.append("b") or {o.metric: 2.0 for o in sp.objectives}, name=name,
                 strategy="random", budget=2, storage=storage, worker="b", resume=True)
    a.study.enqueue_trial(sp.sample(np.random.default_rng(0)))
    return a, b, lost, ran


def test_a_trial_taken_back_before_its_run_began_is_left_to_the_other_worker(tmp_path):
    """The race the slow suite's SIGSTOP once hit: a worker silent past the grace period between
    taking a trial (the compare-and-set) and writing its claim finds, on waking, the trial told by
    another worker. It neither crashes nor runs the point: a lost take, and the worker goes on."""
    c, other, lost, ran = _two_workers(tmp_path, "silent")
    claim = c._claim

    def silent_then_claim(t):  # the grace period passes here: the trial goes back, b runs and tells it
        c._requeue(t._trial_id)
        theirs = other._take()
        assert theirs is not None and other._run_one(theirs)[1] is not None
        claim(t)

    c._claim = silent_then_claim
    assert c._take() is None and lost() == [0] and ran == ["b"]
    done = c.study._storage.get_trial(c._trials()[0]._trial_id)
    assert done.state == optuna.trial.TrialState.COMPLETE and done.values == [2.0]
    assert done.system_attrs["cubic_worker"] == "b"


def test_a_worker_silent_between_its_take_and_its_params_never_claims_the_other_workers_attempt(tmp_path):
    """The narrow window stops 40-45 carried: a worker silent after its compare-and-set, woken while
    the other worker's attempt (after the trial was taken back) is still running. Its claim used to be
    a separate write after the compare-and-set, so on waking it wrote itself over the other's claim:
    both ran and only one told. The take and the claim are now one transaction (take_trial): the
    woken worker finds the attempt is not its own, runs nothing, and the other worker tells."""
    from cubic.codesign.storage import WORKER_ATTR

    c, other, lost, ran = _two_workers(tmp_path, "window")
    claim, theirs = c._claim, {}

    def silent_while_the_other_runs(t):  # the grace period passes here; b takes it and is still running
        c._requeue(t._trial_id)
        theirs["t"] = other._take()
        assert theirs["t"] is not None
        claim(t)

    c._claim = silent_while_the_other_runs
    assert c._take() is None and lost() == [0] and ran == []
    now = c.study._storage.get_trial(theirs["t"]._trial_id)
    assert now.state == optuna.trial.TrialState.RUNNING and now.system_attrs[WORKER_ATTR] == "b"
    assert other._still_ours(theirs["t"])  # b's attempt is intact: its run counts
    assert other._run_one(theirs["t"])[1] is not None and ran == ["b"]
    done = c.study._storage.get_trial(theirs["t"]._trial_id)
    assert done.state == optuna.trial.TrialState.COMPLETE and done.values == [2.0]


def test_a_trial_taken_back_between_the_check_and_the_tell_is_reported_lost_not_raised(tmp_path):
    from cubic.testing import space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    listener, lost = _recording("lost_run")

    storage = f"sqlite:///{tmp_path}/c.db"
    sp = space()
    c = Campaign(sp, lambda p: {o.metric: 1.0 for o in sp.objectives}, name="late", strategy="random", budget=2,
                 storage=storage, worker="a", listener=listener)
    other = Campaign(sp, lambda p: {o.metric: 2.0 for o in sp.objectives}, name="late", strategy="random",
                     budget=2, storage=storage, worker="b", resume=True)
    c.study.enqueue_trial(sp.sample(np.random.default_rng(0)))
    mine = c._take()
    still = c._still_ours

    def ours_then_taken_back(t):  # the check passes; the grace period passes before the tell
        out = still(t)
        c._still_ours = still  # (once)
        c._requeue(t._trial_id, seen=t)
        theirs = other._take()
        assert theirs is not None and other._run_one(theirs)[1] is not None
        return out

    c._still_ours = ours_then_taken_back
    point, ev = c._run_one(mine)
    assert ev is None and lost() == [mine.number]
    assert c.study._storage.get_trial(mine._trial_id).values == [2.0]


def test_a_campaign_another_process_is_creating_is_not_taken_for_a_creation_cut_short(tmp_path):
    """Two workers starting one campaign at once: the second found the first's study before its
    settings were written, took it for a creation a kill had cut short, and deleted it under the
    first (which failed with Optuna's "Record does not exist"; the reliability run's first-start
    check on PostgreSQL, stop 39). Creation is now under the storage's lock: the second waits, then
    finds the campaign made, and says it exists (a worker then resumes it)."""
    import threading

    from cubic.codesign.storage import META_KEY, creation_lock, open_storage
    from cubic.core.spec import SpecError
    from cubic.testing import space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path}/c.db"
    sp = space()
    st = open_storage(url)
    out: dict = {}

    def second():
        try:
            Campaign(sp, lambda p: {}, name="shared", strategy="random", budget=2, storage=url)
            out["made"] = True
        except SpecError as e:
            out["error"] = str(e)

    with creation_lock(st):  # the first process, mid-creation: its study exists, its settings not yet
        first = optuna.create_study(study_name="shared", storage=st, directions=["maximize"])
        t = threading.Thread(target=second)
        t.start()
        t.join(1.5)
        assert t.is_alive() and not out  # waits: does not delete what is being made
        first.set_user_attr(META_KEY, {"note": "made by the first"})
    t.join(30)
    assert "exists" in out.get("error", ""), out
    kept = optuna.load_study(study_name="shared", storage=st)
    assert kept._study_id == first._study_id and kept.user_attrs[META_KEY] == {"note": "made by the first"}
    # a creation that was cut short (no process holds the lock) is still made afresh
    optuna.create_study(study_name="cut", storage=st)
    Campaign(sp, lambda p: {}, name="cut", strategy="random", budget=2, storage=url)
    assert META_KEY in optuna.load_study(study_name="cut", storage=st).user_attrs


def _recording(event: str):
    """A listener and a reader of the trial numbers one of its events (lost_run, lost_take) reported."""
    from cubic.testing import recording_listener

    rec = recording_listener()
    return rec, lambda: [args[1] for args in rec.heard(event)]


class _InvalidAboveFeaturizer:
    """A prior that rates large y best but gives no throughput (NaN: an invalid configuration by its own
    rules, as a 2D group larger than the cluster) from y = 32 up, where runs fail as invalid."""

    prior_columns = {"tput": 0}

    def __call__(self, point, context):
        y = point["y"]
        return np.array([math.nan if y >= 32 else math.log(100 * (1 + math.log2(y) / 3)), float(y)])


def test_the_proxys_rounds_do_not_propose_what_the_prior_marks_invalid():
    """The first round keeps to configurations the prior gives a throughput; so do the rounds after it
    (before stop 80 the proxy proposed the invalid ones until the runs' classifier had learned them)."""
    space = Space.model_validate({**SPACE, "constraints": [], "parameters": [
        {"name": "y", "type": "categorical", "choices": [1, 2, 4, 8, 16, 32, 40, 64], "log": True},
        {"name": "kind", "type": "categorical", "choices": ["a", "b", "c"]}]})

    def f(p):
        if p["y"] >= 32:
            return Result.failed("invalid", "group larger than the cluster")
        return {"tput": 100 * (1 + math.log2(p["y"]) / 6) * {"a": 1.0, "b": 1.2, "c": 0.8}[p["kind"]]}

    c = Campaign(space, f, strategy=ProxyGuided("local", n_inner=64), budget=15, batch_size=3, seed=3,
                 featurize=_InvalidAboveFeaturizer())
    c.run()
    assert [t.params["y"] for t in c.study.trials if t.params["y"] >= 32] == []
    assert len(c.study.trials) == 15  # the budget went to the 15 valid configurations
