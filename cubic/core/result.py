"""What a run returns: measured or simulated, ok or failed with a reason. Failed runs are data."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

FailureKind = Literal["oom", "timeout", "nan", "error", "killed", "invalid", "pruned"]  # pruned: stopped early by a pruner
# Failures that another attempt may not repeat; the rest are properties of the config.
TRANSIENT_FAILURES: frozenset[str] = frozenset({"timeout", "killed"})


class Result(BaseModel):
    version: Literal[1] = 1
    status: Literal["ok", "failed"]
    source: Literal["measured", "simulated"] = "measured"
    failure_kind: FailureKind | None = None
    reason: str | None = None
    workload: str = ""
    workload_hash: str = ""
    config_hash: str = ""
    seed: int = 0
    # headline figures: examples_per_s, step_time_median_ms, step_time_p90_ms, peak_mem_bytes,
    # loss_start, loss_end, ne_start, ne_end; the run's own intervals examples_per_s_ci_lo/_hi,
    # step_time_ci_lo_ms/_hi_ms; what it shared the machine with: load_avg_1m, cpu_util (cubic.core.stats).
    # A Result pooled over repeats (cubic.core.stats.pool) carries the pooled figures, their 95%
    # intervals under the same names, and repeats / repeats_contended; extra["pooled"] says how.
    metrics: dict[str, float] = Field(default_factory=dict)
    # per-phase time per step in ms: embedding_fwd, embedding_bwd, dense_fwd, dense_bwd, optimizer, communication
    phases_ms: dict[str, float] = Field(default_factory=dict)
    trajectory: list[dict[str, float]] = Field(default_factory=list, description="[{step, loss, ne}]")
    fingerprint: dict[str, Any] = Field(default_factory=dict)
    fingerprint_hash: str = ""
    versions: dict[str, str] = Field(default_factory=dict)
    wall_time_s: float = 0.0
    extra: dict[str, Any] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def transient(self) -> bool:
        return self.status == "failed" and self.failure_kind in TRANSIENT_FAILURES

    @classmethod
    def failed(cls, kind: FailureKind, reason: str, **kw: Any) -> "Result":
        return cls(status="failed", failure_kind=kind, reason=reason[:2000], **kw)


class RunInterrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM ended a run: carries its ``killed`` Result so the caller can record it before
    the interrupt goes on (an interrupted run is a transient failure, never an ``error``)."""

    def __init__(self, result: Result):
        super().__init__(result.reason or "interrupted")
        self.result = result
