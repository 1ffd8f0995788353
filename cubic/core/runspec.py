"""Where and how a run happens, as one typed value: the run spec.

A campaign stores it (as ``context["runner"]``) so that resuming, a worker or the report rebuild the
same runner; the proxy's features and the step-model prior depend on it (:meth:`RunSpec.cache_key`);
a Runner built from it answers :meth:`cubic.runners.local.Runner.cache_key` with the same key. Every
reader of a campaign's runner settings goes through :meth:`RunSpec.from_context`, never through the
dict itself, so that no two readers can disagree about a field (``--device cuda:0`` and repeats,
say).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from cubic.core.spec import (MAX_CONFIRM_REPEATS, MAX_REPEATS, MAX_STEPS, MAX_THREADS, MAX_WORLD_SIZE, Frozen,
                              parse_model, stable_hash)

RunnerKind = Literal["local", "distributed", "simulated", "torchrec", "command"]


class RunSpec(Frozen):
    kind: RunnerKind = "local"
    device: str = Field(default="auto", description="torch device of local runs: auto, cpu, cuda, cuda:1")
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS,
                                description="intra-op threads (None: torch's default)")
    world_size: int = Field(default=1, ge=1, le=MAX_WORLD_SIZE, description="processes of a distributed run")
    launcher: Literal["spawn", "torchrun"] = "spawn"
    simulate: str | None = Field(default=None, description="simulated cluster, e.g. h100x64")
    steps: int = Field(default=20, ge=1, le=MAX_STEPS)
    warmup: int = Field(default=3, ge=0, le=MAX_STEPS)
    timeout: float = Field(default=300.0, gt=0)
    repeats: int = Field(default=1, ge=1, le=MAX_REPEATS)
    remeasure: bool = False
    confirm_repeats: int | None = Field(default=None, ge=0, le=MAX_CONFIRM_REPEATS)
    ray: bool = False
    ray_address: str | None = None
    cpus_per_trial: float = Field(default=1.0, gt=0)
    gpus_per_trial: float = Field(default=0.0, ge=0)

    @classmethod
    def from_context(cls, context: dict[str, Any] | None) -> "RunSpec":
        """The run spec stored in a campaign's context (``context["runner"]``); unknown keys are an error."""
        raw = dict((context or {}).get("runner") or {})
        raw = {k: v for k, v in raw.items() if v is not None}
        return parse_model(cls, raw, source="campaign context")

    @property
    def ranks(self) -> int:
        """Ranks of the run: the distributed world size, the simulated cluster's size, else 1."""
        if self.kind == "distributed":
            return self.world_size
        tail = str(self.simulate or "").rsplit("x", 1)[-1]
        return int(tail) if self.kind == "simulated" and tail.isdigit() else self.world_size

    def resolved_device(self) -> str:
        """The device type runs land on (``auto`` resolved here; ``cuda:1`` -> ``cuda``)."""
        if self.kind == "simulated":
            return "simulated"
        device = self.device
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        return device.split(":", 1)[0]

    def cache_key(self) -> str:
        """What a run's figures depend on besides (workload, config) and the machine: where and how
        it ran. Two specs with the same key measure the same thing."""
        return stable_hash({"kind": self.kind, "device": self.resolved_device(), "threads": self.threads,
                            "ranks": self.ranks, "launcher": self.launcher if self.kind == "distributed" else None,
                            "simulate": self.simulate})
