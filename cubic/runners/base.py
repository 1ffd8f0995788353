"""What every runner shares: the :class:`Runner` interface and the helpers each runner's Result
needs (the config check of the single-process runner, the Result header, peak memory, the
classification of an exception into a failure kind, the device, a free TCP port for a process group).

Moved out of :mod:`cubic.runners.local` so that the distributed, TorchRec and simulated runners
depend on this small module, not on the local runner; ``cubic.runners.local`` re-exports the names
its importers used.
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from importlib.util import find_spec
from typing import Any, Callable

from cubic.core.config import Config
from cubic.core.result import Result
from cubic.core.runspec import RunSpec
from cubic.core.spec import SpecError, Workload, check_group_size

ProgressFn = Callable[[int, int], None]


class Runner(ABC):
    """Measures (workload, config) pairs. ``source`` is 'measured' or 'simulated'."""

    source: str = "measured"

    def run_spec(self) -> RunSpec:
        """Where and how this runner's runs happen (subclasses say more: world size, cluster)."""
        return RunSpec(kind="local", device=str(getattr(self, "device", "auto") or "auto"),
                       threads=getattr(self, "threads", None))

    def cache_key(self) -> str:
        """The run spec's key: results of runners with equal keys on one machine are interchangeable."""
        return self.run_spec().cache_key()

    @abstractmethod
    def run(self, workload: Workload, config: Config, *, steps: int = 50, warmup: int = 5,
            progress: ProgressFn | None = None) -> Result:
        """Run and return a Result; failures are failed Results, never exceptions."""


def sharded_field(config: Config) -> str | None:
    """The config field that asks for tables sharded over several processes (None: one process runs it)."""
    s = config.sharding
    for field, on in (("sharding.plan", s.plan is not None), ("sharding.group_size", bool(s.group_size)),
                      ("sharding.sync", s.sync is not None), ("sharding.sync_interval", s.sync_interval is not None)):
        if on:
            return field
    from sharding.types import NONE_NAMES

    return None if s.planner in NONE_NAMES else "sharding.planner"


def needs_world_size(config: Config) -> str:
    """What a sharded config needs, naming the flag that gives it (one wording for every command)."""
    ranks = (config.sharding.plan or {}).get("world_size")
    n = f"{ranks}" if isinstance(ranks, int) and not isinstance(ranks, bool) else "N"
    return (f"a sharded config runs on several processes: add --world-size {n}"
            f"{' (N >= 2)' if n == 'N' else ''} (or --simulate CLUSTERxN for the simulated cluster); "
            "one process runs only sharding.planner: none")


def check_run_config(config: Config, processes: int | None, source: str | None = None,
                     world_flag: str = "--world-size") -> None:
    """A config's values (:func:`check_config_values`) and its fit to a run on ``processes`` ranks
    (None: any size fits, a simulated cluster), refused before anything runs or is recorded, naming
    the field in ``source`` and the flag (``world_flag``; torchrun's is WORLD_SIZE) that gave the
    ranks: a sharded config on one process, a plan for another number of ranks, a group that does not
    divide the ranks, replica sync without a 2D group. ``cubic run`` and torchrun's launch read
    configs through it."""
    check_config_values(config, source=source)
    if processes is None:
        return
    s = config.sharding
    if processes == 1 and (field := sharded_field(config)) is not None:
        raise SpecError(needs_world_size(config), source=source, field=field)
    ranks = (s.plan or {}).get("world_size")
    if processes > 1 and ranks is not None and ranks != processes:
        raise SpecError(f"the plan is for {ranks} ranks, the run has {processes}: run it with {world_flag} {ranks}",
                        source=source, field="sharding.plan.world_size")
    if processes > 1 and s.group_size:
        check_group_size(s.group_size, processes, source=source, world_flag=world_flag)
    if processes > 1 and (why := sync_misfit(s, s.group_size or (s.plan or {}).get("group_size") or processes,
                                             processes, world_flag)):
        raise SpecError(why[1], source=source, field=why[0])
    if processes > 1 and (priced := (s.plan or {}).get("sync")):
        warn_priced_sync(priced, s, source)


class PricedSyncWarning(UserWarning):
    """A 2D plan priced for one replica sync, run with another (torchrun's launch says it on rank 0 only)."""


