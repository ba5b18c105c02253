"""Unreadable `.executor_status` files: a clear error naming the file, planned as that step's error.

A status file can be truncated, garbage, not UTF-8, hold a status we do not know, or be a
directory. Reading it raises StatusFileError naming the file and the fix; planning turns
that into an error row for that step alone, blocks what depends on it, and plans every
other step as usual. Planning reads only the end of a status file, however long.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from executor import Executor, ExecutorRunError, ExecutorStep, output_path_of, this_output_path, versioned
from executor.plan import Action
from executor.store import LocalStore, MemoryStore, open_store
from executor.tree import (
    STATUS_MAX_LINE_BYTES,
    STATUS_TAIL_BYTES,
    Status,
    StatusEvent,
    StatusFileError,
    parse_status,
    read_last_status,
    read_status,
    status_path,
)
from tests.executor.steps_for_tests import WriteConfig, write_value

GOOD = b'{"date": "2026-01-01T00:00:00.000Z", "status": "RUNNING"}\n'
SUCCESS = b'{"date": "2026-01-01T00:01:00.000Z", "status": "SUCCESS"}\n'

# kind -> (file contents, what the error says)
BAD = {
    "truncated": (GOOD + b'{"date": "2026-01-01T00:01:00.000Z", "status": "SUCC', "not valid JSON"),
    "garbage": (b"\x00\x01 this is not a status file {{{\n", "unknown status"),
    "not-utf8": (GOOD + b'{"status": "SUCCESS", "message": "\xff\xfe"}\n', "not UTF-8"),
    "unknown-status": (GOOD + b'{"status": "DONE"}\n', "unknown status 'DONE'"),
    "unknown-word": (b"FINISHED\n", "unknown status 'FINISHED'"),
    "no-status": (b'{"date": "2026-01-01T00:00:00.000Z"}\n', "unknown status None"),
    "json-list": (b'["SUCCESS"]\n', "unknown status '[\"SUCCESS\"]'"),
    "wrong-type": (b'{"status": "SUCCESS", "version_hash": 5}\n', "'version_hash' is a int"),
    "deep-json": (b'{"status": "SUCCESS", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "nested"),
}


def write_status(store, output_path: str, data: bytes) -> str:
    path = status_path(output_path)
    store.write_atomic(path, data)
    return path


@pytest.fixture(params=["local", "memory", "s3"])
def store_and_output(request, tmp_path):
    """A step output directory on local disk, memory:// and a real S3 server (suffix-range reads)."""
    if request.param == "local":
        yield LocalStore(), str(tmp_path / "step-0123abcd")
    elif request.param == "memory":
        store = MemoryStore()
        output = f"memory://status-tests/{os.getpid()}/{request.node.name}/step-0123abcd"
        yield store, output
        store.delete_tree(output)
    else:
        request.getfixturevalue("s3_env")
        output = request.getfixturevalue("s3_prefix") + "/step-0123abcd"
        yield open_store(output), output


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_status_file_is_an_error_naming_the_file_and_the_fix(store_and_output, kind):
    store, output = store_and_output
    data, why = BAD[kind]
    path = write_status(store, output, data)
    with pytest.raises(StatusFileError) as caught:
        read_last_status(store, output)
    message = str(caught.value)
    assert f"cannot read the status file {path}" in message
    assert why in message
    assert "Delete it" in message
    assert caught.value.path == path
    with pytest.raises(StatusFileError, match="cannot read the status file"):
        read_status(store, output)


def test_a_directory_in_place_of_the_status_file_is_an_error(tmp_path):
    output = tmp_path / "step-0123abcd"
    (output / ".executor_status").mkdir(parents=True)
    for read in (read_last_status, read_status):
        with pytest.raises(StatusFileError, match="is a directory"):
            read(LocalStore(), str(output))


def test_the_full_history_names_the_bad_line():
    with pytest.raises(StatusFileError, match="line 2: not valid JSON"):
        parse_status((GOOD + b"{oops\n" + SUCCESS).decode(), "x/.executor_status")


def test_a_missing_or_empty_status_file_is_no_status(store_and_output):
    store, output = store_and_output
    assert read_last_status(store, output) is None
    write_status(store, output, b"")
    assert read_last_status(store, output) is None
    write_status(store, output, b"\n\n")
    assert read_status(store, output) == []


