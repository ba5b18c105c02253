"""The one storage interface the executor writes through.

Everything the executor puts in the output tree -- step info, status, leases, logs,
experiment manifests -- goes through `Store`, so local disk, `memory://` and object
stores (`s3://`, `gs://`) share one code path and one contract test suite
(`tests/executor/test_store_contract.py`).

The interface is deliberately small:

- `read_bytes` / `read_text` return None for a missing file (no exists-then-read race);
  on local disk they never read through a symbolic link nor wait on a FIFO: a link, FIFO,
  device or socket in a file's place is a `NotRegularFileError` (and `append_line` never
  writes through one; `write_atomic`'s rename replaces a link itself, never its target);
- `find_files` lists every file under a directory, at any depth (never through a link);
- `write_atomic` never leaves a half-written file under the final name (temporary
  name then rename on local disk; object stores publish an object whole);
- `append_line` adds one line to a file that only one writer changes at a time (the
  lease holder's status history). On local disk it is one `write()` to a file opened
  with `O_APPEND`: no temporary file, no rename, and a reader sees the old file or the
  old file plus the whole line. Object stores have no append: there it reads the file
  and writes it back whole with `write_atomic`;
- `compare_and_swap` replaces a file only if it still holds what the caller last saw.
  Leases are built on it. It is atomic on local disk (an flock on the directory
  serialises the read-compare-write between processes and threads; creating an absent
  file is one `O_CREAT|O_EXCL` open and one `write()` under that lock) and in memory
  (a process lock) and on GCS and S3 (`ConditionalStore`: the write carries the version
  read -- GCS `ifGenerationMatch`, S3 `If-None-Match: *` / `If-Match: <ETag>` -- and
  the server refuses it if the object changed since).

On object stores every operation is retried after a transient error (connection reset,
timeout, HTTP 429/5xx) that the client library did not absorb, with bounded backoff and a
log line per retry, and a missing bucket or refused credentials is a `StoreError` naming
the bucket and the setting to fix (`executor.retry`, `docs/buckets.md`). Local disk and
`memory://` have no such faults and take no such detour.

Local disk uses `os` calls only and never imports fsspec (its import costs more than a
fully cached re-run of a 1,000-step experiment); `LocalStore.fs` loads fsspec's local
filesystem the first time a caller asks for it. Other protocols import fsspec (and
their backend, s3fs or gcsfs) when their store is opened.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
from _thread import RLock  # (`threading` itself: ~0.4 ms of every start)
from functools import cached_property

from executor.lazy_logging import LazyLogger
from executor.records import dataclass

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    import fsspec

logger = LazyLogger(__name__)


class StoreError(OSError):
    """The prefix cannot be read or written."""


class NotRegularFileError(OSError):
    """A file the executor keeps (status, lease, info, log) is, on local disk, a symbolic
    link, FIFO, device or socket: never read or written through (it could point out of the
    prefix, or block a reader forever). `why` says what it is, for the caller's message."""

    def __init__(self, path: str, why: str):
        self.path = path
        self.why = why
        super().__init__(f"{path}: {why}")

    def __reduce__(self):  # (pickled across processes: rebuild from both arguments)
        return type(self), (self.path, self.why)


@dataclass(frozen=True)
class FileInfo:
    """What a listing says about one entry."""

    path: str
    name: str
    is_dir: bool
    size: int
    mtime: float | None


def _random_hex() -> str:
    """32 random hex digits, as `uuid.uuid4().hex` (without importing uuid and platform)."""
    return os.urandom(16).hex()


_TEMP_SALT = _random_hex()[:12]
"""Random per import: with the process id and a counter it names temporary files uniquely
without a `getrandom` call per file (a forked child has another pid)."""

_TEMP_COUNTER = itertools.count()


def _temp_name(name: str) -> str:
    """`.tmp-<unique>-<name>`: the prefix every reader and cleaner knows as temporary."""
    return f".tmp-{_TEMP_SALT}{os.getpid():x}{next(_TEMP_COUNTER):06x}-{name}"


