"""The plan: what the executor will do with each step, and why.

One row per selected step: its action (run / skip / wait / blocked / error) and the
reason. Two things no other executor tells you:

- when a step is new but outputs of the same name already exist under the prefix,
  *why its hash differs* from the most recent one (the versioned fields and upstream
  versions that changed);
- when a step is skipped but its stored config differs from the current one in
  unversioned fields, a warning listing those fields (the output was made with other
  settings that, by declaration, do not matter -- but you should know).

Selection: the steps passed to `run` and, through blocking inputs, everything they
need. Nonblocking parents are not run unless a blocking child needs them or `run_only`
selects them. With `run_only`, only steps whose names match one of the regexes
(anywhere in the name: `re.search`, as in Marin) run, plus their blocking dependencies
that have not succeeded; a pattern that matches no step is warned about, not refused.

A step whose status file cannot be read (truncated, not UTF-8, an unknown status, a
directory; on local disk also a symbolic link, a FIFO, a device or a socket, which are
never read through), or whose lease file is such a link or special file, is planned as an
error naming the file and the fix; it never stops the planning of the other steps, and
the steps that need it are planned as blocked.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import time
from collections.abc import Sequence
from dataclasses import field

from executor.graph import HASH_LENGTH, ResolvedStep, StepDefinitionError, StepGraph
from executor.lazy_logging import LazyLogger
from executor.lease import LeaseManager
from executor.records import dataclass, record
from executor.steps import ExecutorStep
from executor.store import NotRegularFileError, Store
from executor.terminal import one_line
from executor.tree import (
    LeaseRecord,
    OurSuccessLine,
    Status,
    StatusEvent,
    StatusFileError,
    info_path,
    lease_path,
    read_info,
    read_last_status,
    read_last_status_local,
    recorded_config,
    utc_now_iso,
)

logger = LazyLogger(__name__)

READ_PARALLELISM = 16
"""Concurrent status reads: object stores answer one request per round trip."""


class Action(enum.StrEnum):
    RUN = "run"
    SKIP = "skip"
    WAIT = "wait"
    BLOCKED = "blocked"
    ERROR = "error"


_WILL_RUN = (Action.RUN, Action.WAIT, Action.BLOCKED)

CACHED_ROWS_LISTED = 20
"""Cached steps `Plan.format` lists one by one; beyond this many, one line sums them up."""

StepStatus = StatusEvent | OurSuccessLine | StatusFileError | None
"""What planning knows of a step's status: the last event (or our SUCCESS line, matched but
not yet made an event), why it is unreadable, or none."""


class RunOnlyError(ValueError):
    """The `run_only` patterns are invalid (a usage error)."""


@dataclass(frozen=True)
class PlannedStep:
    """One row of the plan: what happens to a step, and why."""

    step: ResolvedStep
    action: Action
    reason: str
    status: Status | None = None
    lease: LeaseRecord | None = None
    why_new: tuple[str, ...] = ()
    """For a new step: how its version differs from the most recent output of the same name."""

    previous_output: str | None = None
    """That most recent output of the same name."""

    unversioned_changes: tuple[str, ...] = ()
    """For a skipped step: config fields that differ from the stored config."""

    status_error: StatusFileError | None = None
    """For an error row: why the step's status file cannot be read (None: it failed before).
    Such a step fails alone; the rest of the run goes on."""

    absent: bool = False
    """Its output directory did not exist when the plan was made (local disk): nothing in it
    to clean up, and no link in its place to refuse, when the runner makes it."""

    @property
    def name(self) -> str:
        return self.step.name

    @property
    def output_path(self) -> str:
        return self.step.output_path


@dataclass(frozen=True)
class Plan:
    """Every selected step's row; `format()` is what the console prints."""

    rows: tuple[PlannedStep, ...]
    """Selected steps in topological order."""

    graph: StepGraph = field(repr=False)

    def counts(self) -> dict[str, int]:
        by_action: dict[Action, int] = {}
        for row in self.rows:  # (by member: an Enum's `.value` is a property, ~0.1 us a read)
            action = row.action
            by_action[action] = by_action.get(action, 0) + 1
        return {action.value: count for action, count in by_action.items()}

    def format(self, cached_listed: int | None = CACHED_ROWS_LISTED) -> str:
        """The plan as a table, with the hash-change explanations and warnings under their rows.

        Steps skipped because they already succeeded, with nothing to say about them (no
        unversioned change), are listed one by one only up to `cached_listed` of them (None:
        all); more are summed up on one line where the first of them would be: a re-run of a
        1,000-step experiment shows what runs, not 2,000 lines of what does not."""
        if not self.rows:
            return "Plan: nothing selected."
        counts = ", ".join(f"{n} {action}" for action, n in self.counts().items())
        lines = [f"Plan: {len(self.rows)} steps ({counts})"]
        quiet = [row for row in self.rows if _quietly_cached(row)]
        collapsed = quiet if cached_listed is not None and len(quiet) > cached_listed else []
        hidden = {id(row) for row in collapsed}
        width = max((len(row.name) for row in self.rows if id(row) not in hidden), default=0)
        blank = " " * width
        for row in self.rows:
            if id(row) in hidden:
                if row is collapsed[0]:
                    lines.append(
                        f"  {'skip':<7} {len(collapsed)} steps already succeeded, not listed ({collapsed[0].name} "
                        f"... {collapsed[-1].name}); marin ls --prefix {self.graph.prefix} lists them"
                    )
                continue
            lines.append(f"  {row.action.value.ljust(7)} {row.name.ljust(width)}  {row.reason}")
            lines.append(f"          {blank}  -> {row.output_path}")
            if row.why_new:
                lines.append(f"  {'':<7} {'':<{width}}  hash differs from {row.previous_output}:")
                lines.extend(f"  {'':<7} {'':<{width}}    {reason}" for reason in row.why_new)
            if row.unversioned_changes:
                lines.append(
                    f"  {'':<7} {'':<{width}}  WARNING: reusing an output made with other unversioned settings:"
                )
                lines.extend(f"  {'':<7} {'':<{width}}    {change}" for change in row.unversioned_changes)
        return "\n".join(lines)


