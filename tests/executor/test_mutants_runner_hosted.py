"""The runner's hosted-step path (`Runner._run_hosted`), driven through `Executor.run` with a
backend whose `call_hosted` is scripted in this process: what the host is handed, and what the
runner does with each outcome (succeeded, failed, lost, not started, a lost process re-submitted
up to `max_retries` times, cancelled, a lost process that recorded SUCCESS anyway, a lease
another driver took meanwhile).
"""

from __future__ import annotations

import pytest

from executor import Executor, ExecutorRunError, ExecutorStep, LeaseConfig, this_output_path, versioned
from executor.backends import Backend, StepCancelled, StepFunctionError
from executor.backends.host import run_hosted
from executor.events import StepFailed, StepStarted, StepSucceeded
from executor.lease import LeaseManager
from executor.tree import LeaseRecord, Status, append_status, lease_path, read_status
from tests.executor.steps_for_tests import WriteConfig, write_value

QUIET = LeaseConfig(heartbeat_interval=5.0, timeout=60.0, poll_interval=0.02)


class Scripted(Backend):
    """Runs every step hosted; each call takes the next item of `script`: an exception to raise,
    a result to return, "host" (run the real step host here), or a callable(spec) -> either."""

    name = "scripted"

    def __init__(self, *script):
        self.script = list(script)
        self.specs = []

    def prepare(self, step):
        return {"backend": self.name, "where": "test", "hosted": True}

    def call_hosted(self, step, dispatch, spec):
        self.specs.append(spec)
        item = self.script.pop(0)
        if callable(item) and not isinstance(item, type):
            item = item(spec)
        if isinstance(item, BaseException):
            raise item
        if item == "host":
            return run_hosted(spec, step.step.fn, step.config)
        return item


def one_step(name="hosted"):
    return ExecutorStep(
        name=name,
        fn=write_value,
        config=WriteConfig(output_path=this_output_path(), value=versioned(1), key=name),
    )


def run(tmp_path, backend, max_retries=0):
    executor = Executor(
        str(tmp_path), console=False, lease_config=QUIET, backend=backend, max_retries=max_retries
    )
    step = one_step()
    executor_steps[executor] = step
    error = None
    try:
        executor.run([step])
    except ExecutorRunError as raised:
        error = raised
    return executor, executor.output_paths[step], error


def events(executor, kind):
    found = [event for event in executor.events if isinstance(event, kind)]
    for event in found:  # every step event names the step and its output
        assert event.name == "hosted"
        assert event.output_path == executor.output_paths[executor_steps[executor]]
    return found


executor_steps = {}


def statuses(executor, path):
    return [(event.status, event.message) for event in read_status(executor.store, path)]


def test_the_host_is_handed_the_lease_and_what_it_records_with(tmp_path):
    handed = []

    def look(spec):
        handed.append(LeaseRecord.parse(spec.lease_bytes))
        return "host"

    backend = Scripted(look)
    executor, path, error = run(tmp_path, backend)
    assert error is None
    (spec,) = backend.specs
    assert spec.name == "hosted"
    assert spec.output_path == path
    assert spec.prefix == str(tmp_path)
    assert spec.heartbeat_interval == 5.0
    running = read_status(executor.store, path)[0]
    assert running.status == Status.RUNNING and running.message is None
    assert spec.driver_worker == running.worker
    assert handed[0].worker == running.worker  # the driver's own lease, exactly as written
    success = read_status(executor.store, path)[-1]
    assert success.status == Status.SUCCESS
    assert success.extra["version_hash"] == spec.version_hash and len(spec.version_hash) == 64
    assert success.extra["config_digest"] == spec.config_digest and spec.config_digest
    assert len(events(executor, StepStarted)) == 1 and len(events(executor, StepSucceeded)) == 1
    assert executor.store.read_bytes(lease_path(path)) is None


def test_a_failed_step_is_reported_with_its_error(tmp_path):
    executor, path, error = run(tmp_path, Scripted({"outcome": "failed", "error": "ValueError: no"}))
    assert error is not None
    (failed,) = events(executor, StepFailed)
    assert (failed.kind, failed.error) == ("error", "ValueError: no")
    assert failed.log_path is not None and failed.log_path.endswith(".executor_log")
    assert events(executor, StepSucceeded) == []


@pytest.mark.parametrize("outcome", ["lost", "not_started"])
def test_a_lease_taken_over_is_reported_lost(tmp_path, outcome):
    executor, path, error = run(tmp_path, Scripted({"outcome": outcome, "error": "taken"}), max_retries=3)
    assert error is not None
    (failed,) = events(executor, StepFailed)
    assert (failed.kind, failed.error) == ("lease_lost", "taken")
    assert failed.log_path.endswith(".executor_log")


