"""A campaign stopped by Ctrl-C, or whose coordinator vanished, does not list as running."""

import time

import optuna
import pytest

from cubic.codesign.campaign import Campaign
from cubic.codesign.storage import _LEASES, list_campaigns, open_storage, Lease
from search.space import Space

SPACE = Space.model_validate({"name": "toy", "parameters": [{"name": "x", "type": "int", "low": 0, "high": 99}],
                              "objectives": [{"metric": "tput"}]})


def _status(url: str, name: str) -> str:
    return {r["name"]: r["status"] for r in list_campaigns(url)}[name]


def test_ctrl_c_marks_the_campaign_interrupted_and_resume_finishes_it(tmp_path):
    url = f"sqlite:///{tmp_path}/c.db"
    calls = []

    def evaluate(p):
        calls.append(p)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as Ctrl-C arrives in the middle of a run
        return {"tput": float(p["x"])}

    c = Campaign(SPACE, evaluate, name="ci", strategy="random", budget=6, batch_size=2, storage=url)
    with pytest.raises(KeyboardInterrupt):
        c.run()
    assert _status(url, "ci") == "interrupted"
    assert optuna.load_study(study_name="ci", storage=url).user_attrs["stop_reason"] == "interrupted"
    resumed = Campaign.resume("ci", lambda p: {"tput": float(p["x"])}, storage=url)
    assert resumed.run().runs == 6
    assert _status(url, "ci") == "finished"


def test_a_running_campaign_whose_lease_lapsed_lists_as_interrupted(tmp_path):
    from sqlalchemy import insert, update

    url = f"sqlite:///{tmp_path}/s.db"
    c = Campaign(SPACE, lambda p: {"tput": 1.0}, name="stale", strategy="random", budget=2, storage=url)
    c.study.set_user_attr("status", "running")  # as left by a coordinator killed with SIGKILL
    st = open_storage(url)
    Lease(st, "stale", "other-host:1:1")  # creates the lease table
    with st.engine.begin() as conn:
        conn.execute(insert(_LEASES).values(campaign="stale", holder="other-host:1:1", expires_at=time.time() + 60))
    assert _status(url, "stale") == "running"  # a live lease on another machine: running there
    with st.engine.begin() as conn:
        conn.execute(update(_LEASES).values(expires_at=time.time() - 1))  # no renewal within the lease time
    assert _status(url, "stale") == "interrupted"
    with st.engine.begin() as conn:  # a holder on this host whose process is gone: no need to wait
        conn.execute(update(_LEASES).values(holder=f"{__import__('socket').gethostname()}:999999999:1",
                                            expires_at=time.time() + 60))
    assert _status(url, "stale") == "interrupted"
