"""Multi-host training on CPU: one training step run by two JAX processes on two Ray nodes.

A Ray cluster on 127.0.0.1 (`ray.cluster_utils.Cluster`, started and shut down here): a head
with no CPU and two nodes of one CPU each, so a step asking for `ResourceConfig(replicas=2)`
can only run as a gang across the two. The step is the project's `operations.train.train` of
the nano Llama on the tiny corpus of tests/operations/test_train.py; its two processes start
`jax.distributed` (coordinator on process 0's node) and train data-parallel, their
collectives through gloo. The reference is the same config trained by one process here.

LOSS_RTOL: two processes sum the gradient of the global batch in another order than one
process does, so float32 losses differ in their last bits. Measured on this machine (20
steps, train_batch_size 8): at most 1.5e-7 relative per step (several runs, eval losses
likewise); the bound is 1e-5, ~60x that, and still 1000x smaller than what a wrong gang
changes (a process training alone on half the batch, or both on the same half, moves the
loss by 1e-2 or more from step 1).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from executor import Executor, ExecutorRunError, ExecutorStep, ResourceConfig
from executor.tree import Status, read_info, read_status
from operations.train import TrainConfig, read_metrics, train
from tests.operations.test_train import checkpoint_steps, nano_config
from tests.operations.test_train import data as data  # noqa: F401 (the module fixture)

ray = pytest.importorskip("ray")

from executor.backends.ray_cluster import RayBackend  # noqa: E402
from tests.ray_cluster import loopback_cluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOSS_RTOL = 1e-5
GANG = ResourceConfig(cpu=1, replicas=2)
STEPS = 20  # checkpoints at steps 10 and 19


@contextlib.contextmanager
def environment(**values: str | None):
    before = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Two one-CPU nodes (and a head with none). The Ray processes inherit this environment:
    a JAX compilation cache shared by the gangs of this module (the second gang compiles
    nothing: ~40 s less each), and no W&B service of this process to attach to."""
    cache = tmp_path_factory.mktemp("jax-compilation-cache")
    # $WANDB_SERVICE is dropped for good, not restored afterwards: the in-process trainings of
    # this module tear W&B's service down, and a later test's processes would attach to it.
    os.environ.pop("WANDB_SERVICE", None)
    with environment(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PLATFORMS="cpu"):
        node = {"num_cpus": 1}
        with loopback_cluster(node, node, head_cpus=0) as (cluster, nodes):
            yield cluster, [n.node_id for n in nodes]


def run_gang(cluster, step: ExecutorStep) -> tuple[Executor, float]:
    executor = Executor(
        str(Path(step.override_output_path).parent), console=False, backend=RayBackend(cluster.address)
    )
    started = time.perf_counter()
    executor.run([step])
    return executor, time.perf_counter() - started


def gang_step(config, fn=train) -> ExecutorStep:
    return ExecutorStep(
        name="train-gang", fn=fn, config=config, resources=GANG, override_output_path=config.output_path
    )


def losses(output: str | Path, key: str = "train/loss") -> dict[int, float]:
    return {m["step"]: m[key] for m in read_metrics(str(output)) if key in m}


def assert_same_curve(actual: dict[int, float], expected: dict[int, float], steps) -> None:
    steps = list(steps)
    assert set(steps) <= set(actual) and set(steps) <= set(expected), (sorted(actual), sorted(expected))
    got, want = np.array([actual[s] for s in steps]), np.array([expected[s] for s in steps])
    print(
        f"\nlargest relative difference over steps {steps[0]}..{steps[-1]}: {np.max(np.abs(got - want) / np.abs(want)):.2e}"
    )
    np.testing.assert_allclose(got, want, rtol=LOSS_RTOL)


def resume_from(source: Path, step: int, destination: Path) -> None:
    """A new output that holds only `source`'s checkpoint of `step` (as if killed just after it)."""
    shutil.copytree(source / "checkpoints" / f"step-{step}", destination / "checkpoints" / f"step-{step}")


@pytest.fixture(scope="module")
def single(data, tmp_path_factory):  # noqa: F811
    """The reference: the same training in one process (this one)."""
    output = tmp_path_factory.mktemp("single") / "run"
    train(nano_config(data, output, num_train_steps=STEPS))
    return output


