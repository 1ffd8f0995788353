"""Calibration hooks: fit the step model's efficiency factors to measured trials and report the error.

The step model (``cubic/runners/step_model.py``) is built from datasheet figures and a few assumed
efficiencies. Where real runs exist -- a user's GPU cluster, or this machine's CPU -- the factors
that matter most (GEMM efficiency, achieved memory/network bandwidth, overlap, a fixed per-step
overhead) are fitted to measured step times with ``scipy.optimize.least_squares`` on log step time,
and the fit's mean absolute percentage error (MAPE) is reported before and after. The same code then
predicts that cluster more accurately after a few real runs.

For this machine there is no GPU: :func:`measure_cpu_device` describes the CPU as a
:class:`~cost_models.hardware.DeviceSpec` from torch micro-benchmarks (peak GEMM FLOP/s per dtype,
memory bandwidth), and :func:`cpu_cluster` wraps it as a one-rank cluster, so measured CPU step times
(``cubic.runners.local.LocalRunner`` or measured trials in the store) can be fitted with the same model.

The calibrator is a scikit-learn estimator: ``X`` is a list of ``(workload, config, world_size)``
cases, ``y`` the measured step times in seconds; fitted attributes end in ``_``; it saves as JSON.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy.optimize import least_squares
from sklearn.base import BaseEstimator, RegressorMixin

from cost_models.hardware import ClusterSpec, DeviceSpec
from cubic.runners.step_model import DEFAULT_PARAMS, StepModelParams, plan_document, predict_step
from cubic.core.config import Config
from cubic.core.spec import SpecError, Workload

# factor -> (lower, upper) bound; efficiencies are fitted in log space, the rest linearly
FACTOR_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_eff": (1e-3, 10.0),
    "hbm_eff": (1e-3, 1.0),
    "nvlink_eff": (1e-3, 1.0),
    "net_eff": (1e-3, 1.0),
    "overlap": (0.0, 1.0),
    "step_overhead_s": (0.0, 10.0),
}
LOG_FACTORS = frozenset({"gemm_eff", "hbm_eff", "nvlink_eff", "net_eff"})
Case = tuple[Workload, Config, int]


def mape(y_true: Sequence[float], y_pred: Sequence[float]) -> float:
    """Mean absolute percentage error, in percent."""
    t, p = np.asarray(y_true, dtype=float), np.asarray(y_pred, dtype=float)
    return float(np.mean(np.abs(p - t) / np.abs(t)) * 100.0)


def check_factors(factors: Sequence[str], field: str = "factors") -> list[str]:
    """The factors to fit, each one the step model has (checked before any measurement is spent)."""
    factors = list(factors)
    unknown = [f for f in factors if f not in FACTOR_BOUNDS]
    if unknown or not factors:
        raise SpecError(f"unknown factor {unknown[0] if unknown else '(none)'} "
                        f"(fittable: {', '.join(FACTOR_BOUNDS)})", field=field)
    return factors


class StepModelCalibrator(BaseEstimator, RegressorMixin):
    """Fit ``factors`` of :class:`StepModelParams` so that predicted step times match measured ones.

    ``cluster``: the cluster the measurements come from; ``base_params``: the starting point (and the
    values of every factor not fitted). After ``fit``: ``params_`` (fitted StepModelParams),
    ``factors_`` (fitted values), ``mape_before_``/``mape_`` (percent, on the training cases),
    ``n_samples_``, ``cost_``.
    """

    def __init__(self, cluster: ClusterSpec | None = None,
                 factors: Sequence[str] = ("gemm_eff", "hbm_eff", "step_overhead_s"),
                 base_params: StepModelParams | None = None):
        self.cluster = cluster
        self.factors = factors
        self.base_params = base_params

    def _check(self) -> tuple[ClusterSpec, StepModelParams, list[str]]:
        if self.cluster is None:
            raise SpecError("a calibrator needs the cluster the measurements come from", field="cluster")
        return self.cluster, self.base_params or DEFAULT_PARAMS, check_factors(self.factors)

    @staticmethod
    def _predict_with(params: StepModelParams, cluster: ClusterSpec, X: Sequence[Case]) -> np.ndarray:
        out = []
        for workload, config, world_size in X:
            p = predict_step(workload, config, cluster, world_size, params)
            out.append(p.step_s if not p.oom else np.nan)
        return np.array(out)

    def fit(self, X: Sequence[Case], y: Sequence[float]) -> "StepModelCalibrator":
        cluster, base, factors = self._check()
        # pin each case's sharding plan: factors are fitted for the plan the measured run used
        X = [(w, c.model_copy(update={"sharding": c.sharding.model_copy(update={
                 "plan": plan_document(w, c, cluster, n, base)})}), n) for w, c, n in X]
        y = np.asarray(y, dtype=float)
        if len(X) != len(y) or len(X) < len(factors):
            raise SpecError(f"need at least {len(factors)} measured cases (one per factor) and one time per case, "
                            f"got {len(X)} cases and {len(y)} times", field="X")
        if np.any(~np.isfinite(y)) or np.any(y <= 0):
            raise SpecError("measured step times must be finite and > 0", field="y")

        def unpack(z: np.ndarray) -> StepModelParams:
            vals = {f: (float(np.exp(v)) if f in LOG_FACTORS else float(v)) for f, v in zip(factors, z)}
            return base.model_copy(update=vals)

        def residuals(z: np.ndarray) -> np.ndarray:
            pred = self._predict_with(unpack(z), cluster, X)
            pred = np.where(np.isfinite(pred) & (pred > 0), pred, 1e3)  # OOM/NaN: far off, not a crash
            return np.log(pred) - np.log(y)

        lo = np.array([np.log(FACTOR_BOUNDS[f][0]) if f in LOG_FACTORS else FACTOR_BOUNDS[f][0] for f in factors])
        hi = np.array([np.log(FACTOR_BOUNDS[f][1]) if f in LOG_FACTORS else FACTOR_BOUNDS[f][1] for f in factors])
        start = np.array([np.log(getattr(base, f)) if f in LOG_FACTORS else getattr(base, f) for f in factors])
        start = np.clip(start, lo + 1e-9, hi - 1e-9)
        # overhead starts at the smallest measured step share the model cannot explain, if positive
        if "step_overhead_s" in factors:
            gap = y - self._predict_with(base.model_copy(update={"step_overhead_s": 0.0}), cluster, X)
            start[factors.index("step_overhead_s")] = float(np.clip(np.nanmin(gap), 0.0, hi[factors.index("step_overhead_s")] - 1e-9))
        before = self._predict_with(base, cluster, X)
        sol = least_squares(residuals, start, bounds=(lo, hi), x_scale="jac", diff_step=1e-2, max_nfev=200)
        self.params_ = unpack(sol.x)
        self.factors_ = {f: getattr(self.params_, f) for f in factors}
        self.mape_before_ = mape(y, before)
        self.mape_ = mape(y, self._predict_with(self.params_, cluster, X))
        self.n_samples_ = len(X)
        self.cost_ = float(sol.cost)
        return self

    def leave_one_out_mape(self, X: Sequence[Case], y: Sequence[float]) -> float:
        """Held-out error: refit without each case in turn and predict it (percent)."""
        X, y = list(X), list(y)
        preds = []
        for i in range(len(X)):
            rest = [j for j in range(len(X)) if j != i]
            m = StepModelCalibrator(self.cluster, self.factors, self.base_params).fit([X[j] for j in rest],
                                                                                       [y[j] for j in rest])
            preds.append(m.predict([X[i]])[0])
        return mape(y, preds)

    def predict(self, X: Sequence[Case]) -> np.ndarray:
        """Predicted step times (s) with the fitted parameters (NaN where the model says OOM)."""
        if not hasattr(self, "params_"):
            raise ValueError("call fit() first")
        return self._predict_with(self.params_, self.cluster, list(X))

    def report(self) -> dict[str, Any]:
        return {"factors": self.factors_, "mape_before_pct": self.mape_before_, "mape_pct": self.mape_,
                "n_samples": self.n_samples_, "cluster": self.cluster.name}

    def to_json(self) -> str:
        """Fitted parameters plus the fit report and the cluster (the calibration a user keeps)."""
        return json.dumps({"version": 1, "params": self.params_.model_dump(mode="json"), "report": self.report(),
                           "cluster_spec": self.cluster.model_dump(mode="json")}, indent=1)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.to_json() + "\n")
        return p


# --------------------------------------------------------------------------------------------
# This machine's CPU as a device


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def _cpu_memory_bytes() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _cpu_cache_bytes() -> float:
    """The last-level cache (index3 = L3, else L2) from sysfs; 32 MB if unknown."""
    for idx in ("index3", "index2"):
        try:
            text = Path(f"/sys/devices/system/cpu/cpu0/cache/{idx}/size").read_text().strip()
            mult = {"K": 1024, "M": 1024**2}.get(text[-1], 1)
            return float(text.rstrip("KM")) * mult
        except (OSError, ValueError):
            continue
    return 32e6


def measure_cpu_device(threads: int | None = None, shape: tuple[int, int, int] = (2048, 128, 128),
                       repeats: int = 5) -> DeviceSpec:
    """This CPU as a DeviceSpec: MEASURED GEMM FLOP/s per dtype and memory bandwidth (large copy),
    with ``threads`` torch threads (default: torch's current setting).

    The GEMM is recommendation-sized ([2048 x 128] @ [128 x 128] by default), not a large square one:
    on a CPU, bf16 reaches its peak only on large GEMMs (3-6x less at K = N = 256), and the dense
    layers of these models are small. FP8 is timed through :func:`fp8.recipes.scaled_matmul` with
    rowwise scales, quantization included: that is the path the runner's FP8 linears take on CPU
    (the tensorwise path of ``_scaled_mm`` on CPU is a reference loop ~1000x slower, which the
    runner avoids)."""
    import torch

    from fp8.recipes import scaled_matmul

    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        m, k, n = shape
        a = torch.randn(m, k)
        b = torch.randn(n, k)
        flops = 2.0 * m * k * n
        fp32 = flops / _median_time(lambda: a @ b.t(), repeats)
        # bf16 as autocast runs it on CPU: fp32 activations cast in, the product cast back for the
        # fp32 ops around it (on small GEMMs the casts cost as much as the bf16 speed-up saves)
        bb = b.bfloat16()
        bf16 = flops / _median_time(lambda: (a.bfloat16() @ bb.t()).float(), repeats)
        try:
            fp8 = flops / _median_time(lambda: scaled_matmul(a, b, "rowwise"), repeats)
        except (RuntimeError, AttributeError, TypeError):  # no fp8 GEMM in this build
            fp8 = bf16
        nb = 32 * 1024 * 1024  # 128 MB of fp32: well beyond the caches
        src, dst = torch.empty(nb).uniform_(), torch.empty(nb)
        bw = 2 * nb * 4 / _median_time(lambda: dst.copy_(src), repeats)
    finally:
        torch.set_num_threads(old)
    note = (f"MEASURED on this machine with torch micro-benchmarks ({threads or old} threads, median of "
            f"{repeats}, GEMM {m}x{k}x{n})")
    return DeviceSpec(name="cpu", peak_flops_fp32=fp32, peak_flops_bf16=bf16, peak_flops_fp8=fp8,
                      hbm_bytes=_cpu_memory_bytes(), hbm_bw=bw,
                      sources={k: note for k in ("peak_flops_fp32", "peak_flops_bf16", "peak_flops_fp8", "hbm_bw")}
                      | {"hbm_bytes": "/proc/meminfo MemTotal"})


_CPU_DEVICES: dict[int, DeviceSpec] = {}


def cpu_device(threads: int = 1, cache_dir: str | Path = ".cubic") -> DeviceSpec:
    """:func:`measure_cpu_device`, measured once per machine fingerprint and thread count and kept in
    ``cache_dir`` (it takes seconds, and a campaign's prior must not change when it is resumed, or
    when the machine happened to be busy during one measurement)."""
    if threads in _CPU_DEVICES:
        return _CPU_DEVICES[threads]
    from cubic.core.fingerprint import fingerprint, fingerprint_hash

    path = Path(cache_dir) / f"cpu_device-{fingerprint_hash(fingerprint('cpu'))}-t{threads}.json"
    device = None
    if path.is_file():
        try:
            device = DeviceSpec.model_validate_json(path.read_text())
        except ValueError:  # a damaged cache is measured again, not trusted
            device = None
    if device is None:
        device = measure_cpu_device(threads)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(device.model_dump_json(indent=1))
            os.replace(tmp, path)  # atomic: concurrent campaigns never read half a file
        except OSError:
            pass  # a read-only directory: measure per process
    _CPU_DEVICES[threads] = device
    return device


def cpu_cluster(device: DeviceSpec) -> ClusterSpec:
    """A one-rank 'cluster' of this CPU (no interconnect is used at world size 1)."""
    return ClusterSpec(name="cpu", device=device, ranks_per_node=1, nvlink_bw=device.hbm_bw,
                       network_bw=device.hbm_bw, nvlink_latency_s=0.0, network_latency_s=0.0,
                       sources={"nvlink_bw": "unused at world size 1", "network_bw": "unused at world size 1"})


def cpu_gloo_cluster(device: DeviceSpec, ranks: int, calibration: str | None = None) -> tuple[ClusterSpec, dict]:
    """``ranks`` gloo processes on this CPU as a one-node cluster whose links are the gloo calibration
    (``cubic shard calibrate-comm``; default: the user's, else the packaged one) for that many processes
    (its oversubscribed fit when they outnumber the cores): each collective its own fit (``collectives``).

    Returns the cluster and the step-model parameter overrides that make its collectives the
    calibration's alpha-beta lines (efficiency 1: the calibration is already the achieved rate)."""
    from cost_models.comm import CommModel

    cal = CommModel.calibrated(calibration, processes=ranks)
    bw = 1.0 / cal.beta_intra_s_per_byte
    o = dict(cal.origin)
    src = f"gloo calibration {o.get('file')} (this machine: {o.get('this_machine')}; fit: {o.get('fit')})"
    cluster = ClusterSpec(name="cpu-gloo", device=device, ranks_per_node=max(1, int(ranks)), nvlink_bw=bw,
                          network_bw=bw, nvlink_latency_s=cal.alpha_s, network_latency_s=cal.alpha_s,
                          sources={"nvlink_bw": src, "network_bw": src, "latency": src},
                          collectives={"all_to_all": (cal.alpha_s, cal.alpha_peer_s, cal.beta_intra_s_per_byte),
                                       **{k: tuple(c) for k, *c in cal.fitted}})
    return cluster, {"nvlink_eff": 1.0, "net_eff": 1.0, "a2a_peer_overhead_s": min(cal.alpha_peer_s, 1e-3)}


def cpu_gloo_model(device: DeviceSpec, ranks: int, threads: int = 1,
                   calibration: str | None = None) -> tuple[ClusterSpec, StepModelParams]:
    """The step model of ``ranks`` gloo processes on this CPU, ``threads`` intra-op threads each: the
    cluster of :func:`cpu_gloo_cluster` and this CPU's constants (:func:`cpu_params`) with its link
    overrides. The two go together: the cluster's links at the default efficiencies would not be the
    calibration's lines."""
    cluster, comm = cpu_gloo_cluster(device, ranks, calibration)
    return cluster, cpu_params(threads).model_copy(update=comm)


def cpu_params(threads: int = 1, base: StepModelParams = DEFAULT_PARAMS) -> StepModelParams:
    """Step-model constants that describe a CPU instead of an H100 (before calibration).

    The GEMM model's SM/tile/wave terms are mapped onto cores and small register tiles; a kernel
    costs a PyTorch eager dispatch (~10 us) instead of a GPU launch; the 'L2' is the last-level cache.
    """
    return base.model_copy(update={
        "gemm_constants": {"num_sms": max(1, threads), "tiles": [[8, 32, 1.0]], "k_fill_tiles": 0.0,
                           "kernel_overhead_s": 10e-6, "fp32_gemm_frac": 1.0, "achievable_gemm_frac": 1.0,
                           "achievable_mem_frac": 1.0},
        "l2_bytes": _cpu_cache_bytes(),
        "l2_bw_ratio": 2.0,
        "reserved_bytes": 0.5e9,
        "sort_passes": 4.0,
        "hbm_eff": 0.5,
    })