def test_a_result_without_an_error_is_an_empty_message(tmp_path):
    executor, _, _ = run(tmp_path, Scripted({"outcome": "failed", "error": None}))
    (failed,) = events(executor, StepFailed)
    assert failed.error == ""


def test_a_lost_process_is_submitted_again_and_each_attempt_recorded(tmp_path):
    backend = Scripted(StepFunctionError("the node died"), "host")
    executor, path, error = run(tmp_path, backend, max_retries=1)
    assert error is None
    assert statuses(executor, path) == [
        (Status.RUNNING, None),
        (Status.RUNNING, "attempt 2 of 2"),
        (Status.SUCCESS, None),
    ]
    assert len(backend.specs) == 2
    assert len(events(executor, StepStarted)) == 1  # started once, whatever the attempts
    assert (executor.store.read_bytes(f"{path}/.executor_log") or b"").find(b"attempt 1: the node died") >= 0


def test_a_process_that_keeps_dying_fails_after_max_retries_and_releases_the_lease(tmp_path):
    backend = Scripted(StepFunctionError("died"), StepFunctionError("died"), StepFunctionError("died"))
    executor, path, error = run(tmp_path, backend, max_retries=2)
    assert error is not None
    assert len(backend.specs) == 3
    assert statuses(executor, path) == [
        (Status.RUNNING, None),
        (Status.RUNNING, "attempt 2 of 3"),
        (Status.RUNNING, "attempt 3 of 3"),
        (Status.FAILED, "died (after 3 attempts)"),
    ]
    (failed,) = events(executor, StepFailed)
    assert (failed.kind, failed.error) == ("error", "died (after 3 attempts)")
    assert executor.store.read_bytes(lease_path(path)) is None


def test_no_retries_means_one_attempt(tmp_path):
    backend = Scripted(StepFunctionError("died"))
    executor, path, error = run(tmp_path, backend, max_retries=0)
    assert len(backend.specs) == 1
    assert statuses(executor, path)[-1] == (Status.FAILED, "died (after 1 attempts)")


def test_a_cancelled_step_is_not_submitted_again(tmp_path):
    backend = Scripted(StepCancelled("stopped: killed"))
    executor, path, error = run(tmp_path, backend, max_retries=3)
    assert len(backend.specs) == 1
    assert statuses(executor, path)[-1] == (Status.FAILED, "stopped: killed")
    (failed,) = events(executor, StepFailed)
    assert (failed.kind, failed.error) == ("error", "stopped: killed")
    assert executor.store.read_bytes(lease_path(path)) is None


def test_a_lost_process_that_recorded_success_is_a_success(tmp_path):
    def succeed_then_die(spec):
        from executor.store import open_store

        append_status(open_store(spec.prefix), spec.output_path, Status.SUCCESS, None, "host")
        return StepFunctionError("lost after recording")

    backend = Scripted(succeed_then_die)
    executor, path, error = run(tmp_path, backend, max_retries=3)
    assert error is None
    assert len(backend.specs) == 1
    assert len(events(executor, StepSucceeded)) == 1 and events(executor, StepFailed) == []


def test_a_lost_process_whose_lease_another_driver_took_is_lost(tmp_path):
    def taken(spec):
        from executor.store import open_store

        other = LeaseRecord(worker="other:1:ffff", heartbeat=9e9).to_bytes()
        open_store(spec.prefix).write_atomic(lease_path(spec.output_path), other)
        return StepFunctionError("gone")

    backend = Scripted(taken)
    executor, path, error = run(tmp_path, backend, max_retries=3)
    assert len(backend.specs) == 1
    (failed,) = events(executor, StepFailed)
    assert (failed.kind, failed.error) == ("lease_lost", "gone; and another driver holds the lease now")
    assert statuses(executor, path) == [(Status.RUNNING, None)]  # nothing recorded over the other's


def test_a_lease_lost_before_the_hand_over_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(LeaseManager, "hand_over", lambda self, path: None)
    backend = Scripted()
    executor, path, error = run(tmp_path, backend)
    assert backend.specs == []
    (failed,) = events(executor, StepFailed)
    assert (failed.kind, failed.error) == (
        "lease_lost",
        "lease lost to another driver before the step started",
    )
    assert failed.log_path == f"{path}/.executor_log"


