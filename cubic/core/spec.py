"""Workload value objects: tables, dense architecture, optimizers, topology.

Plain, typed, serialisable (pydantic v2); no behaviour beyond validation. Every file a user keeps
carries a ``version`` field. Validation errors are turned into :class:`SpecError`, which names the
file and the field, so that the CLI can print one line and exit 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SPEC_VERSION = 1
NEUROSHARD_HIST_BINS = 17  # NeuroShard's reuse-distance histogram: 17 log2 bins
MAX_WORLD_SIZE = 1_000_000
MAX_BATCH_SIZE = 10_000_000
MAX_MEMORY_GB = 1e6  # per rank, decimal GB: more is a typo
# a run's counts past these are typos: the one bound of each, for the value objects and the flags alike
MAX_STEPS = 10_000_000
MAX_REPEATS = 1000
MAX_CONFIRM_REPEATS = 10_000
MAX_THREADS = 4096
MAX_BUDGET = 1_000_000  # runs of one campaign (and proposals per round)


class SpecError(ValueError):
    """Bad user input. ``str(err)`` is one line naming the file (if any) and the field."""

    def __init__(self, message: str, source: str | None = None, field: str | None = None):
        self.source, self.field, self.message = source, field, message
        where = ": ".join(p for p in (source, field) if p)
        super().__init__(f"{where}: {message}" if where else message)


def spec_error_from_validation(err: ValidationError, source: str | None = None) -> SpecError:
    """First pydantic error as a one-line SpecError naming the dotted field path."""
    first = err.errors()[0]
    loc = [str(p) for p in first.get("loc", ())]
    msg = first.get("msg", "invalid value")
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, SpecError):  # a validator's own SpecError: its field under the model's path
        loc, msg = loc + ([cause.field] if cause.field else []), cause.message
    elif first.get("type") == "value_error":  # pydantic's "Value error, " prefix says nothing to a user
        msg = msg.removeprefix("Value error, ")
    field = ".".join(loc)
    extra = len(err.errors()) - 1
    if extra:
        msg += f" (and {extra} more error{'s' if extra > 1 else ''})"
    return SpecError(msg, source=source, field=field or None)


class Frozen(BaseModel):
    # allow_inf_nan=False: a NaN in a file is "not a finite number", not "should be <= 10000"
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class AccessStats(Frozen):
    """How a table's rows are read. One of: Zipf exponent, or NeuroShard's 17-bin reuse histogram.

    ``zipf_alpha`` = 0 is uniform access; ~1.05-1.2 is typical of production id features.
    ``reuse_histogram`` is the share of accesses per log2 reuse-distance bin (sums to ~1).
    """

    zipf_alpha: float | None = Field(default=1.05, ge=0.0, le=3.0)
    reuse_histogram: list[float] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> "AccessStats":
        if self.reuse_histogram is not None:
            h = self.reuse_histogram
            if len(h) != NEUROSHARD_HIST_BINS:
                raise ValueError(f"reuse_histogram needs {NEUROSHARD_HIST_BINS} bins, got {len(h)}")
            if any(x < 0 for x in h) or not (0.5 <= sum(h) <= 1.5):
                raise ValueError("reuse_histogram bins must be >= 0 and sum to about 1")
        elif self.zipf_alpha is None:
            raise ValueError("give zipf_alpha or reuse_histogram")
        return self

    def effective_alpha(self) -> float:
        """A Zipf exponent equivalent: from the histogram, more mass at short reuse = more skew."""
        if self.reuse_histogram is None:
            return float(self.zipf_alpha)
        h = self.reuse_histogram
        total = sum(h) or 1.0
        # mean log2 reuse distance in [0, 16]; short reuse -> hot rows -> high alpha
        mean_bin = sum(i * x for i, x in enumerate(h)) / total
        return max(0.0, 1.6 - 0.1 * mean_bin)


class Table(Frozen):
    """One embedding table (one sparse feature)."""

    name: str = Field(min_length=1, max_length=200)
    rows: int = Field(gt=0, le=10**11)
    dim: int = Field(gt=0, le=4096, description="a multiple of 4")
    pooling_factor: float = Field(default=1.0, gt=0.0, le=10_000.0, description="mean ids per example")
    pooling_dist: Literal["fixed", "poisson", "lognormal"] = "lognormal"
    pooling_sigma: float = Field(default=0.8, ge=0.0, le=4.0, description="lognormal shape: heavy tail")
    access: AccessStats = AccessStats()
    feature_group: str = "default"

    @field_validator("dim")
    @classmethod
    def _fbgemm_width(cls, dim: int) -> int:
        if dim % 4:  # refused here, not as a failed run from inside the kernel
            raise ValueError(f"must be a multiple of 4 (FBGEMM's fused embedding kernels, which TorchRec "
                             f"and cubic run, need it), got {dim}")
        return dim

    def bytes_fp32(self) -> int:
        return self.rows * self.dim * 4


class DLRMArch(Frozen):
    kind: Literal["dlrm"] = "dlrm"
    bottom_mlp: list[Annotated[int, Field(gt=0, le=65536)]] = [128, 64]
    top_mlp: list[Annotated[int, Field(gt=0, le=65536)]] = [256, 128, 1]
    # the dot interaction needs every embedding at the bottom MLP's output width
    @model_validator(mode="after")
    def _top_ends_in_one(self) -> "DLRMArch":
        if not self.bottom_mlp or not self.top_mlp or self.top_mlp[-1] != 1:
            raise ValueError("bottom_mlp must be non-empty and top_mlp must end in 1")
        return self


class WukongArch(Frozen):
    """Wukong (arXiv 2403.02545): stacked interaction layers, each an FMB and an LCB with residual."""

    kind: Literal["wukong"] = "wukong"
    num_layers: int = Field(default=2, ge=1, le=64)
    emb_dim: int = Field(default=32, ge=4, le=1024, description="common embedding width d")
    num_emb_lcb: int = Field(default=16, ge=1, le=4096, description="embeddings out of the LCB")
    num_emb_fmb: int = Field(default=16, ge=1, le=4096, description="embeddings out of the FMB")
    rank_fmb: int = Field(default=8, ge=1, le=1024, description="optimized-FM projection rank k")
    mlp_width: int = Field(default=256, ge=1, le=65536, description="FMB MLP hidden width")
    fmb_mlp_layers: int = Field(default=1, ge=1, le=8)
    top_mlp: list[Annotated[int, Field(gt=0, le=65536)]] = [256, 1]
    layer_norm: bool = True

    @model_validator(mode="after")
    def _top_ends_in_one(self) -> "WukongArch":
        if not self.top_mlp or self.top_mlp[-1] != 1:
            raise ValueError("top_mlp must end in 1")
        return self


class DMTArch(Frozen):
    """DMT (arXiv 2403.02545 sibling, Luo et al. 2024): a tower module per feature group."""

    kind: Literal["dmt"] = "dmt"
    num_towers: int = Field(default=2, ge=1, le=256)
    tower_dim: int = Field(default=64, ge=1, le=65536, description="tower output width")
    tower_mlp: list[Annotated[int, Field(gt=0, le=65536)]] = [128]
    top_mlp: list[Annotated[int, Field(gt=0, le=65536)]] = [256, 1]

    @model_validator(mode="after")
    def _top_ends_in_one(self) -> "DMTArch":
        if not self.top_mlp or self.top_mlp[-1] != 1:
            raise ValueError("top_mlp must end in 1")
        return self


DenseArch = Annotated[Union[DLRMArch, WukongArch, DMTArch], Field(discriminator="kind")]


EmbeddingOptimizer = Literal["rowwise_adagrad", "sgd", "ms_rowwise_adagrad"]


class Optimizers(Frozen):
    """The optimizers a workload trains with. ``embedding``: ``rowwise_adagrad`` (FBGEMM's
    EXACT_ROWWISE_ADAGRAD), ``sgd``, or ``ms_rowwise_adagrad``, the momentum-scaled row-wise AdaGrad
    of arXiv 2508.03854 as RECONSTRUCTED FROM A THIRD-PARTY SUMMARY (the paper's text was not
    reachable): the row accumulator divided by the number of 2D replicas, identical to
    ``rowwise_adagrad`` in a 1D run (:class:`cubic.core.models.RowWiseAdagrad`)."""

    embedding: EmbeddingOptimizer = "rowwise_adagrad"
    embedding_lr: float = Field(default=0.05, gt=0.0, le=10.0)
    dense: Literal["adam", "sgd"] = "adam"
    dense_lr: float = Field(default=1e-3, gt=0.0, le=10.0)


class Topology(Frozen):
    """The cluster a plan is for. Memory in decimal GB (1e9 bytes; shown in GiB), bandwidths in GB/s
    (1e9 bytes/s) per rank."""

    world_size: int = Field(default=1, ge=1, le=MAX_WORLD_SIZE)
    ranks_per_node: int = Field(default=8, ge=1, le=1024)
    memory_per_rank_gb: float = Field(default=16.0, gt=0.0, le=MAX_MEMORY_GB, description="decimal GB (1e9 bytes)")
    intra_node_bw_gbps: float = Field(default=450.0, gt=0.0, description="per-rank, e.g. NVLink")
    inter_node_bw_gbps: float = Field(default=50.0, gt=0.0, description="per-rank, e.g. RDMA NIC")
    device: str = Field(default="cpu", description="cpu, cuda, or a modelled device such as h100")
    # the interconnect the plan is for (cost_models.comm.CommModel.from_topology reads these)
    intra_node_latency_us: float | None = Field(default=None, ge=0.0, le=1e6,
                                                description="per all-to-all inside a node (default: the device's)")
    inter_node_latency_us: float | None = Field(default=None, ge=0.0, le=1e6,
                                                description="per all-to-all between nodes (default: the device's)")
    comm_model: Literal["auto", "bandwidth", "calibrated"] = Field(
        default="auto", description="bandwidth: the bandwidths and latencies above; calibrated: a `cubic shard "
        "calibrate-comm` file; auto: calibrated on cpu when a calibration exists, else bandwidth")
    comm_calibration: str | None = Field(default=None, max_length=4096,
                                         description="calibration file (default: the user's, else the packaged one)")

    @property
    def memory_per_rank_bytes(self) -> int:
        return int(self.memory_per_rank_gb * 1e9)

    @property
    def num_nodes(self) -> int:
        return -(-self.world_size // self.ranks_per_node)


class DataSpec(Frozen):
    """How synthetic data is drawn (see cubic/data.py for the distributions)."""

    num_dense_features: int = Field(default=13, ge=0, le=4096)
    dense_tail_df: float = Field(default=3.0, gt=0.0, le=1000.0, description="Student-t df: heavy tails")
    teacher_dim: int = Field(default=8, ge=1, le=256)
    teacher_noise: float = Field(default=0.3, ge=0.0, le=10.0)
    eval_batch_size: int = Field(default=4096, ge=16, le=1_000_000)
    seed: int = Field(default=0, ge=0)


class Workload(Frozen):
    """Tables + dense arch + batch + optimizers + topology: what is trained, and where."""

    version: Literal[1] = SPEC_VERSION
    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    tables: list[Table] = Field(min_length=1)
    dense_arch: DenseArch = DLRMArch()
    batch_size: int = Field(default=512, ge=1, le=MAX_BATCH_SIZE, description="examples per rank per step")
    optimizers: Optimizers = Optimizers()
    topology: Topology = Topology()
    data: DataSpec = DataSpec()

    @model_validator(mode="after")
    def _unique_tables(self) -> "Workload":
        seen: set[str] = set()
        for t in self.tables:
            if t.name in seen:
                raise ValueError(f"duplicated table name {t.name!r}")
            seen.add(t.name)
        return self

    def content_hash(self) -> str:
        return stable_hash(self.model_dump(mode="json"))


def stable_hash(obj: Any) -> str:
    """Content hash of a JSON-able object: sorted keys, no whitespace, sha256, 16 hex chars."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# Limits of every user file cubic reads (workloads, configs, spaces, plans, placements, clusters):
