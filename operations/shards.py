"""Document shards: the on-disk format every data operation reads and writes, and the
per-shard parallel map they all run on.

A *document* is one JSON object per line with the fields

    {"id": str, "text": str, "source": str, "metadata": {...}}

and a *shard* is one file of documents: `shard-00000.jsonl.gz` (or `.jsonl.zst`,
`.jsonl`). Operations stream shards (memory bounded by one document at a time, or one
shard where an operation must hold it), and `map_shards` runs a plain per-shard
function over them:

- in parallel worker processes (`workers`, default: one per core); the function is a
  top-level callable taking `(input_shard, output_shard)` and returning a dict of
  counters;
- or, when this process is connected to Ray (`operations.ray_util.ray_connected`: the
  executor's Ray backend connects its driver while a run has steps to run, and light
  steps such as these operations run in the driver), as Ray tasks (one CPU each): the
  same function travels to the workers with cloudpickle, with the paths of its input and
  output shard -- never the documents, so the driver's work grows with the number of
  shards, not documents. At most `workers` tasks (default: twice the cluster's CPUs) are
  in flight; more are submitted as they finish (`ray.wait`). A task writes through the
  same atomic helpers and saves the same counters, so output is byte-identical to the
  local pool's. A failed task fails the map with a `ShardError` naming the shard (the
  worker's exception is its cause) and cancels the tasks still running; the tasks die
  with the driver (Ray ends a job's workers when its driver exits);
- atomically: each output shard is written under a temporary name (`.tmp-<hex>-<name>`)
  and renamed, and its counters are saved next to it (`.shard_stats/<shard>.json`) only
  after the rename; temporary files that a killed writer left behind are removed before
  and after the map, so an output that returns normally holds none;
- with no orphans: a local worker dies with its driver (on Linux the kernel kills it,
  `PR_SET_PDEATHSIG`; a worker from a fork server watches the driver), so a SIGKILLed
  driver leaves no worker writing into its output, and an exception or Ctrl-C in the
  driver terminates the workers instead of waiting for the shards under way. Run in an
  executor step's thread, which never sees a Ctrl-C or SIGTERM, the map registers with
  `executor.interrupts`: the interrupted run ends its workers (or cancels its Ray tasks)
  before it releases the step's lease;
- resumably: a shard whose output and counters both exist is not processed again, so a
  crashed step re-run picks up where it stopped;
- deterministically: output shard i depends only on input shard i, gzip headers carry
  no timestamp or file name, and JSON is written with fixed separators, so identical
  input gives byte-identical output.

`write_stats` then sums the counters into `stats.json` in the output directory.

Shards are exact by construction, so reading one (`read_numbered_documents`) refuses anything
wrong with a `DataError` naming the file, the line and the fix: a truncated gzip or zstd
stream, a `.gz` that is not gzip, bytes that are not UTF-8, a line that is not JSON or not a
JSON object; `list_shards` refuses a directory or a broken link named like a shard, and a
directory without shards. `map_shards` puts the step (its `description`) in front of a
`DataError` from a shard function, so the step's failure is one line. See docs/data.md,
"Bad input".
"""

from __future__ import annotations

import contextlib
import ctypes
import gzip
import io
import json
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import IO, Any

import fsspec

from executor.interrupts import stop_on_interrupt
from operations.ray_util import ensure_ray, ray_connected

SHARD_SUFFIXES = (".jsonl.gz", ".jsonl.zst", ".jsonl")
STATS_FILE = "stats.json"
SHARD_STATS_DIR = ".shard_stats"
TEMP_PREFIX = ".tmp-"
# `atomic_output`'s temporary names. The executor's store writes its bookkeeping
# (`.executor_status`, the lease) with the same naming while a step runs, from its
# heartbeat thread: those are never touched here.
_TEMP_NAME = re.compile(re.escape(TEMP_PREFIX) + r"[0-9a-f]{32}-(?!\.executor)")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_WATCH_SECONDS = 0.5
# How long a terminated worker gets to exit before it is killed.
_TERMINATE_GRACE_SECONDS = 5.0


def shard_name(index: int, suffix: str = ".jsonl.gz") -> str:
    return f"shard-{index:05d}{suffix}"


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(part.strip("/") for part in parts)])


def is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


