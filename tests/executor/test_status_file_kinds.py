"""A link, FIFO or other special file in place of a step's bookkeeping file, on local disk.

The executor never reads or writes its own files (`.executor_status`, the lease
`.executor_status.lock`, `.executor_info`) through a symbolic link, and never waits on a
FIFO: such a status or lease file is planned as that step's error row, naming the file and
the fix, and every unrelated step plans and runs as usual. A link is never written
through, so nothing appears outside the prefix.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from executor import Executor, ExecutorRunError, ExecutorStep, output_path_of, this_output_path, versioned
from executor.plan import Action
from executor.store import LocalStore, NotRegularFileError
from executor.tree import StatusFileError, read_info, read_last_status, read_status, write_info
from tests.executor.steps_for_tests import WriteConfig, write_value

SUCCESS = b'{"date": "2026-01-01T00:01:00.000Z", "status": "SUCCESS"}\n'


def step(name: str, value: int, inputs=()) -> ExecutorStep:
    config = WriteConfig(
        output_path=this_output_path(), value=versioned(value), inputs=list(inputs), key=name
    )
    return ExecutorStep(name, write_value, config)


def make_special(path: Path, kind: str, outside: Path) -> None:
    """Put a `kind` of special file at `path` (which must not exist)."""
    if kind == "loop":
        os.symlink(path.name, path)
    elif kind == "dangling":
        os.symlink(outside / "gone", path)
    elif kind == "dangling-dir":
        os.symlink(outside / "no-such-dir" / "file", path)
    elif kind == "link-to-success":
        (outside / "status").write_bytes(SUCCESS)
        os.symlink(outside / "status", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":  # sparse: 200 MB that take no disk
        with open(path, "wb") as handle:
            handle.truncate(200 << 20)
    else:
        raise AssertionError(kind)


KINDS = ["loop", "dangling", "dangling-dir", "link-to-success", "fifo"]


@contextlib.contextmanager
def never_waits_on(fifo: Path, seconds: float = 10.0):
    """Fail, instead of hanging, if the block waits on `fifo`: past `seconds` a thread keeps
    opening and closing its write end, which lets a blocked reader go on."""
    finished, rescued = threading.Event(), threading.Event()

    def rescue():
        if finished.wait(seconds):
            return
        rescued.set()
        while not finished.wait(0.2):
            with contextlib.suppress(OSError):  # ENXIO while no reader has it open
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    threading.Thread(target=rescue, daemon=True).start()
    try:
        yield
    finally:
        finished.set()
    assert not rescued.is_set(), f"waited on the FIFO {fifo}"


def watchdog(path: Path, kind: str):
    return never_waits_on(path) if kind == "fifo" else contextlib.nullcontext()


def bad_prefix(tmp_path: Path, file_name: str, kind: str):
    """A prefix where `a` succeeded, then its `file_name` was replaced by a `kind` special file."""
    outside = tmp_path / "outside"
    outside.mkdir()
    prefix = tmp_path / "prefix"
    a, unrelated = step("a", 1), step("unrelated", 2)
    Executor(str(prefix), console=False).run([a])
    a_path = Path(Executor(str(prefix), console=False).run([a], dry_run=True).rows[0].output_path)
    target = a_path / file_name
    target.unlink(missing_ok=True)
    make_special(target, kind, outside)
    return prefix, a, unrelated, target, outside


@pytest.mark.parametrize("kind", KINDS)
def test_a_special_status_file_is_an_error_row_and_the_rest_plans(tmp_path, kind):
    prefix, a, unrelated, target, outside = bad_prefix(tmp_path, ".executor_status", kind)
    b = step("b", 3, inputs=[output_path_of(a)])
    with watchdog(target, kind):
        plan = Executor(str(prefix), console=False).run([b, unrelated], dry_run=True)
    rows = {row.name: row for row in plan.rows}
    assert rows["a"].action == Action.ERROR
    assert rows["a"].reason.startswith(f"cannot read the status file {target}: it is ")
    assert "not a regular file" in rows["a"].reason and "Delete it" in rows["a"].reason
    assert rows["a"].status_error is not None
    assert rows["b"].action == Action.BLOCKED
    assert rows["unrelated"].action == Action.RUN


@pytest.mark.parametrize("kind", KINDS)
def test_a_special_status_file_fails_its_step_alone_and_is_never_written_through(tmp_path, kind):
    prefix, a, unrelated, target, outside = bad_prefix(tmp_path, ".executor_status", kind)
    before = sorted(os.listdir(outside))
    with watchdog(target, kind), pytest.raises(ExecutorRunError) as caught:
        Executor(str(prefix), console=False).run([a, unrelated])
    assert [failure.name for failure in caught.value.failures] == ["a"]
    assert f"cannot read the status file {target}: it is " in str(caught.value)
    assert "Delete it" in str(caught.value)
    assert sorted(os.listdir(outside)) == before  # nothing created or changed out there
    if kind == "link-to-success":
        assert (outside / "status").read_bytes() == SUCCESS
    rows = Executor(str(prefix), console=False).run([unrelated], dry_run=True).rows
    assert [(row.name, row.action) for row in rows] == [("unrelated", Action.SKIP)]


@pytest.mark.parametrize("kind", ["loop", "dangling", "fifo", "directory", "huge"])
def test_a_special_lease_file_is_an_error_row_naming_it(tmp_path, kind):
    prefix, a, unrelated, target, _ = bad_prefix(tmp_path, ".executor_status.lock", kind)
    Path(target.parent, ".executor_status").unlink()  # not succeeded: its lease is read
    with watchdog(target, kind):
        plan = Executor(str(prefix), console=False).run([a, unrelated], dry_run=True)
    rows = {row.name: row for row in plan.rows}
    assert rows["a"].action == Action.ERROR
    assert rows["a"].reason.startswith(f"cannot read the lease file {target}: it is ")
    assert "Delete it" in rows["a"].reason
    assert rows["a"].status_error is not None
    assert rows["unrelated"].action == Action.RUN


@pytest.mark.parametrize("kind", KINDS)
def test_the_status_readers_refuse_a_special_file(tmp_path, kind):
    output = tmp_path / "step"
    output.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    make_special(output / ".executor_status", kind, outside)
    for read in (read_last_status, read_status):
        with watchdog(output / ".executor_status", kind), pytest.raises(StatusFileError) as caught:
            read(LocalStore(), str(output))
        assert "not a regular file" in str(caught.value)


def test_append_never_writes_through_a_dangling_link(tmp_path):
    os.symlink(tmp_path / "elsewhere", tmp_path / "file")
    with pytest.raises(NotRegularFileError, match="symbolic link"):
        LocalStore().append_line(str(tmp_path / "file"), "line")
    assert not os.path.lexists(tmp_path / "elsewhere")


def test_append_never_writes_into_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "file")
    with never_waits_on(tmp_path / "file"), pytest.raises(NotRegularFileError, match="FIFO"):
        LocalStore().append_line(str(tmp_path / "file"), "line")


def test_read_bytes_neither_follows_a_link_nor_waits_on_a_fifo(tmp_path):
    (tmp_path / "real").write_bytes(b"secret")
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    store = LocalStore()
    with pytest.raises(NotRegularFileError, match="symbolic link"):
        store.read_bytes(str(tmp_path / "link"))
    with never_waits_on(tmp_path / "fifo"), pytest.raises(NotRegularFileError, match="FIFO"):
        store.read_bytes(str(tmp_path / "fifo"))
    assert store.read_bytes(str(tmp_path / "real")) == b"secret"  # a regular file still reads


def test_an_info_file_that_is_a_link_reads_as_missing_and_is_replaced_not_written_through(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"name": "not this step"}')
    output = tmp_path / "step"
    output.mkdir()
    os.symlink(elsewhere, output / ".executor_info")
    assert read_info(LocalStore(), str(output)) is None
    write_info(LocalStore(), {"output_path": str(output), "name": "step"})  # a rename: replaces the link
    assert not os.path.islink(output / ".executor_info")
    assert read_info(LocalStore(), str(output)) == {"output_path": str(output), "name": "step"}
    assert elsewhere.read_text() == '{"name": "not this step"}'


@pytest.mark.parametrize("kind", ["link-out", "dangling-link", "fifo"])
def test_a_link_or_fifo_in_the_log_s_place_is_replaced_by_the_log(tmp_path, kind):
    """The step's output was written through a link to outside the prefix, or lost in a FIFO."""
    from executor.logs import capture_step_log

    output = tmp_path / "prefix" / "step"
    output.mkdir(parents=True)
    log = output / ".executor_log"
    outside = tmp_path / "outside.txt"
    if kind == "link-out":
        outside.write_text("precious\n")
        os.symlink(outside, log)
    elif kind == "dangling-link":
        os.symlink(outside, log)
    else:
        os.mkfifo(log)
    with capture_step_log(LocalStore(), str(output)):
        print("the step's line")
    assert log.is_file() and not log.is_symlink()
    assert log.read_text() == "the step's line\n"
    if kind == "link-out":
        assert outside.read_text() == "precious\n"
    else:
        assert not outside.exists()


