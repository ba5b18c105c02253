"""operations/shards.py's per-shard map when processes die: no orphaned workers, no
temporary files left in an output that later completes.

The kill tests run a real driver process (`python -c`, importing this module's shard
function) whose workers write half of every odd shard, record their pid and then hold
the shard's temporary file open; the test kills the driver (or one worker, or sends the
driver Ctrl-C) and watches the recorded pids.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from operations.shards import TEMP_PREFIX, document_writer, map_shards, remove_temp_files

REPO = Path(__file__).resolve().parents[2]
HOLD_ENV = "MARIN_TEST_SHARD_HOLD_DIR"
SHARDS = 4
WORKERS = 2
HOLD_SECONDS = 120  # far past every deadline below: a worker alive at a deadline was not stopped
FAKE_JAX_ENV = "MARIN_TEST_SHARD_FAKE_JAX"
SIGTERM_HANDLER_ENV = "MARIN_TEST_SHARD_SIGTERM_HANDLER"
DRIVER = f"""
import os, signal, sys, types
signal.signal(signal.SIGINT, signal.default_int_handler)  # even if the test runner ignores SIGINT
if os.environ.get("{SIGTERM_HANDLER_ENV}"):  # as executor.executor does for a run
    def _terminated(signum, frame):
        raise SystemExit("terminated")
    signal.signal(signal.SIGTERM, _terminated)
if os.environ.get("{FAKE_JAX_ENV}"):
    sys.modules["jax"] = types.ModuleType("jax")  # map_shards then starts workers from a fork server
from operations.shards import map_shards
from tests.operations.test_shards import numbered_shard, shard_inputs
map_shards(numbered_shard, shard_inputs(), sys.argv[1], workers={WORKERS})
"""


def shard_inputs() -> list[str]:
    return [json.dumps({"index": index, "documents": 200}) for index in range(SHARDS)]


def numbered_shard(input_shard: str, output_shard: str) -> dict:
    """Write the shard's documents; with HOLD_ENV set, stop halfway through an odd shard."""
    spec = json.loads(input_shard)
    hold = os.environ.get(HOLD_ENV)
    with document_writer(output_shard) as write:
        for number in range(spec["documents"]):
            write(
                {
                    "id": f"{spec['index']}-{number}",
                    "text": f"document {number} " * 8,
                    "source": "t",
                    "metadata": {},
                }
            )
            if hold and spec["index"] % 2 == 1 and number == spec["documents"] // 2:
                record = Path(hold) / f"{spec['index']}.pid"
                record.with_suffix(".part").write_text(str(os.getpid()))
                record.with_suffix(".part").rename(record)
                time.sleep(HOLD_SECONDS)
    return {"documents": spec["documents"]}


def alive(pid: int) -> bool:
    """A process that still runs (a zombie holds no files and runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_until(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.05)


def temp_files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.name.startswith(TEMP_PREFIX))


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()
    }


class HeldDriver:
    """A driver process mapping `numbered_shard` over SHARDS shards, stopped with workers
    holding the odd shards half-written."""

    def __init__(self, tmp_path: Path, forkserver: bool = False, sigterm_handler: bool = False):
        self.out = tmp_path / "out"
        self.holds = tmp_path / "holds"
        self.holds.mkdir()
        env = {**os.environ, HOLD_ENV: str(self.holds), "PYTHONPATH": str(REPO)}
        env.pop(FAKE_JAX_ENV, None)
        env.pop(SIGTERM_HANDLER_ENV, None)
        if forkserver:
            env[FAKE_JAX_ENV] = "1"
        if sigterm_handler:
            env[SIGTERM_HANDLER_ENV] = "1"
        self.process = subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(self.out)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_until(lambda: len(self.worker_pids()) == WORKERS, 90, "both workers holding a shard")
        except AssertionError:
            self.close()
            raise

    def worker_pids(self) -> list[int]:
        return [int(path.read_text()) for path in sorted(self.holds.glob("*.pid"))]

    def close(self) -> None:
        """Kill whatever this test started and is still running."""
        for pid in self.worker_pids():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.process.stderr.close()


STEP_DRIVER = f"""
import sys
from dataclasses import dataclass
from executor import Executor, ExecutorStep, this_output_path
from executor.lease import LeaseConfig
from operations.shards import map_shards
from tests.operations.test_shards import numbered_shard, shard_inputs

