"""The step host (`executor.backends.host`) run in this process, so that mutation testing sees it.

Normally it runs in a heavy step's own process (the local backend's child, a Ray actor); here
`run_hosted` is called directly on a local store, with its real heartbeat process where that is
safe (the heartbeat kills `kill_pid` when it loses the lease: only in tests where it cannot).
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
import types

import pytest

from executor.backends import host
from executor.backends.host import (
    HostedStep,
    _Tee,
    capture_process_log,
    host_worker_id,
    jax_devices,
    run_hosted,
)
from executor.store import open_store
from executor.tree import LeaseRecord, Status, info_path, lease_path, read_info, read_status, write_info

DRIVER = "drv-host:123:abcd"


def _spec(tmp_path, interval: float = 60.0, name: str = "step") -> HostedStep:
    prefix = str(tmp_path)
    output = f"{prefix}/{name}-0123abcd"
    return HostedStep(
        name=name,
        prefix=prefix,
        output_path=output,
        lease_bytes=LeaseRecord(worker=DRIVER, heartbeat=time.time()).to_bytes(),
        driver_worker=DRIVER,
        heartbeat_interval=interval,
        version_hash="0123abcd" * 8,
        config_digest="digest-1",
    )


def _hand_over(spec: HostedStep):
    store = open_store(spec.prefix)
    store.write_atomic(lease_path(spec.output_path), spec.lease_bytes)
    return store


class _FakeHeartbeat:
    """Stands in for the heartbeat process (records how it was stopped)."""

    def __init__(self, *_args):
        self.signals: list[int] = []
        self.killed = False
        self.waits: list[float | None] = []

    def send_signal(self, sig):
        self.signals.append(sig)

    def wait(self, timeout=None):
        self.waits.append(timeout)
        return 0

    def kill(self):
        self.killed = True


def test_a_hosted_step_takes_the_lease_heartbeats_runs_and_records_success(tmp_path):
    spec = _spec(tmp_path, interval=0.05)
    store = _hand_over(spec)
    path = lease_path(spec.output_path)
    seen = {}

    def fn(config):
        seen["config"] = config
        held = LeaseRecord.parse(store.read_bytes(path))
        seen["worker"] = held.worker
        first = store.read_bytes(path)
        deadline = time.time() + 20
        while store.read_bytes(path) == first and time.time() < deadline:  # the heartbeat refreshes it
            time.sleep(0.02)
        seen["refreshed"] = LeaseRecord.parse(store.read_bytes(path))
        time.sleep(0.05)

    result = run_hosted(spec, fn, {"x": 1})

    assert result == {"outcome": "succeeded", "error": None}
    assert seen["config"] == {"x": 1}
    assert seen["worker"].startswith(f"{DRIVER}/step:")
    assert seen["refreshed"] is not None and seen["refreshed"].worker == seen["worker"]
    assert seen["refreshed"].heartbeat > LeaseRecord.parse(spec.lease_bytes).heartbeat
    events = read_status(store, spec.output_path)
    assert [event.status for event in events] == [Status.SUCCESS]
    (event,) = events
    assert event.worker == seen["worker"]
    assert event.message is None
    assert event.extra["version_hash"] == spec.version_hash
    assert event.extra["config_digest"] == "digest-1"
    assert 0.05 <= event.extra["duration_s"] < 30
    assert store.read_bytes(path) is None  # released


def test_the_heartbeat_process_gets_the_lease_interval_and_this_pid(tmp_path, monkeypatch):
    spec = _spec(tmp_path, interval=7.5)
    started = []

    def popen(args, **kwargs):
        started.append((args, kwargs))
        return _FakeHeartbeat()

    monkeypatch.setattr(host.subprocess, "Popen", popen)
    process = host._start_heartbeat(spec, "the/lease", b"\xe9bytes")
    assert isinstance(process, _FakeHeartbeat)
    ((args, kwargs),) = started
    assert args[:3] == [sys.executable, "-m", "executor.backends.heartbeat"]
    assert json.loads(args[3]) == {
        "prefix": spec.prefix,
        "lease_path": "the/lease",
        "bytes": "\xe9bytes",
        "interval": 7.5,
        "kill_pid": os.getpid(),
        "parent_pid": os.getpid(),
    }
    assert kwargs["stdin"] == subprocess.DEVNULL
    assert "PYTHONPATH" in kwargs["env"]


def test_stop_terminates_the_heartbeat_and_kills_one_that_does_not_stop():
    calm = _FakeHeartbeat()
    host._stop(calm)
    assert calm.signals == [signal.SIGTERM]
    assert calm.waits == [10]
    assert not calm.killed

    class Stuck(_FakeHeartbeat):
        def wait(self, timeout=None):
            self.waits.append(timeout)
            if timeout is not None:
                raise subprocess.TimeoutExpired("heartbeat", timeout)
            return -9

    stuck = Stuck()
    host._stop(stuck)
    assert stuck.killed
    assert stuck.waits == [10, None]

    class Gone(_FakeHeartbeat):
        def send_signal(self, sig):
            raise ProcessLookupError(sig)

    gone = Gone()
    host._stop(gone)  # already exited: no error
    assert gone.waits == [10]


def test_a_step_taken_over_before_it_started_runs_nothing(tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    store = open_store(spec.prefix)
    other = LeaseRecord(worker="other:1:ffff", heartbeat=time.time()).to_bytes()
    store.write_atomic(lease_path(spec.output_path), other)
    monkeypatch.setattr(
        host, "_start_heartbeat", lambda *a: pytest.fail("no heartbeat for a step not started")
    )
    called = []
    result = run_hosted(spec, called.append, 1)
    assert result == {
        "outcome": "not_started",
        "error": "another driver took the step over before it started here",
    }
    assert called == []
    assert store.read_bytes(lease_path(spec.output_path)) == other
    assert read_status(store, spec.output_path) == []


@pytest.mark.parametrize("error", [ValueError("bad input"), SystemExit(4), KeyboardInterrupt()])
def test_a_failing_step_records_failed_with_its_error(tmp_path, monkeypatch, capsys, error):
    spec = _spec(tmp_path)
    store = _hand_over(spec)
    heartbeats = []
    monkeypatch.setattr(
        host, "_start_heartbeat", lambda *a: heartbeats.append(_FakeHeartbeat()) or heartbeats[-1]
    )

    def fn(config):
        raise error

    result = run_hosted(spec, fn, None)
    message = f"{type(error).__name__}: {error}"
    assert result == {"outcome": "failed", "error": message}
    (event,) = read_status(store, spec.output_path)
    assert event.status == Status.FAILED
    assert event.message == message
    assert event.worker.startswith(f"{DRIVER}/step:")
    assert "duration_s" in event.extra and "version_hash" not in event.extra
    assert store.read_bytes(lease_path(spec.output_path)) is None
    assert heartbeats[0].signals == [signal.SIGTERM]
    assert "Traceback" in capsys.readouterr().err


def test_a_lease_lost_while_the_step_ran_records_nothing(tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    store = _hand_over(spec)
    monkeypatch.setattr(host, "_start_heartbeat", lambda *a: _FakeHeartbeat())
    other = LeaseRecord(worker="other:1:ffff", heartbeat=time.time()).to_bytes()

    def fn(config):
        store.write_atomic(lease_path(spec.output_path), other)

    result = run_hosted(spec, fn, None)
    assert result == {
        "outcome": "lost",
        "error": "the lease was taken over by another driver while the step ran",
    }
    assert read_status(store, spec.output_path) == []
    assert store.read_bytes(lease_path(spec.output_path)) == other


def test_a_lease_deleted_while_the_step_ran_is_lost_too(tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    store = _hand_over(spec)
    monkeypatch.setattr(host, "_start_heartbeat", lambda *a: _FakeHeartbeat())
    result = run_hosted(spec, lambda config: store.delete(lease_path(spec.output_path)), None)
    assert result["outcome"] == "lost"
    assert read_status(store, spec.output_path) == []


@pytest.mark.parametrize("raises", [False, True])
def test_a_lost_gang_records_nothing_and_keeps_the_lease(tmp_path, monkeypatch, raises):
    spec = _spec(tmp_path)
    store = _hand_over(spec)
    beat = _FakeHeartbeat()
    monkeypatch.setattr(host, "_start_heartbeat", lambda *a: beat)
    order = []

    def fn(config):
        order.append("fn")
        if raises:
            raise RuntimeError("x")

    def peers_lost(failed):
        order.append(("peers", failed, beat.signals[:]))  # asked while still heartbeating
        return "process 1 of 2 was lost"

    result = run_hosted(spec, fn, None, on_start=lambda: order.append("start"), peers_lost=peers_lost)
    assert result == {"outcome": "gang_lost", "error": "process 1 of 2 was lost"}
    assert order == ["start", "fn", ("peers", raises, [])]
    assert beat.signals == [signal.SIGTERM]
    assert read_status(store, spec.output_path) == []
    held = LeaseRecord.parse(store.read_bytes(lease_path(spec.output_path)))
    assert held.worker.startswith(f"{DRIVER}/step:")


def test_peers_not_lost_lets_the_host_record_success(tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    store = _hand_over(spec)
    monkeypatch.setattr(host, "_start_heartbeat", lambda *a: _FakeHeartbeat())
    asked = []
    result = run_hosted(spec, lambda c: None, None, peers_lost=lambda failed: asked.append(failed))
    assert result["outcome"] == "succeeded"
    assert asked == [False]
    assert [e.status for e in read_status(store, spec.output_path)] == [Status.SUCCESS]


def test_a_release_that_finds_another_lease_says_so(tmp_path, monkeypatch, capsys):
    spec = _spec(tmp_path)
    store = _hand_over(spec)
    monkeypatch.setattr(host, "_start_heartbeat", lambda *a: _FakeHeartbeat())
    real_append = host.append_status
    other = LeaseRecord(worker="other:1:ffff", heartbeat=time.time()).to_bytes()

    def append_then_lose(store_, output_path, *args, **kwargs):
        event = real_append(store_, output_path, *args, **kwargs)
        store_.write_atomic(lease_path(output_path), other)  # taken over just before the release
        return event

    monkeypatch.setattr(host, "append_status", append_then_lose)
    assert run_hosted(spec, lambda c: None, None)["outcome"] == "succeeded"
    assert store.read_bytes(lease_path(spec.output_path)) == other
    assert f"the lease on {spec.output_path} was no longer ours at release" in capsys.readouterr().err


def test_the_host_worker_id_names_the_driver_and_this_process():
    worker = host_worker_id(DRIVER)
    assert worker.startswith(f"{DRIVER}/step:")
    record = LeaseRecord(worker=worker, heartbeat=0.0)
    assert record.pid == os.getpid()
    assert record.host != ""
    assert host_worker_id(DRIVER) != worker


def _fake_jax(monkeypatch, initialized=True, memory=lambda: {"bytes_limit": 17}):
    class Device:
        device_kind = "TPU v4"

        def memory_stats(self):
            return memory()

    jax = types.ModuleType("jax")
    jax.devices = lambda: [Device(), Device(), Device()]
    jax.default_backend = lambda: "tpu"
    jax.process_count = lambda: 2
    bridge = types.ModuleType("jax._src.xla_bridge")
    bridge.backends_are_initialized = lambda: initialized
    monkeypatch.setitem(sys.modules, "jax", jax)
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", bridge)


def test_jax_devices_describes_what_jax_gave_the_process(monkeypatch):
    _fake_jax(monkeypatch)
    assert jax_devices() == {
        "backend": "tpu",
        "kind": "TPU v4",
        "count": 3,
        "process_count": 2,
        "memory_bytes_per_device": 17,
    }


def test_jax_devices_without_memory_stats(monkeypatch):
    def broken():
        raise RuntimeError("no stats on CPU")

    _fake_jax(monkeypatch, memory=broken)
    assert jax_devices()["memory_bytes_per_device"] is None
    _fake_jax(monkeypatch, memory=lambda: None)
    assert jax_devices()["memory_bytes_per_device"] is None


def test_jax_devices_is_none_when_the_step_did_not_start_jax(monkeypatch):
    _fake_jax(monkeypatch, initialized=False)
    assert jax_devices() is None
    monkeypatch.delitem(sys.modules, "jax._src.xla_bridge")
    assert jax_devices() is None
    _fake_jax(monkeypatch)
    monkeypatch.delitem(sys.modules, "jax")
    assert jax_devices() is None


def test_the_devices_jax_gave_are_added_to_the_info(tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    store = _hand_over(spec)
    write_info(store, {"output_path": spec.output_path, "name": "step"})
    monkeypatch.setattr(host, "_start_heartbeat", lambda *a: _FakeHeartbeat())
    monkeypatch.setattr(host, "jax_devices", lambda: {"backend": "gpu", "count": 2})
    assert run_hosted(spec, lambda c: None, None)["outcome"] == "succeeded"
    assert read_info(store, spec.output_path) == {
        "output_path": spec.output_path,
        "name": "step",
        "devices": {"backend": "gpu", "count": 2},
    }


def test_no_devices_leave_the_info_alone(tmp_path, monkeypatch):
    store = open_store(str(tmp_path))
    output = f"{tmp_path}/s-1"
    write_info(store, {"output_path": output})
    before = store.read_bytes(info_path(output))
    monkeypatch.setattr(host, "jax_devices", lambda: None)
    host._record_devices(store, output)
    assert store.read_bytes(info_path(output)) == before
    # devices but no info: nothing written
    monkeypatch.setattr(host, "jax_devices", lambda: {"count": 1})
    host._record_devices(store, f"{tmp_path}/none-1")
    assert store.read_bytes(info_path(f"{tmp_path}/none-1")) is None


def test_a_failure_to_record_devices_is_reported_not_raised(tmp_path, monkeypatch, capsys):
    def broken():
        raise OSError("jax exploded")

    monkeypatch.setattr(host, "jax_devices", broken)
    host._record_devices(open_store(str(tmp_path)), f"{tmp_path}/s-1")
    assert "[executor] could not record the step's devices: OSError: jax exploded" in capsys.readouterr().err


# -- a gang process's log ----------------------------------------------------------------------


def test_capture_process_log_on_local_disk(tmp_path, capsys):
    store = open_store(str(tmp_path))
    target = f"{tmp_path}/out-1/logs/process-1.log"
    stdout, stderr = sys.stdout, sys.stderr
    handlers = list(logging.getLogger().handlers)
    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.INFO)
    try:
        with capture_process_log(store, target):
            print("to stdout")
            print("to stderr", file=sys.stderr)
            logging.getLogger("marin.test").warning("a record")
            with open(target, encoding="utf-8") as handle:  # line-buffered: written in place at once
                assert "to stdout\n" in handle.read()
    finally:
        logging.getLogger().setLevel(level)
    assert sys.stdout is stdout and sys.stderr is stderr
    assert logging.getLogger().handlers == handlers
    text = (tmp_path / "out-1" / "logs" / "process-1.log").read_text()
    assert "to stdout\n" in text and "to stderr\n" in text
    assert "WARNING marin.test: a record" in text
    captured = capsys.readouterr()
    assert "to stdout" in captured.out and "to stderr" in captured.err
    print("after")
    assert "after" not in (tmp_path / "out-1" / "logs" / "process-1.log").read_text()


def test_capture_process_log_on_an_object_store_uploads_now_and_then(monkeypatch):
    root = f"memory://proclog-{os.getpid()}-{time.time_ns()}"
    store = open_store(root)
    target = f"{root}/out-1/logs/process-2.log"
    monkeypatch.setenv("MARIN_LOG_UPLOAD_INTERVAL", "0.05")
    names = []
    with capture_process_log(store, target):
        print("early line")
        names.append(sys.stdout._handle.name)
        deadline = time.time() + 10
        while (store.read_bytes(target) or b"").find(b"early line") < 0 and time.time() < deadline:
            time.sleep(0.02)
        assert b"early line" in (store.read_bytes(target) or b"")  # uploaded while running
        print("last line")
    assert store.read_bytes(target).decode().splitlines() == ["early line", "last line"]
    assert not os.path.exists(names[0])  # the local buffer is gone


def test_capture_process_log_uploads_at_the_end_even_with_a_long_interval(monkeypatch):
    root = f"memory://proclog-{os.getpid()}-{time.time_ns()}"
    store = open_store(root)
    target = f"{root}/out-1/logs/process-3.log"
    monkeypatch.setenv("MARIN_LOG_UPLOAD_INTERVAL", "3600")
    started = time.time()
    with capture_process_log(store, target):
        print("only line")
        assert store.read_bytes(target) is None
    assert store.read_bytes(target) == b"only line\n"
    assert time.time() - started < 5  # the uploader stops at once, not after its interval


def test_tee_writes_both_and_survives_a_closed_log():
    original, handle = io.StringIO(), io.StringIO()
    import threading

    tee = _Tee(original, handle, threading.Lock())
    assert tee.write("abc") == 3
    tee.flush()
    assert original.getvalue() == "abc" and handle.getvalue() == "abc"
    assert tee.getvalue() == "abc"  # anything else is the original's
    handle.close()
    assert tee.write("de") == 2
    tee.flush()
    assert original.getvalue() == "abcde"


def test_tee_flush_survives_a_closed_log_file(tmp_path):
    import threading

    original = io.StringIO()
    handle = open(tmp_path / "log", "w", encoding="utf-8")  # noqa: SIM115 (closed below)
    tee = _Tee(original, handle, threading.Lock())
    tee.write("x")
    handle.close()
    tee.flush()  # a real file raises ValueError once closed: ignored
    assert original.getvalue() == "x"


def test_the_recorded_duration_is_in_milliseconds(tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    store = _hand_over(spec)
    monkeypatch.setattr(host, "_start_heartbeat", lambda *a: _FakeHeartbeat())
    clock = iter([1000.0, 1000.0, 1001.23456])
    monkeypatch.setattr(host, "time", types.SimpleNamespace(time=lambda: next(clock)))
    assert run_hosted(spec, lambda c: None, None)["outcome"] == "succeeded"
    (event,) = read_status(store, spec.output_path)
    assert event.extra["duration_s"] == 1.235
