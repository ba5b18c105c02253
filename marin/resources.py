"""Marin's older resource names, as shorthands for `executor.ResourceConfig`.

Marin experiment scripts written before `ResourceConfig.with_*` import these:

    from marin.resources import CpuOnlyConfig, GpuConfig, TpuPodConfig

    SimpleTrainConfig(..., resources=TpuPodConfig(tpu_type="v4-8", slice_count=2))

Each returns a `ResourceConfig` (Marin's were classes of their own). Note that
`marin.resources.GpuConfig` builds a whole ResourceConfig, while `executor.GpuConfig` is
the GPU *device* inside one (`ResourceConfig.device`), as in Marin's newer `fray` types.
"""

from __future__ import annotations

from executor.resources import ResourceConfig

__all__ = ["CpuOnlyConfig", "GpuConfig", "ResourceConfig", "TpuPodConfig"]


def CpuOnlyConfig(num_cpus: float = 1, **kwargs) -> ResourceConfig:
    """`num_cpus` CPUs, no accelerator; other keywords as `ResourceConfig.with_cpu`."""
    return ResourceConfig.with_cpu(cpu=num_cpus, **kwargs)


def GpuConfig(gpu_count: int = 1, accelerator_type: str | None = None, **kwargs) -> ResourceConfig:
    """`gpu_count` GPUs of `accelerator_type` (Ray's name, e.g. "H100"; None: any GPU);
    other keywords as `ResourceConfig.with_gpu`."""
    return ResourceConfig.with_gpu(accelerator_type or "auto", count=gpu_count, **kwargs)


def TpuPodConfig(tpu_type: str, slice_count: int = 1, **kwargs) -> ResourceConfig:
    """`slice_count` slices of `tpu_type` (e.g. "v4-128"); other keywords as `ResourceConfig.with_tpu`."""
    return ResourceConfig.with_tpu(tpu_type, slice_count=slice_count, **kwargs)
