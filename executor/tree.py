"""The output tree's bookkeeping files, read and written through a `Store`.

Per step, next to the step's own outputs (names compatible with Marin's):

    <output>/.executor_info          JSON: what ran (name, fn, config, version, deps, ...)
    <output>/.executor_status        JSON lines: one event per status change; the last
                                     line is the current status
    <output>/.executor_status.lock   the lease: who runs the step, last heartbeat
    <output>/.executor_log           the step's stdout, stderr and logging

Per experiment run: `<experiments dir>/<script>-<hash>.json` (see `executor.provenance`).

The status file is rewritten whole (atomically) on every change and only by the
lease holder, so readers see either the old or the new history, never half a line.
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from executor.fingerprint import encode
from executor.graph import ResolvedStep, StepGraph, join_path
from executor.store import Store
from executor.template import encode_template

INFO_FILE = ".executor_info"
STATUS_FILE = ".executor_status"
LEASE_FILE = ".executor_status.lock"
LOG_FILE = ".executor_log"


class Status(enum.StrEnum):
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    DEP_FAILED = "DEP_FAILED"


_STATUS_BY_NAME = {status.value: status for status in Status}


def info_path(output_path: str) -> str:
    return join_path(output_path, INFO_FILE)


def status_path(output_path: str) -> str:
    return join_path(output_path, STATUS_FILE)


def lease_path(output_path: str) -> str:
    return join_path(output_path, LEASE_FILE)


def log_path(output_path: str) -> str:
    return join_path(output_path, LOG_FILE)


@dataclass(frozen=True)
class StatusEvent:
    """One line of `.executor_status`."""

    date: str
    """ISO-8601 UTC time of the change."""

    status: Status
    message: str | None = None
    worker: str | None = None
    """Worker id of the driver that wrote the event."""

    extra: dict[str, Any] = field(default_factory=dict)
    """Other recorded facts (e.g. `config_digest` on SUCCESS, `duration_s`)."""

    def to_json(self) -> str:
        record = {
            "date": self.date,
            "status": self.status.value,
            "message": self.message,
            "worker": self.worker,
        }
        record.update(self.extra)
        return json.dumps(record, sort_keys=True)

    @staticmethod
    def from_json(line: str) -> StatusEvent:
        record = json.loads(line)
        pop = record.pop
        return StatusEvent(
            date=pop("date", None) or "",
            status=_STATUS_BY_NAME[pop("status")],
            message=pop("message", None),
            worker=pop("worker", None),
            extra=record,
        )


def utc_now_iso(timestamp: float | None = None) -> str:
    moment = time.time() if timestamp is None else timestamp
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment)) + f".{int(moment % 1 * 1000):03d}Z"


def parse_status(text: str | None) -> list[StatusEvent]:
    """Parse a status file; also reads Marin's old one-word format."""
    if not text:
        return []
    events = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            events.append(StatusEvent.from_json(line))
        else:
            events.append(StatusEvent(date="", status=Status(line)))
    return events


def parse_last_status(text: str | None) -> StatusEvent | None:
    """Only the current status: parses one line, for planning over thousands of steps."""
    if not text:
        return None
    stripped = text.rstrip()
    if not stripped:
        return None
    line = stripped[stripped.rfind("\n") + 1 :].strip()
    if line.startswith("{"):
        return StatusEvent.from_json(line)
    return StatusEvent(date="", status=Status(line))


def read_last_status(store: Store, output_path: str) -> StatusEvent | None:
    return parse_last_status(store.read_text(status_path(output_path)))


def read_status(store: Store, output_path: str) -> list[StatusEvent]:
    return parse_status(store.read_text(status_path(output_path)))


def append_status(
    store: Store,
    output_path: str,
    status: Status,
    message: str | None = None,
    worker: str | None = None,
    **extra: Any,
) -> StatusEvent:
    """Add an event to the step's status history (callers hold the lease)."""
    events = read_status(store, output_path)
    event = StatusEvent(date=utc_now_iso(), status=status, message=message, worker=worker, extra=extra)
    events.append(event)
    store.write_atomic(status_path(output_path), "".join(e.to_json() + "\n" for e in events))
    return event


def current_status(events: list[StatusEvent]) -> Status | None:
    return events[-1].status if events else None


def step_info_record(
    step: ResolvedStep, graph: StepGraph, run_record: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The `.executor_info` JSON for a resolved step of `graph`.

    `run_record` says where the run came from (experiment manifest, git state); with
    `config_template` it is what `marin reproduce` needs to declare the step again.
    """
    names = graph.names_by_path
    return {
        "name": step.name,
        "fn_name": step.fn_name,
        "description": step.step.description,
        "config": step.config_record,
        "config_digest": step.config_digest,
        "version": step.version,
        "version_hash": step.version_hash,
        "dependencies": [
            {"name": names.get(path), "output_path": path, "blocking": path in step.blocking_deps}
            for path in step.dependencies
        ],
        "output_path": step.output_path,
        "override_output_path": step.step.override_output_path,
        "config_template": encode_template(
            step.step.config, lambda upstream: graph.resolved(upstream).output_path
        ),
        "run": run_record or {},
        "pip_dependency_groups": step.step.pip_dependency_groups,
        "resources": _plain(step.step.resources),
    }


def _plain(value: Any) -> Any:
    return encode(value, strict=False)


def write_info(store: Store, record: dict[str, Any]) -> None:
    store.write_atomic(info_path(record["output_path"]), json.dumps(record, indent=2, sort_keys=True) + "\n")


def read_info(store: Store, output_path: str) -> dict[str, Any] | None:
    text = store.read_text(info_path(output_path))
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


@dataclass(frozen=True)
class LeaseRecord:
    """Contents of `.executor_status.lock`."""

    worker: str
    heartbeat: float
    """Unix time of the holder's last refresh."""

    acquired: float
    host: str = ""
    pid: int = 0

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8")

    @staticmethod
    def parse(data: bytes | None) -> LeaseRecord | None:
        if not data:
            return None
        try:
            record = json.loads(data)
            return LeaseRecord(**record)
        except (ValueError, TypeError):
            return None  # a lease we cannot read is treated like an expired one
