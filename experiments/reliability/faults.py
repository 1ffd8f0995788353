"""Injected faults in a campaign: what each becomes, and that the campaign goes on."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cubic.runners.local import Runner
from cubic.testing import SPACE, stand_in_runner, tiny_workload



def fault_campaign(runner: Runner, workdir: str | Path, budget: int = 8, max_retries: int = 2,
                   steps: int = 2) -> dict[str, Any]:
    """A campaign over ``runner`` (faults per point); what each fault became and whether the
    campaign went on. Needs CUBIC_ALLOW_FAULTS=1 for the real runner's faults."""
    from cubic.codesign.campaign import Campaign
    from cubic.codesign.evaluate import RunnerEvaluate
    from cubic.codesign.trials import trial_observation
    from cubic.core.store import TrialStore
    from search.space import Space

    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    sp = Space.model_validate({**SPACE, "parameters": [
        {"name": "batch_size", "type": "int", "low": 32, "high": 256, "step": 32},
        {"name": "seed", "type": "int", "low": 0, "high": 3}]})
    store = TrialStore(f"sqlite:///{wd}/trials.db")
    ev = RunnerEvaluate(tiny_workload(), runner, sp, steps=steps, warmup=0, store=store)
    c = Campaign(sp, ev, name="faults", strategy="random", budget=budget, batch_size=4, seed=1,
                 storage=f"sqlite:///{wd}/campaigns.db", max_retries=max_retries)
    ev.attach(c)
    t0 = time.monotonic()
    summary = c.run()
    kinds: dict[str, Any] = {}
    kind_of = getattr(runner, "kind_of", {})
    for t in c.study.get_trials(deepcopy=False):
        cfg_hash = sp.to_config(dict(t.params)).content_hash()
        injected = kind_of.get(cfg_hash)
        obs = trial_observation(t, {})
        rows = [r for r in store.trials(campaign="faults") if r.config_hash == cfg_hash]
        kinds[injected or "none"] = {
            "recorded_as": t.user_attrs.get("failure_kind") or "ok",
            "reason": (t.user_attrs.get("reason") or "")[:160],
            "attempts": t.user_attrs.get("attempts"),
            "store_rows": [(r.status, r.failure_kind) for r in rows],
            "search_sees_infeasible": not obs.feasible,
        }
    keys = [t.user_attrs["key"] for t in c.study.get_trials(deepcopy=False)]
    return {"budget": budget, "runs": summary.runs, "status": c.study.user_attrs.get("status"),
            "max_retries": max_retries, "reproposed": len(keys) - len(set(keys)), "by_kind": kinds,
            "elapsed_s": round(time.monotonic() - t0, 1)}


def ray_node_lost(workdir: str | Path, delay_s: float = 15.0) -> dict[str, Any]:
    """A local Ray cluster (ray.cluster_utils.Cluster: a head that runs no tasks and one worker
    node, real raylets on this machine); a campaign of 2 runs through RayRunner; the worker node is
    removed while the first run is on it and another node joins. What the lost run became, and
    whether the campaign counted it as the configuration's failure. Call from the main thread (Ray
    starts and stops nodes only there); the campaign runs in a thread."""
    import threading

    import ray
    from ray.cluster_utils import Cluster

    from cubic.codesign.campaign import Campaign
    from cubic.codesign.evaluate import RunnerEvaluate
    from cubic.core.workloads import DEFAULT_WORKLOADS
    from cubic.runners.ray_runner import RayRunner
    from search.space import Space

    marker = Path(workdir) / "running"
    Path(workdir).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        node = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        space = Space.model_validate({"parameters": [{"name": "batch_size", "type": "categorical",
                                                      "choices": [64, 128]}]})
        ev = RunnerEvaluate(DEFAULT_WORKLOADS["dlrm-small"],
                            RayRunner(stand_in_runner(str(marker), delay_s), address=cluster.address, num_cpus=1,
                                      timeout_s=300), space, steps=1, warmup=0)
        c = Campaign(space, ev, strategy="random", budget=2, batch_size=1, max_retries=2)
        done: dict[str, Any] = {}
        th = threading.Thread(target=lambda: done.setdefault("summary", c.run()))
        th.start()
        deadline = time.monotonic() + 240
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        reached = marker.exists()
        if reached:
            cluster.remove_node(node)  # the node is lost with the run on it ...
            cluster.add_node(num_cpus=1)  # ... and the cluster manager brings up another
        th.join(timeout=600)
        trials = sorted(c.study.get_trials(deepcopy=False), key=lambda t: t.number)
        return {"run_reached_the_node": reached, "runs": done["summary"].runs if "summary" in done else None,
                "states": [t.state.name for t in trials], "attempts": [t.user_attrs.get("attempts") for t in trials],
                "failure_kinds": [t.user_attrs.get("failure_kind") for t in trials],
                "wall_s": round(time.monotonic() - t0, 1)}
    finally:
        ray.shutdown()
        cluster.shutdown()
