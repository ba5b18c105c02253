"""The local backend's child process (`executor.backends.child.main`) run in this process.

`run_hosted` is replaced by a recorder where only the child's own work is checked (reading and
deleting the payload, the import path, the step's log, writing the result); one test runs the
real host end to end.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time

import cloudpickle
import pytest

from executor.backends import child, host
from executor.backends.host import HostedStep
from executor.store import open_store
from executor.tree import LeaseRecord, Status, lease_path, log_path, read_status


def _spec(tmp_path) -> HostedStep:
    return HostedStep(
        name="step",
        prefix=str(tmp_path),
        output_path=f"{tmp_path}/step-1",
        lease_bytes=LeaseRecord(worker="drv:1:aaaa", heartbeat=time.time()).to_bytes(),
        driver_worker="drv:1:aaaa",
        heartbeat_interval=60.0,
        version_hash="ab" * 32,
        config_digest="d",
    )


def greet(config):
    print(f"hello {config['who']}")


def _payload(tmp_path, spec, log_is_stdout, sys_path=(), fn=greet, config=None):
    path = tmp_path / "payload.pkl"
    blob = cloudpickle.dumps((fn, config if config is not None else {"who": "world"}))
    path.write_bytes(pickle.dumps((list(sys_path), blob, spec, log_is_stdout)))
    return str(path)


@pytest.fixture
def recorded(monkeypatch):
    calls = []

    def fake_run_hosted(spec, fn, config):
        calls.append((spec, config))
        fn(config)
        return {"outcome": "succeeded", "error": None}

    monkeypatch.setattr(host, "run_hosted", fake_run_hosted)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return calls


def test_the_child_runs_the_step_and_writes_its_result(tmp_path, recorded, capsys):
    spec = _spec(tmp_path)
    extra = tmp_path / "driver-path"
    extra.mkdir()
    payload = _payload(tmp_path, spec, True, sys_path=[str(extra)])
    result = tmp_path / "result.json"
    assert child.main(payload, str(result)) == 0
    assert recorded == [(spec, {"who": "world"})]
    assert json.loads(result.read_text()) == {"outcome": "succeeded", "error": None}
    assert not os.path.exists(payload)  # read once, then deleted
    assert not os.path.exists(f"{result}.tmp")
    assert sys.path[0] == str(extra)  # the driver's import path first
    assert "hello world" in capsys.readouterr().out
    # stdout is already the log file: the child opens no log of its own
    assert open_store(spec.prefix).read_bytes(log_path(spec.output_path)) is None


def test_the_child_captures_its_output_into_the_log_when_stdout_is_not_the_log(tmp_path, recorded):
    spec = _spec(tmp_path)
    result = tmp_path / "result.json"
    assert child.main(_payload(tmp_path, spec, False, config={"who": "log"}), str(result)) == 0
    assert json.loads(result.read_text())["outcome"] == "succeeded"
    log = open_store(spec.prefix).read_bytes(log_path(spec.output_path))
    assert log is not None and b"hello log" in log


def test_a_payload_already_deleted_is_no_error(tmp_path, recorded, monkeypatch):
    spec = _spec(tmp_path)
    payload = _payload(tmp_path, spec, True)
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        real_unlink(path, *args, **kwargs)
        raise FileNotFoundError(path)

    monkeypatch.setattr(child.os, "unlink", unlink)
    assert child.main(payload, str(tmp_path / "r.json")) == 0
    assert json.loads((tmp_path / "r.json").read_text())["outcome"] == "succeeded"


def test_the_child_runs_the_real_host_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = _spec(tmp_path)
    store = open_store(spec.prefix)
    store.write_atomic(lease_path(spec.output_path), spec.lease_bytes)
    result = tmp_path / "result.json"
    assert child.main(_payload(tmp_path, spec, False, config={"who": "host"}), str(result)) == 0
    assert json.loads(result.read_text()) == {"outcome": "succeeded", "error": None}
    assert [event.status for event in read_status(store, spec.output_path)] == [Status.SUCCESS]
    assert b"hello host" in store.read_bytes(log_path(spec.output_path))


def test_the_child_logs_info_records_with_their_level_and_logger(tmp_path, recorded, monkeypatch):
    import logging

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    spec = _spec(tmp_path)
    try:
        assert child.main(_payload(tmp_path, spec, True), str(tmp_path / "r.json")) == 0
        assert root.level == logging.INFO
        (handler,) = root.handlers
        assert handler.formatter._fmt == "%(asctime)s %(levelname)s %(name)s: %(message)s"
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
