"""The Ray cluster configs under infra/ are ones `ray up` accepts, and they place each step on
the node type it asks for.

Acceptance: every YAML goes through `ray up`'s own preparation, `_bootstrap_config` in
`ray.autoscaler._private.commands` (defaults merged, the GCP provider's TPU resource fill-out,
Ray's JSON schema and its cross-field checks), with only the last, networked part -- the GCP
provider's `bootstrap_config`, which creates service accounts and SSH keys in the project --
replaced by the identity. Each node config also passes Ray's GCP node checks (`get_node_type`:
TPU accelerator types and topologies).

Placement: for each node type, the Ray options this project's `ResourceConfig` produces
(`executor/resources.py`: `with_tpu`, `with_gpu`, `with_cpu`) are turned into a resource demand
by Ray's own function and handed to Ray's autoscaler planner (`get_nodes_for`), which must
launch exactly that node type; and the Ray backend's admission check (`_fits`) must accept the
step on that node type and on no other. Nodes start with the YAML's `resources` (Ray passes them
to `ray start` as RAY_OVERRIDE_RESOURCES), so that is what the backend will see.

Nothing here talks to GCP or builds the image: what a real `ray up` would still meet (quota,
zones, images, IAM) is listed in infra/README.md.
"""

from __future__ import annotations

import re
import sys
import tomllib
import types
from functools import partial
from pathlib import Path
from unittest import mock

import pytest
import yaml

from executor.backends.ray_cluster import _bundle, _fits
from executor.resources import ResourceConfig, TpuConfig

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
CONFIGS = sorted(INFRA.glob("*.yaml"))
PLACEHOLDERS = {"FILL_ME_PROJECT_ID", "FILL_ME_BUCKET", "FILL_ME_REGISTRY"}
EXAMPLE_VALUES = {
    "FILL_ME_PROJECT_ID": "my-project",
    "FILL_ME_BUCKET": "my-bucket",
    "FILL_ME_REGISTRY": "us-docker.pkg.dev/my-project/marin",
}


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _stub_google_api_client() -> dict[str, types.ModuleType]:
    """Stand-ins for the Google API client modules Ray's GCP provider imports at the top."""

    class HttpError(Exception):
        pass

    class _Unused:
        pass

    discovery = types.ModuleType("googleapiclient.discovery")
    discovery.Resource = _Unused
    discovery.build = _Unused
    errors = types.ModuleType("googleapiclient.errors")
    errors.HttpError = HttpError
    client = types.ModuleType("googleapiclient")
    client.discovery = discovery
    client.errors = errors
    httplib2 = types.ModuleType("httplib2")
    httplib2.Http = _Unused
    auth_httplib2 = types.ModuleType("google_auth_httplib2")
    auth_httplib2.AuthorizedHttp = _Unused
    return {
        "googleapiclient": client,
        "googleapiclient.discovery": discovery,
        "googleapiclient.errors": errors,
        "httplib2": httplib2,
        "google_auth_httplib2": auth_httplib2,
    }


@pytest.fixture(scope="module")
def gcp():
    """Ray's GCP provider modules. They import Google's API client (google-api-python-client,
    which `ray up` on GCP needs) at the top; the offline checks used here never call it, so
    where it is not installed, stand-in modules let the import succeed. The stand-ins and the
    GCP modules imported over them are removed from `sys.modules` afterwards."""
    stubs = {}
    try:
        import googleapiclient  # noqa: F401
    except ImportError:
        stubs = _stub_google_api_client()
    before = set(sys.modules)
    sys.modules.update(stubs)
    try:
        from ray.autoscaler._private.gcp import config as gcp_config
        from ray.autoscaler._private.gcp.node_provider import GCPNodeProvider

        yield types.SimpleNamespace(config=gcp_config, provider=GCPNodeProvider)
    finally:
        if stubs:
            for name in set(sys.modules) - before:
                if name in stubs or name.startswith("ray.autoscaler._private.gcp"):
                    del sys.modules[name]


def _bootstrapped(gcp, config: dict) -> dict:
    """What `ray up` makes of `config` before it touches the cloud."""
    from ray.autoscaler._private.commands import _bootstrap_config

    with mock.patch.object(gcp.provider, "bootstrap_config", staticmethod(lambda c: c)):
        return _bootstrap_config(config, no_config_cache=True)


def _demand(options: dict) -> dict:
    """A task's resource demand, as Ray computes it from `.options(**options)`."""
    from ray._common.utils import resources_from_ray_options

    return resources_from_ray_options(options)


