"""Reading an output tree: the steps and experiments under a prefix.

What the `marin` CLI and the web browser show, read through the executor's `Store`, so
local disk, `memory://` and object stores (`s3://`, `gs://`) work alike.

A step output is a directory holding `.executor_info` or `.executor_status`. Step
names may contain `/`, so outputs sit at any depth (`tokenized/stdlib-1a2b3c4d`); the
walk descends into ordinary directories (up to `MAX_DEPTH`) and never into a step's
output. Outputs named by experiment manifests (e.g. `override_output_path` steps)
are added even when the walk would not find them.

On local disk reads are sequential (faster than a pool for small files); on object
stores every listing level and every step's files are read in parallel.

A tree is untrusted input: anyone who could write under the prefix wrote it. Reading
one parses JSON and nothing else -- no name recorded in it is imported or called. The
bookkeeping files read whole (`.executor_info`, `.executor_status`, leases, experiment
manifests) are capped at `MAX_RECORD_BYTES`; a larger one, a symbolic link that leads
out of the prefix, or anything but a regular file is not read, and the step says why
(`StepOutput.problem`, `OutputTree.problems`). Paths a tree records (dependencies,
manifest entries) are followed only inside the prefix.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, TypeVar

from executor.lease import LeaseRecord
from executor.store import FileInfo, Store, normalize_prefix, open_store
from executor.tree import (
    INFO_FILE,
    INFO_READ_BY_TOOLS_BYTES,
    LEASE_FILE,
    LOG_FILE,
    STATUS_FILE,
    StatusEvent,
    info_path,
    lease_path,
    log_path,
    parse_status,
    status_path,
)
from marin.terminal import one_line

MAX_DEPTH = 6
"""How many directory levels below the prefix the walk looks for step outputs."""

EXPERIMENTS_DIR = "experiments"
BOOKKEEPING = frozenset({INFO_FILE, STATUS_FILE, LEASE_FILE, LOG_FILE})
_HASH_SUFFIX = re.compile(r"-([0-9a-f]{6,64})$")
_HEX = re.compile(r"^[0-9a-f]{2,64}$")
PARALLEL_READS = 32
"""Concurrent reads on object stores (1: one at a time, for comparison in bench/tree_tools.py)."""

MAX_RECORD_BYTES = INFO_READ_BY_TOOLS_BYTES
"""The most a bookkeeping file read whole may hold (4 MiB; real ones hold a few KB). Defined by
the executor, which warns when it writes a step record larger than this."""

T = TypeVar("T")
R = TypeVar("R")


class RefError(LookupError):
    """A step reference (name, hash or path) matches no output, or several."""


class TreeFileError(ValueError):
    """A bookkeeping file that is not read: too large, a link out of the prefix, not a regular file."""


_NOT_READ: Any = object()


def _parse_info(data: bytes | None, path: str = "") -> tuple[dict[str, Any] | None, str | None]:
    """(the `.executor_info` record, or None; why it is None when the file exists)."""
    if data is None:
        return None, None
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return None, f"{path} is not valid JSON: not read"
    if not isinstance(record, dict):
        return None, f"{path} holds a JSON {type(record).__name__}, not an object: not read"
    return record, None


@dataclass(frozen=True, eq=False)
class StepOutput:
    """One step's output directory and its bookkeeping files."""

    path: str
    """Full output path (as the executor wrote it)."""

    relpath: str
    """Path relative to the prefix (`tokenized/stdlib-1a2b3c4d`)."""

    history: tuple[StatusEvent, ...]
    """`.executor_status`, oldest first."""

    preloaded_info: Any = field(default=_NOT_READ, repr=False)
    """`.executor_info` as read with the status, or `_NOT_READ` (then read on first use)."""

    read_info: Callable[[], bytes | None] | None = field(default=None, repr=False)
    """Reads `.executor_info` when it was not read up front (object-store listings); may raise
    TreeFileError."""

    problems: tuple[str, ...] = ()
    """Why a bookkeeping file was not read (found when the step was loaded)."""

    @cached_property
    def _info_read(self) -> tuple[dict[str, Any] | None, str | None]:
        if self.preloaded_info is not _NOT_READ:
            return self.preloaded_info
        if self.read_info is None:
            return None, None
        try:
            return _parse_info(self.read_info(), info_path(self.path))
        except TreeFileError as error:
            return None, str(error)

    @property
    def info(self) -> dict[str, Any] | None:
        """`.executor_info`, or None when missing or not read (`problem` says why)."""
        return self._info_read[0]

    @property
    def problem(self) -> str | None:
        """Why a bookkeeping file of this output was not read, or None."""
        found = [*self.problems, *([self._info_read[1]] if self._info_read[1] else [])]
        return "; ".join(found) or None

    @property
    def name(self) -> str:
        info = self.info if ("_info_read" in self.__dict__ or self.read_info is None) else None
        if info and isinstance(info.get("name"), str) and info["name"]:
            return info["name"]
        match = _HASH_SUFFIX.search(self.relpath)
        return self.relpath[: match.start()] if match else self.relpath

    @property
    def short_hash(self) -> str:
        match = _HASH_SUFFIX.search(self.relpath)
        if match:
            return match.group(1)
        return (self.version_hash or "")[:8]

    @property
    def version_hash(self) -> str | None:
        value = (self.info or {}).get("version_hash")
        return value if isinstance(value, str) else None

    @property
    def status(self) -> str:
        return self.history[-1].status.value if self.history else "UNKNOWN"

    @property
    def status_unread(self) -> bool:
        """Whether `.executor_status` exists but was not read (too large, not a regular file,
        not a status history): the step's state is unknown, which is not the same as none."""
        prefix = status_path(self.path)
        return not self.history and any(problem.startswith(prefix) for problem in self.problems)

    @property
    def last_event(self) -> StatusEvent | None:
        return self.history[-1] if self.history else None

    @property
    def started(self) -> str | None:
        """Date of the most recent RUNNING event."""
        for event in reversed(self.history):
            if event.status.value == "RUNNING":
                return event.date or None
        return None

    @property
    def finished(self) -> str | None:
        last = self.last_event
        return last.date or None if last and last.status.value != "RUNNING" else None

    @property
    def duration_s(self) -> float | None:
        last = self.last_event
        value = last.extra.get("duration_s") if last else None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        try:
            seconds = float(value)
        except OverflowError:  # an integer with hundreds of digits: the tree is untrusted
            return None
        return seconds if math.isfinite(seconds) else None

    @property
    def dependencies(self) -> list[dict[str, Any]]:
        """`{name, output_path, blocking}` per upstream step: from `dependency_steps` (ours), or
        from `dependencies` as objects (ours before issue 12) or output paths (Marin's). Output
        paths are where the upstream outputs are in this tree (`relocated`)."""
        _, recorded = self._recorded_dependencies()
        return [
            {**entry, "output_path": self.relocated(entry.get("output_path"))}
            if isinstance(entry, dict)
            else {"name": None, "output_path": self.relocated(entry), "blocking": True}
            for entry in recorded
            if isinstance(entry, (dict, str))
        ]

    @cached_property
    def _moved_from(self) -> tuple[str, str] | None:
        """(the prefix this output was written under, the prefix it is read under now), when
        they differ: a tree copied or moved (`cp -a`, a bucket downloaded), or read through a
        link. From the output path its `.executor_info` records, which ends with `relpath`."""
        recorded = (self.info or {}).get("output_path")
        suffix = "/" + self.relpath
        if (
            not isinstance(recorded, str)
            or recorded == self.path
            or not self.relpath
            or not recorded.endswith(suffix)
            or not self.path.endswith(suffix)
        ):
            return None
        old, new = recorded[: -len(suffix)], self.path[: -len(suffix)]
        return (old, new) if old.rstrip("/") else None

    def relocated(self, path: Any) -> Any:
        """A path recorded by this output's records, moved to where this tree is now: paths
        under the prefix the output was written under are read under this tree's prefix
        (anything else, a path elsewhere or not a string, is returned as it is)."""
        moved = self._moved_from
        return path if moved is None or not isinstance(path, str) else _moved(path, *moved)

    def dependency_field(self, index: int) -> str:
        """Where `dependencies[index]`'s output path is in `.executor_info` (for messages)."""
        key, recorded = self._recorded_dependencies()
        position = [i for i, entry in enumerate(recorded) if isinstance(entry, (dict, str))][index]
        return f"{key}[{position}]" + (".output_path" if isinstance(recorded[position], dict) else "")

    def _recorded_dependencies(self) -> tuple[str, list]:
        """(key, list) of the first of `dependency_steps`, `dependencies` that holds a list."""
        info = self.info or {}
        for key in ("dependency_steps", "dependencies"):
            recorded = info.get(key)
            if isinstance(recorded, list):
                return key, recorded
        return "dependencies", []


