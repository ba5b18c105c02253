"""What a step asks the cluster for: CPUs, memory, disk and one device (CPU, GPU or TPU).

    ResourceConfig.with_cpu(cpu=4, ram="16g")
    ResourceConfig.with_gpu("H100", count=8)
    ResourceConfig.with_tpu("v4-8")                    # one v4-8 slice
    ResourceConfig.with_tpu(["v5p-8", "v4-8"], slice_count=2)   # v5p-8 preferred, v4-8 accepted

The shape and the constructors follow Marin's `ResourceConfig` (in `fray`), so an
experiment script's `resources=ResourceConfig.with_tpu(...)` ports unchanged.

A step's resources are a field of the `ExecutorStep`, not of its config: they never
enter the version hash (the same computation on a GPU or a TPU is the same output), and
they are recorded in `.executor_info` under "resources" (see `ResourceConfig.as_record`).
`ExecutorStep(resources=...)` also takes a plain dict, kept as written (what
`marin.defaults` passed before this module existed), or None for a light step.

How it maps to Ray (`ray_options`): `num_cpus`, `memory` (bytes), `num_gpus`, and custom
`resources`. A GPU of a named variant adds a tiny `accelerator_type:<name>` request (Ray's
node label for the GPU model); a TPU asks for the chips of one host plus the slice's head
resource `TPU-<variant>-head`, which Ray puts on worker 0 of each slice (Ray's TPU
accelerator manager, as Levanter's `run_on_pod` uses it). A backend then starts one task
per host of the slice (`TpuConfig.host_count`) and one slice per replica.
`preemptible` and `regions` have no Ray option: backends read them from the config.

Bad values are refused when the config is built, with a `StepDefinitionError` naming the
field, the value and what is accepted: at the top of an experiment script, `executor_main`
prints it as one `file:line: error` line.

Only the standard library is imported here: `import executor` stays cheap.
"""

from __future__ import annotations

import math
from typing import Any

from executor.records import dataclass
from executor.step_errors import StepDefinitionError  # re-exported: raised by the configs below

_RAY_GPU_TYPES = (
    "V100",
    "P100",
    "T4",
    "P4",
    "K80",
    "A10G",
    "L4",
    "L40S",
    "A100",
    "A100-40G",
    "A100-80G",
    "H100",
    "H200",
    "H20",
    "B200",
    "B300",
    "GB200",
    "GB300",
    "RTX-PRO-6000",
)
"""NVIDIA accelerator type names as Ray spells them (`ray.util.accelerators.accelerators`)."""

_RAY_GPU_TYPE_BY_LOWER = {name.lower(): name for name in _RAY_GPU_TYPES}

_TPU_SINGLE_CORE_CHIPS = ("v5litepod", "v6e")
"""TPU generations with one TensorCore per chip (the `-<n>` of their variant counts chips);
the others have two (it counts cores). As in Ray's `_private/accelerators/tpu.py`."""

_TPU_8_CHIPS_PER_HOST = ("v5litepod", "v6e")
"""Generations whose single-host slices put up to 8 chips on one VM; every other slice has
4 chips per host (Ray's `get_num_tpu_visible_chips_per_host`)."""

_TPU_DEFAULT_CHIPS_PER_HOST = 4

_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
"""Binary multipliers of a size suffix (k, m, g, t; optionally followed by "b" or "ib")."""

_UNIT_LETTERS = ("k", "m", "g", "t")

_SIZE_HELP = (
    'a number of bytes with an optional unit k, m, g or t (binary, any case, optionally followed by "b" '
    'or "ib"), e.g. "16g", "512m", "1.5g", "2t" or "1024"'
)


