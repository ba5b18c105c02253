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
4. stops the heartbeat; if the step started JAX, adds the devices it got to `.executor_info`
   (`devices`: backend, kind, count, process count, memory per device; `jax_devices`);
   checks the lease is still its own, appends SUCCESS (or FAILED with the error) and deletes
   the lease -- the same final bookkeeping the runner does for a step in the driver.

So a heavy step finishes, and records its result, whether or not the driver that started it
is still alive; a driver started again sees the live lease, waits for the status, and goes
on downstream without running the step again.

In a gang (a step run by several processes at once: `executor.backends.ray_cluster`) the
host is process 0: it alone does the above. Before it records anything it asks whether the
gang was lost meanwhile (`peers_lost`: another process died); then it records nothing and
says so (`gang_lost`), and the driver submits the whole gang again. The other processes
only run the function, with their output in a log file of their own (`capture_process_log`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import IO, Any

from executor.backends import child_env
from executor.lease import new_worker_id
from executor.records import dataclass
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


def run_hosted(
    spec: HostedStep,
    fn: Any,
    config: Any,
    on_start: Callable[[], None] | None = None,
    peers_lost: Callable[[bool], str | None] | None = None,
) -> dict[str, Any]:
    """Run the step here, holding its lease; the outcome as JSON-ready `{"outcome", "error"}`.

    outcome: "succeeded", "failed" (the function raised; FAILED is recorded), "lost" (the
    lease was taken over while it ran; nothing recorded), "not_started", or "gang_lost".

    `on_start`: called once the lease is ours, before the function (process 0 of a gang
    records where the gang runs). `peers_lost(failed)`: called after the function, still
    heartbeating, with whether it raised; a reason means another process of the gang was
    lost, and then nothing is recorded ("gang_lost"): the lease stays with this host, for
    the driver to take back and submit the gang again.
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
    gang_lost = None
    try:
        try:
            if on_start is not None:
                on_start()
            fn(config)
        except BaseException as caught:  # SystemExit and KeyboardInterrupt from a step are failures too
            error = caught
            traceback.print_exc()
        if peers_lost is not None:
            gang_lost = peers_lost(error is not None)
    finally:
        _stop(heartbeat)
        sys.stdout.flush()
        sys.stderr.flush()
    if gang_lost:
        return {"outcome": "gang_lost", "error": gang_lost}
    duration = round(time.time() - start, 3)
    current = store.read_bytes(path)
    record = LeaseRecord.parse(current)
    if record is None or record.worker != worker:
        return {"outcome": "lost", "error": "the lease was taken over by another driver while the step ran"}
    _record_devices(store, spec.output_path)
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


def jax_devices() -> dict[str, Any] | None:
    """The devices JAX gave this process -- backend, device kind, count (all processes'),
    process count, memory per device where JAX knows it -- or None when the step did not
    start JAX here. Never imports JAX (the executor does not depend on it)."""
    jax = sys.modules.get("jax")
    bridge = sys.modules.get("jax._src.xla_bridge")
    if jax is None or bridge is None or not bridge.backends_are_initialized():
        return None
    devices = jax.devices()
    try:
        memory = (devices[0].memory_stats() or {}).get("bytes_limit")
    except Exception:  # the CPU backend has no memory stats
        memory = None
    return {
        "backend": jax.default_backend(),
        "kind": devices[0].device_kind,
        "count": len(devices),
        "process_count": jax.process_count(),
        "memory_bytes_per_device": memory,
    }


def _record_devices(store: Any, output_path: str) -> None:
    """`devices` in `.executor_info`, when the step used JAX (a record, never a failure)."""
    from executor.tree import read_info, write_info

    try:
        devices = jax_devices()
        info = read_info(store, output_path) if devices is not None else None
        if info is not None:
            write_info(store, {**info, "devices": devices})
    except Exception as error:  # noqa: BLE001 (what JAX or storage raise here must not fail the step)
        print(
            f"[executor] could not record the step's devices: {type(error).__name__}: {error}",
            file=sys.stderr,
        )


def _start_heartbeat(spec: HostedStep, path: str, mine: bytes) -> subprocess.Popen:
    payload = json.dumps(
        {
            "prefix": spec.prefix,
            "lease_path": path,
            "bytes": mine.decode("latin-1"),
            "interval": spec.heartbeat_interval,
            "kill_pid": os.getpid(),
            "parent_pid": os.getpid(),  # it exits when this process is gone (see its docstring)
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


@contextlib.contextmanager
def capture_process_log(store: Any, target: str) -> Iterator[None]:
    """This whole process's stdout, stderr and logging also go to the file `target` of the
    tree (a process of a gang other than 0, alone in its Ray actor's process): written in
    place on local disk; on an object store written locally and uploaded every
    `$MARIN_LOG_UPLOAD_INTERVAL` seconds and when it ends."""
    from executor.logs import LOG_UPLOAD_INTERVAL_ENV

    local = store.local_path(target)
    if local is not None:
        os.makedirs(os.path.dirname(local), exist_ok=True)
        handle: IO[str] = open(local, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed below)
    else:
        handle = tempfile.NamedTemporaryFile("w+", encoding="utf-8", suffix=".log", delete=False, buffering=1)  # noqa: SIM115
    lock = threading.Lock()
    stop = threading.Event()

    def upload() -> None:
        with lock, open(handle.name, "rb") as written:
            store.write_atomic(target, written.read())

    def upload_now_and_then() -> None:
        interval = float(os.environ.get(LOG_UPLOAD_INTERVAL_ENV, "") or 15)
        while not stop.wait(interval):
            with contextlib.suppress(Exception):  # a storage hiccup: the next upload has it all
                upload()

    uploader = None if local is not None else threading.Thread(target=upload_now_and_then, daemon=True)
    if uploader is not None:
        uploader.start()
    originals = (sys.stdout, sys.stderr)
    sys.stdout, sys.stderr = _Tee(originals[0], handle, lock), _Tee(originals[1], handle, lock)
    handler = logging.StreamHandler(handle)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)
        sys.stdout, sys.stderr = originals
        stop.set()
        with lock:
            handle.close()
        if uploader is not None:
            uploader.join()
            try:
                upload()
            finally:
                os.unlink(handle.name)


class _Tee:
    """Writes to the original stream and to the process's log file."""

    def __init__(self, original: Any, handle: IO[str], lock: threading.Lock):
        self._original, self._handle, self._lock = original, handle, lock

    def write(self, text: str) -> int:
        with self._lock, contextlib.suppress(ValueError):  # closed: the capture ended
            self._handle.write(text)
        return self._original.write(text)

    def flush(self) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._handle.flush()
        self._original.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)
