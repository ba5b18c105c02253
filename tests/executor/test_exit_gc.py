"""A process that ran the executor skips the garbage collector's pass at exit (executor.exit_gc),
unless $MARIN_GC_AT_EXIT=1."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import atexit
import gc
import os
import sys
from dataclasses import dataclass

from executor import Executor, ExecutorStep, this_output_path, versioned

# Registered before the run: runs after the executor's exit handler (atexit is last-in, first-out).
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, flush=True))


@dataclass(frozen=True)
class Config:
    index: int
    output_path: str


def work(config):
    os.makedirs(config.output_path, exist_ok=True)


print("frozen before the run:", gc.get_freeze_count() > 0)
Executor(sys.argv[1], console=False).run(
    [ExecutorStep(name="s", fn=work, config=Config(versioned(1), this_output_path()))]
)
print("frozen after the run:", gc.get_freeze_count() > 0)
"""


def _run(tmp_path, **env: str) -> str:
    script = tmp_path / "experiment.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, **env},
    ).stdout


def test_the_collectors_last_pass_is_skipped_only_at_exit(tmp_path):
    out = _run(tmp_path)
    # Nothing is frozen while the script runs: garbage made during the run is still collected.
    assert "frozen before the run: False" in out and "frozen after the run: False" in out
    assert "frozen at exit: True" in out


def test_marin_gc_at_exit_keeps_the_last_pass(tmp_path):
    out = _run(tmp_path, MARIN_GC_AT_EXIT="1")
    assert "frozen at exit: False" in out