class DataError(ValueError):
    """Bad input data: the message is one line naming the file (and line) and what to do.

    `map_shards` puts the step in front (`filter: <file>, line 3: ...`). A ValueError, so
    callers catching ValueError keep working."""


_NOT_A_SHARD_FIX = (
    "point input_path at the output of a documents step, or turn raw files into shards with "
    "operations.documents.make_documents"
)


def list_shards(path: str) -> list[str]:
    """Document shards directly under `path` (sorted), or `[path]` if it is one shard.

    A directory or a broken symbolic link named like a shard is refused here, before any
    shard is processed, and so is a directory with no shard at all."""
    if path.endswith(SHARD_SUFFIXES) and not (is_local(path) and os.path.isdir(_local(path))):
        if is_local(path):
            _check_shard_entry(_local(path), path)
        return [path]
    fs, root = fsspec.core.url_to_fs(path)
    try:
        names = fs.ls(root, detail=False)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no such directory of document shards: {path}; check input_path (the step before "
            "this one must have run)"
        ) from None
    shards = sorted(
        (name if is_local(path) else fs.unstrip_protocol(name))
        for name in names
        if name.rstrip("/").rsplit("/", 1)[-1].endswith(SHARD_SUFFIXES)
        and not name.rsplit("/", 1)[-1].startswith(".")
    )
    if not shards:
        visible = sorted(
            base
            for base in (name.rstrip("/").rsplit("/", 1)[-1] for name in names)
            if not base.startswith(".")
        )
        holds = (
            f"it holds {', '.join(visible[:5])}{f' and {len(visible) - 5} more' if len(visible) > 5 else ''}"
            if visible
            else "it is empty"
        )
        raise FileNotFoundError(
            f"no document shards ({', '.join(SHARD_SUFFIXES)}) under {path} ({holds}); {_NOT_A_SHARD_FIX}"
        )
    if is_local(path):
        for shard in shards:
            _check_shard_entry(_local(shard), shard)
    return shards


def list_input_shards(path: str, step: str) -> list[str]:
    """`list_shards` for a step's input_path: its refusals name the step."""
    try:
        return list_shards(path)
    except (DataError, FileNotFoundError) as error:
        raise type(error)(f"{step}: input_path: {error}") from None


def _check_shard_entry(local: str, shown: str) -> None:
    """Refuse a directory or a broken symbolic link where a shard file is expected."""
    if os.path.isdir(local):
        raise DataError(f"{shown} is a directory, not a shard file; move it out of the input directory")
    if os.path.islink(local) and not os.path.exists(local):
        raise DataError(
            f"{shown} is a broken symbolic link (to {os.readlink(local)}); restore its target or remove the link"
        )


def _compression(path: str) -> str | None:
    if path.endswith(".gz"):
        return "gzip"
    if path.endswith(".zst"):
        return "zstd"
    return None


class _ZstdReader(io.RawIOBase):
    """A zstd stream (any number of frames), decompressed; EOFError when it ends mid-frame.

    zstandard's own stream reader (what fsspec gives) returns the bytes decoded so far and
    then b"" when a file is cut short, so a truncated shard read as a short, valid one."""

    _CHUNK = 1 << 16

    def __init__(self, raw: IO[bytes]) -> None:
        import zstandard

        self._raw = raw
        self._context = zstandard.ZstdDecompressor()
        self._frame: Any = None
        self._pending = b""
        self._offset = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._offset >= len(self._pending):
            chunk = self._raw.read(self._CHUNK)
            if not chunk:
                if self._frame is not None and not self._frame.eof:
                    raise EOFError("the zstd stream ends in the middle of a frame")
                return 0
            parts = []
            while chunk:
                if self._frame is None or self._frame.eof:
                    self._frame = self._context.decompressobj()
                parts.append(self._frame.decompress(chunk))
                chunk = self._frame.unused_data if self._frame.eof else b""
            self._pending, self._offset = b"".join(parts), 0
        count = min(len(buffer), len(self._pending) - self._offset)
        buffer[:count] = self._pending[self._offset : self._offset + count]
        self._offset += count
        return count


