"""The local backend, and choosing a backend (the Ray backend: tests/integration/test_ray_backend.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from executor import Executor, ExecutorRunError, ExecutorStep, ResourceConfig, this_output_path, versioned
from executor.backends import BACKEND_ENV, backend_name, open_backend
from executor.backends.local import LocalBackend, Request, request_of
from executor.events import StepStarted
from executor.main import parse_flags
from executor.resources import GpuConfig
from executor.tree import Status, read_info, read_status
from tests.executor.steps_for_heavy import (
    IntervalConfig,
    MeetConfig,
    SleepConfig,
    boom,
    meet,
    record_interval,
    sleep_then_write,
)

REPO = Path(__file__).resolve().parents[2]


def interval_step(name: str, index: int, resources, **fields) -> ExecutorStep:
    return ExecutorStep(
        name=name,
        fn=record_interval,
        config=IntervalConfig(output_path=this_output_path(), index=versioned(index), **fields),
        resources=resources,
    )


def read_interval(executor: Executor, step: ExecutorStep) -> list:
    return json.loads((Path(executor.output_paths[step]) / "interval.json").read_text())


# -- requests and admission ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        (None, Request(cpu=0, gpu=0)),
        ({"cpu": 2}, Request(cpu=2, gpu=0)),
        ({"cpu": 1, "gpu": 2}, Request(cpu=1, gpu=2)),
        ({"accelerator": "any"}, Request(cpu=0, gpu=0, whole_machine=True)),
        ({}, Request(cpu=0, gpu=0, whole_machine=True)),
        (ResourceConfig.with_cpu(cpu=3), Request(cpu=3, gpu=0)),
        (ResourceConfig.with_gpu("H100", count=2, cpu=4), Request(cpu=4, gpu=2)),
        (ResourceConfig.with_tpu("v4-8"), Request(cpu=0, gpu=0, whole_machine=True)),
    ],
)
def test_what_a_step_asks_of_this_machine(resources, expected):
    assert request_of(resources) == expected


def _resolved(resources):
    from executor.graph import resolve

    step = interval_step("s", 0, resources)
    return resolve([step], "/tmp/unused").steps[0]


def test_admission_by_cpus_and_gpus():
    backend = LocalBackend(cpus=4, gpus=1)
    two_cpus = _resolved(ResourceConfig.with_cpu(cpu=2))
    three_cpus = _resolved(ResourceConfig.with_cpu(cpu=3))
    gpu = _resolved(ResourceConfig(cpu=1, device=GpuConfig(count=1)))
    whole = _resolved({"accelerator": "any"})
    light = _resolved(None)
    assert backend.admit(two_cpus, [two_cpus])  # 4 of 4 CPUs
    assert not backend.admit(three_cpus, [two_cpus])  # 5 of 4
    assert backend.admit(gpu, [two_cpus])
    assert not backend.admit(gpu, [gpu])  # 2 GPUs of 1
    assert not backend.admit(whole, [two_cpus]) and not backend.admit(two_cpus, [whole])
    assert backend.admit(light, [whole])  # light steps are not counted
    assert backend.admit(three_cpus, [light, light])
    assert LocalBackend(cpus=1, gpus=0).admit(_resolved(ResourceConfig.with_cpu(cpu=8)), [])  # alone: runs


# -- heavy steps in their own processes ------------------------------------------------------


def test_a_heavy_step_runs_in_its_own_process_and_its_output_lands_in_its_log(tmp_path):
    step = interval_step("heavy", 1, ResourceConfig.with_cpu(cpu=1), hold=0)
    executor = Executor(str(tmp_path), console=False)
    executor.run([step])
    start, end, pid = read_interval(executor, step)
    assert pid != os.getpid() and start <= end
    output = executor.output_paths[step]
    log = (Path(output) / ".executor_log").read_text()
    assert f"step 1 running in process {pid}" in log
    info = read_info(executor.store, output)
    assert info["dispatch"] == {
        "backend": "local",
        "where": "subprocess",
        "hosted": True,
        "cpu": 1.0,
        "gpu": 0,
    }
    assert [event.status for event in read_status(executor.store, output)] == [Status.RUNNING, Status.SUCCESS]
    # The console and listeners are told where the hosted step's log is.
    (started,) = [event for event in executor.events if isinstance(event, StepStarted)]
    assert started.log_path == str(Path(output) / ".executor_log")


def test_light_steps_stay_in_the_driver(tmp_path):
    step = interval_step("light", 1, None, hold=0)
    executor = Executor(str(tmp_path), console=False)
    executor.run([step])
    assert read_interval(executor, step)[2] == os.getpid()
    assert read_info(executor.store, executor.output_paths[step])["dispatch"] == {
        "backend": "local",
        "where": "driver",
    }


def test_two_heavy_steps_that_fit_run_at_the_same_time(tmp_path):
    a_dir, b_dir = tmp_path / "out" / "a-dir", tmp_path / "out" / "b-dir"
    steps = [
        ExecutorStep(
            name=name,
            fn=meet,
            config=MeetConfig(output_path=str(mine), me=versioned(name), other=str(other)),
            resources=ResourceConfig.with_cpu(cpu=1),
            override_output_path=str(mine),
        )
        for name, mine, other in (("a", a_dir, b_dir), ("b", b_dir, a_dir))
    ]
    Executor(str(tmp_path / "out"), console=False, backend=LocalBackend(cpus=2, gpus=0)).run(steps)
    assert (a_dir / "started").read_text() != (b_dir / "started").read_text()  # two processes


def test_heavy_steps_that_do_not_fit_together_take_turns(tmp_path):
    steps = [interval_step(f"h{i}", i, ResourceConfig.with_cpu(cpu=2)) for i in range(2)]
    executor = Executor(str(tmp_path), console=False, backend=LocalBackend(cpus=3, gpus=0))
    executor.run(steps)
    first, second = sorted(read_interval(executor, step) for step in steps)
    assert first[1] <= second[0]


def test_a_failing_heavy_step_fails_alone_with_its_message_and_traceback(tmp_path):
    bad = ExecutorStep(
        name="bad",
        fn=boom,
        config=IntervalConfig(output_path=this_output_path(), index=versioned(7)),
        resources={"cpu": 1},
    )
    good = interval_step("good", 2, None, hold=0)
    executor = Executor(str(tmp_path), console=False)
    with pytest.raises(ExecutorRunError) as caught:
        executor.run([bad, good])
    (failure,) = caught.value.failures
    assert failure.name == "bad" and failure.error == "ValueError: boom 7"
    log = (Path(executor.output_paths[bad]) / ".executor_log").read_text()
    assert "about to fail" in log and "Traceback" in log and "ValueError: boom 7" in log
    assert read_status(executor.store, executor.output_paths[bad])[-1].status == Status.FAILED
    assert read_status(executor.store, executor.output_paths[good])[-1].status == Status.SUCCESS


def test_a_cancelled_heavy_step_is_killed_and_never_marked_successful(tmp_path):
    backend = LocalBackend()
    step = ExecutorStep(
        name="sleepy",
        fn=sleep_then_write,
        config=SleepConfig(output_path=this_output_path(), seconds=versioned(30.0)),
        resources={"cpu": 1},
    )
    executor = Executor(str(tmp_path), console=False, backend=backend)
    errors: list[BaseException] = []

    def run():
        try:
            executor.run([step])
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=run)
    started = time.time()
    thread.start()
    deadline = time.time() + 30
    while not backend._processes and time.time() < deadline:
        time.sleep(0.02)
    (output,) = list(backend._processes)
    while "sleeping" not in _read(Path(output) / ".executor_log") and time.time() < deadline:
        time.sleep(0.02)
    backend.cancel(output)
    thread.join(30)
    assert not thread.is_alive() and time.time() - started < 25
    (error,) = errors
    assert isinstance(error, ExecutorRunError) and "stopped" in error.failures[0].error
    assert [event.status for event in read_status(executor.store, output)] == [Status.RUNNING, Status.FAILED]
    assert not (Path(output) / ".executor_status.lock").exists()
    assert read_status(executor.store, output)[-1].status == Status.FAILED
    assert not (Path(output) / "woke").exists()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_a_heavy_step_that_cannot_be_pickled_is_refused_with_the_reason(tmp_path):
    lock = threading.Lock()
    step = ExecutorStep(
        name="locked",
        fn=lambda config: lock.acquire(),
        config=IntervalConfig(output_path=this_output_path()),
        resources={"cpu": 1},
    )
    with pytest.raises(ExecutorRunError) as caught:
        Executor(str(tmp_path), console=False).run([step])
    message = caught.value.failures[0].error
    assert (
        "step 'locked'" in message and "cannot be sent to a subprocess" in message and "resources" in message
    )


# -- choosing the backend ------------------------------------------------------------------------


def test_the_backend_comes_from_the_argument_then_the_environment(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert backend_name(None) == "local"
    assert backend_name("ray") == "ray"
    monkeypatch.setenv(BACKEND_ENV, "ray")
    assert backend_name(None) == "ray"
    assert backend_name("local") == "local"
    monkeypatch.setenv(BACKEND_ENV, "slurm")
    with pytest.raises(ValueError, match=r"\$MARIN_BACKEND='slurm': unknown backend; use one of local, ray"):
        backend_name(None)
    with pytest.raises(ValueError, match=r"^backend='k8s': unknown backend"):
        Executor("/tmp/x", backend="k8s")
    assert type(Executor("/tmp/x").backend) is str and Executor("/tmp/x").backend == "local"  # no env


def test_opening_the_ray_backend_imports_no_ray():
    code = (
        "import sys; from executor.backends import open_backend; b = open_backend('ray', '127.0.0.1:1');"
        "print(type(b).__name__, 'ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["RayBackend", "False"]
    assert type(open_backend("local")).__name__ == "LocalBackend"


def test_a_dry_run_with_the_ray_backend_imports_no_ray(tmp_path):
    script = tmp_path / "exp.py"
    script.write_text(
        "import sys\n"
        "from executor import ExecutorStep, ResourceConfig, executor_main, this_output_path, versioned\n"
        "from tests.executor.steps_for_heavy import IntervalConfig, record_interval\n"
        "step = ExecutorStep(name='t', fn=record_interval, resources=ResourceConfig.with_tpu('v4-8'),\n"
        "    config=IntervalConfig(output_path=this_output_path(), index=versioned(1)))\n"
        "if __name__ == '__main__':\n"
        "    executor_main([step])\n"
        "    print('RAY LOADED' if 'ray' in sys.modules else 'NO RAY')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [
            sys.executable,
            str(script),
            "--prefix",
            str(tmp_path / "out"),
            "--dry_run",
            "true",
            "--backend",
            "ray",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert "NO RAY" in out.stdout and "run     t" in out.stdout


def test_backend_flags_are_read():
    config = parse_flags(["--backend", "ray", "--ray_address", "127.0.0.1:6379"])
    assert (config.backend, config.ray_address) == ("ray", "127.0.0.1:6379")
    config = parse_flags(["--backend=local", "--ray_address=ray://head.example:10001"])
    assert (config.backend, config.ray_address) == ("local", "ray://head.example:10001")
    assert parse_flags([]).backend is None


def test_an_unknown_backend_flag_is_a_usage_error(tmp_path):
    code = (
        "import sys; sys.argv = ['x', '--prefix', sys.argv[1], '--backend', 'slurm'];"
        "from executor import executor_main; executor_main([])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 2
    assert out.stderr.strip() == "error: --backend='slurm': unknown backend; use one of local, ray"


def test_marin_backend_is_read_by_executor_main(tmp_path):
    code = (
        "import sys; sys.argv = ['x', '--prefix', sys.argv[1], '--dry_run', 'true'];"
        "from executor import executor_main; print(executor_main([]).backend)"
    )
    env = {**os.environ, BACKEND_ENV: "ray"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=REPO, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "ray"
    env[BACKEND_ENV] = "slurm"
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=REPO, env=env
    )
    assert out.returncode == 2
    assert out.stderr.strip() == "error: $MARIN_BACKEND='slurm': unknown backend; use one of local, ray"


def test_a_heavy_step_whose_process_dies_is_submitted_again_and_each_attempt_is_recorded(tmp_path):
    backend = LocalBackend()
    step = ExecutorStep(
        name="fragile",
        fn=sleep_then_write,
        config=SleepConfig(output_path=this_output_path(), seconds=versioned(1.0)),
        resources={"cpu": 1},
    )
    executor = Executor(str(tmp_path), console=False, backend=backend)
    killed: list[int] = []

    def kill_the_first_attempt():
        deadline = time.time() + 30
        while time.time() < deadline and not killed:
            processes = list(backend._processes.values())
            if processes:
                os.kill(processes[0].pid, 9)  # as a lost machine would: no result, no status
                killed.append(processes[0].pid)
            time.sleep(0.02)

    killer = threading.Thread(target=kill_the_first_attempt)
    killer.start()
    executor.run([step])
    killer.join()
    output = executor.output_paths[step]
    history = read_status(executor.store, output)
    assert [event.status for event in history] == [Status.RUNNING, Status.RUNNING, Status.SUCCESS]
    assert history[1].message == "attempt 2 of 3"
    assert (Path(output) / "woke").read_text() == "late"
    assert not (Path(output) / ".executor_status.lock").exists()


def test_a_heavy_step_that_keeps_dying_fails_after_max_retries(tmp_path):
    backend = LocalBackend()
    step = ExecutorStep(
        name="doomed",
        fn=sleep_then_write,
        config=SleepConfig(output_path=this_output_path(), seconds=versioned(30.0)),
        resources={"cpu": 1},
    )
    executor = Executor(str(tmp_path), console=False, backend=backend, max_retries=1)
    stop = threading.Event()

    def keep_killing():
        seen = set()
        while not stop.is_set():
            for process in list(backend._processes.values()):
                if process.pid not in seen:
                    seen.add(process.pid)
                    os.kill(process.pid, 9)
            time.sleep(0.02)

    killer = threading.Thread(target=keep_killing)
    killer.start()
    try:
        with pytest.raises(ExecutorRunError) as caught:
            executor.run([step])
    finally:
        stop.set()
        killer.join()
    assert "after 2 attempts" in caught.value.failures[0].error
    history = read_status(executor.store, executor.output_paths[step])
    assert [event.status for event in history] == [Status.RUNNING, Status.RUNNING, Status.FAILED]


def test_max_retries_is_read_checked_and_reaches_the_executor(tmp_path, monkeypatch):
    from executor import main as main_module
    from executor.main import UsageError

    assert parse_flags(["--max_retries", "5"]).max_retries == 5
    assert parse_flags(["--max_retries=0"]).max_retries == 0
    assert parse_flags([]).max_retries is None
    with pytest.raises(UsageError, match=r"^--max_retries must be at least 0, got -1$"):
        parse_flags(["--max_retries", "-1"])
    with pytest.raises(ValueError, match="max_retries must be at least 0, got -2"):
        Executor(str(tmp_path), max_retries=-2)
    assert Executor(str(tmp_path)).max_retries == 2
    seen = {}
    monkeypatch.setattr(
        sys, "argv", ["x", "--prefix", str(tmp_path), "--max_retries", "7", "--dry_run", "true"]
    )
    original = main_module.Executor

    def recording(*args, **kwargs):
        executor = original(*args, **kwargs)
        seen["max_retries"] = executor.max_retries
        return executor

    monkeypatch.setattr(main_module, "Executor", recording)
    main_module.executor_main([])
    assert seen == {"max_retries": 7}
    monkeypatch.setattr(sys, "argv", ["x", "--prefix", str(tmp_path), "--dry_run", "true"])
    main_module.executor_main([])
    assert seen == {"max_retries": 2}  # the Executor's default when the flag is absent


# -- gangs: one step run by several processes (on Ray: tests/integration/test_multihost_training.py) --


def test_a_gang_process_reads_its_place_from_the_environment():
    from executor.backends import DistributedProcess

    assert DistributedProcess.from_env({}) is None
    place = DistributedProcess("10.0.0.2:8476", 4, 3)
    assert DistributedProcess.from_env(place.env()) == place
    with pytest.raises(ValueError, match=r"\$MARIN_PROCESS_ID not set"):
        DistributedProcess.from_env({k: v for k, v in place.env().items() if k != "MARIN_PROCESS_ID"})
    with pytest.raises(ValueError, match="0 <= process id < process count"):
        DistributedProcess.from_env({**place.env(), "MARIN_PROCESS_ID": "4"})


def test_replicas_and_slices_of_several_hosts_become_gangs_of_one_bundle_per_host():
    from executor.backends.ray_cluster import _choices

    (cpu,) = _choices(ResourceConfig(cpu=2, ram="1g", replicas=3))
    assert (cpu.processes, cpu.description) == (3, "CPU x3 replicas")
    assert cpu.bundles[0] == {"CPU": 2, "memory": 2**30}
    assert cpu.environment(2, "10.0.0.2:8476", "10.0.0.2") == {
        "MARIN_COORDINATOR_ADDRESS": "10.0.0.2:8476",
        "MARIN_NUM_PROCESSES": "3",
        "MARIN_PROCESS_ID": "2",
    }
    (alone,) = _choices(ResourceConfig.with_tpu("v4-8"))  # one host: no gang
    assert alone.processes == 1 and alone.bundles == ({"CPU": 1, "TPU": 4, "TPU-v4-8-head": 1},)
    (single_hosts,) = _choices(ResourceConfig.with_tpu("v4-8", slice_count=2))
    assert single_hosts.bundles == ({"CPU": 1, "TPU": 4, "TPU-v4-8-head": 1},) * 2
    # a slice of 4 hosts: the head is reserved apart; JAX reads the slice's own metadata, and
    # two slices talk through Megascale (coordinator on process 0's node)
    (pods,) = _choices(ResourceConfig.with_tpu("v4-32", slice_count=2))
    assert (pods.processes, pods.hosts_per_replica, pods.multi_host_slices) == (8, 4, True)
    assert pods.bundles == ({"CPU": 1, "TPU": 4},) * 8
    assert pods.environment(5, "unused", "10.0.0.2") == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2:8081",
        "MEGASCALE_PORT": "8081",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
    }
    assert pods.gang_record()["processes"] == 8


def node(labels=None, **resources):
    return {"Alive": True, "Resources": resources, "Labels": labels or {}}


def test_a_gang_is_placeable_only_on_as_many_distinct_nodes_that_hold_a_host_each():
    from executor.backends.ray_cluster import _choices

    (pair,) = _choices(ResourceConfig(cpu=1, replicas=2))
    assert not pair.placeable([node(CPU=8)])  # one big node is not two hosts
    assert not pair.placeable([node(CPU=1), node(CPU=0.5)])
    assert pair.placeable([node(CPU=1), node(CPU=1)])
    (pod,) = _choices(ResourceConfig.with_tpu("v4-32"))

    def tpu_slice(name, hosts):
        return [
            node(
                {
                    "ray.io/tpu-slice-name": name,
                    "ray.io/tpu-pod-type": "v4-32",
                    "ray.io/tpu-worker-id": str(i),
                },
                CPU=8,
                TPU=4,
                **({"TPU-v4-32-head": 1} if i == 0 else {}),
            )
            for i in range(hosts)
        ]

    # seven hosts of v4-32 are not one slice of four: they must be one slice's hosts
    assert not pod.placeable(tpu_slice("a", 3) + tpu_slice("b", 3)[1:] + tpu_slice("c", 1))
    assert pod.placeable(tpu_slice("a", 3) + tpu_slice("b", 4))
    (two_pods,) = _choices(ResourceConfig.with_tpu("v4-32", slice_count=2))
    assert not two_pods.placeable(tpu_slice("a", 3) + tpu_slice("b", 4))
    assert two_pods.placeable(tpu_slice("a", 4) + tpu_slice("b", 4))


def test_an_unplaceable_gang_is_refused_naming_the_step_what_it_asked_and_the_nodes():
    from executor.backends.ray_cluster import _choices, _unsatisfiable_message

    message = _unsatisfiable_message("train", _choices(ResourceConfig(cpu=2, replicas=4)), [node(CPU=2)] * 3)
    assert message == (
        "step 'train' asks for CPU x4 replicas: 4 processes on 4 different nodes, each with 2 CPU, and the live "
        "nodes of the Ray cluster cannot hold that (nodes: {2 CPU}, {2 CPU}, {2 CPU}). Add such nodes, lower "
        "ResourceConfig.replicas, change the step's resources, or set $MARIN_RAY_WAIT_FOR_NODES=1 if an "
        "autoscaler will add them"
    )


def hosted_spec(tmp_path):
    """A step's lease as the driver hands it over, and the spec a host gets with it."""
    from executor.backends.host import HostedStep
    from executor.store import open_store
    from executor.tree import LeaseRecord, lease_path

    store, output = open_store(str(tmp_path)), str(tmp_path / "step")
    lease = LeaseRecord(worker="driver:1", heartbeat=time.time()).to_bytes()
    store.makedirs(output)
    store.write_atomic(lease_path(output), lease)
    spec = HostedStep("step", str(tmp_path), output, lease, "driver:1", 5.0, "hash", "digest")
    return store, spec


