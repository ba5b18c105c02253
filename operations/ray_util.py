"""Whether the data operations send their work to Ray, and the connection they use.

One rule for every operation (`map_shards` in `operations/shards.py`, tokenize's
`builder="auto"`): work goes to Ray when this process is already connected to Ray (the
executor's Ray backend connects its driver while a run has steps to run; a step running
inside a Ray task is connected too) or `$RAY_ADDRESS` names a cluster. Otherwise the
operation runs on this machine, and Ray is never imported.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

logger = logging.getLogger(__name__)

_RAY_LOCK = threading.Lock()


def ray_connected() -> bool:
    """True if this process is connected to Ray or told where a cluster is (RAY_ADDRESS)."""
    ray = sys.modules.get("ray")
    return bool(os.environ.get("RAY_ADDRESS")) or (ray is not None and ray.is_initialized())


def ensure_ray() -> float:
    """Connect to Ray, starting a local instance if this process has none; returns its CPU count.

    A started instance is left running for later steps in this process (starting one costs
    seconds) and is shut down when the process exits.
    """
    import ray

    with _RAY_LOCK:
        if not ray.is_initialized():
            started = time.perf_counter()
            ray.init(include_dashboard=False, configure_logging=False)
            logger.info("started Ray in %.1f s", time.perf_counter() - started)
    return float(ray.cluster_resources().get("CPU", 0))