def _to_bytes(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs"})
"""Protocols whose permanent errors `Store._io` words (bucket, credentials)."""

_UPLOADS = frozenset({"write", "conditional write"})
"""Operations that cannot meet a missing object: a FileNotFoundError there (GCS's 404) is the bucket's."""


class Store:
    """fsspec-backed store; subclasses specialise atomicity for their backend.

    Every call into `fs` goes through `_io`: retried after transient errors, permanent
    ones (missing bucket, refused credentials) raised as one-line `StoreError`s.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, protocol: str):
        self.fs = fs
        self.protocol = protocol
        from executor import retry  # here: local disk never needs it (import cost)

        self._retry_policy = retry.RetryPolicy.from_env()

    def _io(self, operation: str, path: str, fn, *args, retry_unreachable: bool = True, **kwargs):
        """`fn(*args, **kwargs)` under the retry policy; a permanent error on an object
        store, or an endpoint no connection could be made to after the retries, becomes a
        StoreError naming the bucket and the setting to fix."""
        from executor import retry

        try:
            return retry.call(
                operation,
                path,
                fn,
                *args,
                policy=self._retry_policy,
                retry_unreachable=retry_unreachable,
                **kwargs,
            )
        except StoreError:
            raise
        except Exception as error:
            if self.protocol not in _OBJECT_STORES:
                raise
            kind = retry.permanent_kind(error)
            if kind is None and operation in _UPLOADS and isinstance(error, FileNotFoundError):
                kind = "bucket"
            if kind is None and retry.unreachable(error):
                raise StoreError(retry.unreachable_message(self.protocol, path, error)) from error
            # botocore refuses a bucket name before any request (ParamValidationError).
            if kind is None and type(error).__name__ == "ParamValidationError":
                why = " ".join(str(error).split())  # botocore spreads it over lines
                raise StoreError(
                    f"{path}: the S3 client refuses it ({why}); check the bucket name"
                ) from error
            if kind is None:
                raise
            raise StoreError(retry.permanent_message(kind, self.protocol, path, error)) from error

    # -- naming ---------------------------------------------------------------
    def fs_path(self, path: str) -> str:
        """`path` as this store's fsspec filesystem names it (for streaming reads through `fs`)."""
        return path

    # -- reads ----------------------------------------------------------------
    def read_bytes(self, path: str) -> bytes | None:
        # cat_file is one GET on object stores; open() would first ask for the size (HEAD).
        try:
            return self._io("read", path, self.fs.cat_file, self.fs_path(path))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def read_text(self, path: str) -> str | None:
        data = self.read_bytes(path)
        return None if data is None else data.decode("utf-8")

    def exists(self, path: str) -> bool:
        return self._io("exists", path, self.fs.exists, self.fs_path(path))

    def list_dir(self, path: str) -> list[FileInfo]:
        """Direct children of `path`; empty when it does not exist."""

        def fresh_listing():
            # Listings must be fresh: another driver may have written since (s3fs caches
            # them), and so must a retried one.
            self.fs.invalidate_cache(self.fs_path(path))
            return self.fs.ls(self.fs_path(path), detail=True)

        try:
            entries = self._io("list", path, fresh_listing)
        except (FileNotFoundError, NotADirectoryError):
            return []
        base = self.fs._strip_protocol(self.fs_path(path)).rstrip("/")
        out = []
        for entry in entries:
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if entry["name"].rstrip("/") == base:
                continue
            mtime = entry.get("mtime") or entry.get("LastModified") or entry.get("created")
            if hasattr(mtime, "timestamp"):
                mtime = mtime.timestamp()
            out.append(
                FileInfo(
                    path=f"{path.rstrip('/')}/{name}",
                    name=name,
                    is_dir=entry.get("type") == "directory",
                    size=int(entry.get("size") or 0),
                    mtime=float(mtime) if mtime is not None else None,
                )
            )
        return sorted(out, key=lambda info: info.name)

    def find_files(self, path: str) -> list[str]:
        """Every file under `path`, at any depth (sorted); empty when it does not exist.
        One fresh recursive listing (on S3 one request per 1,000 objects)."""
        fs_path = self.fs_path(path)

        def fresh_find():
            self.fs.invalidate_cache(fs_path)  # another driver may have written since
            return self.fs.find(fs_path)

        try:
            found = self._io("list", path, fresh_find)
        except (FileNotFoundError, NotADirectoryError):
            return []
        base = self.fs._strip_protocol(fs_path).rstrip("/") + "/"
        root = path.rstrip("/")
        return sorted(f"{root}/{name[len(base) :]}" for name in found if name.startswith(base))

    def read_tail(self, path: str, limit: int | None) -> tuple[bytes | None, bool]:
        """(The last `limit` bytes of `path`, or all of it when `limit` is None; whether that
        is the whole file). (None, True) when the file does not exist; IsADirectoryError when
        a directory is in its place. Object stores read it with one suffix-range GET."""
        local = self.local_path(path)
        if local is not None:
            return _read_local_tail(local, limit)
        fs_path = self.fs_path(path)
        try:
            if limit is None:
                return self._io("read", path, self.fs.cat_file, fs_path), True
            data = self._io("read", path, self.fs.cat_file, fs_path, start=-limit)  # one suffix-range GET
        except (FileNotFoundError, NotADirectoryError):
            return None, True
        except StoreError:
            raise
        except OSError:
            if limit is None:
                raise
            # An empty object has no byte range to serve (S3 answers 416): read it whole.
            return self.read_tail(path, None)
        return data, len(data) < limit

    def child_names(self, path: str) -> frozenset[str] | None:
        """Names of the direct children of `path` when one cheap listing gives them (local
        disk; empty when `path` does not exist), else None: the caller looks child by child."""
        return None

    # -- writes ---------------------------------------------------------------
    def makedirs(self, path: str) -> None:
        self._io("makedirs", path, self.fs.makedirs, self.fs_path(path), exist_ok=True)

    def write_atomic(self, path: str, data: bytes | str) -> None:
        # No makedirs: object stores have no directories (s3fs would create a marker
        # object), and fsspec's memory filesystem creates parents itself. One request: a
        # PUT (S3) or a multipart upload (GCS; a file handle would make a resumable upload
        # session, two requests), which publishes the object whole or not at all, so a
        # retry sends it whole again.
        self._io("write", path, self.fs.pipe_file, self.fs_path(path), _to_bytes(data))

    def append_line(self, path: str, line: bytes | str) -> None:
        """Add `line` and a newline at the end of `path` (created if absent).

        One writer at a time (callers hold the step's lease). Object stores have no
        append, so the file is read and published again whole.
        """
        with self._locked(path):
            previous = self.read_bytes(path) or b""
            if previous and not previous.endswith(b"\n"):
                previous += b"\n"  # a file from elsewhere (Marin's one-word format) without one
            self.write_atomic(path, previous + _to_bytes(line) + b"\n")

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._io("delete", path, self.fs.rm, self.fs_path(path))

    def delete_tree(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._io("delete tree", path, self.fs.rm, self.fs_path(path), recursive=True)

    def delete_between_swaps(self, path: str) -> None:
        """Delete `path`, never in the middle of another process's `compare_and_swap` of it.

        A plain delete can land between a swap's read and its write, and the write then
        makes the file again (on local disk the swap renames its new bytes into place).
        Under the swap's own lock the delete waits for a swap in progress, and a swap that
        starts after it reads nothing and fails. Object stores need no lock: their swap is
        conditional on the version it read, which a delete ends."""
        with self._locked(path):
            self.delete(path)

    def _locked(self, path: str):
        return contextlib.nullcontext()

    def compare_and_swap(self, path: str, expected: bytes | str | None, new: bytes | str | None) -> bool:
        """Set `path` to `new` (None deletes it) only if it now holds `expected` (None: absent)."""
        expected_bytes = None if expected is None else _to_bytes(expected)
        with self._locked(path):
            if self.read_bytes(path) != expected_bytes:
                return False
            if new is None:
                self.delete(path)
            else:
                self.write_atomic(path, new)
            return True

    def check_writable(self, prefix: str) -> None:
        """Raise StoreError naming `prefix` unless a file can be created and removed there."""
        probe = f"{prefix.rstrip('/')}/.write-probe-{_random_hex()}"
        try:
            self.write_atomic(probe, b"probe")
            self.delete(probe)
        except StoreError:
            raise  # already one line naming the bucket and the setting to fix
        except Exception as error:  # any backend error means the same thing to the user
            raise StoreError(
                f"cannot write to the prefix {prefix}: {type(error).__name__}: {error}. "
                "Check that it exists or can be created, that you have write access, and "
                "that any credentials are set"
            ) from error

    def check_readable(self, prefix: str) -> None:
        try:
            self.list_dir(prefix)
        except StoreError:
            raise
        except Exception as error:
            raise StoreError(f"cannot read the prefix {prefix}: {type(error).__name__}: {error}") from error

    def check_reachable(self, prefix: str) -> None:
        """Fail at once, with a StoreError naming the setting, when the storage under `prefix`
        cannot be reached at all or its bucket does not exist (one request on object stores;
        nothing elsewhere). A run calls it before reading any step's status."""

    def local_path(self, path: str) -> str | None:
        """A local filesystem path for `path`, if the store is local disk."""
        return None


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL

LOCAL_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
"""How the executor opens its own files for reading on local disk. O_NOFOLLOW: a symbolic
link in a file's place fails the open (ELOOP) instead of reading wherever it points.
O_NONBLOCK: a FIFO in its place opens and reads at once (empty) instead of waiting for a
writer forever. Flags on the open the reader makes anyway: no extra system call."""

_APPEND_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
"""`append_line`'s open: it never writes through a link (a dangling one would create its
target, outside the prefix), and a FIFO in the file's place opens without blocking."""

_SPECIAL_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _not_regular(path: str, mode: int) -> NotRegularFileError | None:
    """The error for a non-regular, non-directory file of `mode` at `path` (None otherwise)."""
    for test, kind in _SPECIAL_KINDS:
        if test(mode):
            why = (
                f"it is {kind}, not a regular file (the executor never reads or writes its files through one)"
            )
            return NotRegularFileError(path, why)
    return None


def special_file_error(local: str, error: OSError) -> OSError:
    """What an open of `local` that raised `error` should raise: a NotRegularFileError when a
    link, FIFO, device or socket is in the file's place (O_NOFOLLOW's ELOOP, a socket's
    ENXIO), else `error` itself. An lstat on this failure path only."""
    try:
        mode = os.lstat(local).st_mode
    except OSError:
        return error
    return _not_regular(local, mode) or error


def check_regular(fd: int, local: str) -> None:
    """Raise NotRegularFileError unless `fd` (opened from `local`) is a regular file or a
    directory (whose callers have their own answer). One fstat: call it only where a
    regular file would not do without (an empty or very long read, a refused read)."""
    error = _not_regular(local, os.fstat(fd).st_mode)
    if error is not None:
        raise error


def _read_local_tail(local: str, limit: int | None) -> tuple[bytes | None, bool]:
    try:
        fd = os.open(local, LOCAL_READ_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None, True
    except OSError as error:
        raise special_file_error(local, error) from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(local)
        special = _not_regular(local, info.st_mode)
        if special is not None:  # a FIFO has no size to read to, a device no end
            raise special
        start = 0 if limit is None else max(0, info.st_size - limit)
        chunks = []
        while chunk := os.pread(fd, 1 << 20, start):
            chunks.append(chunk)
            start += len(chunk)
        return b"".join(chunks), limit is None or info.st_size <= limit
    finally:
        os.close(fd)


def _open_making_parents(path: str, flags: int) -> int:
    """`os.open(path, flags)`, creating the parent directories on the first miss only."""
    try:
        return os.open(path, flags, 0o666)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, flags, 0o666)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class LocalStore(Store):
    """Local disk through `os` calls: atomic rename for writes, flock for compare-and-swap."""

    def __init__(self):  # no Store.__init__: `fs` is loaded on first use
        self.protocol = "file"
        # Size of each file right after this store's last `append_line` to it: a file that
        # still has that size ends with our newline, so the next append need not read its
        # last byte. Cleared when it holds 4,096 files.
        self._appended_size: dict[str, int] = {}

    @cached_property
    def fs(self) -> fsspec.AbstractFileSystem:
        """fsspec's local filesystem, for callers that stream through fsspec (imported on first use)."""
        import fsspec

        return fsspec.filesystem("file")

    def fs_path(self, path: str) -> str:
        return path[len("file://") :] if path.startswith("file://") else path

    def local_path(self, path: str) -> str:
        return self.fs_path(path)

    def read_bytes(self, path: str) -> bytes | None:
        # Raw os.read skips Python's buffered-IO layers: ~2.5x faster for the small
        # status files a plan reads by the thousand.
        local = self.fs_path(path)
        try:
            fd = os.open(local, LOCAL_READ_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as error:
            raise special_file_error(local, error) from None
        try:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:  # a FIFO with a writer but no data yet
                check_regular(fd, local)
                raise
            if 0 < len(chunk) < 1 << 16:
                return chunk  # a small file (status, lease): one read, no second read to see EOF
            # Empty (a FIFO reads empty at once) or long (a device never ends): only now ask
            # what the file is, so a small regular file costs no fstat.
            check_regular(fd, local)
            if not chunk:
                return chunk
            chunks = [chunk]
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        except IsADirectoryError:
            return None
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        return os.path.exists(self.fs_path(path))

    def list_dir(self, path: str) -> list[FileInfo]:
        base = path.rstrip("/")
        out = []
        try:
            with os.scandir(self.fs_path(path)) as entries:
                for entry in entries:
                    try:
                        info = entry.stat()  # follows symbolic links, as fsspec's listing does
                    except OSError:
                        info = entry.stat(follow_symlinks=False)  # a dangling link
                    out.append(
                        FileInfo(
                            path=f"{base}/{entry.name}",
                            name=entry.name,
                            is_dir=stat.S_ISDIR(info.st_mode),
                            size=info.st_size,
                            mtime=info.st_mtime,
                        )
                    )
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(out, key=lambda info: info.name)

    def find_files(self, path: str) -> list[str]:
        root = path.rstrip("/")
        top = self.fs_path(root)
        out = []
        # os.walk never descends into a linked directory (followlinks=False): what it lists
        # is inside `path`. A link to a file is listed as the link itself.
        for directory, _subdirectories, names in os.walk(top):
            relative = directory[len(top) :]
            out.extend(f"{root}{relative}/{name}" for name in names)
        return sorted(out)

    def child_names(self, path: str) -> frozenset[str] | None:
        try:
            return frozenset(os.listdir(self.fs_path(path)))
        except FileNotFoundError:
            return frozenset()
        except OSError:  # unreadable, or a file in the way: let the caller read each child (and report it)
            return None

    def makedirs(self, path: str) -> None:
        os.makedirs(self.fs_path(path), exist_ok=True)

    def write_atomic(self, path: str, data: bytes | str) -> None:
        target = self.fs_path(path)
        directory, name = os.path.split(target)
        temp = os.path.join(directory, _temp_name(name))
        try:
            fd = _open_making_parents(temp, _CREATE)
        except FileExistsError:  # left by a killed process that had our pid and salt: draw anew
            temp = os.path.join(directory, f".tmp-{_random_hex()}-{name}")
            fd = _open_making_parents(temp, _CREATE)
        try:
            try:
                _write_all(fd, _to_bytes(data))
            finally:
                os.close(fd)
            try:
                os.replace(temp, target)
            except IsADirectoryError:  # (a tree someone else wrote: nothing here removes a directory)
                raise StoreError(
                    f"cannot write {path}: a directory is in its place; delete or move it, then run again"
                ) from None
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise

    def append_line(self, path: str, line: bytes | str) -> None:
        # One write() to an O_APPEND file: the line lands whole after the current end. A
        # short write (disk full) is cut off again, so no half line is left behind.
        data = _to_bytes(line) + b"\n"
        target = self.fs_path(path)
        try:
            fd = _open_making_parents(target, _APPEND_FLAGS)
        except OSError as error:
            raise special_file_error(target, error) from None
        try:
            info = os.fstat(fd)
            special = _not_regular(target, info.st_mode)
            if special is not None:  # a FIFO opened for writing: never write into it
                raise special
            size = info.st_size
            ours = self._appended_size.pop(target, None) == size  # still ends with our line
            if size and not ours and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data  # a file from elsewhere (Marin's one-word format) without one
            try:
                written = os.write(fd, data)
            except OSError:
                os.ftruncate(fd, size)
                raise
            if written != len(data):
                os.ftruncate(fd, size)
                raise OSError(f"short write appending to {path}: {written} of {len(data)} bytes")
            if len(self._appended_size) >= 4096:
                self._appended_size.clear()  # bounded: a forgotten entry only costs one pread
            self._appended_size[target] = size + written
        finally:
            os.close(fd)

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.fs_path(path))

    def delete_tree(self, path: str) -> None:
        target = self.fs_path(path)
        with contextlib.suppress(FileNotFoundError):
            if os.path.isdir(target) and not os.path.islink(target):
                import shutil  # here: it pulls in the compression modules

                shutil.rmtree(target)
            else:
                os.unlink(target)

    def compare_and_swap(self, path: str, expected: bytes | str | None, new: bytes | str | None) -> bool:
        if expected is not None or new is None:
            return super().compare_and_swap(path, expected, new)
        # Create if absent: O_EXCL says whether it was, and under the directory lock no
        # other swapper can read the file between its creation and its one write.
        target = self.fs_path(path)
        # (Made first, not after a failed open: a lease is created in a new step's directory.)
        with self._locked(path, make_directory=True):
            try:
                fd = os.open(target, _CREATE, 0o666)
            except FileExistsError:
                return False
            try:
                try:
                    _write_all(fd, _to_bytes(new))
                finally:
                    os.close(fd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(target)
                raise
            return True

    @contextlib.contextmanager
    def _locked(self, path: str, make_directory: bool = False):
        """`make_directory`: the directory most likely does not exist yet; make it before
        the first open rather than after it fails (one system call fewer)."""
        # flock on the directory: one lock per output directory, no extra files, and
        # released by the kernel if the process dies while holding it.
        directory = os.path.dirname(self.fs_path(path))
        try:
            if make_directory:
                _make_directory(directory)
            fd = os.open(directory, os.O_RDONLY)
        except FileNotFoundError:  # a new step's directory: its parent usually exists
            _make_directory(directory)
            fd = os.open(directory, os.O_RDONLY)
        try:
            import fcntl  # (only where a step's lock is taken: not on a cached re-run)

            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _make_directory(directory: str) -> None:
    """A step's output directory (its parent usually exists), if it is not there yet."""
    try:
        os.mkdir(directory)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(directory, exist_ok=True)


class MemoryStore(Store):
    """fsspec's in-process `memory://` filesystem (tests, scratch runs)."""

    _lock = RLock()

    def __init__(self):
        import fsspec

        super().__init__(fsspec.filesystem("memory"), "memory")

    def _locked(self, path: str):
        return self._lock

    def write_atomic(self, path: str, data: bytes | str) -> None:
        # The memory filesystem publishes the buffer on close; serialise with CAS.
        with self._lock:
            super().write_atomic(path, data)

    def read_bytes(self, path: str) -> bytes | None:
        with self._lock:
            return super().read_bytes(path)


class _PreconditionFailed(Exception):
    """A conditional write or delete was refused: the object changed since it was read."""


class ConditionalStore(Store):
    """An object store whose writes can be made conditional on the version last read.

    `compare_and_swap` reads the bytes and their version in one GET, compares the bytes,
    then writes (or deletes) only if the object still has that version; the server
    decides, so two swappers that read the same version cannot both win. Subclasses say
    how to read a version and how to make a write conditional on it.

    A conditional write whose answer is lost and which the client library retries meets
    its own write (HTTP 412): `compare_and_swap` then reads the object again, and if it
    holds exactly the bytes written (a lease names its worker, so no other driver writes
    them) the swap counts as done.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, protocol: str):
        super().__init__(fs, protocol)
        self._buckets_found: set[str] = set()
        """Buckets this store has seen exist: a run asks at its start, then before it writes."""

    def _read_versioned(self, path: str) -> tuple[bytes | None, str | None]:
        """The object's bytes and version from one read; (None, None) when it is absent."""
        raise NotImplementedError

    def _put_if(self, path: str, data: bytes, version: str | None) -> None:
        """Write `data` only if the object has `version` (None: only if absent), else
        raise _PreconditionFailed."""
        raise NotImplementedError

    def _delete_if(self, path: str, version: str) -> None:
        """Delete only if the object has `version`, else raise _PreconditionFailed."""
        raise NotImplementedError

    def _bucket_exists(self, bucket: str) -> bool:
        """Whether `bucket` exists (one request); permanent errors raise like any call."""
        raise NotImplementedError

    def _check_bucket(self, prefix: str) -> None:
        # A listing of a missing bucket reads as empty, and some servers (SeaweedFS) create a
        # bucket on the first write into it: ask for the bucket itself (one request). A set
        # endpoint that refuses connections fails first, in about a second (`refused_endpoint`);
        # one that takes no connection otherwise fails here after the client's own tries alone
        # (botocore's 5, ~9 s; gcsfs's 6, ~30 s), not again under our policy: it is a wrong
        # setting far more often than an outage.
        from executor import retry

        bucket = retry.bucket_of(prefix)
        if bucket in self._buckets_found:
            return  # once per store
        refused = retry.refused_endpoint(self.protocol)  # (in about a second, not the client's ~30 s)
        if refused is not None:
            raise StoreError(retry.unreachable_message(self.protocol, prefix, refused))
        if not self._io("bucket check", prefix, self._bucket_exists, bucket, retry_unreachable=False):
            raise StoreError(retry.permanent_message("bucket", self.protocol, prefix, None))
        self._buckets_found.add(bucket)

    def check_reachable(self, prefix: str) -> None:
        self._check_bucket(prefix)

    def check_readable(self, prefix: str) -> None:
        self._check_bucket(prefix)
        super().check_readable(prefix)

    def check_writable(self, prefix: str) -> None:
        self._check_bucket(prefix)
        super().check_writable(prefix)

    def compare_and_swap(self, path: str, expected: bytes | str | None, new: bytes | str | None) -> bool:
        # Each request is retried alone. A retried conditional write whose first try
        # reached the server (its answer lost to a timeout under load) meets its own write:
        # the object then holds exactly our bytes -- a lease names its worker, so no other
        # driver writes them -- and the swap happened.
        current, version = self._io("versioned read", path, self._read_versioned, path)
        if current != (None if expected is None else _to_bytes(expected)):
            return False
        try:
            if new is not None:
                self._io("conditional write", path, self._put_if, path, _to_bytes(new), version)
            elif version is not None:
                self._io("conditional delete", path, self._delete_if, path, version)
        except _PreconditionFailed:
            if new is None:
                return False
            self.fs.invalidate_cache(self.fs._parent(path))
            now, _ = self._io("versioned read", path, self._read_versioned, path)
            return now == _to_bytes(new)
        finally:
            self.fs.invalidate_cache(self.fs._parent(path))
        return True


class GCSStore(ConditionalStore):
    """`gs://` through gcsfs: versions are GCS generations, conditions `ifGenerationMatch`.

    Every GCS object has a generation that changes on each write. One GET returns the
    bytes and their generation (`X-Goog-Generation`); the write that follows carries
    `ifGenerationMatch`: 0 to create only if absent, the generation read to replace or
    delete only what was read. The server refuses a write whose precondition no longer
    holds with HTTP 412 (which gcsfs raises as FileExistsError). fake-gcs-server (1.54)
    ignores preconditions on DELETE, so against the emulator a release that races a
    takeover is still read-compare-delete; real GCS honours them.
    """

    def _bucket_exists(self, bucket: str) -> bool:
        try:
            self.fs.call("GET", "b/{}", bucket, json_out=True)
        except FileNotFoundError:
            return False
        return True

    def _read_versioned(self, path: str) -> tuple[bytes | None, str | None]:
        try:
            headers, data = self.fs.call("GET", self.fs.url(path))
        except FileNotFoundError:
            return None, None
        generation = headers.get("X-Goog-Generation")
        if generation is None:
            raise StoreError(f"GCS gave no generation for {path}: cannot swap it safely")
        return data, generation

    def _put_if(self, path: str, data: bytes, version: str | None) -> None:
        # One multipart upload (metadata, then data), as gcsfs makes for small files.
        import json
        from urllib.parse import quote

        bucket, key, _ = self.fs.split_path(path)
        boundary = _random_hex()
        body = b"".join(
            (
                f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
                json.dumps({"name": key}).encode(),
                f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
                data,
                f"\r\n--{boundary}--".encode(),
            )
        )
        try:
            self.fs.call(
                "POST",
                f"{self.fs._location}/upload/storage/v1/b/{quote(bucket, safe='')}/o",
                uploadType="multipart",
                ifGenerationMatch=version or "0",
                headers={"Content-Type": f'multipart/related; boundary="{boundary}"'},
                data=body,
                json_out=True,
            )
        except FileExistsError as error:  # gcsfs's name for 412
            raise _PreconditionFailed(path) from error

    def _delete_if(self, path: str, version: str) -> None:
        bucket, key, _ = self.fs.split_path(path)
        try:
            self.fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=version)
        except (FileExistsError, FileNotFoundError) as error:  # 412, or deleted since the read
            raise _PreconditionFailed(path) from error


_S3_CHANGED = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
"""S3 error codes and statuses that mean: the object changed since it was read."""


class S3Store(ConditionalStore):
    """`s3://` through s3fs: versions are ETags, conditions `If-None-Match: *` / `If-Match`.

    S3 refuses a conditional PutObject or DeleteObject whose condition no longer holds
    with 412 (409 when another conditional write to the key is in flight). AWS S3 and
    SeaweedFS (4.48) honour both headers on PutObject, and SeaweedFS on DeleteObject too.
    A server that ignores them makes compare-and-swap a read-compare-write again:
    `check_writable` (run before a run writes anything) tries one and logs a warning.
    """

    def _bucket_key(self, path: str) -> tuple[str, str]:
        bucket, key, _ = self.fs.split_path(path)
        return bucket, key

    def _bucket_exists(self, bucket: str) -> bool:
        try:
            self.fs.call_s3("head_bucket", Bucket=bucket)
        except FileNotFoundError:
            return False
        except OSError as error:
            from executor import retry

            status, code = retry.status_and_code(error.__cause__ or error)
            if status == 404 or code in ("404", "NoSuchBucket"):
                return False
            raise
        return True

    def _read_versioned(self, path: str) -> tuple[bytes | None, str | None]:
        bucket, key = self._bucket_key(path)

        async def get():
            answer = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
            try:
                return await answer["Body"].read(), answer["ETag"]
            finally:
                answer["Body"].close()

        from fsspec.asyn import sync

        try:
            return sync(self.fs.loop, get)
        except FileNotFoundError:
            return None, None

    @staticmethod
    def _changed(error: BaseException, also: frozenset[str] = frozenset()) -> bool:
        """Whether s3fs's `error` says the object changed since it was read."""
        answer = getattr(error.__cause__, "response", None) or {}
        code = answer.get("Error", {}).get("Code")
        status = str(answer.get("ResponseMetadata", {}).get("HTTPStatusCode"))
        return bool({code, status} & (_S3_CHANGED | also))

    def _put_if(self, path: str, data: bytes, version: str | None) -> None:
        bucket, key = self._bucket_key(path)
        condition = {"IfMatch": version} if version is not None else {"IfNoneMatch": "*"}
        try:
            self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)
        except OSError as error:
            if self._changed(error):
                raise _PreconditionFailed(path) from error
            raise

    def _delete_if(self, path: str, version: str) -> None:
        bucket, key = self._bucket_key(path)
        try:
            self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=version)
        except OSError as error:
            if self._changed(error, also=frozenset({"NoSuchKey"})):  # or deleted since the read
                raise _PreconditionFailed(path) from error
            raise

    def check_writable(self, prefix: str) -> None:
        super().check_writable(prefix)
        probe = f"{prefix.rstrip('/')}/.conditional-probe-{_random_hex()}"
        try:
            try:
                self._put_if(probe, b"probe", None)
                self._put_if(probe, b"again", None)
            except _PreconditionFailed:
                return
            except Exception as error:  # the server rejects the header itself
                raise StoreError(
                    f"the S3 server behind {prefix} refused a conditional write (If-None-Match: *): "
                    f"{type(error).__name__}: {error}. Step leases need it; use a server that "
                    "supports conditional writes (AWS S3, SeaweedFS >= 4.48)"
                ) from error
            logger.warning(
                "the S3 server behind %s ignores If-None-Match: compare-and-swap (and so the "
                "step leases) falls back to read-compare-write, and two drivers racing for one "
                "step may both run it",
                prefix,
            )
        finally:
            self.delete(probe)


