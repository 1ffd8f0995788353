"""The co-design config: everything a run needs beyond the workload, with a stable content hash.

It is the unit a campaign proposes and a runner measures. Fields owned by sharding and FP8 work
are validated here for shape only; the runner rejects what it cannot yet execute, with a reason.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_serializer

from cubic.core.recipes import TORCHAO_RECIPES
from cubic.core.spec import (
    EmbeddingOptimizer,
    Frozen,
    SpecError,
    Workload,
    parse_model,
    read_structured,
    spec_error_from_validation,
    stable_hash,
)

CONFIG_VERSION = 1
ModelKnob = int | float | str | bool | list[int]
INT64_MAX = 2**63 - 1  # the trial store's integer columns (seed) and PostgreSQL's JSON integers


def _storable(value: Any) -> None:
    """Raise when a value (nested in dicts/lists too) cannot be stored: an integer outside int64,
    or a non-finite float (JSON has no NaN/inf)."""
    if isinstance(value, BaseModel):
        return  # validated as a model of its own
    if isinstance(value, bool):
        return
    if isinstance(value, int) and not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ValueError(f"integer {value} is outside the 64-bit range the trial store holds")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number")
    if isinstance(value, dict):
        for v in value.values():
            _storable(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _storable(v)


class Storable(Frozen):
    """Every field storable in the trial store, checked when a config is loaded (not at the store
    write, after the run)."""

    @field_validator("*", mode="after")
    @classmethod
    def _check_storable(cls, value: Any) -> Any:
        _storable(value)
        return value


class ShardingChoice(Storable):
    """Which plan the embedding tables use: a planner by name, or an explicit plan (sharding/)."""

    planner: str = Field(default="none", description="'none' (single rank, all tables local) or a planner name")
    group_size: int | None = Field(default=None, ge=1, le=INT64_MAX, description="2D sparse parallelism: ranks per model-parallel group")
    plan: dict[str, Any] | None = Field(default=None, description="an explicit plan document (sharding plan schema)")
    # 2D replica synchronisation (simulated runs: the step model's emb_sync / emb_sync_interval, and the
    # measured NE cost the simulator reports for it); left out of the dump when unset, so the content
    # hashes of configs written before these fields existed do not change
    sync: Literal["gradients", "weights"] | None = Field(
        default=None, description="2D replica sync: per-step touched-row gradients or periodic weight averaging")
    sync_interval: int | None = Field(default=None, ge=1, le=1_000_000,
                                      description="steps between 2D weight syncs (sync='weights')")

    @model_serializer(mode="wrap")
    def _omit_unset_sync(self, handler):
        out = handler(self)
        for k in ("sync", "sync_interval"):
            if isinstance(out, dict) and out.get(k) is None:
                out.pop(k, None)
        return out


class FP8Choice(Storable):
    """Where FP8 is used (fp8/): off, everywhere, by an accuracy budget, or an explicit placement."""

    policy: Literal["off", "all", "budget", "placement"] = "off"
    # the FP8 recipes of fp8/recipes.py that run as a real FP8 GEMM (block recipes are placement-only)
    recipe: Literal[TORCHAO_RECIPES] = "tensorwise"  # type: ignore[valid-type]
    budget_sqnr_db: float | None = Field(default=None, gt=0.0, le=200.0)
    placement: dict[str, Any] | None = Field(default=None, description="a placement document (fp8 placement schema)")


class OptimizerChoice(Storable):
    """Overrides of the workload's ``optimizers`` (unset fields keep the workload's); left out of the
    dump when unset, so the content hashes of configs written before it existed do not change."""

    embedding: EmbeddingOptimizer | None = None
    embedding_lr: float | None = Field(default=None, gt=0.0, le=10.0)

    def overrides(self) -> dict[str, Any]:
        return {k: v for k, v in (("embedding", self.embedding), ("embedding_lr", self.embedding_lr)) if v is not None}


class Kernels(Storable):
    embedding: Literal["auto", "fbgemm", "torch"] = "auto"
    dense_dtype: Literal["fp32", "bf16"] = "fp32"


class Config(Storable):
    version: Literal[1] = CONFIG_VERSION
    batch_size: int | None = Field(default=None, ge=1, le=10_000_000, description="overrides the workload's batch")
    sharding: ShardingChoice = ShardingChoice()
    fp8: FP8Choice = FP8Choice()
    kernels: Kernels = Kernels()
    model: dict[str, ModelKnob] = Field(default_factory=dict, description="overrides of dense_arch knobs")
    seed: int = Field(default=0, ge=0, le=INT64_MAX)
    optimizers: OptimizerChoice = Field(default_factory=OptimizerChoice, description="overrides of the workload's optimizers")

    @model_serializer(mode="wrap")
    def _omit_unset_optimizers(self, handler):
        out = handler(self)
        if isinstance(out, dict) and not self.optimizers.overrides():
            out.pop("optimizers", None)
        return out

    def content_hash(self) -> str:
        return stable_hash(self.model_dump(mode="json"))

    def apply(self, workload: Workload, source: str | None = None) -> Workload:
        """The workload as this config runs it: batch size and model knobs applied, re-validated.
        A value the workload refuses is named as the config field that set it (in ``source``, the
        config file, when given): ``model.bottom_mlp.0``, not the workload's ``dense_arch.dlrm...``."""
        data = workload.model_dump(mode="json")
        if self.batch_size is not None:
            data["batch_size"] = self.batch_size
        if self.optimizers.overrides():
            data["optimizers"] = {**data["optimizers"], **self.optimizers.overrides()}
        if self.model:
            arch = dict(data["dense_arch"])
            for key, value in self.model.items():
                if key == "kind" or key not in arch:
                    known = sorted(k for k in arch if k != "kind")
                    raise SpecError(f"unknown knob for {arch['kind']} (known: {', '.join(known)})",
                                    source=source, field=f"model.{key}")
                arch[key] = value
            data["dense_arch"] = arch
        try:
            return Workload.model_validate(data)
        except Exception as e:  # pydantic ValidationError
            from pydantic import ValidationError

            if isinstance(e, ValidationError):
                err = spec_error_from_validation(e)
                raise SpecError(str(err)[len(err.field) + 2:] if err.field else str(err),
                                source=source or "config", field=self._field_of(err.field)) from None
            raise

    def _field_of(self, loc: str | None) -> str | None:
        """The config field behind a workload field path (``dense_arch.<kind>.<knob>...`` -> ``model.<knob>...``)."""
        parts = (loc or "").split(".")
        if parts[0] == "dense_arch" and self.model:
            rest = parts[2:] if len(parts) > 1 else []
            return ".".join(["model"] + rest) if rest and rest[0] in self.model else "model"
        return loc


class JobConfig(Storable):
    """A user's job (``cubic campaign run --objective``) as the trial store keys its runs: the
    command line (template, launcher, processes: the "workload") and the values filled into it
    (the "config"). ``kind`` tells a stored job row from a cubic Config."""

    kind: Literal["job"] = "job"
    command: str = Field(min_length=1, max_length=10_000)
    launcher: str | None = Field(default=None, max_length=10_000)
    nproc: int = Field(default=1, ge=1, le=1_000_000)
    values: dict[str, Any] = Field(default_factory=dict)
    seed: int = Field(default=0, ge=0, le=INT64_MAX)  # the store's seed column (a job's seed is one of its values)

    def job_hash(self) -> str:
        """The command line's hash: the store's workload hash of every run of this job."""
        return stable_hash({"command": self.command, "launcher": self.launcher, "nproc": self.nproc})

    def content_hash(self) -> str:
        """The command line and the values: the store's config hash of one point of this job."""
        return stable_hash(self.model_dump(mode="json"))


def load_config(path: str) -> Config:
    return parse_model(Config, read_structured(path), source=str(path))