def collective_cut_short(config) -> None:
    raise RuntimeError("gloo: connection closed by peer")


def test_process_0_of_a_gang_records_nothing_when_another_process_was_lost(tmp_path):
    from executor.backends.host import run_hosted
    from executor.tree import LeaseRecord, lease_path

    store, spec = hosted_spec(tmp_path)
    asked = []
    result = run_hosted(
        spec,
        collective_cut_short,
        None,
        on_start=lambda: asked.append("started"),
        peers_lost=lambda failed: asked.append(failed) or "process 1 of 2 was lost (ActorDiedError)",
    )
    assert result == {"outcome": "gang_lost", "error": "process 1 of 2 was lost (ActorDiedError)"}
    assert asked == ["started", True]
    assert read_status(store, spec.output_path) == []  # no FAILED: the driver submits the gang again
    held = LeaseRecord.parse(store.read_bytes(lease_path(spec.output_path)))
    assert held.worker.startswith("driver:1/step:")  # still the host's, for the driver to take back


def test_process_0_of_a_gang_records_a_failure_when_the_others_are_alive(tmp_path):
    from executor.backends.host import run_hosted

    store, spec = hosted_spec(tmp_path)
    result = run_hosted(spec, collective_cut_short, None, peers_lost=lambda failed: None)
    assert result["outcome"] == "failed" and "connection closed by peer" in result["error"]
    assert [event.status for event in read_status(store, spec.output_path)] == [Status.FAILED]