@pytest.fixture(scope="module")
def gang(two_nodes, data, tmp_path_factory):  # noqa: F811
    cluster, _ = two_nodes
    output = tmp_path_factory.mktemp("gang") / "run"
    executor, seconds = run_gang(cluster, gang_step(nano_config(data, output, num_train_steps=STEPS)))
    print(f"\ntwo-process training, {STEPS} steps: {seconds:.1f} s")
    return executor, output


def test_two_processes_on_two_nodes_train_the_single_process_loss_curve(single, gang, two_nodes):
    executor, output = gang
    assert [event.status for event in read_status(executor.store, str(output))] == [
        Status.RUNNING,
        Status.SUCCESS,
    ]
    assert_same_curve(losses(output), losses(single), range(STEPS))
    assert_same_curve(losses(output, "eval/loss"), losses(single, "eval/loss"), [0, 10, 19])
    # two processes, one device each, on the two nodes
    dispatch = read_info(executor.store, str(output))["dispatch"]
    assert dispatch["gang"]["processes"] == 2 and dispatch["gang"]["strategy"] == "STRICT_SPREAD"
    nodes = [entry["node"] for entry in dispatch["gang"]["processes_on"]]
    assert sorted(nodes) == sorted(two_nodes[1])
    host, port = dispatch["gang"]["coordinator"].rsplit(":", 1)
    assert host == dispatch["gang"]["processes_on"][0]["ip"] and int(port) > 0
    devices = json.loads((output / "stats.json").read_text())["devices"]
    assert devices["process_count"] == 2 and devices["count"] == 2
    # and the same in .executor_info (process 0's record) and in the metrics at the first step
    assert read_info(executor.store, str(output))["devices"] == devices
    assert {k: v for k, v in read_metrics(str(output))[0].items() if k.startswith("devices/")} == {
        f"devices/{k}": v for k, v in devices.items()
    }


def test_each_process_logs_to_a_file_of_its_own_and_only_process_0_keeps_the_books(gang):
    executor, output = gang
    dispatch = read_info(executor.store, str(output))["dispatch"]
    node_0, node_1 = (entry["node"] for entry in dispatch["gang"]["processes_on"])
    log_0 = (output / ".executor_log").read_text()
    log_1 = (output / "logs" / "process-1.log").read_text()
    assert f"process 0 of 2 on Ray node {node_0}" in log_0 and "train: JAX backend cpu, 2 x cpu" in log_0
    assert f"process 1 of 2 on Ray node {node_1}" in log_1 and "train: JAX backend cpu, 2 x cpu" in log_1
    assert "process 1 of 2" not in log_0 and "process 0 of 2" not in log_1
    # one metrics line per step and kind (process 1 logs nothing there), W&B's runs are process 0's
    steps = [
        m["step"]
        for m in map(json.loads, (output / "metrics.jsonl").read_text().splitlines())
        if "train/loss" in m
    ]
    assert (
        sorted(set(steps)) == list(range(STEPS)) and len(steps) <= STEPS + 1
    )  # (Levanter logs the last twice)
    assert (
        len(list((output / "wandb").glob("offline-run-*"))) == 2
    )  # Levanter's two wandb.init of one process
    assert [event.worker.count("/step:") for event in read_status(executor.store, str(output))] == [0, 1]


def test_a_two_process_checkpoint_resumes_in_one_process(gang, data, tmp_path):  # noqa: F811
    _, two = gang
    output = tmp_path / "run"
    resume_from(two, 10, output)
    train(nano_config(data, output, num_train_steps=STEPS))
    stats = json.loads((output / "stats.json").read_text())
    assert stats["attempts"][0]["resumed_from_step"] == 10 and stats["devices"]["process_count"] == 1
    assert min(losses(output)) == 11  # continued; nothing before the checkpoint was trained again
    assert_same_curve(losses(output), losses(two), range(11, STEPS))


def test_a_one_process_checkpoint_resumes_in_two_processes(single, two_nodes, data, tmp_path):  # noqa: F811
    cluster, _ = two_nodes
    output = tmp_path / "run"
    resume_from(single, 10, output)
    run_gang(cluster, gang_step(nano_config(data, output, num_train_steps=STEPS)))
    stats = json.loads((output / "stats.json").read_text())
    assert stats["attempts"][0]["resumed_from_step"] == 10 and stats["devices"]["process_count"] == 2
    assert [m["step"] for m in read_metrics(str(output)) if m.get("devices/process_count") == 2] == [11]
    assert min(losses(output)) == 11
    assert_same_curve(losses(output), losses(single), range(11, STEPS))


