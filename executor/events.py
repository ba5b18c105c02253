"""Typed events emitted by the planner and runner.

The console, tests and later tools (the CLI, the browser) read these instead of
parsing log lines. Listeners are plain callables taking one event.

Every event class has a docstring: `dataclass` otherwise builds one from the signature
with `inspect` at import (about a tenth of what the event classes cost to create).
"""

from __future__ import annotations

import time
from dataclasses import field

from executor.records import dataclass, record

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import Any


@dataclass(frozen=True)
class StepEvent:
    """What every step event says: which step, and when."""

    name: str
    output_path: str
    time: float = field(default_factory=time.time, kw_only=True)


@dataclass(frozen=True)
class StepPlanned(StepEvent):
    """The plan's row for a step: its action and why."""

    action: str
    reason: str


@dataclass(frozen=True)
class StepSkipped(StepEvent):
    """A step not run: its output is already there."""

    reason: str


@dataclass(frozen=True)
class StepWaiting(StepEvent):
    """Another driver holds the step's lease; this one waits for it."""

    holder: str
    """Worker id of the driver running the step."""

    heartbeat: float
    """That driver's last heartbeat on the lease (Unix time)."""


@dataclass(frozen=True)
class StepStarted(StepEvent):
    """The step's function was called (its output goes to `log_path`)."""

    log_path: str


@dataclass(frozen=True)
class StepSucceeded(StepEvent):
    """The step finished and its SUCCESS is recorded."""

    duration: float


@dataclass(frozen=True)
class StepFailed(StepEvent):
    """The step did not succeed (see `kind`)."""

    kind: str
    """'error' (the function raised), 'dep_failed', 'lease_lost', 'failed_elsewhere' or 'interrupted'."""

    error: str
    log_path: str | None = None


@dataclass(frozen=True)
class RunFinished:
    """The run is over: how many steps succeeded, were skipped or failed."""

    succeeded: int
    skipped: int
    failed: int
    duration: float
    time: float = field(default_factory=time.time, kw_only=True)


def planned_event(row: Any) -> StepPlanned:
    """`StepPlanned(row.name, row.output_path, action=row.action.value, reason=row.reason)` for
    a plan row (`executor.plan.PlannedStep`), made by `record`: one per step of every plan."""
    fields = {"name": row.name, "output_path": row.output_path, "time": time.time()}
    fields["action"] = row.action._value_  # (`.value`, without the Enum property's ~0.1 us)
    fields["reason"] = row.reason
    return record(StepPlanned, fields)


def skipped_event(row: Any) -> StepSkipped:
    """`StepSkipped(row.name, row.output_path, reason=row.reason)` for a cached step's plan row,
    made by `record`: one per cached step of every run."""
    fields = {"name": row.name, "output_path": row.output_path, "time": time.time()}
    fields["reason"] = row.reason
    return record(StepSkipped, fields)
