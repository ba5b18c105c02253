"""Runs a plan: steps in driver threads, in dependency order, under leases.

All scheduling state lives in `Runner` and is changed only by the thread that calls
`Runner.run`; worker threads leave their reports in one deque, and wake that thread only
when it has something to do now (a failure, a dependent that may be ready, a queue running
short: `Runner._report`); it reads the rest at its next wake, within
SIGNAL_CHECK_INTERVAL_S. A worker that finishes a step goes on by itself with a light
dependent that waits for nothing else (the next step of a chain), and says so in its report:
a chain's step then costs no round trip through the scheduling thread. A worker thread:

1. takes the step's lease; if another live driver holds it, reads the status (done
   by that driver already? then skipped) and waits and polls;
2. with the lease: reads the status once more (another driver may have finished the
   step between our plan and our lease), writes `.executor_info`, marks RUNNING,
   calls `fn(config)` with its output captured to the step's log, then marks SUCCESS
   -- only if the function returned normally *and* the lease is still ours -- and
   releases the lease.

A failing step marks its dependents DEP_FAILED; independent branches go on. If the
heartbeat thread finds the lease taken over, the runner stops waiting on that step at
once and reports it; the orphaned function may still finish, but it never writes
SUCCESS.

An interrupt (Ctrl-C, SIGTERM: raised in the main thread) stops the run: the main thread
marks each running step FAILED "interrupted" and releases its lease. A per-step lock keeps
that apart from the worker's own writes: a worker that finds the run stopped before it
marks RUNNING does not start the step, and a step's final status, once being written, is
not followed by "interrupted".

The bookkeeping one step writes, and what each write is for. This is the least a
crash-safe, exactly-once step needs; on local disk a step that prints nothing and runs
shorter than the heartbeat interval makes exactly these writes:

- `mkdir <output>` (once, when the lease is created): the step's outputs and its
  bookkeeping live there.
- lease created, `.executor_status.lock` (`O_CREAT|O_EXCL` and one write, under the
  directory's flock): exactly-once. Another driver sees the step is taken and waits;
  if this driver dies, the heartbeat stops and the lease goes stale, so it is taken over.
- `.executor_info` (temporary file, then rename): what ran -- config, version,
  dependencies, where the run came from -- for `marin ls`/`explain`/`reproduce` and
  for the planner's "why did this hash change". Atomic so a reader never sees half a
  JSON document.
- RUNNING line appended to `.executor_status` (creates it; one `O_APPEND` write): the
  step started. After a crash the next plan sees RUNNING without a live lease ("a
  previous run did not finish") and `marin gc` sees an abandoned output.
- (the step's own outputs; `.executor_log` only if the step printed or logged)
- SUCCESS (or FAILED) line appended to `.executor_status` (one `O_APPEND` write): the
  cache entry. The last line decides whether a later run skips the step; SUCCESS
  carries the version hash and config digest the planner checks.
- lease deleted: other drivers need not wait out the timeout.

Reads: the plan lists each parent directory once and reads the status and the lease only
of steps whose directory exists (on a cold run, none); the worker reads the status after
taking the lease (another driver may have finished the step meanwhile). Fencing: before
the final status the lease must still be ours. A step shorter than the heartbeat interval
needs no read for that -- no driver can take over a lease younger than that (see
`executor.lease`) -- and its lease is deleted with one unlink; after a longer step the
lease is swapped from our exact bytes first, and deleted only if it still holds them. Nothing is
fsynced: a power cut may lose the last lines written, as it may lose the step's own
unsynced outputs; a process crash (SIGKILL) never leaves a half-written status line,
info or lease that a reader would take for a whole one.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from executor.backends import Backend, StepCancelled, StepFunctionError, UnsatisfiableError, is_heavy
from executor.events import (
    StepFailed,
    StepSkipped,
    StepStarted,
    StepSucceeded,
    StepWaiting,
)
from executor.interrupts import stop_running_work
from executor.lease import LeaseManager
from executor.logs import capture_step_log, streams_wrapped
from executor.mirror import MirrorError
from executor.outcomes import (  # noqa: F401 - DEFAULT_MAX_RETRIES, ExecutorRunError: re-exported
    DEFAULT_MAX_RETRIES,
    ExecutorRunError,
    Failure,
    Outcome,
    RunSummary,
    finish,
    skip_cached,
)
from executor.plan import Action, Plan, PlannedStep
from executor.store import Store
from executor.terminal import one_line
from executor.tree import (
    LEASE_FILE,
    OutputGuard,
    Status,
    append_status,
    log_path,
    read_last_status,
    remove_leftover_temp_files,
    remove_links_leading_out,
    step_info_record,
    write_info,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONCURRENT = 32
"""Driver threads when `max_concurrent` is None. Steps that need more parallelism than
this are heavy and belong on a remote backend anyway."""


WORKER_START_DELAY_S = 0.005
"""A step queued while no worker has taken a step for this long gets a new worker thread
(see `Runner._worker_due_in`)."""

QUEUE_AHEAD = 8
"""Steps queued for the workers beyond one per idle worker. A worker wakes the main thread
to queue more only when it leaves `QUEUE_LOW` or fewer (see `Runner._report`), so the main
thread wakes about once per `QUEUE_AHEAD - QUEUE_LOW` quick steps instead of once per step."""

QUEUE_LOW = 2
"""A worker that leaves this many steps queued or fewer wakes the main thread to queue more."""

SIGNAL_CHECK_INTERVAL_S = 0.02
"""The longest the main thread waits at a time. Python runs signal handlers (Ctrl-C,
SIGTERM) in the main thread only, and the kernel may deliver a signal to any thread: one
taken by another thread left the main thread blocked on the report queue, and the run going
on, until some step reported (seen in tests: a SIGINT unanswered for 30 s, until the test
let its step go on). It is also the longest a report that woke nobody waits to be read (see
`Runner._report`)."""


@contextlib.contextmanager
def _second_ctrl_c_deferred():
    """While an interrupted run records its stopped steps (FAILED, lease released), a second
    Ctrl-C -- two quick presses -- is announced, not raised: raised, it cut the recording
    short and left steps RUNNING under leases that the next run had to wait out. A third
    press leaves them so. Only in the main thread, over Python's own handler."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    presses = []

    def pressed(signum: int, frame: Any) -> None:
        presses.append(signum)
        if len(presses) > 1:
            raise KeyboardInterrupt
        with contextlib.suppress(Exception):  # no console (>&-), or a closed one
            sys.stderr.write(
                "interrupted: recording the stopped steps; press Ctrl-C again to leave them as they are\n"
            )

    previous = signal.signal(signal.SIGINT, pressed)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Runner:
    def __init__(
        self,
        plan: Plan,
        store: Store,
        leases: LeaseManager,
        emit: Callable[[Any], None],
        max_concurrent: int | None = None,
        backend: Backend | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ):
        """`run_record`, set before `run()`, is recorded in every `.executor_info` written.

        `backend` calls the step functions (default: every step in its driver thread)."""
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        self.plan = plan
        self.store = store
        self.leases = leases
        self.emit = _never_raising(emit)
        self.max_concurrent = max_concurrent or DEFAULT_MAX_CONCURRENT
        self.backend = backend or Backend()
        if max_retries < 0:
            raise ValueError(f"max_retries must be at least 0, got {max_retries}")
        self.max_retries = max_retries
        self.follow_logs = True
        """While waiting for a step another driver (or a step's own process) runs, echo its log."""
        self._messages: queue.SimpleQueue = queue.SimpleQueue()
        # Worker threads are kept and reused (starting a thread per step made the main thread
        # wait for each new thread to be scheduled, ~0.5 ms a step on a busy machine), and
        # started only as steps wait for one (see `_dispatch`). `_idle` counts workers waiting
        # on `_work`; `_queued` holds when each step still in `_work` was put there (FIFO).
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._pool_lock = threading.Lock()
        self._idle = 0
        self._workers = 0
        self._queued: collections.deque[float] = collections.deque()
        self._last_take = 0.0  # when a worker last took a queued step (`_worker_due_in`)
        # Workers' reports ("done", path, (outcome, error), the step it went on with), read by
        # the main thread whenever it wakes; `_messages` wakes it (see `_report`).
        self._reports: collections.deque[tuple] = collections.deque()
        self._stop = threading.Event()
        # One lock per dispatched step, held by the main thread while it records the step as
        # stopped (`_interrupt`) and by the step's worker while it checks `_stop` and writes
        # RUNNING, and while it confirms its lease and writes the final status. Without it, a
        # worker still in a step's bookkeeping (its config is built on first read) wrote
        # RUNNING after the main thread's FAILED "interrupted" and started the step, and a
        # step finishing as the run stopped could get "interrupted" after its SUCCESS.
        self._step_locks: dict[str, threading.Lock] = {}
        # Steps a worker went on with (`_following_step`) that the main thread has not yet
        # counted as running; `_continue_lock` orders that against an interrupt.
        self._continued: set[str] = set()
        self._continue_lock = threading.Lock()
        self.run_record: dict[str, Any] = {}
        self._guard = OutputGuard(store, plan.graph.prefix if plan is not None else None)

    # -- main thread ----------------------------------------------------------
    def lease_lost(self, output_path: str) -> None:
        """Called by the heartbeat thread: the step must not write again, so its process (on a
        backend that runs steps in processes) is stopped."""
        self._messages.put(("lost", output_path, None, None))
        try:
            self.backend.cancel(output_path)
        except Exception:  # the step then fails to confirm its lease instead
            logger.exception("could not stop %s after losing its lease", output_path)

    def run(self) -> RunSummary:
        start = time.time()
        summary = RunSummary()
        todo = skip_cached(self.plan.rows, self.emit, summary)
        blockers = {
            path: {dep for dep in row.step.blocking_deps if dep in todo} for path, row in todo.items()
        }
        dependents: dict[str, list[str]] = {path: [] for path in todo}
        for path, deps in blockers.items():
            for dep in deps:
                dependents[dep].append(path)
        ready = [path for path, deps in blockers.items() if not deps]
        self._todo, self._blockers, self._dependents = todo, blockers, dependents  # (`_following_step`)
        if todo:
            with streams_wrapped():  # one tee for the whole run, not one per step
                self._schedule(todo, ready, summary)
        return finish(summary, start, self.emit)

    def _schedule(self, todo: dict[str, PlannedStep], ready: list[str], summary: RunSummary) -> None:
        """Start steps as their blocking dependencies finish, until none is left or runnable
        (the reports are taken by `_take_report`, over `self._blockers` and `self._dependents`)."""
        running: set[str] = set()
        try:
            while ready or running:
                while len(running) < self.max_concurrent and self._room_in_queue():
                    path = self._next_startable(ready, running, todo, self.backend)
                    if path is None:
                        break
                    ready.remove(path)
                    running.add(path)
                    self._dispatch(todo[path])
                try:
                    message = self._messages.get(timeout=self._until_next_worker())
                except queue.Empty:  # a step may have waited WORKER_START_DELAY_S for a worker
                    message = None
                    self._start_worker_if_starved()
                # A lost lease first (as it came first: the step's own report follows it), then
                # every report the workers left, in the order each worker finished its steps.
                reports = [message] if message is not None and message[0] == "lost" else []
                while self._reports:
                    reports.append(self._reports.popleft())
                for kind, path, payload, continued in reports:
                    self._take_report(kind, path, payload, continued, running, ready, summary)
        except BaseException:
            with self._continue_lock:  # no worker goes on with another step after this
                self._stop.set()
                running |= self._continued
            with _second_ctrl_c_deferred():
                self._interrupt(running)
            raise
        finally:
            for _ in range(self._workers):
                self._work.put(None)  # idle workers exit; busy ones (orphaned steps) after their step

    def _take_report(
        self,
        kind: str,
        path: str,
        payload: tuple[Outcome, str] | None,
        continued: str | None,
        running: set[str],
        ready: list[str],
        summary: RunSummary,
    ) -> None:
        """Record a step's outcome ("done": its worker's; "lost": the heartbeat's) and what follows."""
        todo, blockers, dependents = self._todo, self._blockers, self._dependents
        if continued is not None:  # the worker went on with it: running from now on
            running.add(continued)  # (before the discard: an interrupt between finds it)
            with self._continue_lock:
                self._continued.discard(continued)
        if path not in running:
            return  # a late report from a step already written off (lease lost)
        running.discard(path)
        outcome, error = (Outcome.LOST, "lease lost to another driver") if kind == "lost" else payload
        summary.outcomes[path] = outcome
        if outcome.ok:
            for child in dependents[path]:
                blockers[child].discard(path)
                if not blockers[child] and child not in summary.outcomes and child != continued:
                    ready.append(child)
            return
        if kind == "lost":
            self.emit(StepFailed(todo[path].name, path, kind=outcome.value, error=error))
        log = log_path(path) if self._guard.refusal(path) is None else None  # (refused: none written)
        summary.failures.append(Failure(todo[path].name, path, outcome, error, log))
        for child in self._descendants(path, dependents):
            if child in summary.outcomes:
                continue
            summary.outcomes[child] = Outcome.DEP_FAILED
            if child in ready:
                ready.remove(child)
            self._mark_dep_failed(todo[child], failed_name=todo[path].name)

    @staticmethod
    def _next_startable(
        ready: list[str], running: set[str], todo: dict[str, PlannedStep], backend: Backend
    ) -> str | None:
        """The first ready step the backend admits beside the running ones (light steps always;
        heavy steps by the resources they ask for: see `executor.backends`)."""
        if not running:
            return ready[0] if ready else None
        others = [todo[path].step for path in running]
        for path in ready:
            if backend.admit(todo[path].step, others):
                return path
        return None

    @staticmethod
    def _descendants(path: str, dependents: dict[str, list[str]]) -> list[str]:
        seen: list[str] = []
        stack = list(dependents[path])
        while stack:
            child = stack.pop()
            if child not in seen:
                seen.append(child)
                stack.extend(dependents[child])
        return seen

    def _mark_dep_failed(self, row: PlannedStep, failed_name: str) -> None:
        message = f"dependency {failed_name} failed"
        self.emit(StepFailed(row.name, row.output_path, kind=Outcome.DEP_FAILED.value, error=message))
        if row.action == Action.WAIT:
            return  # another driver owns it
        if self._guard.refusal(row.output_path) is not None:
            return  # (the line would be written through a link out of the prefix)
        if self.leases.try_acquire(row.output_path).acquired:
            try:
                append_status(self.store, row.output_path, Status.DEP_FAILED, message, self.leases.worker_id)
            finally:
                self.leases.release(row.output_path)

    def _interrupt(self, running: set[str]) -> None:
        for path in running:
            try:
                self.backend.cancel(path)
            except Exception:
                logger.exception("could not stop %s", path)
        # What light steps wait on in other processes (shard workers, Ray tasks) ends before
        # any lease is released: it would go on writing into outputs another driver may take.
        stop_running_work()
        for path in running:
            with self._step_locks.setdefault(path, threading.Lock()):  # (set by `_dispatch`)
                if self.leases.holds(path) or self._reclaim_unfinished(path):
                    self._record_interrupted(path)

    def _record_interrupted(self, path: str) -> None:
        try:
            append_status(self.store, path, Status.FAILED, "interrupted", self.leases.worker_id)
        finally:
            self.leases.release(path)

    def _mark_running(self, path: str, message: str | None) -> bool:
        """Append RUNNING to `path`'s status, unless the run was stopped: then (False) the
        step is recorded as `_interrupt` records it, if its lease is still ours, and not run."""
        with self._step_locks[path]:
            if not self._stop.is_set():
                append_status(self.store, path, Status.RUNNING, message, self.leases.worker_id)
                return True
            if self.leases.holds(path):  # taken after the main thread recorded the stopped steps
                self._record_interrupted(path)
            return False

    def _reclaim_unfinished(self, path: str) -> bool:
        """Take the lease back from a heavy step's killed process, unless it finished first."""
        try:
            last = read_last_status(self.store, path)
        except (OSError, ValueError):
            return False
        if last is not None and last.status in (Status.SUCCESS, Status.FAILED):
            return False
        return self.leases.reclaim(path)

    def _dispatch(self, row: PlannedStep) -> None:
        """Queue `row` for the worker threads; start the first worker if there is none.

        More workers start only when a step is queued and no worker has taken one for
        WORKER_START_DELAY_S (`_start_worker_if_starved`), up to one per running step: steps
        that finish in a fraction of a millisecond (bookkeeping-bound) keep one thread busy
        instead of 32 threads handing the GIL to each other (twice the time of a cold fan-in run of
        1,000 trivial steps), while steps that wait on I/O or on a process get a thread each
        within milliseconds.
        """
        self._step_locks[row.output_path] = threading.Lock()
        with self._pool_lock:
            self._queued.append(time.monotonic())
            start = self._workers == 0
            if start:
                self._workers += 1
        self._work.put(row)
        if start:
            self._start_worker()

    def _room_in_queue(self) -> bool:
        """Whether to queue another step: one per idle worker, plus QUEUE_AHEAD so that a
        worker finishing a step finds the next without waiting for the main thread."""
        with self._pool_lock:
            return len(self._queued) < self._idle + QUEUE_AHEAD

    def _until_next_worker(self) -> float | None:
        """How long the main thread may wait for a report before it must check whether the
        oldest queued step still waits for a worker, or run a signal's handler."""
        with self._pool_lock:
            due = self._worker_due_in()
        return SIGNAL_CHECK_INTERVAL_S if due is None else min(due, SIGNAL_CHECK_INTERVAL_S)

    def _start_worker_if_starved(self) -> None:
        with self._pool_lock:
            starved = self._worker_due_in() == 0.0
            if starved:
                self._workers += 1
        if starved:
            self._start_worker()

    def _worker_due_in(self) -> float | None:
        """Seconds until a queued step has waited WORKER_START_DELAY_S while no worker took
        any step (0.0: it has); None if no step is queued or no more workers may start. Call
        under `_pool_lock`.

        Waiting counts from the later of when the oldest queued step was queued and when a
        worker last took one: steps queued behind quick steps are being reached, and get no
        thread of their own (a second thread only passed the GIL back and forth); steps queued
        behind a step that blocks get one within WORKER_START_DELAY_S."""
        if not self._queued or self._workers >= self.max_concurrent:
            return None
        waiting_since = max(self._queued[0], self._last_take)
        return max(0.0, waiting_since + WORKER_START_DELAY_S - time.monotonic())

    def _start_worker(self) -> None:
        threading.Thread(target=self._worker_loop, daemon=True).start()

    # -- worker threads -------------------------------------------------------
    def _worker_loop(self) -> None:
        row = self._take()
        while row is not None:
            threading.current_thread().name = f"step:{row.name}"
            following = None
            try:
                result = self._worker(row)
                following = self._following_step(row, result)
            except BaseException as error:  # (an exception whose str() raises): report all the same
                result = (Outcome.FAILED, f"executor error: {type(error).__name__}")
            # Whatever happened, a report goes back: the main thread waits for it.
            threading.current_thread().name = "step:(idle)"
            self._report(row, result, following)
            row = following or self._take()

    def _report(self, row: PlannedStep, result: tuple[Outcome, str], following: PlannedStep | None) -> None:
        """Leave the step's outcome for the main thread, and wake it only if it has something
        to do now: a failure to record, steps to queue because this worker is running out
        (`QUEUE_LOW`), or a dependent that this outcome may make ready. Otherwise the main
        thread reads the report at its next wake, within SIGNAL_CHECK_INTERVAL_S: waking it
        for every quick step cost a thread hand-off each, with the GIL passed back and forth
        (about a third of a cold run of 1,000 trivial steps)."""
        path = row.output_path
        self._reports.append(("done", path, result, following and following.output_path))
        wake = not result[0].ok
        if not wake and following is None:
            with self._pool_lock:
                wake = len(self._queued) <= QUEUE_LOW
        if not wake:
            # (`blockers` is the main thread's and only shrinks: a dependent with one blocker
            # left may be waiting for this step alone.)
            wake = any(
                len(self._blockers[child]) <= 1
                for child in self._dependents[path]
                if following is None or child != following.output_path
            )
        if wake:
            self._messages.put(_WAKE)

    def _following_step(self, row: PlannedStep, result: tuple[Outcome, str]) -> PlannedStep | None:
        """The step this worker goes on with after `row`, without a round trip through the
        main thread (two thread hand-offs a step of a chain): a light dependent of `row`
        waiting for nothing else. None: the main thread schedules what comes next.

        A step taken here is added to `_continued` under `_continue_lock`, and none is taken
        once the run is stopped, so that an interrupt always finds it (`_schedule`).
        Heavy steps go through the main thread, which admits them by the resources they ask
        for. `dependents` is fixed for the run; `blockers` is the main thread's, read here (a
        dependent whose only blocker is `row` changes only when `row` reports).
        """
        if not result[0].ok or self.leases.was_lost(row.output_path):
            return None  # (a lost lease is reported by the heartbeat too: the main thread decides)
        for path in self._dependents[row.output_path]:
            child = self._todo[path]
            # (Such a dependent has no outcome yet: only a failed blocking ancestor gives it
            # one, and every blocking ancestor of it but `row` has succeeded.)
            if self._blockers[path] == {row.output_path} and not is_heavy(child.step):
                with self._continue_lock:
                    if self._stop.is_set():
                        return None
                    self._step_locks[path] = threading.Lock()
                    self._continued.add(path)
                return child
        return None

    def _take(self) -> PlannedStep | None:
        """The next queued step (None: the run is over)."""
        with self._pool_lock:
            self._idle += 1
        row = self._work.get()
        with self._pool_lock:
            self._idle -= 1
            if row is not None:
                self._queued.popleft()  # FIFO: the time this row was queued
                self._last_take = time.monotonic()
        return row

    def _worker(self, row: PlannedStep) -> tuple[Outcome, str]:
        """The step's outcome, whatever goes wrong: a worker that raised instead would never
        report, and the main thread would wait for it forever with the step left RUNNING."""
        try:
            return self._acquire_and_run(row)
        except BaseException as error:  # a bug or a storage error outside the step function
            result = (Outcome.FAILED, f"executor error: {type(error).__name__}: {error}")
            # Even if logging the error fails (a closed stderr), the report still goes back.
            with contextlib.suppress(BaseException):
                self._report_executor_error(row, error, result[1])
            return result

    def _report_executor_error(self, row: PlannedStep, error: BaseException, message: str) -> None:
        # One line on the console (the run ends with an `error:` line naming the step); the
        # traceback is the executor's, not the step's, so it goes to DEBUG.
        logger.error("executor error while running %s: %s: %s", row.name, type(error).__name__, error)
        logger.debug("traceback of the executor error in %s", row.name, exc_info=True)
        try:
            self.leases.release(row.output_path)
        except Exception as release_error:  # storage still failing: the lease times out by itself
            logger.error("could not release the lease on %s: %s", row.output_path, release_error)
        self.emit(StepFailed(row.name, row.output_path, kind="error", error=message))

    def _acquire_and_run(self, row: PlannedStep) -> tuple[Outcome, str]:
        path = row.output_path
        if row.action == Action.ERROR:  # planned as an error (its status file cannot be read): never run
            self.emit(StepFailed(row.name, path, kind="error", error=row.reason))
            return Outcome.FAILED, row.reason
        refusal = self._guard.refusal(path, absent=row.absent)
        if refusal is not None:  # nothing written: not even a FAILED line, which would go through the link
            self.emit(StepFailed(row.name, path, kind="error", error=refusal))
            return Outcome.FAILED, refusal
        announced: str | None = None
        follower: _LogFollower | None = None
        # The plan read the status of a step it runs: try the lease first, and read the
        # status again once the lease is ours (or when someone else holds it).
        check_first = row.action == Action.WAIT
        while not self._stop.is_set():
            if check_first:
                last = read_last_status(self.store, path)
                status = last.status if last is not None else None
                if status == Status.SUCCESS:
                    reason = "finished by another driver" if announced else "already succeeded"
                    self.emit(StepSkipped(row.name, path, reason=reason))
                    return Outcome.SKIPPED, reason
                if announced and status == Status.FAILED:
                    error = f"failed in another driver ({announced}): {last.message}"
                    self.emit(
                        StepFailed(
                            row.name, path, kind="failed_elsewhere", error=error, log_path=log_path(path)
                        )
                    )
                    return Outcome.FAILED_ELSEWHERE, error
            # A step the plan found with neither status nor lease (a cold run) most likely
            # still has none: create the lease without reading it first.
            expect_absent = not check_first and row.status is None and row.lease is None
            check_first = True
            attempt = self.leases.try_acquire(path, expect_absent=expect_absent)
            if attempt.acquired:
                last = read_last_status(self.store, path)
                if last is not None and last.status == Status.SUCCESS:
                    self.leases.release(path)
                    self.emit(StepSkipped(row.name, path, reason="finished by another driver"))
                    return Outcome.SKIPPED, "finished by another driver"
                # An earlier attempt ran here (FAILED, or RUNNING and died), or the directory was
                # there before this step's first attempt (a tree shared with others: links to
                # plant, temporary files to leave in an output marked SUCCESS).
                if last is not None or (not row.absent and self._found_files(path)):
                    self._remove_leftovers(row)
                return self._run_holding_lease(row)
            holder = attempt.holder
            if holder is not None and holder.worker != announced:
                announced = holder.worker
                self.emit(StepWaiting(row.name, path, holder=holder.worker, heartbeat=holder.heartbeat))
                if follower is None and self.follow_logs:
                    follower = _LogFollower(self.store, row.name, log_path(path))
            if follower is not None:
                follower.poll()  # show what the step running elsewhere writes to its log
            self._stop.wait(self.leases.config.poll_interval)
        return Outcome.INTERRUPTED, "interrupted"

    def _found_files(self, output_path: str) -> bool:
        """Whether the local output holds anything but the lease just taken (one directory read;
        a new step's directory holds nothing else). Object stores have no links to plant."""
        local = self.store.local_path(output_path)
        if local is None:
            return False
        try:
            with os.scandir(local) as listing:
                return any(entry.name != LEASE_FILE for entry in listing)
        except OSError:
            return False

    def _remove_leftovers(self, row: PlannedStep) -> None:
        """Remove the temporary files an earlier attempt's unfinished atomic writes left in the
        output, so that an output marked SUCCESS never holds one (`remove_leftover_temp_files`),
        and the symbolic links in it that lead out of it (`remove_links_leading_out`)."""
        removed = remove_leftover_temp_files(self.store, row.output_path)
        if removed:
            logger.info("step %s: removed %d temporary file(s) an earlier attempt left", row.name, removed)
        links = remove_links_leading_out(self.store, row.output_path)
        if links:
            logger.warning(
                "step %s: removed %d symbolic link(s) leading out of its output, which this attempt "
                "would have written through: %s",
                row.name,
                len(links),
                ", ".join(one_line(link) for link in links[:5]) + (" ..." if len(links) > 5 else ""),
            )

    def _run_holding_lease(self, row: PlannedStep) -> tuple[Outcome, str]:
        step, path = row.step, row.output_path
        start = time.time()
        error: BaseException | None = None
        dispatch = None
        try:
            dispatch = self.backend.prepare(step)
        except (UnsatisfiableError, StepFunctionError) as refused:
            error = refused
        write_info(self.store, step_info_record(step, self.plan.graph, self.run_record, dispatch))
        if error is None and step.mirrors:
            error = self._ensure_mirrors(row)
        if error is None and dispatch.get("hosted"):
            return self._run_hosted(row, dispatch)
        if not self._mark_running(path, None):
            return Outcome.INTERRUPTED, "interrupted"
        with capture_step_log(self.store, path) as log:
            self.emit(StepStarted(row.name, path, log_path=log))
            if error is not None:
                print(f"not started: {error}")
            else:
                try:
                    self.backend.call(step, dispatch)
                except StepFunctionError as caught:  # its traceback is in the log already
                    error = caught
                    print(f"step failed: {caught}")
                except BaseException as caught:  # SystemExit from a step is a failure, not an exit
                    error = caught
                    traceback.print_exc()
        duration = time.time() - start
        with self._step_locks[path]:  # not between `_interrupt`'s check of the lease and its write
            outcome, message = self._record_result(row, error, duration)
        self._emit_result(row, outcome, message, duration, log)
        return outcome, message

    def _emit_result(
        self, row: PlannedStep, outcome: Outcome, message: str, duration: float, log: str
    ) -> None:
        if outcome == Outcome.SUCCEEDED:
            self.emit(StepSucceeded(row.name, row.output_path, duration=duration))
        elif outcome != Outcome.INTERRUPTED:  # the run is over: nothing left to tell
            kind = Outcome.LOST.value if outcome == Outcome.LOST else "error"
            self.emit(StepFailed(row.name, row.output_path, kind=kind, error=message, log_path=log))

    def _record_result(
        self, row: PlannedStep, error: BaseException | None, duration: float
    ) -> tuple[Outcome, str]:
        """Write the final status of a step run in this driver, if its lease is still ours."""
        step, path, worker = row.step, row.output_path, self.leases.worker_id
        if self._stop.is_set():
            # The run was interrupted: `_interrupt` records the step (and releases its lease)
            # once it has stopped the work the step waits on. A step that failed *because* of
            # that stopping (its shard workers killed) must not record its own failure and
            # release the lease while other workers of it are still being stopped.
            return Outcome.INTERRUPTED, "interrupted"
        if self.leases.was_lost(path) or not self.leases.confirm(path):
            return Outcome.LOST, "lease lost to another driver while the step ran; not marking it successful"
        if error is not None:
            message = (
                str(error)
                if isinstance(error, (StepFunctionError, UnsatisfiableError, MirrorError))  # already worded
                else f"{type(error).__name__}: {error}"
            )
            try:
                append_status(self.store, path, Status.FAILED, message, worker, duration_s=round(duration, 3))
            finally:
                self.leases.release(path)
            return Outcome.FAILED, message
        try:
            append_status(
                self.store,
                path,
                Status.SUCCESS,
                None,
                worker,
                duration_s=round(duration, 3),
                version_hash=step.version_hash,
                config_digest=step.config_digest,
            )
        finally:
            self.leases.release(path)
        return Outcome.SUCCEEDED, ""

    def _ensure_mirrors(self, row: PlannedStep) -> MirrorError | None:
        """Copy the step's `mirrored()` paths under the prefix where missing (`executor.mirror`),
        in the driver and before the step starts wherever it runs; the refusal, if any."""
        from executor.mirror import ensure_mirrored, mirror_sources

        sources = mirror_sources()
        for mirror in row.step.mirrors:
            try:
                ensure_mirrored(
                    row.name, mirror, sources, log=lambda line: print(f"{row.name}: {line}", flush=True)
                )
            except MirrorError as refused:
                return refused
            except OSError as failed:  # storage errors while listing or copying
                return MirrorError(
                    f"step {row.name!r}, field {mirror.field!r}: copying mirrored path "
                    f"{mirror.relative_path!r} failed: {type(failed).__name__}: {failed}"
                )
        return None

    def _run_hosted(self, row: PlannedStep, dispatch: dict[str, Any]) -> tuple[Outcome, str]:
        """A heavy step in its own process, which takes the lease over and records the result
        itself (`executor.backends.host`), so it finishes even if this driver dies. A process
        or node lost without a result is re-submitted up to `max_retries` times."""
        from executor.backends.host import HostedStep

        step, path, worker = row.step, row.output_path, self.leases.worker_id
        start = time.time()
        attempt = 1
        while True:
            message = None if attempt == 1 else f"attempt {attempt} of {self.max_retries + 1}"
            if attempt > 1:  # the lost attempt may have been killed in the middle of a write
                self._remove_leftovers(row)
            if not self._mark_running(path, message):
                return Outcome.INTERRUPTED, "interrupted"
            handed = self.leases.hand_over(path)
            if handed is None:
                error = "lease lost to another driver before the step started"
                self.emit(
                    StepFailed(row.name, path, kind=Outcome.LOST.value, error=error, log_path=log_path(path))
                )
                return Outcome.LOST, error
            spec = HostedStep(
                name=row.name,
                prefix=self.plan.graph.prefix,
                output_path=path,
                lease_bytes=handed,
                driver_worker=worker,
                heartbeat_interval=self.leases.config.heartbeat_interval,
                version_hash=step.version_hash,
                config_digest=step.config_digest,
            )
            with capture_step_log(self.store, path) as log:
                if attempt == 1:
                    self.emit(StepStarted(row.name, path, log_path=log))
                try:
                    result = self.backend.call_hosted(step, dispatch, spec)
                except StepCancelled as stopped:
                    result = {"outcome": "cancelled", "error": str(stopped)}
                except StepFunctionError as lost:
                    result = {"outcome": "process_lost", "error": str(lost)}
                    print(f"attempt {attempt}: {lost}")
            outcome, error = result["outcome"], result.get("error") or ""
            if outcome == "succeeded":
                self.emit(StepSucceeded(row.name, path, duration=time.time() - start))
                return Outcome.SUCCEEDED, ""
            if outcome == "failed":
                self.emit(StepFailed(row.name, path, kind="error", error=error, log_path=log))
                return Outcome.FAILED, error
            if outcome in ("lost", "not_started"):
                self.emit(StepFailed(row.name, path, kind=Outcome.LOST.value, error=error, log_path=log))
                return Outcome.LOST, error
            with self._step_locks[path]:  # not between `_interrupt`'s check of the lease and its write
                verdict = self._after_lost_process(row, outcome, error, attempt)
            if verdict is not None:
                self._emit_result(row, *verdict, time.time() - start, log)
                return verdict
            logger.warning("step %s: %s; submitting it again (attempt %d)", row.name, error, attempt + 1)
            attempt += 1

    def _after_lost_process(
        self, row: PlannedStep, outcome: str, error: str, attempt: int
    ) -> tuple[Outcome, str] | None:
        """A heavy step's process ended without a result (`outcome`: cancelled, or lost): what
        it recorded itself, or FAILED written here, or None to submit it again."""
        path = row.output_path
        if self._stop.is_set():  # interrupted: the main thread records it (`_interrupt`)
            return Outcome.INTERRUPTED, "interrupted"
        last = read_last_status(self.store, path)  # the process may still have recorded one
        if last is not None and last.status == Status.SUCCESS:
            return Outcome.SUCCEEDED, ""
        if not self.leases.reclaim(path):
            return Outcome.LOST, f"{error}; and another driver holds the lease now"
        if outcome == "cancelled" or attempt > self.max_retries:
            why = error if outcome == "cancelled" else f"{error} (after {attempt} attempts)"
            try:
                append_status(self.store, path, Status.FAILED, why, self.leases.worker_id)
            finally:
                self.leases.release(path)
            return Outcome.FAILED, why
        return None