@dataclass(frozen=True)
class LoseProcessConfig:
    train: TrainConfig
    output_path: str
    process: int = 1
    after_checkpoint: int = 10


def train_losing_a_process_once(config: LoseProcessConfig) -> None:
    """`train`, but process `config.process` of the gang exits at once -- as if its host were
    lost -- when checkpoint `after_checkpoint` is complete, the first time only."""
    marker = Path(config.output_path) / f"lost-process-{config.process}"
    if os.environ.get("MARIN_PROCESS_ID") == str(config.process) and not marker.exists():
        checkpoint = (
            Path(config.output_path) / "checkpoints" / f"step-{config.after_checkpoint}" / "metadata.json"
        )

        def exit_after_checkpoint():
            while not checkpoint.exists():
                time.sleep(0.02)
            marker.write_text("lost once\n")
            print(
                f"process {config.process}: exiting on purpose after checkpoint {config.after_checkpoint}",
                flush=True,
            )
            os._exit(1)

        threading.Thread(target=exit_after_checkpoint, daemon=True).start()
    train(config.train)


def test_a_process_lost_mid_run_stops_the_gang_which_is_resubmitted_and_resumes(two_nodes, data, tmp_path):  # noqa: F811
    cluster, _ = two_nodes
    output = tmp_path / "run"
    steps = 30  # so that the exit at checkpoint 10 comes well before the end
    config = LoseProcessConfig(
        train=nano_config(data, output, num_train_steps=steps, epochs=2), output_path=str(output)
    )
    executor, _ = run_gang(cluster, gang_step(config, fn=train_losing_a_process_once))
    history = read_status(executor.store, str(output))
    assert [event.status for event in history] == [Status.RUNNING, Status.RUNNING, Status.SUCCESS]
    assert history[1].message == "attempt 2 of 3"
    assert (output / "lost-process-1").exists()
    assert "exiting on purpose after checkpoint 10" in (output / "logs" / "process-1.log").read_text()
    # the driver's side of the step log says why the gang was submitted again
    assert "process 1 of 2" in (output / ".executor_log").read_text()
    stats = json.loads((output / "stats.json").read_text())
    # one finished attempt (the lost one wrote no stats), resumed from the checkpoint, not from 0
    assert [attempt["resumed_from_step"] for attempt in stats["attempts"]] == [10]
    assert checkpoint_steps(str(output))[-1] == steps - 1
    trained = losses(output)
    assert sorted(trained) == list(range(steps))


@dataclass(frozen=True)
class NothingConfig:
    output_path: str


def never_runs(config: NothingConfig) -> None:
    raise AssertionError("a refused step ran")


def test_a_gang_larger_than_the_cluster_is_refused_naming_the_step_and_what_it_asked(two_nodes, tmp_path):
    cluster, _ = two_nodes
    output = str(tmp_path / "out")
    step = ExecutorStep(
        name="too-wide",
        fn=never_runs,
        config=NothingConfig(output),
        resources=ResourceConfig(cpu=1, replicas=3),
        override_output_path=output,
    )
    executor = Executor(str(tmp_path), console=False, backend=RayBackend(cluster.address))
    started = time.time()
    with pytest.raises(ExecutorRunError) as caught:
        executor.run([step])
    assert time.time() - started < 30
    message = caught.value.failures[0].error
    assert message.startswith(
        "step 'too-wide' asks for CPU x3 replicas: 3 processes on 3 different nodes, each with 1 CPU, "
        "and the live nodes of the Ray cluster cannot hold that (nodes: "
    ), message
    assert message.count("{1 CPU}") == 2  # what the nodes have (the head: nothing)
    assert "lower ResourceConfig.replicas" in message
    assert read_status(executor.store, output)[-1].status == Status.FAILED


# -- the gang itself, with a step function that trains nothing (seconds, not minutes) ----------


def where_am_i(config: NothingConfig) -> None:
    """Each process of the gang writes its place in it and its Ray node to the output."""
    import ray as ray_on_worker

    index = os.environ["MARIN_PROCESS_ID"]
    node = ray_on_worker.get_runtime_context().get_node_id()
    Path(config.output_path, f"process-{index}").write_text(
        f"{index} {os.environ['MARIN_NUM_PROCESSES']} {os.environ['MARIN_COORDINATOR_ADDRESS']} {node}\n"
    )


