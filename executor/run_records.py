"""What a step's output says about its run (when, where, how fast) rather than its result.

A training step writes, beside its checkpoints, a log file, its tracker's files and how long
each step took. Run twice on the same code and data, those differ while the result does not.
A step function declares them:

    @run_records("logs/**", "wandb/**", "attempts.json",
                 fields={"stats.json": ["run_id", "median_tokens_per_second"],
                         "metrics.jsonl": ["throughput/*"]})
    def train(config): ...

and `marin reproduce` then compares the rest byte for byte, lists the declared files
without comparing them, and compares the declared JSON (or JSON-lines) files without the
declared fields.

The declaration is read from the step function -- code `marin reproduce` has already
checked it may run -- and never from an output tree: a tree could otherwise declare its
own differences away. Code that cannot import the executor (the operations) sets the same
attribute to plain data: `fn.__run_records__ = {"files": [...], "fields": {...}}`.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from executor.records import dataclass

F = TypeVar("F", bound=Callable[..., Any])

ATTRIBUTE = "__run_records__"


def _matches(pattern: str, relpath: str) -> bool:
    """Glob match of a relative path: `*`/`?`/`[...]` within one part, `**` for any number of parts."""

    def match(patterns: list[str], parts: list[str]) -> bool:
        if not patterns:
            return not parts
        if patterns == ["**"]:
            return bool(parts)  # as in .gitignore: "logs/**" is what lies inside logs/, not logs itself
        if patterns[0] == "**":
            return any(match(patterns[1:], parts[start:]) for start in range(len(parts) + 1))
        return bool(parts) and fnmatch.fnmatchcase(parts[0], patterns[0]) and match(patterns[1:], parts[1:])

    return match(pattern.strip("/").split("/"), relpath.strip("/").split("/"))


@dataclass(frozen=True)
class RunRecords:
    """The files and fields of an output that record its run, not its result."""

    files: tuple[str, ...] = ()
    """Glob patterns relative to the output (`*` within one path part, `**` for any number of
    parts) of files that only describe the run: logs, tracker files, timings. Not compared."""

    fields: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(file pattern, field patterns): JSON files, or JSON-lines files of objects, compared
    without these fields. A field pattern is a dotted path through nested objects (list items
    are passed through: "attempts.seconds" reaches every attempt's seconds) whose parts may
    hold fnmatch wildcards ("throughput/*")."""

    def is_record_file(self, relpath: str) -> bool:
        return any(_matches(pattern, relpath) for pattern in self.files)

    def fields_of(self, relpath: str) -> tuple[str, ...]:
        """The field patterns to drop from `relpath` before comparing (empty: compare as it is)."""
        found: list[str] = []
        for pattern, fields in self.fields:
            if _matches(pattern, relpath):
                found += fields
        return tuple(found)


NO_RUN_RECORDS = RunRecords()


def make_run_records(
    files: Iterable[str] = (), fields: Mapping[str, Iterable[str]] | None = None
) -> RunRecords:
    """A checked RunRecords: every pattern a path relative to the output, every field a string."""
    files = tuple(files)
    for pattern in [*files, *(fields or {})]:
        if not isinstance(pattern, str) or not pattern.strip("/") or pattern.startswith(".."):
            raise ValueError(f"run_records: {pattern!r} is not a path pattern relative to the output")
    checked = []
    for pattern, names in (fields or {}).items():
        names = (names,) if isinstance(names, str) else tuple(names)
        if not all(isinstance(name, str) and name for name in names):
            raise ValueError(
                f"run_records: the fields of {pattern!r} must be non-empty strings, not {names!r}"
            )
        checked.append((pattern, names))
    return RunRecords(files=files, fields=tuple(checked))


def run_records(*files: str, fields: Mapping[str, Iterable[str]] | None = None) -> Callable[[F], F]:
    """Declare which files (and fields of JSON files) of a step function's output describe the run."""
    records = make_run_records(files, fields)

    def declare(fn: F) -> F:
        setattr(fn, ATTRIBUTE, records)
        return fn

    return declare


def records_of(fn: Any) -> RunRecords:
    """What `fn` (or the function it wraps, through functools.wraps) declared; nothing if it declared nothing."""
    seen = 0
    while fn is not None and seen < 16:
        records = getattr(fn, ATTRIBUTE, None)
        if isinstance(records, RunRecords):
            return records
        if isinstance(records, Mapping):
            return make_run_records(records.get("files", ()), records.get("fields"))
        fn, seen = getattr(fn, "__wrapped__", None), seen + 1
    return NO_RUN_RECORDS


def _drop(value: Any, path: list[str]) -> Any:
    if isinstance(value, list):
        return [_drop(item, path) for item in value]
    if not isinstance(value, dict) or not path:
        return value
    head, rest = path[0], path[1:]
    kept = {}
    for key, item in value.items():
        if fnmatch.fnmatchcase(str(key), head):
            if rest:
                kept[key] = _drop(item, rest)
        else:
            kept[key] = item
    return kept


def without_fields(data: bytes, fields: Iterable[str]) -> bytes | None:
    """Canonical JSON of `data` (one JSON value, or JSON lines) without `fields`; None if not JSON."""
    try:
        text = data.decode("utf-8")
        try:
            values = [json.loads(text)]
        except json.JSONDecodeError:
            values = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    for field in fields:
        path = field.split(".")
        values = [_drop(value, path) for value in values]
    try:
        return "\n".join(json.dumps(value, sort_keys=True) for value in values).encode()
    except (TypeError, ValueError, RecursionError):
        return None
