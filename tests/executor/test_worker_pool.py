"""The runner's worker threads: started only as steps wait for one.

A fan-in of steps that each finish in a fraction of a millisecond ran on 32 threads that
handed the GIL to each other on every system call: twice the time of the same run on one
thread. Workers now start when a step is queued and no worker has taken one for
`WORKER_START_DELAY_S`; steps that block (I/O, a process, a barrier) still get a thread each.
"""

from __future__ import annotations

import threading
import time

import executor.runner as runner_module
from executor import Executor, ExecutorStep, LeaseConfig, this_output_path, versioned
from executor.events import StepSucceeded
from tests.executor.steps_for_tests import WriteConfig

QUIET = LeaseConfig(heartbeat_interval=5.0, timeout=60.0, poll_interval=0.02, heartbeat_process=False)


def step(name, fn, value=0):
    return ExecutorStep(
        name=name,
        fn=fn,
        config=WriteConfig(output_path=this_output_path(), value=versioned(value), inputs=[], key=name),
    )


def test_quick_steps_ready_together_run_on_one_thread_while_none_waits(tmp_path, monkeypatch):
    # No queued step waits 30 s, so no second worker starts: 60 ready steps share one thread.
    monkeypatch.setattr(runner_module, "WORKER_START_DELAY_S", 30.0)
    threads = []

    def record(config):
        threads.append(threading.get_ident())

    executor = Executor(str(tmp_path), console=False, lease_config=QUIET)
    executor.run([step(f"s{i}", record, i) for i in range(60)])
    assert len(threads) == 60
    assert len(set(threads)) == 1
    assert len([e for e in executor.events if isinstance(e, StepSucceeded)]) == 60


def test_a_step_queued_behind_a_blocked_one_gets_a_thread_after_the_delay(tmp_path, monkeypatch):
    # a blocks until b has run; b can only run on a second worker, which starts once b has
    # waited WORKER_START_DELAY_S -- not before.
    monkeypatch.setattr(runner_module, "WORKER_START_DELAY_S", 0.3)
    started: dict[str, float] = {}
    b_ran = threading.Event()

    def a_fn(config):
        started["a"] = time.monotonic()
        assert b_ran.wait(20), "b never ran while a blocked"

    def b_fn(config):
        started["b"] = time.monotonic()
        b_ran.set()

    executor = Executor(str(tmp_path), console=False, lease_config=QUIET)
    executor.run([step("a", a_fn, 1), step("b", b_fn, 2)])
    assert b_ran.is_set()
    assert started["b"] - started["a"] >= 0.25
    assert sorted(e.name for e in executor.events if isinstance(e, StepSucceeded)) == ["a", "b"]


def test_blocked_steps_each_get_a_thread_up_to_max_concurrent(tmp_path):
    # Six steps that meet at a barrier: all six must be running at once (six workers).
    meeting = threading.Barrier(6, timeout=20)
    threads = set()

    def meet(config):
        threads.add(threading.get_ident())
        meeting.wait()

    executor = Executor(str(tmp_path), console=False, lease_config=QUIET)
    executor.run([step(f"m{i}", meet, i) for i in range(6)], max_concurrent=6)
    assert len(threads) == 6


def threads_of_naps(tmp_path, count: int, seconds: float) -> list[int]:
    """The thread each of `count` independent steps ran on, each sleeping `seconds`."""
    threads = []

    def nap(config):
        threads.append(threading.get_ident())
        time.sleep(seconds)

    Executor(str(tmp_path), console=False, lease_config=QUIET).run(
        [step(f"n{i:02d}", nap, i) for i in range(count)]
    )
    assert len(threads) == count
    return threads


def test_steps_are_queued_only_just_ahead_of_the_workers(tmp_path, monkeypatch):
    # Twenty 50 ms steps on one worker: each queued step waits for at most the few before it
    # (QUEUE_AHEAD), and a worker takes one every ~50 ms, far less than the 0.5 s that starts
    # a second worker. Had all twenty been queued at once, the later ones would wait ~1 s.
    monkeypatch.setattr(runner_module, "WORKER_START_DELAY_S", 0.5)
    assert len(set(threads_of_naps(tmp_path, 20, 0.05))) == 1


def test_the_main_thread_queues_no_more_than_queue_ahead_beyond_its_idle_workers(tmp_path, monkeypatch):
    # One worker (no second one starts within the test), held by the first step for 0.3 s:
    # meanwhile the main thread queues QUEUE_AHEAD of the 20 other ready steps and keeps the
    # rest, to choose among when a worker is free. (The test above no longer tells: with the
    # start rule counting from the last step a worker took, a long queue starts no thread.)
    monkeypatch.setattr(runner_module, "WORKER_START_DELAY_S", 30.0)
    dispatched, seen = [], []
    dispatch = runner_module.Runner._dispatch

    def counting_dispatch(self, row):
        dispatched.append(row.name)
        dispatch(self, row)

    monkeypatch.setattr(runner_module.Runner, "_dispatch", counting_dispatch)

    def holds(config):
        time.sleep(0.3)
        seen.append(len(dispatched))

    steps = [step("a-first", holds)] + [step(f"q{i:02d}", lambda config: None, i) for i in range(20)]
    Executor(str(tmp_path), console=False, lease_config=QUIET).run(steps)
    assert len(dispatched) == 21
    # The held step, and at most QUEUE_AHEAD queued behind it (not all 20: had the main thread
    # queued every ready step, it would have done so within milliseconds).
    assert len(seen) == 1 and seen[0] <= 1 + runner_module.QUEUE_AHEAD, seen


def test_steps_queued_behind_quick_steps_get_no_thread_of_their_own(tmp_path, monkeypatch):
    # Sixty 10 ms steps queued at once: the last waits ~0.6 s, longer than the 0.2 s that
    # starts a worker for a step waiting behind a blocked one. But a worker takes a step every
    # ~10 ms, so none is blocked, and one thread runs them all.
    monkeypatch.setattr(runner_module, "WORKER_START_DELAY_S", 0.2)
    monkeypatch.setattr(runner_module, "QUEUE_AHEAD", 60)
    assert len(set(threads_of_naps(tmp_path, 60, 0.01))) == 1


def test_a_slow_lease_keeper_start_does_not_start_a_thread_per_waiting_step(tmp_path, monkeypatch):
    # The lease keeper (a process) takes ~0.1 s to come up. The run waits for it before the
    # first step, not inside the first step's worker: there, the wait made every step queued
    # behind it look starved, and the runner started a thread for each (then 40 threads
    # shared quick steps, passing the GIL back and forth). Here the keeper takes 0.3 s.
    import executor.lease_keeper as lease_keeper

    monkeypatch.setattr(lease_keeper, "_KEEPERS", {})  # a keeper of this test's own
    real_await = lease_keeper.LeaseKeeper._await_ready

    def slow_await(self):
        if not self._ready:
            time.sleep(0.3)
        real_await(self)

    monkeypatch.setattr(lease_keeper.LeaseKeeper, "_await_ready", slow_await)
    threads = []

    def record(config):
        threads.append(threading.get_ident())

    executor = Executor(str(tmp_path), console=False, lease_config=LeaseConfig(heartbeat_process=True))
    try:
        executor.run([step(f"q{i}", record, i) for i in range(40)])
    finally:
        for keeper in lease_keeper._KEEPERS.values():
            keeper.close()
    assert len(threads) == 40
    assert len(set(threads)) <= 2  # (a second one only if a step waited 5 ms on a busy machine)