@contextlib.contextmanager
def open_compressed(path: str, compression: str | None = "infer") -> Iterator[IO[bytes]]:
    """A binary, line-iterable reader of a (possibly compressed) file: gzip, zstd (checked for
    truncation, see `_ZstdReader`) or whatever else fsspec infers from the name."""
    if compression == "infer":
        compression = _compression(path) or fsspec.utils.infer_compression(path)
    if compression != "zstd":
        with fsspec.open(path, "rb", compression=compression) as handle:
            yield handle
        return
    with fsspec.open(path, "rb") as raw, io.BufferedReader(_ZstdReader(raw), buffer_size=1 << 16) as handle:
        yield handle


def compressed_read_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged compressed file raises (truncated, or not compressed at all)."""
    import zstandard

    return (EOFError, gzip.BadGzipFile, zstandard.ZstdError)


def describe_read_error(path: str, error: BaseException, line: int = 0) -> str:
    """One line for a file that cannot be read as what its name says: the file, what is wrong, the fix."""
    after = f" after line {line}" if line else ""
    if isinstance(error, gzip.BadGzipFile):
        return (
            f"{path}: not a gzip file although its name ends in .gz ({error}); rename it to match its "
            "content (.jsonl for plain JSON Lines), or compress it with gzip"
        )
    if isinstance(error, EOFError):
        return (
            f"{path}: truncated: the compressed stream ends{after} before its end marker ({error}); "
            "the file is incomplete (an interrupted download or write) -- download or write it again"
        )
    if isinstance(error, IsADirectoryError):
        return f"{path} is a directory, not a shard file; move it out of the input directory"
    if isinstance(error, FileNotFoundError) and os.path.islink(_local(path)):
        return f"{path} is a broken symbolic link (to {os.readlink(_local(path))}); restore its target or remove the link"
    return (
        f"{path}: not a valid {_compression(path) or 'compressed'} file{after} ({type(error).__name__}: "
        f"{error}); the file is damaged or misnamed -- write it again, or rename it to match its content"
    )


def _json_kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _not_utf8(path: str, number: int, raw: bytes, error: UnicodeDecodeError) -> DataError:
    return DataError(
        f"{path}, line {number}: not valid UTF-8 (byte {raw[error.start]:#04x} at column {error.start + 1}); "
        "shards are UTF-8 JSON Lines: re-encode the file, or make the shards with operations.documents "
        "(encoding_errors='replace' keeps such text)"
    )


def parse_document_line(
    path: str, number: int, raw: bytes, loads: Callable[[bytes], Any] | None = None
) -> dict[str, Any]:
    """One shard line (bytes) as a document object, or a `DataError` naming the file, the line
    and the fix: bytes that are not UTF-8, a line that is not JSON, JSON that is not an object.
    `loads` (e.g. `orjson.loads`) parses the bytes directly; None: `json.loads` of the text."""
    try:
        document = json.loads(raw.decode("utf-8")) if loads is None else loads(raw)
    except UnicodeDecodeError as error:
        raise _not_utf8(path, number, raw, error) from None
    except ValueError as error:  # json's and orjson's decode errors
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as decode_error:
            raise _not_utf8(path, number, raw, decode_error) from None
        raise DataError(
            f"{path}, line {number}: not a JSON document ({error}); fix or remove the line, or make the "
            "shards with operations.documents (it skips and counts such lines)"
        ) from None
    if not isinstance(document, dict):
        raise DataError(
            f"{path}, line {number}: a JSON {_json_kind(document)}, not a document object "
            '({"id": ..., "text": ...}); fix or remove the line, or make the shards with '
            "operations.documents (it skips and counts records without text)"
        )
    return document


def numbered_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """`(line number, bytes)` of the non-blank lines of one shard (1-based, as editors count);
    a damaged or misnamed compressed file, a directory or a broken link raise a `DataError`."""
    number = 0
    try:
        with open_compressed(path) as handle:
            for number, raw in enumerate(handle, 1):  # noqa: B007 (read in the handler)
                if raw.strip():
                    yield number, raw
    except (*compressed_read_errors(), IsADirectoryError) as error:
        raise DataError(describe_read_error(path, error, number)) from None
    except FileNotFoundError as error:
        if is_local(path) and os.path.islink(_local(path)):
            raise DataError(describe_read_error(path, error)) from None
        raise


def read_numbered_documents(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream `(line number, document)` of one shard; blank lines are skipped. Bad input raises
    a `DataError` naming the file, the line and the fix (`numbered_lines`, `parse_document_line`)."""
    for number, raw in numbered_lines(path):
        yield number, parse_document_line(path, number, raw)


