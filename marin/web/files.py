"""Paged reads of output files: only the requested page is read, never a file whole.

- JSON lines (`.jsonl`, `.ndjson`, also gzip / zstd / bz2 / xz compressed) and any
  compressed text: the page is a range of lines; the reader streams and stops after the
  page (lines past the offset are decompressed and skipped, not kept).
- Parquet: the page is a range of rows; only the row groups that hold it are read, in
  batches (`pyarrow.parquet.ParquetFile.iter_batches`).
- Plain text and large JSON: the page is a byte range (seek + read), cut at a newline.
- Small JSON (up to `JSON_PRETTY_MAX` bytes): pretty-printed whole.
- Anything else that looks binary (NUL bytes, undecodable UTF-8): "binary, N bytes".

Every single line is capped at `MAX_LINE_BYTES`: the rest of a longer line is skipped
in chunks, so one huge line cannot make the server hold it. A page keeps at most
`MAX_PAGE_BYTES` of lines (it ends early, with a "next" link, past that).

Line reads are bounded per request: one `ReadBudget` of `MAX_READ_BYTES` of (decompressed)
data and `MAX_READ_SECONDS` is shared by every file a request reads (a page that reads a
shard in each of a dozen steps gets one budget, not one per file), and the readers stop
when it is spent, so a small compressed file that expands to gigabytes (a "zip bomb"), or
a page far into a huge file, cannot tie up a core. The file viewer then says where it
stopped (a 'stopped' page); other readers raise `ReadLimit`, which the pages show as an
error or as a note saying which files were not (fully) read. The heads of files a page
shows (`read_head`: a compare page's sources, a training page's results.json) count in
the same budget when the page passes it.

Only regular files are read: a FIFO, device or socket is refused with 403 (`Refused`)
without blocking on it, by the file viewer as by `open_raw`.
"""

from __future__ import annotations

import bz2
import contextlib
import errno
import gzip
import importlib
import importlib.util
import io
import json
import lzma
import os
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from executor.store import Store

from .safety import Refused, Target

LINES_PER_PAGE = 50
MAX_LINES_PER_PAGE = 1000
TEXT_PAGE_BYTES = 64 * 1024
MAX_LINE_BYTES = 1 << 20
MAX_PAGE_BYTES = 8 << 20
MAX_READ_BYTES = 256 << 20
MAX_READ_SECONDS = 5.0
JSON_PRETTY_MAX = 1 << 20
SNIFF_BYTES = 8192
COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
BINARY_SUFFIXES = (
    ".npz",
    ".npy",
    ".bin",
    ".safetensors",
    ".pt",
    ".pth",
    ".msgpack",
    ".arrow",
    ".zip",
    ".tar",
    ".png",
    ".jpg",
    ".jpeg",
    ".gif",
    ".pdf",
    ".pkl",
    ".pickle",
    ".ckpt",
    ".ocdbt",
    ".so",
)


@dataclass
class Page:
    """One page of a file, as the viewer shows it."""

    kind: str
    """'lines' (JSON or text lines), 'text' (a byte range), 'json' (whole, pretty),
    'table' (parquet rows), 'binary', 'empty', or 'stopped' (the read limits ran out
    before the page's first line; `note` says so)."""

    offset: int
    """First line / byte / row of the page."""

    next_offset: int | None = None
    prev_offset: int | None = None
    lines: list[tuple[int, str, bool]] = field(default_factory=list)
    """(line number, text, cut) for 'lines'; cut when the line was longer than the cap."""

    text: str = ""
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    total: int | None = None
    """Rows of a parquet file; bytes of a text file."""

    size: int | None = None
    """Bytes on storage."""

    note: str = ""


def compression_of(name: str) -> str | None:
    for suffix, kind in COMPRESSION.items():
        if name.endswith(suffix):
            return kind
    return None


def base_name(name: str) -> str:
    """`shard-00000.jsonl.gz` -> `shard-00000.jsonl`."""
    for suffix in COMPRESSION:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def is_json_lines(name: str) -> bool:
    base = base_name(name)
    return base.endswith((".jsonl", ".ndjson")) or (
        base.endswith(".json") and compression_of(name) is not None
    )


