"""Leases, pinned where mutation testing found no test: config validation and its messages,
what a lease file records, staleness at the boundary, confirm's and release's young-lease
fast paths, and the
heartbeat thread surviving a storage error.

Everything goes through `LeaseConfig`, `LeaseManager`, `read_lease` / `lease_is_stale` and
the lease file itself.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time

import pytest

from executor import LeaseConfig
from executor.lease import LeaseManager, lease_is_stale, new_worker_id, read_lease
from executor.store import open_store
from executor.tree import LeaseRecord, lease_path

# Heartbeats far apart: nothing rewrites a lease behind a test's back.
QUIET = LeaseConfig(heartbeat_interval=5.0, timeout=10.0, poll_interval=0.05)
FAST = LeaseConfig(heartbeat_interval=0.05, timeout=0.3, poll_interval=0.05)


def wait_for(predicate, timeout=5.0, interval=0.01):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "prefix")


def lease_bytes(store, output):
    return store.read_bytes(lease_path(output))


def age(manager, output, seconds):
    """As if `manager` had last written its lease on `output` `seconds` earlier."""
    manager._written[output] -= seconds


# -- LeaseConfig -----------------------------------------------------------------------


def test_lease_config_defaults_are_ten_sixty_and_five_seconds():
    config = LeaseConfig()
    assert (config.heartbeat_interval, config.timeout, config.poll_interval) == (10.0, 60.0, 5.0)


@pytest.mark.parametrize("field", ["heartbeat_interval", "timeout", "poll_interval"])
@pytest.mark.parametrize("value", [0, -1.0, math.inf, math.nan, True, "5"])
def test_lease_config_rejects_non_positive_or_non_numeric_seconds_naming_the_field(field, value):
    values = {"heartbeat_interval": 1.0, "timeout": 2.0, "poll_interval": 1.0, field: value}
    with pytest.raises(ValueError) as raised:
        LeaseConfig(**values)
    assert str(raised.value) == f"{field} must be a positive number of seconds, got {value!r}"


def test_lease_config_accepts_small_positive_intervals():
    config = LeaseConfig(heartbeat_interval=0.01, timeout=0.02, poll_interval=0.001)
    assert config.timeout == 0.02


def test_a_heartbeat_equal_to_the_timeout_is_refused_with_both_values():
    # `>=`, not `>`: a lease refreshed exactly every `timeout` would look stale between beats.
    with pytest.raises(ValueError) as raised:
        LeaseConfig(heartbeat_interval=2.5, timeout=2.5)
    assert str(raised.value) == (
        "heartbeat_interval (2.5s) must be smaller than timeout (2.5s): the lease is refreshed every "
        "heartbeat and taken over by another driver once the timeout passes without one"
    )


def test_a_heartbeat_just_below_the_timeout_is_accepted():
    assert LeaseConfig(heartbeat_interval=2.4, timeout=2.5).heartbeat_interval == 2.4


def test_from_env_reads_each_variable():
    environ = {"MARIN_LEASE_TIMEOUT": "30", "MARIN_LEASE_HEARTBEAT": "3", "MARIN_LEASE_POLL": "0.25"}
    assert LeaseConfig.from_env(environ) == LeaseConfig(
        timeout=30.0, heartbeat_interval=3.0, poll_interval=0.25
    )


def test_from_env_without_variables_gives_the_defaults():
    assert LeaseConfig.from_env({}) == LeaseConfig()


def test_from_env_reads_the_process_environment_when_none_is_given(monkeypatch):
    monkeypatch.setenv("MARIN_LEASE_POLL", "0.5")
    monkeypatch.delenv("MARIN_LEASE_TIMEOUT", raising=False)
    monkeypatch.delenv("MARIN_LEASE_HEARTBEAT", raising=False)
    assert LeaseConfig.from_env().poll_interval == 0.5


def test_from_env_treats_a_blank_variable_as_unset():
    assert LeaseConfig.from_env({"MARIN_LEASE_TIMEOUT": "   "}).timeout == 60.0


def test_given_values_win_over_the_environment():
    config = LeaseConfig.from_env({"MARIN_LEASE_TIMEOUT": "3600", "MARIN_LEASE_POLL": "1"}, timeout=20.0)
    assert config.timeout == 20.0 and config.poll_interval == 1.0


def test_a_given_none_falls_back_to_the_environment():
    assert LeaseConfig.from_env({"MARIN_LEASE_TIMEOUT": "90"}, timeout=None).timeout == 90.0


def test_from_env_names_a_variable_that_is_not_a_number():
    with pytest.raises(ValueError) as raised:
        LeaseConfig.from_env({"MARIN_LEASE_HEARTBEAT": "soon"})
    assert str(raised.value) == "MARIN_LEASE_HEARTBEAT='soon' is not a number of seconds"
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_from_env_names_the_variable_holding_a_bad_value():
    with pytest.raises(ValueError) as raised:
        LeaseConfig.from_env({"MARIN_LEASE_TIMEOUT": "-4"})
    assert str(raised.value) == "MARIN_LEASE_TIMEOUT must be a positive number of seconds, got -4.0"


def test_from_env_names_the_flag_a_given_value_came_from():
    with pytest.raises(ValueError) as raised:
        LeaseConfig.from_env({}, sources={"poll_interval": "--lease_poll"}, poll_interval=0.0)
    assert str(raised.value) == "--lease_poll must be a positive number of seconds, got 0.0"


def test_a_given_value_without_a_source_is_named_by_its_field():
    with pytest.raises(ValueError) as raised:
        LeaseConfig.from_env({}, poll_interval=-1.0)
    assert str(raised.value) == "poll_interval must be a positive number of seconds, got -1.0"


def test_a_heartbeat_above_the_default_timeout_names_the_default_by_its_flag():
    with pytest.raises(ValueError) as raised:
        LeaseConfig.from_env(
            {},
            sources={"heartbeat_interval": "--lease_heartbeat", "timeout": "--lease_timeout"},
            heartbeat_interval=100.0,
        )
    assert str(raised.value).startswith(
        "--lease_heartbeat (100s) must be smaller than the default --lease_timeout (60s)"
    )


def test_a_default_heartbeat_above_a_given_timeout_is_named_as_the_default():
    with pytest.raises(ValueError) as raised:
        LeaseConfig.from_env({}, timeout=5.0)
    assert str(raised.value).startswith(
        "the default heartbeat_interval (10s) must be smaller than timeout (5s)"
    )


def test_from_env_refuses_unknown_settings_listing_them_sorted():
    with pytest.raises(TypeError) as raised:
        LeaseConfig.from_env({}, zeta=1.0, alpha=2.0)
    assert str(raised.value) == "LeaseConfig.from_env: unknown settings ['alpha', 'zeta']"


# -- worker ids, lease records, staleness ------------------------------------------------


def test_worker_ids_name_host_and_pid_and_differ_per_driver():
    first, second = new_worker_id(), new_worker_id()
    assert first != second
    host, pid, suffix = first.rsplit(":", 2)
    assert host == os.uname().nodename and pid == str(os.getpid())
    assert re.fullmatch("[0-9a-f]{8}", suffix)


def test_a_new_lease_is_marins_worker_id_and_timestamp(root):
    store = open_store(root)
    manager = LeaseManager(store, QUIET, "w1")
    before = time.time()
    try:
        result = manager.try_acquire(f"{root}/s")
        after = time.time()
        assert result.acquired and result.holder is None  # nothing taken over
        record = read_lease(store, f"{root}/s")
        assert json.loads(store.read_bytes(lease_path(f"{root}/s"))).keys() == {"worker_id", "timestamp"}
        assert record.worker == "w1"
        assert before <= record.heartbeat <= after
        assert manager.read(f"{root}/s") == record
    finally:
        manager.close()


def test_a_refresh_moves_the_heartbeat_and_keeps_the_holder(root):
    store = open_store(root)
    manager = LeaseManager(store, QUIET, "w1")
    try:
        manager.try_acquire(f"{root}/s")
        first = read_lease(store, f"{root}/s")
        time.sleep(0.01)
        assert manager.refresh(f"{root}/s") is True
        second = read_lease(store, f"{root}/s")
        assert second.heartbeat > first.heartbeat
        assert second.worker == "w1"
        assert manager.holds(f"{root}/s") and not manager.was_lost(f"{root}/s")
    finally:
        manager.close()


def test_refreshing_a_lease_not_held_is_false_and_writes_nothing(root):
    store = open_store(root)
    manager = LeaseManager(store, QUIET, "w1")
    assert manager.refresh(f"{root}/s") is False
    assert lease_bytes(store, f"{root}/s") is None
    assert not manager.was_lost(f"{root}/s")


def test_read_lease_of_an_absent_or_unreadable_lease_is_none(root):
    store = open_store(root)
    assert read_lease(store, f"{root}/s") is None
    store.write_atomic(lease_path(f"{root}/s"), b"{not json")
    assert read_lease(store, f"{root}/s") is None


def test_staleness_is_strictly_older_than_the_timeout():
    record = LeaseRecord(worker="w", heartbeat=1000.0)
    assert lease_is_stale(None, 10.0, now=1000.0)
    assert not lease_is_stale(record, 10.0, now=1010.0)  # exactly `timeout` old: still held
    assert lease_is_stale(record, 10.0, now=1010.5)
    assert not lease_is_stale(record, 10.0, now=1005.0)


def test_staleness_without_now_uses_the_clock():
    assert not lease_is_stale(LeaseRecord(worker="w", heartbeat=time.time()), 10.0)
    assert lease_is_stale(LeaseRecord(worker="w", heartbeat=time.time() - 11), 10.0)


def test_the_manager_judges_staleness_by_its_configured_timeout_at_the_given_time(root):
    manager = LeaseManager(open_store(root), QUIET, "w1")  # timeout 10 s
    record = LeaseRecord(worker="w", heartbeat=1000.0)
    assert not manager.is_stale(record, now=1009.0)  # (by the clock it is decades old)
    assert manager.is_stale(record, now=1011.0)
    assert manager.is_stale(LeaseRecord(worker="w", heartbeat=time.time() - 11))
    assert not manager.is_stale(LeaseRecord(worker="w", heartbeat=time.time() - 9))
    assert manager.is_stale(None)


# -- acquiring -------------------------------------------------------------------------


def test_an_unreadable_lease_file_is_taken_over(root):
    # A lease that cannot be parsed is treated like an expired one, not like a live holder.
    store = open_store(root)
    store.write_atomic(lease_path(f"{root}/s"), b"garbage")
    manager = LeaseManager(store, QUIET, "w1")
    try:
        result = manager.try_acquire(f"{root}/s")
        assert result.acquired and result.holder is None
        assert read_lease(store, f"{root}/s").worker == "w1"
    finally:
        manager.close()


def test_taking_over_a_stale_lease_logs_who_held_it(root, caplog):
    store = open_store(root)
    stale = LeaseRecord(worker="dead-driver", heartbeat=time.time() - 100)
    store.write_atomic(lease_path(f"{root}/s"), stale.to_bytes())
    manager = LeaseManager(store, QUIET, "w1")
    try:
        with caplog.at_level(logging.WARNING, logger="executor.lease"):
            result = manager.try_acquire(f"{root}/s")
        assert result.acquired and result.holder == stale
        fresh = read_lease(store, f"{root}/s")
        assert fresh.worker == "w1" and fresh.heartbeat > stale.heartbeat  # a fresh lease, ours
        messages = [r.getMessage() for r in caplog.records if r.name == "executor.lease"]
        assert len(messages) == 1
        assert re.fullmatch(
            rf"took over the stale lease on {re.escape(root)}/s from dead-driver \(last heartbeat 10\ds ago\)",
            messages[0],
        )
    finally:
        manager.close()


def test_a_fresh_acquire_logs_nothing(root, caplog):
    manager = LeaseManager(open_store(root), QUIET, "w1")
    try:
        with caplog.at_level(logging.DEBUG, logger="executor.lease"):
            manager.try_acquire(f"{root}/s")
        assert [r for r in caplog.records if r.name == "executor.lease"] == []
    finally:
        manager.close()


def test_a_live_holder_is_reported_without_touching_its_lease(root):
    store = open_store(root)
    holder = LeaseManager(store, QUIET, "w1")
    other = LeaseManager(store, QUIET, "w2")
    try:
        holder.try_acquire(f"{root}/s")
        before = lease_bytes(store, f"{root}/s")
        result = other.try_acquire(f"{root}/s")
        assert not result.acquired and result.holder == LeaseRecord.parse(before)
        assert lease_bytes(store, f"{root}/s") == before
        assert not other.holds(f"{root}/s") and holder.holds(f"{root}/s")
    finally:
        holder.close()
        other.close()


def test_a_driver_that_keeps_losing_the_swap_gives_up_and_names_the_current_holder(root):
    # Another driver changes the file between every read and swap: try_acquire must stop
    # after a few tries (not spin forever) and report whoever holds the lease then.
    store = open_store(root)
    current = LeaseRecord(worker="busy", heartbeat=time.time() - 100)
    store.write_atomic(lease_path(f"{root}/s"), current.to_bytes())
    swaps = []
    real_swap = store.compare_and_swap

    def losing_swap(path, expected, new):
        swaps.append(path)
        return False

    store.compare_and_swap = losing_swap
    manager = LeaseManager(store, QUIET, "w1")
    try:
        result = manager.try_acquire(f"{root}/s")
        assert not result.acquired and result.holder == current
        assert swaps == [lease_path(f"{root}/s")] * 5
        assert not manager.holds(f"{root}/s")
    finally:
        store.compare_and_swap = real_swap
        manager.close()


def test_a_lease_lost_then_acquired_again_is_no_longer_lost(root):
    store = open_store(root)
    lost = []
    manager = LeaseManager(store, QUIET, "w1", on_lost=lost.append)
    try:
        manager.try_acquire(f"{root}/s")
        thief = LeaseRecord(worker="thief", heartbeat=time.time() - 100)
        store.write_atomic(lease_path(f"{root}/s"), thief.to_bytes())
        assert manager.refresh(f"{root}/s") is False
        assert lost == [f"{root}/s"] and manager.was_lost(f"{root}/s") and not manager.holds(f"{root}/s")
        assert manager.try_acquire(f"{root}/s").acquired  # the thief's lease has gone stale
        assert not manager.was_lost(f"{root}/s") and manager.holds(f"{root}/s")
        assert manager.confirm(f"{root}/s")
    finally:
        manager.close()


# -- confirm -----------------------------------------------------------------------------


def test_confirming_a_young_lease_rewrites_nothing(root):
    # A step shorter than the heartbeat interval writes its lease once (module docstring).
    store = open_store(root)
    manager = LeaseManager(store, QUIET, "w1")
    try:
        manager.try_acquire(f"{root}/s")
        before = lease_bytes(store, f"{root}/s")
        time.sleep(0.01)
        assert manager.confirm(f"{root}/s") is True
        assert lease_bytes(store, f"{root}/s") == before
    finally:
        manager.close()


def test_a_lease_just_short_of_the_heartbeat_interval_is_young_and_one_at_it_is_not(root):
    store = open_store(root)
    manager = LeaseManager(store, QUIET, "w1")
    manager.try_acquire(f"{root}/s")
    manager.close()
    now = time.monotonic()
    assert manager._young(now - QUIET.heartbeat_interval + 0.5)
    assert not manager._young(now - QUIET.heartbeat_interval)
    assert not manager._young(-math.inf)  # never written


def test_the_age_of_a_lease_is_taken_from_before_its_write(root, monkeypatch):
    """A slow write must not make the lease look younger than the heartbeat it carries."""
    store = open_store(root)
    manager = LeaseManager(store, QUIET, "w1")
    real_swap = store.compare_and_swap
    sampled = []

    def slow_swap(path, expected, new):
        sampled.append(time.monotonic())
        return real_swap(path, expected, new)

    store.compare_and_swap = slow_swap
    before = time.monotonic()
    manager.try_acquire(f"{root}/s")
    manager.close()
    assert before <= manager._written[f"{root}/s"] <= sampled[0]
    manager.refresh(f"{root}/s")
    assert sampled[0] <= manager._written[f"{root}/s"] <= sampled[1]


def test_confirming_a_lease_older_than_the_heartbeat_rewrites_it_first(root):
    store = open_store(root)
    config = LeaseConfig(heartbeat_interval=0.05, timeout=10.0, poll_interval=0.05)
    manager = LeaseManager(store, config, "w1")
    manager.try_acquire(f"{root}/s")
    manager.close()  # no heartbeat thread: only confirm may rewrite the lease
    before = read_lease(store, f"{root}/s")
    time.sleep(0.06)
    assert manager.confirm(f"{root}/s") is True
    after = read_lease(store, f"{root}/s")
    assert after.heartbeat > before.heartbeat and after.worker == before.worker
    # ... and that rewrite counts as the last write: an immediate second confirm only reads.
    assert manager.confirm(f"{root}/s") is True
    assert read_lease(store, f"{root}/s") == after


def test_confirm_finds_a_lease_taken_over_and_reports_it_lost_once(root):
    store = open_store(root)
    lost = []
    manager = LeaseManager(store, QUIET, "w1", on_lost=lost.append)
    try:
        manager.try_acquire(f"{root}/s")
        thief = LeaseRecord(worker="thief", heartbeat=time.time()).to_bytes()
        store.write_atomic(lease_path(f"{root}/s"), thief)
        age(manager, f"{root}/s", QUIET.heartbeat_interval)
        assert manager.confirm(f"{root}/s") is False
        assert lost == [f"{root}/s"]
        assert manager.was_lost(f"{root}/s") and not manager.holds(f"{root}/s")
        assert manager.confirm(f"{root}/s") is False  # not held any more
        assert lost == [f"{root}/s"]
        assert lease_bytes(store, f"{root}/s") == thief
    finally:
        manager.close()


def test_confirming_a_lease_never_held_is_false_and_not_a_loss(root):
    lost = []
    manager = LeaseManager(open_store(root), QUIET, "w1", on_lost=lost.append)
    assert manager.confirm(f"{root}/s") is False
    assert lost == [] and not manager.was_lost(f"{root}/s")


def test_losing_a_lease_logs_an_error_naming_it(root, caplog):
    store = open_store(root)
    manager = LeaseManager(store, QUIET, "w1")
    try:
        manager.try_acquire(f"{root}/s")
        thief = LeaseRecord(worker="thief", heartbeat=time.time()).to_bytes()
        store.write_atomic(lease_path(f"{root}/s"), thief)
        age(manager, f"{root}/s", QUIET.heartbeat_interval)
        with caplog.at_level(logging.ERROR, logger="executor.lease"):
            manager.confirm(f"{root}/s")
        assert [r.getMessage() for r in caplog.records if r.name == "executor.lease"] == [
            f"lost the lease on {root}/s: another driver took it over"
        ]
    finally:
        manager.close()


# -- release -----------------------------------------------------------------------------


def test_releasing_a_young_lease_deletes_it_without_reading_or_swapping(root):
    store = open_store(root)
    manager = LeaseManager(store, QUIET, "w1")
    manager.try_acquire(f"{root}/s")
    manager.close()
    calls = []
    store.read_bytes = lambda path: calls.append(("read", path))
    store.compare_and_swap = lambda *args: calls.append(("swap", args))
    real_delete = store.delete
    store.delete = lambda path: (calls.append(("delete", path)), real_delete(path))
    manager.release(f"{root}/s")
    assert calls == [("delete", lease_path(f"{root}/s"))]
    del store.read_bytes, store.compare_and_swap, store.delete
    assert lease_bytes(store, f"{root}/s") is None and not manager.holds(f"{root}/s")


def test_releasing_an_old_lease_swaps_it_away_from_our_bytes(root):
    store = open_store(root)
    manager = LeaseManager(store, QUIET, "w1")
    manager.try_acquire(f"{root}/s")
    manager.close()
    mine = lease_bytes(store, f"{root}/s")
    age(manager, f"{root}/s", QUIET.heartbeat_interval)
    swaps = []
    real_swap = store.compare_and_swap
    store.compare_and_swap = lambda path, expected, new: (
        swaps.append((path, expected, new)),
        real_swap(path, expected, new),
    )[1]
    manager.release(f"{root}/s")
    assert swaps == [(lease_path(f"{root}/s"), mine, None)]
    assert lease_bytes(store, f"{root}/s") is None


def test_release_deletes_our_lease_and_forgets_it(root, caplog):
    store = open_store(root)
    manager = LeaseManager(store, QUIET, "w1")
    try:
        manager.try_acquire(f"{root}/s")
        with caplog.at_level(logging.WARNING, logger="executor.lease"):
            manager.release(f"{root}/s")
        assert lease_bytes(store, f"{root}/s") is None
        assert not manager.holds(f"{root}/s") and not manager.was_lost(f"{root}/s")
        assert manager.confirm(f"{root}/s") is False
        assert [r for r in caplog.records if r.name == "executor.lease"] == []
    finally:
        manager.close()


def test_releasing_a_lease_taken_over_warns_and_leaves_the_new_holders_lease(root, caplog):
    store = open_store(root)
    manager = LeaseManager(store, QUIET, "w1")
    try:
        manager.try_acquire(f"{root}/s")
        thief = LeaseRecord(worker="thief", heartbeat=time.time()).to_bytes()
        store.write_atomic(lease_path(f"{root}/s"), thief)
        age(manager, f"{root}/s", QUIET.heartbeat_interval)
        with caplog.at_level(logging.WARNING, logger="executor.lease"):
            manager.release(f"{root}/s")
        assert lease_bytes(store, f"{root}/s") == thief
        assert [r.getMessage() for r in caplog.records if r.name == "executor.lease"] == [
            f"lease on {root}/s was no longer ours at release"
        ]
    finally:
        manager.close()


def test_releasing_a_lease_never_held_touches_nothing(root, caplog):
    store = open_store(root)
    other = LeaseRecord(worker="other", heartbeat=time.time()).to_bytes()
    store.write_atomic(lease_path(f"{root}/s"), other)
    manager = LeaseManager(store, QUIET, "w1")
    with caplog.at_level(logging.WARNING, logger="executor.lease"):
        manager.release(f"{root}/s")
    assert lease_bytes(store, f"{root}/s") == other
    assert [r for r in caplog.records if r.name == "executor.lease"] == []


# -- the heartbeat thread ------------------------------------------------------------------


def test_the_heartbeat_refreshes_every_held_lease(root):
    store = open_store(root)
    manager = LeaseManager(store, FAST, "w1")
    try:
        manager.try_acquire(f"{root}/a")
        manager.try_acquire(f"{root}/b")
        first = {p: read_lease(store, f"{root}/{p}").heartbeat for p in "ab"}
        wait_for(lambda: all(read_lease(store, f"{root}/{p}").heartbeat > first[p] for p in "ab"))
        assert all(read_lease(store, f"{root}/{p}").worker == "w1" for p in "ab")
    finally:
        manager.close()


def test_the_heartbeat_survives_a_storage_error_and_keeps_the_lease(root, caplog):
    # A storage hiccup in one heartbeat must not end the thread: the lease would time out
    # and another driver would take over a step that is still running.
    store = open_store(root)
    manager = LeaseManager(store, FAST, "w1")
    real_swap = store.compare_and_swap
    failed = threading.Event()

    def flaky_swap(path, expected, new):
        if expected is not None and new is not None and not failed.is_set():
            failed.set()
            raise OSError("storage hiccup")
        return real_swap(path, expected, new)

    try:
        manager.try_acquire(f"{root}/s")
        first = read_lease(store, f"{root}/s").heartbeat
        with caplog.at_level(logging.ERROR, logger="executor.lease"):
            store.compare_and_swap = flaky_swap
            assert failed.wait(5.0)
            wait_for(lambda: read_lease(store, f"{root}/s").heartbeat > first)
        assert manager.holds(f"{root}/s") and not manager.was_lost(f"{root}/s")
        (record,) = [r for r in caplog.records if r.getMessage() == f"heartbeat for {root}/s failed"]
        assert record.threadName == "lease-heartbeat"  # what a log line with %(threadName)s shows
    finally:
        manager.close()


def test_close_stops_the_heartbeat(root):
    store = open_store(root)
    manager = LeaseManager(store, FAST, "w1")
    manager.try_acquire(f"{root}/s")
    manager.close()
    written = lease_bytes(store, f"{root}/s")
    time.sleep(FAST.heartbeat_interval * 3)
    assert lease_bytes(store, f"{root}/s") == written


def test_a_manager_closed_before_its_heartbeat_thread_started_ends_that_thread_at_once(root):
    """The stop event is made with the thread (`threading` loads only then): a close that came
    first still stops it."""
    manager = LeaseManager(open_store(root), FAST, "w1")
    manager.close()
    manager._ensure_thread()
    manager._thread.join(timeout=FAST.heartbeat_interval * 20)
    assert not manager._thread.is_alive()


@pytest.mark.parametrize("field", ["timeout", "heartbeat_interval", "poll_interval"])
def test_a_timing_below_a_millisecond_is_refused(field):
    """1e-300 s between heartbeats was accepted: a busy loop, not a setting."""
    with pytest.raises(ValueError) as raised:
        LeaseConfig.from_env({}, sources={field: f"--{field}"}, **{field: 1e-300})
    assert str(raised.value) == f"--{field} must be at least 0.001 seconds, got 1e-300"
    assert LeaseConfig(heartbeat_interval=0.001, poll_interval=0.001, timeout=0.002).poll_interval == 0.001
