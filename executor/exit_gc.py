"""Spare the process the garbage collector's pass over every live object at exit.

When the interpreter exits, CPython runs the cyclic garbage collector over every object
still alive: the modules' functions and classes, the steps the script declared, and so on.
After a cached re-run of a 1,000-step experiment that pass is about 5 of the process's 80 ms
(measured by ending the same process with `os._exit`; docs/benchmarks.md). The
objects are freed all the same as the modules are torn down; the pass only looks for
reference cycles that became garbage.

So once a run starts, the executor registers `gc.freeze` to run at exit (`atexit`, after
every handler registered later, e.g. `logging.shutdown`): it moves the live objects out of
the collector's reach, and its last pass has nothing to traverse. What is given up: reference
cycles that are already garbage when the process exits are not collected, so their
finalizers (`__del__`) do not run -- which Python does not promise at exit anyway. Set
`MARIN_GC_AT_EXIT=1` to keep the collector's last pass.
"""

from __future__ import annotations

import atexit
import gc
import os

GC_AT_EXIT_ENV = "MARIN_GC_AT_EXIT"
"""Set to 1 to keep the garbage collector's pass at exit."""

_registered = False


def skip_gc_at_exit() -> None:
    """Register `gc.freeze` to run at exit, once per process (unless $MARIN_GC_AT_EXIT is 1)."""
    global _registered
    if _registered or os.environ.get(GC_AT_EXIT_ENV) == "1":
        return
    _registered = True
    atexit.register(gc.freeze)