# far above any real document, far below what would exhaust memory or the stack.
MAX_INPUT_BYTES = 32 * 2**20
MAX_YAML_ALIASES = 1_000
MAX_EXPANDED_NODES = 2_000_000  # nodes once every alias is expanded (a "billion laughs" is ~1e9)
MAX_NESTING = 64


class _TooLong:
    """Stands in for a number Python refuses to convert (over 4300 digits), so that the tree walk
    after parsing can name its field."""

    def __init__(self, digits: int):
        self.digits = digits


def _int_or_marker(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        if len(text) > 1000:
            return _TooLong(len(text))
        raise


_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc,valid-type]
    def construct_yaml_int(self, node):  # noqa: ANN001
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            value = str(node.value)
            if len(value) > 1000:
                return _TooLong(len(value))
            raise


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def _check_yaml_graph(node: Any, source: str) -> None:
    """Aliases, expanded size and depth of a composed YAML node graph, before anything is built.

    A node an alias points to is shared in the graph but copied by whoever walks the result
    (pydantic, JSON, merge keys), so its expanded size is what counts; memoised per node: linear."""
    from yaml.nodes import MappingNode, SequenceNode

    aliases = 0
    size: dict[int, int] = {}
    seen: set[int] = set()
    # iterative post-order walk with depth: (node, depth, children_done, path)
    stack: list[tuple[Any, int, bool, str]] = [(node, 1, False, "")]
    while stack:
        n, depth, done, path = stack.pop()
        if depth > MAX_NESTING:
            raise SpecError(f"nested more than {MAX_NESTING} levels deep", source=source, field=path or None)
        kids: list[tuple[Any, str]] = []
        if isinstance(n, SequenceNode):
            kids = [(c, f"{path}.{i}" if path else str(i)) for i, c in enumerate(n.value)]
        elif isinstance(n, MappingNode):
            for k, v in n.value:
                name = str(getattr(k, "value", "?"))[:40]
                kids += [(k, f"{path}.{name}" if path else name), (v, f"{path}.{name}" if path else name)]
        if done:
            size[id(n)] = 1 + sum(size[id(c)] for c, _ in kids)
            if size[id(n)] > MAX_EXPANDED_NODES:
                raise SpecError(f"expands to more than {MAX_EXPANDED_NODES:,} values (YAML aliases?)",
                                source=source, field=path or None)
            continue
        if id(n) in seen:  # a second reference to a node: an alias
            aliases += 1
            if aliases > MAX_YAML_ALIASES:
                raise SpecError(f"more than {MAX_YAML_ALIASES} YAML alias references", source=source,
                                field=path or None)
            if id(n) in size:
                continue
            # a reference to a node still being walked: a recursive alias
            raise SpecError("a YAML alias refers to its own parent (recursive document)", source=source,
                            field=path or None)
        seen.add(id(n))
        stack.append((n, depth, True, path))
        stack.extend((c, depth + 1, False, p) for c, p in reversed(kids))


