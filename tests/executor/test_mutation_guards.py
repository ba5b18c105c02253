"""Tests that each catch one deliberate bug (see docs/testing.md for the list).

Every test here was checked by putting its bug in by hand and watching it fail: a step
used both blocking and nonblocking losing its blocking flag, the hash-collision refusal
switched off, and `executor_main` dropping `--force_run_failed` or `--max_concurrent`
on the way from the command line to the runner. No sleeps decide an outcome: where
timing is involved, the buggy order is forced with events, and the correct order is
what must happen.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import executor.graph
from executor import (
    Executor,
    ExecutorStep,
    InputName,
    StepDefinitionError,
    executor_main,
    output_path_of,
    this_output_path,
    versioned,
)
from executor.events import StepStarted, StepSucceeded
from executor.fingerprint import sha256_hex
from executor.tree import Status, read_status
from tests.executor.steps_for_tests import CALLS, WriteConfig, fail, write_value


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()


def write_step(name: str, value: Any = 0, fn=write_value, key: str | None = None) -> ExecutorStep:
    return ExecutorStep(
        name=name,
        fn=fn,
        config=WriteConfig(output_path=this_output_path(), value=versioned(value), key=key or name),
    )


# -- a step used both blocking and nonblocking is waited for ---------------------------


@dataclass(frozen=True)
class TwoRefsConfig:
    output_path: Any
    first: Any
    second: Any


UP_STARTED_DOWN = threading.Event()
"""Set by the downstream step when it starts; the upstream waits for it (briefly)."""


def slow_upstream(config: WriteConfig) -> None:
    # If the downstream (wrongly) runs alongside, it starts now, finds no output yet,
    # and fails; if it waits for us as it must, this wait just times out.
    UP_STARTED_DOWN.wait(timeout=0.3)
    write_value(config)


def read_both(config: TwoRefsConfig) -> None:
    seen = [os.path.exists(f"{path}/value.json") for path in (config.first, config.second)]
    UP_STARTED_DOWN.set()
    if not all(seen):
        raise RuntimeError(f"the upstream output was not there when the step started: {seen}")
    os.makedirs(config.output_path, exist_ok=True)
    with open(f"{config.output_path}/value.json", "w") as handle:
        json.dump(seen, handle)


NONBLOCKING_SPELLINGS = {
    "step.nonblocking()": lambda step: step.nonblocking(),
    "output_path_of(step).nonblocking()": lambda step: output_path_of(step).nonblocking(),
    "InputName(step, None).nonblocking()": lambda step: InputName(step, None).nonblocking(),
}


@pytest.mark.parametrize("spelling", sorted(NONBLOCKING_SPELLINGS))
@pytest.mark.parametrize("blocking_first", [True, False], ids=["blocking-first", "nonblocking-first"])
@pytest.mark.parametrize("roots", ["down", "up-and-down"])
def test_a_step_used_both_blocking_and_nonblocking_is_waited_for(tmp_path, spelling, blocking_first, roots):
    UP_STARTED_DOWN.clear()
    up = write_step("up", 1, fn=slow_upstream)
    refs = [output_path_of(up), NONBLOCKING_SPELLINGS[spelling](up)]
    if not blocking_first:
        refs.reverse()
    down = ExecutorStep("down", read_both, TwoRefsConfig(this_output_path(), refs[0], refs[1]))
    run = Executor(str(tmp_path), console=False)

    run.run([down] if roots == "down" else [up, down])

    order = [(type(e).__name__, e.name) for e in run.events if isinstance(e, (StepStarted, StepSucceeded))]
    assert order == [
        ("StepStarted", "up"),
        ("StepSucceeded", "up"),
        ("StepStarted", "down"),
        ("StepSucceeded", "down"),
    ]
    assert CALLS == {"up": 1}


# -- hash collisions are refused ---------------------------------------------------------


@pytest.fixture
def colliding_hashes(monkeypatch):
    """Every version hash starts with 00000000: two versions of a name share an output path."""

    def colliding(text: str) -> str:
        return "00000000" + sha256_hex(text)[8:]

    monkeypatch.setattr(executor.graph, "sha256_hex", colliding)


def test_a_stored_output_of_another_version_at_the_same_path_is_refused(tmp_path, colliding_hashes):
    first = Executor(str(tmp_path), console=False)
    first.run([write_step("s", 1)])
    path = first.output_paths[first.steps[0]]
    assert path.endswith("/s-00000000")
    before = Path(path, "value.json").read_text()

    second = Executor(str(tmp_path), console=False)
    with pytest.raises(StepDefinitionError, match="collision") as refused:
        second.run([write_step("s", 2)])

    assert path in str(refused.value)
    assert CALLS == {"s": 1}  # the colliding version never ran...
    assert Path(path, "value.json").read_text() == before  # ...nor touched the stored output
    assert [e.status for e in read_status(first.store, path)] == [Status.RUNNING, Status.SUCCESS]


def test_the_same_version_at_the_same_path_is_still_reused(tmp_path, colliding_hashes):
    Executor(str(tmp_path), console=False).run([write_step("s", 1)])
    Executor(str(tmp_path), console=False).run([write_step("s", 1)])
    assert CALLS == {"s": 1}


def test_two_versions_colliding_in_one_run_are_refused(tmp_path, colliding_hashes):
    with pytest.raises(StepDefinitionError, match="different versions"):
        Executor(str(tmp_path), console=False).run([write_step("s", 1), write_step("s", 2)])
    assert CALLS == {}


# -- executor_main passes its flags through ----------------------------------------------


@pytest.fixture
def cli(monkeypatch, tmp_path):
    """Run `executor_main(steps)` in this process with the given flags; returns (exit code, stderr)."""
    for variable in ("MARIN_PREFIX", "MARIN_LEASE_TIMEOUT", "MARIN_LEASE_HEARTBEAT", "MARIN_LEASE_POLL"):
        monkeypatch.delenv(variable, raising=False)
    prefix = str(tmp_path / "out")

    def run(steps, *flags: str) -> int:
        monkeypatch.setattr(sys, "argv", ["experiment.py", "--prefix", prefix, *flags])
        try:
            executor_main(steps)
        except SystemExit as exit_:
            return exit_.code
        return 0

    return run


def test_force_run_failed_false_refuses_to_rerun_a_failed_step(cli, capsys):
    assert cli([write_step("flaky", fn=fail)]) == 1
    assert CALLS == {"flaky": 1}
    capsys.readouterr()

    assert cli([write_step("flaky")], "--force_run_failed", "false") == 1
    assert CALLS == {"flaky": 1}  # not run again
    assert "force_run_failed" in capsys.readouterr().err

    assert cli([write_step("flaky")], "--force_run_failed", "true") == 0
    assert CALLS == {"flaky": 2}


def test_failed_steps_rerun_without_the_flag(cli):
    assert cli([write_step("flaky", fn=fail)]) == 1
    assert cli([write_step("flaky")]) == 0
    assert CALLS == {"flaky": 2}


class OverlapProbe:
    """Step function that records how many steps run at once.

    A step waits (up to `patience` seconds) for another to join it and returns as soon as
    one does, so steps that may overlap do, and steps that may not cost `patience` each.
    """

    def __init__(self, patience: float = 0.3):
        self.patience = patience
        self.lock = threading.Lock()
        self.active = 0
        self.most = 0
        self.overlapped = threading.Event()

    def __call__(self, config: WriteConfig) -> None:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
            if self.active > 1:
                self.overlapped.set()
        self.overlapped.wait(timeout=self.patience)
        with self.lock:
            self.active -= 1


@pytest.mark.parametrize("limit", [1, 2])
def test_max_concurrent_from_the_command_line_bounds_the_steps_running_at_once(cli, limit):
    probe = OverlapProbe()
    steps = [write_step(f"p{i}", i, fn=probe) for i in range(3)]
    assert cli(steps, "--max_concurrent", str(limit)) == 0
    assert probe.most == limit  # 1: strictly one after another; 2: they did overlap