def gang_leftovers() -> list[str]:
    """Placement groups of the executor's gangs still reserved, and its actors still alive."""
    groups = [
        info["name"]
        for info in ray.util.placement_group_table().values()
        if info.get("name", "").startswith("marin-gang:") and info.get("state") != "REMOVED"
    ]
    actors = [  # the processes, and a TPU gang's slice reservations (Levanter's SliceActors)
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].startswith(("marin-step:", "marin-gang:"))
    ]
    return groups + actors


def test_the_processes_of_a_gang_run_on_distinct_nodes_even_where_one_node_could_hold_them_all(
    two_nodes, tmp_path
):
    cluster, node_ids = two_nodes
    output = tmp_path / "out"
    step = ExecutorStep(
        name="where",
        fn=where_am_i,
        config=NothingConfig(str(output)),
        resources=ResourceConfig(cpu=0.5, replicas=2),  # both halves would fit on one node
        override_output_path=str(output),
    )
    executor, _ = run_gang(cluster, step)
    places = [(output / f"process-{index}").read_text().split() for index in range(2)]
    assert [place[:2] for place in places] == [["0", "2"], ["1", "2"]]
    assert places[0][2] == places[1][2]  # one coordinator, process 0's
    assert sorted(place[3] for place in places) == sorted(node_ids)
    assert [event.status for event in read_status(executor.store, str(output))] == [
        Status.RUNNING,
        Status.SUCCESS,
    ]
    assert (output / "logs" / "process-1.log").exists() and not (output / "logs" / "process-0.log").exists()
    deadline = time.time() + 30  # the driver removes the gang when it has its result
    while gang_leftovers() and time.time() < deadline:
        time.sleep(0.2)
    assert gang_leftovers() == []


def test_a_gang_not_placed_within_the_placement_timeout_is_a_lost_attempt_and_leaves_nothing(
    two_nodes, tmp_path
):
    cluster, _ = two_nodes
    output = tmp_path / "out"
    step = ExecutorStep(
        name="waits",
        fn=never_runs,
        config=NothingConfig(str(output)),
        resources=ResourceConfig(cpu=1, replicas=3),  # three hosts; the cluster has two
        override_output_path=str(output),
    )
    executor = Executor(str(tmp_path), console=False, backend=RayBackend(cluster.address), max_retries=0)
    with environment(MARIN_RAY_WAIT_FOR_NODES="1", MARIN_RAY_PLACEMENT_TIMEOUT="3"):
        started = time.time()
        with pytest.raises(ExecutorRunError) as caught:
            executor.run([step])
    assert time.time() - started < 30
    message = caught.value.failures[0].error
    assert "was not placed within 3 s ($MARIN_RAY_PLACEMENT_TIMEOUT)" in message, message
    assert "(after 1 attempts)" in message
    assert read_status(executor.store, str(output))[-1].status == Status.FAILED
    assert gang_leftovers() == []


def attempt_number(config: NothingConfig) -> int:
    from executor.store import open_store

    return sum(
        event.status == Status.RUNNING
        for event in read_status(open_store(config.output_path), config.output_path)
    )


def process_1_lost_while_process_0_hangs(config: NothingConfig) -> None:
    """First attempt: process 1 dies at once, process 0 waits for 90 s, as a process blocked in a
    collective with a dead peer may; later attempts finish at once."""
    first = attempt_number(config) == 1
    if first and os.environ["MARIN_PROCESS_ID"] == "1":
        os._exit(1)
    if first:
        time.sleep(90)
        Path(config.output_path, "process-0-woke").write_text("the gang was not stopped\n")


def test_the_driver_stops_the_whole_gang_when_a_process_dies_and_submits_it_again(two_nodes, tmp_path):
    cluster, _ = two_nodes
    output = tmp_path / "out"
    output.mkdir()
    step = ExecutorStep(
        name="lossy",
        fn=process_1_lost_while_process_0_hangs,
        config=NothingConfig(str(output)),
        resources=GANG,
        override_output_path=str(output),
    )
    executor, seconds = run_gang(cluster, step)
    assert seconds < 60, seconds  # not the 90 s process 0 of the first attempt would have waited
    history = read_status(executor.store, str(output))
    assert [event.status for event in history] == [Status.RUNNING, Status.RUNNING, Status.SUCCESS]
    assert history[1].message == "attempt 2 of 3"
    assert not (output / "process-0-woke").exists()
    deadline = time.time() + 30
    while gang_leftovers() and time.time() < deadline:
        time.sleep(0.2)
    assert gang_leftovers() == []


