"""Hardware and software fingerprint: which machine a measurement belongs to.

A repeated run of the same config is served from the store only on the same fingerprint hash, so
the hash covers what changes speed (CPU model, core count, device, torch build), not the hostname.
"""

from __future__ import annotations

import os
import platform
import subprocess
from functools import lru_cache
from typing import Any

from cubic.core.spec import stable_hash


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def check_device(device, field: str = "--device"):
    """``device`` as a torch.device this machine has (cpu, or a CUDA device it can see), else a one-line
    SpecError naming ``field``: asked for before anything runs or is recorded."""
    import torch

    from cubic.core.spec import SpecError

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise SpecError(f"not a device: {device!r} ({e})", field=field) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecError(f"{device}: CUDA is not available on this machine (torch {torch.__version__})",
                            field=field)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise SpecError(f"{device}: this machine has {torch.cuda.device_count()} CUDA device(s)", field=field)
    elif dev.type != "cpu":
        raise SpecError(f"{device}: cubic runs on cpu or cuda only", field=field)
    return dev


@lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    # Read installed distributions' metadata instead of importing them: importing torchrec, ray
    # and xgboost just for a version string costs seconds per process.
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for key, dist in (("torch", "torch"), ("numpy", "numpy"), ("fbgemm_gpu", "fbgemm-gpu-cpu"),
                      ("torchrec", "torchrec"), ("optuna", "optuna"), ("xgboost", "xgboost-cpu"),
                      ("ray", "ray"), ("torchao", "torchao")):
        for name in (dist, key):  # fbgemm/xgboost ship under CPU- or GPU-named distributions
            try:
                out[key] = version(name)
                break
            except PackageNotFoundError:
                continue
    out["cubic"] = code_version()
    return out


@lru_cache(maxsize=1)
def code_version() -> str:
    """The git commit of this checkout (with -dirty when code differs from it), or the package
    version outside git. ``results/`` does not count: a benchmark chain rewrites it between runs,
    and a result file is not code. CUBIC_CODE_VERSION, when set, wins: a tree copied to another
    machine (a lent GPU) can arrive beside a stale .git, and the command that copied it knows."""
    from cubic import __version__

    if os.environ.get("CUBIC_CODE_VERSION"):
        return os.environ["CUBIC_CODE_VERSION"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=here, capture_output=True,
                             text=True, timeout=5).stdout.strip() or here
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)results"], cwd=top,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        if sha:
            return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return __version__


@lru_cache(maxsize=4)
def fingerprint(device: str = "cpu") -> dict[str, Any]:
    import torch

    fp: dict[str, Any] = {
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count() or 1,
        "torch": torch.__version__,
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        fp["gpu_name"] = torch.cuda.get_device_name(0)
        fp["gpu_count"] = torch.cuda.device_count()
        fp["cuda"] = torch.version.cuda or ""
    return fp


def fingerprint_hash(fp: dict[str, Any]) -> str:
    return stable_hash(fp)


MACHINE_KEYS = ("machine", "cpu_model", "cpu_count")  # what makes a CPU measurement another machine's


def machine_differences(recorded: dict[str, Any] | None) -> list[str]:
    """The fingerprint keys (``MACHINE_KEYS``) on which ``recorded`` differs from this machine's CPU
    ([] when it was recorded here; every key when nothing was recorded)."""
    if not recorded:
        return list(MACHINE_KEYS)
    here = fingerprint("cpu")
    return [k for k in MACHINE_KEYS if recorded.get(k) != here.get(k)]


def user_data_dir() -> "os.PathLike[str]":
    """Where cubic writes what it fits on the user's machine (never the installed package):
    $CUBIC_HOME, else $XDG_DATA_HOME/cubic, else ~/.local/share/cubic."""
    from pathlib import Path

    if os.environ.get("CUBIC_HOME"):
        return Path(os.environ["CUBIC_HOME"])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "cubic"