def test_the_hosts_succeeded_is_trusted_without_reading_the_status_again(tmp_path):
    backend = Scripted({"outcome": "succeeded", "error": None})
    executor, path, error = run(tmp_path, backend, max_retries=2)
    assert error is None
    assert len(backend.specs) == 1
    assert len(events(executor, StepSucceeded)) == 1


def test_a_failure_after_the_last_attempt_is_recorded_by_this_driver(tmp_path):
    backend = Scripted(StepFunctionError("died"))
    executor, path, error = run(tmp_path, backend)
    running, failed = read_status(executor.store, path)
    assert failed.worker == running.worker and failed.worker


def test_a_resubmission_is_logged(tmp_path, caplog):
    import logging

    caplog.set_level(logging.WARNING, logger="executor.runner")
    run(tmp_path, Scripted(StepFunctionError("the node died"), "host"), max_retries=1)
    assert "step hosted: the node died; submitting it again (attempt 2)" in caplog.messages


# -- following the log of a step running elsewhere ---------------------------------------------------


@pytest.fixture
def console(monkeypatch):
    written = []
    monkeypatch.setattr("executor.logs.console_write", written.append)
    return written


def _follower(tmp_path):
    from executor.runner import _LogFollower
    from executor.store import open_store

    store = open_store(str(tmp_path))
    path = f"{tmp_path}/step-1/.executor_log"
    return _LogFollower(store, "s", path), store, path


def test_the_follower_first_shows_the_last_whole_lines(tmp_path, console):
    follower, store, path = _follower(tmp_path)
    lines = [f"line {i}" for i in range(15)]
    store.write_atomic(path, ("\n".join(lines) + "\npartial").encode())
    follower.poll()
    assert console == [
        f"  s | ... (the end of {path} so far)\n",
        "".join(f"  s | line {i}\n" for i in range(5, 15)),
    ]
    assert follower.offset == len(("\n".join(lines) + "\n").encode())


def test_the_follower_then_shows_each_whole_line_once(tmp_path, console):
    follower, store, path = _follower(tmp_path)
    store.write_atomic(path, b"")
    follower.poll()
    assert console == [] and follower.offset == 0
    store.write_atomic(path, b"one\ntw")
    follower.poll()
    assert console == ["  s | one\n"]
    follower.poll()  # nothing new
    store.write_atomic(path, b"one\ntwo \x1b[31mred\xff\nthr")
    follower.poll()
    assert console[1:] == ["  s | two ?[31mred\ufffd\n"]
    follower.poll()
    assert len(console) == 2
    store.write_atomic(path, b"new\n")  # replaced by a shorter log: first look again
    follower.poll()
    assert console[2:] == [f"  s | ... (the end of {path} so far)\n", "  s | new\n"]


def test_the_follower_ignores_a_log_it_cannot_read(tmp_path, console, monkeypatch):
    follower, store, path = _follower(tmp_path)
    store.write_atomic(path, b"x\n")

    def broken(path):
        raise OSError("gone")

    monkeypatch.setattr(store, "read_bytes", broken)
    follower.poll()
    assert console == [] and follower.offset is None


# -- the run's error and a lost lease's stop ------------------------------------------------------------


def test_the_run_error_names_each_failure_and_its_log_only_when_there_is_one():
    from executor.runner import ExecutorRunError, Failure, Outcome

    error = ExecutorRunError(
        [
            Failure(
                name="b",
                output_path="/o/b",
                outcome=Outcome.FAILED,
                error="ValueError: x",
                log_path="/o/b/.executor_log",
            ),
            Failure(name="a", output_path="/o/a", outcome=Outcome.LOST, error="lost", log_path=None),
        ]
    )
    assert str(error) == (
        "2 step(s) failed: ['a', 'b']\n"
        "  - b [failed] ValueError: x\n      log: /o/b/.executor_log\n"
        f"  - a [{Outcome.LOST.value}] lost"
    )


def test_a_lost_lease_stops_the_steps_process_and_a_failure_to_stop_it_is_logged(caplog):
    import logging
    import queue

    from executor.runner import Runner

    class Refuses(Backend):
        def cancel(self, output_path):
            raise RuntimeError("cannot")

    runner = Runner.__new__(Runner)
    runner._messages = queue.Queue()
    runner.backend = Refuses()
    caplog.set_level(logging.ERROR, logger="executor.runner")
    runner.lease_lost("/out/step-1")
    assert runner._messages.get_nowait() == ("lost", "/out/step-1", None, None)
    assert caplog.messages == ["could not stop /out/step-1 after losing its lease"]
