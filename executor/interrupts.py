"""Stopping the work a step hands to other processes when its run is interrupted.

Ctrl-C and SIGTERM reach the driver's main thread, which records the running steps as
interrupted and releases their leases (`executor.runner.Runner._interrupt`). A light step
runs in a thread of the driver that never sees the interrupt: work it waits on in other
processes (a pool of shard workers, Ray tasks) went on writing into the output after its
lease was released, and a second driver could take the step at once and write the same
files (found by a red-team pass, twenty-second session).

Such code registers how to stop that work for as long as it waits on it
(`stop_on_interrupt`); the runner calls every registered stopper (`stop_running_work`)
before it releases any lease. A stopper ends the work (terminates the processes, cancels
the tasks) and returns once it has ended, or after a bounded wait; the waiting thread then
sees its work fail and unwinds.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator

from executor.lazy_logging import LazyLogger

logger = LazyLogger(__name__)

_lock = threading.Lock()
_stoppers: dict[int, Callable[[], None]] = {}
_keys = itertools.count()


@contextlib.contextmanager
def stop_on_interrupt(stop: Callable[[], None]) -> Iterator[None]:
    """While the block runs, an interrupted run calls `stop()` (from the driver's main thread)."""
    key = next(_keys)
    with _lock:
        _stoppers[key] = stop
    try:
        yield
    finally:
        with _lock:
            _stoppers.pop(key, None)


def stop_running_work() -> int:
    """Call every registered stopper; returns how many there were. Never raises: a stopper
    that fails is logged, and the others still run."""
    with _lock:
        stoppers = list(_stoppers.values())
    for stop in stoppers:
        try:
            stop()
        except Exception as error:  # (the interrupt goes on: leases are released, the run ends)
            logger.error("could not stop a step's work on interrupt: %s: %s", type(error).__name__, error)
    return len(stoppers)
