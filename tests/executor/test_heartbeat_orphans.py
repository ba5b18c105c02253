"""A heavy step's heartbeat process never outlives the process that started it.

Found as two heartbeat processes still running, reparented to init, long after the test
`test_a_child_that_dies_without_a_result_names_its_exit_code`: its step process exits at once,
before the heartbeat has armed its parent-death signal, and a heartbeat left running keeps the
step's lease fresh for ever (no driver could take the step again).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from executor.tree import LeaseRecord

PARENT = r"""
import json, os, subprocess, sys
spec = json.loads(sys.argv[1])
spec["kill_pid"] = spec["parent_pid"] = os.getpid()
heartbeat = subprocess.Popen(
    [sys.executable, "-m", "executor.backends.heartbeat", json.dumps(spec)],
    stdout=subprocess.DEVNULL,  # not our pipes: the test reads them to their end
    stderr=subprocess.DEVNULL,
)
print(heartbeat.pid, flush=True)
os._exit(0)  # gone before the heartbeat has even imported the executor
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_a_heartbeat_whose_parent_died_before_it_started_exits_and_leaves_the_lease_alone(tmp_path):
    lease = tmp_path / "step" / ".executor_status.lock"
    lease.parent.mkdir()
    mine = LeaseRecord(worker="drv:1:w", heartbeat=time.time()).to_bytes()
    lease.write_bytes(mine)
    spec = {
        "prefix": str(tmp_path),
        "lease_path": str(lease),
        "bytes": mine.decode("latin-1"),
        "interval": 0.2,
    }
    parent = subprocess.run(
        [sys.executable, "-c", PARENT, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    heartbeat = int(parent.stdout.strip())
    deadline = time.monotonic() + 30
    while _running(heartbeat) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _running(heartbeat):
        os.kill(heartbeat, 9)  # do not leave it behind, then fail
        raise AssertionError("the heartbeat outlived its parent")
    time.sleep(0.5)  # past two intervals: nothing refreshes the lease any more
    assert lease.read_bytes() == mine
