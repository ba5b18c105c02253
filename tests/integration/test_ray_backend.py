"""The Ray backend against a real multi-node Ray cluster on 127.0.0.1.

Three nodes (`ray.cluster_utils.Cluster`, started and shut down by this module): a head
with one CPU, a node that declares a TPU v4-8 host (Ray's own resource names: `TPU` chips
and `TPU-v4-8-head`), and a node that declares one GPU of type H100. No real accelerator is
needed: Ray schedules by the declared resources, which is what these tests check.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from executor import Executor, ExecutorRunError, ExecutorStep, ResourceConfig, this_output_path, versioned
from executor.backends.ray_cluster import RayBackend
from executor.tree import Status, read_info, read_status

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass(frozen=True)
class WhereConfig:
    output_path: str
    tag: str = ""


def record_node(config: WhereConfig) -> None:
    """Write which Ray node and process ran the step; print a line for the log."""
    import ray as ray_module

    node = ray_module.get_runtime_context().get_node_id()
    print(f"running {config.tag} on node {node}")
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "where.json"), "w") as handle:
        json.dump({"node": node, "pid": os.getpid()}, handle)


def fail_remotely(config: WhereConfig) -> None:
    print("failing on purpose")
    raise RuntimeError(f"remote boom {config.tag}")


@pytest.fixture(scope="module")
def cluster():
    # Ray rewrites 127.0.0.1 in a cluster address to the machine's outward address, which
    # this cluster does not listen on; this setting makes it keep the loopback address.
    # (The variable for the processes Ray starts; the constant for this one, which may have
    # imported Ray before this module.)
    from ray._private import ray_constants

    previous = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    previous_constant = ray_constants.ENABLE_RAY_CLUSTER
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1"},
    )
    tpu = cluster.add_node(num_cpus=1, resources={"TPU": 4, "TPU-v4-8-head": 1}, node_ip_address="127.0.0.1")
    gpu = cluster.add_node(
        num_cpus=1, num_gpus=1, resources={"accelerator_type:H100": 1}, node_ip_address="127.0.0.1"
    )
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield {"cluster": cluster, "tpu": tpu.node_id, "gpu": gpu.node_id, "head": cluster.head_node.node_id}
    finally:
        ray.shutdown()
        cluster.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = previous_constant
        if previous is None:
            os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        else:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = previous


def step(name: str, fn, resources, tag: str = "") -> ExecutorStep:
    return ExecutorStep(
        name=name,
        fn=fn,
        config=WhereConfig(output_path=this_output_path(), tag=versioned(tag or name)),
        resources=resources,
    )


def where(executor: Executor, step: ExecutorStep) -> dict:
    return json.loads((Path(executor.output_paths[step]) / "where.json").read_text())


def test_steps_go_to_the_nodes_that_have_their_resources(cluster, tmp_path):
    on_tpu = step("on-tpu", record_node, ResourceConfig.with_tpu("v4-8"))
    on_gpu = step("on-gpu", record_node, ResourceConfig.with_gpu("H100", count=1))
    light = step("light", record_node, None)
    executor = Executor(str(tmp_path), console=False, backend=RayBackend(cluster["cluster"].address))
    executor.run([on_tpu, on_gpu])
    assert where(executor, on_tpu)["node"] == cluster["tpu"]
    assert where(executor, on_gpu)["node"] == cluster["gpu"]
    info = read_info(executor.store, executor.output_paths[on_tpu])
    assert info["dispatch"]["backend"] == "ray" and info["dispatch"]["device"] == "TPU v4-8"
    assert info["dispatch"]["ray_options"]["resources"] == {"TPU": 4, "TPU-v4-8-head": 1}
    # the step's output went to its log in the tree, from the worker
    log = (Path(executor.output_paths[on_tpu]) / ".executor_log").read_text()
    assert f"running on-tpu on node {cluster['tpu']}" in log
    assert where(executor, on_tpu)["pid"] != os.getpid()
    # a light step stays in the driver even with the Ray backend
    executor.run([light])
    assert where(executor, light)["pid"] == os.getpid()


def test_the_first_device_alternative_a_node_has_is_chosen_and_recorded(cluster, tmp_path):
    flexible = step("flexible", record_node, ResourceConfig.with_tpu(["v5litepod-16", "v4-8"]))
    executor = Executor(str(tmp_path), console=False, backend=RayBackend(cluster["cluster"].address))
    executor.run([flexible])
    assert where(executor, flexible)["node"] == cluster["tpu"]
    dispatch = read_info(executor.store, executor.output_paths[flexible])["dispatch"]
    assert dispatch["device"] == "TPU v4-8"


def test_a_request_no_node_can_satisfy_fails_at_once_naming_the_step(cluster, tmp_path):
    impossible = step("impossible", record_node, ResourceConfig.with_tpu("v6e-8"))
    executor = Executor(str(tmp_path), console=False, backend=RayBackend(cluster["cluster"].address))
    started = time.time()
    with pytest.raises(ExecutorRunError) as caught:
        executor.run([impossible])
    assert time.time() - started < 30
    message = caught.value.failures[0].error
    assert (
        "step 'impossible' asks for TPU v6e-8" in message and "no node of the Ray cluster has that" in message
    )
    assert read_status(executor.store, executor.output_paths[impossible])[-1].status == Status.FAILED


def test_a_remote_failure_is_the_steps_failure_with_its_message(cluster, tmp_path):
    bad = step("bad", fail_remotely, ResourceConfig.with_cpu(cpu=1), tag="x")
    executor = Executor(str(tmp_path), console=False, backend=RayBackend(cluster["cluster"].address))
    with pytest.raises(ExecutorRunError) as caught:
        executor.run([bad])
    assert (
        "RuntimeError" in caught.value.failures[0].error and "remote boom x" in caught.value.failures[0].error
    )
    log = (Path(executor.output_paths[bad]) / ".executor_log").read_text()
    assert "failing on purpose" in log


def test_a_cached_rerun_with_the_ray_backend_runs_nothing(cluster, tmp_path):
    on_gpu = step("again", record_node, ResourceConfig.with_gpu("H100"))
    backend = RayBackend(cluster["cluster"].address)
    Executor(str(tmp_path), console=False, backend=backend).run([on_gpu])
    plan = Executor(str(tmp_path), console=False, backend=backend).run([on_gpu])
    assert [row.action.value for row in plan.rows] == ["skip"]
