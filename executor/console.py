"""Live progress on the console: one line per step event, with done/running/left counts."""

from __future__ import annotations

import contextlib
import os
import sys
from _thread import allocate_lock  # (`threading` itself: ~0.4 ms of every start)
from collections.abc import Collection

from executor.events import (
    RunFinished,
    StepFailed,
    StepSkipped,
    StepStarted,
    StepSucceeded,
    StepWaiting,
)
from executor.terminal import one_line
from executor.tree import utc_now_iso

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import TextIO


def write_or_drop(stream: TextIO | None, text: str) -> bool:
    """Write `text` to the console and flush; False, raising nothing, if the console is gone.

    A console that went away (`script | head`, a closed terminal, a process started without
    a stdout) is no reason to stop a run: its steps and statuses do not depend on it.
    """
    if stream is None:
        return False
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):  # BrokenPipeError, EIO, or a closed file object
        return False
    return True


def settle_stdout() -> None:
    """Flush stdout; if the reader went away, point it at /dev/null.

    Otherwise the interpreter's own flush at exit fails on what is still buffered, prints
    "Exception ignored ... BrokenPipeError" and exits with status 120 instead of the run's.
    """
    if sys.stdout is None:  # started without one (`>&-`): nothing to flush
        return
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)


class ConsoleProgress:
    """An event listener printing per-step status lines."""

    def __init__(self, total: int, stream: TextIO | None = None, planned_skips: Collection[str] = ()):
        """`planned_skips`: output paths the printed plan already shows as skipped; they count
        as done without a line each (a cached re-run of 1,000 steps printed 1,000 lines that
        repeated the plan)."""
        self.total = total
        self.stream = stream
        self.planned_skips = frozenset(planned_skips)
        self.done: set[str] = set()
        self.running: set[str] = set()
        self._lock = allocate_lock()  # events arrive from worker threads
        self.closed = False
        """Set when the console could not be written (`| head`, a closed terminal): nothing
        more is printed."""

    def _print(self, text: str) -> None:
        if self.closed:
            return
        stream = self.stream or sys.__stdout__
        left = self.total - len(self.done) - len(self.running)
        line = f"[{len(self.done)}/{self.total} done, {len(self.running)} running, {left} left] {text}\n"
        # The listener runs in the step's worker thread: raising here would fail the step (or,
        # before, kill the worker and hang the run) over progress lines nobody reads.
        self.closed = not write_or_drop(stream, line)

    def __call__(self, event) -> None:
        if type(event) is StepSkipped and event.output_path in self.planned_skips:
            # One per step of a cached re-run: it only counts (a set's add needs no lock).
            self.done.add(event.output_path)
            return
        with self._lock:
            self._handle(event)

    def _handle(self, event) -> None:
        if isinstance(event, StepSkipped):  # (first: a cached re-run sends one per step)
            self._finish(event.output_path)
            if event.output_path not in self.planned_skips:
                self._print(f"skip   {event.name}  ({event.reason})")
        elif isinstance(event, StepStarted):
            self.running.add(event.output_path)
            self._print(f"start  {event.name}  (log: {event.log_path})")
        elif isinstance(event, StepSucceeded):
            self._finish(event.output_path)
            self._print(f"ok     {event.name}  {event.duration:.1f}s")
        elif isinstance(event, StepWaiting):
            self._print(
                f"wait   {event.name}  held by {one_line(event.holder)}, last heartbeat {utc_now_iso(event.heartbeat)}"
            )
        elif isinstance(event, StepFailed):
            self._finish(event.output_path)
            where = f"  (log: {event.log_path})" if event.log_path else ""
            self._print(f"FAIL   {event.name}  [{event.kind}] {event.error}{where}")
        elif isinstance(event, RunFinished):
            self._print(
                f"finished in {event.duration:.1f}s: {event.succeeded} ran, {event.skipped} cached, "
                f"{event.failed} failed"
            )

    def _finish(self, output_path: str) -> None:
        self.running.discard(output_path)
        self.done.add(output_path)
