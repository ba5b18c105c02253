"""Per-step log capture (`executor.logs`): what reaches the log file, the console, and when.

Each test pins one behaviour a mutation of `executor/logs.py` broke without any other
test noticing (see docs/testing.md): where output goes, the log line format, the
wrapping of `sys.stdout` being undone exactly once, logs on object stores appended to
the earlier run's log, and the temporary buffer being removed.
"""

from __future__ import annotations

import io
import locale
import logging
import os
import sys
import threading
import time
import uuid

import pytest

from executor import logs
from executor.store import LocalStore, MemoryStore
from executor.tree import LOG_FILE


class Recording(io.StringIO):
    """A console stand-in that counts flushes and has an attribute of its own."""

    marker = "the original stream"

    def __init__(self):
        super().__init__()
        self.flushes = 0

    def flush(self):
        self.flushes += 1
        super().flush()


@pytest.fixture
def console(monkeypatch):
    """Replace sys.stdout / sys.stderr by recordings for the test (restored afterwards).

    A factory called in the test body: pytest's output capture re-installs its own streams
    between fixture set-up and the test call.
    """

    def install():
        out, err = Recording(), Recording()
        monkeypatch.setattr(sys, "stdout", out)
        monkeypatch.setattr(sys, "stderr", err)
        return out, err

    return install


def memory_prefix() -> str:
    return f"memory://logs-{uuid.uuid4().hex}"


def test_printed_text_goes_to_the_console_and_to_the_step_log(tmp_path, console):
    out, err = console()
    output = str(tmp_path / "step")
    with logs.capture_step_log(LocalStore(), output) as path:
        assert path == f"{output}/{LOG_FILE}"
        print("to stdout")
        print("to stderr", file=sys.stderr)
    assert out.getvalue() == "to stdout\n"
    assert err.getvalue() == "to stderr\n"
    with open(path, encoding="utf-8") as log:
        assert log.read() == "to stdout\nto stderr\n"


def test_write_returns_what_the_console_stream_returned(tmp_path, console):
    console()
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")):
        assert sys.stdout.write("abc") == 3


@pytest.mark.parametrize("directory_exists", [True, False])
def test_the_log_is_line_buffered_so_it_can_be_tailed_while_the_step_runs(
    tmp_path, console, directory_exists
):
    console()
    if directory_exists:
        (tmp_path / "step").mkdir()
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")) as path:
        sys.stdout.write("first line\n")
        with open(path, encoding="utf-8") as log:  # still inside the step
            assert log.read() == "first line\n"


def test_a_local_log_is_appended_to_the_earlier_runs_log(tmp_path, console):
    console()
    output = str(tmp_path / "step")
    with logs.capture_step_log(LocalStore(), output) as path:
        print("run 1")
    with logs.capture_step_log(LocalStore(), output):
        print("run 2")
    with open(path, encoding="utf-8") as log:
        assert log.read() == "run 1\nrun 2\n"


def test_a_step_that_prints_nothing_leaves_no_log_file(tmp_path, console):
    console()
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")) as path:
        sys.stdout.write("")  # an empty write opens nothing either
        sys.stdout.flush()
    assert not os.path.exists(path)
    assert not os.path.exists(tmp_path / "step")


def test_a_step_that_removed_its_own_directory_still_gets_its_log(tmp_path, console):
    console()
    output = tmp_path / "step"  # does not exist when the first line is printed
    with logs.capture_step_log(LocalStore(), str(output)) as path:
        print("after rmtree")
    with open(path, encoding="utf-8") as log:
        assert log.read() == "after rmtree\n"


def test_flush_reaches_the_console_and_the_log(tmp_path, console, monkeypatch):
    out, _ = console()
    flushed = []
    real_open = logs._open_local

    def open_recording(path):
        handle = real_open(path)
        original_flush = handle.flush

        def flush():
            flushed.append(path)
            original_flush()

        handle.flush = flush
        return handle

    monkeypatch.setattr(logs, "_open_local", open_recording)
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")) as path:
        sys.stdout.write("x")
        before = out.flushes
        sys.stdout.flush()
        assert out.flushes == before + 1
        assert flushed == [path]


