"""What the backends' in-process tests build their cases from: a resolved heavy step, the
node records `ray.nodes()` returns (shared by test_mutants_backends_local.py, _ray_cluster.py
and _ray_slices.py), and a console stream that records each flush."""

from __future__ import annotations

import io

from executor import ExecutorStep, this_output_path, versioned
from executor.backends import ray_cluster as rc
from tests.executor.steps_for_heavy import IntervalConfig, record_interval


def resolved_interval_step(resources, name: str = "train", prefix: str = "/tmp/unused"):
    """`record_interval` as a step asking for `resources`, resolved under `prefix`."""
    from executor.graph import resolve

    step = ExecutorStep(
        name=name,
        fn=record_interval,
        config=IntervalConfig(output_path=this_output_path(), index=versioned(0)),
        resources=resources,
    )
    return resolve([step], prefix).steps[0]


def node(labels=None, alive=True, node_id="n", ip=None, **resources):
    """A node as `ray.nodes()` lists it."""
    record = {"Alive": alive, "Resources": resources, "Labels": labels, "NodeID": node_id}
    if ip is not None:
        record["NodeManagerAddress"] = ip
    return record


def tpu_slice(name, hosts, variant="v4-32", head=True):
    """The nodes of a TPU slice as Ray labels them: worker 0 holds `TPU-<variant>-head`."""
    return [
        node(
            {rc.TPU_SLICE_LABEL: name, rc.TPU_POD_TYPE_LABEL: variant, rc.TPU_WORKER_LABEL: str(i)},
            CPU=8,
            TPU=4,
            **({f"TPU-{variant}-head": 1} if i == 0 and head else {}),
        )
        for i in range(hosts)
    ]


class FlushRecorder(io.StringIO):
    """A console stream that records what it held at each flush (for lines that must reach the
    console before something else happens, not only when the process ends)."""

    def __init__(self):
        super().__init__()
        self.flushed: list[str] = []

    def flush(self):
        self.flushed.append(self.getvalue())
