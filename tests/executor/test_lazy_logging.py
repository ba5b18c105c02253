"""`logging` is imported only when something logs (executor.lazy_logging), and what
`executor_main` promised still holds: INFO messages shown, with a timestamped format, when
the script did not set up logging itself."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os
import sys
from dataclasses import dataclass

from executor import ExecutorStep, executor_main, this_output_path, versioned


@dataclass(frozen=True)
class Config:
    index: int
    output_path: str


def work(config):
    import logging  # (in the step, so that the driver has not imported it before executor_main)

    logging.getLogger("user.step").info("hello from step %s", config.index)
    os.makedirs(config.output_path, exist_ok=True)


steps = [ExecutorStep(name=f"s{i}", fn=work, config=Config(versioned(i), this_output_path())) for i in range(2)]
executor_main(steps)
print("logging imported:", "logging" in sys.modules)
print("typing imported:", "typing" in sys.modules)
print("threading imported:", "threading" in sys.modules)
"""


def _run(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    script = tmp_path / "experiment.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), "--prefix", str(tmp_path / "out"), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_steps_that_log_are_shown_and_a_cached_rerun_never_imports_logging(tmp_path):
    cold = _run(tmp_path)
    # The step logged after executor_main: the set-up it deferred was applied before the step ran.
    assert " INFO user.step: hello from step 0" in cold.stderr
    assert " INFO user.step: hello from step 1" in cold.stderr
    assert "logging imported: True" in cold.stdout

    cached = _run(tmp_path)
    assert "0 ran, 2 cached" in cached.stdout
    assert "logging imported: False" in cached.stdout
    # Nor `typing` (~2 ms): the executor's annotations are for type checkers only.
    assert "typing imported: False" in cached.stdout
    assert "threading imported: False" in cached.stdout  # (locks from `_thread`; threads only to run steps)
    assert "INFO" not in cached.stderr


def test_a_warning_on_a_cached_run_is_shown_with_the_promised_format(tmp_path):
    _run(tmp_path)
    warned = _run(tmp_path, "--run_only", "nothing-matches-this")
    # First use of a LazyLogger: `logging` loads and executor_main's set-up applies then.
    assert " WARNING executor.plan: run_only pattern 'nothing-matches-this' matches no step" in warned.stderr
    assert "logging imported: True" in warned.stdout
