"""Validation runs on Ray: each run a Ray task with its own resources.

``RayRunner(inner, address=None, num_cpus=1, num_gpus=0)`` is a Runner: ``run()`` ships the
workload and config to a Ray worker, where ``inner`` (a LocalRunner, or the simulated cluster)
makes the run, and brings the Result back. A campaign with ``workers=k`` thus keeps k runs in
flight across the cluster, each holding the CPUs/GPUs asked for; Ray's scheduler places them.
``address`` joins an existing cluster (``ray start --head`` elsewhere; "auto" for the local one);
None starts a private local instance. A lost worker or node comes back as a transient failure
(``killed``), which the campaign retries; Ray never raises into the campaign.

A run that never gets a node (no node with the resources asked for, none joining within
``start_timeout_s``) is an infrastructure fault, not the configuration's: it comes back as
``killed`` (retried) with a reason saying so, never as the configuration's ``timeout``. The run's
own ``timeout_s`` counts from the moment it starts on a worker (the task is a Ray generator that
yields once when it starts, then the Result).

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


def check_address(address: str) -> None:
    """Join the Ray cluster at ``address`` now, before a campaign starts: a malformed or unreachable
    address is bad input (one line naming --ray-address), not a failed run per configuration."""
    import socket

    from cubic.core.spec import SpecError

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if sep and host and port.isdigit():  # Ray waits minutes on an address where nothing answers: 5 s here
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except (OSError, ValueError, OverflowError) as e:
            raise SpecError(f"nothing answers at {address} ({getattr(e, 'strerror', None) or e}): is the Ray head "
                            "running there (`ray start --head`)?", field="--ray-address") from None
    try:
        _ensure_ray(address)
    except Exception as e:  # noqa: BLE001 - whatever Ray raises, one line
        raise SpecError(f"cannot join a Ray cluster there: {type(e).__name__}: {' '.join(str(e).split())[:300]}",
                        field="--ray-address") from None


def _remote_run(inner, workload_json: str, config_json: str, steps: int, warmup: int):
    """Executed on a Ray worker (a generator task): "started" as soon as it holds a node, then the
    inner runner's Result (JSON) from the rebuilt value objects."""
    yield "started"
    from cubic.core.config import Config
    from cubic.core.spec import Workload

    wl = Workload.model_validate_json(workload_json)
    cfg = Config.model_validate_json(config_json)
    yield inner.run(wl, cfg, steps=steps, warmup=warmup).model_dump_json()


def _cancel(ray, gen) -> None:
    try:
        ray.cancel(gen, force=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


def _resources(ray) -> dict[str, float]:
    try:
        return {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
    except Exception:  # noqa: BLE001 - a figure for the message only
        return {}


class RayRunner(Runner):  # type: ignore[misc,valid-type]
    def __init__(self, inner, address: str | None = None, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 timeout_s: float | None = None, start_timeout_s: float = 300.0):
        self.inner = inner
        self.start_timeout_s = start_timeout_s  # waiting for a node (an autoscaler may be adding one)
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
        except Exception as e:  # noqa: BLE001 - no cluster to run on: not this configuration's failure
            # (it was an "error" of the config: stored, then served to every later campaign as its result)
            return Result.failed("killed", f"ray: cannot reach the Ray cluster at {self.address or 'a local instance'}:"
                                 f" {type(e).__name__}: {' '.join(str(e).split())[:500]}; an infrastructure fault, "
                                 "not this configuration's", wall_time_s=time.perf_counter() - t0, **common)
        try:
            task = ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_retries=0)(_remote_run)
            gen = task.remote(self.inner, workload.model_dump_json(), config.model_dump_json(), steps, warmup)
            if not ray.wait([gen], timeout=self.start_timeout_s)[0]:
                _cancel(ray, gen)
                return Result.failed(
                    "killed", f"ray: the run never started: no node gave it {self.num_cpus:g} CPU and "
                    f"{self.num_gpus:g} GPU within {self.start_timeout_s:.0f} s (cluster resources now: "
                    f"{_resources(ray)}); an infrastructure fault, not this configuration's",
                    wall_time_s=time.perf_counter() - t0, **common)
            ray.get(next(gen))  # "started" (or the error that ended the task before it could start)
            if not ray.wait([gen], timeout=self.timeout_s)[0]:
                _cancel(ray, gen)
                return Result.failed("timeout", f"ray: no result within {self.timeout_s:.0f} s of the run's start",
                                     wall_time_s=time.perf_counter() - t0, **common)
            out = ray.get(next(gen))
        except Exception as e:  # every Ray failure is a failed run; lost workers/nodes may succeed next time
            import ray.exceptions as rex

            name = type(e).__name__
            if isinstance(e, (rex.WorkerCrashedError, rex.NodeDiedError, rex.RaySystemError,
                              rex.ObjectLostError, ConnectionError, StopIteration)):
                kind = "killed"  # (StopIteration: the task ended without its Result: its worker went away)
            else:
                kind = "error"
            return Result.failed(kind, f"ray: {name}: {' '.join(str(e).split())[:1500]}",
                                 wall_time_s=time.perf_counter() - t0, **common)
        res = Result.model_validate_json(out)
        res.extra.setdefault("ray", {"address": self.address or "local", "num_cpus": self.num_cpus,
                                     "num_gpus": self.num_gpus})
        return res
