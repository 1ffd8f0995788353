"""SIGKILL a running campaign process at random moments and resume it each time.

`make test` runs the reduced form: 2 kills (a campaign of 16 runs); experiments/reliability.py
runs the full form (24 kills by default). At the end every finished run is in the Optuna storage
and in the trial store exactly once, both SQLite files pass PRAGMA integrity_check, and the
campaign equals one that was never interrupted (same seed: same points, same outcomes)."""

from experiments.reliability import kill_resume


def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_campaign(tmp_path):
    out = kill_resume(tmp_path, kills=2, budget=16, batch=4, max_wait_s=0.5, rng_seed=3)
    assert out["kills"] == 2 and not out["finished_before_all_kills"]
    assert out["trials"] == 16 and out["lost_trials"] == 0 and out["duplicated_trials"] == 0
    assert out["store"] == {"store_trials": 16, "lost": 0, "duplicates": 0, "orphans": 0}
    assert out["integrity_check"] == {"campaigns.db": "ok", "trials.db": "ok"}
    assert out["equals_uninterrupted"], out["differences"]
    assert out["best_point"] == out["best_point_uninterrupted"] and out["status"] == "finished"
    # a finished run is served from the store on resume, never redone: only runs in flight are
    assert 0 <= out["evaluations_redone_after_kills"] <= out["kills"]