def compile_run_only(patterns: Sequence[str] | None) -> list[re.Pattern] | None:
    """The `run_only` regexes, compiled; RunOnlyError naming the first invalid one."""
    if patterns is None:
        return None
    if isinstance(patterns, str):
        patterns = [patterns]
    compiled = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise RunOnlyError(
                f"run_only: expected regexes (strings), got {type(pattern).__name__} {pattern!r}"
            )
        try:
            compiled.append(compile_regex(pattern))
        except ValueError as why:
            shown = pattern if len(pattern) <= 200 else f"{pattern[:200]}... ({len(pattern):,} characters)"
            raise RunOnlyError(f"run_only: invalid regular expression {shown!r}: {why}") from None
    return compiled


def compile_regex(pattern: str) -> re.Pattern:
    """`re.compile(pattern)`; a ValueError saying why when it is not a regular expression, or
    nests groups thousands deep (the parser's RecursionError: "nested too deeply")."""
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ValueError(str(error)) from None
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _read_status(store: Store, output_path: str, reader=None) -> StepStatus:
    """The step's current status (`reader`: `read_last_status` unless given), or the error
    that makes its status file unreadable: this step's problem only, planned as an error row."""
    try:
        return (reader or read_last_status)(store, output_path)
    except StatusFileError as error:
        return error


def _read_local_statuses(
    store: Store, steps: Sequence[ResolvedStep]
) -> tuple[dict[str, StepStatus], frozenset[str]]:
    """Each step's status on local disk, and the output paths whose directory does not exist.

    A cold run's steps have no directory yet: one listing of their parent directory spares
    each of them a status read, and later a lease read, that could only find nothing."""
    listings: dict[str, frozenset[str] | None] = {}
    statuses: dict[str, StepStatus] = {}
    absent = []
    for step in steps:
        path = step.output_path
        parent, _, name = path.rpartition("/")
        if parent not in listings:
            # Listed only when the first step of a parent has no directory: a cached re-run's
            # parents hold their steps' directories, and one stat spares the listing.
            exists = os.path.isdir(store.local_path(path))
            listings[parent] = None if exists else store.child_names(parent)
        names = listings[parent]
        if names is not None and name not in names:
            statuses[path] = None
            absent.append(path)
            continue
        statuses[path] = _read_status(store, path, read_last_status_local)
    return statuses, frozenset(absent)


