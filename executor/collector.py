"""The executor and Python's cyclic garbage collector.

**Paused where only long-lived objects are made** (`CollectorPause`): while `executor`
imports, and while a run resolves, plans and reports, until its steps run. Those phases
allocate ~100 objects per step and free almost none, so the collector, run every 700
allocations, would walk the growing heap again and again for nothing: about a tenth of a
cached re-run of 1,000 steps. Reference counting frees memory as usual meanwhile. A
collector the caller has disabled is left alone.

**What a pause made, promoted to the oldest generation** (`CollectorPause(promote=True)`: the
package's `__init__`, and `Executor.run`). Paused, the collector still counts the objects
made meanwhile -- ~5,000 functions, classes and tables while `executor` imports, ~100 per
step while a run plans -- and the first collections after the pause walked them all again:
a young collection at once, a middle-generation one soon after (1.5-2.5 ms of collections
in a cached re-run of 1,000 steps by a `gc.callbacks` hook, ~1% of its wall time by an
interleaved A/B; docs/benchmarks.md, fifteenth session). They live as long as the process or
the run, so on resuming they -- and whatever else was young then -- are moved where
survivors of two collections would be, the oldest generation (`gc.freeze()` then
`gc.unfreeze()`), which only the rare full collections walk. Nothing is given up but
timing: a reference cycle among them that is or becomes garbage is collected by the next
full collection, and `gc.get_objects()` lists them all as before. Not done while objects
are frozen (`gc.get_freeze_count()`: a program that froze objects before forking keeps
them frozen).

**Its last pass skipped at exit** (`skip_gc_at_exit`). When the interpreter exits, CPython runs the cyclic garbage collector over every object
still alive: the modules' functions and classes, the steps the script declared, and so on.
After a cached re-run of a 1,000-step experiment that pass was about 8 of the process's 83 ms
(the same script with and without the freeze; docs/benchmarks.md, thirteenth session). The
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


class CollectorPause:
    """The collector off for a `with` block (see the module docstring); `resume` turns it back
    on early (before the steps' own code runs). Left alone when the caller has disabled it.
    `promote`: on resuming, move every object to the oldest generation first (see the module
    docstring): for a block whose objects outlive it."""

    def __init__(self, promote: bool = False) -> None:
        self.paused = False
        self.promote = promote

    def __enter__(self) -> CollectorPause:
        if gc.isenabled():
            gc.disable()
            self.paused = True
        return self

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            if self.promote and not gc.get_freeze_count():
                # (freeze also resets the young generation's count: no collection right away)
                gc.freeze()
                gc.unfreeze()
            gc.enable()

    def __exit__(self, *exc_info: object) -> None:
        self.resume()