def test_a_lease_that_is_a_directory_fails_its_step_instead_of_waiting_forever(tmp_path):
    """No lease can be written in a directory's place: the run waited for one for good."""
    prefix, a, unrelated, target, _ = bad_prefix(tmp_path, ".executor_status.lock", "directory")
    Path(target.parent, ".executor_status").unlink()
    finished = threading.Event()
    caught: list[BaseException] = []

    def run() -> None:
        try:
            Executor(str(prefix), console=False).run([a, unrelated])
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            caught.append(error)
        finally:
            finished.set()

    threading.Thread(target=run, daemon=True).start()
    assert finished.wait(60), "the run waited on a lease that is a directory"
    assert len(caught) == 1 and isinstance(caught[0], ExecutorRunError), caught
    assert [failure.name for failure in caught[0].failures] == ["a"]
    assert f"cannot read the lease file {target}: it is a directory" in str(caught[0])


def test_read_info_reads_no_more_than_its_bound(tmp_path):
    import tracemalloc

    from executor.tree import MAX_INFO_BYTES, info_path

    output = tmp_path / "step"
    output.mkdir()
    with open(info_path(str(output)), "wb") as handle:
        handle.truncate(MAX_INFO_BYTES * 8)  # sparse
    tracemalloc.start()
    try:
        assert read_info(LocalStore(), str(output)) is None
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_INFO_BYTES, peak  # the file is 8 times that