def _read_statuses(store: Store, steps: Sequence[ResolvedStep]) -> dict[str, StepStatus]:
    # Remote reads take a round trip each, so they go in parallel, in batches to keep task
    # overhead low. (Local reads take microseconds: `_read_local_statuses`, no thread pool.)
    if len(steps) <= 1:
        return {step.output_path: _read_status(store, step.output_path) for step in steps}
    from concurrent.futures import ThreadPoolExecutor  # (imported only for object stores)

    batches = [steps[i : i + 64] for i in range(0, len(steps), 64)]
    with ThreadPoolExecutor(max_workers=READ_PARALLELISM) as pool:
        results = pool.map(lambda batch: [_read_status(store, step.output_path) for step in batch], batches)
        flat = [event for batch in results for event in batch]
    return {step.output_path: event for step, event in zip(steps, flat, strict=True)}


def _quietly_cached(row: PlannedStep) -> bool:
    """A row skipped because its step already succeeded, with nothing more to say about it."""
    return row.action == Action.SKIP and row.reason == _SKIPPED_ROW["reason"] and not row.unversioned_changes


def _succeeded(status: StepStatus) -> bool:
    return isinstance(status, (StatusEvent, OurSuccessLine)) and status.status == Status.SUCCESS


RUN_ONLY_NAMES_SHOWN = 20
"""Step names listed in the warning for a `run_only` pattern that matches nothing."""


def run_only_warning(unused: Sequence[str], graph: StepGraph) -> str:
    """`run_only pattern 'x' matches no step; the steps are: a, b, ...` (names sorted, capped)."""
    names = sorted({s.name for s in graph.steps})
    shown = ", ".join(names[:RUN_ONLY_NAMES_SHOWN])
    if len(names) > RUN_ONLY_NAMES_SHOWN:
        shown += f", ... ({len(names) - RUN_ONLY_NAMES_SHOWN} more)"
    quoted = ", ".join(repr(pattern) for pattern in unused)
    many = len(unused) > 1
    return f"run_only pattern{'s' if many else ''} {quoted} match{'' if many else 'es'} no step; the steps are: {shown}"


def select_steps(
    graph: StepGraph,
    roots: Sequence[ExecutorStep],
    run_only: list[re.Pattern] | None,
    statuses: dict[str, StepStatus],
) -> list[ResolvedStep]:
    """The steps this run considers, in topological order (see the module docstring)."""
    by_path = graph.by_path
    if run_only is None:
        wanted = [graph.resolved(root).output_path for root in roots]
        expand_succeeded = True
    else:
        # As in Marin: a pattern may match anywhere in the name (re.search), and one that
        # matches nothing is a warning, not an error (the other patterns still select).
        wanted, used = [], set()
        for s in graph.steps:
            hits = [p for p in run_only if p.search(s.name)]
            if hits:
                wanted.append(s.output_path)
                used.update(p.pattern for p in hits)
        unused = [p.pattern for p in run_only if p.pattern not in used]
        if unused:
            logger.warning("%s", run_only_warning(unused, graph))
        expand_succeeded = False
    selected: set[str] = set()
    stack = list(wanted)
    while stack:
        path = stack.pop()
        if path in selected:
            continue
        selected.add(path)
        step = by_path[path]
        for dep in step.blocking_deps:
            if expand_succeeded or not _succeeded(statuses.get(dep)):
                stack.append(dep)
    return [step for step in graph.steps if step.output_path in selected]


