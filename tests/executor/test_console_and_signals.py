"""A closed console, a failing event listener and SIGTERM: the run still ends, with its
statuses written and its leases released (run as a user would, in a subprocess, where the
failure was a hang or a killed driver)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from executor import Executor, ExecutorStep, this_output_path, versioned
from executor.console import ConsoleProgress
from executor.events import StepFailed, StepStarted, StepSucceeded
from executor.runner import ExecutorRunError
from executor.tree import Status, lease_path, read_status
from tests.executor.steps_for_tests import WriteConfig, write_value
from tests.fault_proxy import FaultProxy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent(
    """
    import os, time
    from dataclasses import dataclass
    from executor import ExecutorStep, executor_main, this_output_path, versioned

    @dataclass(frozen=True)
    class Config:
        name: str
        output_path: str

    def sleeps(config: Config) -> None:
        time.sleep(float(os.environ["STEP_SLEEP"]))
        print("the step prints", flush=True)  # to its log and to the console, which may be gone

    if __name__ == "__main__":
        import signal

        # Ctrl-C as from a terminal. A shell without job control starts background commands
        # (a test run started with `&`) with SIGINT ignored, which Python and this driver then
        # keep (as `nohup python experiment.py &` should): the tests' SIGINT would go unheard.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from executor import ResourceConfig

        heavy = ResourceConfig.with_cpu(cpu=1) if os.environ.get("HEAVY") else None  # a process of its own
        steps = [
            ExecutorStep(name="s/a", fn=sleeps, config=Config(versioned("a"), this_output_path()), resources=heavy),
            ExecutorStep(name="s/b", fn=sleeps, config=Config(versioned("b"), this_output_path())),
        ]
        executor_main(steps=steps)
    """
)


def write_step(name: str, fn=write_value) -> ExecutorStep:
    return ExecutorStep(
        name=name, fn=fn, config=WriteConfig(output_path=this_output_path(), value=versioned(name), key=name)
    )


def start_script(
    tmp_path,
    step_sleep: float,
    heavy: bool = False,
    shell_redirect: str = "",
    text: str = SCRIPT,
    extra_env: dict | None = None,
    **popen,
):
    """The experiment (`text`) in a subprocess; `shell_redirect` (e.g. ">&-") is applied by a shell."""
    script = tmp_path / "experiment.py"
    script.write_text(text)
    env = {key: value for key, value in os.environ.items() if key not in ("MARIN_PREFIX", "HEAVY")}
    env.pop("PYTHONUNBUFFERED", None)  # stdout block-buffered, as when piped to `head`
    env.update(
        PYTHONPATH=REPO, STEP_SLEEP=str(step_sleep), **({"HEAVY": "1"} if heavy else {}), **(extra_env or {})
    )
    env["PYTHONFAULTHANDLER"] = "1"  # a driver that hangs is dumped (`signal_when_running`), not just killed
    command = [sys.executable, str(script), "--prefix", str(tmp_path / "out")]
    if shell_redirect:
        command = ["sh", "-c", 'exec "$@" ' + shell_redirect, "sh", *command]
    return subprocess.Popen(command, cwd=tmp_path, env=env, **popen)


def assert_all_succeeded(tmp_path) -> None:
    dirs = step_dirs(tmp_path)
    assert len(dirs) == 2
    for path in dirs:
        assert last_status(path)["status"] == "SUCCESS", path
        assert not os.path.exists(os.path.join(path, ".executor_status.lock"))
        with open(os.path.join(path, ".executor_log")) as handle:
            assert "the step prints" in handle.read()  # what the console missed is in the log


def step_dirs(tmp_path) -> list[str]:
    base = tmp_path / "out" / "s"
    return sorted(str(base / name) for name in os.listdir(base)) if base.is_dir() else []


def last_status(path: str) -> dict | None:
    try:
        with open(os.path.join(path, ".executor_status")) as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return None
    return json.loads(lines[-1]) if lines else None


def wait_for_exit(process: subprocess.Popen, seconds: float) -> int:
    try:
        return process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"the driver was still running after {seconds:.0f} s (hung)")


def test_a_console_closed_mid_run_does_not_hang_the_run(tmp_path):
    # `script | head -1`: the reader goes away after the first line of the plan; the steps'
    # progress lines then meet a broken pipe in the worker threads.
    process = start_script(tmp_path, step_sleep=1.0, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline().startswith(b"Plan:")
    process.stdout.close()
    # The run ends as it would with a console: exit 0, no error (stderr is read as it comes,
    # so the driver never blocks on it).
    err = process.stderr.read().decode()
    assert wait_for_exit(process, 60) == 0, err
    assert "error:" not in err and "Traceback" not in err, err
    assert_all_succeeded(tmp_path)


@pytest.mark.parametrize("redirect", [">&-", ">&- 2>&-"], ids=["no-stdout", "no-stdout-no-stderr"])
def test_a_run_started_without_a_console_succeeds(tmp_path, redirect):
    """`python experiment.py >&-`: Python's sys.stdout (and sys.stderr) is None."""
    process = start_script(tmp_path, step_sleep=0.2, shell_redirect=redirect, stderr=subprocess.PIPE)
    _, err = process.communicate(timeout=60) if "2>&-" not in redirect else (None, b"")
    assert wait_for_exit(process, 60) == 0, err
    assert_all_succeeded(tmp_path)