def _check_tree(data: Any, source: str) -> None:
    """Nesting depth, and numbers too long to be numbers, of a parsed document (iterative)."""
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    while stack:
        obj, depth, path = stack.pop()
        if depth > MAX_NESTING:
            raise SpecError(f"nested more than {MAX_NESTING} levels deep", source=source, field=path or None)
        if isinstance(obj, _TooLong):
            raise SpecError(f"a number of {obj.digits} digits; far outside any valid range", source=source,
                            field=path or None)
        if isinstance(obj, dict):
            stack.extend((v, depth + 1, f"{path}.{k}" if path else str(k)) for k, v in obj.items())
        elif isinstance(obj, list):
            stack.extend((v, depth + 1, f"{path}.{i}" if path else str(i)) for i, v in enumerate(obj))


def _load_yaml(text: str, source: str) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_graph(node, source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def check_input_file(p: Path) -> None:
    """A document to read is a regular file: a folder, a device or a pipe was "no such file"."""
    if p.is_file():
        return
    if p.is_dir():
        raise SpecError("is a folder, not a file", source=str(p))
    if p.exists():
        raise SpecError("not a regular file (a device, a pipe or a socket)", source=str(p))
    raise SpecError("no such file", source=str(p))


def read_structured(path: str | Path) -> Any:
    """Parse a JSON or YAML file; a missing, oversized or unparsable file is a SpecError naming it.

    The one reader of user documents: bounded in bytes, YAML alias references, expanded size and
    nesting depth, and a number too long to convert names the file instead of escaping as a bare
    ValueError."""
    p = Path(path)
    check_input_file(p)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror or e}", source=str(p)) from None
    if len(raw) > MAX_INPUT_BYTES:
        raise SpecError(f"larger than {MAX_INPUT_BYTES // 2**20} MiB; not a cubic document", source=str(p))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"not UTF-8 text (byte {e.start})", source=str(p)) from None
    kind = "JSON" if p.suffix.lower() == ".json" else "YAML"
    try:
        data = json.loads(text, parse_int=_int_or_marker) if kind == "JSON" else _load_yaml(text, str(p))
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        one_line = " ".join(str(e).split())
        raise SpecError(f"not valid {kind}: {one_line}", source=str(p)) from None
    except RecursionError:  # e.g. "[[[[..." thousands deep: the parsers recurse
        raise SpecError("nested too deeply to be a cubic document", source=str(p)) from None
    except SpecError:
        raise
    except ValueError as e:  # a value a parser could not convert
        raise SpecError(f"a value cannot be read: {' '.join(str(e).split())[:120]}", source=str(p)) from None
    _check_tree(data, str(p))
    return data