@dataclass(frozen=True)
class Config:
    output_path: str

def shards_step(config):
    map_shards(numbered_shard, shard_inputs(), config.output_path, workers={WORKERS})

step = ExecutorStep(name="sharded", fn=shards_step, config=Config(this_output_path()))
Executor(sys.argv[1], console=False, lease_config=LeaseConfig(heartbeat_interval=0.5, timeout=3)).run([step])
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_run_ends_a_data_steps_workers_before_it_releases_the_lease(tmp_path, signum):
    """Found by a red-team pass (twenty-second session): a step runs in a thread of the driver,
    which never saw the Ctrl-C (or SIGTERM to the driver alone). The driver recorded the step
    as interrupted and released its lease while the shard workers went on writing the output,
    and a second driver could take the step at once and write the same files."""
    holds, prefix = tmp_path / "holds", tmp_path / "prefix"
    holds.mkdir()
    env = {**os.environ, HOLD_ENV: str(holds), "PYTHONPATH": str(REPO)}
    env.pop(FAKE_JAX_ENV, None)
    process = subprocess.Popen(
        [sys.executable, "-c", STEP_DRIVER, str(prefix)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    pids: list[int] = []
    try:
        wait_until(lambda: len(list(holds.glob("*.pid"))) == WORKERS, 90, "both workers holding a shard")
        pids = [int(path.read_text()) for path in sorted(holds.glob("*.pid"))]
        (output,) = [path for path in (prefix).iterdir() if path.name.startswith("sharded-")]
        lease = output / ".executor_status.lock"
        assert lease.exists()
        process.send_signal(signum)  # the driver alone: its workers get nothing from the terminal
        while lease.exists() and process.poll() is None:
            time.sleep(0.005)
        # The moment the lease is gone another driver may take the step: nothing may still write.
        assert not any(alive(pid) for pid in pids), "a worker outlived the lease"
        process.wait(timeout=30)  # not HOLD_SECONDS: the held shards were not waited for
        assert process.returncode != 0
        last = json.loads((output / ".executor_status").read_text().splitlines()[-1])
        assert (last["status"], last["message"]) == ("FAILED", "interrupted")
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stderr.close()


@pytest.fixture(params=["fork", "forkserver"])
def held_driver(request, tmp_path, monkeypatch):
    """Workers forked by the driver, or by a fork server (what map_shards uses once JAX is loaded)."""
    monkeypatch.delenv(HOLD_ENV, raising=False)
    driver = HeldDriver(tmp_path, forkserver=request.param == "forkserver")
    driver.start_method = request.param
    yield driver
    driver.close()


def test_workers_die_with_a_sigkilled_driver(held_driver):
    pids = held_driver.worker_pids()
    parents = {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in pids}
    assert (parents == {held_driver.process.pid}) == (held_driver.start_method == "fork")
    assert all(alive(pid) for pid in pids)
    held_driver.process.send_signal(signal.SIGKILL)
    held_driver.process.wait(timeout=30)
    wait_until(lambda: not any(alive(pid) for pid in pids), 10, f"workers {pids} gone after the driver died")


def test_ctrl_c_in_the_driver_stops_its_workers_at_once(held_driver):
    pids = held_driver.worker_pids()
    held_driver.process.send_signal(signal.SIGINT)
    held_driver.process.wait(timeout=20)  # not after the held shards (HOLD_SECONDS)
    assert b"KeyboardInterrupt" in held_driver.process.stderr.read()
    assert not any(alive(pid) for pid in pids)


def test_sigterm_ends_a_worker_even_when_the_driver_handles_sigterm(tmp_path):
    """A worker forked by a driver that handles SIGTERM (the executor does, for every run)
    must not inherit the handler: `terminate()` would only fail its shard, and the worker
    would live on, waiting for the next one."""
    driver = HeldDriver(tmp_path, sigterm_handler=True)
    try:
        pids = driver.worker_pids()
        os.kill(pids[0], signal.SIGTERM)
        wait_until(lambda: not alive(pids[0]), 10, f"worker {pids[0]} gone after SIGTERM")
        assert driver.process.wait(timeout=30) != 0
        err = driver.process.stderr.read().decode()
        assert "a worker process died (killed, or out of memory?) with " in err, err[-2000:]
        wait_until(lambda: not any(alive(pid) for pid in pids), 10, "workers gone")
    finally:
        driver.close()


def test_ctrl_c_to_the_process_group_is_handled_by_the_driver_alone(tmp_path):
    """Ctrl-C in a terminal signals the driver and its workers: the workers ignore it (a
    KeyboardInterrupt in a worker would fail its shard, and the worker would live on), and
    the driver alone decides to stop them."""
    driver = HeldDriver(tmp_path, sigterm_handler=True)
    try:
        pids = driver.worker_pids()
        for pid in pids:  # what the terminal does, without signalling the test runner's group
            os.kill(pid, signal.SIGINT)
        time.sleep(1.0)
        assert all(alive(pid) for pid in pids), "workers should ignore SIGINT"
        assert driver.process.poll() is None, driver.process.stderr.read().decode()[-2000:]
        driver.process.send_signal(signal.SIGINT)
        driver.process.wait(timeout=20)
        assert b"KeyboardInterrupt" in driver.process.stderr.read()
        wait_until(lambda: not any(alive(pid) for pid in pids), 10, "workers gone")
    finally:
        driver.close()


@pytest.mark.parametrize("killed", ["driver", "worker"])
def test_rerun_after_a_kill_mid_shard_leaves_no_temporary_files(held_driver, tmp_path, killed):
    pids = held_driver.worker_pids()
    if killed == "driver":
        held_driver.process.send_signal(signal.SIGKILL)
    else:
        os.kill(pids[0], signal.SIGKILL)  # the driver sees a broken pool and fails
    assert held_driver.process.wait(timeout=30) != 0
    if killed == "worker":  # the pool's own error names no shard; ours names the unfinished ones
        err = held_driver.process.stderr.read().decode()
        assert "a worker process died (killed, or out of memory?) with " in err, err[-2000:]
        assert "shard(s) unfinished: " in err and "run the step again to do the rest" in err, err[-2000:]
    wait_until(lambda: not any(alive(pid) for pid in pids), 10, "workers gone")
    out = held_driver.out
    assert temp_files(out), "the kill should leave half-written shards behind"

    stats = map_shards(numbered_shard, shard_inputs(), str(out), workers=WORKERS)

    assert temp_files(out) == []
    assert stats == [{"documents": 200}] * SHARDS
    map_shards(numbered_shard, shard_inputs(), str(tmp_path / "clean"), workers=WORKERS)
    assert tree_bytes(out) == tree_bytes(tmp_path / "clean")


def test_stale_temporary_files_anywhere_in_the_output_are_removed(tmp_path):
    out = tmp_path / "out"
    stale = [
        out / f"{TEMP_PREFIX}{'a' * 32}-shard-00000.jsonl.gz",
        out / f"{TEMP_PREFIX}{'b' * 32}-stats.json",
        out / ".shard_stats" / f"{TEMP_PREFIX}{'c' * 32}-shard-00001.jsonl.gz.json",
        out / "work" / f"{TEMP_PREFIX}{'d' * 32}-removed-00000.bin",
    ]
    # The executor writes its own bookkeeping with the same naming while the step runs.
    kept = [out / f"{TEMP_PREFIX}{'e' * 32}-.executor_status", out / "notes.tmp-keep.txt"]
    for path in stale + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half")

    map_shards(numbered_shard, shard_inputs()[:2], str(out), workers=1)

    assert [path for path in stale if path.exists()] == []
    assert all(path.exists() for path in kept)
    assert remove_temp_files(str(out)) == []
    assert remove_temp_files("memory://anything") == []