def is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def open_store(prefix: str) -> Store:
    """The store for `prefix`: local disk, `memory://`, or any fsspec protocol."""
    if is_local(prefix):
        return LocalStore()
    protocol = prefix.split("://", 1)[0]
    if protocol == "memory":
        return MemoryStore()
    import fsspec

    options = {}
    if protocol in ("gs", "gcs") and os.environ.get("STORAGE_EMULATOR_HOST"):
        # An emulator takes no credentials (as Google's own clients assume): without this
        # gcsfs would try the machine's real ones (and the metadata server) first.
        options["token"] = "anon"
    try:
        fs, _ = fsspec.core.url_to_fs(prefix, **options)
    except (ImportError, ValueError) as error:
        raise StoreError(
            f"no filesystem for {prefix!r}: {error}. Install the fsspec backend for {protocol}:// "
            "(s3fs for s3://, gcsfs for gs://)"
        ) from error
    if protocol in _OBJECT_STORES:
        from executor import retry

        retry.observe_client_retries(fs)  # the client's own retries show in the log too
    if protocol in ("gs", "gcs"):
        return GCSStore(fs, protocol)
    if protocol in ("s3", "s3a"):
        return S3Store(fs, protocol)
    return Store(fs, protocol)


def is_within(path: str, directory: str) -> bool:
    """Whether the local `path` is `directory` or below it (both as given: resolve links first)."""
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def normalize_prefix(prefix: str) -> str:
    """Make a local prefix absolute once, so status and outputs can never diverge.

    A URL must name a location after its scheme: `s3://` alone became `s3:` and so a local
    directory of that name, and `s3:///x` names no bucket."""
    if is_local(prefix):
        local = prefix[len("file://") :] if prefix.startswith("file://") else prefix
        return os.path.abspath(os.path.expanduser(local)).rstrip("/") or "/"
    scheme, _, rest = prefix.partition("://")
    if scheme != "memory" and (not rest.strip("/") or rest.startswith("/")):
        raise StoreError(
            f"prefix {prefix!r} names no bucket or location after {scheme}://; give one, e.g. {scheme}://bucket/path"
        )
    return prefix.rstrip("/")