def available_memory_bytes() -> int | None:
    """What this machine can still hand out (MemAvailable, Linux), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def group_misfit(group: int, world: int) -> str | None:
    """Why ``group`` ranks cannot be a model-parallel group of a ``world``-rank job, or None. The one
    rule for 2D sparse parallelism: the world is world/group replicas of one group, so the group
    divides it (group == world is plain 1D sharding)."""
    if group < 1 or group > world or world % group:
        return f"a group of {group} ranks must divide the world size {world}"
    return None


def check_group_size(group: int, world: int, field: str | None = "sharding.group_size",
                     source: str | None = None, world_flag: str | None = None) -> None:
    """:func:`group_misfit` as a SpecError naming the field (``world_flag``: the flag that gave the world)."""
    why = group_misfit(group, world)
    if why:
        raise SpecError(why.replace("the world size", world_flag) if world_flag else why, source=source, field=field)


def check_allocation(nbytes: float, what: str, field: str | None = None, source: str | None = None) -> None:
    """Refuse, as bad input naming ``field``, an allocation larger than the memory available now.

    Called before building tensors whose size a user typed, so that a typo is one line and exit 2
    rather than a MemoryError traceback or a machine swapping to death."""
    avail = available_memory_bytes()
    if avail is not None and nbytes > avail:
        raise SpecError(f"{what} needs {_human_bytes(nbytes)}, more than the {_human_bytes(avail)} "
                        "of memory available on this machine", source=source, field=field)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):  # binary: memory is in GiB (cubic.core.units)
        if abs(n) < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.3g} EiB"


# C0 controls but tab and newline (ESC starts terminal escape sequences; CR overwrites a line), DEL,
# C1 controls, and the zero-width and bidirectional overrides that make text read other than it is
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def sanitize(text: Any) -> str:
    """Untrusted text (a name from a user file or the store) made safe for a terminal: control and
    direction characters are shown escaped (``\\x1b``) instead of acting."""
    return _UNPRINTABLE.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), str(text))


def parse_model(cls: type[BaseModel], data: Any, source: str | None = None):
    """Validate ``data`` as ``cls``; errors become one-line SpecErrors naming source and field."""
    if not isinstance(data, dict):
        raise SpecError(f"expected a mapping at the top level, got {type(data).__name__}", source=source)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise spec_error_from_validation(e, source) from None


def load_callable(spec: str, field: str, example: str = "package.module:function"):
    """``module:attr`` -> that callable: the one loader of user code named on a command line
    (a campaign's ``--evaluate`` factory, a Probe's ``--module`` or ``--loss``). Only the module
    named is imported; any failure is a SpecError naming ``field``."""
    import importlib

    module_name, sep, attr = str(spec).partition(":")
    if not sep or not module_name or not attr or not all(p.isidentifier() for p in attr.split(".")):
        raise SpecError(f"expected module:attribute, e.g. {example}", field=field)
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise SpecError(f"cannot import {module_name!r}: {e}", field=field) from None
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    if not callable(obj):
        raise SpecError(f"{module_name!r} has no callable {attr!r}", field=field)
    return obj


def call_user_code(fn, what: str, field: str, *args):
    """Call user code named on a command line (a Probe's factory, a campaign worker's evaluate
    factory): an exception becomes one line naming ``what`` failed and the flag ``field`` (exit 2
    in the CLI). Its warnings are shown only when it succeeds: before an error they only push the
    one line down (a loss on mismatched shapes warns about broadcasting, then raises)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:  # under the filters in force (once, ignore...)
        try:
            out = fn(*args)
        except SpecError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of user code is bad input, reported in one line
            raise SpecError(f"{what} raised {type(e).__name__}: {e}".splitlines()[0], field=field) from None
    for w in caught:  # as they would have been shown (to whoever records warnings now)
        warnings._showwarnmsg(w)  # type: ignore[attr-defined]
    return out
