"""ResourceConfig: constructors, validation, sizes, Ray options, records; and how steps and
`marin.defaults` carry resources (recorded, never versioned)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from executor import (
    CpuConfig,
    Executor,
    ExecutorStep,
    GpuConfig,
    InputName,
    ResourceConfig,
    StepDefinitionError,
    TpuConfig,
    this_output_path,
    versioned,
)
from executor.fingerprint import encode
from executor.graph import resolve
from executor.resources import parse_size
from executor.tree import read_info
from tests.executor.steps_for_tests import WriteConfig, write_value

REPO = Path(__file__).resolve().parents[2]

# -- devices ---------------------------------------------------------------------------


def test_devices_have_a_kind_and_a_short_description():
    assert (CpuConfig().kind, CpuConfig().describe()) == ("cpu", "CPU")
    assert (GpuConfig("H100", 8).kind, GpuConfig("H100", 8).describe()) == ("gpu", "GPU H100 x8")
    assert GpuConfig().describe() == "GPU x1"
    assert (TpuConfig("v4-8").kind, TpuConfig("v4-8").describe()) == ("tpu", "TPU v4-8")
    assert TpuConfig("v4-8", "2x2x1").describe() == "TPU v4-8 (2x2x1)"


def test_gpu_variants_take_rays_spelling_in_any_case():
    assert GpuConfig("h100").variant == "H100"
    assert GpuConfig("a100-80g").variant == "A100-80G"
    assert GpuConfig("AUTO").variant == "auto"
    assert GpuConfig("my-gpu").variant == "my-gpu"  # a custom node label passes through


@pytest.mark.parametrize(
    ("variant", "chips", "per_host", "hosts"),
    [
        ("v4-8", 4, 4, 1),
        ("v4-16", 8, 4, 2),
        ("v4-128", 64, 4, 16),
        ("v5p-8", 4, 4, 1),
        ("v5litepod-4", 4, 4, 1),
        ("v5litepod-16", 16, 4, 4),
        ("v6e-8", 8, 8, 1),
        ("v6e-16", 16, 4, 4),
    ],
)
def test_tpu_chips_and_hosts_follow_rays_rules(variant, chips, per_host, hosts):
    tpu = TpuConfig(variant)
    assert (tpu.chip_count, tpu.chips_per_host, tpu.host_count) == (chips, per_host, hosts)


def test_an_unknown_tpu_generation_of_the_right_shape_is_accepted():
    assert TpuConfig("V9z-32").variant == "v9z-32"


@pytest.mark.parametrize("variant", ["v4", "x4-8", "v-8", "v4-0", "v4a5-8", "v4-8-1", "tpu-v4-8", ""])
def test_a_tpu_variant_of_the_wrong_shape_is_refused(variant):
    with pytest.raises(ValueError, match=r"TpuConfig.variant .* expected v<generation>\[letters\]-<size>"):
        TpuConfig(variant)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: GpuConfig("H100", 0), r"GpuConfig.count must be an integer >= 1, got 0"),
        (lambda: GpuConfig("H100", True), r"GpuConfig.count must be an integer >= 1, got True"),
        (lambda: GpuConfig(""), r"GpuConfig.variant must be"),
        (lambda: TpuConfig("v4-8", "2x"), r"TpuConfig.topology must be None or dimensions"),
    ],
)
def test_bad_devices_are_refused(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# -- constructors ----------------------------------------------------------------------


def test_with_cpu_builds_a_cpu_only_config():
    config = ResourceConfig.with_cpu(cpu=4, ram="16g", disk="100g", preemptible=False, regions=["us-east1"])
    assert config == ResourceConfig(
        cpu=4, ram="16g", disk="100g", device=CpuConfig(), preemptible=False, regions=("us-east1",)
    )
    assert config.devices() == (CpuConfig(),)


def test_with_gpu_builds_a_gpu_config():
    config = ResourceConfig.with_gpu("H100", count=8, cpu=16, replicas=2)
    assert config.device == GpuConfig("H100", 8)
    assert (config.cpu, config.replicas, config.device_alternatives) == (16, 2, ())
    assert ResourceConfig.with_gpu().device == GpuConfig("auto", 1)


def test_with_tpu_maps_slice_count_to_replicas_and_a_list_to_alternatives():
    single = ResourceConfig.with_tpu("v4-8", slice_count=2)
    assert (single.device, single.replicas, single.device_alternatives) == (TpuConfig("v4-8"), 2, ())
    choices = ResourceConfig.with_tpu(["v5p-8", "v4-8", "v6e-8"])
    assert choices.devices() == (TpuConfig("v5p-8"), TpuConfig("v4-8"), TpuConfig("v6e-8"))
    assert choices.device == TpuConfig("v5p-8")


def test_with_tpu_refuses_an_empty_list():
    with pytest.raises(ValueError, match="at least one TPU variant"):
        ResourceConfig.with_tpu([])


def test_the_default_is_one_cpu_preemptible_anywhere():
    config = ResourceConfig()
    assert (config.cpu, config.ram, config.disk, config.device) == (1, None, None, CpuConfig())
    assert (config.preemptible, config.regions, config.replicas) == (True, None, 1)


def test_configs_are_frozen_and_hashable():
    config = ResourceConfig.with_tpu(["v4-8", "v5p-8"], regions=["us-central2"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.cpu = 2  # type: ignore[misc]
    assert config.regions == ("us-central2",)  # a list is stored as a tuple
    assert hash(config) == hash(ResourceConfig.with_tpu(["v4-8", "v5p-8"], regions=("us-central2",)))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cpu": 0}, r"ResourceConfig.cpu must be a number > 0, got 0"),
        ({"cpu": -1.5}, r"ResourceConfig.cpu must be a number > 0, got -1.5"),
        ({"cpu": "4"}, r"ResourceConfig.cpu must be a number > 0, got '4'"),
        ({"cpu": True}, r"ResourceConfig.cpu must be a number > 0, got True"),
        ({"cpu": float("nan")}, r"ResourceConfig.cpu must be a number > 0, got nan"),
        ({"replicas": 0}, r"ResourceConfig.replicas must be an integer >= 1, got 0"),
        ({"replicas": 1.0}, r"ResourceConfig.replicas must be an integer >= 1, got 1.0"),
        ({"ram": "lots"}, r"ResourceConfig.ram 'lots' is not a size"),
        ({"disk": 10}, r"ResourceConfig.disk must be a string"),
        ({"device": "tpu"}, r"ResourceConfig.device must be a CpuConfig, GpuConfig or TpuConfig, got 'tpu'"),
        ({"preemptible": "yes"}, r"ResourceConfig.preemptible must be True or False"),
        ({"regions": "us-east1"}, r"ResourceConfig.regions must be None or a tuple of region names"),
        ({"regions": ("",)}, r"ResourceConfig.regions must hold non-empty strings"),
        ({"device_alternatives": TpuConfig("v4-8")}, r"ResourceConfig.device_alternatives must be a tuple"),
        ({"device_alternatives": ("v4-8",)}, r"ResourceConfig.device_alternatives must hold"),
    ],
)
def test_bad_fields_are_refused_at_construction(fields, message):
    with pytest.raises(ValueError, match=message):
        ResourceConfig(**fields)


def test_every_field_has_a_docstring():
    source = (REPO / "executor" / "resources.py").read_text()
    body = source[
        source.index("class ResourceConfig:") : source.index(
            "def __post_init__", source.index("class ResourceConfig:")
        )
    ]
    for field in dataclasses.fields(ResourceConfig):
        after = body[body.index(f"    {field.name}: ") :].splitlines()[1]
        assert after.strip().startswith('"""'), field.name