def read_documents(path: str) -> Iterator[dict[str, Any]]:
    """Stream the documents of one shard (see `read_numbered_documents` for bad input)."""
    for _number, document in read_numbered_documents(path):
        yield document


def iter_documents(path: str) -> Iterator[dict[str, Any]]:
    """Stream the documents of every shard under `path`, in shard order."""
    for shard in list_shards(path):
        yield from read_documents(shard)


def document_text(document: dict[str, Any], text_field: str, where: str, index: int) -> str:
    """The text of a document with an id, or a ValueError naming the shard, document and field."""
    text = document.get(text_field)
    if not isinstance(text, str):
        raise ValueError(
            f"{where}: document {document.get('id', f'#{index}')!r} has no string field "
            f"{text_field!r} (got {type(text).__name__}); set text_field to the field holding the text"
        )
    if "id" not in document:
        raise ValueError(f"{where}: document #{index} has no 'id' field; every document needs one")
    return text


def dumps_document(document: dict[str, Any]) -> str:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


@contextlib.contextmanager
def atomic_output(path: str) -> Iterator[IO[bytes]]:
    """A binary file handle that appears under `path` only when closed without error."""
    if is_local(path):
        target = _local(path)
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        temp = os.path.join(
            os.path.dirname(target), f"{TEMP_PREFIX}{uuid.uuid4().hex}-{os.path.basename(target)}"
        )
        try:
            with open(temp, "wb") as handle:
                yield handle
            os.replace(temp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
    else:
        # Object stores publish an object whole when the upload completes; a failed
        # upload leaves nothing under the final name.
        buffer = io.BytesIO()
        yield buffer
        with fsspec.open(path, "wb") as handle:
            handle.write(buffer.getvalue())


@contextlib.contextmanager
def _compressed(raw: IO[bytes], path: str) -> Iterator[IO[bytes]]:
    compression = _compression(path)
    if compression == "gzip":
        # mtime=0 and no file name: byte-identical output for identical input. Level 3: level 6
        # spent ~85% of a filter pass compressing, for ~10% smaller files.
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=3) as handle:
            yield handle
    elif compression == "zstd":
        import zstandard

        with zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=False) as handle:
            yield handle
    else:
        yield raw


@contextlib.contextmanager
def document_writer(path: str) -> Iterator[Callable[[dict[str, Any]], None]]:
    """`with document_writer(p) as write: write(doc)` -- an atomic, compressed shard."""
    with atomic_output(path) as raw, _compressed(raw, path) as handle:

        def write(document: dict[str, Any]) -> None:
            line = dumps_document(document)
            try:
                data = line.encode("utf-8")
            except UnicodeEncodeError:
                # A lone surrogate ("\ud800") is valid JSON but not UTF-8: escape it instead
                # of crashing; the line reads back to the same document.
                data = json.dumps(document, ensure_ascii=True, separators=(",", ":"), sort_keys=True).encode()
            handle.write(data + b"\n")

        yield write


def write_documents(path: str, documents: Iterable[dict[str, Any]]) -> int:
    count = 0
    with document_writer(path) as write:
        for document in documents:
            write(document)
            count += 1
    return count


