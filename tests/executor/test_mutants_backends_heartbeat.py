"""The heartbeat process's code (`executor.backends.heartbeat.main`) run in this process.

It normally runs as `python -m executor.backends.heartbeat` beside a heavy step. Here its
`kill_pid` is a `sleep` process started by the test (never this one), and SIGTERM, which
stops it, comes from a timer in this process (main installs its own handler; the test puts
the old one back).
"""

from __future__ import annotations

import ctypes
import json
import signal
import subprocess
import sys
import threading
import time

import pytest

from executor.backends import heartbeat
from executor.store import LocalStore
from executor.tree import LeaseRecord, lease_path

WORKER = "drv:1:aaaa/step:h:2:bbbb"


@pytest.fixture
def victim():
    process = subprocess.Popen(["sleep", "60"])
    yield process
    if process.poll() is None:
        process.kill()
    process.wait()


@pytest.fixture
def sigterm_restored():
    old = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, old)


def _lease(tmp_path, stamp: float = 1000.0):
    path = lease_path(f"{tmp_path}/step-1")
    data = LeaseRecord(worker=WORKER, heartbeat=stamp).to_bytes()
    LocalStore().write_atomic(path, data)
    return path, data


def _spec(tmp_path, path, data, interval, kill_pid) -> str:
    return json.dumps(
        {
            "prefix": str(tmp_path),
            "lease_path": path,
            "bytes": data.decode("latin-1"),
            "interval": interval,
            "kill_pid": kill_pid,
        }
    )


def _sigterm_after(seconds: float) -> threading.Timer:
    import os

    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGTERM))
    timer.daemon = True
    timer.start()
    return timer


@pytest.fixture
def no_parent_death(monkeypatch):
    calls = []
    monkeypatch.setattr(heartbeat, "_die_with_parent", lambda: calls.append(True))
    return calls


def _count_swaps(monkeypatch, fail_first_with: Exception | None = None):
    swaps = []
    real = LocalStore.compare_and_swap

    def counting(self, path, expected, new):
        swaps.append((expected, new))
        if fail_first_with is not None and len(swaps) == 1:
            raise fail_first_with
        return real(self, path, expected, new)

    monkeypatch.setattr(LocalStore, "compare_and_swap", counting)
    return swaps


def test_the_heartbeat_refreshes_the_lease_from_its_own_last_bytes_until_sigterm(
    tmp_path, monkeypatch, victim, sigterm_restored, no_parent_death
):
    path, data = _lease(tmp_path)
    swaps = _count_swaps(monkeypatch)
    _sigterm_after(0.8)
    started = time.time()
    assert heartbeat.main(_spec(tmp_path, path, data, 0.1, victim.pid)) == 0
    assert time.time() - started < 5
    assert no_parent_death == [True]
    assert len(swaps) >= 3
    assert swaps[0][0] == data
    for (_, new), (expected, _) in zip(swaps, swaps[1:], strict=False):
        assert expected == new  # each swap starts from the bytes the previous one wrote
    final = LeaseRecord.parse(LocalStore().read_bytes(path))
    assert final.worker == WORKER
    assert final.heartbeat > 1000.0
    assert LocalStore().read_bytes(path) == swaps[-1][1]
    assert victim.poll() is None  # the step's process lives on


def test_the_heartbeat_waits_its_interval_before_the_first_refresh(
    tmp_path, monkeypatch, victim, sigterm_restored, no_parent_death
):
    path, data = _lease(tmp_path)
    swaps = _count_swaps(monkeypatch)
    _sigterm_after(0.5)
    started = time.time()
    assert heartbeat.main(_spec(tmp_path, path, data, 30, victim.pid)) == 0
    assert time.time() - started < 3  # wakes at least every 0.1 s to see SIGTERM
    assert swaps == []
    assert LocalStore().read_bytes(path) == data


def test_a_lost_lease_kills_the_step_and_exits_3(tmp_path, monkeypatch, victim, capsys, no_parent_death):
    path, data = _lease(tmp_path)
    taken = LeaseRecord(worker="other:9:cccc", heartbeat=2000.0).to_bytes()
    LocalStore().write_atomic(path, taken)
    old = signal.getsignal(signal.SIGTERM)
    try:
        assert heartbeat.main(_spec(tmp_path, path, data, 0.05, victim.pid)) == heartbeat.LOST_EXIT_CODE == 3
    finally:
        signal.signal(signal.SIGTERM, old)
    assert victim.wait(timeout=10) == -signal.SIGKILL
    assert LocalStore().read_bytes(path) == taken
    err = capsys.readouterr().err
    assert f"lost the lease {path}: another driver took the step over; stopping it" in err


def test_a_lost_lease_whose_step_is_already_gone_still_exits_3(tmp_path, no_parent_death, sigterm_restored):
    path, data = _lease(tmp_path)
    LocalStore().write_atomic(path, b"{}")
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert heartbeat.main(_spec(tmp_path, path, data, 0.05, gone.pid)) == 3


def test_a_storage_error_is_reported_and_retried(
    tmp_path, monkeypatch, victim, capsys, sigterm_restored, no_parent_death
):
    path, data = _lease(tmp_path)
    swaps = _count_swaps(monkeypatch, fail_first_with=OSError("disk hiccup"))
    _sigterm_after(0.7)
    assert heartbeat.main(_spec(tmp_path, path, data, 0.1, victim.pid)) == 0
    assert len(swaps) >= 2
    assert swaps[1][0] == data  # the failed swap wrote nothing: retried from the same bytes
    assert LeaseRecord.parse(LocalStore().read_bytes(path)).heartbeat > 1000.0
    assert f"heartbeat for {path} failed: disk hiccup" in capsys.readouterr().err
    assert victim.poll() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_the_heartbeat_dies_with_its_parent():
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    value = ctypes.c_int(-1)
    libc.prctl(2, ctypes.byref(value))  # PR_GET_PDEATHSIG
    before = value.value
    try:
        heartbeat._die_with_parent()
        libc.prctl(2, ctypes.byref(value))
        assert value.value == signal.SIGKILL
    finally:
        libc.prctl(1, before)  # PR_SET_PDEATHSIG: as it was


def test_no_libc_is_no_error(monkeypatch):
    def missing(*args, **kwargs):
        raise OSError("no libc")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    heartbeat._die_with_parent()