@contextlib.contextmanager
def open_raw(store: Store, target: Target) -> Iterator[IO[bytes]]:
    """The file's bytes as a seekable stream (local file, or fsspec's block-cached reader).

    On local disk only a regular file is read: a FIFO, device or socket is refused (403)
    before it is opened (a character device such as /dev/zero would stream without end),
    and checked again once open, O_NONBLOCK, in case it was swapped in between (a FIFO then
    opens at once instead of holding a connection until some writer comes)."""
    if target.local is not None:
        _check_regular(target)  # not even opened: opening a device can do things
        try:
            fd = os.open(target.local, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as error:
            if error.errno == errno.ENXIO:  # a socket (made since the check): it cannot be opened
                raise _not_regular(target) from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _not_regular(target)
            handle = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        with handle:
            yield handle
    else:
        with store.fs.open(store.fs_path(target.path), "rb") as handle:
            yield handle


class MissingPackage(Refused):
    """A file kind that needs a package of the `data` extra, which is not installed."""

    def __init__(self, module: str, what: str):
        super().__init__(
            501,
            f"showing {what} needs {module.split('.')[0]}, which is not installed: "
            "pip install -e '.[data]' (or pip install marin-experiments[data])",
        )


def _require(module: str, what: str) -> None:
    """MissingPackage unless `module` is installed; imports nothing (a parquet page is read in
    a process of its own, so the server need not load pyarrow)."""
    if module in sys.modules:
        installed = sys.modules[module] is not None
    else:
        try:
            installed = importlib.util.find_spec(module.split(".")[0]) is not None
        except (ImportError, ValueError):
            installed = False
    if not installed:
        raise MissingPackage(module, what)


def _optional(module: str, what: str) -> Any:
    """`module`, imported on first use (the browser itself needs no package of the `data` extra)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingPackage(module, what) from error


def decompressed(raw: IO[bytes], kind: str | None) -> IO[bytes]:
    if kind == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if kind == "zstd":
        zstandard = _optional("zstandard", ".zst files")
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True))
    if kind == "bz2":
        return bz2.BZ2File(raw, mode="rb")
    if kind == "xz":
        return lzma.LZMAFile(raw, mode="rb")
    return raw


class ReadLimit(Refused):
    """A read stopped by the per-request limits (`MAX_READ_BYTES`, `MAX_READ_SECONDS`)."""

    def __init__(self, name: str, read: int, seconds: float):
        why = f"{seconds:.1f} s" if read <= MAX_READ_BYTES else f"{read >> 20} MiB"
        super().__init__(
            413,
            f"stopped reading {name} after {why} ({read >> 20} MiB of data read by this request): "
            f"the browser reads at most {MAX_READ_BYTES >> 20} MiB, or {MAX_READ_SECONDS:g} s, of "
            "(decompressed) lines per request, all the files it reads together; use the raw link "
            "to read the whole file",
        )


class ReadBudget:
    """What one request may read of files' (decompressed) lines: `MAX_READ_BYTES` of data and
    `MAX_READ_SECONDS` from the budget's creation, shared by every file read with it."""

    def __init__(self) -> None:
        self.read = 0
        self.started = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def spent(self) -> bool:
        return self.read > MAX_READ_BYTES or self.elapsed > MAX_READ_SECONDS

    def check(self, name: str) -> None:
        """`ReadLimit` (naming the file `name`) if the budget is spent."""
        elapsed = self.elapsed
        if self.read > MAX_READ_BYTES or elapsed > MAX_READ_SECONDS:
            raise ReadLimit(name, self.read, elapsed)


class _Bounded:
    """`readline` of a stream, raising `ReadLimit` once the request's budget is spent."""

    def __init__(self, stream: IO[bytes], name: str, budget: ReadBudget | None = None):
        self.stream = stream
        self.name = name
        self.budget = budget if budget is not None else ReadBudget()

    def readline(self, size: int = -1) -> bytes:
        self.budget.check(self.name)  # a budget spent on other files reads nothing more
        line = self.stream.readline(size)
        self.budget.read += len(line)
        self.budget.check(self.name)
        return line


def read_line(stream: IO[bytes], cap: int = MAX_LINE_BYTES) -> tuple[bytes, bool] | None:
    """The next line (without its newline), at most `cap` bytes of it; None at the end."""
    head = stream.readline(cap)
    if not head:
        return None
    if head.endswith(b"\n") or len(head) < cap:
        return head.rstrip(b"\r\n"), False
    while True:  # skip the rest of an over-long line without keeping it
        rest = stream.readline(cap)
        if not rest or rest.endswith(b"\n"):
            return head, True


def iter_lines(stream: IO[bytes], start: int = 0) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, bytes, cut) from line `start` on; earlier lines are read and dropped."""
    number = 0
    while True:
        line = read_line(stream)
        if line is None:
            return
        if number >= start:
            yield number, line[0], line[1]
        number += 1


def file_size(store: Store, target: Target) -> int | None:
    try:
        if target.local is not None:
            return os.path.getsize(target.local)
        return int(store.fs.size(store.fs_path(target.path)))
    except (OSError, ValueError, TypeError):
        return None


def _not_regular(target: Target) -> Refused:
    return Refused(403, f"{target.relpath}: not a regular file (a pipe, device, socket or directory)")


def _check_regular(target: Target) -> None:
    """Refused (403) if `target` is on local disk and not a regular file (a FIFO, device,
    socket or directory); a path that cannot be stat'ed is left to the open to report."""
    if target.local is None:
        return
    try:
        mode = os.stat(target.local).st_mode
    except OSError:
        return  # gone, or a link loop: the open says so
    if not stat.S_ISREG(mode):
        raise _not_regular(target)