def warn_priced_sync(priced: dict, sharding, source: str | None) -> None:
    """A 2D plan priced for one replica sync, run with another, still runs right, but its prediction and
    its shard balance are for the other cost: said once, as a warning."""
    import warnings

    from sharding.types import ReplicaSync

    runs = ReplicaSync.of(sharding.sync, sharding.sync_interval)
    try:
        planned = ReplicaSync.model_validate(priced)
    except ValueError:
        return  # the plan document's own check names a malformed field
    if planned != runs:
        how = lambda r: r.mode if r.mode == "gradients" else f"weights every {r.interval} steps"  # noqa: E731
        warnings.warn(f"{source or 'config'}: sharding.plan was priced for replica sync {how(planned)}, the job syncs "
                      f"{how(runs)} (sharding.sync / sync_interval): re-plan with --sync / --sync-interval to match",
                      PricedSyncWarning, stacklevel=3)


def sync_misfit(sharding, group: int, world: int, world_name: str = "the world size") -> tuple[str, str] | None:
    """(field, why) when a replica-sync setting cannot apply: ``sync``/``sync_interval`` keep the
    world/group replicas of a 2D plan in step, so they need a group below the world. The one rule for
    a config checked at load and a plan checked against it (``distributed.check_plan``)."""
    if group == world and (sharding.sync is not None or sharding.sync_interval is not None):
        return ("sharding.sync" if sharding.sync is not None else "sharding.sync_interval",
                f"keeps 2D replicas in step: it needs sharding.group_size below {world_name} {world} (a 2D plan)")
    return None


def _nested(e: SpecError, prefix: str, source: str | None) -> SpecError:
    """A document's error (raised without a source) re-said at its place in the config file."""
    msg = str(e)
    if e.field and msg.startswith(f"{e.field}: "):
        msg = msg[len(e.field) + 2:]
    return SpecError(msg, source=source, field=".".join(p for p in (prefix, e.field) if p))


def check_config_values(config: Config, source: str | None = None) -> None:
    """Raise a one-line SpecError (naming ``source`` and the field) when a config value names
    something that does not exist: a planner (``sharding.types.PLANNERS``, the list
    ``sharding.registry`` builds), an explicit plan document (its sharding types and compute kernels:
    ``sharding.kernels``) or an FP8 placement document (its recipes and kernels: ``fp8.kernels``).
    Recipes, the embedding kernel and the optimizers are checked when the config is parsed (their
    one tables live in ``cubic.core``: recipes.py, config.Kernels, spec.Optimizers). Here, not in
    cubic.core, because planners and placements belong to the feature packages."""
    from sharding.types import NONE_NAMES, PLANNERS, plan_from_dict

    s = config.sharding
    if s.planner not in NONE_NAMES and s.planner not in PLANNERS:
        raise SpecError(f"unknown planner {s.planner!r} (known: none, {', '.join(PLANNERS)})",
                        source=source, field="sharding.planner")
    if s.plan is not None:
        try:
            plan_from_dict(s.plan, source=None)
        except SpecError as e:
            raise _nested(e, "sharding.plan", source) from None
    f = config.fp8
    if f.policy == "placement" and f.placement is None:
        raise SpecError("policy 'placement' needs a placement document (`cubic fp8 probe` writes one)",
                        source=source, field="fp8.placement")
    if f.policy == "budget" and f.budget_sqnr_db is None:
        raise SpecError("policy 'budget' needs budget_sqnr_db (the SQNR floor in dB, e.g. 25)",
                        source=source, field="fp8.budget_sqnr_db")
    # a value that cannot apply is refused, not ignored: the user meant something by it
    for name, value, policy in (("budget_sqnr_db", f.budget_sqnr_db, "budget"), ("placement", f.placement, "placement")):
        if value is not None and f.policy != policy:
            raise SpecError(f"applies only with policy {policy!r} (policy is {f.policy!r}): set policy: {policy} "
                            "or remove it", source=source, field=f"fp8.{name}")
    if s.sync == "gradients" and s.sync_interval is not None:
        raise SpecError("applies only with sync: weights (sync: gradients keeps the replicas in step every step)",
                        source=source, field="sharding.sync_interval")
    if config.fp8.placement is not None:
        if find_spec("fp8.placement") is None:
            raise SpecError("an FP8 placement needs fp8/, which is not installed in this checkout",
                            source=source, field="fp8.placement")
        from fp8.placement import parse_placement

        try:
            parse_placement(config.fp8.placement, source=None)
        except SpecError as e:
            raise _nested(e, "fp8.placement", source) from None