def test_an_unreadable_info_is_not_reported_as_every_field_added(tmp_path):
    """The reuse warning diffs against the recorded config; with `.executor_info` unreadable
    it said every field was 'added', even the versioned ones."""
    from executor.tree import info_path

    prefix = tmp_path / "prefix"
    first = ExecutorStep(
        "a", write_value, WriteConfig(output_path=this_output_path(), value=versioned(1), key="x")
    )
    Executor(str(prefix), console=False).run([first])
    output = Executor(str(prefix), console=False).run([first], dry_run=True).rows[0].output_path
    Path(info_path(output)).write_bytes(b"\xff not json")
    again = ExecutorStep(
        "a", write_value, WriteConfig(output_path=this_output_path(), value=versioned(1), key="y")
    )
    row = Executor(str(prefix), console=False).run([again], dry_run=True).rows[0]
    assert row.action == Action.SKIP
    assert row.unversioned_changes == (f"which ones is unknown: {info_path(output)} cannot be read",)


def test_a_lease_holders_control_characters_are_shown_escaped(tmp_path):
    """The plan and the progress line print a lease's worker id, taken from the tree: an
    escape sequence there (ESC [2J clears the screen) reached the terminal as such."""
    import io
    import time

    from executor.console import ConsoleProgress
    from executor.events import StepWaiting
    from executor.tree import LeaseRecord, lease_path

    prefix = tmp_path / "prefix"
    a = step("a", 1)
    output = Executor(str(prefix), console=False).run([a], dry_run=True).rows[0].output_path
    os.makedirs(output)
    worker = "vm:1:abc\x1b[2J\x07"
    Path(lease_path(output)).write_bytes(LeaseRecord(worker=worker, heartbeat=time.time()).to_bytes())
    row = Executor(str(prefix), console=False).run([a], dry_run=True).rows[0]
    assert row.action == Action.WAIT
    assert "held by vm:1:abc\\x1b[2J\\x07," in row.reason and "\x1b" not in row.reason
    stale = LeaseRecord(worker=worker, heartbeat=time.time() - 3600)
    Path(lease_path(output)).write_bytes(stale.to_bytes())
    row = Executor(str(prefix), console=False).run([a], dry_run=True).rows[0]
    assert "stale lease of vm:1:abc\\x1b[2J\\x07 " in row.reason and "\x1b" not in row.reason
    out = io.StringIO()
    ConsoleProgress(total=1, stream=out)(StepWaiting("a", output, holder=worker, heartbeat=time.time()))
    assert "held by vm:1:abc\\x1b[2J\\x07," in out.getvalue() and "\x1b" not in out.getvalue()