def _regular_size(store: Store, target: Target) -> int | None:
    """The file's size, after refusing (403) a local FIFO, device or socket: its size (0) says
    nothing of what reading it would do (wait for a writer, or stream without end)."""
    _check_regular(target)
    return file_size(store, target)


def looks_binary(sample: bytes) -> bool:
    if b"\x00" in sample:
        return True
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as error:
        # A multi-byte character cut by the sample's end is still text.
        return error.start < len(sample) - 3
    return False


def read_page(
    store: Store,
    target: Target,
    offset: int = 0,
    limit: int = LINES_PER_PAGE,
    budget: ReadBudget | None = None,
) -> Page:
    """The page of `target` starting at `offset` (line, byte or row, by file kind). Lines are
    read within `budget` (a fresh one if None). A FIFO, device or socket is refused (403)."""
    name = target.relpath.rsplit("/", 1)[-1]
    size = _regular_size(store, target)
    offset = max(0, offset)
    limit = max(1, min(limit, MAX_LINES_PER_PAGE))
    if size == 0:
        return Page("empty", 0, size=0, note="empty file")
    base = base_name(name).lower()
    if base.endswith(".parquet"):
        return _parquet_page(store, target, offset, limit, size)
    kind = compression_of(name)
    if kind is None and base.endswith(BINARY_SUFFIXES):
        return Page("binary", 0, size=size, note=f"binary, {size} bytes")
    if kind is None and base.endswith(".json") and size is not None and size <= JSON_PRETTY_MAX:
        page = _json_page(store, target, size)
        if page is not None:
            return page
    if kind is not None or is_json_lines(name):
        return _lines_page(store, target, kind, offset, limit, size, budget)
    return _text_page(store, target, offset, size)


def _json_page(store: Store, target: Target, size: int) -> Page | None:
    with open_raw(store, target) as raw:
        data = raw.read(JSON_PRETTY_MAX + 1)
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None  # not JSON after all (or nested deeper than the parser goes): shown as text
    return Page("json", 0, text=json.dumps(value, indent=2, ensure_ascii=False), size=size)


def _lines_page(
    store: Store,
    target: Target,
    kind: str | None,
    offset: int,
    limit: int,
    size: int | None,
    budget: ReadBudget | None = None,
) -> Page:
    lines: list[tuple[int, str, bool]] = []
    kept = 0
    more = False
    note = ""
    prev_offset = max(0, offset - limit) if offset > 0 else None
    try:
        with open_raw(store, target) as raw:
            stream = decompressed(raw, kind)
            sample = stream.peek(SNIFF_BYTES)[:SNIFF_BYTES] if hasattr(stream, "peek") else b""
            if sample and looks_binary(sample):
                return Page("binary", 0, size=size, note=f"binary, {size} bytes ({kind or 'uncompressed'})")
            for number, data, cut in iter_lines(_Bounded(stream, target.relpath, budget), offset):
                if len(lines) == limit or kept >= MAX_PAGE_BYTES:
                    more = True
                    break
                lines.append((number, data.decode("utf-8", errors="replace"), cut))
                kept += len(data)
    except ReadLimit as stopped:
        if not lines:
            return Page("stopped", offset, prev_offset=prev_offset, size=size, note=stopped.message)
        more, note = False, stopped.message
    except (OSError, EOFError, lzma.LZMAError, ValueError) as error:
        if not lines:
            return Page("binary", 0, size=size, note=f"cannot read as {kind or 'text'}: {error}")
        more = False
    return Page(
        "lines",
        offset,
        next_offset=offset + len(lines) if more else None,
        prev_offset=prev_offset,
        lines=lines,
        size=size,
        note=note or ("" if lines or offset == 0 else "no lines at this offset"),
    )