@pytest.mark.slow
def test_a_heavy_step_printing_to_a_closed_console_succeeds(tmp_path):
    """Its process's output is followed onto the driver's console, which went away."""
    process = start_script(
        tmp_path, step_sleep=1.0, heavy=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout.readline().startswith(b"Plan:")
    process.stdout.close()
    err = process.stderr.read().decode()
    assert wait_for_exit(process, 120) == 0, err
    assert "error" not in err.lower(), err
    assert_all_succeeded(tmp_path)


def signal_when_running(
    process: subprocess.Popen, tmp_path, signum: int, running: int = 1
) -> tuple[bytes, bytes]:
    """Send `signum` once `running` steps are RUNNING; the driver's (stdout, stderr)."""
    try:
        deadline = time.monotonic() + 60
        while (
            len([p for p in step_dirs(tmp_path) if (last_status(p) or {}).get("status") == "RUNNING"])
            < running
        ):
            assert time.monotonic() < deadline, "the steps never started"
            assert process.poll() is None, process.communicate()
            time.sleep(0.05)
        process.send_signal(signum)
        try:
            return process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            # Still running 30 s after the signal: have it print every thread's stack (Python's
            # faulthandler, on SIGABRT) so that the failure says where it hangs.
            process.send_signal(signal.SIGABRT)
            try:
                _, err = process.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                err = b"(no stack dump within 10 s)"
            tail = (err or b"").decode(errors="replace")[-6000:]
            raise AssertionError(
                f"the driver did not exit 30 s after signal {signum}; its threads:\n{tail}"
            ) from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_end_the_run_as_ctrl_c_does(tmp_path, signum):
    """SIGHUP: the terminal or SSH session a run was started from closes. It killed the
    driver at once, leaving its steps RUNNING and leases the next run waited a minute for."""
    process = start_script(tmp_path, step_sleep=120, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = signal_when_running(process, tmp_path, signum)
    assert process.returncode == 130, (out, err)
    assert err.decode().strip().splitlines()[-1] == "error: interrupted"
    for path in step_dirs(tmp_path):
        assert last_status(path)["status"] == "FAILED"
        assert last_status(path)["message"] == "interrupted"
        assert not os.path.exists(os.path.join(path, ".executor_status.lock"))


@pytest.mark.parametrize("heavy", [False, True], ids=["light", "heavy"])
@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_a_signal_to_the_whole_process_group_releases_every_lease(tmp_path, signum, heavy):
    """A closing terminal signals the whole process group (Slurm's scancel every process),
    the lease keeper too. A keeper that died of it could not release the leases it had
    refreshed (older than a heartbeat): the driver called them lost and left them for the
    next run to wait out. The keeper ends when the driver closes its pipe, not by signals."""
    process = start_script(
        tmp_path,
        step_sleep=120,
        heavy=heavy,  # step s/a in a process of its own, with its own heartbeat process
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a terminal's job is
        extra_env={"MARIN_LEASE_HEARTBEAT": "0.2", "MARIN_LEASE_TIMEOUT": "30"},
    )
    try:
        deadline = time.monotonic() + 60
        while len([p for p in step_dirs(tmp_path) if (last_status(p) or {}).get("status") == "RUNNING"]) < 2:
            assert time.monotonic() < deadline and process.poll() is None, process.communicate()
            time.sleep(0.05)
        time.sleep(1.0)  # several heartbeats: the leases are the keeper's rewrites now
        os.killpg(process.pid, signum)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, (out, err)
    assert "lease" not in err.decode(), err  # no "treating the lease as lost", no keeper errors
    for path in step_dirs(tmp_path):
        assert last_status(path)["message"] == "interrupted"
        assert not os.path.exists(os.path.join(path, ".executor_status.lock")), path


def test_a_run_under_nohup_ignores_sighup_and_finishes(tmp_path):
    """`nohup python experiment.py &`: SIGHUP is ignored when the run starts, and stays so."""

    def ignore_sighup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    process = start_script(
        tmp_path, step_sleep=1.0, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=ignore_sighup
    )
    deadline = time.monotonic() + 60
    while not any((last_status(p) or {}).get("status") == "RUNNING" for p in step_dirs(tmp_path)):
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGHUP)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, (out, err)
    assert_all_succeeded(tmp_path)


def test_a_sigterm_handler_of_the_program_is_left_alone(tmp_path):
    seen = []

    def mine(signum, frame):
        pass

    def records_the_handler(config: WriteConfig) -> None:
        seen.append(signal.getsignal(signal.SIGTERM))

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        Executor(str(tmp_path), console=False).run([write_step("a", fn=records_the_handler)])
        assert seen == [mine]
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_default_sigterm_action_is_back_after_the_run(tmp_path):
    seen = []

    def records_the_handler(config: WriteConfig) -> None:
        seen.append(signal.getsignal(signal.SIGTERM))

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        Executor(str(tmp_path), console=False).run([write_step("a", fn=records_the_handler)])
        assert seen and seen[0] not in (signal.SIG_DFL, signal.SIG_IGN, None)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)


