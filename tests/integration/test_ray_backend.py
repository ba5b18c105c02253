"""The Ray backend against a real multi-node Ray cluster on 127.0.0.1.

Three nodes (`ray.cluster_utils.Cluster`, started and shut down by this module): a head
with one CPU, a node that declares a TPU v4-8 host (Ray's own resource names: `TPU` chips
and `TPU-v4-8-head`), and a node that declares one GPU of type H100. No real accelerator is
needed: Ray schedules by the declared resources, which is what these tests check.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from executor import Executor, ExecutorRunError, ExecutorStep, ResourceConfig, this_output_path, versioned
from executor.backends.ray_cluster import RayBackend
from executor.tree import Status, read_info, read_status
from tests.waiting import wait_for

ray = pytest.importorskip("ray")

from tests.ray_cluster import loopback_cluster  # noqa: E402

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
    tpu_node = {"num_cpus": 1, "resources": {"TPU": 4, "TPU-v4-8-head": 1}}
    gpu_node = {"num_cpus": 1, "num_gpus": 1, "resources": {"accelerator_type:H100": 1}}
    with loopback_cluster(tpu_node, gpu_node) as (cluster, (tpu, gpu)):
        yield {"cluster": cluster, "tpu": tpu.node_id, "gpu": gpu.node_id, "head": cluster.head_node.node_id}


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


REPO = Path(__file__).resolve().parents[2]


DRIVER_SCRIPT = """
import sys
from executor import ExecutorStep, ResourceConfig, executor_main, this_output_path, versioned
from tests.executor.steps_for_heavy import CountConfig, count_and_sleep

heavy = ExecutorStep(
    name="remote-heavy",
    fn=count_and_sleep,
    config=CountConfig(output_path=this_output_path(), counter=sys.argv.pop(1), release=sys.argv.pop(1)),
    resources=ResourceConfig.with_gpu("H100"),
)
if __name__ == "__main__":
    executor_main([heavy])
"""


def test_a_remote_step_outlives_its_killed_driver_and_the_next_driver_reattaches(cluster, tmp_path):
    script, counter, prefix = tmp_path / "exp.py", tmp_path / "counter", tmp_path / "out"
    script.write_text(DRIVER_SCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    release = tmp_path / "release"  # the step runs until this file appears
    command = [
        sys.executable, str(script), str(counter), str(release), "--prefix", str(prefix), "--backend", "ray",
        "--ray_address", cluster["cluster"].address,
        "--lease_heartbeat", "0.5", "--lease_timeout", "5", "--lease_poll", "0.2",
    ]  # fmt: skip
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: counter.exists() and counter.read_text().strip(), timeout=120)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    with open(tmp_path / "second.out", "w") as second_out:
        second = subprocess.Popen(command, cwd=REPO, env=env, stdout=second_out, stderr=subprocess.STDOUT)
        try:
            # it found the step running and follows its log: now let the step finish
            wait_for(lambda: "remote-heavy | sleeping" in (tmp_path / "second.out").read_text(), timeout=180)
            release.touch()
            second.wait(180)
        finally:
            release.touch()  # the detached step actor ends too
            if second.poll() is None:
                second.kill()
    out = (tmp_path / "second.out").read_text()
    assert second.returncode == 0, out
    assert "held by" in out and "remote-heavy | sleeping" in out  # waited, showing the step's log
    assert len(counter.read_text().split()) == 1  # the body ran exactly once
    (heavy_dir,) = prefix.glob("remote-heavy-*")
    history = read_status(executor_store(), str(heavy_dir))
    assert [event.status for event in history] == [Status.RUNNING, Status.SUCCESS]
    assert "/step:" in history[-1].worker  # recorded by the step's own process


def executor_store():
    from executor.store import LocalStore

    return LocalStore()


def test_a_step_on_a_lost_node_is_resubmitted_and_resumes_from_its_checkpoint(cluster, tmp_path):
    from tests.executor.steps_for_heavy import ResumableConfig, resumable_count

    nodes = [cluster["cluster"].add_node(num_cpus=1, resources={"trainer": 1}) for _ in range(2)]
    cluster["cluster"].wait_for_nodes()
    step = ExecutorStep(
        name="trainer",
        fn=resumable_count,
        config=ResumableConfig(output_path=this_output_path(), total=versioned(100), tick=0.1),
        resources=ResourceConfig.with_cpu(cpu=1),
    )
    backend = RayBackend(cluster["cluster"].address)
    executor = Executor(str(tmp_path), console=False, backend=backend)
    original = executor.backend.prepare

    def on_trainer_nodes(resolved):
        dispatch = original(resolved)
        dispatch["ray_options"] = {**dispatch["ray_options"], "resources": {"trainer": 1}}
        return dispatch

    executor.backend.prepare = on_trainer_nodes  # only the two trainer nodes can run it
    errors: list[BaseException] = []
    runner = threading.Thread(target=lambda: _run_catching(executor, [step], errors))
    runner.start()
    output = tmp_path / next(p.name for p in _wait_listing(tmp_path, "trainer-"))
    progress = output / "progress"
    wait_for(lambda: progress.exists() and int(progress.read_text() or 0) >= 5, timeout=120)
    first_node = (output / "attempts.txt").read_text().split()[1]
    (lost,) = [node for node in nodes if node.node_id == first_node]
    cluster["cluster"].remove_node(lost)
    runner.join(180)
    assert not runner.is_alive() and not errors, errors
    attempts = [line.split() for line in (output / "attempts.txt").read_text().splitlines()]
    assert len(attempts) == 2 and attempts[0][0] == "0"
    assert int(attempts[1][0]) >= 5  # resumed from its checkpoint, not from 0
    assert attempts[1][1] != first_node
    history = read_status(executor.store, str(output))
    assert [event.status for event in history] == [Status.RUNNING, Status.RUNNING, Status.SUCCESS]
    assert history[1].message == "attempt 2 of 3"
    assert (output / "done").read_text() == "ok"


def _run_catching(executor, steps, errors):
    try:
        executor.run(steps)
    except BaseException as error:
        errors.append(error)


def _wait_listing(directory: Path, prefix: str):
    wait_for(lambda: any(p.name.startswith(prefix) for p in directory.iterdir()), timeout=60)
    return [p for p in directory.iterdir() if p.name.startswith(prefix)]


def test_two_heavy_steps_run_at_once_on_different_nodes(cluster, tmp_path):
    from tests.executor.steps_for_heavy import MeetConfig, meet

    a_dir, b_dir = tmp_path / "a-out", tmp_path / "b-out"
    steps = [
        ExecutorStep(
            name=name,
            fn=meet,
            config=MeetConfig(output_path=str(mine), me=versioned(name), other=str(other)),
            resources=ResourceConfig.with_cpu(cpu=1),
            override_output_path=str(mine),
        )
        for name, mine, other in (("a", a_dir, b_dir), ("b", b_dir, a_dir))
    ]
    Executor(str(tmp_path / "prefix"), console=False, backend=RayBackend(cluster["cluster"].address)).run(
        steps
    )
    assert (a_dir / "started").read_text() != (b_dir / "started").read_text()