@dataclass(frozen=True)
class Experiment:
    """One experiment manifest (`<prefix>/experiments/<script>-<hash>.json`)."""

    path: str
    record: dict[str, Any]

    @property
    def id(self) -> str:
        return os.path.splitext(self.path.rstrip("/").rsplit("/", 1)[-1])[0]

    @property
    def steps(self) -> list[dict[str, Any]]:
        recorded = self.record.get("steps")
        return [entry for entry in recorded if isinstance(entry, dict)] if isinstance(recorded, list) else []

    @property
    def created(self) -> str:
        created = self.record.get("created_date")
        return created if isinstance(created, str) else ""

    @property
    def git(self) -> dict[str, Any]:
        git = self.record.get("git")
        return git if isinstance(git, dict) else {}

    def output_path(self, entry: dict[str, Any], prefix: str) -> str | None:
        """Where the output `entry` records is in the tree under `prefix` (None: no path).

        A manifest records absolute paths under the prefix it was written for (its `prefix`
        field). A tree copied or moved elsewhere (`cp -a`, `gsutil cp -r`, a download of a
        colleague's bucket) keeps those names, so they are read relative to that prefix:
        otherwise every output would look unreferenced here, and `marin gc` would delete them.
        """
        path = entry.get("output_path")
        if not isinstance(path, str):  # the manifest is untrusted: a list there is no path
            return None
        return self.relocated(path, prefix)

    def relocated(self, path: str, prefix: str) -> str:
        """`path`, recorded in this manifest, read under `prefix` if it lies under the prefix
        the manifest records (see `output_path`); anything else as it is."""
        recorded = self.record.get("prefix")
        if isinstance(recorded, str) and recorded.rstrip("/") and recorded != prefix:
            return _moved(path, recorded.rstrip("/"), prefix)
        return path