class _RaisingStream:
    def __init__(self):
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_the_console_stops_printing_once_its_stream_is_broken():
    stream = _RaisingStream()
    console = ConsoleProgress(total=1, stream=stream)
    console(StepStarted("a", "/p/a", log_path="/p/a/.executor_log"))
    console(StepSucceeded("a", "/p/a", duration=1.0))
    assert console.closed
    assert stream.writes == 1
    assert console.done == {"/p/a"}


def run_in_thread(run, steps, seconds: float = 60):
    """`run.run(steps)` in a thread: a hang fails the test instead of blocking it."""
    outcome: list = []

    def target() -> None:
        try:
            outcome.append(run.run(steps))
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the run was still waiting after {seconds:.0f} s (hung)"
    return outcome[0]


def raising_in_workers(error: BaseException):
    def emit(event) -> None:
        if threading.current_thread() is not threading.main_thread() and isinstance(
            event, (StepStarted, StepSucceeded, StepFailed)
        ):
            raise error

    return emit


def test_a_listener_raising_in_a_worker_thread_loses_no_step(tmp_path, monkeypatch):
    monkeypatch.setattr(Executor, "_dispatch", lambda self, listeners, plan: raising_in_workers(OSError(5)))
    run = Executor(str(tmp_path), console=False)
    result = run_in_thread(run, [write_step("a"), write_step("b")])
    assert not isinstance(result, BaseException), result
    for path in run.output_paths.values():
        assert [entry.status for entry in read_status(run.store, path)] == [Status.RUNNING, Status.SUCCESS]
        assert run.store.read_bytes(lease_path(path)) is None


def test_a_worker_whose_error_report_fails_still_reports_back(tmp_path, monkeypatch):
    # SystemExit is no Exception: it passes the listener guard and unwinds the worker itself.
    monkeypatch.setattr(
        Executor, "_dispatch", lambda self, listeners, plan: raising_in_workers(SystemExit(3))
    )
    run = Executor(str(tmp_path), console=False)
    result = run_in_thread(run, [write_step("a")])
    assert isinstance(result, ExecutorRunError), result
    assert "executor error: SystemExit" in str(result)
    path = run.output_paths[run.steps[0]]
    assert run.store.read_bytes(lease_path(path)) is None


