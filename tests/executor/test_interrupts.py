"""`executor.interrupts`: what a step's thread waits on is stopped when the run is interrupted.

The end-to-end check (a data step's shard workers end before its lease is released) is
`tests/operations/test_shards.py::test_an_interrupted_run_ends_a_data_steps_workers_before_it_releases_the_lease`.
"""

from __future__ import annotations

import logging
import threading

from executor.interrupts import stop_on_interrupt, stop_running_work


def test_a_stopper_is_called_only_while_its_block_runs():
    calls = []
    assert stop_running_work() == 0
    with stop_on_interrupt(lambda: calls.append("stopped")):
        assert stop_running_work() == 1
    assert stop_running_work() == 0
    assert calls == ["stopped"]


def test_a_failing_stopper_is_logged_and_the_others_still_run(caplog):
    calls = []

    def broken():
        raise OSError("no such process")

    with (
        stop_on_interrupt(lambda: calls.append("first")),
        stop_on_interrupt(broken),
        stop_on_interrupt(lambda: calls.append("third")),
        caplog.at_level(logging.ERROR, logger="executor.interrupts"),
    ):
        assert stop_running_work() == 3
    assert calls == ["first", "third"]
    assert "could not stop a step's work on interrupt: OSError: no such process" in caplog.text


def test_stoppers_registered_from_other_threads_are_all_called():
    """Steps run in worker threads; the interrupt comes from the main thread."""
    registered, release, calls = threading.Barrier(4), threading.Event(), []

    def step(name: str) -> None:
        with stop_on_interrupt(lambda: calls.append(name)):
            registered.wait()
            release.wait()

    threads = [threading.Thread(target=step, args=(f"step-{n}",)) for n in range(3)]
    for thread in threads:
        thread.start()
    registered.wait()
    try:
        assert stop_running_work() == 3
    finally:
        release.set()
        for thread in threads:
            thread.join()
    assert sorted(calls) == ["step-0", "step-1", "step-2"]
    assert stop_running_work() == 0
