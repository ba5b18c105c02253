"""Durable dispatch on the local backend: a heavy step outlives its driver, and a driver
started again re-attaches to it instead of running it again (issue 10)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from executor.store import LocalStore
from executor.tree import LeaseRecord, Status, read_status
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
from executor import ExecutorStep, ResourceConfig, executor_main, output_path_of, this_output_path, versioned
from tests.executor.steps_for_heavy import CountConfig, IntervalConfig, count_and_sleep, record_interval

heavy = ExecutorStep(
    name="heavy",
    fn=count_and_sleep,
    config=CountConfig(output_path=this_output_path(), counter=sys.argv.pop(1), release=sys.argv.pop(1)),
    resources=ResourceConfig.with_cpu(cpu=1),
)
after = ExecutorStep(
    name="after",
    fn=record_interval,
    config=IntervalConfig(output_path=this_output_path(), index=versioned(1), wait_for=output_path_of(heavy, "done"), hold=0),
)
if __name__ == "__main__":
    executor_main([heavy, after])
"""

FLAGS = ["--lease_heartbeat", "0.3", "--lease_timeout", "3", "--lease_poll", "0.2"]


def _driver(script: Path, counter: Path, prefix: Path, output=subprocess.PIPE) -> subprocess.Popen:
    """The experiment, as a user runs it; its step runs until the file `release` appears."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    release = counter.parent / "release"
    return subprocess.Popen(
        [sys.executable, str(script), str(counter), str(release), "--prefix", str(prefix), *FLAGS],
        cwd=REPO,
        env=env,
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_heavy_step_outlives_its_killed_driver_and_the_next_driver_reattaches(tmp_path):
    script, counter, prefix = tmp_path / "exp.py", tmp_path / "counter", tmp_path / "out"
    script.write_text(SCRIPT)
    first = _driver(script, counter, prefix)
    try:
        wait_for(lambda: counter.exists() and counter.read_text().strip())
        heavy_dir = next(prefix.glob("heavy-*"))
        wait_for(lambda: "sleeping" in (heavy_dir / ".executor_log").read_text())
        lease = LeaseRecord.parse((heavy_dir / ".executor_status.lock").read_bytes())
        assert "/step:" in lease.worker  # held by the step's own process, not the driver
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    with open(tmp_path / "second.out", "w") as second_out:
        second = _driver(script, counter, prefix, output=second_out)
        try:
            # the step is still running (it waits for `release`): the new driver must find it
            wait_for(lambda: "heavy | sleeping" in (tmp_path / "second.out").read_text(), timeout=120)
            (tmp_path / "release").touch()
            second.wait(120)
        finally:
            (tmp_path / "release").touch()  # the step's process (its own session) ends too
            if second.poll() is None:
                second.kill()
    out = (tmp_path / "second.out").read_text()
    assert second.returncode == 0, out
    assert "wait" in out and "held by" in out  # it saw the running step and waited for it
    assert "heavy | sleeping" in out  # and showed its log meanwhile
    assert len(counter.read_text().split()) == 1  # the step body ran exactly once
    history = read_status(LocalStore(), str(heavy_dir))
    assert [event.status for event in history] == [Status.RUNNING, Status.SUCCESS]
    assert (heavy_dir / "done").read_text() == "ok"
    (after_dir,) = prefix.glob("after-*")
    assert read_status(LocalStore(), str(after_dir))[-1].status == Status.SUCCESS
    assert not (heavy_dir / ".executor_status.lock").exists()


def test_a_step_process_that_loses_its_lease_is_killed_at_once(tmp_path):
    """Fencing: the heartbeat (its own process) kills the step as soon as another driver has
    its lease, so the step cannot write into an output someone else now owns."""
    script, counter, prefix = tmp_path / "exp.py", tmp_path / "counter", tmp_path / "out"
    script.write_text(SCRIPT)
    first = _driver(script, counter, prefix)
    try:
        wait_for(lambda: counter.exists() and counter.read_text().strip())
        heavy_dir = next(prefix.glob("heavy-*"))
        lease_file = heavy_dir / ".executor_status.lock"
        wait_for(
            lambda: lease_file.exists() and "/step:" in LeaseRecord.parse(lease_file.read_bytes()).worker
        )
        step_pid = LeaseRecord.parse(lease_file.read_bytes()).pid
        # another driver takes the lease over (as after a long pause of this one)
        stolen = LeaseRecord(worker="other-driver", heartbeat=time.time() + 100).to_bytes()
        tmp = heavy_dir / "lock.tmp"
        tmp.write_bytes(stolen)
        os.replace(tmp, lease_file)
        wait_for(lambda: not _alive(step_pid), timeout=10)
        out, _ = first.communicate(timeout=60)
    finally:
        (tmp_path / "release").touch()  # should the fencing fail, its step ends anyway
        if first.poll() is None:
            first.kill()
    assert first.returncode == 1
    assert "lease" in out
    assert not (heavy_dir / "done").exists()  # killed before it could finish writing
    assert read_status(LocalStore(), str(heavy_dir))[-1].status == Status.RUNNING  # never SUCCESS


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (killed, not yet reaped) counts as dead
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
