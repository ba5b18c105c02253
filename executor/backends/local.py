"""The local backend: light steps in driver threads, heavy steps in processes of their own.

A step with `resources` (training, evaluation) holds process-wide state -- JAX's devices
and compilation cache, the W&B run, Levanter's logging -- so two of them in one process
would share it. Each runs in a subprocess (`executor.backends.child`) instead; its stdout
and stderr go to the step's log (and the console) as a light step's do.

Heavy steps are admitted by what this machine has: the CPUs and GPUs the running heavy
steps asked for, plus the new step's, must fit in `os.sched_getaffinity` CPUs and the
visible NVIDIA GPUs. A step asking for more than the machine has still runs, alone (it
could never start otherwise). A plain-dict `resources` (the older form, e.g.
`{"accelerator": "any"}`) and a TPU ask for the whole machine.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from executor.backends import Backend, StepCancelled, StepFunctionError, child_env, is_heavy

if TYPE_CHECKING:
    from executor.graph import ResolvedStep


@dataclass(frozen=True)
class Request:
    """What one heavy step takes from the machine while it runs."""

    cpu: float
    gpu: int
    whole_machine: bool = False
    """True: runs only when no other heavy step does, and none starts beside it."""


def request_of(resources: Any) -> Request:
    """The CPUs and GPUs a step's `resources` ask for on this machine."""
    if resources is None:
        return Request(cpu=0, gpu=0)
    if isinstance(resources, dict):
        known = {"cpu", "gpu"}
        if resources and set(resources) <= known:
            return Request(cpu=float(resources.get("cpu", 1)), gpu=int(resources.get("gpu", 0)))
        return Request(cpu=0, gpu=0, whole_machine=True)
    device = getattr(resources, "device", None)
    kind = getattr(device, "kind", "cpu")
    if kind == "tpu":
        return Request(cpu=0, gpu=0, whole_machine=True)
    gpu = int(getattr(device, "count", 1)) if kind == "gpu" else 0
    return Request(cpu=float(getattr(resources, "cpu", 1) or 0), gpu=gpu)


def machine_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_gpus() -> int:
    """NVIDIA GPUs this process may use: `$CUDA_VISIBLE_DEVICES`, else the device files."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([entry for entry in visible.split(",") if entry.strip() and entry.strip() != "-1"])
    return len(glob.glob("/dev/nvidia[0-9]*"))


class LocalBackend(Backend):
    name = "local"

    def __init__(self, cpus: int | None = None, gpus: int | None = None):
        """`cpus`/`gpus`: the machine's capacity (default: what this process can use)."""
        self.cpus = machine_cpus() if cpus is None else cpus
        self.gpus = machine_gpus() if gpus is None else gpus
        self._processes: dict[str, subprocess.Popen] = {}
        self._cancelled: set[str] = set()
        self._temp_files: dict[str, tuple[str, str]] = {}
        """Each running heavy step's payload and result files (removed by `close` too)."""
        self._lock = threading.Lock()

    def admit(self, step: ResolvedStep, running: list[ResolvedStep]) -> bool:
        if not is_heavy(step):
            return True
        heavy = [request_of(other.step.resources) for other in running if is_heavy(other)]
        if not heavy:
            return True  # alone, whatever it asks for
        wanted = request_of(step.step.resources)
        if wanted.whole_machine or any(other.whole_machine for other in heavy):
            return False
        cpu = sum(other.cpu for other in heavy) + wanted.cpu
        gpu = sum(other.gpu for other in heavy) + wanted.gpu
        return cpu <= self.cpus and gpu <= self.gpus

    def prepare(self, step: ResolvedStep) -> dict[str, Any]:
        if not is_heavy(step):
            return super().prepare(step)
        wanted = request_of(step.step.resources)
        return {
            "backend": self.name,
            "where": "subprocess",
            "hosted": True,
            "cpu": "all" if wanted.whole_machine else wanted.cpu,
            "gpu": "all" if wanted.whole_machine else wanted.gpu,
        }

    def call_hosted(self, step: ResolvedStep, dispatch: dict[str, Any], spec: Any) -> dict[str, Any]:
        from executor.store import open_store
        from executor.tree import log_path

        path = step.output_path
        local_log = open_store(spec.prefix).local_path(log_path(path))
        payload_fd, payload_path = tempfile.mkstemp(prefix="marin-step-", suffix=".pkl")
        result_fd, result_path = tempfile.mkstemp(prefix="marin-step-", suffix=".json")
        os.close(result_fd)
        with self._lock:
            self._temp_files[path] = (payload_path, result_path)
        try:
            with os.fdopen(payload_fd, "wb") as handle:
                handle.write(_payload(step, spec, local_log is not None))
            output = _open_log(local_log)
            try:
                # Its own session: a Ctrl-C meant for the driver does not reach it (the driver
                # stops it itself), and it outlives the driver, finishing and recording the step.
                process = subprocess.Popen(
                    [sys.executable, "-m", "executor.backends.child", payload_path, result_path],
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=output,
                    env=child_env(),
                    start_new_session=True,
                )
            finally:
                if output is not subprocess.DEVNULL:
                    output.close()
            with self._lock:
                self._processes[path] = process
                cancelled = path in self._cancelled
            if cancelled:
                _kill(process)
            try:
                _echo_while_running(process, local_log)
                code = process.wait()
            finally:
                with self._lock:
                    self._processes.pop(path, None)
                    cancelled = path in self._cancelled
                    self._cancelled.discard(path)
            result = _read_result(result_path)
        finally:
            with self._lock:
                self._temp_files.pop(path, None)
            _remove(payload_path, result_path)
        if result is not None:
            return result
        if cancelled:
            raise StepCancelled("stopped: its process was killed (Backend.cancel)")
        raise StepFunctionError(f"the step's process died without a result (exit code {code})")

    def cancel(self, output_path: str) -> None:
        with self._lock:
            self._cancelled.add(output_path)
            process = self._processes.get(output_path)
        if process is not None:
            _kill(process)

    def close(self) -> None:
        with self._lock:
            paths = set(self._processes) | set(self._temp_files)
            in_flight = [(self._processes.get(path), files) for path, files in self._temp_files.items()]
        for path in paths:
            self.cancel(path)
        # The threads waiting for these steps are daemons: an interrupted driver exits before
        # they remove the steps' files. Once a step's process is dead it writes none again.
        for process, files in in_flight:
            if process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)
            _remove(*files)


