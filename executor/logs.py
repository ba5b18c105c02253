"""Per-step log files: a step's stdout, stderr and logging records, next to its outputs.

Steps run in driver threads, so redirecting `sys.stdout` for one step would capture
its neighbours too. Instead, while steps run (a runner holds this for its whole run:
`streams_wrapped`), `sys.stdout`/`sys.stderr` are
wrapped in a tee that still writes to the console and also writes to the log file of
the step *running on the current thread*; a logging handler routes records the same
way. Output from threads a step starts itself, and from subprocesses writing straight
to file descriptor 1, goes to the console only.

The log file is created at the step's first output: a step that prints nothing
leaves no log file (and costs no file creation). On local disk the log is written in
place (so it can be tailed live); on object stores it is buffered in a local temporary
file and uploaded every `$MARIN_LOG_UPLOAD_INTERVAL` seconds (15) while the step runs and
once more when it ends, after any earlier run's log.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import sys
import threading
from collections.abc import Iterator
from typing import IO

from executor.console import write_or_drop
from executor.store import Store
from executor.tree import log_path

_sinks: dict[int, _LazyLog] = {}
_lock = threading.Lock()
_installed = 0
_originals: tuple = ()
_handler: logging.Handler | None = None


class _TeeStream:
    """Writes to the original stream and to the current thread's step log."""

    def __init__(self, original):
        self._original = original

    def write(self, text: str) -> int:
        sink = _sinks.get(threading.get_ident())
        if sink is None:
            # Not a step's output: as written (None: started without a stdout/stderr, `>&-`).
            return len(text) if self._original is None else self._original.write(text)
        with contextlib.suppress(ValueError):
            sink.write(text)
        # A step's output is in its log: a console that went away (`| head`) or was never
        # there must not fail it.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self._original.write(text)
        return len(text)

    def flush(self) -> None:
        sink = _sinks.get(threading.get_ident())
        if sink is None:
            if self._original is not None:
                self._original.flush()
            return
        with contextlib.suppress(ValueError):
            sink.flush()
        with contextlib.suppress(OSError, ValueError, AttributeError):  # AttributeError: no stream
            self._original.flush()

    def __getattr__(self, name):
        return getattr(self._original, name)


class _ThreadRoutingHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        sink = _sinks.get(record.thread)
        if sink is None:
            return
        try:
            with contextlib.suppress(ValueError):
                sink.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


def _install() -> None:
    global _installed, _originals, _handler
    with _lock:
        _installed += 1
        if _installed > 1:
            return
        _originals = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = _TeeStream(sys.stdout), _TeeStream(sys.stderr)
        _handler = _ThreadRoutingHandler()
        _handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(_handler)


def _uninstall() -> None:
    global _installed, _handler
    with _lock:
        _installed -= 1
        if _installed > 0:
            return
        # Only undo our own wrapping: someone (pytest) may have replaced the streams since.
        if isinstance(sys.stdout, _TeeStream):
            sys.stdout = _originals[0]
        if isinstance(sys.stderr, _TeeStream):
            sys.stderr = _originals[1]
        if _handler is not None:
            logging.getLogger().removeHandler(_handler)
            _handler = None


class _LazyLog:
    """A text sink that opens its file at the first write (line-buffered, so tails are live)."""

    def __init__(self, opener):
        self._opener = opener
        self.handle: IO[str] | None = None

    def write(self, text: str) -> None:
        if self.handle is None:
            if not text:
                return
            self.handle = self._opener()
        self.handle.write(text)

    def flush(self) -> None:
        if self.handle is not None:
            self.handle.flush()


def console_write(text: str) -> None:
    """Write to the console only: the stdout the tee wraps (never into a step's log)."""
    stream = _originals[0] if _installed and _originals else sys.stdout
    if isinstance(stream, _TeeStream):  # (someone wrapped our tee: use what it wraps)
        stream = stream._original
    write_or_drop(stream, text)  # a console that went away stops no step


