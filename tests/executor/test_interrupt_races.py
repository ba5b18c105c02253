"""Ctrl-C (or SIGTERM) while a worker thread is still in a step's bookkeeping, before the step
is marked RUNNING: the step must end FAILED "interrupted" with no lease, and its function must
not start. Deterministic: the worker is held at the point of the race until the main thread
has recorded the stopped steps (a fresh-clone CI run once caught the RUNNING line written
after the FAILED one, when the worker was slower than the interrupt). Also: a worker going
on with the next step of a chain itself, and an interrupt that comes before the main thread
has heard of that step."""

import os
import signal
import threading
import time

import pytest

from executor import Executor, ExecutorStep, this_output_path, versioned
from executor.backends import Backend
from executor.graph import resolve
from executor.lease import LeaseManager
from executor.tree import Status, lease_path, read_status
from tests.executor.steps_for_tests import WriteConfig


def run_until_interrupted(run, steps, interrupter=None, release=None, on_stopped=None) -> None:
    """Run `steps` with Python's own Ctrl-C handler (whatever the test runner installed) and
    expect the run to raise KeyboardInterrupt. `interrupter` runs in a thread of its own,
    started just before; `on_stopped` is called once the run has raised, before `release` is
    set. Then every thread started meanwhile (the interrupter, the run's workers) is joined."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    before = set(threading.enumerate())
    if interrupter is not None:
        threading.Thread(target=interrupter).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run.run(steps)
        if on_stopped is not None:
            on_stopped()
    finally:
        if release is not None:
            release.set()
        signal.signal(signal.SIGINT, previous)
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=30)
        assert not thread.is_alive(), thread.name


def one_step(name: str, fn) -> list[ExecutorStep]:
    return [
        ExecutorStep(name=name, fn=fn, config=WriteConfig(output_path=this_output_path(), value=versioned(1)))
    ]


def interrupted_run(tmp_path, hold_in_worker, backend: Backend | None = None, step_waits_for=None):
    """Run one step whose worker waits in `hold_in_worker(arrived, release)`; SIGINT the run
    once the worker has arrived there, release it once the run has raised, and wait for the
    worker to finish. The step function waits for `step_waits_for` (an Event), if given.
    Returns (the step's status history, whether its function ran, the executor, its path)."""
    arrived, release, ran = threading.Event(), threading.Event(), threading.Event()

    def step_fn(config: WriteConfig) -> None:
        ran.set()
        if step_waits_for is not None:
            step_waits_for.wait(timeout=30)

    def interrupt_when_arrived() -> None:
        if arrived.wait(timeout=30):
            os.kill(os.getpid(), signal.SIGINT)

    hold_in_worker(arrived, release)
    run = Executor(str(tmp_path), console=False, backend=backend)
    run_until_interrupted(run, one_step("held", step_fn), interrupt_when_arrived, release)
    path = run.output_paths[run.steps[0]]
    return [(entry.status, entry.message) for entry in read_status(run.store, path)], ran.is_set(), run, path


class HeldInPrepare(Backend):
    """A backend whose `prepare` (called by the worker holding the step's lease, before the
    step is marked RUNNING) waits to be released."""

    def __init__(self):
        self.arrived = self.release = None

    def hold(self, arrived: threading.Event, release: threading.Event) -> None:
        self.arrived, self.release = arrived, release

    def prepare(self, step):
        self.arrived.set()
        assert self.release.wait(timeout=30)
        return super().prepare(step)


def test_a_step_stopped_between_its_lease_and_running_is_failed_and_never_started(tmp_path):
    backend = HeldInPrepare()
    history, ran, run, path = interrupted_run(tmp_path, backend.hold, backend=backend)
    # The main thread recorded the step it found holding a lease; the worker, released
    # afterwards, neither wrote RUNNING after that nor called the step function.
    assert history == [(Status.FAILED, "interrupted")]
    assert not ran
    assert run.store.read_bytes(lease_path(path)) is None


def test_a_lease_taken_after_the_interrupt_was_recorded_is_failed_and_released(tmp_path, monkeypatch):
    # The worker is held just before it creates the step's lease, so the main thread finds
    # no lease of ours: it takes the lease, records "interrupted" and releases it. The worker
    # then takes the lease itself; it must record the step as stopped and release the lease,
    # not leave it behind (which made the next run wait out the lease) nor run the step.
    original = LeaseManager.try_acquire
    gates: list[tuple[threading.Event, threading.Event]] = []

    def held_try_acquire(self, output_path, expect_absent=False):
        if threading.current_thread().name.startswith("step:") and gates:
            arrived, release = gates.pop()
            arrived.set()
            assert release.wait(timeout=30)
        return original(self, output_path, expect_absent=expect_absent)

    monkeypatch.setattr(LeaseManager, "try_acquire", held_try_acquire)
    history, ran, run, path = interrupted_run(
        tmp_path, lambda arrived, release: gates.append((arrived, release))
    )
    assert not ran
    assert [status for status, _ in history] == [Status.FAILED] * len(history)
    assert {message for _, message in history} == {"interrupted"}
    assert run.store.read_bytes(lease_path(path)) is None


def hold_status_write(monkeypatch, status: Status):
    """Make the worker's write of `status` wait (at most 1 s) until the step's next status
    line is written by anyone; returns (the `hold_in_worker` for `interrupted_run`, an Event
    set once a line after the held one was written)."""
    import executor.runner as runner_module

    original = runner_module.append_status
    gates: list[tuple[threading.Event, threading.Event]] = []
    written_after = threading.Event()
    held = []

    def held_append_status(store, path, written, *args, **kwargs):
        if written == status and gates:
            arrived, release = gates.pop()
            held.append(release)
            arrived.set()
            release.wait(timeout=1)  # had the main thread waited for this write: 1 s late, in order
            return original(store, path, written, *args, **kwargs)
        original(store, path, written, *args, **kwargs)
        if held:
            written_after.set()
            for release in held:
                release.set()

    monkeypatch.setattr(runner_module, "append_status", held_append_status)
    return (lambda arrived, release: gates.append((arrived, release))), written_after


def test_a_running_line_being_written_when_the_run_stops_comes_before_the_interrupted_one(
    tmp_path, monkeypatch
):
    # The worker is inside its RUNNING write when the run is stopped. The main thread must
    # wait for that write before it records the step as stopped: its FAILED line would wake
    # the worker, and RUNNING would come last. The step function, then started, waits for
    # the FAILED line, so that the step cannot finish first.
    hold, written_after = hold_status_write(monkeypatch, Status.RUNNING)
    history, _, run, path = interrupted_run(tmp_path, hold, step_waits_for=written_after)
    assert history == [(Status.RUNNING, None), (Status.FAILED, "interrupted")]
    assert run.store.read_bytes(lease_path(path)) is None


def test_a_step_finishing_as_the_run_stops_stays_successful(tmp_path, monkeypatch):
    # The worker is inside its SUCCESS write when the run is stopped: the main thread must
    # not record the finished step as interrupted (it would be run again for nothing).
    hold, _ = hold_status_write(monkeypatch, Status.SUCCESS)
    history, ran, run, path = interrupted_run(tmp_path, hold)
    assert ran
    assert history == [(Status.RUNNING, None), (Status.SUCCESS, None)]
    assert run.store.read_bytes(lease_path(path)) is None


class ProcessEndsWithoutResult(Backend):
    """Runs every step "hosted" (as a heavy step's process would be), and the process ends
    without a result, as one cancelled or killed does."""

    def prepare(self, step):
        return {"hosted": True}

    def call_hosted(self, step, dispatch, spec):
        return {"outcome": "cancelled", "error": "the step's process was cancelled"}


def test_a_heavy_step_recorded_failed_as_the_run_stops_is_not_recorded_again(tmp_path, monkeypatch):
    # The worker, having taken the lease back from the step's ended process, is inside its
    # FAILED write when the run is stopped: the main thread must wait for that write (and
    # then find the step finished) rather than add "interrupted" under it.
    hold, _ = hold_status_write(monkeypatch, Status.FAILED)
    history, _, run, path = interrupted_run(tmp_path, hold, backend=ProcessEndsWithoutResult())
    assert history == [(Status.RUNNING, None), (Status.FAILED, "the step's process was cancelled")]
    assert run.store.read_bytes(lease_path(path)) is None


def test_a_signal_delivered_to_a_worker_thread_still_stops_the_run(tmp_path):
    # The kernel may hand a process's SIGINT (or SIGTERM) to any of its threads; Python then
    # runs the handler in the main thread only once that thread wakes. The signal is sent to
    # the step's own thread here: the run must stop while the step still runs, not when it
    # finishes.
    started, release, returned = threading.Event(), threading.Event(), threading.Event()
    worker: list[int] = []

    def blocks(config: WriteConfig) -> None:
        worker.append(threading.get_ident())
        started.set()
        release.wait(timeout=30)
        returned.set()

    def interrupt_the_step_thread() -> None:
        if started.wait(timeout=30):
            signal.pthread_kill(worker[0], signal.SIGINT)

    def stopped_while_the_step_ran() -> None:
        assert not returned.is_set()

    run = Executor(str(tmp_path), console=False)
    run_until_interrupted(
        run, one_step("blocks", blocks), interrupt_the_step_thread, release, stopped_while_the_step_ran
    )
    path = run.output_paths[run.steps[0]]
    history = [(entry.status, entry.message) for entry in read_status(run.store, path)]
    assert history == [(Status.RUNNING, None), (Status.FAILED, "interrupted")]


def chain(names: list[str], fn) -> list[ExecutorStep]:
    steps: list[ExecutorStep] = []
    for name in names:
        inputs = [steps[-1].as_input_name()] if steps else []
        steps.append(
            ExecutorStep(
                name=name,
                fn=fn,
                config=WriteConfig(output_path=this_output_path(), value=versioned(name), inputs=inputs),
            )
        )
    return steps


@pytest.fixture
def dispatched(monkeypatch) -> list[str]:
    """The names of the steps the main thread queues for the workers (`Runner._dispatch`)."""
    from executor.runner import Runner

    names: list[str] = []
    original = Runner._dispatch

    def counted(self, row):
        names.append(row.name)
        original(self, row)

    monkeypatch.setattr(Runner, "_dispatch", counted)
    return names


def test_a_worker_goes_on_with_the_next_step_of_a_chain_itself(tmp_path, dispatched):
    # Each step of a chain used to go back to the main thread to be scheduled (two thread
    # hand-offs a step); the worker that finished it now starts its dependent itself.
    order = []

    def records(config: WriteConfig) -> None:
        order.append(config.value)
        for path in config.inputs:  # the step before finished (SUCCESS) before this one started
            assert read_status(run.store, path)[-1].status == Status.SUCCESS

    run = Executor(str(tmp_path), console=False)
    run.run(chain(["c/0", "c/1", "c/2", "c/3"], records))
    assert order == ["c/0", "c/1", "c/2", "c/3"]
    assert dispatched == ["c/0"]
    for step in run.steps:
        assert [e.status for e in read_status(run.store, run.output_paths[step])] == [
            Status.RUNNING,
            Status.SUCCESS,
        ]


def test_a_step_a_worker_went_on_with_is_recorded_when_the_run_stops_first(tmp_path, monkeypatch):
    # The run is stopped after the worker took the chain's next step but before the main
    # thread heard of it: the interrupt must still record that step (it used to count only
    # the steps it had dispatched itself).
    from executor.runner import Runner

    original = Runner._following_step
    main = threading.main_thread().ident

    def stop_the_run_first(self, row, result):
        following = original(self, row, result)
        if following is not None:
            signal.pthread_kill(main, signal.SIGINT)
            assert self._stop.wait(timeout=30)  # the main thread has begun to stop the run
        return following

    monkeypatch.setattr(Runner, "_following_step", stop_the_run_first)
    ran = []

    def records(config: WriteConfig) -> None:
        ran.append(config.value)

    run = Executor(str(tmp_path), console=False)
    run_until_interrupted(run, chain(["c/0", "c/1"], records))
    first, second = (run.output_paths[step] for step in run.steps)
    assert ran == ["c/0"]
    assert read_status(run.store, first)[-1].status == Status.SUCCESS
    assert [(e.status, e.message) for e in read_status(run.store, second)] == [(Status.FAILED, "interrupted")]
    assert run.store.read_bytes(lease_path(second)) is None


def test_a_heavy_step_after_a_light_one_is_still_admitted_by_the_main_thread(tmp_path, dispatched):
    # A heavy step asks for resources, which the main thread counts (backend.admit): the
    # worker that finished its light dependency does not start it itself.
    from executor import ResourceConfig
    from tests.executor.steps_for_tests import write_value

    light = ExecutorStep(
        name="light", fn=write_value, config=WriteConfig(output_path=this_output_path(), value=versioned(1))
    )
    heavy = ExecutorStep(
        name="heavy",
        fn=write_value,
        config=WriteConfig(
            output_path=this_output_path(), value=versioned(2), inputs=[light.as_input_name()]
        ),
        resources=ResourceConfig.with_cpu(cpu=1),
    )
    run = Executor(str(tmp_path), console=False)
    run.run([light, heavy])
    assert dispatched == ["light", "heavy"]
    assert read_status(run.store, run.output_paths[heavy])[-1].status == Status.SUCCESS


def test_a_step_failing_because_its_work_was_stopped_leaves_the_record_and_lease_to_the_interrupt(tmp_path):
    """The interrupt stops what a light step waits on (`stop_on_interrupt`: its shard workers)
    before it records the step and releases the lease. The step's function saw its first
    worker die and failed at once; its thread recorded that failure (`ShardError: ...`) and
    released the lease while the stopper was still ending the other workers -- which another
    driver could then find writing into the output it had just taken."""
    from executor.interrupts import stop_on_interrupt

    stopping, step_failed, seen = threading.Event(), threading.Event(), {}

    def step_fn(config: WriteConfig) -> None:
        def stop_workers() -> None:  # (called from the main thread, by the interrupt)
            stopping.set()
            step_failed.wait(timeout=30)  # the step's thread is failing now...
            time.sleep(0.3)  # ...and has had ample time to record it and drop the lease
            seen["lease while stopping"] = os.path.exists(lease_file[0])

        with stop_on_interrupt(stop_workers):
            os.kill(os.getpid(), signal.SIGINT)
            assert stopping.wait(timeout=30)
        step_failed.set()
        raise RuntimeError("a shard worker died")  # what the step sees of its stopped workers

    run = Executor(str(tmp_path), console=False)
    steps = one_step("sharded", step_fn)
    lease_file = [lease_path(resolve(steps, str(tmp_path)).resolved(steps[0]).output_path)]
    run_until_interrupted(run, steps)
    path = run.output_paths[run.steps[0]]
    assert seen == {"lease while stopping": True}
    assert [(e.status, e.message) for e in read_status(run.store, path)] == [
        (Status.RUNNING, None),
        (Status.FAILED, "interrupted"),
    ]
    assert run.store.read_bytes(lease_path(path)) is None
