"""Per-step log files: a step's stdout, stderr and logging records, next to its outputs.

Steps run in driver threads, so redirecting `sys.stdout` for one step would capture
its neighbours too. Instead, while any step is running, `sys.stdout`/`sys.stderr` are
wrapped in a tee that still writes to the console and also writes to the log file of
the step *running on the current thread*; a logging handler routes records the same
way. Output from threads a step starts itself, and from subprocesses writing straight
to file descriptor 1, goes to the console only.

On local disk the log is written in place (so it can be tailed live); on object
stores it is buffered in a local temporary file and uploaded when the step ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import IO

from executor.store import Store
from executor.tree import log_path

_sinks: dict[int, IO[str]] = {}
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


@contextlib.contextmanager
def capture_step_log(store: Store, output_path: str) -> Iterator[str]:
    """Send this thread's output to the step's log file; yields the log's path."""
    target = log_path(output_path)
    local = store.local_path(target)
    if local is not None:
        os.makedirs(os.path.dirname(local), exist_ok=True)
        handle = open(local, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed below)
        temp_name = None
    else:
        handle = tempfile.NamedTemporaryFile("w+", encoding="utf-8", suffix=".log", delete=False)  # noqa: SIM115
        temp_name = handle.name
        previous = store.read_text(target)
        if previous:
            handle.write(previous)
    ident = threading.get_ident()
    _install()
    _sinks[ident] = handle
    try:
        yield target
    finally:
        _sinks.pop(ident, None)
        _uninstall()
        handle.close()
        if temp_name is not None:
            try:
                with open(temp_name, "rb") as data:
                    store.write_atomic(target, data.read())
            finally:
                os.unlink(temp_name)
