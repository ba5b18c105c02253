"""Races on leases and compare-and-swap, forced to happen instead of hoped for.

Each test makes two callers read the same bytes before either writes, by making the
store's read (or swap) wait at a `threading.Barrier` (or a multiprocessing one). Where
the code under test serialises the callers (a lock, an flock), the second one never
reaches the barrier: the first one's wait times out and it carries on alone, so a
correct implementation costs one barrier timeout; a broken one loses the race every
time, not once in a thousand runs.

Only public behaviour is used: `Store.compare_and_swap`, and
`LeaseManager.try_acquire / refresh / release / was_lost`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import uuid

import pytest

from executor import LeaseConfig
from executor.lease import LeaseManager
from executor.store import LocalStore, open_store
from executor.tree import lease_path

BARRIER_TIMEOUT = 0.5
"""How long the first caller waits for a second one that a lock keeps out."""

PROCESS_BARRIER_TIMEOUT = 2.0
"""The same across processes (a forked child takes longer to get going than a thread)."""


def meet(barrier: threading.Barrier) -> None:
    """Wait for the other caller; alone (it is locked out), go on when the wait times out."""
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(timeout=BARRIER_TIMEOUT)


class Rendezvous:
    """The first two callers of `meet()` wait for each other; later callers pass straight on."""

    def __init__(self):
        self.barrier = threading.Barrier(2)
        self.arrivals = 0
        self.lock = threading.Lock()

    def meet(self) -> None:
        with self.lock:
            self.arrivals += 1
            armed = self.arrivals <= 2
        if armed:
            meet(self.barrier)


def race(*targets) -> list:
    """Run each target in its own thread; their return values (exceptions re-raised)."""
    results: list = [None] * len(targets)
    errors: list[BaseException] = []

    def run(index: int, target) -> None:
        try:
            results[index] = target()
        except BaseException as error:  # re-raised in the test thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), "a racing caller hung"
    if errors:
        raise errors[0]
    return results


@pytest.fixture(params=["local", "memory"])
def store_and_root(request, tmp_path):
    if request.param == "local":
        return open_store(str(tmp_path)), str(tmp_path)
    return open_store("memory://"), f"memory://races-{uuid.uuid4().hex}"


# -- compare-and-swap -------------------------------------------------------------------


def test_two_threads_swapping_from_the_same_bytes_have_exactly_one_winner(store_and_root, monkeypatch):
    store, root = store_and_root
    path = f"{root}/step/.executor_status.lock"
    store.write_atomic(path, b"old")
    barrier = threading.Barrier(2)
    real_read = store.read_bytes

    def read_then_meet(read_path):
        data = real_read(read_path)
        if read_path == path and data == b"old":
            meet(barrier)  # both have now seen b"old" -- unless a lock kept the other out
        return data

    monkeypatch.setattr(store, "read_bytes", read_then_meet)
    results = race(
        lambda: store.compare_and_swap(path, b"old", b"first"),
        lambda: store.compare_and_swap(path, b"old", b"second"),
    )
    monkeypatch.undo()
    assert sorted(results) == [False, True]
    assert store.read_bytes(path) == (b"first" if results[0] else b"second")


def test_two_threads_creating_the_same_file_have_exactly_one_winner(store_and_root, monkeypatch):
    store, root = store_and_root
    path = f"{root}/step/.executor_status.lock"
    barrier = threading.Barrier(2)
    real_read = store.read_bytes

    def read_then_meet(read_path):
        data = real_read(read_path)
        if read_path == path and data is None:
            meet(barrier)
        return data

    monkeypatch.setattr(store, "read_bytes", read_then_meet)
    results = race(
        lambda: store.compare_and_swap(path, None, b"first"),
        lambda: store.compare_and_swap(path, None, b"second"),
    )
    monkeypatch.undo()
    assert sorted(results) == [False, True]
    assert store.read_bytes(path) == (b"first" if results[0] else b"second")


def _swap_in_child(path: str, new: bytes, barrier, outcomes) -> None:
    store = LocalStore()
    real_read = store.read_bytes

    def read_then_meet(read_path):
        data = real_read(read_path)
        if read_path == path and data == b"old":
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=PROCESS_BARRIER_TIMEOUT)
        return data

    store.read_bytes = read_then_meet
    outcomes.put((new, store.compare_and_swap(path, b"old", new)))


def test_two_processes_swapping_from_the_same_bytes_have_exactly_one_winner(tmp_path):
    path = str(tmp_path / "step" / ".executor_status.lock")
    LocalStore().write_atomic(path, b"old")
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    outcomes = context.Queue()
    children = [
        context.Process(target=_swap_in_child, args=(path, new, barrier, outcomes)) for new in (b"a", b"b")
    ]
    for child in children:
        child.start()
    results = dict(outcomes.get(timeout=30) for _ in children)
    for child in children:
        child.join(timeout=30)
    assert sorted(results.values()) == [False, True]
    winner = next(new for new, won in results.items() if won)
    assert LocalStore().read_bytes(path) == winner


# -- leases ----------------------------------------------------------------------------


QUIET = LeaseConfig(heartbeat_interval=30.0, timeout=60.0, poll_interval=0.05)
"""No heartbeat fires during a test unless the test calls refresh itself."""


def swaps_meet(store, monkeypatch) -> Rendezvous:
    """Make the first two lease swaps (from existing bytes) wait for each other."""
    rendezvous = Rendezvous()
    real_swap = store.compare_and_swap

    def swap_after_meeting(path, expected, new):
        if path.endswith(".executor_status.lock") and expected is not None:
            rendezvous.meet()
        return real_swap(path, expected, new)

    monkeypatch.setattr(store, "compare_and_swap", swap_after_meeting)
    return rendezvous


def test_a_heartbeat_racing_a_worker_refresh_does_not_lose_the_lease(store_and_root, monkeypatch):
    store, root = store_and_root
    output = f"{root}/step-abc"
    leases = LeaseManager(store, QUIET, "worker-1")
    try:
        assert leases.try_acquire(output).acquired
        swaps_meet(store, monkeypatch)
        # Two refreshes of one lease at once (the heartbeat thread's and the worker's
        # final one): each would swap from the bytes it last wrote.
        results = race(lambda: leases.refresh(output), lambda: leases.refresh(output))
        monkeypatch.undo()
        assert results == [True, True]
        assert not leases.was_lost(output)
        assert leases.holds(output)
        assert leases.refresh(output)  # and the lease is still ours afterwards
        leases.release(output)
        assert store.read_bytes(lease_path(output)) is None
    finally:
        leases.close()


def test_the_real_heartbeat_thread_racing_a_worker_refresh_does_not_lose_the_lease(
    store_and_root, monkeypatch
):
    store, root = store_and_root
    output = f"{root}/step-abc"
    lost: list[str] = []
    config = LeaseConfig(heartbeat_interval=0.02, timeout=60.0, poll_interval=0.05)
    leases = LeaseManager(store, config, "worker-1", on_lost=lost.append)
    rendezvous = Rendezvous()
    heartbeat_swapped = threading.Event()
    real_swap = store.compare_and_swap

    def swap_after_meeting(path, expected, new):
        if path.endswith(".executor_status.lock") and expected is not None and new is not None:
            if threading.current_thread() is not threading.main_thread():
                heartbeat_swapped.set()
            rendezvous.meet()
        return real_swap(path, expected, new)

    try:
        assert leases.try_acquire(output).acquired
        monkeypatch.setattr(store, "compare_and_swap", swap_after_meeting)
        # The heartbeat thread (every 20 ms) and this refresh meet at the swap: both would
        # swap from the bytes last written unless refreshes are serialised.
        refreshed = leases.refresh(output)
        assert heartbeat_swapped.wait(timeout=10)
        assert leases.refresh(output)
        monkeypatch.undo()
        assert refreshed
        assert not leases.was_lost(output)
        assert lost == []
    finally:
        leases.close()


def test_a_release_racing_a_heartbeat_leaves_no_lease_and_reports_no_loss(store_and_root, monkeypatch):
    store, root = store_and_root
    output = f"{root}/step-abc"
    lost: list[str] = []
    leases = LeaseManager(store, QUIET, "worker-1", on_lost=lost.append)
    try:
        assert leases.try_acquire(output).acquired
        swaps_meet(store, monkeypatch)
        race(lambda: leases.refresh(output), lambda: leases.release(output))
        monkeypatch.undo()
        assert store.read_bytes(lease_path(output)) is None
        assert not leases.holds(output)
        assert lost == []
    finally:
        leases.close()


def test_a_young_release_during_a_keeper_swap_leaves_no_lease_behind(store_and_root, monkeypatch):
    """The keeper (another process, here a thread) starts its first heartbeat swap just as
    the driver releases the lease, judged young a moment before. The swap has read our bytes
    and is about to write: a delete that does not wait for it lets the swap's write make the
    lease again, in an output the run has finished with (CI saw a tree that could not be
    removed right after a run). The release must wait for the swap and delete after it."""
    store, root = store_and_root
    output = f"{root}/step-abc"
    path = lease_path(output)
    leases = LeaseManager(store, QUIET, "worker-1")
    try:
        assert leases.try_acquire(output).acquired
        mine = store.read_bytes(path)
        swap_has_read, released = threading.Event(), threading.Event()
        real_read = store.read_bytes

        def read_then_wait_for_the_release(read_path):
            data = real_read(read_path)
            if threading.current_thread().name == "keeper" and read_path == path:
                swap_has_read.set()
                released.wait(timeout=BARRIER_TIMEOUT)  # a release that waits for us never comes
            return data

        monkeypatch.setattr(store, "read_bytes", read_then_wait_for_the_release)
        swapped: list[bool] = []
        keeper = threading.Thread(
            target=lambda: swapped.append(store.compare_and_swap(path, mine, mine + b" ")), name="keeper"
        )
        keeper.start()
        assert swap_has_read.wait(timeout=10)

        def release() -> None:
            leases.release(output)
            released.set()

        race(release)
        keeper.join(timeout=30)
        monkeypatch.undo()
        assert swapped == [True]  # the swap went through, before the delete
        assert store.read_bytes(path) is None
        assert not leases.holds(output)
    finally:
        leases.close()


def test_two_drivers_racing_for_a_free_lease_one_wins(store_and_root, monkeypatch):
    store, root = store_and_root
    output = f"{root}/step-abc"
    first, second = LeaseManager(store, QUIET, "driver-1"), LeaseManager(store, QUIET, "driver-2")
    rendezvous = Rendezvous()
    real_read = store.read_bytes

    def read_then_meet(read_path):
        data = real_read(read_path)
        if read_path == lease_path(output):
            rendezvous.meet()
        return data

    try:
        monkeypatch.setattr(store, "read_bytes", read_then_meet)
        results = race(lambda: first.try_acquire(output), lambda: second.try_acquire(output))
        monkeypatch.undo()
        assert sorted(result.acquired for result in results) == [False, True]
        winner, loser = (first, second) if results[0].acquired else (second, first)
        assert winner.holds(output) and not loser.holds(output)
        loser_result = results[1] if results[0].acquired else results[0]
        assert loser_result.holder is not None and loser_result.holder.worker == winner.worker_id
    finally:
        first.close()
        second.close()


def test_a_lease_taken_over_is_reported_lost_exactly_once(store_and_root):
    store, root = store_and_root
    output = f"{root}/step-abc"
    lost: list[str] = []
    leases = LeaseManager(store, QUIET, "worker-1", on_lost=lost.append)
    try:
        assert leases.try_acquire(output).acquired
        store.write_atomic(lease_path(output), b"someone else's lease")
        assert not leases.refresh(output)
        assert not leases.refresh(output)
        assert leases.was_lost(output)
        assert not leases.holds(output)
        assert lost == [output]
        leases.release(output)  # not ours: left alone
        assert store.read_bytes(lease_path(output)) == b"someone else's lease"
    finally:
        leases.close()
