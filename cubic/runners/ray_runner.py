"""Validation runs on Ray: each run a Ray task with its own resources.

``RayRunner(inner, address=None, num_cpus=1, num_gpus=0)`` is a Runner: ``run()`` ships the
workload and config to a Ray worker, where ``inner`` (a LocalRunner, or the simulated cluster)
makes the run, and brings the Result back. A campaign with ``workers=k`` thus keeps k runs in
flight across the cluster, each holding the CPUs/GPUs asked for; Ray's scheduler places them.
``address`` joins an existing cluster (``ray start --head`` elsewhere; "auto" for the local one);
None starts a private local instance. A lost worker or node comes back as a transient failure
(``killed``), which the campaign retries; Ray never raises into the campaign.

"""

from __future__ import annotations

import time
from typing import Any

from cubic.core.result import Result

try:
    from cubic.runners.base import Runner
except ModuleNotFoundError as _e:  # the runner module lands separately; RayRunner works without the ABC
    if _e.name != "cubic.runners.local":
        raise
    Runner = object  # type: ignore[assignment,misc]


def _ensure_ray(address: str | None, num_cpus: float | None = None):
    import ray

    if not ray.is_initialized():
        kw: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": False, "include_dashboard": False}
        if address:
            kw["address"] = address
        elif num_cpus:
            kw["num_cpus"] = int(max(1, num_cpus))
        ray.init(**kw)
    return ray


def _remote_run(inner, workload_json: str, config_json: str, steps: int, warmup: int) -> str:
    """Executed on a Ray worker: rebuild the value objects and let the inner runner make the run."""
    from cubic.core.config import Config
    from cubic.core.spec import Workload

    wl = Workload.model_validate_json(workload_json)
    cfg = Config.model_validate_json(config_json)
    return inner.run(wl, cfg, steps=steps, warmup=warmup).model_dump_json()


class RayRunner(Runner):  # type: ignore[misc,valid-type]
    def __init__(self, inner, address: str | None = None, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 timeout_s: float | None = None):
        self.inner = inner
        self.address = address
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.timeout_s = timeout_s if timeout_s is not None else getattr(inner, "timeout_s", 600.0) + 120.0
        self.source = getattr(inner, "source", "measured")

    def fingerprint_hash(self) -> str | None:
        """Unknown before the run for a measured run (the worker's machine decides): no store serving."""
        own = getattr(self.inner, "fingerprint_hash", None)
        return own() if callable(own) and self.source == "simulated" else None

    def run(self, workload, config, *, steps: int = 50, warmup: int = 5, progress=None) -> Result:
        t0 = time.perf_counter()
        common = dict(source=self.source, workload=workload.name, workload_hash=workload.content_hash(),
                      config_hash=config.content_hash(), seed=config.seed)
        try:
            ray = _ensure_ray(self.address)
            task = ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_retries=0)(_remote_run)
            ref = task.remote(self.inner, workload.model_dump_json(), config.model_dump_json(), steps, warmup)
            out = ray.get(ref, timeout=self.timeout_s)
        except Exception as e:  # every Ray failure is a failed run; lost workers/nodes may succeed next time
            import ray.exceptions as rex

            name = type(e).__name__
            if isinstance(e, rex.GetTimeoutError):
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # already gone
                    pass
                kind = "timeout"
            elif isinstance(e, (rex.WorkerCrashedError, rex.NodeDiedError, rex.RaySystemError,
                                rex.ObjectLostError, ConnectionError)):
                kind = "killed"
            else:
                kind = "error"
            return Result.failed(kind, f"ray: {name}: {' '.join(str(e).split())[:1500]}",
                                 wall_time_s=time.perf_counter() - t0, **common)
        res = Result.model_validate_json(out)
        res.extra.setdefault("ray", {"address": self.address or "local", "num_cpus": self.num_cpus,
                                     "num_gpus": self.num_gpus})
        return res
