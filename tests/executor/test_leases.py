"""Leases: one driver per step, waiting drivers skip, dead drivers are taken over, lost leases never succeed."""

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from executor import Executor, ExecutorRunError, ExecutorStep, LeaseConfig, this_output_path, versioned
from executor.events import StepFailed, StepSkipped, StepWaiting
from executor.lease import LeaseManager
from executor.store import open_store
from executor.tree import LeaseRecord, Status, lease_path, read_status
from tests.executor.steps_for_tests import SleepConfig, WriteConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wait_for(predicate, timeout=20.0, interval=0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


# -- LeaseManager ----------------------------------------------------------------


def test_a_fresh_lease_cannot_be_acquired_by_another_worker(any_prefix, fast_leases):
    store = open_store(any_prefix)
    first = LeaseManager(store, fast_leases, "w1")
    second = LeaseManager(store, fast_leases, "w2")
    try:
        assert first.try_acquire(f"{any_prefix}/s").acquired
        attempt = second.try_acquire(f"{any_prefix}/s")
        assert not attempt.acquired and attempt.holder.worker == "w1"
    finally:
        first.close()
        second.close()


def test_heartbeats_keep_a_lease_alive_past_its_timeout(any_prefix, fast_leases):
    store = open_store(any_prefix)
    holder = LeaseManager(store, fast_leases, "w1")
    other = LeaseManager(store, fast_leases, "w2")
    try:
        holder.try_acquire(f"{any_prefix}/s")
        time.sleep(fast_leases.timeout * 1.5)
        assert not other.try_acquire(f"{any_prefix}/s").acquired
        assert holder.holds(f"{any_prefix}/s")
    finally:
        holder.close()
        other.close()


def test_a_stale_lease_is_taken_over(any_prefix, fast_leases):
    store = open_store(any_prefix)
    stale = LeaseRecord(worker="dead", heartbeat=time.time() - 100)
    store.write_atomic(lease_path(f"{any_prefix}/s"), stale.to_bytes())
    manager = LeaseManager(store, fast_leases, "w2")
    try:
        attempt = manager.try_acquire(f"{any_prefix}/s")
        assert attempt.acquired and attempt.holder.worker == "dead"
        assert LeaseRecord.parse(store.read_bytes(lease_path(f"{any_prefix}/s"))).worker == "w2"
    finally:
        manager.close()


def test_release_removes_only_our_own_lease(any_prefix, fast_leases):
    store = open_store(any_prefix)
    manager = LeaseManager(store, fast_leases, "w1")
    manager.try_acquire(f"{any_prefix}/s")
    manager.close()  # no heartbeat thread: our last write stays the one try_acquire made
    thief = LeaseRecord(worker="thief", heartbeat=time.time()).to_bytes()
    store.write_atomic(lease_path(f"{any_prefix}/s"), thief)
    # Once our last write is a heartbeat interval old, someone may have taken the lease over:
    # release then deletes it only if it still holds our bytes.
    manager._written[f"{any_prefix}/s"] -= fast_leases.heartbeat_interval
    manager.release(f"{any_prefix}/s")
    assert store.read_bytes(lease_path(f"{any_prefix}/s")) == thief


def test_a_taken_over_lease_is_reported_lost(any_prefix, fast_leases):
    store = open_store(any_prefix)
    lost = []
    manager = LeaseManager(store, fast_leases, "w1", on_lost=lost.append)
    try:
        manager.try_acquire(f"{any_prefix}/s")
        thief = LeaseRecord(worker="thief", heartbeat=time.time())
        store.write_atomic(lease_path(f"{any_prefix}/s"), thief.to_bytes())
        wait_for(lambda: lost == [f"{any_prefix}/s"])
        assert manager.was_lost(f"{any_prefix}/s") and not manager.holds(f"{any_prefix}/s")
    finally:
        manager.close()


def test_lease_config_rejects_a_heartbeat_slower_than_the_timeout():
    with pytest.raises(ValueError, match="heartbeat_interval"):
        LeaseConfig(heartbeat_interval=10, timeout=5)


# -- drivers racing ----------------------------------------------------------------


def test_ten_threads_racing_ten_executors_run_a_step_once(any_prefix, fast_leases):
    calls = []
    lock = threading.Lock()

    def slow_once(config):
        with lock:
            calls.append(1)
        time.sleep(0.3)

    step = ExecutorStep("shared", slow_once, WriteConfig(output_path=this_output_path(), value=versioned(1)))
    barrier = threading.Barrier(10)
    errors = []

    def drive():
        barrier.wait()
        try:
            Executor(any_prefix, console=False, lease_config=fast_leases).run([step])
        except Exception as error:  # collected and asserted below
            errors.append(error)

    threads = [threading.Thread(target=drive) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(calls) == 1
    store = open_store(any_prefix)
    output = Executor(any_prefix, console=False).run([step], dry_run=True).rows[0].output_path
    assert [e.status for e in read_status(store, output)] == [Status.RUNNING, Status.SUCCESS]
    assert store.read_bytes(lease_path(output)) is None


def test_a_second_executor_waits_for_the_first_and_then_skips(tmp_path, fast_leases):
    started, release = threading.Event(), threading.Event()

    def blocking(config):
        started.set()
        assert release.wait(20)

    step = ExecutorStep("shared", blocking, WriteConfig(output_path=this_output_path(), value=versioned(1)))
    first = Executor(str(tmp_path), console=False, lease_config=fast_leases)
    runner = threading.Thread(target=first.run, args=([step],))
    runner.start()
    assert started.wait(20)
    second = Executor(str(tmp_path), console=False, lease_config=fast_leases)
    waiter = threading.Thread(target=second.run, args=([step],))
    waiter.start()
    wait_for(lambda: any(isinstance(e, StepWaiting) for e in second.events))
    (waiting,) = [e for e in second.events if isinstance(e, StepWaiting)]
    # Who holds the step, and when it last showed a sign of life (the lease's heartbeat).
    held = LeaseRecord.parse(
        open_store(str(tmp_path)).read_bytes(lease_path(second.plan.rows[0].output_path))
    )
    assert waiting.holder == held.worker
    assert isinstance(waiting.heartbeat, float) and abs(held.heartbeat - waiting.heartbeat) < 30
    assert second.plan.rows[0].action.value == "wait"
    assert first.events and "held by" in second.plan.rows[0].reason
    release.set()
    runner.join(20)
    waiter.join(20)
    skipped = [e for e in second.events if isinstance(e, StepSkipped)]
    assert [e.reason for e in skipped] == ["finished by another driver"]


def test_a_killed_driver_is_taken_over_and_never_marked_successful_in_between(tmp_path):
    prefix = tmp_path / "prefix"
    marker, counts = tmp_path / "started", tmp_path / "counts"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {REPO!r})
        from executor import Executor, ExecutorStep, LeaseConfig, this_output_path
        from tests.executor.steps_for_tests import SleepConfig, sleep_step
        step = ExecutorStep("victim", sleep_step, SleepConfig(
            output_path=this_output_path(), marker={str(marker)!r}, seconds=3600, count_file={str(counts)!r}))
        leases = LeaseConfig(heartbeat_interval=0.1, timeout=1.0, poll_interval=0.05)
        Executor({str(prefix)!r}, console=False, lease_config=leases).run([step])
        """
    )
    victim = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_for(marker.exists)
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
    from tests.executor.steps_for_tests import sleep_step

    step = ExecutorStep(
        "victim",
        sleep_step,
        SleepConfig(output_path=this_output_path(), marker=str(marker), seconds=0, count_file=str(counts)),
    )
    leases = LeaseConfig(heartbeat_interval=0.1, timeout=1.0, poll_interval=0.05)
    executor = Executor(str(prefix), console=False, lease_config=leases)
    output = executor.run([step], dry_run=True).rows[0].output_path
    assert [e.status for e in read_status(executor.store, output)] == [Status.RUNNING]
    time.sleep(1.2)  # let the dead driver's lease expire
    plan = executor.run([step], dry_run=True)
    assert "stale lease" in plan.rows[0].reason
    executor.run([step])
    history = read_status(executor.store, output)
    assert [e.status for e in history] == [Status.RUNNING, Status.RUNNING, Status.SUCCESS]
    assert history[0].worker != history[1].worker == history[2].worker
    assert counts.read_text() == "ran\nran\n"
    assert os.path.exists(f"{output}/done")


def test_a_driver_that_loses_its_lease_stops_waiting_and_does_not_mark_success(tmp_path, fast_leases):
    """With heartbeats from a thread (the keeper process would stop this whole process: see
    tests/executor/test_lease_keeper.py), a lost lease is reported and never marked SUCCESS."""
    fast_leases = dataclasses.replace(fast_leases, heartbeat_process=False)
    started, release = threading.Event(), threading.Event()

    def slow(config):
        started.set()
        release.wait(30)

    step = ExecutorStep("contested", slow, WriteConfig(output_path=this_output_path(), value=versioned(1)))
    executor = Executor(str(tmp_path), console=False, lease_config=fast_leases)
    outcome = {}

    def drive():
        try:
            executor.run([step])
        except ExecutorRunError as error:
            outcome["error"] = error

    thread = threading.Thread(target=drive)
    thread.start()
    assert started.wait(20)
    output = executor.plan.rows[0].output_path
    thief = LeaseRecord(worker="thief", heartbeat=time.time() + 3600)
    executor.store.write_atomic(lease_path(output), thief.to_bytes())
    thread.join(20)
    assert not thread.is_alive(), "the run kept waiting on a step whose lease it lost"
    assert "lease_lost" in str(outcome["error"])
    assert any(isinstance(e, StepFailed) and e.kind == "lease_lost" for e in executor.events)
    release.set()  # the orphaned function returns now; it must not write SUCCESS
    time.sleep(0.5)
    assert Status.SUCCESS not in [e.status for e in read_status(executor.store, output)]
    assert LeaseRecord.parse(executor.store.read_bytes(lease_path(output))).worker == "thief"


def test_a_lease_taken_over_between_heartbeats_is_caught_when_the_step_returns(tmp_path, monkeypatch):
    """No heartbeat runs while the step does (the interval is long), so only the final check
    before SUCCESS can see the takeover: the step must end lease_lost, never SUCCESS."""
    slow_heartbeats = LeaseConfig(heartbeat_interval=600, timeout=1200, poll_interval=0.05)
    executor = Executor(str(tmp_path), console=False, lease_config=slow_heartbeats)
    thief = LeaseRecord(worker="thief", heartbeat=time.time() + 3600)

    def taken_over_while_running(config):
        executor.store.write_atomic(lease_path(config.output_path), thief.to_bytes())

    # As if the step had outlived the heartbeat interval (only then can a lease be taken over
    # by another driver): the final check swaps from our bytes and finds the thief's.
    monkeypatch.setattr(LeaseManager, "_young", lambda self, written: False)

    step = ExecutorStep(
        "taken", taken_over_while_running, WriteConfig(output_path=this_output_path(), value=versioned(1))
    )
    with pytest.raises(ExecutorRunError, match="lease_lost"):
        executor.run([step])
    output = executor.plan.rows[0].output_path
    assert [e.status for e in read_status(executor.store, output)] == [Status.RUNNING]
    assert LeaseRecord.parse(executor.store.read_bytes(lease_path(output))).worker == "thief"