def make_plan(
    graph: StepGraph,
    roots: Sequence[ExecutorStep],
    store: Store,
    leases: LeaseManager,
    run_only: Sequence[str] | None = None,
    force_run_failed: bool = True,
) -> Plan:
    patterns = compile_run_only(run_only)
    # (`absent`: see `_read_local_statuses`. A driver that creates such a directory meanwhile is
    # met by the runner, which takes the lease before it writes anything.)
    if store.local_path("/") is not None:
        statuses, absent = _read_local_statuses(store, graph.steps)
    else:
        statuses, absent = _read_statuses(store, graph.steps), frozenset()
    selected = select_steps(graph, roots, patterns, statuses)
    names = {step.output_path: step.name for step in graph.steps}
    siblings = _SiblingFinder(store)
    rows: dict[str, PlannedStep] = {}
    now = time.time()
    for step in selected:
        last = statuses[step.output_path]
        if type(last) is OurSuccessLine:  # (most rows of a cached re-run)
            if last.version_hash == step.version_hash and last.config_digest == step.config_digest:
                rows[step.output_path] = record(PlannedStep, {**_SKIPPED_ROW, "step": step})
                continue
            last = _read_status(store, step.output_path)  # the whole event, to explain the difference
        if isinstance(last, StatusEvent) and last.status == Status.SUCCESS:
            rows[step.output_path] = _plan_succeeded(step, last, store)
            continue
        if isinstance(last, StatusFileError):
            rows[step.output_path] = PlannedStep(step, Action.ERROR, str(last), status_error=last)
            continue
        row = _plan_step(step, last, leases, force_run_failed, now, step.output_path in absent)
        if row.action == Action.RUN and last is None:
            previous = siblings.most_recent(step)
            if previous is not None:
                path, version = previous
                from executor.diffing import diff_versions  # (loaded only to explain a new version)

                dep_names = [names.get(p, p) for p in step.dependencies]
                reasons = diff_versions(version, step.version, dep_names)
                row = dataclasses.replace(row, why_new=tuple(reasons), previous_output=path)
        pending = (
            [
                dep
                for dep in step.blocking_deps
                if dep in rows and rows[dep].action in (*_WILL_RUN, Action.ERROR)
            ]
            if row.action == Action.RUN
            else []
        )
        if pending:
            # A dependency with an error blocks for good: name it before one that will run.
            first = next((dep for dep in pending if rows[dep].action == Action.ERROR), pending[0])
            verb = {Action.WAIT: "runs elsewhere", Action.ERROR: "has an error (see its row)"}.get(
                rows[first].action, "will run"
            )
            row = dataclasses.replace(
                row,
                action=Action.BLOCKED,
                reason=f"{row.reason}; after dependency {names[first]} {verb}",
            )
        rows[step.output_path] = row
    return Plan(rows=tuple(rows[s.output_path] for s in selected), graph=graph)


def _plan_step(
    step: ResolvedStep,
    last: StatusEvent | None,
    leases: LeaseManager,
    force_run_failed: bool,
    now: float,
    absent: bool = False,
) -> PlannedStep:
    """The row of a step that has not succeeded (`make_plan` plans a SUCCESS with
    `_plan_succeeded`). `absent`: the step's output directory does not exist (so neither
    does a lease)."""
    status = last.status if last is not None else None
    if status == Status.FAILED:
        if force_run_failed:
            return PlannedStep(step, Action.RUN, "failed before; re-running (force_run_failed)", status)
        return PlannedStep(
            step,
            Action.ERROR,
            f"failed previously (log: {step.output_path}/.executor_log); re-run with --force_run_failed true",
            status,
        )
    try:
        lease = None if absent else leases.read(step.output_path)
    except NotRegularFileError as error:  # a link or FIFO in the lease's place: this step's problem
        bad = StatusFileError(lease_path(step.output_path), error.why, "lease file")
        return PlannedStep(step, Action.ERROR, str(bad), status, status_error=bad)
    if lease is not None and not leases.is_stale(lease, now):
        ahead = lease.heartbeat - now > AHEAD_NOTED_S
        return PlannedStep(
            step,
            Action.WAIT,
            f"running elsewhere: held by {one_line(lease.worker)}, last heartbeat {utc_now_iso(lease.heartbeat)}"
            + (
                " (dated ahead of this machine's clock: taken over if it does not change for the lease timeout)"
                if ahead
                else ""
            ),
            status,
            lease,
        )
    if lease is not None:
        return PlannedStep(
            step,
            Action.RUN,
            f"stale lease of {one_line(lease.worker)} (last heartbeat {utc_now_iso(lease.heartbeat)}) will be taken over",
            status,
            lease,
        )
    if status == Status.RUNNING:
        return PlannedStep(step, Action.RUN, "a previous run did not finish (no live lease)", status)
    if status == Status.DEP_FAILED:
        return PlannedStep(step, Action.RUN, "a dependency failed in a previous run; trying again", status)
    if status == Status.WAITING:
        return PlannedStep(step, Action.RUN, "queued by a previous (Marin) run but never started", status)
    return PlannedStep(step, Action.RUN, "no output yet", status, absent=absent)