# -- sizes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("16g", 16 * 2**30),
        ("16G", 16 * 2**30),
        ("16gb", 16 * 2**30),
        ("16GiB", 16 * 2**30),
        ("512m", 512 * 2**20),
        ("1.5g", 1536 * 2**20),
        ("1024", 1024),
        ("1024b", 1024),
        ("2t", 2 * 2**40),
        ("64k", 65536),
        (" 8g ", 8 * 2**30),
    ],
)
def test_sizes_parse_in_binary_units(text, size):
    assert parse_size(text) == size
    assert ResourceConfig(ram=text).ram_bytes() == size
    assert ResourceConfig(disk=text).disk_bytes() == size


@pytest.mark.parametrize(
    "text", ["", "g", "gb", "-1g", "1x", "1.2.3g", "inf", "nan", "1e3", "16 gigs", "１６g"]
)
def test_a_bad_size_names_the_field_the_value_and_the_accepted_forms(text):
    with pytest.raises(ValueError) as refused:
        ResourceConfig(ram=text)
    message = str(refused.value)
    assert message.startswith(f"ResourceConfig.ram {text!r} is not a size")
    assert 'e.g. "16g", "512m", "1.5g", "2t" or "1024"' in message


def test_a_size_below_one_byte_is_refused():
    with pytest.raises(ValueError, match=r"ResourceConfig.disk '0' must be at least 1 byte"):
        ResourceConfig(disk="0")