_WAKE = ("wake", None, None, None)
"""Put on `Runner._messages` by a worker whose report the main thread should read now."""


def _never_raising(emit: Callable[[Any], None]) -> Callable[[Any], None]:
    """`emit`, with a listener's error logged instead of raised.

    Events are emitted from worker threads in the middle of a step's bookkeeping: a listener
    that raises there (the console on a closed pipe, a user's callback) must not fail the
    step after its status is written, nor stop the worker before it reports back.
    """

    def guarded(event: Any) -> None:
        try:
            emit(event)
        except Exception:
            logger.exception("an event listener failed on %r", event)

    return guarded


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class _LogFollower:
    """Echoes what a step running elsewhere appends to its log, to this driver's console.

    Started when the driver begins to wait for the step: it shows the last lines written so
    far, then each whole line as it is appended. Lines are prefixed with the step name.
    """

    TAIL_LINES = 10

    def _lines(self, lines: list[str]) -> str:
        # The log was written by another process (read from the tree): shown as text, with
        # control characters (terminal escape sequences) replaced, never interpreted.
        return "".join(f"  {self.name} | {_CONTROL.sub('?', line)}\n" for line in lines)

    def __init__(self, store: Store, name: str, path: str):
        self.store, self.name, self.path = store, name, path
        self.offset: int | None = None

    def poll(self) -> None:
        from executor.logs import console_write

        try:
            data = self.store.read_bytes(self.path) or b""
        except OSError:
            return
        if self.offset is None or len(data) < self.offset:  # first look, or the log was replaced
            self.offset = data.rfind(b"\n") + 1
            tail = data[: self.offset].decode("utf-8", errors="replace").splitlines()[-self.TAIL_LINES :]
            if tail:
                console_write(f"  {self.name} | ... (the end of {self.path} so far)\n")
                console_write(self._lines(tail))
            return
        new = data[self.offset :]
        if not new:
            return
        cut = new.rfind(b"\n") + 1  # whole lines only; the rest next time
        if not cut:
            return
        self.offset += cut
        console_write(self._lines(new[:cut].decode("utf-8", errors="replace").splitlines()))
