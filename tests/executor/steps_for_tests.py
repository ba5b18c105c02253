"""Importable step functions and configs shared by the executor tests (also used in subprocesses)."""

import json
import os
import threading
import time
from dataclasses import dataclass, field

import fsspec

CALLS: dict[str, int] = {}
_calls_lock = threading.Lock()


def record_call(key: str) -> None:
    with _calls_lock:
        CALLS[key] = CALLS.get(key, 0) + 1


@dataclass(frozen=True)
class WriteConfig:
    output_path: str
    """Where to write `value.json`."""

    value: object = 0
    """Written to the output (versioned or not, as the test chooses)."""

    inputs: list = field(default_factory=list)
    """Upstream output paths to read."""

    key: str = "write"
    """Name under which calls are counted in CALLS."""


def write_value(config: WriteConfig) -> None:
    record_call(config.key)
    total = [config.value]
    for path in config.inputs:
        with fsspec.open(f"{path}/value.json", "r") as handle:
            total.append(json.load(handle))
    with fsspec.open(f"{config.output_path}/value.json", "w", auto_mkdir=True) as handle:
        json.dump(total, handle)
    print(f"wrote {config.key}")


def fail(config: WriteConfig) -> None:
    record_call(config.key)
    raise RuntimeError(f"boom in {config.key}")


@dataclass(frozen=True)
class SleepConfig:
    output_path: str
    marker: str
    """A file created when the step starts (so a test can wait for it)."""

    seconds: float = 3600.0
    count_file: str = ""
    """If set, a line is appended here each time the function runs (counts across processes)."""


def sleep_step(config: SleepConfig) -> None:
    if config.count_file:
        with open(config.count_file, "a") as handle:
            handle.write("ran\n")
    with open(config.marker, "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(config.seconds)
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "done"), "w") as handle:
        handle.write("done")


def noop(config) -> None:
    record_call(getattr(config, "key", "noop"))


def modules_loaded_by(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of `modules` a fresh interpreter has loaded after running `code` (import-cost tests)."""
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    probe = f"{code}\nimport sys\nprint(','.join(sorted(m for m in {modules!r} if m in sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": repo},
        capture_output=True,
        text=True,
        check=True,
    )
    return [name for name in result.stdout.strip().split(",") if name]