def test_unset_sizes_are_none():
    assert (ResourceConfig().ram_bytes(), ResourceConfig().disk_bytes()) == (None, None)


# -- Ray options -----------------------------------------------------------------------


def test_ray_options_of_a_tpu_ask_for_one_hosts_chips_and_the_slice_head():
    assert ResourceConfig.with_tpu("v4-8").ray_options() == {
        "num_cpus": 1,
        "num_gpus": 0,
        "resources": {"TPU": 4, "TPU-v4-8-head": 1},
    }
    assert ResourceConfig.with_tpu("v6e-8", cpu=8, ram="64g").ray_options() == {
        "num_cpus": 8,
        "memory": 64 * 2**30,
        "num_gpus": 0,
        "resources": {"TPU": 8, "TPU-v6e-8-head": 1},
    }
    assert ResourceConfig.with_tpu("v4-32").ray_options()["resources"] == {"TPU": 4, "TPU-v4-32-head": 1}


def test_ray_options_of_a_gpu_count_gpus_and_constrain_the_type():
    assert ResourceConfig.with_gpu("H100", count=8, cpu=16, ram="512m").ray_options() == {
        "num_cpus": 16,
        "memory": 512 * 2**20,
        "num_gpus": 8,
        "resources": {"accelerator_type:H100": 0.001},
    }
    assert ResourceConfig.with_gpu(count=2).ray_options() == {"num_cpus": 1, "num_gpus": 2, "resources": {}}


def test_ray_options_of_cpus_only():
    assert ResourceConfig.with_cpu(cpu=0.5).ray_options() == {"num_cpus": 0.5, "num_gpus": 0, "resources": {}}


def test_ray_options_for_an_alternative_device():
    config = ResourceConfig.with_tpu(["v5p-8", "v6e-8"])
    assert config.ray_options(TpuConfig("v6e-8"))["resources"] == {"TPU": 8, "TPU-v6e-8-head": 1}
    assert config.ray_options()["resources"] == {"TPU": 4, "TPU-v5p-8-head": 1}
    with pytest.raises(
        ValueError, match=r"is not one of this ResourceConfig's devices: TPU v5p-8, TPU v6e-8"
    ):
        config.ray_options(TpuConfig("v4-8"))


def test_ray_gpu_names_match_rays_own_list():
    accelerators = pytest.importorskip("ray.util.accelerators.accelerators")
    from executor.resources import _RAY_GPU_TYPES

    ray_names = {value for name, value in vars(accelerators).items() if name.startswith("NVIDIA_")}
    assert set(_RAY_GPU_TYPES) <= ray_names


def test_tpu_chips_per_host_match_ray():
    tpu = pytest.importorskip("ray._private.accelerators.tpu")
    for variant in ["v4-8", "v4-16", "v5p-8", "v5litepod-4", "v5litepod-16", "v6e-8", "v6e-16", "v2-8"]:
        assert TpuConfig(variant).chips_per_host == tpu.get_num_tpu_visible_chips_per_host(variant), variant
        assert TpuConfig(variant).chip_count == tpu.get_total_chips_from_accelerator_type(variant), variant


# -- records ---------------------------------------------------------------------------