def _moved(path: str, old_prefix: str, new_prefix: str) -> str:
    """`path` under `new_prefix` if it lies under `old_prefix` (a tree copied or moved), else as it is."""
    return new_prefix + path[len(old_prefix) :] if path.startswith(old_prefix + "/") else path


def iso_age(date: str | None, now: float | None = None) -> str:
    """'3m ago'-style age of an ISO-8601 UTC date ('' when unknown)."""
    seconds = iso_seconds(date)
    if seconds is None:
        return ""
    delta = max(0.0, (now or time.time()) - seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{int(delta // size)}{unit} ago"
    return f"{int(delta)}s ago"


def iso_seconds(date: str | None) -> float | None:
    """Seconds since the epoch of an ISO-8601 date as the executor writes it (UTC, `Z`), or
    with any offset; a date without one is taken as UTC. None when it is not such a date
    (dates come from the tree: untrusted)."""
    if not isinstance(date, str) or not date:
        return None
    try:
        moment = datetime.fromisoformat(date[:-1] + "+00:00" if date.endswith("Z") else date)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def finite_number(value: Any) -> float | None:
    """A number read from a tree as a finite float, else None: a bool, a string, and what JSON
    allows past a float (an integer of hundreds of digits, `Infinity`, `NaN`)."""
    if type(value) not in (int, float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def human_duration(seconds: Any) -> str:
    """'12.0s', '1.5m', '2.0h'; '' for anything but a finite number (a status line's
    `duration_s` is untrusted: a string, a 400-digit integer, Infinity)."""
    seconds = finite_number(seconds)
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def human_size(size: int | None) -> str:
    if size is None:
        return ""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


class OutputTree:
    """The steps and experiments under one prefix (read-only, cached per instance)."""

    def __init__(self, prefix: str, store: Store | None = None):
        self.prefix = normalize_prefix(prefix)
        self.store = store or open_store(self.prefix)
        local = self.store.local_path(self.prefix)
        self.local = local is not None
        self._real_prefix = os.path.realpath(local) if local is not None else None
        self.problems: list[str] = []
        """Files the walk did not read, and why (an experiment manifest too large, ...)."""
        self.manifest_problems: list[str] = []
        """Of `problems`, the experiment manifests not read: what they reference is unknown."""

    # -- helpers --------------------------------------------------------------
    def _map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        items = list(items)
        if self.local or len(items) < 2:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(min(PARALLEL_READS, len(items))) as pool:
            return list(pool.map(fn, items))

    def relpath(self, path: str) -> str:
        return path[len(self.prefix) :].lstrip("/") if path.startswith(self.prefix) else path

    def abspath(self, relpath: str) -> str:
        return f"{self.prefix}/{relpath.strip('/')}" if relpath.strip("/") else self.prefix

    def list_dir(self, path: str) -> list[FileInfo]:
        local = self.store.local_path(path)
        if local is None:
            return self.store.list_dir(path)
        try:
            entries = list(os.scandir(local))
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # follows symlinks, like a listing would show them
                stat = entry.stat()
            except OSError:
                continue
            out.append(
                FileInfo(
                    path=f"{path.rstrip('/')}/{entry.name}",
                    name=entry.name,
                    is_dir=is_dir,
                    size=0 if is_dir else stat.st_size,
                    mtime=stat.st_mtime,
                )
            )
        return sorted(out, key=lambda info: info.name)

    # -- reading bookkeeping files ---------------------------------------------
    def contains(self, path: Any) -> bool:
        """Whether the path string `path` names something strictly inside the prefix (no `..`).

        A local path inside by name may still be a link out of it: `leads_outside` says.
        """
        if not isinstance(path, str) or not path.startswith(self.prefix + "/"):
            return False
        return not any(
            part in ("", ".", "..") for part in path[len(self.prefix) + 1 :].rstrip("/").split("/")
        )

    def _alias(self, path: str) -> bool:
        """A symbolic link to a directory inside the prefix: walked by its real name instead (a
        few links to the prefix itself would otherwise multiply the walk, and list each output
        under many names)."""
        local = self.store.local_path(path)
        if local is None or self._real_prefix is None or not os.path.islink(local):
            return False
        return not self.leads_outside(path)

    def _first_visit(self, path: str, seen: set) -> bool:
        """Whether the walk has not been in this real directory yet (links out of the prefix
        may lead back to one; a loop of them would otherwise be walked to the depth limit)."""
        local = self.store.local_path(path)
        if local is None:
            return True
        real = os.path.realpath(local)
        if real in seen:
            return False
        seen.add(real)
        return True

    def reached_through_link(self, path: str) -> bool:
        """Whether the local `path` is reached through a symbolic link anywhere below the prefix
        (so the same directory has another, real name): gc deletes only by the real name."""
        local = self.store.local_path(path)
        if local is None or self._real_prefix is None:
            return False
        relative = self.relpath(path).strip("/").replace("/", os.sep)
        return os.path.realpath(local) != os.path.join(self._real_prefix, relative)

    def leads_outside(self, path: str) -> bool:
        """Whether the local `path` resolves (through symbolic links) to a place outside the prefix."""
        local = self.store.local_path(path)
        if local is None or self._real_prefix is None:
            return False
        return not os.path.realpath(local).startswith(self._real_prefix.rstrip(os.sep) + os.sep)

    def read_record(self, path: str, limit: int = MAX_RECORD_BYTES) -> bytes | None:
        """A bookkeeping file read whole, at most `limit` bytes; None when it does not exist.

        Raises TreeFileError (naming the file) when it is larger, is not a regular file, or
        is a link that leads out of the prefix. Never reads more than `limit` + 1 bytes.
        """
        local = self.store.local_path(path)
        if local is None:
            return self._read_remote(path, limit)
        if self.leads_outside(path):
            if not os.path.lexists(local):
                return None
            raise TreeFileError(
                f"{path} leads to {os.path.realpath(local)}, outside the prefix {self.prefix}: not read"
            )
        try:
            fd = os.open(local, os.O_RDONLY | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as error:  # a link loop (ELOOP), a socket (ENXIO), no permission, ...
            raise TreeFileError(f"{path} cannot be opened ({error.strerror or error}): not read") from None
        try:
            mode = os.fstat(fd)
            if stat.S_ISDIR(mode.st_mode):  # not "missing": gc would take its step for abandoned
                raise TreeFileError(f"{path} is a directory, not a file: not read")
            if not stat.S_ISREG(mode.st_mode):
                raise TreeFileError(f"{path} is not a regular file: not read")
            if mode.st_size > limit:
                raise TreeFileError(_too_large(path, mode.st_size, limit))
            chunks, total = [], 0
            while total <= limit and (chunk := os.read(fd, min(1 << 16, limit + 1 - total))):
                chunks.append(chunk)
                total += len(chunk)
        except OSError as error:  # EIO and the like: this file is not read, the rest of the tree is
            raise TreeFileError(f"{path} could not be read ({error.strerror or error}): not read") from None
        finally:
            os.close(fd)
        if total > limit:
            raise TreeFileError(_too_large(path, None, limit))
        return b"".join(chunks)

    def _read_remote(self, path: str, limit: int) -> bytes | None:
        fs_path = self.store.fs_path(path)
        try:
            data = self.store.fs.cat_file(fs_path, start=0, end=limit + 1)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError:  # some stores refuse a range on an empty object
            try:
                size = self.store.fs.size(fs_path)
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                return None
            if size and size > limit:
                raise TreeFileError(_too_large(path, size, limit)) from None
            data = self.store.fs.cat_file(fs_path) if size else b""
        if len(data) > limit:
            raise TreeFileError(_too_large(path, None, limit))
        return data

    def _read_or_problem(self, path: str) -> tuple[bytes | None, str | None]:
        try:
            return self.read_record(path), None
        except TreeFileError as error:
            return None, str(error)

    # -- steps ----------------------------------------------------------------
    def load_step(self, path: str) -> StepOutput | None:
        """The step output at `path`, or None if it holds no bookkeeping files or is not
        inside the prefix."""
        if not self.contains(path):
            return None
        info, info_problem = self._read_or_problem(info_path(path))
        status, status_problem = self._read_or_problem(status_path(path))
        if info_problem or status_problem:
            return self._parse_step(
                path, info, status, problems=tuple(p for p in (info_problem, status_problem) if p)
            )
        return self._parse_step(path, info, status)

    def _parse_step(
        self,
        path: str,
        info_data: bytes | None,
        status_data: bytes | None,
        info_read: bool = True,
        problems: tuple[str, ...] = (),
    ) -> StepOutput | None:
        if info_data is None and status_data is None and info_read and not problems:
            return None
        try:
            history = tuple(parse_status(status_data.decode("utf-8") if status_data else None))
            for event in history:
                if not isinstance(event.date, str) or not isinstance(event.message, (str, type(None))):
                    raise ValueError("malformed event")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            history = ()
            problems = (*problems, f"{status_path(path)} is not a status history: not read")
        if info_read:
            return StepOutput(
                path,
                self.relpath(path),
                history,
                preloaded_info=_parse_info(info_data, info_path(path)),
                problems=problems,
            )
        return StepOutput(
            path,
            self.relpath(path),
            history,
            read_info=lambda: self.read_record(info_path(path)),
            problems=problems,
        )

    def _load_listed(self, paths: list[str]) -> list[StepOutput | None]:
        """`load_step` for directories found by listing the prefix.

        On object stores only the status files are fetched up front, all of a level in one
        batched `cat` (concurrent requests on fsspec's event loop); `.executor_info` is read
        when something asks for it, and up front only where there is no status. Listing
        1,000 steps then costs ~1,000 requests instead of 2,000 thread-pool reads.
        """
        if self.local or len(paths) < 2 or PARALLEL_READS <= 1:
            return [self.load_step(path) for path in paths]
        statuses = self._cat_many([status_path(path) for path in paths])
        missing = [path for path in paths if statuses[status_path(path)] is None]
        infos = self._cat_many([info_path(path) for path in missing])
        loaded = []
        for path in paths:
            status = statuses[status_path(path)]
            if info_path(path) in infos:  # no status: its info says whether it is a step
                info = infos[info_path(path)]
                if isinstance(info, TreeFileError):
                    loaded.append(self._parse_step(path, None, None, problems=(str(info),)))
                else:
                    loaded.append(self._parse_step(path, info, None))
            elif isinstance(status, TreeFileError):
                loaded.append(self._parse_step(path, None, None, info_read=False, problems=(str(status),)))
            else:
                loaded.append(self._parse_step(path, None, status, info_read=False))
        return loaded

    def _cat_many(self, paths: list[str]) -> dict[str, bytes | TreeFileError | None]:
        """{path: content, None when missing, or the TreeFileError}, fetched concurrently and
        never more than `MAX_RECORD_BYTES` + 1 bytes of each."""
        if not paths:
            return {}
        fs = self.store.fs
        names = [fs._strip_protocol(self.store.fs_path(path)) for path in paths]
        limit = MAX_RECORD_BYTES
        try:
            found = fs.cat_ranges(names, [0] * len(names), [limit + 1] * len(names), on_error="return")
        except (FileNotFoundError, NotADirectoryError):
            found = [None] * len(names)
        out: dict[str, bytes | TreeFileError | None] = {}
        for path, data in zip(paths, found, strict=True):
            if isinstance(data, (FileNotFoundError, IsADirectoryError, NotADirectoryError)) or data is None:
                out[path] = None
            elif isinstance(data, BaseException):  # e.g. a range refused on an empty object
                read, problem = self._read_or_problem(path)
                out[path] = TreeFileError(problem) if problem else read
            elif len(data) > limit:
                out[path] = TreeFileError(_too_large(path, None, limit))
            else:
                out[path] = data
        return out

    @cached_property
    def steps(self) -> list[StepOutput]:
        """Every step output under the prefix, sorted by relative path."""
        found: dict[str, StepOutput] = {}
        seen = {self._real_prefix}  # real directories walked (local disk): each once, by one name
        level = [
            entry
            for entry in self.list_dir(self.prefix)
            if entry.is_dir and entry.name != EXPERIMENTS_DIR and not self._alias(entry.path)
        ]
        for _depth in range(MAX_DEPTH):
            if not level:
                break
            loaded = zip(level, self._load_listed([entry.path for entry in level]), strict=True)
            descend = []
            for entry, step in loaded:
                if step is not None:
                    found[step.path] = step
                elif not entry.name.startswith(".") and self._first_visit(entry.path, seen):
                    descend.append(entry)
            listings = self._map(lambda entry: self.list_dir(entry.path), descend)
            level = [
                child
                for listing in listings
                for child in listing
                if child.is_dir and not self._alias(child.path)
            ]
        extra = {
            path
            for experiment in self.experiments
            for entry in experiment.steps
            if self.contains(path := experiment.output_path(entry, self.prefix)) and path not in found
        }
        for step in self._map(self.load_step, sorted(extra)):
            if step is not None:
                found[step.path] = step
        return sorted(found.values(), key=lambda step: step.relpath)

    @cached_property
    def by_path(self) -> dict[str, StepOutput]:
        return {step.path: step for step in self.steps}

    def versions_of(self, name: str) -> list[StepOutput]:
        """Outputs of the step `name`, most recent first."""
        same = [step for step in self.steps if step.name == name]
        return sorted(same, key=lambda step: step.last_event.date if step.last_event else "", reverse=True)

    def find(self, ref: str) -> StepOutput:
        """The one step output `ref` names: a path (full, or relative to the prefix, or a
        file inside an output), `name-hash`, a hash prefix (4+ hex digits of the path hash or
        the full version hash), or a step name (its most recent output).

        Raises RefError naming the candidates when `ref` is ambiguous or matches nothing.
        """
        ref = ref.strip()
        if not ref:
            raise RefError("empty step reference: give a name, a hash or a path")
        candidate_paths = [ref, self.abspath(ref)]
        if "://" not in ref and not ref.startswith("/"):
            candidate_paths.append(normalize_prefix(ref))
        for path in candidate_paths:
            path = path.rstrip("/")
            while path and path.startswith(self.prefix) and len(path) > len(self.prefix):
                if path in self.by_path:
                    return self.by_path[path]
                path = path.rsplit("/", 1)[0]
        by_name = self.versions_of(ref)
        if by_name:
            return by_name[0]
        if _HEX.match(ref):
            matches = [
                step
                for step in self.steps
                if step.short_hash.startswith(ref) or (step.version_hash or "").startswith(ref)
            ]
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                listing = "\n".join(f"  {one_line(step.relpath)}  ({step.status})" for step in matches[:20])
                raise RefError(
                    f"hash {ref!r} is ambiguous: {len(matches)} outputs match; give more digits:\n{listing}"
                )
        suggestions = [step.relpath for step in self.steps if ref in step.relpath][:10]
        hint = (
            ("\ndid you mean:\n" + "\n".join(f"  {one_line(s)}" for s in suggestions)) if suggestions else ""
        )
        raise RefError(f"no step output matches {ref!r} under {self.prefix}{hint}")

    def lease(self, step: StepOutput) -> LeaseRecord | None:
        """The step's lease; None when there is none or it cannot be read (like an expired one)."""
        try:
            return LeaseRecord.parse(self.read_record(lease_path(step.path)))
        except TreeFileError:
            return None

    def log_tail(self, step: StepOutput, max_bytes: int = 8192) -> str | None:
        """The last `max_bytes` of the step's log, never reading more (nor a link out of the prefix)."""
        return self.file_tail(log_path(step.path), max_bytes)

    def file_tail(self, path: str, max_bytes: int = 8192) -> str | None:
        """The last `max_bytes` of a file in the tree as text, from a line start when cut; never
        reads more, nor a link out of the prefix. None when it is missing or cannot be read."""
        local = self.store.local_path(path)
        try:
            if local is not None:
                if self.leads_outside(path):
                    return f"(not read: {path} leads outside the prefix)" if os.path.lexists(local) else None
                fd = os.open(local, os.O_RDONLY | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as handle:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        return f"(not read: {path} is not a regular file)"
                    handle.seek(0, os.SEEK_END)
                    size = handle.tell()
                    handle.seek(max(0, size - max_bytes))
                    data = handle.read(max_bytes)
            else:
                fs_path = self.store.fs_path(path)
                size = self.store.fs.size(fs_path)
                data = self.store.fs.cat_file(fs_path, start=max(0, size - max_bytes))
        except (FileNotFoundError, OSError):
            return None
        text = data.decode("utf-8", errors="replace")
        if size > max_bytes:
            text = text.split("\n", 1)[-1]
        return text

    def files(self, step: StepOutput, include_bookkeeping: bool = False) -> list[tuple[str, int]]:
        """(path relative to the step output, size) of every file in the output."""
        out: list[tuple[str, int]] = []
        local = self.store.local_path(step.path)
        if local is not None:
            for root, dirs, names in os.walk(local):
                dirs.sort()
                for name in sorted(names):
                    rel = os.path.relpath(os.path.join(root, name), local)
                    if not include_bookkeeping and rel in BOOKKEEPING:
                        continue
                    try:
                        out.append((rel, os.path.getsize(os.path.join(root, name))))
                    except OSError:
                        continue
            return out
        fs = self.store.fs
        base = fs._strip_protocol(self.store.fs_path(step.path)).rstrip("/")
        try:
            found = fs.find(base, detail=True)
        except FileNotFoundError:
            return []
        for name, entry in sorted(found.items()):
            rel = name[len(base) :].lstrip("/")
            if not rel or (not include_bookkeeping and rel in BOOKKEEPING):
                continue
            out.append((rel, int(entry.get("size") or 0)))
        return out

    def size(self, step: StepOutput) -> int:
        return sum(size for _rel, size in self.files(step, include_bookkeeping=True))

    def sizes(self, steps: list[StepOutput]) -> dict[str, int]:
        """Total bytes per step output (parallel on object stores)."""
        return dict(zip([s.path for s in steps], self._map(self.size, steps), strict=True))

    # -- experiments ----------------------------------------------------------
    def manifest_listing(self) -> list[FileInfo]:
        """The `.json` entries of `<prefix>/experiments/`, as listed (no manifest is read)."""
        return [e for e in self.list_dir(f"{self.prefix}/{EXPERIMENTS_DIR}") if e.name.endswith(".json")]

    def load_experiment(self, entry: FileInfo) -> Experiment | None:
        """The manifest `entry` lists, read and parsed; None (saying why in `problems` and
        `manifest_problems`) when it cannot be read or is no manifest."""
        problem = None
        try:
            data = None if entry.is_dir else self.read_record(entry.path)
            record = json.loads(data) if data else None
        except TreeFileError as error:
            problem = str(error)
        except (ValueError, RecursionError):
            problem = f"{entry.path} is not valid JSON: not read"
        else:
            if entry.is_dir:
                problem = f"{entry.path} is a directory, not an experiment manifest: not read"
            elif not isinstance(record, dict):
                problem = f"{entry.path} is not a JSON object: not read"
            elif not isinstance(record.get("steps"), list):
                problem = f"{entry.path} holds no list of steps: not read"
        if problem is not None:
            self.problems.append(problem)
            self.manifest_problems.append(problem)
            return None
        return Experiment(entry.path, record)

    @cached_property
    def experiments(self) -> list[Experiment]:
        """Experiment manifests, most recent first."""
        loaded = [exp for exp in self._map(self.load_experiment, self.manifest_listing()) if exp is not None]
        return sorted(loaded, key=lambda exp: exp.created, reverse=True)

    def find_experiment(self, ref: str) -> Experiment:
        """An experiment by id (`quickstart-1a2b3c4d`), id prefix, script name or manifest path."""
        ref = ref.strip().removesuffix(".json")
        exact = [exp for exp in self.experiments if exp.id == ref or exp.path.removesuffix(".json") == ref]
        if exact:
            return exact[0]
        by_script = [exp for exp in self.experiments if exp.id.rsplit("-", 1)[0] == ref]
        if by_script:
            return by_script[0]  # most recent run of that script
        partial = [exp for exp in self.experiments if exp.id.startswith(ref)]
        if len(partial) == 1:
            return partial[0]
        names = "\n".join(f"  {exp.id}" for exp in (partial or self.experiments)[:20])
        what = "is ambiguous" if partial else "matches no experiment"
        raise RefError(f"{ref!r} {what} under {self.prefix}; experiments:\n{names or '  (none)'}")

    def experiment_steps(self, experiment: Experiment) -> list[tuple[dict[str, Any], StepOutput | None]]:
        """(manifest entry, the output as it is now or None if gone) per step of `experiment`."""
        entries = experiment.steps

        def path_of(entry: dict[str, Any]) -> str:
            return experiment.output_path(entry, self.prefix) or ""

        if "steps" in self.__dict__:
            loaded = [self.by_path.get(path_of(entry)) for entry in entries]
        else:  # read only this experiment's steps, not the whole tree
            loaded = self._map(lambda entry: self.load_step(path_of(entry)), entries)
        return list(zip(entries, loaded, strict=True))

    def referenced_paths(self) -> set[str]:
        """Outputs the experiment manifests read reference (`manifest_problems`: those not read)."""
        return {
            path
            for experiment in self.experiments
            for entry in experiment.steps
            if (path := experiment.output_path(entry, self.prefix)) is not None
        }


def _too_large(path: str, size: int | None, limit: int) -> str:
    held = f"{size:,} bytes" if size is not None else "more"
    return f"{path} holds {held}, more than the {limit:,} bytes a bookkeeping file may hold: not read"