def test_a_keyboard_interrupt_raised_by_a_step_fails_that_step_only(tmp_path):
    # Only the driver's main thread receives Ctrl-C (and SIGTERM): a KeyboardInterrupt in a step
    # is the step's own exception, a failure like SystemExit (as in a heavy step's process).
    def interrupts(config: WriteConfig) -> None:
        raise KeyboardInterrupt

    run = Executor(str(tmp_path), console=False)
    with pytest.raises(ExecutorRunError) as raised:
        run.run([write_step("a", fn=interrupts), write_step("b")])
    assert [failure.name for failure in raised.value.failures] == ["a"]
    statuses = {step.name: read_status(run.store, run.output_paths[step])[-1] for step in run.steps}
    assert statuses["a"].status == Status.FAILED
    assert statuses["a"].message.startswith("KeyboardInterrupt")
    assert statuses["b"].status == Status.SUCCESS


class _Unprintable(SystemExit):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_a_worker_reports_back_even_when_its_error_cannot_be_described(tmp_path, monkeypatch):
    monkeypatch.setattr(
        Executor, "_dispatch", lambda self, listeners, plan: raising_in_workers(_Unprintable())
    )
    run = Executor(str(tmp_path), console=False)
    result = run_in_thread(run, [write_step("a")])
    assert isinstance(result, ExecutorRunError), result
    assert "[failed] executor error: " in str(result)


SECOND_CTRL_C = SCRIPT.replace(
    'if __name__ == "__main__":\n',
    textwrap.dedent(
        """
        import signal
        import executor.runner

        _append = executor.runner.append_status

        def append_status(store, path, status, message, *args, **kwargs):
            if message == "interrupted" and not getattr(append_status, "pressed", False):
                append_status.pressed = True
                signal.raise_signal(signal.SIGINT)  # the second press, while the first is recorded
            return _append(store, path, status, message, *args, **kwargs)

        executor.runner.append_status = append_status

        if __name__ == "__main__":
        """
    ),
)


def test_a_second_ctrl_c_while_the_first_is_recorded_leaves_no_step_running(tmp_path):
    """Two quick presses: the second one cut the recording of the stopped steps short, which
    left them RUNNING with their leases (the next run waited out the lease timeout)."""
    process = start_script(
        tmp_path, step_sleep=120, text=SECOND_CTRL_C, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = signal_when_running(process, tmp_path, signal.SIGINT, running=2)
    assert process.returncode == 130, (out, err)
    assert err.decode().strip().splitlines()[-1] == "error: interrupted", err
    assert "press Ctrl-C again" in err.decode()
    for path in step_dirs(tmp_path):
        assert last_status(path)["status"] == "FAILED" and last_status(path)["message"] == "interrupted"
        assert not os.path.exists(os.path.join(path, ".executor_status.lock"))


def test_sigterm_while_the_plan_waits_on_storage_ends_as_ctrl_c_does(tmp_path):
    """Before the run installed its handler (the plan waiting out a storage client's retries),
    SIGTERM ended the driver by the signal: exit 143 and no message."""
    script = tmp_path / "experiment.py"
    script.write_text(SCRIPT)
    # Every request fails (503, 429 or a reset), so the client retries. (A port nobody listens
    # on no longer makes it wait: the run's connection probe refuses it at once.)
    with FaultProxy("http://127.0.0.1:1", fault_rate=1.0, seed=1) as proxy:
        environ = {key: value for key, value in os.environ.items() if key != "MARIN_PREFIX"}
        environ.update(
            PYTHONPATH=REPO,
            STEP_SLEEP="0",
            AWS_ENDPOINT_URL=proxy.url,
            AWS_ACCESS_KEY_ID="x",
            AWS_SECRET_ACCESS_KEY="y",
        )
        process = subprocess.Popen(
            [sys.executable, str(script), "--prefix", "s3://bucket/out"],
            cwd=tmp_path,
            env=environ,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            seen = []
            for line in process.stderr:
                seen.append(line)
                if "retry, attempt" in line:  # waiting on the storage client
                    process.send_signal(signal.SIGTERM)
                    break
            err = "".join(seen) + process.stderr.read()
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == "error: interrupted"