# -- TPU slices, reserved by Levanter's SliceActor --------------------------------------------


def fake_tpu_host(cluster, slice_name: str, worker: int, variant: str = "v4-16"):
    """A CPU node that presents itself to Ray and to Levanter as host `worker` of the TPU slice
    `slice_name`, as a GKE TPU host does. What is faked is only what the TPU hardware would
    provide: the environment GKE gives a TPU VM (`TPU_NAME`, `TPU_WORKER_ID`,
    `TPU_ACCELERATOR_TYPE`: where Ray's `TPUAcceleratorManager`, and so Levanter's
    `SliceActor`/`TPUHostActor`, read the slice's name, the host's worker id and the pod type,
    the GCE metadata server being the other source), and what Ray derives from it on a real
    TPU host (its resources: the chips `TPU`, `<slice name>`, `TPU-<variant>-head` on worker 0;
    its labels `ray.io/tpu-*`), which Ray only does when it finds TPU chips (/dev/accel*).
    Nothing in Levanter or in the executor is mocked."""
    resources = {"TPU": 4, slice_name: 1, **({f"TPU-{variant}-head": 1} if worker == 0 else {})}
    labels = {
        "ray.io/tpu-slice-name": slice_name,
        "ray.io/tpu-worker-id": str(worker),
        "ray.io/tpu-pod-type": variant,
    }
    env = {"TPU_NAME": slice_name, "TPU_WORKER_ID": str(worker), "TPU_ACCELERATOR_TYPE": variant}
    return cluster.add_node(
        node_ip_address="127.0.0.1", num_cpus=1, resources=resources, labels=labels, env_vars=env
    )


@pytest.fixture(scope="module")
def tpu_slices(two_nodes):
    """Fake TPU hosts join the cluster for the rest of the module (the TPU tests come last):
    v4-16 slices `a` and `c` with only their worker 0, v4-16 slices `b` and `d` and v5p-16
    slice `p` whole (two hosts each)."""
    cluster, _ = two_nodes
    spec = {"a": ("v4-16", 1), "c": ("v4-16", 1), "b": ("v4-16", 2), "d": ("v4-16", 2), "p": ("v5p-16", 2)}
    added = {
        name: [fake_tpu_host(cluster, name, worker, variant) for worker in range(hosts)]
        for name, (variant, hosts) in spec.items()
    }
    cluster.wait_for_nodes()
    yield cluster, {name: [node.node_id for node in nodes] for name, nodes in added.items()}
    for nodes in added.values():
        for node in nodes:
            cluster.remove_node(node)


def on_which_node(config: NothingConfig) -> None:
    """Each process writes a file named for its Ray node and the TPU worker id it finds in its
    environment (a TPU gang has no $MARIN_PROCESS_ID: JAX reads a slice's own metadata)."""
    import ray as ray_on_worker

    node = ray_on_worker.get_runtime_context().get_node_id()
    Path(config.output_path, f"on-{node}").write_text(os.environ.get("TPU_WORKER_ID", "?"))


def run_on_tpu(cluster, tmp_path, name: str, resources: ResourceConfig, fn=on_which_node, **kwargs):
    output = tmp_path / name
    output.mkdir()
    step = ExecutorStep(
        name=name,
        fn=fn,
        config=NothingConfig(str(output)),
        resources=resources,
        override_output_path=str(output),
    )
    executor = Executor(str(tmp_path), console=False, backend=RayBackend(cluster.address), **kwargs)
    with environment(MARIN_RAY_PLACEMENT_TIMEOUT="60"):
        executor.run([step])
    return executor, output


def assert_slices_released(names: list[str]) -> None:
    """No gang is left, and Levanter's actors gave the slices back: every slice's own resource
    (held by its TPUHostActors) and every head (held by its SliceActor) is free again."""

    def held() -> dict[str, float]:
        free, total = ray.available_resources(), ray.cluster_resources()
        return {
            name: total[name] - free.get(name, 0)
            for name in total
            if (name in names or name.endswith("-head")) and free.get(name, 0) != total[name]
        }

    deadline = time.time() + 30
    while (gang_leftovers() or held()) and time.time() < deadline:
        time.sleep(0.2)
    assert gang_leftovers() == [] and held() == {}


