"""Accelerator and cluster descriptions as data, each figure with its public source.

These feed *analytical models* (GPU GEMM time, simulated cluster step time). Nothing here is
measured on this machine; every figure derived from them is labelled as modelled/simulated.
A user describes their own device or cluster in YAML (:func:`load_device`, :func:`load_cluster`;
every field and its unit: docs/clusters.md).
"""

from __future__ import annotations

from pathlib import Path

from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from cubic.core.spec import Frozen, SpecError, parse_model, read_structured

H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (SXM5 column), nvidia.com/en-us/data-center/h100"
H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet (SXM column), nvidia.com/en-us/data-center/h200"
HOPPER_WHITEPAPER = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), sections on NVLink 4 and HBM3"
CX7_DATASHEET = "NVIDIA ConnectX-7 adapter datasheet: 400 Gb/s per port (one NIC per GPU in DGX H100)"
DGX_H100_GUIDE = "NVIDIA DGX H100 user guide: 8 GPUs per node, 8x ConnectX-7 400 Gb/s compute fabric"
A100_DATASHEET = "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column), nvidia.com/en-us/data-center/a100"
DGX_A100_GUIDE = "NVIDIA DGX A100 user guide: 8 GPUs per node, 8x ConnectX-6 200 Gb/s HDR compute fabric"


class DeviceSpec(Frozen):
    """One accelerator. FLOP/s are dense (no 2:4 sparsity); bandwidths in bytes/s."""

    name: str
    peak_flops_fp32: float = Field(gt=0)
    peak_flops_bf16: float = Field(gt=0)
    peak_flops_fp8: float = Field(gt=0)
    hbm_bytes: float = Field(gt=0)
    hbm_bw: float = Field(gt=0, description="bytes/s")
    sources: dict[str, str] = Field(default_factory=dict, description="figure -> public source")


class ClusterSpec(Frozen):
    """A cluster of identical devices. Per-GPU bandwidths, one direction, bytes/s; latencies in s.

    ``device`` is a known device's name (``h100``, ``h200``, ``a100``: the full datasheet spec, see
    :data:`DEVICES`) or a full :class:`DeviceSpec` mapping. ``world_size`` (optional) is the number
    of GPUs, so that ``--simulate FILE`` needs no ``xN``. docs/clusters.md documents every field."""

    name: str
    device: DeviceSpec
    world_size: int | None = Field(default=None, ge=1, le=1_000_000, description="GPUs in all (optional)")
    ranks_per_node: int = Field(default=8, ge=1)
    nvlink_bw: float = Field(gt=0, description="per GPU, one direction, within a node")
    network_bw: float = Field(gt=0, description="per GPU, one direction, between nodes")
    nvlink_latency_s: float = Field(default=3e-6, ge=0)
    network_latency_s: float = Field(default=10e-6, ge=0)
    sources: dict[str, str] = Field(default_factory=dict)
    collectives: dict[Literal["all_to_all", "all_reduce", "all_gather"], tuple[float, float, float]] = Field(
        default_factory=dict, description="(alpha_s, alpha_peer_s, beta_s_per_byte) of a collective a calibration "
        "fitted on its own (gloo on a CPU: cost_models.comm.CommModel.fitted); the rest are priced from the links")

    @field_validator("device", mode="before")
    @classmethod
    def _device_by_name(cls, value: Any) -> Any:
        """``device: h100`` is shorthand for the full H100 spec."""
        if isinstance(value, str):
            if value.strip().lower() not in DEVICES:
                raise PydanticCustomError("unknown_device", "unknown device '{name}' (known: {known}; or a full "
                                          "device mapping, see docs/clusters.md)",
                                          {"name": value, "known": ", ".join(DEVICES)})
            return DEVICES[value.strip().lower()]
        return value


H100_SXM = DeviceSpec(
    name="h100",
    peak_flops_fp32=67e12,
    peak_flops_bf16=989e12,
    peak_flops_fp8=1979e12,
    hbm_bytes=80e9,
    hbm_bw=3.35e12,
    sources={
        "peak_flops_fp32": H100_DATASHEET + " (FP32 67 TFLOPS)",
        "peak_flops_bf16": H100_DATASHEET + " (BF16 1,979 TFLOPS with sparsity -> 989 dense)",
        "peak_flops_fp8": H100_DATASHEET + " (FP8 3,958 TFLOPS with sparsity -> 1,979 dense)",
        "hbm_bytes": H100_DATASHEET + " (80 GB HBM3)",
        "hbm_bw": H100_DATASHEET + " (3.35 TB/s)",
    },
)