def _plan_succeeded(step: ResolvedStep, event: StatusEvent, store: Store) -> PlannedStep:
    stored_version = event.extra.get("version_hash")
    if stored_version is not None and stored_version != step.version_hash:
        from executor.diffing import diff_versions  # loaded only to explain a change: not on a cached re-run

        info = read_info(store, step.output_path) or {}
        reasons = diff_versions(info.get("version", {}), step.version) or ["(versions differ)"]
        if step.step.override_output_path is None:
            raise StepDefinitionError(
                f"step {step.name!r}: {step.output_path} holds a different version of this step "
                f"({stored_version[:12]} vs {step.version_hash[:12]}; {'; '.join(reasons)}). This is a "
                "hash collision; rename the step or delete that output"
            )
        return PlannedStep(
            step,
            Action.SKIP,
            "already succeeded (override_output_path: stored output has another version)",
            Status.SUCCESS,
            unversioned_changes=tuple(reasons),
        )
    changes: tuple[str, ...] = ()
    stored_digest = event.extra.get("config_digest")
    if stored_digest is not None and stored_digest != step.config_digest:
        info = read_info(store, step.output_path)
        if info is None:  # not "every field added": which ones differ is unknown
            changes = (f"which ones is unknown: {info_path(step.output_path)} cannot be read",)
        else:
            from executor.diffing import diff_flat, flatten

            diff = diff_flat(flatten(recorded_config(info)), flatten(step.config_record), skip_unset=True)
            changes = tuple(change.describe() for change in diff)
    return record(PlannedStep, {**_SKIPPED_ROW, "step": step, "unversioned_changes": changes})


AHEAD_NOTED_S = 5.0
"""A live lease's heartbeat dated more than this ahead of the planning machine's clock is
pointed out in its row (clocks of drivers sharing a tree differ by less)."""

_SKIPPED_ROW = {
    "unversioned_changes": (),
    "action": Action.SKIP,
    "reason": "already succeeded",
    "status": Status.SUCCESS,
    "lease": None,
    "why_new": (),
    "previous_output": None,
    "status_error": None,
    "absent": False,
}
"""The fields of a cached step's plan row other than its step (and its unversioned changes, when any)."""


class _SiblingFinder:
    """Finds earlier outputs of the same step name (`<name>-<hash>` next to ours)."""

    def __init__(self, store: Store):
        self.store = store
        self._listings: dict[str, list] = {}

    def most_recent(self, step: ResolvedStep) -> tuple[str, dict] | None:
        parent, _, base = step.output_path.rpartition("/")
        if not base.startswith(f"{step.name.rsplit('/', 1)[-1]}-"):
            return None  # override_output_path: no siblings by name
        listing = self._listings.get(parent)
        if listing is None:
            listing = self._listings[parent] = self.store.list_dir(parent)
        stem = base[: -(HASH_LENGTH + 1)]
        candidates = [
            info
            for info in listing
            if info.is_dir
            and info.path != step.output_path
            and info.name[: -(HASH_LENGTH + 1)] == stem
            and len(info.name) == len(base)
        ]
        best: tuple[str, str, dict] | None = None
        for candidate in candidates:
            last = _read_status(self.store, candidate.path)
            record = read_info(self.store, candidate.path)
            if record is None or "version" not in record:
                continue
            stamp = last.date if isinstance(last, StatusEvent) else ""
            if best is None or stamp > best[0]:
                best = (stamp, candidate.path, record["version"])
        return None if best is None else (best[1], best[2])