def test_a_tpu_slice_of_two_hosts_is_reserved_by_levanter_and_runs_on_one_whole_slice(tpu_slices, tmp_path):
    """Slices `a` and `c` have only their worker 0, `b` both hosts of a v4-16, and `d`'s head is
    held by another job. Levanter's SliceActor must take `b`'s head -- never a slice it cannot
    complete, where its TPUHostActors would wait for ever -- and the gang runs on `b`'s two
    hosts, in worker order: process 0 (the books, `.executor_log`) on worker 0, process 1
    (`logs/process-1.log`) on worker 1."""
    cluster, hosts = tpu_slices
    holder = ray.remote(num_cpus=0, resources={"TPU-v4-16-head": 1})(HeadHolder)
    holder = holder.options(label_selector={"ray.io/tpu-slice-name": "d"}).remote()  # d is busy
    ray.get(holder.ready.remote())
    try:
        executor, output = run_on_tpu(
            cluster, tmp_path, "slice", ResourceConfig.with_tpu("v4-16"), max_retries=0
        )
    finally:
        ray.kill(holder)
    ran_on = {path.name.removeprefix("on-"): path.read_text() for path in output.glob("on-*")}
    assert ran_on == {hosts["b"][0]: "0", hosts["b"][1]: "1"}
    dispatch = read_info(executor.store, str(output))["dispatch"]
    gang = dispatch["gang"]
    assert dispatch["device"] == "TPU v4-16"
    assert (gang["processes"], gang["hosts_per_replica"], gang["coordinator"]) == (2, 2, None)
    assert [entry["node"] for entry in gang["processes_on"]] == hosts["b"]
    assert gang["slices"] == [{"name": "b", "ip": "127.0.0.1", "nodes": hosts["b"]}]
    assert gang["slices_reserved_by"] == "levanter.infra.ray_tpu.SliceActor"
    assert gang["bundles"] == [{"CPU": 1, "TPU": 4}] * 2  # the head is the SliceActor's
    assert "process 0 of 2 on Ray node " + hosts["b"][0] in (output / ".executor_log").read_text()
    assert "process 1 of 2 on Ray node " + hosts["b"][1] in (output / "logs" / "process-1.log").read_text()
    assert [event.status for event in read_status(executor.store, str(output))] == [
        Status.RUNNING,
        Status.SUCCESS,
    ]
    assert_slices_released(["a", "b", "c", "d", "p"])


def where_on_the_slices(config: NothingConfig) -> None:
    """Each process writes what it finds in its environment: its host's TPU name and worker id,
    and Megascale's variables."""
    names = [
        "TPU_NAME",
        "TPU_WORKER_ID",
        *(f"MEGASCALE_{n}" for n in ("COORDINATOR_ADDRESS", "NUM_SLICES", "SLICE_ID")),
    ]
    place = {name: os.environ.get(name) for name in names}
    Path(config.output_path, f"{place['TPU_NAME']}-{place['TPU_WORKER_ID']}.json").write_text(
        json.dumps(place)
    )


def test_two_tpu_slices_are_reserved_by_two_slice_actors_and_talk_through_megascale(tpu_slices, tmp_path):
    """`with_tpu("v4-16", slice_count=2)`: Levanter reserves the two whole v4-16 slices, `b` and
    `d`, one SliceActor each; four processes, slice 0's hosts first, each with Megascale's
    variables (the coordinator on slice 0's worker 0, port 8081, as Levanter's run_on_pod sets
    them)."""
    cluster, hosts = tpu_slices
    executor, output = run_on_tpu(
        cluster,
        tmp_path,
        "two-slices",
        ResourceConfig.with_tpu("v4-16", slice_count=2),
        fn=where_on_the_slices,
    )
    gang = read_info(executor.store, str(output))["dispatch"]["gang"]
    first, second = (piece["name"] for piece in gang["slices"])
    assert {first, second} == {"b", "d"}
    assert [entry["node"] for entry in gang["processes_on"]] == hosts[first] + hosts[second]
    places = {path.stem: json.loads(path.read_text()) for path in output.glob("*.json")}
    assert sorted(places) == sorted(f"{name}-{worker}" for name in "bd" for worker in (0, 1))
    for name, slice_id in ((first, "0"), (second, "1")):
        for worker in (0, 1):
            assert places[f"{name}-{worker}"] == {
                "TPU_NAME": name,
                "TPU_WORKER_ID": str(worker),
                "MEGASCALE_COORDINATOR_ADDRESS": "127.0.0.1:8081",
                "MEGASCALE_NUM_SLICES": "2",
                "MEGASCALE_SLICE_ID": slice_id,
            }
    assert (output / "logs" / "process-3.log").exists()
    assert_slices_released(["b", "d"])