def _check_positive_int(owner: str, name: str, value: Any) -> None:
    if type(value) is not int or value < 1:
        raise StepDefinitionError(f"{owner}.{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class CpuConfig:
    """No accelerator: the step runs on CPUs only."""

    @property
    def kind(self) -> str:
        return "cpu"

    def describe(self) -> str:
        return "CPU"

    def as_record(self) -> dict[str, Any]:
        return {"__type__": "CpuConfig"}


@dataclass(frozen=True)
class GpuConfig:
    """`count` GPUs of one `variant` on one host."""

    variant: str = "auto"
    """The GPU model, e.g. "H100", "A100-80G" (Ray's names, any case: "h100" is stored as
    "H100"), or "auto": any GPU."""

    count: int = 1
    """GPUs per host."""

    def __post_init__(self):
        if not isinstance(self.variant, str) or not self.variant.strip():
            raise StepDefinitionError(
                f'GpuConfig.variant must be a GPU model name or "auto", got {self.variant!r}'
            )
        _check_positive_int("GpuConfig", "count", self.count)
        lower = self.variant.strip().lower()
        canonical = "auto" if lower == "auto" else _RAY_GPU_TYPE_BY_LOWER.get(lower, self.variant.strip())
        if canonical != self.variant:
            object.__setattr__(self, "variant", canonical)

    @property
    def kind(self) -> str:
        return "gpu"

    @property
    def ray_accelerator_type(self) -> str | None:
        """Ray's accelerator type name of this variant; None for "auto". A variant Ray does
        not name is passed through as written (a custom node label)."""
        return None if self.variant == "auto" else self.variant

    def describe(self) -> str:
        return f"GPU x{self.count}" if self.variant == "auto" else f"GPU {self.variant} x{self.count}"

    def as_record(self) -> dict[str, Any]:
        return {"__type__": "GpuConfig", "variant": self.variant, "count": self.count}


@dataclass(frozen=True)
class TpuConfig:
    """One Cloud TPU slice, named by its GCP accelerator type."""

    variant: str
    """GCP accelerator type `v<generation>-<size>`, e.g. "v4-8", "v5p-8", "v5litepod-16",
    "v6e-8" (lower case). The size counts TensorCores (chips for v5litepod and v6e)."""

    topology: str | None = None
    """Chip topology, e.g. "2x2x1"; None: the variant's default. Recorded for backends."""

    def __post_init__(self):
        if not isinstance(self.variant, str):
            raise StepDefinitionError(f"TpuConfig.variant must be a string like 'v4-8', got {self.variant!r}")
        variant = self.variant.strip().lower()
        generation, _, size = variant.partition("-")
        digits = generation[1:].rstrip("abcdefghijklmnopqrstuvwxyz")  # "v5litepod" -> "5"
        letters = generation[1 + len(digits) :]
        valid = (
            generation.startswith("v")
            and digits.isascii()
            and digits.isdigit()
            and (letters == "" or (letters.isascii() and letters.isalpha()))
            and size.isascii()
            and size.isdigit()
            and int(size) > 0
        )
        if not valid:
            raise StepDefinitionError(
                f"TpuConfig.variant {self.variant!r} is not a TPU type: expected v<generation>[letters]-<size>, "
                "e.g. 'v4-8', 'v5p-8', 'v5litepod-16', 'v6e-8'"
            )
        if variant != self.variant:
            object.__setattr__(self, "variant", variant)
        if self.topology is not None:
            dims = self.topology.split("x") if isinstance(self.topology, str) else []
            if not dims or not all(d.isascii() and d.isdigit() and int(d) > 0 for d in dims):
                raise StepDefinitionError(
                    f"TpuConfig.topology must be None or dimensions joined by 'x' (e.g. '2x2x1'), "
                    f"got {self.topology!r}"
                )

    @property
    def kind(self) -> str:
        return "tpu"

    @property
    def generation(self) -> str:
        """The part before the size: "v4", "v5p", "v5litepod", "v6e"."""
        return self.variant.partition("-")[0]

    @property
    def chip_count(self) -> int:
        """Chips in the slice."""
        size = int(self.variant.partition("-")[2])
        return size if self.generation in _TPU_SINGLE_CORE_CHIPS else max(1, size // 2)

    @property
    def chips_per_host(self) -> int:
        """Chips on each host (VM) of the slice, as Ray counts its "TPU" resource."""
        if self.generation in _TPU_8_CHIPS_PER_HOST and self.chip_count <= 8:
            return self.chip_count
        return min(_TPU_DEFAULT_CHIPS_PER_HOST, self.chip_count)

    @property
    def host_count(self) -> int:
        """Hosts (VMs) in the slice."""
        return -(-self.chip_count // self.chips_per_host)

    def describe(self) -> str:
        return f"TPU {self.variant}" if self.topology is None else f"TPU {self.variant} ({self.topology})"

    def as_record(self) -> dict[str, Any]:
        return {"__type__": "TpuConfig", "variant": self.variant, "topology": self.topology}


DeviceConfig = CpuConfig | GpuConfig | TpuConfig
"""One device kind a step can run on."""

_DEVICE_TYPES = (CpuConfig, GpuConfig, TpuConfig)


def parse_size(text: str, field: str = "size") -> int:
    """Bytes of a size string: "16g", "16G", "16gb", "16GiB", "512m", "1.5g", "2t", "1024".

    Units are binary (g = 2**30). Raises ValueError naming `field`, the value and the accepted forms.
    """
    if not isinstance(text, str):
        raise ValueError(f"{field} must be a string ({_SIZE_HELP}), got {text!r}")
    body = text.strip().lower()
    if body.endswith("ib") and body[-3:-2] in _UNIT_LETTERS:  # "16gib"
        body = body[:-2]
    elif body.endswith("b"):  # "16gb", "1024b"
        body = body[:-1]
    unit = body[-1] if body[-1:] in _UNIT_LETTERS else ""
    number = body[: len(body) - len(unit)]
    if not (number.replace(".", "", 1).isdigit() and number.isascii()):
        raise ValueError(f"{field} {text!r} is not a size: expected {_SIZE_HELP}")
    value = float(number) * _SIZE_UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"{field} {text!r} must be at least 1 byte: expected {_SIZE_HELP}")
    return int(value)


@dataclass(frozen=True)
class ResourceConfig:
    """What one step asks for. Build one with `with_cpu`, `with_gpu` or `with_tpu`."""

    cpu: float = 1
    """CPU cores per replica (Ray's `num_cpus`; fractions allowed). Must be > 0."""

    ram: str | None = None
    """Memory per replica, e.g. "16g", "512m" (binary units, see `parse_size`); None: no
    memory request (Ray's `memory`)."""

    disk: str | None = None
    """Local disk per replica, same format as `ram`; None: no request. Ray has no disk
    resource: backends that provision machines read it."""

    device: DeviceConfig = CpuConfig()
    """The preferred device: `CpuConfig()`, `GpuConfig(...)` or `TpuConfig(...)`."""

    preemptible: bool = True
    """Whether the step may run on preemptible (spot) capacity. Recorded for backends; a
    preempted step is re-run and resumes from its own checkpoints."""

    regions: tuple[str, ...] | None = None
    """Cloud regions the step may run in (e.g. ("us-central2",)); None: anywhere."""

    replicas: int = 1
    """Hosts (or processes) that run the step together; for TPUs, the number of slices
    (`with_tpu(slice_count=...)`). Must be >= 1."""

    device_alternatives: tuple[DeviceConfig, ...] = ()
    """Other acceptable devices, in order of preference after `device`."""

    def __post_init__(self):
        if type(self.cpu) not in (int, float) or not math.isfinite(self.cpu) or self.cpu <= 0:
            raise StepDefinitionError(
                f"ResourceConfig.cpu must be a number > 0, got {self.cpu!r}: give the CPU cores per "
                "replica, e.g. cpu=4 or cpu=0.5"
            )
        for name in ("ram", "disk"):
            value = getattr(self, name)
            if value is not None:
                try:
                    parse_size(value, f"ResourceConfig.{name}")
                except ValueError as error:
                    raise StepDefinitionError(str(error)) from None
        if not isinstance(self.device, _DEVICE_TYPES):
            raise StepDefinitionError(
                f"ResourceConfig.device must be a CpuConfig, GpuConfig or TpuConfig, got {self.device!r}"
            )
        if type(self.preemptible) is not bool:
            raise StepDefinitionError(
                f"ResourceConfig.preemptible must be True or False, got {self.preemptible!r}"
            )
        if self.regions is not None:
            if isinstance(self.regions, str) or not isinstance(self.regions, (list, tuple)):
                raise StepDefinitionError(
                    f"ResourceConfig.regions must be None or a tuple of region names, got {self.regions!r}"
                )
            if not all(isinstance(r, str) and r.strip() for r in self.regions):
                raise StepDefinitionError(
                    f"ResourceConfig.regions must hold non-empty strings, got {self.regions!r}"
                )
            object.__setattr__(self, "regions", tuple(self.regions))
        _check_positive_int("ResourceConfig", "replicas", self.replicas)
        if isinstance(self.device_alternatives, _DEVICE_TYPES) or not isinstance(
            self.device_alternatives, (list, tuple)
        ):
            raise StepDefinitionError(
                "ResourceConfig.device_alternatives must be a tuple of CpuConfig, GpuConfig or TpuConfig, "
                f"got {self.device_alternatives!r}"
            )
        for alternative in self.device_alternatives:
            if not isinstance(alternative, _DEVICE_TYPES):
                raise StepDefinitionError(
                    "ResourceConfig.device_alternatives must hold CpuConfig, GpuConfig or TpuConfig values, "
                    f"got {alternative!r}"
                )
        object.__setattr__(self, "device_alternatives", tuple(self.device_alternatives))

    # -- constructors ------------------------------------------------------------------

    @staticmethod
    def with_cpu(
        cpu: float = 1,
        ram: str | None = None,
        disk: str | None = None,
        preemptible: bool = True,
        regions: tuple[str, ...] | list[str] | None = None,
    ) -> ResourceConfig:
        """CPUs only."""
        return ResourceConfig(cpu=cpu, ram=ram, disk=disk, preemptible=preemptible, regions=regions)

    @staticmethod
    def with_gpu(
        variant: str = "auto",
        count: int = 1,
        cpu: float = 1,
        ram: str | None = None,
        disk: str | None = None,
        preemptible: bool = True,
        regions: tuple[str, ...] | list[str] | None = None,
        replicas: int = 1,
    ) -> ResourceConfig:
        """`count` GPUs of `variant` ("auto": any) per replica."""
        return ResourceConfig(
            cpu=cpu,
            ram=ram,
            disk=disk,
            device=GpuConfig(variant, count),
            preemptible=preemptible,
            regions=regions,
            replicas=replicas,
        )

    @staticmethod
    def with_tpu(
        variant_or_list: str | list[str] | tuple[str, ...],
        slice_count: int = 1,
        cpu: float = 1,
        ram: str | None = None,
        disk: str | None = None,
        preemptible: bool = True,
        regions: tuple[str, ...] | list[str] | None = None,
    ) -> ResourceConfig:
        """`slice_count` TPU slices of a variant ("v4-8"), or of the first acceptable one of a
        list (["v5p-8", "v4-8"]: the first is preferred, the rest are alternatives)."""
        if isinstance(variant_or_list, str):
            variants = [variant_or_list]
        elif isinstance(variant_or_list, (list, tuple)):
            variants = list(variant_or_list)
        else:
            raise StepDefinitionError(
                "ResourceConfig.with_tpu takes a TPU variant like 'v4-8' or a list of them, "
                f"got {type(variant_or_list).__name__} {variant_or_list!r}"
            )
        if not variants:
            raise StepDefinitionError(
                "ResourceConfig.with_tpu needs at least one TPU variant, got an empty list"
            )
        if type(slice_count) is not int or slice_count < 1:
            raise StepDefinitionError(
                f"ResourceConfig.with_tpu: slice_count must be an integer >= 1 (slices the step runs on), "
                f"got {slice_count!r}"
            )
        devices = [TpuConfig(variant) for variant in variants]
        return ResourceConfig(
            cpu=cpu,
            ram=ram,
            disk=disk,
            device=devices[0],
            preemptible=preemptible,
            regions=regions,
            replicas=slice_count,
            device_alternatives=tuple(devices[1:]),
        )

    # -- queries -----------------------------------------------------------------------

    def devices(self) -> tuple[DeviceConfig, ...]:
        """The acceptable devices, preferred first (`device`, then `device_alternatives`)."""
        return (self.device, *self.device_alternatives)

    def ram_bytes(self) -> int | None:
        """`ram` in bytes; None when not given."""
        return None if self.ram is None else parse_size(self.ram, "ResourceConfig.ram")

    def disk_bytes(self) -> int | None:
        """`disk` in bytes; None when not given."""
        return None if self.disk is None else parse_size(self.disk, "ResourceConfig.disk")

    def describe(self) -> str:
        """One line for plans and logs, e.g. "TPU v4-8 x2 slices, 1 CPU"."""
        text = " or ".join(device.describe() for device in self.devices())
        if self.replicas > 1:
            text += f" x{self.replicas} " + ("slices" if self.device.kind == "tpu" else "replicas")
        text += f", {self.cpu:g} CPU"
        if self.ram is not None:
            text += f", {self.ram} RAM"
        return text

    def ray_options(self, device: DeviceConfig | None = None) -> dict[str, Any]:
        """Keyword arguments for `ray.remote(fn).options(**...)` for one replica on `device`
        (one of `devices()`; default: the preferred one). For a TPU this is the request of
        the slice's head host: chips of one host plus `TPU-<variant>-head`."""
        if device is None:
            device = self.device
        elif device not in self.devices():
            raise ValueError(
                f"device {device!r} is not one of this ResourceConfig's devices: "
                + ", ".join(d.describe() for d in self.devices())
            )
        options: dict[str, Any] = {"num_cpus": self.cpu}
        memory = self.ram_bytes()
        if memory is not None:
            options["memory"] = memory
        options["num_gpus"] = device.count if isinstance(device, GpuConfig) else 0
        resources: dict[str, float] = {}
        if isinstance(device, TpuConfig):
            resources["TPU"] = device.chips_per_host
            resources[f"TPU-{device.variant}-head"] = 1
        elif isinstance(device, GpuConfig) and device.ray_accelerator_type is not None:
            resources[f"accelerator_type:{device.ray_accelerator_type}"] = 0.001
        options["resources"] = resources
        return options

    # -- records -----------------------------------------------------------------------

    def as_record(self) -> dict[str, Any]:
        """JSON-ready dict, as `.executor_info` records it (`{"__type__": "ResourceConfig", ...}`);
        `from_value` turns it back into this config."""
        return {
            "__type__": "ResourceConfig",
            "cpu": self.cpu,
            "ram": self.ram,
            "disk": self.disk,
            "device": self.device.as_record(),
            "preemptible": self.preemptible,
            "regions": None if self.regions is None else list(self.regions),
            "replicas": self.replicas,
            "device_alternatives": [device.as_record() for device in self.device_alternatives],
        }

    @staticmethod
    def from_value(value: Any) -> ResourceConfig | dict[str, Any] | None:
        """Normalise what `ExecutorStep(resources=...)` accepts: None, a ResourceConfig, a
        record from `as_record` (turned back into a ResourceConfig) or any other dict (kept
        as it is, e.g. `{"accelerator": "any"}`). Anything else raises ValueError."""
        if value is None or isinstance(value, ResourceConfig):
            return value
        if isinstance(value, dict):
            if value.get("__type__") == "ResourceConfig":
                return _resource_config_from_record(value)
            _check_plain_request(value)
            return value
        raise ValueError(
            f"resources must be None, a ResourceConfig (e.g. ResourceConfig.with_gpu('H100')) or a dict, "
            f"got {type(value).__name__} {value!r}"
        )


def _check_plain_request(value: dict[str, Any]) -> None:
    """The keys of a plain dict that the local backend reads (`cpu`, `gpu`) hold counts: a
    string there passed the declaration and failed the run (`float('abc')`)."""
    cpu, gpu = value.get("cpu"), value.get("gpu")
    if "cpu" in value and not (
        isinstance(cpu, (int, float)) and not isinstance(cpu, bool) and math.isfinite(cpu) and cpu >= 0
    ):
        raise ValueError(f"resources['cpu'] must be a number of cores >= 0 (fractions allowed), got {cpu!r}")
    if "gpu" in value and not (isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0):
        raise ValueError(f"resources['gpu'] must be a whole number of GPUs >= 0, got {gpu!r}")


_DEVICE_FIELDS = {CpuConfig: (), GpuConfig: ("variant", "count"), TpuConfig: ("variant", "topology")}
_RESOURCE_FIELDS = ("cpu", "ram", "disk", "preemptible", "regions", "replicas")


def _device_from_record(record: Any, where: str) -> DeviceConfig:
    kinds = {kind.__name__: kind for kind in _DEVICE_FIELDS}
    kind = kinds.get(record.get("__type__")) if isinstance(record, dict) else None
    if kind is None:
        raise ValueError(
            f"resources record: {where} {record!r} is not a CpuConfig, GpuConfig or TpuConfig record"
        )
    unknown = set(record) - {"__type__", *_DEVICE_FIELDS[kind]}
    if unknown:
        raise ValueError(f"resources record: {where} has unknown fields {sorted(unknown)}")
    return kind(**{name: record[name] for name in _DEVICE_FIELDS[kind] if name in record})


def _resource_config_from_record(record: dict[str, Any]) -> ResourceConfig:
    unknown = set(record) - {"__type__", "device", "device_alternatives", *_RESOURCE_FIELDS}
    if unknown:
        raise ValueError(f"resources record has unknown fields {sorted(unknown)}")
    fields: dict[str, Any] = {name: record[name] for name in _RESOURCE_FIELDS if name in record}
    if "device" in record:
        fields["device"] = _device_from_record(record["device"], "device")
    alternatives = record.get("device_alternatives", ())
    if not isinstance(alternatives, (list, tuple)):
        raise ValueError(f"resources record: device_alternatives {alternatives!r} is not a list")
    fields["device_alternatives"] = tuple(
        _device_from_record(item, f"device_alternatives[{i}]") for i, item in enumerate(alternatives)
    )
    return ResourceConfig(**fields)
