"""Interrupting a run leaves none of the local backend's temporary files behind.

A heavy step's process gets its payload and writes its result through `marin-step-*` files
in the system's temporary directory. The driver interrupted (Ctrl-C, SIGTERM) while such a
step runs used to leave the empty result file there, one per interrupted run.
"""

import os
import signal
import subprocess

import pytest

from tests.executor.test_console_and_signals import signal_when_running, start_script
from tests.waiting import wait_for


def leftovers(temp) -> list[str]:
    return sorted(name for name in os.listdir(temp) if name.startswith("marin-step-"))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_heavy_step_leaves_no_temporary_files(tmp_path, signum):
    temp = tmp_path / "tmp"
    temp.mkdir()
    process = start_script(
        tmp_path,
        step_sleep=120,
        heavy=True,
        extra_env={"TMPDIR": str(temp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    wait_for(lambda: leftovers(temp) or process.poll() is not None, timeout=60)
    assert leftovers(temp), ("the step's files should exist while it runs", process.poll())
    out, err = signal_when_running(process, tmp_path, signum, running=2)
    assert process.returncode == 130, (out, err)
    assert err.decode().strip().splitlines()[-1] == "error: interrupted"
    assert leftovers(temp) == []