def test_as_record_is_what_executor_info_records_and_round_trips():
    config = ResourceConfig.with_tpu(["v4-8", "v5p-8"], slice_count=2, ram="16g", regions=["us-central2"])
    record = config.as_record()
    assert record == {
        "__type__": "ResourceConfig",
        "cpu": 1,
        "ram": "16g",
        "disk": None,
        "device": {"__type__": "TpuConfig", "variant": "v4-8", "topology": None},
        "preemptible": True,
        "regions": ["us-central2"],
        "replicas": 2,
        "device_alternatives": [{"__type__": "TpuConfig", "variant": "v5p-8", "topology": None}],
    }
    assert encode(config, strict=False) == record
    assert json.loads(json.dumps(record)) == record
    assert ResourceConfig.from_value(record) == config
    gpu = ResourceConfig.with_gpu("H100", 8)
    assert ResourceConfig.from_value(json.loads(json.dumps(gpu.as_record()))) == gpu
    assert ResourceConfig.from_value(ResourceConfig().as_record()) == ResourceConfig()


def test_from_value_keeps_none_configs_and_plain_dicts():
    config = ResourceConfig.with_gpu()
    plain = {"accelerator": "any"}
    assert ResourceConfig.from_value(None) is None
    assert ResourceConfig.from_value(config) is config
    assert ResourceConfig.from_value(plain) is plain


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("v4-8", r"resources must be None, a ResourceConfig .* or a dict, got str 'v4-8'"),
        (["v4-8"], r"got list \['v4-8'\]"),
        ({"__type__": "ResourceConfig", "gpus": 2}, r"unknown fields \['gpus'\]"),
        (
            {"__type__": "ResourceConfig", "device": {"__type__": "FpgaConfig"}},
            r"device .* is not a CpuConfig",
        ),
        ({"__type__": "ResourceConfig", "cpu": -1}, r"ResourceConfig.cpu must be a number > 0"),
    ],
)
def test_from_value_refuses_anything_else(value, message):
    with pytest.raises(ValueError, match=message):
        ResourceConfig.from_value(value)


def test_describe_is_one_line():
    config = ResourceConfig.with_tpu(["v5p-8", "v4-8"], slice_count=2, ram="16g")
    assert config.describe() == "TPU v5p-8 or TPU v4-8 x2 slices, 1 CPU, 16g RAM"


# -- steps -----------------------------------------------------------------------------


def step(resources=None, name="train/a"):
    return ExecutorStep(
        name,
        write_value,
        WriteConfig(output_path=this_output_path(), value=versioned(1)),
        resources=resources,
    )


@pytest.mark.parametrize("resources", ["v4-8", 8, ["gpu"], TpuConfig("v4-8")])
def test_a_step_refuses_resources_of_another_type_naming_the_step(resources):
    with pytest.raises(
        StepDefinitionError, match=r"step 'train/a': resources must be None, a ResourceConfig"
    ):
        step(resources)


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (
            {"cpu": "abc"},
            r"resources\['cpu'\] must be a number of cores >= 0 \(fractions allowed\), got 'abc'",
        ),
        ({"cpu": -1}, r"resources\['cpu'\] must be .* got -1"),
        ({"cpu": float("nan")}, r"resources\['cpu'\] must be .* got nan"),
        ({"cpu": True}, r"resources\['cpu'\] must be .* got True"),
        ({"gpu": 1.5}, r"resources\['gpu'\] must be a whole number of GPUs >= 0, got 1.5"),
        ({"cpu": 2, "gpu": "1"}, r"resources\['gpu'\] must be .* got '1'"),
    ],
)
def test_a_plain_dict_with_counts_that_are_not_numbers_is_refused_at_declaration(resources, message):
    """Found by a red-team pass (twenty-second session): the dry run was clean and the run failed
    with `executor error: ValueError: could not convert string to float: 'abc'`."""
    with pytest.raises(StepDefinitionError, match=r"step 'train/a': " + message):
        step(resources)


def test_a_plain_dict_with_counts_is_kept():
    plain = {"cpu": 0.5, "gpu": 1}
    assert step(plain).resources is plain


