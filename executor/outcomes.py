"""What a run reports: each step's outcome, the failures, and the error raised after the run.

Apart from `executor.runner` so that a run with nothing to run (every step cached) reports
without loading the runner: `skip_all` is the runner's whole work for such a plan.
"""

from __future__ import annotations

import enum
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import field

from executor.events import RunFinished, skipped_event
from executor.plan import Action, PlannedStep
from executor.records import dataclass

DEFAULT_MAX_RETRIES = 2
"""Re-submissions of a heavy step whose process or node was lost (not of one that failed)."""


class Outcome(enum.StrEnum):
    SUCCEEDED = "succeeded"
    SKIPPED = "skipped"
    FAILED = "failed"
    DEP_FAILED = "dep_failed"
    LOST = "lease_lost"
    FAILED_ELSEWHERE = "failed_elsewhere"
    INTERRUPTED = "interrupted"

    @property
    def ok(self) -> bool:
        return self in (Outcome.SUCCEEDED, Outcome.SKIPPED)


@dataclass(frozen=True)
class Failure:
    """A step that did not succeed, as `ExecutorRunError` lists it."""

    name: str
    output_path: str
    outcome: Outcome
    error: str
    log_path: str | None


class ExecutorRunError(RuntimeError):
    """Some steps failed. `failures` lists each one with its log path."""

    def __init__(self, failures: list[Failure]):
        self.failures = failures
        # Marin's first line, word for word (scripts and CI logs grep for it); then ours.
        lines = [f"{len(failures)} step(s) failed: {sorted(failure.name for failure in failures)}"]
        for failure in failures:
            where = f"\n      log: {failure.log_path}" if failure.log_path else ""
            lines.append(f"  - {failure.name} [{failure.outcome.value}] {failure.error}{where}")
        super().__init__("\n".join(lines))


@dataclass
class RunSummary:
    """Every planned step's outcome (by output path), the failures, and how long the run took."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    duration: float = 0.0


def skip_cached(
    rows: Iterable[PlannedStep], emit: Callable[[object], None], summary: RunSummary
) -> dict[str, PlannedStep]:
    """Record every SKIP row of a plan as skipped (one `StepSkipped` each); the other rows, by
    output path, are returned: what is left to run."""
    todo = {}
    outcomes, skip, skipped = summary.outcomes, Action.SKIP, Outcome.SKIPPED
    for row in rows:
        if row.action == skip:
            outcomes[row.output_path] = skipped
            emit(skipped_event(row))
        else:
            todo[row.output_path] = row
    return todo


def finish(summary: RunSummary, start: float, emit: Callable[[object], None]) -> RunSummary:
    """Set the run's duration and emit `RunFinished` with its counts."""
    summary.duration = time.time() - start
    counts = Counter(summary.outcomes.values())  # (counted in C: one entry per step)
    succeeded, skipped = counts[Outcome.SUCCEEDED], counts[Outcome.SKIPPED]
    emit(
        RunFinished(
            succeeded=succeeded,
            skipped=skipped,
            failed=len(summary.outcomes) - succeeded - skipped,
            duration=summary.duration,
        )
    )
    return summary


def skip_all(rows: Iterable[PlannedStep], emit: Callable[[object], None]) -> RunSummary:
    """The run of a plan whose every row is SKIP: what `Runner.run` does for it, without the runner."""
    start = time.time()
    summary = RunSummary()
    todo = skip_cached(rows, emit, summary)
    if todo:
        raise ValueError(f"skip_all: {len(todo)} step(s) are not cached, e.g. {next(iter(todo))}")
    return finish(summary, start, emit)
