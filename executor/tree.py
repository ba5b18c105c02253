"""The output tree's bookkeeping files, read and written through a `Store`.

Per step, next to the step's own outputs (names compatible with Marin's):

    <output>/.executor_info          JSON: what ran (name, fn, config, version, deps, ...)
    <output>/.executor_status        JSON lines: one event per status change; the last
                                     line is the current status
    <output>/.executor_status.lock   the lease: who runs the step, last heartbeat
    <output>/.executor_log           the step's stdout, stderr and logging

Per experiment run: `<experiments dir>/<script>-<hash>.json` (see `executor.provenance`).

Only the lease holder changes the status file, one whole line per change
(`Store.append_line`: a single `O_APPEND` write on local disk, a whole-file rewrite on
object stores), so readers see the old history or the old history plus one whole line.
"""

from __future__ import annotations

import enum
import json
import os
import re
import time
from dataclasses import field

from executor.fingerprint import dumps_sorted, encode
from executor.graph import ResolvedStep, StepGraph, join_path
from executor.lazy_logging import LazyLogger
from executor.records import dataclass, record
from executor.store import (
    LOCAL_READ_FLAGS,
    NotRegularFileError,
    Store,
    StoreError,
    check_regular,
    is_within,
    special_file_error,
)

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

logger = LazyLogger(__name__)

INFO_FILE = ".executor_info"
STATUS_FILE = ".executor_status"
LEASE_FILE = ".executor_status.lock"
LOG_FILE = ".executor_log"


class Status(enum.StrEnum):
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    DEP_FAILED = "DEP_FAILED"
    WAITING = "WAITING"
    """Written by Marin's executor (older versions) for a step queued behind its
    dependencies; never by ours. Read so a Marin tree plans without errors: not started."""


_STATUS_BY_NAME = {status.value: status for status in Status}

STATUS_TAIL_BYTES = 64 * 1024
"""Planning reads this many bytes from the end of a status file: the last line is the
current status, so a history of any length costs one small read."""

STATUS_MAX_LINE_BYTES = 16 * 1024 * 1024
"""A last line longer than the tail (a huge error message) is read again up to this size;
longer than this, the file is refused."""


class StatusFileError(ValueError):
    """A `.executor_status` file (or, `what` says, another file of the step's bookkeeping:
    its lease) the executor cannot read: names the file and the fix."""

    def __init__(self, path: str, why: str, what: str = "status file"):
        self.path = path
        self.why = why
        self.what = what
        super().__init__(
            f"cannot read the {what} {path}: {why}. Delete it to plan the step afresh "
            "(the step then runs again; its other files are kept)"
        )

    def __reduce__(self):  # (pickled across processes: rebuild from the arguments)
        return type(self), (self.path, self.why, self.what)


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
        return dumps_sorted(record)

    @staticmethod
    def from_json(line: str) -> StatusEvent:
        """Parse one line; ValueError saying what is wrong when it is not a status event."""
        fast = _OUR_SUCCESS_LINE.fullmatch(line)
        if fast is not None:  # the line our runner writes on success: no general JSON parse
            return _our_success_event(fast)
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"not valid JSON ({error.msg.removesuffix(' at')} at column {error.colno}; truncated?)"
            ) from None
        except RecursionError:
            raise ValueError("not a status event (JSON nested too deeply)") from None
        if not isinstance(record, dict):
            raise ValueError(f"a JSON {type(record).__name__}, not a status event object")
        pop = record.pop
        status = _parse_status_word(pop("status", None))
        date, message, worker = pop("date", None), pop("message", None), pop("worker", None)
        get = record.get
        strings = (date, message, worker, get("version_hash"), get("config_digest"))
        for key, value in zip(_STRING_FIELDS, strings, strict=True):
            if value is not None and type(value) is not str:  # (what JSON decodes as a string is a str)
                raise ValueError(f"field {key!r} is a {type(value).__name__}, not a string")
        return StatusEvent(date=date or "", status=status, message=message, worker=worker, extra=record)