def test_a_step_keeps_none_a_dict_or_a_resource_config():
    config = ResourceConfig.with_tpu("v4-8")
    plain = {"accelerator": "any"}
    assert step().resources is None
    assert step(plain).resources is plain
    assert step(config).resources is config


def test_a_step_turns_a_recorded_resource_config_back_into_one():
    config = ResourceConfig.with_gpu("H100", 8)
    assert step(config.as_record()).resources == config
    with pytest.raises(StepDefinitionError, match=r"step 'train/a': ResourceConfig.replicas must be"):
        step({**config.as_record(), "replicas": 0})


def test_resources_do_not_change_the_output_path():
    variants = [
        None,
        {"accelerator": "any"},
        ResourceConfig.with_tpu("v4-8"),
        ResourceConfig.with_gpu("H100", 8),
    ]
    paths = {resolve([s], "/prefix").resolved(s).output_path for s in map(step, variants)}
    assert len(paths) == 1


def test_executor_info_records_a_resource_config_as_a_readable_dict(tmp_path):
    config = ResourceConfig.with_cpu(cpu=2, ram="1g")
    declared = step(config)
    executor = Executor(str(tmp_path), console=False)
    executor.run([declared])
    info = read_info(executor.store, executor.output_paths[declared])
    assert info["resources"] == config.as_record()
    assert info["resources"]["device"] == {"__type__": "CpuConfig"}
    assert ResourceConfig.from_value(info["resources"]) == config


def test_importing_executor_does_not_import_ray_or_jax():
    code = "import sys, executor\nprint(sorted(m for m in ('ray', 'jax', 'levanter') if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert result.stdout.strip() == "[]"


# -- marin.defaults --------------------------------------------------------------------


def training_step(**train_fields):
    from marin.defaults import default_tokenize, default_train
    from marin.models import MODELS
    from operations.train import SimpleTrainConfig

    tokenized = default_tokenize("tiny", InputName.hardcoded("documents/tiny"), "gpt2")
    return default_train(
        "tiny", tokenized, MODELS["llama_nano"], SimpleTrainConfig(8, 20, 1e-3, **train_fields)
    )


def test_default_train_uses_the_train_configs_resources_else_any_accelerator():
    assert training_step().resources == {"accelerator": "any"}
    config = ResourceConfig.with_tpu("v4-8")
    assert training_step(resources=config).resources is config


def test_training_resources_are_not_versioned():
    from marin.defaults import TRAIN_FIELDS_THAT_MATTER

    assert "resources" not in TRAIN_FIELDS_THAT_MATTER
    steps = [
        training_step(),
        training_step(resources=ResourceConfig.with_tpu("v4-8")),
        training_step(resources=ResourceConfig.with_gpu("H100", 8, ram="64g")),
    ]
    assert len({resolve([s], "/prefix").resolved(s).version_hash for s in steps}) == 1
    # ... while a field that matters does change it.
    assert resolve([s := training_step(seed=1)], "/prefix").resolved(s).version_hash != (
        resolve([steps[0]], "/prefix").resolved(steps[0]).version_hash
    )


def test_default_eval_inherits_the_training_resources_unless_given():
    from marin.defaults import default_eval

    config = ResourceConfig.with_gpu("H100")
    trained = training_step(resources=config)
    datasets = {"tiny": trained.config.tokenized_path}
    assert default_eval("tiny", trained, datasets).resources is config
    assert default_eval("tiny", training_step(), datasets).resources == {"accelerator": "any"}
    cpu = ResourceConfig.with_cpu(cpu=4)
    assert default_eval("tiny", trained, datasets, resources=cpu).resources is cpu


def test_marins_older_resource_names_build_resource_configs():
    from marin.resources import CpuOnlyConfig, GpuConfig, TpuPodConfig

    assert CpuOnlyConfig(num_cpus=4) == ResourceConfig.with_cpu(cpu=4)
    assert GpuConfig(gpu_count=8, accelerator_type="H100") == ResourceConfig.with_gpu("H100", count=8)
    assert GpuConfig() == ResourceConfig.with_gpu()
    assert TpuPodConfig(tpu_type="v4-128", slice_count=2) == ResourceConfig.with_tpu("v4-128", slice_count=2)
