"""The local backend's pieces (`executor.backends.local`) and the backend helpers
(`executor.backends`), each called directly in this process."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import pytest

from executor import ExecutorStep, ResourceConfig, this_output_path, versioned
from executor.backends import (
    BACKEND_ENV,
    CHILD_ENV_DROPPED,
    Backend,
    DistributedProcess,
    StepCancelled,
    StepFunctionError,
    backend_name,
    child_env,
    extend_sys_path,
    is_heavy,
    local,
    open_backend,
)
from executor.backends.local import LocalBackend, Request, request_of
from executor.resources import GpuConfig
from tests.executor.backend_stand_ins import resolved_interval_step
from tests.executor.steps_for_heavy import record_interval


def _resolved(resources, name: str = "s"):
    return resolved_interval_step(resources, name)


# -- requests ------------------------------------------------------------------------------------


def test_requests_of_dicts_and_configs():
    assert request_of({"gpu": 3}) == Request(cpu=1.0, gpu=3)  # cpu defaults to 1
    assert request_of({"cpu": 2.5}) == Request(cpu=2.5, gpu=0)
    assert request_of({"cpu": 1, "other": 1}) == Request(cpu=0, gpu=0, whole_machine=True)
    assert request_of(ResourceConfig(cpu=1, device=GpuConfig(count=2))) == Request(cpu=1.0, gpu=2)
    assert request_of(ResourceConfig.with_cpu(cpu=2)) == Request(cpu=2.0, gpu=0)
    assert Request(cpu=1, gpu=0).whole_machine is False

    class Bare:  # no device attribute: a CPU step asking for 1 CPU
        pass

    assert request_of(Bare()) == Request(cpu=1.0, gpu=0)

    class Gpuish:
        cpu = 0
        device = type("D", (), {"kind": "gpu"})()

    assert request_of(Gpuish()) == Request(cpu=0.0, gpu=1)  # a device count defaults to 1


def test_machine_cpus_and_gpus(monkeypatch):
    assert local.machine_cpus() == len(os.sched_getaffinity(0))
    monkeypatch.delattr(local.os, "sched_getaffinity")
    monkeypatch.setattr(local.os, "cpu_count", lambda: 6)
    assert local.machine_cpus() == 6
    monkeypatch.setattr(local.os, "cpu_count", lambda: None)
    assert local.machine_cpus() == 1


@pytest.mark.parametrize(
    ("visible", "count"),
    [("0,1", 2), ("", 0), ("-1", 0), (" 0 , 2 ,", 2), ("3", 1), ("0,-1", 1)],
)
def test_visible_gpus_come_from_cuda_visible_devices(monkeypatch, visible, count):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(local.glob, "glob", lambda pattern: pytest.fail("device files read"))
    assert local.machine_gpus() == count


def test_without_cuda_visible_devices_the_device_files_count(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    patterns = []
    monkeypatch.setattr(
        local.glob, "glob", lambda pattern: patterns.append(pattern) or ["/dev/nvidia0", "/dev/nvidia1"]
    )
    assert local.machine_gpus() == 2
    assert patterns == ["/dev/nvidia[0-9]*"]


def test_the_backend_defaults_to_this_machine(monkeypatch):
    monkeypatch.setattr(local, "machine_cpus", lambda: 5)
    monkeypatch.setattr(local, "machine_gpus", lambda: 3)
    backend = LocalBackend()
    assert (backend.cpus, backend.gpus) == (5, 3)
    backend = LocalBackend(cpus=0, gpus=0)
    assert (backend.cpus, backend.gpus) == (0, 0)


def test_admission_at_the_exact_limits():
    backend = LocalBackend(cpus=4, gpus=2)
    one_gpu = _resolved(ResourceConfig(cpu=2, device=GpuConfig(count=1)))
    assert backend.admit(one_gpu, [one_gpu])  # 4 of 4 CPUs, 2 of 2 GPUs
    assert not backend.admit(one_gpu, [one_gpu, one_gpu])
    three = _resolved(ResourceConfig.with_cpu(cpu=3))
    assert not LocalBackend(cpus=4, gpus=0).admit(_resolved(ResourceConfig.with_cpu(cpu=2)), [three])
    assert LocalBackend(cpus=5, gpus=0).admit(_resolved(ResourceConfig.with_cpu(cpu=2)), [three])
    assert backend.admit(_resolved(None), [one_gpu, one_gpu, one_gpu])  # light: always


def test_prepare_records_where_a_step_runs():
    backend = LocalBackend(cpus=4, gpus=1)
    assert backend.prepare(_resolved(None)) == {"backend": "local", "where": "driver"}
    assert backend.prepare(_resolved(ResourceConfig(cpu=2, device=GpuConfig(count=1)))) == {
        "backend": "local",
        "where": "subprocess",
        "hosted": True,
        "cpu": 2.0,
        "gpu": 1,
    }
    assert backend.prepare(_resolved({"accelerator": "any"})) == {
        "backend": "local",
        "where": "subprocess",
        "hosted": True,
        "cpu": "all",
        "gpu": "all",
    }


# -- the child's payload, log and result ---------------------------------------------------------


def test_the_payload_carries_the_import_path_the_step_and_the_log_mode(monkeypatch):
    import cloudpickle

    step = _resolved(ResourceConfig.with_cpu(cpu=1))
    monkeypatch.setattr(sys, "path", ["", "/a", "/b"])
    sys_path, blob, spec, log_is_stdout = pickle.loads(local._payload(step, {"spec": 1}, True))
    assert sys_path == ["/a", "/b"]
    fn, config = cloudpickle.loads(blob)
    assert fn is record_interval and config == step.config
    assert spec == {"spec": 1} and log_is_stdout is True
    assert pickle.loads(local._payload(step, None, False))[3] is False


def test_an_unpicklable_step_is_refused_with_the_reason():
    step = _resolved(ResourceConfig.with_cpu(cpu=1))
    bad = dataclasses.replace(step, config=threading.Lock())
    with pytest.raises(StepFunctionError) as caught:
        local._payload(bad, None, True)
    message = str(caught.value)
    assert message.startswith("step 's': its function and config cannot be sent to a subprocess (TypeError: ")
    assert message.endswith("make them picklable, or drop `resources` to run the step in the driver")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_the_log_is_opened_for_appending_with_its_directory(tmp_path):
    assert local._open_log(None) is subprocess.DEVNULL
    path = tmp_path / "a" / "b" / ".executor_log"
    handle = local._open_log(str(path))
    try:
        handle.write(b"one\n")
    finally:
        handle.close()
    handle = local._open_log(str(path))
    try:
        handle.write(b"two\n")
    finally:
        handle.close()
    assert path.read_bytes() == b"one\ntwo\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"outcome": "succeeded", "error": null}', {"outcome": "succeeded", "error": None}),
        ('{"outcome": "failed", "error": "E: x"}', {"outcome": "failed", "error": "E: x"}),
        ('{"outcome": 3}', None),
        ('{"error": "x"}', None),
        ('["outcome"]', None),
        ("not json", None),
        ("", None),
    ],
)
def test_the_result_is_read_once_and_checked(tmp_path, text, expected):
    path = tmp_path / "r.json"
    path.write_text(text)
    assert local._read_result(str(path)) == expected
    assert not path.exists()
    assert local._read_result(str(path)) is None  # none written (killed)


def test_a_huge_result_is_not_read_whole(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"outcome": "failed", "error": "x" * (1 << 20)}))
    assert local._read_result(str(path)) is None  # cut at 1 MiB: not JSON any more
    path.write_text(json.dumps({"outcome": "failed", "error": "x" * ((1 << 20) - 40)}))
    assert local._read_result(str(path))["outcome"] == "failed"


class _FakeProcess:
    def __init__(self, polls_before_exit: int, log=None, lines=()):
        self.polls = 0
        self.exit_after = polls_before_exit
        self.log, self.lines = log, list(lines)
        self.pid = 999999999

    def poll(self):
        self.polls += 1
        if self.log is not None and self.lines:
            with open(self.log, "ab") as handle:
                handle.write(self.lines.pop(0))
        return 0 if self.polls > self.exit_after else None


def test_the_log_is_echoed_to_the_console_while_the_step_runs(tmp_path, monkeypatch):
    log = tmp_path / ".executor_log"
    log.write_bytes(b"from an earlier attempt\n")
    written = []
    monkeypatch.setattr("executor.logs.console_write", written.append)
    process = _FakeProcess(2, str(log), [b"one\n", "two \xe9\n".encode(), b"\xff\n"])
    started = time.time()
    local._echo_while_running(process, str(log))
    assert "".join(written) == "one\ntwo \xe9\n\ufffd\n"  # only what this attempt wrote
    assert process.polls == 3
    assert 0.15 <= time.time() - started < 5  # polls every 0.1 s


def test_no_local_log_means_nothing_to_echo(tmp_path, monkeypatch):
    written = []
    monkeypatch.setattr("executor.logs.console_write", written.append)
    local._echo_while_running(_FakeProcess(1), None)
    assert written == []
    local._echo_while_running(_FakeProcess(0), str(tmp_path / "missing.log"))  # never written
    assert written == []


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_kill_stops_the_whole_process_group():
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, time; print(subprocess.Popen(['sleep', '60']).pid, flush=True); time.sleep(60)",
        ],
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    grandchild = int(process.stdout.readline())
    local._kill(process)
    assert process.wait(timeout=10) == -signal.SIGKILL
    deadline = time.time() + 10
    while not _dead(grandchild) and time.time() < deadline:
        time.sleep(0.05)
    assert _dead(grandchild)  # the heartbeat (same group) is gone too
    process.stdout.close()
    local._kill(process)  # already gone: no error


def test_cancel_before_the_process_starts_kills_it_at_once_and_close_cancels_all(monkeypatch):
    backend = LocalBackend(cpus=1, gpus=0)
    killed = []
    monkeypatch.setattr(local, "_kill", killed.append)
    backend.cancel("out/a")
    assert backend._cancelled == {"out/a"} and killed == []
    backend._processes["out/b"] = "process-b"
    backend._processes["out/c"] = "process-c"
    backend.close()
    assert sorted(killed) == ["process-b", "process-c"]
    assert backend._cancelled == {"out/a", "out/b", "out/c"}


# -- the backend helpers -------------------------------------------------------------------------


def test_a_gang_process_environment_round_trips():
    process = DistributedProcess("10.0.0.1:1234", 4, 3)
    env = process.env()
    assert env == {
        "MARIN_COORDINATOR_ADDRESS": "10.0.0.1:1234",
        "MARIN_NUM_PROCESSES": "4",
        "MARIN_PROCESS_ID": "3",
    }
    assert DistributedProcess.from_env(env) == process
    assert DistributedProcess.from_env({k: f" {v} " for k, v in env.items()}) == process
    assert DistributedProcess.from_env({}) is None
    assert DistributedProcess.from_env({"MARIN_PROCESS_ID": "  "}) is None


def test_a_gang_process_environment_is_read_from_os_environ(monkeypatch):
    for name, value in DistributedProcess("h:1", 2, 0).env().items():
        monkeypatch.setenv(name, value)
    assert DistributedProcess.from_env() == DistributedProcess("h:1", 2, 0)


def test_an_incomplete_gang_environment_names_what_is_missing():
    with pytest.raises(ValueError) as caught:
        DistributedProcess.from_env({"MARIN_NUM_PROCESSES": "2"})
    assert str(caught.value) == (
        "$MARIN_COORDINATOR_ADDRESS, $MARIN_PROCESS_ID not set, but $MARIN_NUM_PROCESSES is: a process "
        "of a gang needs all three (coordinator host:port, process count, its index)"
    )


@pytest.mark.parametrize(("count", "index"), [("2", "2"), ("x", "0"), ("2", "-1"), ("2", "1.0"), ("1", "3")])
def test_a_malformed_gang_environment_is_refused(count, index):
    with pytest.raises(ValueError) as caught:
        DistributedProcess.from_env(
            {"MARIN_COORDINATOR_ADDRESS": "h:1", "MARIN_NUM_PROCESSES": count, "MARIN_PROCESS_ID": index}
        )
    assert str(caught.value) == (
        f"$MARIN_NUM_PROCESSES={count!r}, $MARIN_PROCESS_ID={index!r}: expected integers with "
        "0 <= process id < process count"
    )


def test_the_last_process_of_a_gang_is_accepted():
    env = {"MARIN_COORDINATOR_ADDRESS": "h:1", "MARIN_NUM_PROCESSES": "3", "MARIN_PROCESS_ID": "2"}
    assert DistributedProcess.from_env(env).process_id == 2


def test_the_driver_backend_runs_light_steps_here_and_no_heavy_ones():
    backend = Backend()
    step = _resolved(None)
    assert backend.name == "driver"
    assert backend.admit(step, [step, step]) is True
    assert backend.prepare(step) == {"backend": "driver", "where": "driver"}
    ran = []
    fake = type("S", (), {"step": type("T", (), {"fn": staticmethod(ran.append)})(), "config": {"c": 1}})()
    backend.call(fake, {})
    assert ran == [{"c": 1}]
    with pytest.raises(NotImplementedError, match="the driver backend runs no heavy steps"):
        backend.call_hosted(step, {}, None)
    assert backend.start() is None and backend.cancel("x") is None and backend.close() is None


def test_step_cancelled_and_refused_are_step_function_errors():
    from executor.backends import StepRefused

    assert issubclass(StepCancelled, StepFunctionError)
    assert issubclass(StepRefused, StepCancelled)


def test_the_child_environment_puts_this_code_first_and_drops_the_wandb_service(monkeypatch):
    import executor

    root = os.path.dirname(os.path.dirname(os.path.abspath(executor.__file__)))
    monkeypatch.setenv("WANDB_SERVICE", "2-123-tcp-localhost-4567")
    monkeypatch.setenv("MARIN_SOMETHING", "kept")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = child_env()
    assert "WANDB_SERVICE" not in env and "WANDB_SERVICE" in CHILD_ENV_DROPPED
    assert env["MARIN_SOMETHING"] == "kept"
    assert env["PYTHONPATH"] == f"{root}{os.pathsep}/elsewhere"
    monkeypatch.delenv("PYTHONPATH")
    assert child_env()["PYTHONPATH"] == root
    assert os.environ["WANDB_SERVICE"]  # the driver's own environment is untouched


def test_extend_sys_path_puts_entries_first_in_order_once(monkeypatch):
    monkeypatch.setattr(sys, "path", ["/x", "/y"])
    extend_sys_path(["/a", "/b", "/y"])
    assert sys.path == ["/a", "/b", "/x", "/y"]
    extend_sys_path(["/a", "/b"])
    assert sys.path == ["/a", "/b", "/x", "/y"]


def test_is_heavy():
    assert not is_heavy(_resolved(None))
    assert is_heavy(_resolved({}))
    assert is_heavy(_resolved(ResourceConfig.with_cpu(cpu=1)))


def test_backend_names(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert backend_name(None) == "local"
    monkeypatch.setenv(BACKEND_ENV, " ray ")
    assert backend_name(None) == "ray"
    assert backend_name("local") == "local"
    assert backend_name(None, environ=False) == "local"
    monkeypatch.setenv(BACKEND_ENV, "slurm")
    with pytest.raises(ValueError) as caught:
        backend_name(None)
    assert str(caught.value) == "$MARIN_BACKEND='slurm': unknown backend; use one of local, ray"
    with pytest.raises(ValueError) as caught:
        backend_name("k8s", flag="--where")
    assert str(caught.value) == "--where='k8s': unknown backend; use one of local, ray"


def test_open_backend(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert type(open_backend()) is LocalBackend
    from executor.backends.ray_cluster import RayBackend

    ray = open_backend("ray", ray_address="ray://head:10001")
    assert type(ray) is RayBackend and ray.address == "ray://head:10001"
    assert open_backend("ray").address is None


@dataclasses.dataclass(frozen=True)
class ExitConfig:
    output_path: str
    code: int


def exit_with(config: ExitConfig) -> None:
    os._exit(config.code)


def test_a_child_that_dies_without_a_result_names_its_exit_code(tmp_path):
    import time as _time

    from executor.backends.host import HostedStep
    from executor.graph import resolve
    from executor.store import open_store
    from executor.tree import LeaseRecord, lease_path

    step = ExecutorStep(
        name="dies",
        fn=exit_with,
        config=ExitConfig(output_path=this_output_path(), code=versioned(7)),
        resources=ResourceConfig.with_cpu(cpu=1),
    )
    resolved = resolve([step], str(tmp_path)).steps[0]
    lease = LeaseRecord(worker="drv:1:aaaa", heartbeat=_time.time()).to_bytes()
    open_store(str(tmp_path)).write_atomic(lease_path(resolved.output_path), lease)
    spec = HostedStep("dies", str(tmp_path), resolved.output_path, lease, "drv:1:aaaa", 60.0, "h", "d")
    with pytest.raises(StepFunctionError) as caught:
        LocalBackend(cpus=1, gpus=0).call_hosted(resolved, {}, spec)
    assert type(caught.value) is StepFunctionError
    assert str(caught.value) == "the step's process died without a result (exit code 7)"


@dataclasses.dataclass(frozen=True)
class StdinConfig:
    output_path: str
    marker: int


def report_stdin(config: StdinConfig) -> None:
    null = os.stat(os.devnull)
    mine = os.fstat(0)
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "stdin.txt"), "w") as handle:
        handle.write("devnull" if (mine.st_dev, mine.st_ino) == (null.st_dev, null.st_ino) else "inherited")


def test_the_child_reads_nothing_from_the_drivers_stdin(tmp_path):
    import time as _time

    from executor.backends.host import HostedStep
    from executor.graph import resolve
    from executor.store import open_store
    from executor.tree import LeaseRecord, lease_path

    step = ExecutorStep(
        name="stdin",
        fn=report_stdin,
        config=StdinConfig(output_path=this_output_path(), marker=versioned(1)),
        resources=ResourceConfig.with_cpu(cpu=1),
    )
    resolved = resolve([step], str(tmp_path)).steps[0]
    lease = LeaseRecord(worker="drv:1:aaaa", heartbeat=_time.time()).to_bytes()
    open_store(str(tmp_path)).write_atomic(lease_path(resolved.output_path), lease)
    spec = HostedStep("stdin", str(tmp_path), resolved.output_path, lease, "drv:1:aaaa", 60.0, "h", "d")
    read_end, write_end = os.pipe()  # the driver's stdin is a pipe here, never /dev/null
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        result = LocalBackend(cpus=1, gpus=0).call_hosted(resolved, {}, spec)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)
    assert result["outcome"] == "succeeded"
    with open(os.path.join(resolved.output_path, "stdin.txt")) as handle:
        assert handle.read() == "devnull"


def test_a_hosted_step_runs_with_the_child_environment(tmp_path, monkeypatch):
    """The step's process gets `child_env()`: the driver's variables without $WANDB_SERVICE."""
    from executor import Executor
    from tests.executor.steps_for_heavy import EnvConfig, record_env

    monkeypatch.setenv("WANDB_SERVICE", "2-123-tcp-localhost-4567")
    monkeypatch.setenv("MARIN_SOMETHING", "kept")
    step = ExecutorStep(
        name="env",
        fn=record_env,
        config=EnvConfig(output_path=this_output_path()),
        resources=ResourceConfig.with_cpu(cpu=1),
    )
    executor = Executor(str(tmp_path), console=False)
    executor.run([step])
    with open(os.path.join(executor.output_paths[step], "env.json")) as handle:
        assert json.load(handle) == {"WANDB_SERVICE": None, "MARIN_SOMETHING": "kept"}