def test_tpu_alternatives_are_tried_in_order_the_first_with_free_slices_wins(tpu_slices, tmp_path):
    """`with_tpu(["v5p-16", "v4-16"])`: while something else holds the v5p-16 slice's head the
    gang takes the v4-16 alternative (and records that device); once it is free, the
    preferred v5p-16."""
    cluster, hosts = tpu_slices
    holder = ray.remote(num_cpus=0, resources={"TPU-v5p-16-head": 1})(HeadHolder).remote()
    ray.get(holder.ready.remote())
    try:
        busy, output = run_on_tpu(cluster, tmp_path, "busy", ResourceConfig.with_tpu(["v5p-16", "v4-16"]))
    finally:
        ray.kill(holder)
    dispatch = read_info(busy.store, str(output))["dispatch"]
    assert dispatch["device"] == "TPU v4-16"
    assert dispatch["ray_options"]["resources"] == {"TPU": 4, "TPU-v4-16-head": 1}
    (taken,) = (piece["name"] for piece in dispatch["gang"]["slices"])
    assert taken in ("b", "d")  # the whole v4-16 slices
    ran_on = {path.name.removeprefix("on-"): path.read_text() for path in output.glob("on-*")}
    assert ran_on == {hosts[taken][0]: "0", hosts[taken][1]: "1"}
    assert_slices_released(["b", "d", "p"])

    free, output = run_on_tpu(cluster, tmp_path, "free", ResourceConfig.with_tpu(["v5p-16", "v4-16"]))
    ran_on = {path.name.removeprefix("on-"): path.read_text() for path in output.glob("on-*")}
    assert ran_on == {hosts["p"][0]: "0", hosts["p"][1]: "1"}
    dispatch = read_info(free.store, str(output))["dispatch"]
    assert dispatch["device"] == "TPU v5p-16" and [s["name"] for s in dispatch["gang"]["slices"]] == ["p"]
    assert_slices_released(["b", "d", "p"])


class HeadHolder:
    """Something else's job on a TPU slice: it holds the slice's head."""

    def ready(self) -> bool:
        return True


def worker_1_lost_on_the_first_attempt(config: NothingConfig) -> None:
    """First attempt: the process on TPU worker 1 dies at once, the one on worker 0 waits for
    90 s (as a process blocked in a collective with a dead peer may); later attempts finish."""
    first = attempt_number(config) == 1
    worker = os.environ["TPU_WORKER_ID"]
    if first and worker == "1":
        os._exit(1)
    if first:
        time.sleep(90)
        Path(config.output_path, "worker-0-woke").write_text("the gang was not stopped\n")
    Path(config.output_path, f"done-{worker}").write_text("")


def test_a_tpu_gang_that_loses_a_host_is_stopped_and_resubmitted_as_a_unit(tpu_slices, tmp_path):
    """A process of a TPU gang dies: the whole gang is stopped (the other process too, and
    Levanter's reservation given back), and the step is submitted again, which reserves the
    slice again through Levanter and finishes."""
    cluster, hosts = tpu_slices
    started = time.perf_counter()
    executor, output = run_on_tpu(
        cluster,
        tmp_path,
        "lossy-tpu",
        ResourceConfig.with_tpu("v4-16"),
        fn=worker_1_lost_on_the_first_attempt,
    )
    assert time.perf_counter() - started < 85  # not the 90 s worker 0 of the first attempt would wait
    history = read_status(executor.store, str(output))
    assert [event.status for event in history] == [Status.RUNNING, Status.RUNNING, Status.SUCCESS]
    assert history[1].message == "attempt 2 of 3"
    assert not (output / "worker-0-woke").exists()
    assert (output / "done-0").exists() and (output / "done-1").exists()
    assert "process 1 of 2" in (output / ".executor_log").read_text()  # why it was submitted again
    assert_slices_released(["b", "d"])