def check_placement_fits(applied: Workload, config: Config, source: str | None = None) -> None:
    """Raise a one-line SpecError (naming ``source`` and the site's field) when the config's FP8
    placement names a site the model of ``applied`` (``config.apply(workload)``) lacks or gives it
    another shape: known before a run, so bad input rather than a recorded failed run."""
    if config.fp8.placement is None or find_spec("fp8.runtime") is None:
        return
    from fp8.placement import parse_placement
    from fp8.runtime import placement_misfit

    misfit = placement_misfit(parse_placement(config.fp8.placement, source=None), applied)
    if misfit:
        raise SpecError(misfit[1], source=source, field=f"fp8.placement.{misfit[0]}")


def validate_config(workload: Workload, config: Config) -> str | None:
    """Why the local single-process runner cannot execute ``config`` (None when it can)."""
    try:
        check_config_values(config)
    except SpecError as e:
        return str(e)
    field = sharded_field(config)
    if field is not None:
        return f"{field}: {needs_world_size(config)}"
    if config.fp8.policy != "off" and find_spec("fp8.runtime") is None:
        return f"fp8.policy={config.fp8.policy!r} needs fp8.runtime, which is not installed in this checkout"
    try:
        check_placement_fits(config.apply(workload), config)
    except SpecError as e:
        return str(e)
    from cubic.runners.memory import preflight  # its tables and dense state fit the device's memory

    return preflight(workload, config)


def result_header(workload: Workload, config: Config) -> dict[str, Any]:
    """The fields every Result of (workload, config) carries, failures included."""
    return dict(workload=workload.name, workload_hash=workload.content_hash(),
                config_hash=config.content_hash(), seed=config.seed)


_OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "bad_alloc",
                "failed to allocate")


def classify_exception(e: BaseException) -> tuple[str, str]:
    """(failure kind, one-line reason) for an exception raised by a run."""
    text = f"{type(e).__name__}: {e}"
    reason = " ".join(text.split())[:1000]
    if isinstance(e, KeyboardInterrupt):  # SIGINT, or SIGTERM turned into one by the child's handler
        return "killed", f"interrupted: {' '.join(str(e).split()) or 'SIGINT'}"
    if isinstance(e, SpecError):
        return "invalid", reason
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return "oom", reason
    if isinstance(e, RuntimeError) and any(m in str(e).lower() for m in _OOM_MARKERS):
        return "oom", reason
    return "error", reason


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def proc_status_bytes(field: str) -> int | None:
    """A ``Vm*`` line of /proc/self/status in bytes (Linux); None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0: ``5 > clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_memory(device) -> dict[str, float]:
    """The run's own peak memory, as metrics.

    CPU: ``peak_mem_bytes`` is the process's peak resident set, ``VmHWM`` from /proc/self/status.
    Not ``ru_maxrss``: Linux carries that across exec from the parent's address space (a parent
    holding 10 GB would make every child report 10 GB), while VmHWM belongs to the address space
    exec created, i.e. to this run alone. It includes the interpreter, torch and the model, which a
    run does need; :func:`train_and_measure` resets it after setting up (see ``reset_peak_rss``) so
    that the synthetic data's one-off calibration arrays do not count, only what training holds.
    CUDA: ``peak_mem_bytes`` is ``torch.cuda.max_memory_allocated`` (tensors) and
    ``peak_mem_reserved_bytes`` ``max_memory_reserved`` (what the caching allocator took from the
    device, which is what decides an OOM).
    """
    import torch

    if device.type == "cuda":
        return {"peak_mem_bytes": float(torch.cuda.max_memory_allocated(device)),
                "peak_mem_reserved_bytes": float(torch.cuda.max_memory_reserved(device))}
    hwm = proc_status_bytes("VmHWM")
    if hwm is None:  # not Linux: the best there is
        import resource

        hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_mem_bytes": float(hwm)}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a process group's rendezvous)."""
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]