def _launched(config: dict, resources: ResourceConfig) -> tuple[dict, list]:
    """The node types Ray's autoscaler would add for one task of `resources` on a cluster with
    only its head up, and the demands it could not place."""
    from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
    from ray.autoscaler._private.resource_demand_scheduler import (
        _default_utilization_scorer,
        get_nodes_for,
    )

    to_add, unplaced = get_nodes_for(
        config["available_node_types"],
        {config["head_node_type"]: 1},
        config["head_node_type"],
        config["max_workers"],
        [_demand(resources.ray_options())],
        partial(_default_utilization_scorer, node_availability_summary=NodeAvailabilitySummary({})),
    )
    return dict(to_add), unplaced


def _accelerator_label(resources: dict) -> str | None:
    labels = [name.partition(":")[2] for name in resources if name.startswith("accelerator_type:")]
    assert len(labels) <= 1, f"several accelerator_type labels: {labels}"
    return labels[0] if labels else None


def _config_by_name(name: str) -> Path:
    path = INFRA / name
    assert path in CONFIGS, f"{name} is not one of {[p.name for p in CONFIGS]}"
    return path


# -- Ray accepts the configs --------------------------------------------------------------


def test_there_is_a_config_for_cpu_tpu_and_h100_clusters():
    assert {p.name for p in CONFIGS} >= {
        "cluster-gcp-cpu.yaml",
        "cluster-gcp-gpu-h100.yaml",
        "cluster-gcp-tpu-v4.yaml",
        "cluster-gcp-tpu-v5e.yaml",
        "cluster-gcp-tpu-v6e.yaml",
    }


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_ray_up_accepts_the_config(gcp, path):
    config = _bootstrapped(gcp, _load(path))
    assert config["provider"]["type"] == "gcp"
    assert config["head_node_type"] in config["available_node_types"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_node_config_passes_rays_gcp_node_checks(gcp, path):
    config = _load(path)
    for name, node_type in config["available_node_types"].items():
        kind = gcp.config.get_node_type(node_type["node_config"])  # raises on a bad TPU type
        if name == config["head_node_type"]:
            assert kind.value == "compute", "Ray's GCP launcher cannot make a TPU VM the head node"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_config_already_declares_what_rays_gcp_fill_out_adds(gcp, path):
    """`ray up` adds `TPU-<type>-head` to TPU node types and only warns if that fails; the YAML
    declares it itself, so the fill-out changes nothing."""
    config = _load(path)
    filled = gcp.provider.fillout_available_node_types_resources(config)
    for name, node_type in config["available_node_types"].items():
        assert filled["available_node_types"][name]["resources"] == node_type["resources"], name


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_config_still_passes_with_the_placeholders_filled_in(gcp, path):
    text = path.read_text()
    for placeholder, value in EXAMPLE_VALUES.items():
        text = text.replace(placeholder, value)
    assert "FILL_ME" not in text
    config = _bootstrapped(gcp, yaml.safe_load(text))
    assert "-e MARIN_PREFIX=gs://my-bucket/marin" in config["docker"]["run_options"]
    assert config["provider"]["project_id"] == "my-project"


# -- the node types provide what the project's ResourceConfig asks for --------------------

PLACEMENTS = [
    ("cluster-gcp-tpu-v4.yaml", ResourceConfig.with_tpu("v4-8"), "tpu_v4_8"),
    ("cluster-gcp-tpu-v5e.yaml", ResourceConfig.with_tpu("v5litepod-8"), "tpu_v5e_8"),
    ("cluster-gcp-tpu-v5e.yaml", ResourceConfig.with_tpu("v5litepod-8", cpu=8, ram="64g"), "tpu_v5e_8"),
    ("cluster-gcp-tpu-v6e.yaml", ResourceConfig.with_tpu("v6e-8"), "tpu_v6e_8"),
    ("cluster-gcp-gpu-h100.yaml", ResourceConfig.with_gpu("H100"), "gpu_h100_8"),
    ("cluster-gcp-gpu-h100.yaml", ResourceConfig.with_gpu("h100", count=8, cpu=16, ram="256g"), "gpu_h100_8"),
    ("cluster-gcp-gpu-h100.yaml", ResourceConfig.with_gpu(count=2), "gpu_h100_8"),
    *[(path.name, ResourceConfig.with_cpu(), "cpu_worker") for path in CONFIGS],
    *[(path.name, ResourceConfig.with_cpu(cpu=8, ram="32g"), "cpu_worker") for path in CONFIGS],
]


@pytest.mark.parametrize(
    ("name", "resources", "node_type"),
    PLACEMENTS,
    ids=[f"{name}-{resources.describe()}" for name, resources, _ in PLACEMENTS],
)
def test_the_autoscaler_adds_the_node_type_a_step_asks_for(gcp, name, resources, node_type):
    config = _bootstrapped(gcp, _load(_config_by_name(name)))
    assert _launched(config, resources) == ({node_type: 1}, [])


@pytest.mark.parametrize(
    ("name", "resources", "node_type"),
    PLACEMENTS,
    ids=[f"{name}-{resources.describe()}" for name, resources, _ in PLACEMENTS],
)
def test_the_ray_backend_admits_the_step_on_that_node_type(name, resources, node_type):
    """And an accelerator step on no other node type; a CPU step fits accelerator hosts too
    (Ray may place it there while one is up), never the head."""
    config = _load(_config_by_name(name))
    options = resources.ray_options()
    admitting = [
        n for n, t in config["available_node_types"].items() if _fits(_bundle(options), t["resources"])
    ]
    if resources.device.kind == "cpu":
        assert node_type in admitting and config["head_node_type"] not in admitting
    else:
        assert admitting == [node_type]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_accelerator_node_type_is_reached_by_the_resource_config_naming_it(gcp, path):
    """Derived from the YAML, so a node type added later is covered too."""
    config = _bootstrapped(gcp, _load(path))
    for name, node_type in config["available_node_types"].items():
        resources = node_type["resources"]
        accelerator = node_type["node_config"].get("acceleratorType")
        if accelerator is not None:
            asked = ResourceConfig.with_tpu(accelerator)
        elif resources.get("GPU"):
            asked = ResourceConfig.with_gpu(_accelerator_label(resources), count=resources["GPU"])
        else:
            continue
        assert _launched(config, asked) == ({name: 1}, []), f"{name}: {asked.describe()}"


@pytest.mark.parametrize(
    ("name", "resources"),
    [
        ("cluster-gcp-tpu-v4.yaml", ResourceConfig.with_tpu("v5litepod-8")),
        ("cluster-gcp-tpu-v5e.yaml", ResourceConfig.with_tpu("v5litepod-16")),
        ("cluster-gcp-gpu-h100.yaml", ResourceConfig.with_gpu("A100")),
        ("cluster-gcp-gpu-h100.yaml", ResourceConfig.with_gpu("H100", count=16)),
        ("cluster-gcp-cpu.yaml", ResourceConfig.with_gpu("H100")),
    ],
    ids=lambda v: v if isinstance(v, str) else v.describe(),
)
def test_a_step_asking_for_a_device_the_cluster_lacks_adds_no_node(gcp, name, resources):
    config = _bootstrapped(gcp, _load(_config_by_name(name)))
    to_add, unplaced = _launched(config, resources)
    assert to_add == {} and len(unplaced) == 1


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_tpu_node_types_are_single_host_slices_with_the_chips_ray_detects(gcp, path):
    """The Ray backend runs a step as one actor on the slice's head host, so a slice must be one
    host; its "TPU" count is the chips Ray finds on that host, as executor/resources.py counts them."""
    from ray._private.accelerators import tpu

    for name, node_type in _load(path)["available_node_types"].items():
        accelerator = node_type["node_config"].get("acceleratorType")
        if accelerator is None:
            assert "TPU" not in node_type["resources"], name
            continue
        assert gcp.config._is_single_host_tpu(node_type["node_config"]), name
        assert TpuConfig(accelerator).host_count == 1, name
        chips = tpu.get_num_tpu_visible_chips_per_host(accelerator)
        assert node_type["resources"]["TPU"] == chips == TpuConfig(accelerator).chips_per_host, name
        assert node_type["resources"][f"TPU-{accelerator}-head"] == 1, name


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_gpu_node_types_carry_the_accelerator_label_ray_gives_their_gpus(path):
    from ray.util import accelerators

    ray_names = {value for key, value in vars(accelerators).items() if key.startswith("NVIDIA_")}
    for name, node_type in _load(path)["available_node_types"].items():
        resources = node_type["resources"]
        label = _accelerator_label(resources)
        if not resources.get("GPU"):
            assert label is None, name
            continue
        assert label in ray_names, f"{name}: {label!r} is not a GPU name Ray detects"
        assert f"accelerator_type:{label}" in _demand({"accelerator_type": label})
        assert "a3-highgpu" not in node_type["node_config"]["machineType"] or label == "H100"


# -- the files agree with each other, the Dockerfile and the runbook -----------------------

_PER_FILE_KEYS = {"cluster_name", "provider"}


def _shared_part(config: dict) -> dict:
    shared = {key: value for key, value in config.items() if key not in _PER_FILE_KEYS}
    shared["available_node_types"] = {
        name: node_type
        for name, node_type in config["available_node_types"].items()
        if name in (config["head_node_type"], "cpu_worker")
    }
    return shared


def test_all_configs_share_the_head_cpu_workers_image_and_commands():
    first, *others = CONFIGS
    for path in others:
        assert _shared_part(_load(path)) == _shared_part(_load(first)), f"{path.name} vs {first.name}"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_node_types_that_replace_the_init_commands_keep_the_shared_ones(path):
    config = _load(path)
    shared = config["initialization_commands"]
    for name, node_type in config["available_node_types"].items():
        own = node_type.get("initialization_commands")
        assert own is None or own[: len(shared)] == shared, name


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_disk_zone_is_the_cluster_zone(path):
    config = _load(path)
    zone = config["provider"]["availability_zone"]
    assert zone.rsplit("-", 1)[0] == config["provider"]["region"]
    for name, node_type in config["available_node_types"].items():
        for disk in node_type["node_config"].get("disks", []):
            disk_type = disk["initializeParams"].get("diskType")
            assert disk_type is None or disk_type.startswith(f"zones/{zone}/"), name


def test_the_placeholders_are_the_three_the_runbook_explains():
    found = set()
    for path in CONFIGS:
        found |= set(re.findall(r"FILL_ME_[A-Z_]+", path.read_text()))
    assert found == PLACEHOLDERS
    runbook = (INFRA / "README.md").read_text()
    for name in sorted(PLACEHOLDERS) + [path.name for path in CONFIGS]:
        assert name in runbook, f"infra/README.md does not mention {name}"


def _dockerfile() -> str:
    return (INFRA / "Dockerfile").read_text()


def _image_kinds() -> dict[str, str]:
    """ACCELERATOR value -> the extras the Dockerfile installs for it."""
    return dict(re.findall(r'^\s*(\w+)\) extras="([\w,]+)"', _dockerfile(), re.MULTILINE))


def test_the_dockerfile_installs_the_project_on_python_311_with_extras_pyproject_defines():
    text = _dockerfile()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert re.search(r"^FROM python:3\.11[-\w.]*$", text, re.MULTILINE)
    assert 'pip install -e ".[${extras}]"' in text
    assert _image_kinds() == {"cpu": "all", "gpu": "all,gpu", "tpu": "all"}
    extras = pyproject["project"]["optional-dependencies"]
    for kind_extras in _image_kinds().values():
        assert set(kind_extras.split(",")) <= set(extras)
    copied = {
        source for line in re.findall(r"^COPY (.+)$", text, re.MULTILINE) for source in line.split()[:-1]
    }
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= copied
    for package in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert package.rstrip("*") in copied, f"the Dockerfile does not copy {package}"


def test_the_dockerfile_pins_the_jax_pyproject_pins_and_a_ray_it_allows():
    from packaging.requirements import Requirement

    text = _dockerfile()
    train = [
        Requirement(r)
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
            "train"
        ]
    ]
    jax = next(r for r in train if r.name == "jax")
    ray = next(r for r in train if r.name == "ray")
    jax_version = re.search(r"^ARG JAX_VERSION=(\S+)$", text, re.MULTILINE).group(1)
    ray_version = re.search(r"^ARG RAY_VERSION=(\S+)$", text, re.MULTILINE).group(1)
    assert str(jax.specifier) == f"=={jax_version}"
    assert ray.specifier.contains(ray_version)
    assert 'more="jax[tpu]==${JAX_VERSION}"' in text


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_each_node_type_runs_the_image_built_for_its_device(path):
    config = _load(path)
    default = config["docker"]["image"]
    assert default.endswith("/marin:cpu")
    for name, node_type in config["available_node_types"].items():
        image = node_type.get("docker", {}).get("worker_image", default)
        kind = image.rsplit(":", 1)[1]
        assert kind in _image_kinds(), f"{name}: no image kind {kind!r} in infra/Dockerfile"
        if "acceleratorType" in node_type["node_config"]:
            assert kind == "tpu", name
        elif node_type["resources"].get("GPU"):
            assert kind == "gpu", name
        else:
            assert kind == "cpu", name
