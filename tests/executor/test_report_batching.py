"""Workers' reports: left for the main thread, which is woken only when it has work to do.

A worker used to wake the main thread for every step it finished: for quick steps, a thread
hand-off each, with the GIL passed back and forth. Now a report wakes the main thread only
for a failure, when the worker runs short of queued steps, or when the outcome may make a
dependent ready; otherwise the main thread reads it at its next wake. These tests make that
next wake far away (`SIGNAL_CHECK_INTERVAL_S` = 30 s), so only the wake rules can move the
run along: without them, each test waits on a step that is never started (or marked).
"""

from __future__ import annotations

import threading

import executor.runner as runner_module
from executor import Executor, ExecutorStep, LeaseConfig, output_path_of, this_output_path, versioned
from executor.events import StepFailed, StepStarted, StepSucceeded
from executor.runner import ExecutorRunError
from tests.executor.steps_for_tests import WriteConfig

QUIET = LeaseConfig(heartbeat_interval=5.0, timeout=60.0, poll_interval=0.02, heartbeat_process=False)


def step(name, fn, value=0, inputs=()):
    return ExecutorStep(
        name=name,
        fn=fn,
        config=WriteConfig(
            output_path=this_output_path(), value=versioned(value), inputs=list(inputs), key=name
        ),
    )


def no_polling(monkeypatch):
    monkeypatch.setattr(runner_module, "SIGNAL_CHECK_INTERVAL_S", 30.0)
    monkeypatch.setattr(runner_module, "WORKER_START_DELAY_S", 0.05)


def fillers(count):
    """Quick independent steps queued behind the others, so that the worker is not short of
    queued steps (the `QUEUE_LOW` wake) while the test's own wake is checked."""
    return [step(f"filler{i}", lambda config: None, 100 + i) for i in range(count)]


def test_a_dependent_made_ready_starts_while_the_worker_runs_a_long_step(tmp_path, monkeypatch):
    # `a` has two dependents: its worker goes on with `long` (declared first) itself; `child`
    # needs the main thread, which must hear of `a` now -- `long` waits for `child` to run.
    no_polling(monkeypatch)
    child_ran = threading.Event()
    started = []

    def long_step(config):
        started.append("long")
        assert child_ran.wait(20), "child never started while long ran"

    def child_fn(config):
        started.append("child")
        child_ran.set()

    a = step("a", lambda config: None, 1)
    long = step("long", long_step, 2, inputs=[output_path_of(a)])
    child = step("child", child_fn, 3, inputs=[output_path_of(a)])
    executor = Executor(str(tmp_path), console=False, lease_config=QUIET)
    executor.run([a, long, child], max_concurrent=4)
    assert started == ["long", "child"]  # (the case under test: the worker went on with long)
    assert sorted(e.name for e in executor.events if isinstance(e, StepSucceeded)) == ["a", "child", "long"]


def test_a_failure_marks_its_dependents_while_the_worker_runs_a_long_step(tmp_path, monkeypatch):
    # `bad` fails, then its worker takes `long`. `child` needs both: only the failure can make
    # it final now (DEP_FAILED), and `long` waits for that mark. (One worker: the main thread's
    # check for a starved queue would read the report too.)
    no_polling(monkeypatch)
    monkeypatch.setattr(runner_module, "WORKER_START_DELAY_S", 30.0)
    marked = threading.Event()

    def bad_fn(config):
        raise RuntimeError("boom")

    def long_step(config):
        assert marked.wait(20), "the dependent of the failed step was not marked while long ran"

    bad = step("bad", bad_fn, 1)
    long = step("long", long_step, 2)
    child = step("child", lambda config: None, 3, inputs=[output_path_of(bad), output_path_of(long)])
    executor = Executor(str(tmp_path), console=False, lease_config=QUIET)

    def listen(event):
        if isinstance(event, StepFailed) and event.name == "child" and event.kind == "dep_failed":
            marked.set()

    executor.listeners.append(listen)
    try:
        executor.run([bad, long, child, *fillers(5)], max_concurrent=4)
        raise AssertionError("the run should fail (bad raised)")
    except ExecutorRunError as error:
        assert "bad" in str(error)
    assert marked.is_set()
    succeeded = {e.name for e in executor.events if isinstance(e, StepSucceeded)}
    assert "long" in succeeded and "bad" not in succeeded
    assert "child" not in [e.name for e in executor.events if isinstance(e, StepStarted)]


def test_a_worker_running_short_of_queued_steps_gets_more_without_polling(tmp_path, monkeypatch):
    # 40 quick independent steps, more than the queue holds at once: the worker wakes the main
    # thread to queue more whenever it is down to QUEUE_LOW. Without that, the run would
    # stall for SIGNAL_CHECK_INTERVAL_S (30 s) each time the queue ran dry.
    no_polling(monkeypatch)
    monkeypatch.setattr(runner_module, "WORKER_START_DELAY_S", 30.0)  # one worker throughout
    ran = []
    done = threading.Event()

    def quick(config):
        ran.append(config.key)

    steps = [step(f"q{i:02d}", quick, i) for i in range(40)]
    timer = threading.Timer(20, done.set)  # a stalled run is seen as a failure, not a hang
    timer.start()
    try:
        executor = Executor(str(tmp_path), console=False, lease_config=QUIET)
        executor.run(steps)
    finally:
        timer.cancel()
    assert not done.is_set(), "the run took 20 s: a worker's queue ran dry with no wake"
    assert sorted(ran) == sorted(f"q{i:02d}" for i in range(40))
    assert len([e for e in executor.events if isinstance(e, StepSucceeded)]) == 40