def _payload(step: ResolvedStep, spec: Any, log_is_stdout: bool) -> bytes:
    import pickle

    import cloudpickle

    try:
        blob = cloudpickle.dumps((step.step.fn, step.config))
    except Exception as error:  # locks, open files, generators in the config or the function
        raise StepFunctionError(
            f"step {step.name!r}: its function and config cannot be sent to a subprocess "
            f"({type(error).__name__}: {error}); make them picklable, or drop `resources` to run "
            "the step in the driver"
        ) from None
    return pickle.dumps(([entry for entry in sys.path if entry], blob, spec, log_is_stdout))


def _open_log(local_log: str | None):
    """The step's log file, appended to, as the child's stdout and stderr (on local disk)."""
    if local_log is None:
        return subprocess.DEVNULL  # the child captures its output and uploads the log itself
    os.makedirs(os.path.dirname(local_log), exist_ok=True)
    return open(local_log, "ab")  # noqa: SIM115 (closed once the child has it)


def _remove(*paths: str) -> None:
    for path in paths:
        with contextlib.suppress(OSError):  # the child deletes its payload; the result is read once
            os.unlink(path)


def _kill(process: subprocess.Popen) -> None:
    """The step's process and its heartbeat (their own process group)."""
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        process.kill()


def _echo_while_running(process: subprocess.Popen, local_log: str | None) -> None:
    """Copy what the step writes to its log onto the console while it runs."""
    from executor.logs import console_write

    offset = os.path.getsize(local_log) if local_log and os.path.exists(local_log) else 0
    while True:
        finished = process.poll() is not None
        if local_log is not None:
            try:
                with open(local_log, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except OSError:
                data = b""
            if data:
                offset += len(data)
                console_write(data.decode("utf-8", errors="replace"))
        if finished:
            return
        time.sleep(0.1)


def _read_result(result_path: str) -> dict[str, Any] | None:
    """The child's `{"outcome", "error"}`; None if it wrote none (killed, crashed)."""
    try:
        with open(result_path, encoding="utf-8") as handle:
            text = handle.read(1 << 20)
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(result_path)
    try:
        result = json.loads(text)
    except ValueError:
        return None
    if not isinstance(result, dict) or not isinstance(result.get("outcome"), str):
        return None
    return result