def test_a_gang_process_output_goes_to_a_log_file_of_its_own(tmp_path):
    import logging

    from executor.backends.host import capture_process_log
    from executor.store import open_store

    target = str(tmp_path / "step" / "logs" / "process-1.log")
    stdout = sys.stdout
    with capture_process_log(open_store(str(tmp_path)), target):
        print("from print")
        print("from stderr", file=sys.stderr)
        logging.getLogger("some.library").warning("from logging")
    assert sys.stdout is stdout
    text = Path(target).read_text()
    assert "from print\n" in text and "from stderr\n" in text and "some.library: from logging" in text
    print("after")  # no longer captured
    assert "after" not in Path(target).read_text()


def test_a_gang_process_log_on_an_object_store_is_uploaded(tmp_path):
    import uuid

    from executor.backends.host import capture_process_log
    from executor.store import open_store

    prefix = f"memory://gang-{uuid.uuid4().hex}"
    store = open_store(prefix)
    with capture_process_log(store, f"{prefix}/step/logs/process-2.log"):
        print("remote line")
    assert store.read_text(f"{prefix}/step/logs/process-2.log") == "remote line\n"


def test_the_training_operation_reads_the_place_the_executor_gives_a_gang_process():
    # operations never import the executor: the variable names are repeated there
    from executor.backends import DistributedProcess
    from operations.train import GANG_ENV, gang_from_env

    place = DistributedProcess("10.0.0.2:8476", 4, 3)
    assert tuple(place.env()) == GANG_ENV
    assert gang_from_env(place.env()) == ("10.0.0.2:8476", 4, 3)
    assert gang_from_env({}) is None
    with pytest.raises(ValueError, match=r"\$MARIN_PROCESS_ID=''"):
        gang_from_env({k: v for k, v in place.env().items() if k != "MARIN_PROCESS_ID"})