def test_other_attributes_come_from_the_console_stream(tmp_path, console):
    console()
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")):
        assert sys.stdout.marker == "the original stream"
        assert sys.stdout.getvalue() == ""


def test_writes_after_the_log_was_closed_still_reach_the_console(tmp_path, console):
    """A closed log file raises ValueError; the step's output must not fail because of it."""
    out, _ = console()
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")) as path:
        print("one")
        logs._sinks[threading.get_ident()].handle.close()
        print("two")
        sys.stdout.flush()
    assert out.getvalue() == "one\ntwo\n"
    with open(path, encoding="utf-8") as log:
        assert log.read() == "one\n"


def test_output_of_another_thread_goes_to_the_console_only(tmp_path, console):
    out, _ = console()
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")) as path:
        print("mine")
        thread = threading.Thread(target=lambda: print("theirs"))
        thread.start()
        thread.join()
    assert "theirs\n" in out.getvalue()
    with open(path, encoding="utf-8") as log:
        assert log.read() == "mine\n"


def test_two_steps_on_two_threads_each_get_their_own_log(tmp_path, console):
    console()
    barrier = threading.Barrier(2, timeout=5)
    paths = {}

    def step(name):
        with logs.capture_step_log(LocalStore(), str(tmp_path / name)) as path:
            paths[name] = path
            barrier.wait()  # both are capturing now
            print(f"from {name}")
            barrier.wait()

    threads = [threading.Thread(target=step, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in ("a", "b"):
        with open(paths[name], encoding="utf-8") as log:
            assert log.read() == f"from {name}\n"


def test_logging_records_of_the_step_thread_are_formatted_into_the_log(tmp_path, console):
    console()
    logger = logging.getLogger("mutants.logs.step")
    logger.setLevel(logging.INFO)
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")) as path:
        logger.warning("careful %s", "now")
        thread = threading.Thread(target=lambda: logger.warning("not this one"))
        thread.start()
        thread.join()
    with open(path, encoding="utf-8") as log:
        text = log.read()
    assert text.endswith(" WARNING mutants.logs.step: careful now\n")
    assert text.count("\n") == 1
    date, clock = text.split(" ")[:2]
    assert len(date) == 10 and date[4] == "-" and clock[2] == ":"  # %(asctime)s first


def test_a_logging_record_for_a_closed_log_is_dropped_quietly(tmp_path, console, monkeypatch):
    console()
    errors = []
    monkeypatch.setattr(logs._ThreadRoutingHandler, "handleError", lambda self, record: errors.append(record))
    logger = logging.getLogger("mutants.logs.closed")
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")):
        print("opened")
        logs._sinks[threading.get_ident()].handle.close()
        logger.warning("after close")
    assert errors == []


def test_a_failing_sink_is_reported_through_handle_error(monkeypatch):
    """Anything but a closed file (ValueError) goes to logging's handleError, not the caller."""

    class Broken:
        def write(self, text):
            raise OSError("disk full")

    errors = []
    handler = logs._ThreadRoutingHandler()
    monkeypatch.setattr(handler, "handleError", errors.append)
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "msg", None, None)
    monkeypatch.setitem(logs._sinks, record.thread, Broken())
    handler.emit(record)
    assert errors == [record]


def test_the_console_streams_and_root_handlers_are_restored_after_the_step(tmp_path, console):
    out, err = console()
    handlers = list(logging.getLogger().handlers)
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")):
        assert sys.stdout is not out and sys.stderr is not err
        assert len(logging.getLogger().handlers) == len(handlers) + 1
    assert sys.stdout is out and sys.stderr is err
    assert logging.getLogger().handlers == handlers


def test_nested_captures_unwrap_only_when_the_last_one_ends(tmp_path, console):
    out, err = console()
    handlers = list(logging.getLogger().handlers)
    started, release = threading.Event(), threading.Event()

    def other_step():
        with logs.capture_step_log(LocalStore(), str(tmp_path / "other")):
            started.set()
            release.wait(5)

    thread = threading.Thread(target=other_step)
    thread.start()
    started.wait(5)
    wrapped = sys.stdout
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")) as path:
        assert sys.stdout is wrapped  # not wrapped twice
        assert len(logging.getLogger().handlers) == len(handlers) + 1
    # The other step still runs: its wrapping stays.
    assert sys.stdout is wrapped
    assert len(logging.getLogger().handlers) == len(handlers) + 1
    release.set()
    thread.join()
    assert sys.stdout is out and sys.stderr is err
    assert logging.getLogger().handlers == handlers
    assert os.path.exists(os.path.dirname(path)) is False  # nothing printed, no log


def test_streams_replaced_by_someone_else_meanwhile_are_left_alone(tmp_path, console):
    console()
    replacement_out, replacement_err = io.StringIO(), io.StringIO()
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")):
        sys.stdout, sys.stderr = replacement_out, replacement_err
    assert sys.stdout is replacement_out
    assert sys.stderr is replacement_err


def test_only_stdout_replaced_meanwhile_still_restores_stderr(tmp_path, console):
    _, err = console()
    replacement = io.StringIO()
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")):
        sys.stdout = replacement
    assert sys.stdout is replacement
    assert sys.stderr is err


def test_on_an_object_store_the_log_is_uploaded_when_the_step_ends(console, monkeypatch):
    console()
    store = MemoryStore()
    output = memory_prefix() + "/step"
    temp_names = []
    real_open_temp = logs._open_temp

    def open_temp():
        handle = real_open_temp()
        temp_names.append(handle.name)
        return handle

    monkeypatch.setattr(logs, "_open_temp", open_temp)
    with logs.capture_step_log(store, output) as path:
        assert path == f"{output}/{LOG_FILE}"
        print("first run")
        assert store.read_bytes(path) is None  # buffered until the step ends
    assert store.read_bytes(path) == b"first run\n"
    with logs.capture_step_log(store, output):
        print("second run")
    assert store.read_bytes(path) == b"first run\nsecond run\n"
    assert len(temp_names) == 2
    assert not any(os.path.exists(name) for name in temp_names)  # buffers removed


def test_an_object_store_step_that_prints_nothing_uploads_nothing(console):
    console()
    store = MemoryStore()
    with logs.capture_step_log(store, memory_prefix() + "/step") as path:
        pass
    assert store.read_bytes(path) is None


def test_the_temporary_buffer_is_removed_even_when_the_upload_fails(console, monkeypatch):
    console()
    temp_names = []
    opened = logs._open_temp

    def recording():
        handle = opened()
        temp_names.append(handle.name)
        return handle

    monkeypatch.setattr(logs, "_open_temp", recording)

    class FailingStore(MemoryStore):
        def write_atomic(self, path, data):
            raise OSError("upload failed")

    with (
        pytest.raises(OSError, match="upload failed"),
        logs.capture_step_log(FailingStore(), memory_prefix() + "/step"),
    ):
        print("text")
    assert temp_names and not os.path.exists(temp_names[0])


def test_a_running_step_log_on_an_object_store_is_uploaded_while_it_runs(console, monkeypatch):
    """`marin show` and the browser read the tail of a running remote step from the bucket."""
    console()
    monkeypatch.setenv(logs.LOG_UPLOAD_INTERVAL_ENV, "0.05")
    store, step = MemoryStore(), memory_prefix() + "/live"
    store.write_atomic(step + "/.executor_log", b"earlier run\n")
    with logs.capture_step_log(store, step) as path:
        print("first line")
        deadline = time.time() + 10
        while b"first line" not in (store.read_bytes(path) or b"") and time.time() < deadline:
            time.sleep(0.01)
        assert store.read_bytes(path) == b"earlier run\nfirst line\n"  # before the step ended
        print("second line")
    assert store.read_bytes(path) == b"earlier run\nfirst line\nsecond line\n"


def test_a_local_log_is_utf8(tmp_path, console):
    console()
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")) as path:
        print("naïve ✓")
    with open(path, "rb") as log:
        assert log.read() == "naïve ✓\n".encode()


@pytest.fixture
def ascii_locale():
    """The C locale for this test: Python's default file encoding is then ASCII, not UTF-8."""
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, before)