_OUR_SUCCESS_LINE = re.compile(
    r'\{"config_digest": "([0-9a-f]{64})", "date": "([0-9T:.Z-]{1,40})", '
    r'"duration_s": (-?[0-9]{1,20}(?:\.[0-9]{1,20})?(?:e-?[0-9]{1,3})?), "message": null, '
    r'"status": "SUCCESS", "version_hash": "([0-9a-f]{64})", "worker": "([A-Za-z0-9._:-]{1,200})"\}'
)
"""The SUCCESS line `append_status` writes, exactly (sorted keys, `json.dumps` spacing): most
of what a cached re-run reads. Its values need no unescaping and decode as JSON would;
any other line goes through `json.loads` and the checks below."""


def _our_success_event(match: re.Match) -> StatusEvent:
    """The event of a line `_OUR_SUCCESS_LINE` matched."""
    digest, date, duration, version_hash, worker = match.groups()
    extra = {
        "config_digest": digest,
        "duration_s": float(duration) if "." in duration or "e" in duration else int(duration),
        "version_hash": version_hash,
    }
    fields = {"date": date, "status": Status.SUCCESS, "message": None, "worker": worker, "extra": extra}
    return record(StatusEvent, fields)


_STRING_EXTRAS = ("version_hash", "config_digest")
"""Extra fields the planner compares as strings."""

_STRING_FIELDS = ("date", "message", "worker", *_STRING_EXTRAS)
"""Fields that must be strings (or null), in the order they are checked."""


def _parse_status_word(word: Any) -> Status:
    status = _STATUS_BY_NAME.get(word) if isinstance(word, str) else None
    if status is None:
        shown = repr(word) if len(repr(word)) <= 60 else repr(word)[:57] + "..."
        raise ValueError(f"unknown status {shown} (expected one of {', '.join(_STATUS_BY_NAME)})")
    return status


def _parse_line(line: str) -> StatusEvent:
    if line.startswith("{"):
        return StatusEvent.from_json(line)
    return StatusEvent(date="", status=_parse_status_word(line))  # Marin's old one-word format


_ISO_SECOND: list[tuple[int | None, str]] = [(None, "")]
"""The last whole second formatted by `utc_now_iso` (one tuple, replaced whole: thread-safe)."""