def test_the_old_one_word_format_still_reads(store_and_output):
    store, output = store_and_output
    write_status(store, output, b"SUCCESS\n")
    assert read_last_status(store, output) == StatusEvent(date="", status=Status.SUCCESS)


def test_a_bad_line_earlier_in_the_history_does_not_stop_planning(store_and_output):
    # Planning reads the last line only; the runner's full read names the bad line.
    store, output = store_and_output
    write_status(store, output, GOOD + b"{garbage\n" + SUCCESS)
    assert read_last_status(store, output).status == Status.SUCCESS


def test_a_long_history_is_read_from_its_tail(store_and_output):
    store, output = store_and_output
    history = GOOD * (3 * STATUS_TAIL_BYTES // len(GOOD)) + SUCCESS
    write_status(store, output, history)
    assert read_last_status(store, output).status == Status.SUCCESS
    assert [e.status for e in read_status(store, output)][-2:] == [Status.RUNNING, Status.SUCCESS]


def test_a_last_line_longer_than_the_tail_is_read_whole(store_and_output):
    store, output = store_and_output
    message = "x" * (2 * STATUS_TAIL_BYTES)
    line = f'{{"status": "FAILED", "message": "{message}"}}\n'.encode()
    write_status(store, output, GOOD + line)
    event = read_last_status(store, output)
    assert event.status == Status.FAILED and event.message == message


def test_a_last_line_over_the_line_limit_is_an_error(tmp_path):
    output = tmp_path / "step-0123abcd"
    output.mkdir()
    with open(output / ".executor_status", "wb") as handle:
        handle.write(GOOD + b'{"status": "FAILED", "message": "')
        handle.truncate(STATUS_MAX_LINE_BYTES + 2 * len(GOOD))  # sparse: zeros, no newline
    with pytest.raises(StatusFileError, match="last line is longer than 16,777,216 bytes"):
        read_last_status(LocalStore(), str(output))


def test_a_status_file_of_hundreds_of_megabytes_is_not_read_whole(tmp_path, monkeypatch):
    output = tmp_path / "step-0123abcd"
    output.mkdir()
    big = output / ".executor_status"
    with open(big, "wb") as handle:
        handle.truncate(300 << 20)  # a sparse 300 MB of history...
        handle.seek(0, os.SEEK_END)
        handle.write(b"\n" + SUCCESS)  # ...ending in the current status
    read_sizes: list[int] = []
    real_pread = os.pread

    def counting_pread(fd, size, offset):
        data = real_pread(fd, size, offset)
        read_sizes.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", counting_pread)
    assert read_last_status(LocalStore(), str(output)).status == Status.SUCCESS
    assert sum(read_sizes) <= STATUS_TAIL_BYTES


# -- planning -----------------------------------------------------------------------------


def step(name: str, value: int, inputs=()) -> ExecutorStep:
    config = WriteConfig(
        output_path=this_output_path(), value=versioned(value), inputs=list(inputs), key=name
    )
    return ExecutorStep(name, write_value, config)


@pytest.mark.parametrize("kind", ["truncated", "not-utf8", "unknown-status", "directory"])
def test_a_bad_status_file_makes_an_error_row_and_plans_the_rest(tmp_path, kind):
    a = step("a", 1)
    b = step("b", 2, inputs=[output_path_of(a)])
    c = step("c", 3)
    done = step("done", 4)
    Executor(str(tmp_path), console=False).run([a, done])
    a_path = Executor(str(tmp_path), console=False).run([a], dry_run=True).rows[0].output_path
    status_file = Path(a_path, ".executor_status")
    status_file.unlink()
    if kind == "directory":
        status_file.mkdir()
    else:
        status_file.write_bytes(BAD[kind][0])

    rows = {
        row.name: row for row in Executor(str(tmp_path), console=False).run([b, c, done], dry_run=True).rows
    }
    assert rows["a"].action == Action.ERROR
    assert rows["a"].reason.startswith(f"cannot read the status file {status_file}")
    assert rows["a"].status_error is not None
    assert (rows["b"].action, rows["b"].reason) == (
        Action.BLOCKED,
        "no output yet; after dependency a has an error (see its row)",
    )
    assert rows["c"].action == Action.RUN
    assert rows["done"].action == Action.SKIP


@pytest.mark.parametrize("where", ["output", "parent"])
def test_a_file_in_place_of_the_output_directory_is_an_error_row_naming_it(tmp_path, where):
    """Found by a red-team pass (twenty-second session): the plan said `run ... no output yet`
    and the run failed with `executor error: NotADirectoryError: ... .executor_status.lock`."""
    a = ExecutorStep("group/a", write_value, WriteConfig(output_path=this_output_path(), key="a"))
    c = step("c", 3)
    a_path = Path(Executor(str(tmp_path), console=False).run([a], dry_run=True).rows[0].output_path)
    in_the_way = a_path if where == "output" else a_path.parent
    in_the_way.parent.mkdir(parents=True, exist_ok=True)
    in_the_way.write_text("not a directory")

    rows = {row.name: row for row in Executor(str(tmp_path), console=False).run([a, c], dry_run=True).rows}
    assert rows["group/a"].action == Action.ERROR
    assert rows["group/a"].reason.startswith(
        f"cannot read the output directory {in_the_way}: it is not a directory. Delete it"
    ), rows["group/a"].reason
    assert rows["c"].action == Action.RUN
    with pytest.raises(ExecutorRunError, match="cannot read the output directory"):
        Executor(str(tmp_path), console=False).run([a, c])
    assert in_the_way.read_text() == "not a directory"  # nothing removed
    assert Path(
        Executor(str(tmp_path), console=False).run([c], dry_run=True).rows[0].output_path, "value.json"
    ).exists()


def test_a_directory_in_place_of_the_info_file_fails_the_step_in_one_line(tmp_path):
    """A re-run writes `.executor_info` by renaming over it: a directory there made the step fail
    with `executor error: IsADirectoryError: [Errno 21] ... .tmp-...-.executor_info' -> ...`."""
    a, c = step("a", 1), step("c", 3)
    a_path = Path(Executor(str(tmp_path), console=False).run([a], dry_run=True).rows[0].output_path)
    a_path.mkdir(parents=True)
    (a_path / ".executor_status").write_bytes(b'{"date": "2026-01-01T00:00:00.000Z", "status": "FAILED"}\n')
    (a_path / ".executor_info").mkdir()
    (a_path / ".executor_info" / "kept.txt").write_text("someone's")

    with pytest.raises(ExecutorRunError) as raised:
        Executor(str(tmp_path), console=False).run([a, c], force_run_failed=True)

    message = str(raised.value)
    assert f"cannot write {a_path}/.executor_info: a directory is in its place; delete or move it" in message
    assert "Errno" not in message and ".tmp-" not in message, message
    assert (a_path / ".executor_info" / "kept.txt").read_text() == "someone's"
    assert not [name for name in os.listdir(a_path) if name.startswith(".tmp-")]
    assert not (a_path / ".executor_status.lock").exists()  # the lease was released
    assert Path(
        Executor(str(tmp_path), console=False).run([c], dry_run=True).rows[0].output_path, "value.json"
    ).exists()


def test_run_only_treats_a_dependency_with_a_bad_status_file_as_not_done(tmp_path):
    a = step("a", 1)
    b = step("b", 2, inputs=[output_path_of(a)])
    Executor(str(tmp_path), console=False).run([a])
    a_path = Executor(str(tmp_path), console=False).run([a], dry_run=True).rows[0].output_path
    Path(a_path, ".executor_status").write_bytes(b"???\n")
    rows = Executor(str(tmp_path), console=False).run([b], dry_run=True, run_only=["b"]).rows
    assert [(row.name, row.action) for row in rows] == [("a", Action.ERROR), ("b", Action.BLOCKED)]


def test_a_bad_status_file_of_an_older_version_does_not_break_the_explanation(tmp_path):
    Executor(str(tmp_path), console=False).run([step("a", 1)])
    old = Executor(str(tmp_path), console=False).run([step("a", 1)], dry_run=True).rows[0].output_path
    Path(old, ".executor_status").write_bytes(b"\xff\xff\n")
    row = Executor(str(tmp_path), console=False).run([step("a", 2)], dry_run=True).rows[0]
    assert row.action == Action.RUN and row.why_new == ("value: 1 -> 2",)
