"""Step functions for heavy steps: they run in other processes (the local backend's
subprocesses, Ray workers), so they coordinate through files, not Python objects."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class IntervalConfig:
    output_path: str
    index: int = 0
    wait_for: str | None = None
    """A file to wait for (at most 20 s) before finishing: another step must be running."""

    hold: float = 0.3
    """Seconds to stay running."""


def record_interval(config: IntervalConfig) -> None:
    """Write (start, end, pid) of this call to interval.json; print a line to the step log."""
    start = time.time()
    print(f"step {config.index} running in process {os.getpid()}")
    deadline = start + 20
    while config.wait_for and not os.path.exists(config.wait_for) and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(config.hold)
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "interval.json"), "w") as handle:
        json.dump([start, time.time(), os.getpid()], handle)


@dataclass(frozen=True)
class MeetConfig:
    output_path: str
    me: str
    other: str
    """Directory of the other step: it must have started (written `started`) while we run."""


def meet(config: MeetConfig) -> None:
    """Succeeds only if the other step is running at the same time (each waits up to 30 s)."""
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "started"), "w") as handle:
        handle.write(str(os.getpid()))
    deadline = time.time() + 30
    while not os.path.exists(os.path.join(config.other, "started")):
        if time.time() > deadline:
            raise TimeoutError(f"{config.me}: the other step never ran at the same time")
        time.sleep(0.02)


@dataclass(frozen=True)
class SleepConfig:
    output_path: str
    seconds: float = 60.0


def sleep_then_write(config: SleepConfig) -> None:
    print("sleeping", flush=True)
    time.sleep(config.seconds)
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "woke"), "w") as handle:
        handle.write("late")


def boom(config: IntervalConfig) -> None:
    print("about to fail")
    raise ValueError(f"boom {config.index}")


@dataclass(frozen=True)
class CountConfig:
    output_path: str
    counter: str
    """A file outside the tree: one line is appended each time the body runs."""

    seconds: float = 3.0
    """How long the body runs, unless `release` is given."""

    release: str | None = None
    """A file: the body runs until it exists (at most 120 s), so a test decides when it ends."""


def count_and_sleep(config: CountConfig) -> None:
    with open(config.counter, "a") as handle:
        handle.write(f"{os.getpid()}\n")
    print("sleeping", flush=True)
    if config.release is None:
        time.sleep(config.seconds)
    else:
        deadline = time.time() + 120
        while not os.path.exists(config.release) and time.time() < deadline:
            time.sleep(0.05)
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "done"), "w") as handle:
        handle.write("ok")


@dataclass(frozen=True)
class ResumableConfig:
    output_path: str
    total: int = 30
    tick: float = 0.1


def resumable_count(config: ResumableConfig) -> None:
    """A stand-in for training: counts to `total`, checkpointing after every tick, and on a
    new attempt resumes from the last checkpoint. Each attempt appends "<start> <node>" to
    attempts.txt (node: the Ray node id, or "-" outside Ray)."""
    os.makedirs(config.output_path, exist_ok=True)
    progress = os.path.join(config.output_path, "progress")
    start = 0
    if os.path.exists(progress):
        with open(progress) as handle:
            start = int(handle.read())
    try:
        import ray

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "-"
    except ImportError:
        node = "-"
    with open(os.path.join(config.output_path, "attempts.txt"), "a") as handle:
        handle.write(f"{start} {node}\n")
    for i in range(start, config.total):
        time.sleep(config.tick)
        temp = progress + ".tmp"
        with open(temp, "w") as handle:
            handle.write(str(i + 1))
        os.replace(temp, progress)
    with open(os.path.join(config.output_path, "done"), "w") as handle:
        handle.write("ok")


@dataclass(frozen=True)
class EnvConfig:
    output_path: str
    names: tuple[str, ...] = ("WANDB_SERVICE", "MARIN_SOMETHING")


def record_env(config: EnvConfig) -> None:
    """Write the values of `names` in this process's environment (None where unset) to env.json."""
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "env.json"), "w") as handle:
        json.dump({name: os.environ.get(name) for name in config.names}, handle)