def write_json_atomic(path: str, value: Any) -> None:
    with atomic_output(path) as handle:
        handle.write((json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def read_json(path: str) -> Any | None:
    try:
        with fsspec.open(path, "rt", encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


ShardFunction = Callable[[str, str], dict[str, Any]]


class ShardError(RuntimeError):
    """A shard's task failed on Ray; the message names the shard, `__cause__` is the
    worker's exception."""


def _shard_stats_path(output_dir: str, output_shard: str) -> str:
    return join(output_dir, SHARD_STATS_DIR, output_shard.rsplit("/", 1)[-1] + ".json")


def remove_temp_files(directory: str) -> list[str]:
    """Delete the temporary files `atomic_output` writers left anywhere under `directory`
    when they were killed (local disk only: object stores publish an object whole or not
    at all); returns their paths. Call it only while no writer is at work there."""
    if not is_local(directory):
        return []
    removed = []
    for root, _dirs, files in os.walk(_local(directory)):
        for name in files:
            if _TEMP_NAME.match(name):
                path = os.path.join(root, name)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    removed.append(path)
    return removed


def _init_worker(driver: int, forked_by_driver: bool) -> None:
    """Worker initializer: default signal handling, and an end with the driver."""
    # A forked worker inherits the driver's handlers. The executor's SIGTERM handler raises
    # in the main thread: `terminate()` would then fail the current shard, and the worker
    # would take the next one. With the default action SIGTERM ends the worker. Ctrl-C in
    # a terminal reaches the whole process group: the driver alone handles it, and stops
    # the workers.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_driver(driver, forked_by_driver)


def _die_with_driver(driver: int, forked_by_driver: bool) -> None:
    """Worker initializer: end this worker when the driver dies.

    Forked by the driver, the kernel does it (`PR_SET_PDEATHSIG` on Linux). Forked by a
    fork server, the worker's parent is the fork server, which outlives the driver (its
    own children keep it alive): a daemon thread then checks the driver every
    `_WATCH_SECONDS`."""
    if forked_by_driver and sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != driver:
            os._exit(1)  # the driver died before the prctl took effect
        return
    identity = _process_identity(driver)
    if identity is None:
        os._exit(1)
    threading.Thread(target=_watch_driver, args=(driver, identity), name="watch-driver", daemon=True).start()


def _process_identity(pid: int) -> str | None:
    """A running process's start time (so a reused pid is not taken for it), or None if
    it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc: only whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return "alive"
    return None if fields[0] in ("Z", "X") else fields[19]


def _watch_driver(driver: int, identity: str) -> None:
    while _process_identity(driver) == identity:
        time.sleep(_WATCH_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel the shards not started and end the workers now, mid-shard if need be (their
    temporary files are removed by the next run); returns once they have exited."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        with contextlib.suppress(Exception):
            process.terminate()
    for process in processes:
        process.join(_TERMINATE_GRACE_SECONDS)
        if process.is_alive():
            process.kill()
            process.join()
    pool.shutdown(wait=True, cancel_futures=True)


def _end_workers_now(pool: ProcessPoolExecutor) -> None:
    """End the pool's workers from another thread than the one waiting on the pool (the run
    was interrupted): SIGTERM, SIGKILL after `_TERMINATE_GRACE_SECONDS`; returns once they
    have exited. Reaping them is left to the pool's own threads (`_stop_workers`), so that no
    two threads wait for the same process."""
    from multiprocessing.connection import wait

    processes = [p for p in list((getattr(pool, "_processes", None) or {}).values()) if p.pid is not None]
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + _TERMINATE_GRACE_SECONDS
    left = {process.sentinel: process for process in processes}
    while left and time.monotonic() < deadline:
        for sentinel in wait(list(left), timeout=max(0.0, deadline - time.monotonic())):
            left.pop(sentinel, None)
    for process in left.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    if left:
        wait(list(left), timeout=_TERMINATE_GRACE_SECONDS)
    _wait_until_dead([process.pid for process in processes], _TERMINATE_GRACE_SECONDS)


def _wait_until_dead(pids: list[int], timeout: float) -> None:
    """Wait (up to `timeout` s) until each process has finished exiting: a zombie, or gone.

    A worker's sentinel becomes readable when the kernel closes its files, a moment before
    the process is done exiting; the lease released in that moment was released while the
    worker still existed (a CI-load flake of the test that checks this). Linux only (/proc);
    elsewhere the sentinel is all there is."""
    if not os.path.isdir("/proc/self"):
        return
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat", "rb") as handle:
                    state = handle.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                break  # gone (reaped)
            if state in (b"Z", b"X"):
                break
            time.sleep(0.001)


def _run_one(
    fn: ShardFunction, input_shard: str, output_shard: str, stats_path: str, description: str = ""
) -> dict[str, Any]:
    try:
        stats = fn(input_shard, output_shard)
    except DataError as error:
        if not description:
            raise
        # The step in front of the file and line: one line says which step, which file, what to do.
        raise DataError(f"{description}: {error}") from error
    write_json_atomic(stats_path, stats)
    return stats


def refuse_output_among_inputs(inputs: Iterable[str], output_dir: str, what: str) -> None:
    """Refuse an output directory that holds input shards: its shards would replace them
    (same names) or mix with them (the next step lists both)."""
    if not is_local(output_dir):
        return
    output = os.path.realpath(_local(output_dir))
    for input_shard in inputs:
        if is_local(input_shard) and os.path.realpath(os.path.dirname(_local(input_shard))) == output:
            raise ValueError(
                f"{what}: output_path {output_dir} is the directory of its input shards ({input_shard}); "
                "writing there would replace or mix with the input -- give the step its own output_path"
            )


def map_shards(
    fn: ShardFunction,
    inputs: list[str],
    output_dir: str,
    *,
    workers: int | None = None,
    description: str = "shards",
    output_suffix: str = ".jsonl.gz",
) -> list[dict[str, Any]]:
    """Run `fn(input_shard, output_shard)` for every input shard; returns each shard's counters.

    Output shard i is `<output_dir>/shard-0000i<suffix>`. Shards already done (output and
    counters present) are skipped; `fn` must write its output shard atomically (use
    `document_writer`). Connected to Ray, the shards run as Ray tasks (at most `workers`
    in flight, default twice the cluster's CPUs); else in local worker processes (at most
    `workers`, default one per core).
    """
    from tqdm.auto import tqdm

    refuse_output_among_inputs((i for i in inputs if _is_local_file(i)), output_dir, description)
    # Left by a worker or driver killed mid-shard; no writer of this output is alive now
    # (the executor's lease keeps other drivers out, and workers die with their driver).
    remove_temp_files(output_dir)
    jobs = []
    results: dict[int, dict[str, Any]] = {}
    for index, input_shard in enumerate(inputs):
        output_shard = join(output_dir, shard_name(index, output_suffix))
        stats_path = _shard_stats_path(output_dir, output_shard)
        done = read_json(stats_path)
        if done is not None and _exists(output_shard):
            results[index] = done
        else:
            jobs.append((index, input_shard, output_shard, stats_path))
    on_ray = bool(jobs) and ray_connected()
    if not on_ray:
        workers = max(1, min(workers or os.cpu_count() or 1, len(jobs) or 1))
    progress = tqdm(total=len(inputs), initial=len(results), desc=description, unit="shard", leave=False)
    try:
        if on_ray:
            _map_on_ray(fn, jobs, results, progress.update, workers, description)
        elif workers == 1 or len(jobs) <= 1:
            for index, input_shard, output_shard, stats_path in jobs:
                results[index] = _run_one(fn, input_shard, output_shard, stats_path, description)
                progress.update()
        else:
            # fork is fastest, but forking a process that has loaded JAX (a tokenize or train
            # step earlier in the same driver) can deadlock: use a fork server then.
            context = multiprocessing.get_context("forkserver" if "jax" in sys.modules else None)
            pool = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=context,
                initializer=_init_worker,
                initargs=(os.getpid(), context.get_start_method() != "forkserver"),
            )
            interrupted = threading.Event()

            def stop_on_interrupt_of_the_run() -> None:  # (from the driver's main thread)
                interrupted.set()
                _end_workers_now(pool)

            try:
                with stop_on_interrupt(stop_on_interrupt_of_the_run):
                    futures = {
                        pool.submit(_run_one, fn, input_shard, output_shard, stats_path, description): index
                        for index, input_shard, output_shard, stats_path in jobs
                    }
                    for future in as_completed(futures):
                        try:
                            results[futures[future]] = future.result()
                        except BrokenProcessPool as broken:  # a worker was killed (OOM killer, kill -9)
                            if interrupted.is_set():
                                raise ShardError(f"{description}: interrupted") from None
                            raise _worker_died(jobs, results) from broken
                        progress.update()
            except BaseException:
                _stop_workers(pool)
                raise
            pool.shutdown(wait=True)
    finally:
        progress.close()
    remove_temp_files(output_dir)
    return [results[index] for index in range(len(inputs))]


def _worker_died(jobs: list, results: dict) -> RuntimeError:
    """Which shards were unfinished when a worker process died: the pool's own error names none."""
    unfinished = [input_shard for index, input_shard, _output, _stats in jobs if index not in results]
    shown = ", ".join(unfinished[:5]) + (f" and {len(unfinished) - 5} more" if len(unfinished) > 5 else "")
    return RuntimeError(
        f"a worker process died (killed, or out of memory?) with {len(unfinished)} shard(s) unfinished: "
        f"{shown}. The finished shards are kept; run the step again to do the rest"
    )


def _run_on_ray_worker(
    blob: bytes, sys_path: list[str], input_shard: str, output_shard: str, stats_path: str
) -> dict[str, Any]:
    """The body of one Ray task: `_run_one` with the shard function the driver pickled.

    The driver's `sys.path` comes first, so a shard function defined in an experiment
    script (pickled by reference) resolves on the worker as it does in the driver."""
    for entry in reversed(sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    import cloudpickle

    return _run_one(cloudpickle.loads(blob), input_shard, output_shard, stats_path)


def _map_on_ray(
    fn: ShardFunction,
    jobs: list[tuple[int, str, str, str]],
    results: dict[int, dict[str, Any]],
    advance: Callable[[], Any],
    in_flight: int | None,
    description: str,
) -> None:
    """Run `jobs` as Ray tasks, at most `in_flight` at once (default: twice the cluster's
    CPUs), filling `results`; on any failure or interrupt the running tasks are cancelled."""
    import cloudpickle
    import ray

    cpus = ensure_ray()
    limit = max(1, in_flight or int(2 * cpus) or 1)
    task = ray.remote(num_cpus=1)(_run_on_ray_worker)
    # Pickled once and put in the object store once: every task reads the same bytes.
    blob = ray.put(cloudpickle.dumps(fn))
    sys_path = ray.put([entry for entry in sys.path if entry])
    pending = deque(jobs)
    running: dict[Any, tuple[int, str, str, str]] = {}

    def cancel_running() -> None:  # (the run was interrupted: from the driver's main thread)
        refs = list(running)
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        # `ray.cancel` only asks: the tasks' workers are killed a moment later. Wait for their
        # results (a cancelled or killed task's result is its error) before the step's lease is
        # released, or a task could still be writing when another driver takes the step.
        if refs:
            with contextlib.suppress(Exception):
                ray.wait(refs, num_returns=len(refs), timeout=_TERMINATE_GRACE_SECONDS)

    try:
        with stop_on_interrupt(cancel_running):
            while pending or running:
                while pending and len(running) < limit:
                    job = pending.popleft()
                    running[task.remote(blob, sys_path, *job[1:])] = job
                done, _ = ray.wait(list(running), num_returns=1)
                for ref in done:
                    index, input_shard, output_shard, _stats = running.pop(ref)
                    try:
                        results[index] = ray.get(ref)
                    except ray.exceptions.RayError as error:
                        cause = getattr(error, "cause", None) or error
                        raise ShardError(
                            f"{description}: shard {index} ({input_shard} -> {output_shard}) failed on a "
                            f"Ray worker: {type(cause).__name__}: {cause}"
                        ) from cause
                    advance()
    except BaseException:
        cancel_running()
        raise


def finished_shards(output_dir: str, count: int, output_suffix: str = ".jsonl.gz") -> set[int]:
    """Indices below `count` of the output shards `map_shards` would skip as done."""
    done = set()
    for index in range(count):
        output_shard = join(output_dir, shard_name(index, output_suffix))
        if _exists(_shard_stats_path(output_dir, output_shard)) and _exists(output_shard):
            done.add(index)
    return done


def _is_local_file(path: str) -> bool:
    """A local path to an existing file (not `documents`' JSON descriptors, not a URL)."""
    return is_local(path) and not path.lstrip().startswith("{") and os.path.isfile(_local(path))


def _exists(path: str) -> bool:
    if is_local(path):
        return os.path.exists(_local(path))
    fs, root = fsspec.core.url_to_fs(path)
    return fs.exists(root)


def sum_counters(per_shard: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Add up numeric counters (nested dicts too) across shards."""
    total: dict[str, Any] = {}
    for stats in per_shard:
        _add_into(total, stats)
    return total


def _add_into(total: dict[str, Any], stats: dict[str, Any]) -> None:
    for key, value in stats.items():
        if isinstance(value, dict):
            _add_into(total.setdefault(key, {}), value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            total[key] = total.get(key, 0) + value
        elif isinstance(value, list):
            total.setdefault(key, []).extend(value)


def write_stats(output_dir: str, stats: dict[str, Any]) -> None:
    """Write `stats.json` (atomically) into an operation's output directory."""
    write_json_atomic(join(output_dir, STATS_FILE), stats)
