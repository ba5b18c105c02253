"""A real multi-node Ray cluster on 127.0.0.1 for tests (and benchmarks), shut down after use."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def loopback_cluster(*nodes: dict[str, Any], head_cpus: int = 1) -> Iterator[tuple[Any, list[Any]]]:
    """A head with `head_cpus` CPUs and one node per `nodes` entry (`Cluster.add_node`
    arguments), all on 127.0.0.1, with this process connected; yields (cluster, nodes).

    Ray rewrites 127.0.0.1 in a cluster address to the machine's outward address, which
    this cluster does not listen on (the connection then hangs for minutes); the setting
    below makes it keep the loopback address -- the variable for the processes Ray starts,
    the constant for this one, which may have imported Ray already. Both are restored, and
    the cluster's processes stopped, on the way out, also when starting it fails.
    """
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    previous = os.environ.get(LOOPBACK_ENV)
    previous_constant = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOOPBACK_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    cluster = None
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": head_cpus,
                "include_dashboard": False,
                "node_ip_address": "127.0.0.1",
            },
        )
        added = [cluster.add_node(node_ip_address="127.0.0.1", **node) for node in nodes]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster, added
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = previous_constant
        if previous is None:
            os.environ.pop(LOOPBACK_ENV, None)
        else:
            os.environ[LOOPBACK_ENV] = previous
