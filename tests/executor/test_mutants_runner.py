"""The runner, pinned where mutation testing found no test: the run summary and the error
listing every failure, status lines of failed / succeeded / dep-failed steps, dependents
of a failure (transitively, once each), the default concurrency bound, worker threads,
errors outside the step function, and steps finished by another driver between the plan
and the lease.

Everything goes through `Executor.run`, its events, and the files it writes.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from executor import (
    Executor,
    ExecutorRunError,
    ExecutorStep,
    LeaseConfig,
    output_path_of,
    this_output_path,
    versioned,
)
from executor.events import RunFinished, StepFailed, StepPlanned, StepSkipped, StepStarted, StepSucceeded
from executor.lease import LeaseManager
from executor.runner import DEFAULT_MAX_CONCURRENT, Outcome
from executor.store import open_store
from executor.tree import LeaseRecord, Status, append_status, lease_path, log_path, read_status
from tests.executor.steps_for_tests import CALLS, WriteConfig, fail, noop, write_value

QUIET = LeaseConfig(heartbeat_interval=5.0, timeout=60.0, poll_interval=0.02)


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()


def step(name, value=0, inputs=(), fn=write_value, **kwargs):
    return ExecutorStep(
        name=name,
        fn=fn,
        config=WriteConfig(
            output_path=this_output_path(), value=versioned(value), inputs=list(inputs), key=name
        ),
        **kwargs,
    )


def executor_for(tmp_path, **kwargs):
    return Executor(str(tmp_path), console=False, lease_config=QUIET, **kwargs)


def events_of(executor, kind):
    return [event for event in executor.events if isinstance(event, kind)]


def statuses(executor, declared):
    return read_status(executor.store, executor.output_paths[declared])


def wait_for(predicate, timeout=10.0, interval=0.01):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


# -- the summary of a mixed run ------------------------------------------------------------


def test_a_mixed_run_counts_succeeded_skipped_and_failed_steps_and_lists_each_failure(tmp_path):
    # The error lists the steps that failed themselves; the summary's failed count also
    # includes their dependents (dep_failed).
    cached = step("cached", 1)
    executor_for(tmp_path).run([cached])
    good = step("good", 2)
    bad = step("bad", 3, fn=fail)
    child = step("child", 4, inputs=[output_path_of(bad)])
    executor = executor_for(tmp_path)
    with pytest.raises(ExecutorRunError) as raised:
        executor.run([cached, good, child])
    (finished,) = events_of(executor, RunFinished)
    assert (finished.succeeded, finished.skipped, finished.failed) == (1, 1, 2)
    assert 0 <= finished.duration < 30
    bad_path, child_path = executor.output_paths[bad], executor.output_paths[child]
    failures = raised.value.failures
    assert [(f.name, f.output_path, f.outcome, f.error, f.log_path) for f in failures] == [
        ("bad", bad_path, Outcome.FAILED, "RuntimeError: boom in bad", log_path(bad_path)),
    ]
    assert str(raised.value) == (
        f"1 step(s) failed: ['bad']\n  - bad [failed] RuntimeError: boom in bad\n      log: {log_path(bad_path)}"
    )
    (dep_failed,) = [e for e in events_of(executor, StepFailed) if e.kind == "dep_failed"]
    assert (dep_failed.name, dep_failed.output_path, dep_failed.error) == (
        "child",
        child_path,
        "dependency bad failed",
    )


def test_a_clean_run_reports_every_step_succeeded(tmp_path):
    a = step("a", 1)
    b = step("b", 2, inputs=[output_path_of(a)])
    executor = executor_for(tmp_path)
    executor.run([b])
    (finished,) = events_of(executor, RunFinished)
    assert (finished.succeeded, finished.skipped, finished.failed) == (2, 0, 0)
    again = executor_for(tmp_path)
    again.run([b])
    (finished,) = events_of(again, RunFinished)
    assert (finished.succeeded, finished.skipped, finished.failed) == (0, 2, 0)
    assert [e.reason for e in events_of(again, StepSkipped)] == ["already succeeded"] * 2


def test_outcomes_that_count_as_ok():
    assert {o for o in Outcome if o.ok} == {Outcome.SUCCEEDED, Outcome.SKIPPED}
    assert Outcome.LOST.value == "lease_lost" and Outcome.FAILED_ELSEWHERE.value == "failed_elsewhere"


# -- status lines and events of each kind of step ------------------------------------------------


def test_a_success_line_records_worker_duration_version_and_config_digest(tmp_path):
    def slow(config):
        time.sleep(0.05)

    s = step("slow", 1, fn=slow)
    executor = executor_for(tmp_path)
    executor.run([s])
    running, success = statuses(executor, s)
    row = executor.plan.rows[0]
    assert running.status == Status.RUNNING and running.message is None and running.extra == {}
    assert success.status == Status.SUCCESS and success.message is None
    assert success.worker == running.worker and success.worker.count(":") == 2
    assert set(success.extra) == {"duration_s", "version_hash", "config_digest"}
    assert success.extra["version_hash"] == row.step.version_hash
    assert success.extra["config_digest"] == row.step.config_digest
    duration = success.extra["duration_s"]
    assert 0.05 <= duration < 10 and round(duration, 3) == duration
    (started,) = events_of(executor, StepStarted)
    assert started.log_path == log_path(row.output_path)
    (succeeded,) = events_of(executor, StepSucceeded)
    assert succeeded.name == "slow" and succeeded.output_path == row.output_path
    assert succeeded.duration == pytest.approx(duration, abs=0.0006)  # the same duration, unrounded
    assert executor.store.read_bytes(lease_path(row.output_path)) is None


def test_a_failure_line_records_the_error_and_a_rounded_duration(tmp_path):
    bad = step("bad", 1, fn=fail)
    executor = executor_for(tmp_path)
    with pytest.raises(ExecutorRunError):
        executor.run([bad])
    running, failed = statuses(executor, bad)
    path = executor.output_paths[bad]
    assert failed.status == Status.FAILED and failed.message == "RuntimeError: boom in bad"
    assert failed.worker == running.worker
    assert set(failed.extra) == {"duration_s"}
    assert (
        0 <= failed.extra["duration_s"] < 10
        and round(failed.extra["duration_s"], 3) == failed.extra["duration_s"]
    )
    (event,) = events_of(executor, StepFailed)
    assert (event.name, event.output_path, event.kind, event.error, event.log_path) == (
        "bad",
        path,
        "error",
        "RuntimeError: boom in bad",
        log_path(path),
    )
    assert executor.store.read_bytes(lease_path(path)) is None


def test_every_descendant_of_a_failure_is_marked_once_naming_the_failed_step(tmp_path):
    # a fails; b and c need a; d needs both b and c; e needs d. All are dep_failed "because
    # of a" (not of their direct parent), each once, each with a DEP_FAILED status line.
    a = step("a", 1, fn=fail)
    b = step("b", 2, inputs=[output_path_of(a)])
    c = step("c", 3, inputs=[output_path_of(a)])
    d = step("d", 4, inputs=[output_path_of(b), output_path_of(c)])
    e = step("e", 5, inputs=[output_path_of(d)])
    free = step("free", 6)
    executor = executor_for(tmp_path)
    with pytest.raises(ExecutorRunError) as raised:
        executor.run([e, free])
    dep_failed = [ev for ev in events_of(executor, StepFailed) if ev.kind == "dep_failed"]
    assert sorted(ev.name for ev in dep_failed) == ["b", "c", "d", "e"]
    assert {ev.error for ev in dep_failed} == {"dependency a failed"}
    assert [f.name for f in raised.value.failures] == ["a"]
    for declared in (b, c, d, e):
        (line,) = statuses(executor, declared)
        assert (line.status, line.message) == (Status.DEP_FAILED, "dependency a failed")
        assert line.worker is not None
        assert executor.store.read_bytes(lease_path(executor.output_paths[declared])) is None
    assert CALLS == {"a": 1, "free": 1}
    (finished,) = events_of(executor, RunFinished)
    assert (finished.succeeded, finished.failed) == (1, 5)


def test_a_step_waits_for_all_of_its_dependencies(tmp_path):
    gate = threading.Event()
    order = []

    def slow_parent(config):
        gate.wait(10)
        order.append("slow")

    def quick_parent(config):
        order.append("quick")
        gate.set()

    def child(config):
        order.append("child")

    slow = step("slow", 1, fn=slow_parent)
    quick = step("quick", 2, fn=quick_parent)
    last = step("last", 3, inputs=[output_path_of(slow), output_path_of(quick)], fn=child)
    executor_for(tmp_path).run([last])
    assert order == ["quick", "slow", "child"]


def test_a_child_of_a_skipped_step_runs(tmp_path):
    a = step("a", 1)
    executor_for(tmp_path).run([a])
    b = step("b", 2, inputs=[output_path_of(a)])
    executor = executor_for(tmp_path)
    executor.run([b])
    assert CALLS == {"a": 1, "b": 1}


# -- concurrency and worker threads -------------------------------------------------------


def test_without_a_bound_at_most_the_default_number_of_steps_run_at_once(tmp_path):
    assert DEFAULT_MAX_CONCURRENT == 32
    lock = threading.Lock()
    running = [0]
    peak = [0]
    gate = threading.Event()

    def blocker(config):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        gate.wait(30)
        with lock:
            running[0] -= 1

    steps = [step(f"s{i}", i, fn=blocker) for i in range(DEFAULT_MAX_CONCURRENT + 2)]
    executor = executor_for(tmp_path)
    thread = threading.Thread(target=executor.run, args=(steps,))
    thread.start()
    try:
        wait_for(lambda: running[0] >= DEFAULT_MAX_CONCURRENT)
        time.sleep(0.2)  # a 33rd step, if one were allowed, would have started by now
        assert peak[0] == DEFAULT_MAX_CONCURRENT
    finally:
        gate.set()
        thread.join(30)
    assert not thread.is_alive()
    assert len(events_of(executor, StepSucceeded)) == DEFAULT_MAX_CONCURRENT + 2


def test_a_max_concurrent_below_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="max_concurrent must be at least 1, got 0"):
        executor_for(tmp_path).run([step("a")], max_concurrent=0)


def test_steps_run_in_threads_named_after_them_and_a_chain_reuses_one_thread(tmp_path):
    seen = []

    def record(config):
        current = threading.current_thread()
        seen.append((current.name, current.ident))

    a = step("a", fn=record)
    b = step("b", inputs=[output_path_of(a)], fn=record)
    c = step("c", inputs=[output_path_of(b)], fn=record)
    executor_for(tmp_path).run([c])
    assert [name for name, _ in seen] == ["step:a", "step:b", "step:c"]
    assert len({ident for _, ident in seen}) == 1  # one worker, kept between steps


def test_no_worker_thread_outlives_the_run_or_dies_of_an_error(tmp_path, monkeypatch):
    crashed = []
    monkeypatch.setattr(threading, "excepthook", crashed.append)  # an uncaught error in any thread
    before = {t.ident for t in threading.enumerate()}
    steps = [step(f"s{i}", i, fn=noop) for i in range(4)]
    executor_for(tmp_path).run(steps, max_concurrent=2)
    wait_for(
        lambda: not [t for t in threading.enumerate() if t.ident not in before and t.name.startswith("step:")]
    )
    assert crashed == []


def test_two_steps_ready_at_once_after_a_third_run_side_by_side(tmp_path):
    # When a finishes, its worker is idle and b and c become ready together: one of them
    # reuses that worker, the other must get a thread of its own (not queue behind it).
    meeting = threading.Barrier(2, timeout=5)

    def meet(config):
        meeting.wait()

    a = step("a", 1, fn=noop)
    b = step("b", 2, inputs=[output_path_of(a)], fn=meet)
    c = step("c", 3, inputs=[output_path_of(a)], fn=meet)
    executor = executor_for(tmp_path)
    executor.run([b, c])
    assert sorted(e.name for e in events_of(executor, StepSucceeded)) == ["a", "b", "c"]


# -- errors outside the step function -----------------------------------------------------


def test_a_storage_error_outside_the_step_fails_only_that_step_and_frees_its_lease(tmp_path, caplog):
    a = step("a", 1)
    executor = executor_for(tmp_path)
    real_append = executor.store.append_line

    def broken_append(path, line):
        if "/a-" in path:
            raise OSError("disk gone")
        return real_append(path, line)

    executor.store.append_line = broken_append
    other = step("other", 2)
    with caplog.at_level(logging.ERROR, logger="executor.runner"), pytest.raises(ExecutorRunError) as raised:
        executor.run([a, other])
    path = executor.output_paths[a]
    (failure,) = raised.value.failures
    assert (failure.name, failure.outcome, failure.error) == (
        "a",
        Outcome.FAILED,
        "executor error: OSError: disk gone",
    )
    (event,) = events_of(executor, StepFailed)
    assert (event.name, event.output_path, event.kind, event.error) == (
        "a",
        path,
        "error",
        "executor error: OSError: disk gone",
    )
    assert executor.store.read_bytes(lease_path(path)) is None
    assert CALLS == {"other": 1}
    assert "executor error while running a: OSError: disk gone" in [
        r.getMessage() for r in caplog.records if r.name == "executor.runner"
    ]


def test_a_lease_that_cannot_be_released_after_an_executor_error_is_logged(tmp_path, caplog):
    a = step("a", 1)
    executor = executor_for(tmp_path)
    store = executor.store
    real_append, real_delete = store.append_line, store.delete

    def broken_append(path, line):
        raise OSError("disk gone")

    def broken_delete(path):
        if path.endswith(".executor_status.lock"):
            raise OSError("still gone")
        real_delete(path)

    store.append_line = broken_append
    store.delete = broken_delete  # a young lease is released by a plain delete
    with (
        caplog.at_level(logging.ERROR, logger="executor.runner"),
        pytest.raises(ExecutorRunError, match="executor error: OSError: disk gone"),
    ):
        executor.run([a])
    store.append_line, store.delete = real_append, real_delete
    path = executor.output_paths[a]
    assert f"could not release the lease on {path}: still gone" in [
        r.getMessage() for r in caplog.records if r.name == "executor.runner"
    ]
    assert LeaseRecord.parse(store.read_bytes(lease_path(path))) is not None  # left to time out


# -- another driver finished the step meanwhile ------------------------------------------------


def test_a_step_finished_between_the_plan_and_the_lease_is_skipped_and_not_run(tmp_path):
    a = step("a", 1)
    store = open_store(str(tmp_path))

    def finish_elsewhere(event):
        if isinstance(event, StepPlanned):
            append_status(store, event.output_path, Status.SUCCESS, None, "other:1:x")

    executor = executor_for(tmp_path, listeners=[finish_elsewhere])
    executor.run([a])
    assert CALLS == {}
    path = executor.output_paths[a]
    (skipped,) = events_of(executor, StepSkipped)
    assert (skipped.name, skipped.reason) == ("a", "finished by another driver")
    assert [e.status for e in read_status(store, path)] == [Status.SUCCESS]
    assert store.read_bytes(lease_path(path)) is None
    (finished,) = events_of(executor, RunFinished)
    assert (finished.succeeded, finished.skipped) == (0, 1)


def test_a_step_planned_as_waiting_that_finished_before_the_runner_looked_is_already_succeeded(tmp_path):
    a = step("a", 1)
    store = open_store(str(tmp_path))
    holder = LeaseManager(store, QUIET, "other:1:x")

    def finish_now(event):
        if isinstance(event, StepPlanned):
            assert event.action == "wait"
            append_status(store, event.output_path, Status.SUCCESS, None, "other:1:x")
            holder.release(event.output_path)

    executor = executor_for(tmp_path, listeners=[finish_now])
    path = executor_for(tmp_path).run([a], dry_run=True).rows[0].output_path
    assert holder.try_acquire(path).acquired
    try:
        executor.run([a])
    finally:
        holder.close()
    assert CALLS == {}
    (skipped,) = events_of(executor, StepSkipped)
    assert skipped.reason == "already succeeded"
    assert not [e for e in executor.events if type(e).__name__ == "StepWaiting"]


def test_a_failure_recorded_before_the_runner_waited_is_retried_not_reported_as_elsewhere(tmp_path):
    # Only a failure seen *after* waiting on the holder is "failed in another driver"; a
    # FAILED status found at once (the holder gave up) leaves the step to this driver.
    a = step("a", 1)
    store = open_store(str(tmp_path))
    holder = LeaseManager(store, QUIET, "other:1:x")

    def fail_now(event):
        if isinstance(event, StepPlanned):
            append_status(store, event.output_path, Status.FAILED, "boom", "other:1:x")
            holder.release(event.output_path)

    executor = executor_for(tmp_path, listeners=[fail_now])
    path = executor_for(tmp_path).run([a], dry_run=True).rows[0].output_path
    assert holder.try_acquire(path).acquired
    try:
        executor.run([a])
    finally:
        holder.close()
    assert CALLS == {"a": 1}
    assert [e.status for e in read_status(store, path)] == [Status.FAILED, Status.RUNNING, Status.SUCCESS]


def test_a_lost_lease_is_reported_with_its_kind_and_message(tmp_path):
    started, release = threading.Event(), threading.Event()

    def slow(config):
        started.set()
        release.wait(30)

    s = step("contested", 1, fn=slow)
    # (heartbeats from a thread: the keeper process would stop this whole process)
    fast = LeaseConfig(heartbeat_interval=0.05, timeout=0.3, poll_interval=0.05, heartbeat_process=False)
    executor = Executor(str(tmp_path), console=False, lease_config=fast)
    result = {}

    def drive():
        try:
            executor.run([s])
        except ExecutorRunError as error:
            result["error"] = error

    thread = threading.Thread(target=drive)
    thread.start()
    try:
        assert started.wait(20)
        path = executor.plan.rows[0].output_path
        thief = LeaseRecord(worker="thief", heartbeat=time.time() + 3600)
        executor.store.write_atomic(lease_path(path), thief.to_bytes())
        thread.join(20)
    finally:
        release.set()
    assert not thread.is_alive()
    (failure,) = result["error"].failures
    assert (failure.outcome, failure.error) == (Outcome.LOST, "lease lost to another driver")
    lost = [e for e in events_of(executor, StepFailed) if e.kind == "lease_lost"]
    assert [(e.name, e.output_path, e.error) for e in lost][:1] == [
        ("contested", path, "lease lost to another driver")
    ]
    (finished,) = events_of(executor, RunFinished)
    assert (finished.succeeded, finished.failed) == (0, 1)


def test_workers_freed_together_are_all_reused(tmp_path):
    # b and c finish side by side, leaving two idle workers; d and e (ready together) must
    # reuse both rather than start a third thread.
    first, second = threading.Barrier(2, timeout=5), threading.Barrier(2, timeout=5)
    threads = set()

    def meet(barrier):
        def fn(config):
            threads.add(threading.current_thread().ident)
            if barrier is not None:
                barrier.wait()

        return fn

    a = step("a", 1, fn=meet(None))
    b = step("b", 2, inputs=[output_path_of(a)], fn=meet(first))
    c = step("c", 3, inputs=[output_path_of(a)], fn=meet(first))
    d = step("d", 4, inputs=[output_path_of(b), output_path_of(c)], fn=meet(second))
    e = step("e", 5, inputs=[output_path_of(b), output_path_of(c)], fn=meet(second))
    executor_for(tmp_path).run([d, e])
    assert len(threads) == 2


def test_a_lease_lost_while_the_step_ran_is_reported_with_the_step_and_why(tmp_path, monkeypatch):
    slow_heartbeats = LeaseConfig(heartbeat_interval=600, timeout=1200, poll_interval=0.05)
    executor = Executor(str(tmp_path), console=False, lease_config=slow_heartbeats)
    thief = LeaseRecord(worker="thief", heartbeat=time.time() + 3600)
    monkeypatch.setattr(LeaseManager, "_young", lambda self, written: False)  # a step past a heartbeat

    def taken_over_while_running(config):
        executor.store.write_atomic(lease_path(config.output_path), thief.to_bytes())

    s = step("taken", 1, fn=taken_over_while_running)
    with pytest.raises(ExecutorRunError):
        executor.run([s])
    path = executor.output_paths[s]
    # (the run also reports the loss itself, as on the heartbeat path: "lease lost to another driver")
    (event,) = [e for e in events_of(executor, StepFailed) if e.log_path is not None]
    assert (event.name, event.output_path, event.kind, event.log_path) == (
        "taken",
        path,
        "lease_lost",
        log_path(path),
    )
    assert event.error == "lease lost to another driver while the step ran; not marking it successful"