def uses_jax(config) -> None:
    import jax.numpy as jnp

    assert float(jnp.ones(3).sum()) == 3.0


def test_a_hosted_step_that_used_jax_records_its_devices_in_executor_info(tmp_path):
    import jax

    from executor.backends.host import run_hosted
    from executor.tree import read_info, write_info

    store, spec = hosted_spec(tmp_path)
    write_info(store, {"name": "step", "output_path": spec.output_path, "dispatch": {"backend": "local"}})
    assert run_hosted(spec, uses_jax, None)["outcome"] == "succeeded"
    devices = read_info(store, spec.output_path)["devices"]
    assert devices["backend"] == jax.default_backend() and devices["kind"] == jax.devices()[0].device_kind
    assert devices["count"] == len(jax.devices()) and devices["process_count"] == 1
    assert "memory_bytes_per_device" in devices  # None on a CPU


def test_devices_are_described_only_where_the_step_started_jax_and_jax_is_never_imported_for_it():
    code = (
        "import sys; from executor.backends.host import jax_devices; "
        "assert jax_devices() is None and 'jax' not in sys.modules; "
        "import jax; assert jax_devices() is None; "  # imported, no backend started yet
        "jax.numpy.ones(1); print(jax_devices()['backend'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=str(Path(__file__).parents[2]),
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cpu"


def test_a_step_process_does_not_inherit_the_drivers_wandb_service(monkeypatch):
    """A driver that used W&B in-process exports $WANDB_SERVICE; a step's process must start its
    own service (the driver's may be torn down by then: the quickstart then failed with
    WandbServiceConnectionError after another test had trained in-process)."""
    from executor.backends import child_env

    monkeypatch.setenv("WANDB_SERVICE", "2-123-unix-/tmp/wandb-gone/socket")
    monkeypatch.setenv("MARIN_SOMETHING", "kept")
    env = child_env()
    assert "WANDB_SERVICE" not in env and env["MARIN_SOMETHING"] == "kept"
    assert os.environ["WANDB_SERVICE"]  # the driver's own environment is left as it was