@contextlib.contextmanager
def streams_wrapped() -> Iterator[None]:
    """Keep the tee and the logging handler installed for a whole run.

    `capture_step_log` installs them itself when nothing holds them; a runner holds them
    across its steps so that a step does not swap `sys.stdout`, `sys.stderr` and the root
    logger's handlers twice (a tenth of a trivial step's cost in a long chain).
    """
    _install()
    try:
        yield
    finally:
        _uninstall()


@contextlib.contextmanager
def capture_step_log(store: Store, output_path: str) -> Iterator[str]:
    """Send this thread's output to the step's log file; yields the log's path."""
    target = log_path(output_path)
    local = store.local_path(target)
    if local is not None:
        sink = _LazyLog(lambda: _open_local(local))
    else:
        sink = _LazyLog(_open_temp)
    ident = threading.get_ident()
    uploader = None if local is not None else _PeriodicUpload(store, target, sink)
    _install()
    _sinks[ident] = sink
    try:
        yield target
    finally:
        _sinks.pop(ident, None)
        _uninstall()
        if uploader is not None:
            uploader.stop()
        if sink.handle is not None:
            sink.handle.close()
            if uploader is not None:
                try:
                    uploader.upload()
                finally:
                    os.unlink(sink.handle.name)


LOG_UPLOAD_INTERVAL_ENV = "MARIN_LOG_UPLOAD_INTERVAL"
"""Seconds between uploads of a running step's log on an object store (default 15)."""


class _PeriodicUpload:
    """Publishes a running step's buffered log to the object store every few seconds, so
    `marin show` and the browser show the tail of a step still running; the last upload,
    when the step ends, has everything. Each upload writes the log as it was before this
    step started (read once) followed by everything the step wrote so far."""

    def __init__(self, store: Store, target: str, sink: _LazyLog):
        self.store, self.target, self.sink = store, target, sink
        self._earlier: bytes | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        interval = float(os.environ.get(LOG_UPLOAD_INTERVAL_ENV, "") or 15)
        self._thread = threading.Thread(target=self._loop, args=(interval,), name="log-upload", daemon=True)
        self._thread.start()

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.upload()
            except Exception as error:  # storage hiccup: the next upload (or the last) has it all
                sys.__stderr__.write(f"uploading the log {self.target} failed: {error}\n")

    def upload(self) -> None:
        with self._lock:
            handle = self.sink.handle
            if handle is None:
                return
            with open(handle.name, "rb") as data:  # (line-buffered: whole lines are there)
                written = data.read()
            if self._earlier is None:
                self._earlier = self.store.read_bytes(self.target) or b""
            self.store.write_atomic(self.target, self._earlier + written)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _open_local(path: str) -> IO[str]:
    """The step's log for appending; never through a link nor onto a FIFO or socket.

    Whatever stands in the log's place that is not a regular file (a link, perhaps leading
    out of the prefix; a FIFO) is removed and the log started afresh: the step holds its
    lease, and the log is its own.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    for _ in range(3):
        try:
            fd = os.open(path, flags, 0o666)
        except FileNotFoundError:  # the step removed its own directory
            os.makedirs(os.path.dirname(path), exist_ok=True)
            continue
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.ENXIO, errno.EOPNOTSUPP):
                raise
            os.unlink(path)  # a link (ELOOP under O_NOFOLLOW), or a FIFO or socket with no reader
            continue
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO that has a reader
            os.close(fd)
            os.unlink(path)
            continue
        return os.fdopen(fd, "a", encoding="utf-8", buffering=1)
    raise OSError(f"cannot open the step's log {path}: something keeps taking its place")


def _open_temp() -> IO[str]:
    import tempfile  # object stores only

    return tempfile.NamedTemporaryFile(  # noqa: SIM115
        "w+", encoding="utf-8", suffix=".log", delete=False, buffering=1
    )
