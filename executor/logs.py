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
file and uploaded when the step ends, appended to any earlier run's log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import IO

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
        if sink is not None:
            with contextlib.suppress(ValueError):
                sink.write(text)
        return self._original.write(text)

    def flush(self) -> None:
        sink = _sinks.get(threading.get_ident())
        if sink is not None:
            with contextlib.suppress(ValueError):
                sink.flush()
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
    stream.write(text)
    stream.flush()


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
    _install()
    _sinks[ident] = sink
    try:
        yield target
    finally:
        _sinks.pop(ident, None)
        _uninstall()
        if sink.handle is not None:
            sink.handle.close()
            if local is None:
                _upload(store, target, sink.handle.name)


def _open_local(path: str) -> IO[str]:
    try:
        return open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed by capture_step_log)
    except FileNotFoundError:  # the step removed its own directory
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115


def _open_temp() -> IO[str]:
    import tempfile  # object stores only

    return tempfile.NamedTemporaryFile("w+", encoding="utf-8", suffix=".log", delete=False)  # noqa: SIM115


def _upload(store: Store, target: str, temp_name: str) -> None:
    """Publish the buffered log after any earlier run's log (object stores cannot append)."""
    try:
        with open(temp_name, "rb") as data:
            store.write_atomic(target, (store.read_bytes(target) or b"") + data.read())
    finally:
        os.unlink(temp_name)