H200_SXM = DeviceSpec(
    name="h200",
    peak_flops_fp32=67e12,
    peak_flops_bf16=989e12,
    peak_flops_fp8=1979e12,
    hbm_bytes=141e9,
    hbm_bw=4.8e12,
    sources={
        "peak_flops_fp32": H200_DATASHEET + " (FP32 67 TFLOPS)",
        "peak_flops_bf16": H200_DATASHEET + " (BF16 1,979 TFLOPS with sparsity -> 989 dense)",
        "peak_flops_fp8": H200_DATASHEET + " (FP8 3,958 TFLOPS with sparsity -> 1,979 dense)",
        "hbm_bytes": H200_DATASHEET + " (141 GB HBM3e)",
        "hbm_bw": H200_DATASHEET + " (4.8 TB/s)",
    },
)

A100_SXM = DeviceSpec(
    name="a100",
    peak_flops_fp32=19.5e12,
    peak_flops_bf16=312e12,
    peak_flops_fp8=312e12,
    hbm_bytes=80e9,
    hbm_bw=2.039e12,
    sources={
        "peak_flops_fp32": A100_DATASHEET + " (FP32 19.5 TFLOPS)",
        "peak_flops_bf16": A100_DATASHEET + " (BF16 624 TFLOPS with sparsity -> 312 dense)",
        "peak_flops_fp8": "modelling assumption: the A100 has no FP8 tensor cores; FP8 GEMMs get the BF16 rate",
        "hbm_bytes": A100_DATASHEET + " (80 GB HBM2e)",
        "hbm_bw": A100_DATASHEET + " (2,039 GB/s)",
    },
)

_FABRIC_SOURCES = {
    "nvlink_bw": H100_DATASHEET + " (NVLink 900 GB/s bidirectional -> 450 GB/s per direction); " + HOPPER_WHITEPAPER,
    "network_bw": CX7_DATASHEET + " (400 Gb/s = 50 GB/s per GPU per direction); " + DGX_H100_GUIDE,
    "ranks_per_node": DGX_H100_GUIDE,
    "latencies": "modelling assumption: a few microseconds per NVLink hop, ~10 us per RDMA message",
}

_A100_FABRIC_SOURCES = {
    "nvlink_bw": A100_DATASHEET + " (NVLink 3 600 GB/s bidirectional -> 300 GB/s per direction)",
    "network_bw": DGX_A100_GUIDE + " (200 Gb/s = 25 GB/s per GPU per direction)",
    "ranks_per_node": DGX_A100_GUIDE,
    "latencies": _FABRIC_SOURCES["latencies"],
}

DEVICES: dict[str, DeviceSpec] = {d.name: d for d in (H100_SXM, H200_SXM, A100_SXM)}
CLUSTERS: dict[str, ClusterSpec] = {
    name: ClusterSpec(name=name, device=dev, ranks_per_node=8, nvlink_bw=nvlink, network_bw=net, sources=src)
    for name, dev, nvlink, net, src in (("h100", H100_SXM, 450e9, 50e9, _FABRIC_SOURCES),
                                        ("h200", H200_SXM, 450e9, 50e9, _FABRIC_SOURCES),
                                        ("a100", A100_SXM, 300e9, 25e9, _A100_FABRIC_SOURCES))
}


def load_device(name_or_path: str, field: str | None = None, source: str | None = None) -> DeviceSpec:
    """A device by name or from a YAML file; errors name ``field`` (the flag or the workload field that
    gave it, in ``source``: the workload file)."""
    if name_or_path in DEVICES:
        return DEVICES[name_or_path]
    if not Path(name_or_path).suffix:
        raise SpecError(f"unknown device {name_or_path!r} (known: {', '.join(DEVICES)}; or a YAML file)",
                        source=source if field else name_or_path, field=field)
    if field and not Path(name_or_path).is_file():
        raise SpecError(f"no such device file {name_or_path!r}", source=source, field=field)
    return parse_model(DeviceSpec, read_structured(name_or_path), source=name_or_path)


def load_cluster(name_or_path: str) -> ClusterSpec:
    if name_or_path in CLUSTERS:
        return CLUSTERS[name_or_path]
    if not Path(name_or_path).suffix:
        raise SpecError(f"unknown cluster (known: {', '.join(CLUSTERS)}; or a YAML file)", source=name_or_path)
    return parse_model(ClusterSpec, read_structured(name_or_path), source=name_or_path)