def utc_now_iso(timestamp: float | None = None) -> str:
    moment = time.time() if timestamp is None else timestamp
    second = int(moment // 1)
    cached = _ISO_SECOND[0]
    if cached[0] != second:  # strftime once per second, not once per status line
        cached = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        _ISO_SECOND[0] = cached
    return f"{cached[1]}.{int(moment % 1 * 1000):03d}Z"


def parse_status(text: str | None, path: str = STATUS_FILE) -> list[StatusEvent]:
    """Parse a whole status history; also reads Marin's old one-word format.

    Raises StatusFileError naming `path` and the line when a line is not a status event.
    """
    if not text:
        return []
    events = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        try:
            events.append(_parse_line(line))
        except ValueError as error:
            raise StatusFileError(path, f"line {number}: {error}") from None
    return events


def parse_last_status(text: str | None, path: str = STATUS_FILE) -> StatusEvent | None:
    """Only the current status (the last line), for planning over thousands of steps."""
    if not text:
        return None
    stripped = text.rstrip()
    if not stripped:
        return None
    line = stripped[stripped.rfind("\n") + 1 :].strip()
    try:
        return _parse_line(line)
    except ValueError as error:
        raise StatusFileError(path, f"last line: {error}") from None


def read_last_status(store: Store, output_path: str) -> StatusEvent | None:
    """The step's current status, reading only the end of its status file (STATUS_TAIL_BYTES).

    None when there is no status file (or it is empty). Raises StatusFileError (bad
    content, or a directory in its place) or StoreError (storage failure), both naming
    the file.
    """
    path = status_path(output_path)
    local = store.local_path(path)
    if local is not None:
        data = _read_local_head(local, path)
        if data is None:
            return None
        if len(data) < STATUS_TAIL_BYTES:  # the whole file: the usual case, one read
            return parse_last_status(_decode(data, path), path)
    for limit in (STATUS_TAIL_BYTES, STATUS_MAX_LINE_BYTES):
        data, whole = _read_tail(store, path, limit)
        if data is None:
            return None
        if whole:
            break
        newline = data.find(b"\n", 0, len(data.rstrip()))
        if newline >= 0:
            data = data[newline + 1 :]  # the first line of the tail may be cut
            break
    else:
        raise StatusFileError(path, f"its last line is longer than {STATUS_MAX_LINE_BYTES:,} bytes")
    return parse_last_status(_decode(data, path), path)


class OurSuccessLine:
    """A status file whose last line is the SUCCESS line our runner writes (`_OUR_SUCCESS_LINE`):
    only the two hashes a plan compares. A cached re-run's plan reads thousands of these; the
    whole event (`read_last_status`) is read only for a step whose hashes differ."""

    __slots__ = ("version_hash", "config_digest")
    status = Status.SUCCESS

    def __init__(self, match: re.Match):
        self.config_digest, self.version_hash = match.group(1, 4)


def read_last_status_local(store: Store, output_path: str) -> StatusEvent | OurSuccessLine | None:
    """`read_last_status` for a tree on local disk (`store.local_path` is not None), for a
    plan over thousands of steps: the SUCCESS line our runner writes -- nearly every status a
    cached re-run reads -- is matched in place after one `os.read` and returned as an
    `OurSuccessLine`; any other content, and every error, goes through `read_last_status`
    (which reads the file again and names it)."""
    try:
        fd = os.open(store.local_path(f"{output_path}/{STATUS_FILE}"), LOCAL_READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError:  # a link in its place (ELOOP), a file in the output's (ENOTDIR), ...: worded there
        return read_last_status(store, output_path)
    try:
        data = os.read(fd, STATUS_TAIL_BYTES)
    except OSError:
        data = b""
    finally:
        os.close(fd)
    if 0 < len(data) < STATUS_TAIL_BYTES and data.isascii():  # (a SUCCESS line is ASCII)
        text = data.decode("ascii")
        end = len(text) - 1 if text.endswith("\n") else len(text)
        fast = _OUR_SUCCESS_LINE.fullmatch(text, text.rfind("\n", 0, end) + 1, end)
        if fast is not None:
            return OurSuccessLine(fast)
    return read_last_status(store, output_path)


def _file_in_place_of_directory(local_output: str) -> StatusFileError:
    """The error for a step whose output directory (or a directory above it) is something
    else, a regular file say: the step would fail on its first write (ENOTDIR), so the plan
    says it, naming what is in the way."""
    path = local_output
    while path != os.path.dirname(path) and not os.path.lexists(path):
        path = os.path.dirname(path)
    return StatusFileError(path, "it is not a directory", what="output directory")


def read_status(store: Store, output_path: str) -> list[StatusEvent]:
    """The step's whole status history. Raises like `read_last_status`."""
    path = status_path(output_path)
    data, _ = _read_tail(store, path, None)
    return parse_status(None if data is None else _decode(data, path), path)


def _decode(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise StatusFileError(path, f"not UTF-8 text (byte {error.start} of what was read)") from None


def _read_local_head(local: str, path: str) -> bytes | None:
    """Up to STATUS_TAIL_BYTES from the start of a local file in one `os.read` (no fstat
    unless the read comes back empty or refused: a status file is a few hundred bytes);
    None when it does not exist. Raises like `_read_tail`."""
    try:
        fd = os.open(local, LOCAL_READ_FLAGS)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise _file_in_place_of_directory(os.path.dirname(local)) from None
    except OSError as error:
        raise _named(path, special_file_error(local, error)) from error
    try:
        try:
            data = os.read(fd, STATUS_TAIL_BYTES)
        except IsADirectoryError:
            raise StatusFileError(path, "it is a directory, not a file") from None
        except OSError as error:
            check_regular(fd, local)  # a FIFO with a writer refuses a non-blocking read
            raise _named(path, error) from error
        if not data:
            check_regular(fd, local)  # a FIFO reads empty at once: no status, or not a file?
        return data
    except NotRegularFileError as error:
        raise _named(path, error) from None
    finally:
        os.close(fd)


def _named(path: str, error: OSError) -> StatusFileError | StoreError:
    """`error` from reading the status file `path`, as its readers raise it: a link, FIFO,
    device or socket in its place is the step's problem (StatusFileError), anything else a
    storage failure (StoreError), both naming the file."""
    if isinstance(error, NotRegularFileError):
        return StatusFileError(path, error.why)
    return StoreError(f"cannot read {path}: {type(error).__name__}: {error}")


def _read_tail(store: Store, path: str, limit: int | None) -> tuple[bytes | None, bool]:
    """`Store.read_tail`, with its failures named: a directory in the file's place is a
    StatusFileError, any other storage failure a StoreError naming the file."""
    try:
        return store.read_tail(path, limit)
    except IsADirectoryError:
        raise StatusFileError(path, "it is a directory, not a file") from None
    except NotRegularFileError as error:
        raise StatusFileError(path, error.why) from None
    except StoreError:
        raise  # already names the file
    except OSError as error:
        raise StoreError(f"cannot read {path}: {type(error).__name__}: {error}") from error


LEFTOVER_TEMP_NAME = r"\.tmp-[0-9a-f]+-(?!\.executor)"
"""The temporary name of an atomic write: `.tmp-<hex>-<final name>`, as `Store.write_atomic`
(`_temp_name`) and `operations.shards.atomic_output` name them (a regular expression,
compiled at its first use rather than by every start). The executor's own files
(`.tmp-<hex>-.executor_status.lock`) are left out: the lease holder's heartbeat writes
them while the step runs, and removing one would fail its rename."""


def remove_leftover_temp_files(store: Store, output_path: str) -> int:
    """Remove the temporary files of atomic writes that a failed or killed attempt left
    anywhere under the step's output directory; returns how many.

    A writer killed between creating its temporary file and renaming it leaves the file
    behind, and a later attempt that succeeds would leave it in an output marked SUCCESS.
    Call it while holding the step's lease, before the step's function starts: no writer
    of this step is at work then. Only names matching LEFTOVER_TEMP_NAME go (checkpoints
    and resume state stay); nothing behind a symbolic link is listed (local disk). Cheap
    when there is nothing to remove: one listing of the directory tree.
    """
    removed = 0
    for path in store.find_files(output_path):
        if re.match(LEFTOVER_TEMP_NAME, path.rsplit("/", 1)[-1]):
            store.delete(path)
            removed += 1
    return removed


def remove_links_leading_out(store: Store, output_path: str) -> list[str]:
    """Remove the symbolic links under a local step output that lead out of it; returns them.

    An output found FAILED or abandoned may come from someone else's tree: a link there
    (`stats.json -> ~/.bashrc`) would have the step's next attempt write through it, outside
    the output, with the writer's permissions. Only the links go, never what they point at;
    a step that made such a link on purpose makes it again. Call it where
    `remove_leftover_temp_files` is called (a re-run, holding the lease); object stores have
    no links."""
    top = store.local_path(output_path)
    if top is None:
        return []
    root = os.path.realpath(top)
    removed: list[str] = []
    pending = [top]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.is_symlink():
                if not is_within(os.path.realpath(entry.path), root):
                    os.unlink(entry.path)
                    removed.append(entry.path)
            elif entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
    return sorted(removed)


class OutputGuard:
    """Refuses a local step output reached through a symbolic link that leads out of the prefix.

    A tree shared with others may hold `<prefix>/a-1234abcd -> ~/` (or a link in place of a
    directory above it, `<prefix>/tokenized -> /elsewhere`): the step's lease, records and
    output would be written there, with the writer's permissions. `refusal` says why a step
    must not run (None: it may), before anything of it is written; it costs one `lstat` a step
    whose directory the plan found (none for a cold step's), and one `realpath` per parent
    directory and run. Links that stay inside the prefix are allowed; object stores have no links.
    """

    def __init__(self, store: Store, prefix: str | None):
        """`prefix` None: no prefix to guard (a runner made without a plan, in tests)."""
        self._store = store
        local = store.local_path(prefix) if prefix is not None else None
        self._prefix = local
        self._real_prefix = os.path.realpath(local) if local is not None else None
        self._parents: dict[str, str | None] = {}

    def refusal(self, output_path: str, absent: bool = False) -> str | None:
        """`absent`: the plan found no directory at `output_path` (its parents are checked all
        the same; a link made in its place since is a race this check does not pretend to win)."""
        local = self._store.local_path(output_path)
        if local is None or self._real_prefix is None or not is_within(local, self._prefix):
            return None
        parent = os.path.dirname(local)
        if parent not in self._parents:  # (the steps of a run share a few parents)
            self._parents[parent] = self._leads_out(parent)
        found = self._parents[parent]
        if found is None and not absent and os.path.islink(local):
            found = self._leads_out(local)
        if found is None:
            return None
        return (
            f"{found} is a symbolic link to {os.path.realpath(found)}, outside the prefix "
            f"{self._real_prefix}: the step would write there, so it is not run. Remove the link "
            "(a run writes only inside its prefix; to use another disk, put the prefix there)"
        )

    def _leads_out(self, local: str) -> str | None:
        """The first path from the prefix down to `local` that resolves outside the prefix."""
        if is_within(os.path.realpath(local), self._real_prefix):
            return None
        relative = os.path.relpath(local, self._prefix).split(os.sep)
        for depth in range(1, len(relative) + 1):
            path = os.path.join(self._prefix, *relative[:depth])
            if not is_within(os.path.realpath(path), self._real_prefix):
                return path
        return local


def append_status(
    store: Store,
    output_path: str,
    status: Status,
    message: str | None = None,
    worker: str | None = None,
    **extra: Any,
) -> StatusEvent:
    """Add an event to the step's status history (callers hold the lease).

    One line appended (JSON escapes newlines, so an event is always one line); the
    history before it is neither read nor rewritten.
    """
    event = StatusEvent(date=utc_now_iso(), status=status, message=message, worker=worker, extra=extra)
    store.append_line(status_path(output_path), event.to_json())
    return event


def step_info_record(
    step: ResolvedStep,
    graph: StepGraph,
    run_record: dict[str, Any] | None = None,
    dispatch: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `.executor_info` JSON for a resolved step of `graph`.

    `run_record` says where the run came from (experiment manifest, git state); with
    `config_template` it is what `marin reproduce` needs to declare the step again.
    `dispatch` is where the backend ran it (backend, device chosen, Ray options).
    """
    from executor.template import encode_template  # (only when a step's record is written)

    names = graph.names_by_path
    config, config_types = step.config_as_recorded
    return {
        "name": step.name,
        "fn_name": step.fn_name,
        "description": step.step.description,
        "config": config,
        "config_types": config_types,
        "config_digest": step.config_digest,
        "version": step.version,
        "version_hash": step.version_hash,
        "dependencies": list(step.dependencies),
        "dependency_steps": [
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
        "dispatch": dispatch,
    }


def _plain(value: Any) -> Any:
    return encode(value, strict=False)


TYPE_KEY = "__type__"
"""Where the encoder records a dataclass's class name (see `executor.fingerprint`)."""

MAX_TYPED_DEPTH = 100
"""How deep `split_config_types`/`recorded_config` look for dataclasses (the encoder's limit)."""


def split_config_types(record: Any) -> tuple[Any, dict[str, str]]:
    """An encoded config as Marin records it (`dataclasses.asdict`: no `__type__` keys), and
    the class names taken out, by field path as `executor.diffing.flatten` names fields
    ("" for the config itself, "model", "leaves[0]").

    `.executor_info` keeps both (`config`, `config_types`), so a Marin reader sees a plain
    dict and `marin diff`/`why` can still say which dataclass changed (`recorded_config`).
    """
    types: dict[str, str] = {}

    def strip(value: Any, path: str, depth: int) -> Any:
        if depth > MAX_TYPED_DEPTH:
            return value
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if key == TYPE_KEY and isinstance(item, str):
                    types[path] = item
                    continue
                out[key] = strip(item, f"{path}.{key}" if path else str(key), depth + 1)
            return out
        if isinstance(value, list):
            return [strip(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)]
        return value

    return strip(record, "", 0), types


def recorded_config(info: dict[str, Any]) -> Any:
    """The config an `.executor_info` records, as the encoder wrote it (`__type__` keys back
    in place from `config_types`), whichever form the file has: ours since issue 12,
    ours before (types inline), or Marin's (no types). For comparing with `config_record`."""
    config = info.get("config")
    types = info.get("config_types")
    if not isinstance(types, dict) or not types:
        return config

    def restore(value: Any, path: str, depth: int) -> Any:
        if depth > MAX_TYPED_DEPTH:
            return value
        if isinstance(value, dict):
            out = {
                key: restore(item, f"{path}.{key}" if path else str(key), depth + 1)
                for key, item in value.items()
            }
            name = types.get(path)
            if isinstance(name, str):
                out = {TYPE_KEY: name, **out}
            return out
        if isinstance(value, list):
            return [restore(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)]
        return value

    return restore(config, "", 0)


def write_info(store: Store, record: dict[str, Any]) -> None:
    text = info_json(record)
    if len(text) > INFO_READ_BY_TOOLS_BYTES:  # (ASCII: characters are bytes)
        _warn_large_info(record, len(text))
    store.write_atomic(info_path(record["output_path"]), text)


INFO_READ_BY_TOOLS_BYTES = 4 << 20
"""The most of a bookkeeping file `marin ls`/`explain`/`reproduce` and the browser read
(`marin.outputs.MAX_RECORD_BYTES` is this)."""


def _warn_large_info(record: dict[str, Any], size: int) -> None:
    """Written all the same (it is the step's record), but the user is told that the tools
    will call it unreadable: a large unversioned config (a list of 100,000 file names) does it."""
    logger.warning(
        "step %s: its .executor_info is %s bytes, over the %s that marin ls, explain, reproduce and "
        "the browser read: they will report it as unreadable, and reproduce cannot rebuild this "
        "step. Keep large values in a file and pass its path in the config",
        record.get("name"),
        f"{size:,}",
        f"{INFO_READ_BY_TOOLS_BYTES:,}",
    )


def info_json(record: dict[str, Any]) -> str:
    """`.executor_info` text: one top-level field per line, each value compact JSON.

    Readable with `cat`, and ~5x faster to write than `json.dumps(indent=2)` (which takes
    the pure-Python encoder; this takes the C one): ~0.1 ms of every cold step.
    """
    quote = json.encoder.encode_basestring_ascii  # (keys are strings)
    fields = ",\n".join(f"  {quote(key)}: {dumps_sorted(record[key])}" for key in sorted(record))
    return "{\n" + fields + "\n}\n"


MAX_INFO_BYTES = 16 << 20
"""The most of a step's `.executor_info` the executor reads (real ones hold a few KB; a
config's versioned part is limited to much less, see `executor.fingerprint`)."""


def read_info(store: Store, output_path: str) -> dict[str, Any] | None:
    """The step's `.executor_info`, or None when it is missing or not a JSON object.

    Only explanations (why a hash changed, which unversioned fields differ) read it, so
    an unreadable one costs an explanation, never a run. Storage failures still raise.
    """
    try:
        data, whole = store.read_tail(info_path(output_path), MAX_INFO_BYTES)
    except (NotRegularFileError, IsADirectoryError):  # a link, FIFO or directory: unreadable, as bad JSON is
        return None
    if data is None or not whole:  # a file of hundreds of MB is not read into memory
        return None
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested absurdly deep
        return None
    return record if isinstance(record, dict) else None


@dataclass(frozen=True)
class LeaseRecord:
    """Contents of `.executor_status.lock`: `{"timestamp": ..., "worker_id": ...}`, Marin's
    `Lease` exactly, so Marin's executor reads our leases (its `Lease(**data)` refuses any
    other key) and we read its. Who holds it (host and process) is in the worker id."""

    worker: str
    """The holder's worker id: `<host>:<pid>:<random>` (`executor.lease.new_worker_id`),
    followed by `/step:<host>:<pid>:<random>` when a step's own process holds it."""

    heartbeat: float
    """Unix time of the holder's last refresh (Marin's `timestamp`)."""

    acquired: float | None = None
    """When the holder took the lease: known only from leases written before the lease took
    Marin's format (`{acquired, heartbeat, host, pid, worker}`), which are still read."""

    @property
    def host(self) -> str:
        """The machine of the process holding the lease ("" when the id is not ours)."""
        return self._holder()[0]

    @property
    def pid(self) -> int:
        """Its process id (0 when the id is not ours)."""
        return self._holder()[1]

    def _holder(self) -> tuple[str, int]:
        last = self.worker.rsplit("/", 1)[-1].removeprefix("step:")
        parts = last.rsplit(":", 2)
        if len(parts) == 3 and parts[1].isdecimal() and parts[0]:
            return parts[0], int(parts[1])
        return "", 0

    def to_bytes(self) -> bytes:
        # Key-sorted, as `executor.lease_keeper.with_fresh_heartbeat` rewrites it.
        return dumps_sorted({"timestamp": self.heartbeat, "worker_id": self.worker}).encode("utf-8")

    @staticmethod
    def parse(data: bytes | None) -> LeaseRecord | None:
        """The lease in `data`, or None for no lease or one we cannot read (treated as expired)."""
        if not data:
            return None
        try:
            record = json.loads(data)
        except (ValueError, RecursionError):
            return None
        if not isinstance(record, dict):
            return None
        if record.keys() == {"worker_id", "timestamp"}:  # ours, and Marin's (refreshed every 30 s)
            worker, stamp, acquired = record["worker_id"], record["timestamp"], None
        elif record.keys() == {"acquired", "heartbeat", "host", "pid", "worker"}:  # ours, earlier
            worker, stamp, acquired = record["worker"], record["heartbeat"], record["acquired"]
            if not _timestamp(acquired):
                return None
        else:
            return None
        if type(worker) is not str or not _timestamp(stamp):
            return None
        return LeaseRecord(
            worker=worker, heartbeat=float(stamp), acquired=None if acquired is None else float(acquired)
        )


MAX_TIMESTAMP = 253402300799
"""The last second of the year 9999. A lease time outside 0..MAX_TIMESTAMP is no clock's
reading and could not be printed as a date: such a lease is unreadable (treated as expired)."""


def _timestamp(value: Any) -> bool:
    """Whether `value` is a time a lease can record: a number of seconds in 0..MAX_TIMESTAMP.

    (Comparing never converts: an integer with hundreds of digits is refused, not overflowed.)
    """
    return type(value) in (int, float) and 0 <= value <= MAX_TIMESTAMP