def _past_the_end(offset: int, size: int | None) -> Page:
    """The empty page after a file's last byte (an offset past the end, however far)."""
    last = max(0, size - TEXT_PAGE_BYTES) if size is not None else None
    return Page(
        "text",
        offset,
        prev_offset=last if last is not None and last < offset else None,
        total=size,
        size=size,
        note=f"offset {offset} is past the end of the file"
        + (f" ({size} bytes); the previous page is its last" if size is not None else ""),
    )


def _text_page(store: Store, target: Target, offset: int, size: int | None) -> Page:
    if offset > 0 and size is not None and offset >= size:
        return _past_the_end(offset, size)  # seek would fail (EINVAL) past what the filesystem allows
    with open_raw(store, target) as raw:
        if offset == 0:
            sample = raw.read(SNIFF_BYTES)
            if looks_binary(sample):
                return Page("binary", 0, size=size, note=f"binary, {size} bytes")
        try:
            raw.seek(offset)
        except (OSError, ValueError, OverflowError):  # the size was not known, or changed
            return _past_the_end(offset, size)
        data = raw.read(TEXT_PAGE_BYTES)
    end = offset + len(data)
    at_end = size is not None and end >= size
    if not at_end and b"\n" in data:
        cut = data.rindex(b"\n") + 1
        data, end = data[:cut], offset + cut
    return Page(
        "text",
        offset,
        next_offset=None if at_end or not data else end,
        prev_offset=max(0, offset - TEXT_PAGE_BYTES) if offset > 0 else None,
        text=data.decode("utf-8", errors="replace"),
        total=size,
        size=size,
    )


def _parquet_page(store: Store, target: Target, offset: int, limit: int, size: int | None) -> Page:
    _require("pyarrow.parquet", "parquet files")
    source = target.local if target.local is not None else target.path
    if source.startswith("memory://"):  # lives in this process only: no preview process can open it
        return Page("binary", 0, size=size, note="parquet files of a memory:// tree are not previewed")
    from .parquet_preview import read_rows

    result = read_rows(source, offset, limit)
    if result.error is not None:
        return Page("binary", 0, size=size, note=result.error)
    if result.stopped is not None:
        return Page("stopped", offset, size=size, note=result.stopped)
    end = offset + len(result.rows)
    return Page(
        "table",
        offset,
        next_offset=end if result.more or end < result.total else None,
        prev_offset=max(0, min(offset, result.total) - limit) if offset > 0 else None,
        columns=result.columns,
        rows=result.rows,
        total=result.total,
        size=size,
    )


def read_head(
    store: Store, target: Target, max_bytes: int, budget: ReadBudget | None = None
) -> tuple[str, bool]:
    """The first `max_bytes` of a file as text, and whether there was more. With a `budget`
    the bytes read count in it, and a spent budget raises `ReadLimit` before the file is opened."""
    if budget is not None:
        budget.check(target.relpath)
    with open_raw(store, target) as raw:
        data = raw.read(max_bytes + 1)
    if budget is not None:
        budget.read += len(data)
    return data[:max_bytes].decode("utf-8", errors="replace"), len(data) > max_bytes


def iter_records(
    store: Store, target: Target, start: int = 0, budget: ReadBudget | None = None
) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(line number, parsed JSON object or None) of a JSON-lines file, streamed; raises
    `ReadLimit` (a `Refused`) once `budget` is spent (a fresh budget if None: pass the
    request's one when a request reads several files)."""
    name = target.relpath.rsplit("/", 1)[-1]
    with open_raw(store, target) as raw:
        stream = _Bounded(decompressed(raw, compression_of(name)), target.relpath, budget)
        for number, data, cut in iter_lines(stream, start):
            record = None
            if not cut:
                try:
                    value = json.loads(data)
                    record = value if isinstance(value, dict) else None
                except (ValueError, RecursionError):
                    record = None
            yield number, record
