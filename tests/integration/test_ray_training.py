"""Real Levanter training on the Ray backend: a node lost mid-training, and two trainings at once.

A Ray cluster on 127.0.0.1 (`ray.cluster_utils.Cluster`, started and shut down here) with a
head and two "trainer" nodes (a custom resource only they have). The training step is the
project's own `operations.train.train` of the nano Llama on a tiny tokenized corpus.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from executor import Executor, ExecutorStep, ResourceConfig
from executor.tree import Status, read_status
from operations.train import train
from tests.operations.test_train import checkpoint_steps, nano_config
from tests.operations.test_train import data as data  # noqa: F401 (the module fixture)
from tests.waiting import wait_for

ray = pytest.importorskip("ray")

from executor.backends.ray_cluster import RayBackend  # noqa: E402
from tests.ray_cluster import loopback_cluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def trainers():
    trainer = {"num_cpus": 1, "resources": {"trainer": 1}}
    with loopback_cluster(trainer, trainer) as (cluster, nodes):
        yield cluster, nodes


class TrainerBackend(RayBackend):
    """The Ray backend, with heavy steps sent to the "trainer" nodes only."""

    def prepare(self, step):
        dispatch = super().prepare(step)
        if dispatch.get("where") == "ray":
            dispatch["ray_options"] = {**dispatch["ray_options"], "resources": {"trainer": 1}}
        return dispatch


def step_node(output: Path) -> list[str]:
    return re.findall(r"on Ray node (\w+)", (output / ".executor_log").read_text())


def test_training_on_a_lost_node_is_resubmitted_and_resumes_from_its_checkpoint(trainers, data, tmp_path):  # noqa: F811
    cluster, nodes = trainers
    prefix = tmp_path / "tree"
    output = prefix / "train-nano"
    config = nano_config(
        data, str(output), num_train_steps=60, steps_per_checkpoint=5, steps_per_eval=30, epochs=5
    )
    step = ExecutorStep(
        name="train-nano",
        fn=train,
        config=config,
        resources=ResourceConfig.with_cpu(cpu=1),
        override_output_path=str(output),
    )
    executor = Executor(str(prefix), console=False, backend=TrainerBackend(cluster.address))
    errors: list[BaseException] = []

    def run():
        try:
            executor.run([step])
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: bool(checkpoint_steps(str(output))), timeout=240)
    (first_node,) = step_node(output)
    (lost,) = [node for node in nodes if node.node_id == first_node]
    killed_after = checkpoint_steps(str(output))[-1]
    cluster.remove_node(lost)
    thread.join(400)
    assert not thread.is_alive() and not errors, errors
    history = read_status(executor.store, str(output))
    assert [event.status for event in history] == [Status.RUNNING, Status.RUNNING, Status.SUCCESS]
    assert history[1].message == "attempt 2 of 3"
    nodes_seen = step_node(output)
    assert len(nodes_seen) == 2 and nodes_seen[1] != first_node
    stats = json.loads((output / "stats.json").read_text())
    # the attempt that finished started from a checkpoint, not from step 0
    assert stats["attempts"][-1]["resumed_from_step"] is not None
    assert stats["attempts"][-1]["resumed_from_step"] >= killed_after > 0
    assert checkpoint_steps(str(output))[-1] == 59


def test_two_trainings_run_at_once_on_different_nodes(trainers, data, tmp_path):  # noqa: F811
    cluster, nodes = trainers
    cluster.wait_for_nodes()
    live = [
        node
        for node in nodes
        if ray.nodes() and any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes())
    ]
    if len(live) < 2:  # the other test removed one: add another trainer node
        cluster.add_node(num_cpus=1, resources={"trainer": 1}, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
    prefix = tmp_path / "tree"
    steps = [
        ExecutorStep(
            name=f"train-{seed}",
            fn=train,
            config=nano_config(data, str(prefix / f"train-{seed}"), num_train_steps=20, seed=seed),
            resources=ResourceConfig.with_cpu(cpu=1),
            override_output_path=str(prefix / f"train-{seed}"),
        )
        for seed in (1, 2)
    ]
    Executor(str(prefix), console=False, backend=TrainerBackend(cluster.address)).run(steps)
    outputs = [prefix / f"train-{seed}" for seed in (1, 2)]
    (node_a,), (node_b,) = (step_node(output) for output in outputs)
    assert node_a != node_b
    spans = []
    for output in outputs:
        history = read_status(Executor(str(prefix), console=False).store, str(output))
        spans.append((history[0].date, history[-1].date))
        assert history[-1].status == Status.SUCCESS
    (start_a, end_a), (start_b, end_b) = spans
    assert start_a < end_b and start_b < end_a  # they overlapped in time
