"""Pre-flight memory: a run whose tables and dense state cannot fit the device (the GPU's memory, or
the machine's on CPU) is refused before it starts, with one line giving both sizes; and an OOM that
does happen is told in words a user can read (not ``RuntimeError: err == 0.``).

The need is a LOWER BOUND, counted from the workload as the config runs it: embedding tables (fp32
weights) and their optimizer state (row-wise Adagrad: one fp32 per row; SGD: none), and the dense
part's parameters, gradients and optimizer state (Adam: two fp32 moments; SGD: none). Activations,
buffers and the framework's own footprint come on top, so a run refused here could never have
fitted; one that passes may still run out of memory (then :func:`explain_oom` words the failure).
The local runner holds every table in one process (no sharding), so the whole need is per device.
"""

from __future__ import annotations

import os

from cubic.core.config import Config
from cubic.core.spec import Workload
from cubic.core.units import fmt_gib

F32 = 4
_LABELS = {"embedding_tables": "tables", "embedding_optimizer": "their optimizer state",
           "dense_params_grads_optimizer": "dense params+grads+optimizer"}


def state_bytes(workload: Workload, config: Config) -> dict[str, int]:
    """The run's resident state, by part (bytes; a lower bound of its peak memory)."""
    from cubic.runners.step_model import dense_sites

    from sharding.types import Storage

    wl = config.apply(workload)
    parts = [Storage.parts(t.rows, t.dim, wl.optimizers.embedding) for t in wl.tables]
    emb, emb_opt = sum(w for w, _ in parts), sum(s for _, s in parts)
    params = sum(s.params for s in dense_sites(wl, 1))
    dense = params * F32 * (2 + (2 if wl.optimizers.dense == "adam" else 0))  # weights, grads, moments
    return {"embedding_tables": emb, "embedding_optimizer": emb_opt, "dense_params_grads_optimizer": dense}


def _machine_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gpu_bytes(index: int) -> tuple[int, str] | None:
    """(total bytes, name) of visible GPU ``index`` from nvidia-smi: asking torch would create a CUDA
    context in this (parent) process, memory the run's child then lacks. None without a GPU."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if index >= len(ids):
            return None
        target = ids[index]
    else:
        target = str(index)
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total,name", "--format=csv,noheader,nounits", "-i", target],
                             capture_output=True, text=True, timeout=10)
        mib, name = out.stdout.strip().splitlines()[0].split(",", 1)
        return int(float(mib)) * 2**20, name.strip()
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def capacity(device: str = "auto") -> tuple[int | None, str]:
    """(bytes, what) of the memory a run on ``device`` has: the GPU's total memory on CUDA, the
    machine's physical memory on CPU (its total, not what is free now: refusing is a property of
    the config on this machine, stored and served like any deterministic failure)."""
    if device != "cpu":
        gpu = _gpu_bytes(int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0)
        if gpu is not None:
            return gpu[0], f"the {gpu[1]}'s {fmt_gib(gpu[0])} of memory"
    total = _machine_bytes()
    return total, (f"this machine's {fmt_gib(total)} of memory" if total else "this machine's memory")


def preflight(workload: Workload, config: Config, device: str = "auto", limit_bytes: int | None = None) -> str | None:
    """Why the run cannot fit (one line, both sizes), or None when it may."""
    need = state_bytes(workload, config)
    have, what = capacity(device)
    if limit_bytes is not None and (have is None or limit_bytes < have):
        have, what = int(limit_bytes), f"the run's memory limit of {fmt_gib(limit_bytes)}"
    total = sum(need.values())
    if have is None or total <= have:
        return None
    parts = ", ".join(f"{_LABELS[k]} {fmt_gib(v)}" for k, v in need.items() if v)
    return (f"infeasible, not started: the run needs at least {fmt_gib(total)} ({parts}), more than {what}; "
            "shard the tables over more devices or make them smaller")


def explain_oom(kind: str, reason: str, workload: Workload | None, config: Config | None,
                device: str = "auto") -> tuple[str, str]:
    """(kind, reason) of a failed run with an out-of-memory told as one: an allocator's bare assert
    (FBGEMM's ``err == 0`` when posix_memalign fails) becomes ``oom`` with the sizes involved."""
    alloc_assert = "err == 0" in reason
    if kind != "oom" and not alloc_assert:
        return kind, reason
    sizes = ""
    if workload is not None and config is not None:
        try:
            need = sum(state_bytes(workload, config).values())
            have, what = capacity(device)
            sizes = f": the tables and dense state alone need {fmt_gib(need)}, on {what}"
        except Exception:  # noqa: BLE001 - the words are a courtesy; the failure stands without them
            sizes = ""
    return "oom", f"out of memory{sizes} (raised: {reason})"[:1000]

