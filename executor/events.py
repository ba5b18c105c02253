"""Typed events emitted by the planner and runner.

The console, tests and later tools (the CLI, the browser) read these instead of
parsing log lines. Listeners are plain callables taking one event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepEvent:
    name: str
    output_path: str
    time: float = field(default_factory=time.time, kw_only=True)


@dataclass(frozen=True)
class StepPlanned(StepEvent):
    action: str
    reason: str


@dataclass(frozen=True)
class StepSkipped(StepEvent):
    reason: str


@dataclass(frozen=True)
class StepWaiting(StepEvent):
    holder: str
    """Worker id of the driver running the step."""

    since: float
    """When that driver acquired the lease (Unix time)."""


@dataclass(frozen=True)
class StepStarted(StepEvent):
    log_path: str


@dataclass(frozen=True)
class StepSucceeded(StepEvent):
    duration: float


@dataclass(frozen=True)
class StepFailed(StepEvent):
    kind: str
    """'error' (the function raised), 'dep_failed', 'lease_lost', 'failed_elsewhere' or 'interrupted'."""

    error: str
    log_path: str | None = None


@dataclass(frozen=True)
class RunFinished:
    succeeded: int
    skipped: int
    failed: int
    duration: float
    time: float = field(default_factory=time.time, kw_only=True)
