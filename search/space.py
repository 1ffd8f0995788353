"""Co-design search spaces: a YAML schema of parameters, objectives and constraints.

A space is what a campaign may vary. Parameters are categorical, int, float (optionally
log-scaled) and may be conditional (``when``: exist only when another parameter has one of some
values). Objectives name result metrics to maximize or minimize; constraints bound result metrics
(memory per device, minimum quality) and make a point infeasible when violated.

Schema (``version: 1``)::

    version: 1
    name: cpu-default
    objectives:                       # first one is primary
      - {metric: examples_per_s, direction: maximize}
    constraints:
      - {name: memory per device, metric: peak_mem_bytes, max: 8.0e9}
      - {name: minimum quality, metric: ne_end, max: 1.05}
    parameters:
      - {name: batch_size, type: categorical, choices: [256, 512, 1024], log: true}
      - {name: kernels.embedding, type: categorical, choices: [fbgemm, torch]}
      - {name: fp8.policy, type: categorical, choices: ["off", budget]}
      - {name: fp8.budget_sqnr_db, type: float, low: 15, high: 40, when: {fp8.policy: [budget]}}
      - {name: model.num_layers, type: int, low: 1, high: 4, archs: [wukong]}

``archs`` restricts a parameter to workloads whose dense architecture is of that kind
(:meth:`Space.for_workload`).

Shape knobs (``model.*``: layers, widths, embedding dims) change the model, not only how it runs,
so a space tunes them only when asked: ``shape: true`` in the file (or ``cubic campaign run
--tune-shape``); otherwise :meth:`Space.for_workload` leaves them out. With shape on, quality is a
constraint: a run's NE may exceed the default config's NE by at most ``ne_ceiling_pct`` percent
(default 0.1; :meth:`Space.with_ne_ceiling` adds it once that NE is measured). For cubic's own campaigns a parameter name is the dotted path of a
:class:`cubic.core.config.Config` field (``batch_size``, ``kernels.*``, ``sharding.*``, ``fp8.*``,
``model.<knob>``); for any other system names are free and the evaluate function interprets them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from cubic.core.spec import Frozen, SpecError, parse_model, read_structured, stable_hash

SPACE_VERSION = 1
MAX_INT_BOUND = 2**53
MAX_STEPS = 1e15  # a finer float step is continuous in all but name (and Optuna's Decimal arithmetic fails)
DEFAULT_SPACE_PATH = Path(__file__).resolve().parent.parent / "cubic" / "data" / "space-default.yaml"
Value = int | float | str | bool


class Parameter(Frozen):
    name: str = Field(min_length=1, max_length=200)
    type: Literal["categorical", "int", "float"]
    choices: list[Value] | None = None
    low: float | None = Field(default=None, allow_inf_nan=False)
    high: float | None = Field(default=None, allow_inf_nan=False)
    step: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    log: bool = False
    when: dict[str, list[Value]] | None = Field(default=None, description="parent name -> values enabling it")
    archs: list[Literal["dlrm", "wukong", "dmt"]] | None = None

    @model_validator(mode="after")
    def _check(self) -> "Parameter":
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical parameter needs a non-empty 'choices' list")
            if len({repr(c) for c in self.choices}) != len(self.choices):
                raise ValueError("duplicated choices")
            if self.low is not None or self.high is not None:
                raise ValueError("a categorical parameter takes 'choices', not low/high")
            if self.log and not all(_is_number(c) and c > 0 for c in self.choices):
                raise ValueError("log: true needs positive numeric choices")
        else:
            if self.choices is not None:
                raise ValueError(f"an {self.type} parameter takes low/high, not 'choices'")
            if self.low is None or self.high is None:
                raise ValueError(f"an {self.type} parameter needs 'low' and 'high'")
            if not self.low < self.high:
                raise ValueError(f"low ({self.low}) must be below high ({self.high})")
            if self.log and self.low <= 0:
                raise ValueError("log: true needs low > 0")
            if self.log and self.step is not None:
                raise ValueError("log and step cannot be combined (Optuna's rule)")
            if self.type == "int" and (self.low != int(self.low) or self.high != int(self.high)):
                raise ValueError("an int parameter needs integer low/high")
            if self.type == "int" and max(abs(self.low), abs(self.high)) > MAX_INT_BOUND:
                raise ValueError(f"int bounds must lie within +-2**53 ({MAX_INT_BOUND:.3g}), where every "
                                 "integer is exact")
            if self.type == "int" and self.step is not None and self.step != int(self.step):
                raise ValueError("an int parameter needs an integer step")
            if not math.isfinite(self.high - self.low):
                raise ValueError("the range high - low is too wide to represent")
            if self.type == "float" and self.step and (self.high - self.low) / self.step > MAX_STEPS:
                raise ValueError(f"step {self.step:g} cuts the range into more than {MAX_STEPS:.0e} values; "
                                 "leave step out for a continuous parameter")
        return self

    def count(self) -> int | None:
        """Number of values (arithmetic, never by listing them); None for a continuous parameter."""
        if self.type == "categorical":
            return len(self.choices)
        if self.type == "int":
            return (int(self.high) - int(self.low)) // int(self.step or 1) + 1
        if not self.step:
            return None
        return int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1

    @property
    def numeric(self) -> bool:
        """Numbers carry order: such a categorical becomes one ordinal feature, not one-hot."""
        return self.type != "categorical" or all(_is_number(c) for c in self.choices)

    def distribution(self):
        import optuna.distributions as od

        if self.type == "categorical":
            return od.CategoricalDistribution(list(self.choices))
        if self.type == "int":
            return od.IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return od.FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def contains(self, value: Any) -> bool:
        if self.type == "categorical":
            return any(_same_choice(value, c) for c in self.choices)
        if not _is_number(value):
            return False
        if self.type == "int" and value != int(value):
            return False
        return self.low - 1e-12 <= value <= self.high + 1e-12


class Objective(Frozen):
    metric: str = Field(min_length=1)
    direction: Literal["maximize", "minimize"] = "maximize"
    # log: the search models log(value) where positive (throughputs: ratios matter); linear: the value
    scale: Literal["log", "linear"] = "log"


class Constraint(Frozen):
    metric: str = Field(min_length=1)
    name: str = ""
    max: float | None = None
    min: float | None = None

    @model_validator(mode="after")
    def _bound(self) -> "Constraint":
        if self.max is None and self.min is None:
            raise ValueError("a constraint needs 'max' or 'min'")
        return self

    def violation(self, metrics: dict[str, float]) -> float:
        """0 when satisfied (or metric absent), else the relative amount by which it is violated."""
        v = metrics.get(self.metric)
        if v is None or not math.isfinite(v):
            return 0.0
        out = 0.0
        if self.max is not None and v > self.max:
            out = max(out, (v - self.max) / max(abs(self.max), 1e-12))
        if self.min is not None and v < self.min:
            out = max(out, (self.min - v) / max(abs(self.min), 1e-12))
        return out


SHAPE_PREFIX = "model."  # Config.model: overrides of the dense architecture's shape
NE_METRIC = "ne_end"
NE_CEILING_NAME = "NE ceiling"


def is_shape_knob(name: str) -> bool:
    return name.startswith(SHAPE_PREFIX)


class Space(Frozen):
    version: Literal[1] = SPACE_VERSION
    name: str = "space"
    description: str = ""
    objectives: list[Objective] = Field(default_factory=lambda: [Objective(metric="examples_per_s")], min_length=1)
    constraints: list[Constraint] = Field(default_factory=list)
    parameters: list[Parameter] = Field(min_length=1)
    shape: bool = Field(default=False, description="tune the model's shape (model.* knobs); off: left out")
    ne_ceiling_pct: float = Field(default=0.1, gt=0.0, le=100.0, allow_inf_nan=False,
                                  description="with shape on: NE at most this % above the default config's")

    @model_validator(mode="after")
    def _check(self) -> "Space":
        names = [p.name for p in self.parameters]
        for i, p in enumerate(self.parameters):
            if p.name in names[:i]:
                raise ValueError(f"parameters.{i}.name: duplicated parameter {p.name!r}")
            for parent, values in (p.when or {}).items():
                if parent not in names[:i]:
                    raise ValueError(f"parameters.{i}.when: {parent!r} must be a parameter listed before {p.name!r}")
                par = self.parameters[names.index(parent)]
                for v in values:
                    if not par.contains(v):
                        raise ValueError(f"parameters.{i}.when: {v!r} is not a value of {parent!r}")
        return self

    # ---- construction -------------------------------------------------------------------
    def for_workload(self, workload, shape: bool | None = None) -> "Space":
        """The parameters that apply to this workload's dense architecture (``archs``), without the
        shape knobs unless ``shape`` (default: the space's own ``shape``) is on."""
        shape = self.shape if shape is None else shape
        kind = workload.dense_arch.kind
        keep = [p for p in self.parameters if (p.archs is None or kind in p.archs) and (shape or not is_shape_knob(p.name))]
        while True:  # a parameter conditional on one left out goes too (and so on down the chain)
            kept = {p.name for p in keep}
            still = [p for p in keep if all(parent in kept for parent in (p.when or {}))]
            if len(still) == len(keep):
                break
            keep = still
        if not keep:
            raise SpecError("no parameter applies to this workload" + ("" if shape else
                            " without its shape knobs (model.*: tune them with shape: true or --tune-shape)"),
                            source=self.name, field="parameters")
        return self.model_copy(update={"parameters": keep, "name": f"{self.name}/{workload.name}", "shape": shape})

    @property
    def shape_knobs(self) -> list[str]:
        return [p.name for p in self.parameters if is_shape_knob(p.name)]

    def with_ne_ceiling(self, reference_ne: float) -> "Space":
        """The space with the quality constraint of shape tuning: NE <= the default config's NE
        (``reference_ne``) plus ``ne_ceiling_pct`` percent (replacing an earlier NE ceiling)."""
        if not math.isfinite(reference_ne) or reference_ne <= 0:
            raise SpecError(f"the default config's NE is {reference_ne}; no ceiling can be set from it",
                            source=self.name, field="ne_ceiling_pct")
        ceiling = Constraint(metric=NE_METRIC, max=reference_ne * (1 + self.ne_ceiling_pct / 100),
                             name=f"{NE_CEILING_NAME} (+{self.ne_ceiling_pct:g}% over the default config's NE "
                                  f"{reference_ne:.4f})")
        rest = [c for c in self.constraints if not c.name.startswith(NE_CEILING_NAME)]
        return self.model_copy(update={"constraints": [*rest, ceiling]})

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_defaults=False)

    @property
    def param_names(self) -> list[str]:
        return [p.name for p in self.parameters]

    @property
    def primary(self) -> Objective:
        return self.objectives[0]

    # ---- points -----------------------------------------------------------------------
    def active(self, p: Parameter, point: dict[str, Any]) -> bool:
        return all(point.get(parent) in values for parent, values in (p.when or {}).items())

    def suggest(self, trial) -> dict[str, Any]:
        """Ask an Optuna trial for a point; conditional parameters are asked only when active."""
        point: dict[str, Any] = {}
        for p in self.parameters:
            if not self.active(p, point):
                continue
            if p.type == "categorical":
                point[p.name] = trial.suggest_categorical(p.name, list(p.choices))
            elif p.type == "int":
                point[p.name] = trial.suggest_int(p.name, int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
            else:
                point[p.name] = trial.suggest_float(p.name, p.low, p.high, log=p.log, step=p.step)
        return point

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        point: dict[str, Any] = {}
        for p in self.parameters:
            if self.active(p, point):
                point[p.name] = self.sample_value(p, rng)
        return point

    @staticmethod
    def sample_value(p: Parameter, rng: np.random.Generator) -> Any:
        """One value of ``p``, uniform on its (log) scale."""
        if p.type == "categorical":
            return p.choices[int(rng.integers(len(p.choices)))]
        if p.type == "int" and not p.log:  # uniform over the values: an index, never a list
            return int(p.low) + int(p.step or 1) * int(rng.integers(p.count()))
        lo, hi = p.low, p.high
        x = math.exp(rng.uniform(math.log(lo), math.log(hi))) if p.log else rng.uniform(lo, hi)
        if p.step:
            x = lo + round((x - lo) / p.step) * p.step
        return int(round(x)) if p.type == "int" else float(min(max(x, lo), hi))

    def neighbour(self, point: dict[str, Any], rng: np.random.Generator, scale: float) -> dict[str, Any]:
        """A point near ``point``: each active parameter moves with probability ``min(1, 2/d)`` (at
        least one moves); a number by a Gaussian step of sd ``scale`` on its [0, 1] (log where
        ``log``) scale, rounded to its grid; a numeric choice the same on its index; a text choice
        is redrawn. A parameter that becomes active is drawn afresh, one that becomes inactive is
        dropped. What the local part of the proxy's inner search walks on (SMAC's local search
        over the acquisition, Hutter et al. 2011, in small)."""
        names = [p.name for p in self.parameters if p.name in point]
        moving = {n for n in names if rng.random() < min(1.0, 2.0 / max(len(names), 1))}
        if names and not moving:
            moving = {names[int(rng.integers(len(names)))]}
        out: dict[str, Any] = {}
        for p in self.parameters:
            if not self.active(p, out):
                continue
            if p.name not in point:
                out[p.name] = self.sample_value(p, rng)  # it became active
            elif p.name not in moving:
                out[p.name] = point[p.name]
            elif p.type == "categorical" and not p.numeric:
                out[p.name] = p.choices[int(rng.integers(len(p.choices)))]
            elif p.type == "categorical":
                order = sorted(range(len(p.choices)), key=lambda i: p.choices[i])
                at = order.index(next(i for i, c in enumerate(p.choices) if c == point[p.name]))
                out[p.name] = p.choices[order[_step_index(at, len(order), rng.normal(0.0, scale))]]
            else:
                lo, hi = (math.log(p.low), math.log(p.high)) if p.log else (p.low, p.high)
                v = math.log(point[p.name]) if p.log else float(point[p.name])
                x = min(max(v + rng.normal(0.0, scale) * (hi - lo), lo), hi)
                x = math.exp(x) if p.log else x
                if p.step or p.type == "int":
                    grid = p.step or 1
                    at = round((point[p.name] - p.low) / grid)
                    j = round((x - p.low) / grid)
                    if j == at:  # a discrete parameter chosen to move moves at least one value
                        j = _step_index(at, p.count(), 1e-9 if x >= point[p.name] else -1e-9)
                    x = p.low + j * grid
                out[p.name] = int(round(min(max(x, p.low), p.high))) if p.type == "int" else float(min(max(x, p.low), p.high))
        return out

    def validate_point(self, point: dict[str, Any], source: str = "point") -> dict[str, Any]:
        """The point restricted to its active parameters; a missing/unknown/out-of-range value is a SpecError."""
        known = set(self.param_names)
        for k in point:
            if k not in known:
                raise SpecError(f"unknown parameter (known: {', '.join(self.param_names)})", source=source, field=k)
        out: dict[str, Any] = {}
        for p in self.parameters:
            if not self.active(p, out):
                continue
            if p.name not in point:
                raise SpecError("missing value", source=source, field=p.name)
            v = point[p.name]
            if not p.contains(v):
                raise SpecError(f"{v!r} is outside the space", source=source, field=p.name)
            out[p.name] = v
        return out

    def key(self, point: dict[str, Any]) -> str:
        """Identity of a point: two proposals with the same key are the same configuration."""
        return stable_hash({k: point[k] for k in sorted(point)})

    def size(self) -> int | None:
        """Number of distinct points when every parameter is discrete, else None. Counted, not
        listed: a parameter's values only matter where a later ``when`` names them, so the count
        branches on those values and one "any other value" class per parent."""
        if any(p.count() is None for p in self.parameters):
            return None
        params = self.parameters
        mentioned: dict[str, list[Any]] = {}
        for p in params:
            for parent, values in (p.when or {}).items():
                seen = mentioned.setdefault(parent, [])
                seen.extend(v for v in values if not any(v == u for u in seen))
        other = object()  # stands for every value no ``when`` names

        def count(i: int, assigned: dict[str, Any]) -> int:
            if i == len(params):
                return 1
            p = params[i]
            if not self.active(p, assigned):
                return count(i + 1, assigned)
            n = p.count()
            if p.name not in mentioned:
                return n * count(i + 1, assigned)
            named = mentioned[p.name]
            total = sum(count(i + 1, {**assigned, p.name: v}) for v in named)
            if n > len(named):
                total += (n - len(named)) * count(i + 1, {**assigned, p.name: other})
            return total

        return count(0, {})

    def enumerate(self, limit: int = 100_000) -> list[dict[str, Any]]:
        """Every point of a discrete space (depth-first over parameters, honouring ``when``); a
        space of more than ``limit`` points is refused before anything is listed."""
        for p in self.parameters:
            if p.count() is None:
                raise SpecError("cannot enumerate a continuous parameter", field=p.name)
        if self.size() > limit:
            raise SpecError(f"more than {limit} points; sample instead", source=self.name)

        def values(p: Parameter) -> list[Any]:
            if p.type == "categorical":
                return list(p.choices)
            if p.type == "float" and not p.step:
                raise SpecError("cannot enumerate a continuous parameter", field=p.name)
            step = p.step or 1
            xs = [p.low + i * step for i in range(p.count())]
            return [int(x) for x in xs] if p.type == "int" else xs

        points: list[dict[str, Any]] = [{}]
        for p in self.parameters:
            nxt = []
            for pt in points:
                if self.active(p, pt):
                    nxt.extend({**pt, p.name: v} for v in values(p))
                else:
                    nxt.append(pt)
                if len(nxt) > limit:
                    raise SpecError(f"more than {limit} points; sample instead", source=self.name)
            points = nxt
        return points

    # ---- features for the proxy -------------------------------------------------------------
    def feature_names(self) -> list[str]:
        names = []
        for p in self.parameters:
            if p.numeric:
                names.append(p.name)
            else:
                names.extend(f"{p.name}={c}" for c in p.choices)
            if p.when:
                names.append(f"{p.name}?")
        return names

    def features(self, point: dict[str, Any]) -> np.ndarray:
        """Numbers in [0, 1] (log-scaled where ``log``), one-hot for text choices, an 'is active'
        flag for conditional parameters (inactive numeric -> 0)."""
        out: list[float] = []
        for p in self.parameters:
            v = point.get(p.name)
            if p.numeric:
                if v is None:
                    out.append(0.0)
                else:
                    lo, hi = (min(p.choices), max(p.choices)) if p.type == "categorical" else (p.low, p.high)
                    if lo == hi:
                        out.append(0.0)
                    elif p.log:
                        out.append((math.log(float(v)) - math.log(lo)) / (math.log(hi) - math.log(lo)))
                    else:
                        out.append((float(v) - lo) / (hi - lo))
            else:
                out.extend(1.0 if _same_choice(v, c) else 0.0 for c in p.choices)
            if p.when:
                out.append(1.0 if v is not None else 0.0)
        return np.asarray(out, dtype=np.float64)

    # ---- cubic's own mapping -----------------------------------------------------------------
    def to_config(self, point: dict[str, Any], base=None):
        """The cubic Config a point stands for: dotted names set Config fields (``model.*`` are
        dense-arch knob overrides). Fields the point does not set keep ``base``'s values."""
        from cubic.core.config import Config

        data = (base or Config()).model_dump(mode="json")
        for name, value in point.items():
            parts = name.split(".")
            if parts[0] == "model":
                data["model"][".".join(parts[1:])] = value
                continue
            node, cls = data, Config
            for part in parts[:-1]:
                if not isinstance(node.get(part), dict):
                    raise SpecError("not a Config field", source=self.name, field=name)
                node = node[part]
                f = getattr(cls, "model_fields", {}).get(part)
                cls = f.annotation if f is not None else None
            # a field left out of the dump while unset (ShardingChoice.sync*) is still a Config field
            if parts[-1] not in node and parts[-1] not in getattr(cls, "model_fields", {}):
                raise SpecError("not a Config field", source=self.name, field=name)
            node[parts[-1]] = value
        return parse_model(Config, data, source=f"space {self.name}")


def _step_index(at: int, n: int, z: float) -> int:
    """Index ``at`` of ``n`` moved by ``z`` of the range, at least one value, kept inside."""
    move = int(round(z * max(n - 1, 1)))
    if move == 0:
        move = 1 if z >= 0 else -1
    j = at + move
    if not 0 <= j < n:
        j = at - move  # bounce off the edge
    return min(max(j, 0), n - 1)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _same_choice(value: Any, choice: Any) -> bool:
    """A categorical's value is this choice: equal and of one type, or two numbers that are equal (in
    Python True == 1, and a choice list may hold both, as Optuna's does: each is its own feature)."""
    return value == choice and type(value) is type(choice) or (_is_number(value) and _is_number(choice)
                                                                and value == choice)


def load_space(path: str | Path | None = None) -> Space:
    """A space from YAML/JSON (default: cubic/data/space-default.yaml). Errors name file and field."""
    p = Path(path) if path else DEFAULT_SPACE_PATH
    return parse_model(Space, read_structured(p), source=str(p))