@pytest.mark.parametrize("directory_exists", [True, False])
def test_a_local_log_is_utf8_whatever_the_locale(tmp_path, console, ascii_locale, directory_exists):
    """Opened with the locale's encoding, non-ASCII output would be dropped from the log."""
    out, _ = console()
    if directory_exists:
        (tmp_path / "step").mkdir()
    with logs.capture_step_log(LocalStore(), str(tmp_path / "step")) as path:
        print("naïve ✓")
    assert out.getvalue() == "naïve ✓\n"
    with open(path, "rb") as log:
        assert log.read() == "naïve ✓\n".encode()


def test_an_object_store_log_is_utf8_whatever_the_locale(console, ascii_locale):
    console()
    store = MemoryStore()
    with logs.capture_step_log(store, memory_prefix() + "/step") as path:
        print("naïve ✓")
    assert store.read_bytes(path) == "naïve ✓\n".encode()


def test_streams_wrapped_holds_the_tee_across_steps(tmp_path, console):
    """A runner holds the wrapping for its whole run; steps inside neither re-wrap nor unwrap."""
    out, err = console()
    handlers = list(logging.getLogger().handlers)
    with logs.streams_wrapped():
        wrapped = sys.stdout
        assert wrapped is not out and sys.stderr is not err
        with logs.capture_step_log(LocalStore(), str(tmp_path / "a")) as path:
            assert sys.stdout is wrapped
            print("in a")
        assert sys.stdout is wrapped  # still held after the step
        assert len(logging.getLogger().handlers) == len(handlers) + 1
        print("between steps")
    assert sys.stdout is out and sys.stderr is err
    assert logging.getLogger().handlers == handlers
    with open(path, encoding="utf-8") as log:
        assert log.read() == "in a\n"
    assert out.getvalue() == "in a\nbetween steps\n"


