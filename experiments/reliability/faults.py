"""Injected faults in a campaign: what each becomes, and that the campaign goes on."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cubic.runners.local import Runner
from cubic.testing import SPACE, tiny_workload



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
