"""Hardware profiles, and a context that makes torch's estimators compute for one.

torch's cost estimators (``torch/_inductor/comm_analysis.py`` for collectives,
``torch/utils/_runtime_estimation.py`` for the roofline used by
``overlap_scheduling.estimate_roofline_runtime_ms`` and
``fusion_regions.estimate_fused_node_costs``) query the local device. On a CPU-only
machine without triton they fall back to an Ampere GPU type, 8 GPUs per node, 0 TFLOP/s,
and ``get_gpu_dram_gbps`` fails (it imports triton). ``hardware_context(profile)``
replaces, for its duration only, exactly these module attributes and restores the saved
originals on exit:

``torch._inductor.comm_analysis``
  * ``get_gpu_type`` -> ``NVIDIA_GPU_TYPE[profile.gpu_generation]``. The original is an
    ``lru_cache``d device query; its cache is left untouched.
  * ``_has_nvlink`` -> ``True`` (every profile is an NVLink/NVSwitch node). Also keeps
    the original from running ``nvidia-smi`` once the proxy below reports a GPU count.
  * ``torch`` (the module global that ``comm_analysis`` resolves ``torch.cuda`` through)
    -> a proxy whose ``cuda.is_available()`` is True and ``cuda.device_count()`` is
    ``profile.gpus_per_node``; every other attribute is the real ``torch``. This is how
    ``_nccl_algo_time`` and ``detect_interconnect`` get gpus_per_node, without changing
    ``torch.cuda`` for the rest of the process (FakeTensor, flop counter, ...).

``torch._inductor.config`` (via ``config.patch``), only for fields the profile sets:
  * ``intra_node_bw`` <- ``profile.intra_node_bw_gbps``
  * ``inter_node_bw`` <- ``profile.inter_node_bw_gbps``
  (``None`` in the profile leaves the user's config, or comm_analysis' per-generation
  default, in force.)

``torch.utils._runtime_estimation`` (it imported these names from
``torch._inductor.utils``, so its own module globals are what the roofline calls):
  * ``get_gpu_dram_gbps`` -> ``profile.memory_bandwidth_gbps``
  * ``get_device_tflops`` -> ``profile.tflops(dtype)``
  * ``flops_to_ns`` -> ``flops / (profile.tflops(dtype) * 1e12)`` seconds (on a torch
    without it, ``get_device_tflops`` is scaled so its inline formula gives the same). Replaced, not
    reused: torch's version halves the FLOP count ("FLOPs to MACs") and divides by 75% of
    the peak. That matches triton's MAC-per-second fallback numbers, but with the dense
    datasheet FLOP/s that ``get_device_tflops`` returns on a real GPU it prices a GEMM
    1.5x *faster than peak*. Ours is the textbook roofline at the profile's peak.

``torch._inductor.utils.get_device_tflops``/``get_gpu_dram_gbps`` themselves are not
patched (Inductor's scheduler imported them by name; nothing on our path calls them).

Nesting is safe (each level saves and restores what it replaced, LIFO), with the same or
a different profile. It is NOT thread-safe: the patches are process-global while active.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)

__all__ = ["HardwareProfile", "PROFILES", "get_profile", "hardware_context"]

_GENERATIONS = ("volta", "ampere", "hopper", "blackwell")


@dataclass(frozen=True)
class HardwareProfile:
    """Peak numbers of one GPU model in a multi-GPU node.

    ``peak_tflops`` holds dense (non-sparse) TFLOP/s keyed by dtype name
    (``str(dtype)`` without ``torch.``). The key ``"tf32"`` is the tensor-core rate used
    for float32 when ``torch.backends.cuda.matmul.fp32_precision == "tf32"``; otherwise
    float32 uses ``"float32"`` (the SIMD rate), as torch's
    ``datasheet_tops`` does. Lookup is by the op's *output* dtype (torch's convention).
    """

    name: str
    peak_tflops: Mapping[str, float]
    memory_bandwidth_gbps: float  # HBM GB/s == bytes/ns
    kernel_launch_overhead_ns: int  # GPU-side time per kernel launch (gap + ramp)
    gpus_per_node: int = 8
    gpu_generation: str = "hopper"
    intra_node_bw_gbps: float | None = None
    inter_node_bw_gbps: float | None = None
    _peak_items: tuple[tuple[str, float], ...] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.gpu_generation.lower() not in _GENERATIONS:
            raise ValueError(
                f"HardwareProfile {self.name!r}: unknown gpu_generation "
                f"{self.gpu_generation!r}; expected one of {_GENERATIONS}"
            )
        if self.memory_bandwidth_gbps <= 0 or self.gpus_per_node < 1:
            raise ValueError(
                f"HardwareProfile {self.name!r}: memory_bandwidth_gbps and "
                "gpus_per_node must be positive"
            )
        peaks = {str(k).removeprefix("torch."): float(v) for k, v in self.peak_tflops.items()}
        object.__setattr__(self, "peak_tflops", types.MappingProxyType(peaks))
        object.__setattr__(self, "_peak_items", tuple(sorted(peaks.items())))

    def __hash__(self) -> int:
        return hash(
            (
                self.name,
                self._peak_items,
                self.memory_bandwidth_gbps,
                self.kernel_launch_overhead_ns,
                self.gpus_per_node,
                self.gpu_generation,
                self.intra_node_bw_gbps,
                self.inter_node_bw_gbps,
            )
        )

    def tflops(self, dtype: torch.dtype | str) -> float:
        """Dense peak TFLOP/s for ``dtype`` (tf32 rule for float32, see class doc)."""
        key = str(dtype).removeprefix("torch.")
        if key == "float32" and "tf32" in self.peak_tflops and _tf32_enabled():
            key = "tf32"
        try:
            return self.peak_tflops[key]
        except KeyError:
            raise ValueError(
                f"hardware profile {self.name!r} has no peak TFLOP/s for dtype {key!r}; "
                f"known: {sorted(self.peak_tflops)}"
            ) from None


def _tf32_enabled() -> bool:
    # torch's own rule (utils.get_device_tflops). Not ``allow_tf32``: reading the legacy
    # flag raises once the new API has been used.
    try:
        return torch.backends.cuda.matmul.fp32_precision == "tf32"
    except (AttributeError, RuntimeError):
        return False


# Numbers are per GPU from NVIDIA's datasheets; sparse tensor-core figures halved to
# dense (torch's device_info.py does the same for H100: 1979/2). The launch overhead is
# the GPU-side cost of one extra kernel (launch latency + wave ramp), not CPU dispatch.
PROFILES: dict[str, HardwareProfile] = {
    # H100 SXM5 80GB: BF16/FP16 989, TF32 494.5, FP32 (SIMD) 67, FP64 TC 67,
    # FP8/INT8 1979; HBM3 3.35 TB/s; NVLink4 (comm_analysis: 370 GB/s), IB NDR.
    "h100": HardwareProfile(
        name="h100",
        peak_tflops={
            "bfloat16": 989.0,
            "float16": 989.0,
            "tf32": 494.5,
            "float32": 67.0,
            "float64": 67.0,
            "float8_e4m3fn": 1979.0,
            "float8_e5m2": 1979.0,
            "float8_e4m3fnuz": 1979.0,
            "float8_e5m2fnuz": 1979.0,
            "int8": 1979.0,
        },
        memory_bandwidth_gbps=3350.0,
        kernel_launch_overhead_ns=2000,
        gpus_per_node=8,
        gpu_generation="hopper",
    ),
    # A100 SXM4 80GB: BF16/FP16 312, TF32 156, FP32 19.5, FP64 TC 19.5, INT8 624;
    # HBM2e 2.039 TB/s; NVLink3, IB HDR.
    "a100": HardwareProfile(
        name="a100",
        peak_tflops={
            "bfloat16": 312.0,
            "float16": 312.0,
            "tf32": 156.0,
            "float32": 19.5,
            "float64": 19.5,
            "int8": 624.0,
        },
        memory_bandwidth_gbps=2039.0,
        kernel_launch_overhead_ns=2000,
        gpus_per_node=8,
        gpu_generation="ampere",
    ),
    # B200 (HGX B200, per GPU): BF16/FP16 2250, TF32 1125, FP32 75, FP64 37,
    # FP8/INT8 4500; HBM3e 8 TB/s; NVLink5, IB NDR.
    "b200": HardwareProfile(
        name="b200",
        peak_tflops={
            "bfloat16": 2250.0,
            "float16": 2250.0,
            "tf32": 1125.0,
            "float32": 75.0,
            "float64": 37.0,
            "float8_e4m3fn": 4500.0,
            "float8_e5m2": 4500.0,
            "int8": 4500.0,
        },
        memory_bandwidth_gbps=8000.0,
        kernel_launch_overhead_ns=2000,
        gpus_per_node=8,
        gpu_generation="blackwell",
    ),
}


def get_profile(name_or_profile: str | HardwareProfile) -> HardwareProfile:
    """Return ``name_or_profile`` if it is a profile, else the named one in ``PROFILES``."""
    if isinstance(name_or_profile, HardwareProfile):
        return name_or_profile
    key = str(name_or_profile).strip().lower()
    if key not in PROFILES:
        raise ValueError(
            f"unknown hardware profile {name_or_profile!r}; known: {sorted(PROFILES)}"
        )
    return PROFILES[key]


class _CudaProxy:
    """``torch.cuda`` as seen by comm_analysis: a node of ``gpus_per_node`` GPUs."""

    def __init__(self, gpus_per_node: int) -> None:
        self._n = gpus_per_node

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self._n

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _TorchProxy:
    """The real ``torch`` module except for ``.cuda`` (see ``_CudaProxy``)."""

    def __init__(self, gpus_per_node: int) -> None:
        self.cuda = _CudaProxy(gpus_per_node)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _make_flops_to_ns(profile: HardwareProfile) -> Any:
    def flops_to_ns(flops: float | int, dtype: torch.dtype) -> float:
        # Textbook roofline: FLOPs / peak FLOP/s (see module docstring for why
        # torch's flops_to_ns is not used).
        return float(flops) / (profile.tflops(dtype) * 1e12) * 1e9

    return flops_to_ns


# torch before 2.13 has no ``flops_to_ns``: its ``get_compute_time`` prices
# ``(flops / 2) / (0.75 * get_device_tflops(dtype) * 1e15)`` seconds inline. Reporting the peak
# divided by this factor makes that exactly ``flops / (tflops * 1e12)``, the textbook roofline.
_INLINE_ROOFLINE_SCALE = 1e15 * 0.75 * 2 / 1e12


def _roofline_patch(runtime_estimation: Any, profile: HardwareProfile) -> dict[str, Any]:
    """The ``torch.utils._runtime_estimation`` attributes to replace for ``profile``: the same
    FLOP-time for the installed torch whether or not it has ``flops_to_ns``."""
    values: dict[str, Any] = {"get_gpu_dram_gbps": lambda: profile.memory_bandwidth_gbps}
    if hasattr(runtime_estimation, "flops_to_ns"):
        values["get_device_tflops"] = profile.tflops
        values["flops_to_ns"] = _make_flops_to_ns(profile)
    else:
        values["get_device_tflops"] = lambda dtype: profile.tflops(dtype) / _INLINE_ROOFLINE_SCALE
    return values


@contextmanager
def _patch_attrs(module: Any, values: dict[str, Any], optional: tuple[str, ...] = ()) -> Iterator[None]:
    """Set ``module``'s attributes to ``values`` for the block. A name in ``optional`` that the
    installed torch lacks is skipped (``comm_analysis._has_nvlink`` came after torch 2.11); any
    other missing name is an error, since patching it would silently do nothing."""
    values = {name: v for name, v in values.items() if name not in optional or hasattr(module, name)}
    saved = {name: getattr(module, name) for name in values}
    try:
        for name, value in values.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


@contextmanager
def hardware_context(profile: HardwareProfile | str) -> Iterator[HardwareProfile]:
    """Make torch's estimators compute for ``profile`` (see the module docstring)."""
    import torch._inductor.comm_analysis as comm_analysis
    import torch._inductor.config as inductor_config
    import torch.utils._runtime_estimation as runtime_estimation

    profile = get_profile(profile)
    gpu_type = comm_analysis.NVIDIA_GPU_TYPE[profile.gpu_generation.upper()]
    config_patch: dict[str, float] = {}
    if profile.intra_node_bw_gbps is not None:
        config_patch["intra_node_bw"] = float(profile.intra_node_bw_gbps)
    if profile.inter_node_bw_gbps is not None:
        config_patch["inter_node_bw"] = float(profile.inter_node_bw_gbps)

    with ExitStack() as stack:
        stack.enter_context(
            _patch_attrs(
                comm_analysis,
                {
                    "get_gpu_type": lambda: gpu_type,
                    "_has_nvlink": lambda: True,
                    "torch": _TorchProxy(profile.gpus_per_node),
                },
                optional=("_has_nvlink",),
            )
        )
        stack.enter_context(_patch_attrs(runtime_estimation, _roofline_patch(runtime_estimation, profile)))
        if config_patch:
            stack.enter_context(inductor_config.patch(config_patch))
        yield profile