def test_streams_wrapped_unwraps_when_the_run_raises(console):
    out, _ = console()
    with pytest.raises(RuntimeError), logs.streams_wrapped():
        raise RuntimeError("run failed")
    assert sys.stdout is out


def test_a_log_directory_created_by_someone_else_meanwhile_is_used(tmp_path, console, monkeypatch):
    """The step's directory is missing at the first open and appears before it is made (a
    thread of the step creating its outputs): making it must not fail because it exists."""
    console()
    output = tmp_path / "step"
    real_open = os.open
    calls = []

    def racing_open(path, *args, **kwargs):
        if str(path).startswith(str(output)):
            calls.append(path)
            if len(calls) == 1:
                output.mkdir()  # created meanwhile
                raise FileNotFoundError(2, "No such file or directory", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", racing_open)
    with logs.capture_step_log(LocalStore(), str(output)) as path:
        print("made it")
    monkeypatch.undo()
    assert calls == [path, path]
    with open(path, encoding="utf-8") as log:
        assert log.read() == "made it\n"


def test_output_outside_a_step_with_no_console_is_dropped_not_an_error():
    """Started with `>&-`: sys.stdout is None, and the tee stands in for it during a run; a
    write outside a step (the driver's own) must count as written, not raise."""
    from executor.logs import _TeeStream

    tee = _TeeStream(None)
    assert tee.write("the driver prints\n") == len("the driver prints\n")
