"""The step host: what runs in a heavy step's own process (a local subprocess, a Ray actor).

The driver takes the step's lease, writes `.executor_info` and the RUNNING line, then
*hands the lease over*: it stops heartbeating it and passes the exact lease bytes to the
host. The host

1. swaps the lease from those bytes to its own (worker `<driver worker>/step:<host>:<pid>:<rand>`).
   If the swap fails, another driver took the step over while it waited to start: it runs
   nothing and says so (`not_started`);
2. starts its heartbeat in a separate process (`executor.backends.heartbeat`: no shared GIL
   with the step; it kills this process the moment the lease is taken over);
3. runs `fn(config)`;
4. stops the heartbeat, checks the lease is still its own, appends SUCCESS (or FAILED with
   the error) and deletes the lease -- the same final bookkeeping the runner does for a
   step in the driver.

So a heavy step finishes, and records its result, whether or not the driver that started it
is still alive; a driver started again sees the live lease, waits for the status, and goes
on downstream without running the step again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

from executor.backends import child_env
from executor.lease import new_worker_id
from executor.tree import LeaseRecord, Status, append_status, lease_path


@dataclass(frozen=True)
class HostedStep:
    """What the step's process needs besides the function and config."""

    name: str
    prefix: str
    """Opens the store (any path of the tree works: only its scheme and location count)."""

    output_path: str
    lease_bytes: bytes
    """The lease exactly as the driver last wrote it (handed over)."""

    driver_worker: str
    heartbeat_interval: float
    version_hash: str
    config_digest: str


def host_worker_id(driver_worker: str) -> str:
    """A host's worker id: the driver's, then this process (a reader sees who started it)."""
    return f"{driver_worker}/step:{new_worker_id()}"


def run_hosted(spec: HostedStep, fn: Any, config: Any) -> dict[str, Any]:
    """Run the step here, holding its lease; the outcome as JSON-ready `{"outcome", "error"}`.

    outcome: "succeeded", "failed" (the function raised; FAILED is recorded), "lost" (the
    lease was taken over while it ran; nothing recorded) or "not_started".
    """
    from executor.store import open_store

    store = open_store(spec.prefix)
    path = lease_path(spec.output_path)
    worker = host_worker_id(spec.driver_worker)
    now = time.time()
    mine = LeaseRecord(worker=worker, heartbeat=now).to_bytes()
    if not store.compare_and_swap(path, spec.lease_bytes, mine):
        return {"outcome": "not_started", "error": "another driver took the step over before it started here"}
    heartbeat = _start_heartbeat(spec, path, mine)
    start = time.time()
    error: BaseException | None = None
    try:
        fn(config)
    except BaseException as caught:  # SystemExit and KeyboardInterrupt from a step are failures too
        error = caught
        traceback.print_exc()
    finally:
        _stop(heartbeat)
        sys.stdout.flush()
        sys.stderr.flush()
    duration = round(time.time() - start, 3)
    current = store.read_bytes(path)
    record = LeaseRecord.parse(current)
    if record is None or record.worker != worker:
        return {"outcome": "lost", "error": "the lease was taken over by another driver while the step ran"}
    try:
        if error is not None:
            message = f"{type(error).__name__}: {error}"
            append_status(store, spec.output_path, Status.FAILED, message, worker, duration_s=duration)
            return {"outcome": "failed", "error": message}
        append_status(
            store,
            spec.output_path,
            Status.SUCCESS,
            None,
            worker,
            duration_s=duration,
            version_hash=spec.version_hash,
            config_digest=spec.config_digest,
        )
        return {"outcome": "succeeded", "error": None}
    finally:
        if not store.compare_and_swap(path, current, None):
            print(f"the lease on {spec.output_path} was no longer ours at release", file=sys.stderr)


def _start_heartbeat(spec: HostedStep, path: str, mine: bytes) -> subprocess.Popen:
    payload = json.dumps(
        {
            "prefix": spec.prefix,
            "lease_path": path,
            "bytes": mine.decode("latin-1"),
            "interval": spec.heartbeat_interval,
            "kill_pid": os.getpid(),
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "executor.backends.heartbeat", payload],
        stdin=subprocess.DEVNULL,
        env=child_env(),
    )


def _stop(heartbeat: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        heartbeat.send_signal(signal.SIGTERM)
    try:
        heartbeat.wait(timeout=10)
    except subprocess.TimeoutExpired:
        heartbeat.kill()
        heartbeat.wait()
