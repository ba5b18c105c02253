"""The output tree's bookkeeping files (`executor.tree`): exact formats and refusals.

Each test pins a behaviour that a mutation of `executor/tree.py` broke without any other
test noticing (see docs/testing.md): the keys of a status line and of a lease record,
the messages naming what is wrong with a status file, the tail reads of long status
files, and the `.executor_info` layout.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass

import pytest

from executor import tree
from executor.graph import resolve
from executor.steps import ExecutorStep, this_output_path, versioned
from executor.store import LocalStore, MemoryStore, StoreError
from executor.tree import (
    LeaseRecord,
    Status,
    StatusEvent,
    StatusFileError,
    append_status,
    info_json,
    parse_last_status,
    parse_status,
    read_info,
    read_last_status,
    read_status,
    step_info_record,
    utc_now_iso,
    write_info,
)


def memory_output() -> str:
    return f"memory://tree-{uuid.uuid4().hex}/step"


def event_line(status: str = "SUCCESS", **fields) -> str:
    return json.dumps({"date": "2026-01-01T00:00:00.000Z", "status": status, **fields})


# -- status lines ------------------------------------------------------------------------


def test_a_status_event_is_one_sorted_json_line_with_its_extras():
    event = StatusEvent(
        date="2026-01-02T03:04:05.006Z", status=Status.FAILED, message="boom", worker="w1", extra={"a": 1}
    )
    assert event.to_json() == (
        '{"a": 1, "date": "2026-01-02T03:04:05.006Z", "message": "boom", "status": "FAILED", "worker": "w1"}'
    )


def test_a_status_event_survives_a_round_trip():
    event = StatusEvent(
        date="2026-01-02T03:04:05.006Z",
        status=Status.DEP_FAILED,
        message="m",
        worker="w",
        extra={"version_hash": "ab", "duration_s": 1.5},
    )
    assert StatusEvent.from_json(event.to_json()) == event


def test_a_status_line_without_a_date_reads_as_an_empty_date():
    event = StatusEvent.from_json('{"status": "RUNNING"}')
    assert event == StatusEvent(date="", status=Status.RUNNING, message=None, worker=None, extra={})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"status": "SUCC', "not valid JSON (Unterminated string starting at column 12; truncated?)"),
        ("[1, 2]", "a JSON list, not a status event object"),
        (
            '{"status": "DONE"}',
            "unknown status 'DONE' (expected one of RUNNING, SUCCESS, FAILED, DEP_FAILED, WAITING)",
        ),
        (
            '{"date": 5}',
            "unknown status None (expected one of RUNNING, SUCCESS, FAILED, DEP_FAILED, WAITING)",
        ),
        ('{"status": 1}', "unknown status 1 (expected one of RUNNING, SUCCESS, FAILED, DEP_FAILED, WAITING)"),
        (
            '{"status": ["SUCCESS"]}',
            "unknown status ['SUCCESS'] (expected one of RUNNING, SUCCESS, FAILED, DEP_FAILED, WAITING)",
        ),
        (
            '{"status": {"a": 1}}',
            "unknown status {'a': 1} (expected one of RUNNING, SUCCESS, FAILED, DEP_FAILED, WAITING)",
        ),
        (event_line(date=5), "field 'date' is a int, not a string"),
        (event_line(message=["x"]), "field 'message' is a list, not a string"),
        (event_line(worker=1.5), "field 'worker' is a float, not a string"),
        (event_line(version_hash=7), "field 'version_hash' is a int, not a string"),
        (event_line(config_digest={}), "field 'config_digest' is a dict, not a string"),
    ],
    ids=lambda value: "case",
)
def test_a_bad_status_line_is_refused_saying_what_is_wrong(line, message):
    with pytest.raises(ValueError) as caught:
        StatusEvent.from_json(line)
    assert str(caught.value) == message


def test_a_status_line_nested_absurdly_deep_is_refused_not_a_crash():
    with pytest.raises(ValueError, match=r"^not a status event \(JSON nested too deeply\)$"):
        StatusEvent.from_json("[" * 100_000 + "]" * 100_000)


def test_a_long_unknown_status_word_is_shortened_in_the_message():
    word = "X" * 100
    with pytest.raises(ValueError) as caught:
        StatusEvent.from_json(json.dumps({"status": word}))
    assert str(caught.value).startswith(f"unknown status '{'X' * 56}... (expected")
    exactly = "Y" * 58  # repr is 60 characters: shown whole
    with pytest.raises(ValueError) as caught:
        StatusEvent.from_json(json.dumps({"status": exactly}))
    assert str(caught.value).startswith(f"unknown status '{exactly}' (expected")
    one_more = "Z" * 59  # repr is 61 characters: shortened
    with pytest.raises(ValueError) as caught:
        StatusEvent.from_json(json.dumps({"status": one_more}))
    assert str(caught.value).startswith(f"unknown status '{'Z' * 56}... (expected")


DIGEST = "0123456789abcdef" * 4
VERSION = "fedcba9876543210" * 4


@pytest.mark.parametrize("duration", [0, 12, 1.5, -0.25, 1e-05, 2.5e16, 123456789012])
def test_a_success_line_reads_back_exactly_as_json_would_read_it(duration):
    """The runner's SUCCESS lines take a fast path (no JSON parse): same event, same types."""
    event = StatusEvent(
        date="2026-01-02T03:04:05.006Z",
        status=Status.SUCCESS,
        worker="host.example:1234-ab_c",
        extra={"config_digest": DIGEST, "duration_s": duration, "version_hash": VERSION},
    )
    line = event.to_json()
    parsed = StatusEvent.from_json(line)
    assert parsed == event
    assert type(parsed.extra["duration_s"]) is type(json.loads(line)["duration_s"])


def test_a_success_line_unlike_the_runners_is_read_as_json():
    event = StatusEvent(
        date="d",
        status=Status.SUCCESS,
        message="with a message",
        worker="w w",  # a space: not the fast path's worker
        extra={"config_digest": DIGEST, "duration_s": 1, "version_hash": VERSION, "more": [1]},
    )
    assert StatusEvent.from_json(event.to_json()) == event


def test_the_old_one_word_status_format_is_read():
    assert parse_status("SUCCESS\n") == [StatusEvent(date="", status=Status.SUCCESS)]
    assert parse_last_status("RUNNING\nFAILED") == StatusEvent(date="", status=Status.FAILED)


def test_utc_now_iso_is_iso_8601_with_milliseconds():
    assert utc_now_iso(0) == "1970-01-01T00:00:00.000Z"
    assert utc_now_iso(0.999) == "1970-01-01T00:00:00.999Z"
    assert utc_now_iso(1.0) == "1970-01-01T00:00:01.000Z"  # the next second, not the last one's text
    assert utc_now_iso(0.5) == "1970-01-01T00:00:00.500Z"
    assert utc_now_iso(59.5) == "1970-01-01T00:00:59.500Z"
    assert utc_now_iso(-0.5) == "1969-12-31T23:59:59.500Z"  # whole seconds round down, not toward 0
    assert utc_now_iso(86400 * 365 + 3661.25) == "1971-01-01T01:01:01.250Z"
    now = utc_now_iso()
    assert len(now) == len("1970-01-01T00:00:00.000Z") and now.endswith("Z") and now > "2020"


# -- whole histories and last lines ---------------------------------------------------------


def test_parse_status_skips_blank_lines_and_names_the_bad_line():
    text = event_line("RUNNING") + "\n\n   \n" + event_line("SUCCESS") + "\n"
    assert [event.status for event in parse_status(text)] == [Status.RUNNING, Status.SUCCESS]
    assert parse_status("") == [] and parse_status(None) == []
    with pytest.raises(StatusFileError) as caught:
        parse_status(event_line("RUNNING") + "\n\nnonsense\n", "/out/s/.executor_status")
    assert caught.value.path == "/out/s/.executor_status"
    assert caught.value.why.startswith("line 3: unknown status 'nonsense'")
    assert str(caught.value) == (
        f"cannot read the status file /out/s/.executor_status: {caught.value.why}. Delete it to plan "
        "the step afresh (the step then runs again; its other files are kept)"
    )


def test_parse_status_names_the_default_file_when_given_no_path():
    with pytest.raises(StatusFileError, match=r"the status file \.executor_status: line 1"):
        parse_status("nonsense")
    with pytest.raises(StatusFileError, match=r"the status file \.executor_status: last line"):
        parse_last_status("nonsense")


def test_parse_last_status_reads_only_the_last_line():
    text = "garbage that is never parsed\n" + event_line("FAILED", message="m") + "\n\n  "
    assert parse_last_status(text).status == Status.FAILED
    assert parse_last_status(event_line("RUNNING")).status == Status.RUNNING  # no newline at all
    assert parse_last_status(None) is None
    assert parse_last_status("") is None
    assert parse_last_status(" \n\t\n") is None
    with pytest.raises(StatusFileError) as caught:
        parse_last_status(event_line() + "\nDONE\n", "/p/.executor_status")
    assert caught.value.why.startswith("last line: unknown status 'DONE'")


# -- reading status files from a store -----------------------------------------------------------


@pytest.fixture(params=["local", "memory"])
def place(request, tmp_path):
    """(store, output path) on local disk and on memory://."""
    if request.param == "local":
        return LocalStore(), str(tmp_path / "step")
    return MemoryStore(), memory_output()


def write_status(store, output: str, data: bytes) -> None:
    store.write_atomic(tree.status_path(output), data)


def test_append_status_writes_one_line_per_event_and_returns_it(place):
    store, output = place
    first = append_status(store, output, Status.RUNNING, worker="w")
    second = append_status(store, output, Status.FAILED, "boom", "w", duration_s=2)
    assert second.message == "boom" and second.extra == {"duration_s": 2}
    assert read_status(store, output) == [first, second]
    assert read_last_status(store, output) == second
    text = store.read_text(tree.status_path(output))
    assert text == first.to_json() + "\n" + second.to_json() + "\n"


def test_no_status_file_reads_as_no_status(place):
    store, output = place
    assert read_last_status(store, output) is None
    assert read_status(store, output) == []


def test_an_empty_status_file_reads_as_no_status(place):
    store, output = place
    write_status(store, output, b"")
    assert read_last_status(store, output) is None
    assert read_status(store, output) == []


def test_a_long_history_is_read_from_its_tail(place, monkeypatch):
    """Longer than the tail: only the end is read, and a first line cut in half is dropped."""
    monkeypatch.setattr(tree, "STATUS_TAIL_BYTES", 200)
    store, output = place
    lines = [event_line("RUNNING", message=f"attempt {i}") for i in range(20)]
    write_status(store, output, ("\n".join(lines) + "\n" + event_line("SUCCESS") + "\n").encode())
    assert read_last_status(store, output).status == Status.SUCCESS
    assert len(read_status(store, output)) == 21


def test_a_tail_whose_only_line_is_cut_is_read_again_longer(place, monkeypatch):
    """The last line is longer than the tail: it is read again up to STATUS_MAX_LINE_BYTES."""
    monkeypatch.setattr(tree, "STATUS_TAIL_BYTES", 100)
    store, output = place
    last = event_line("FAILED", message="x" * 500)
    write_status(store, output, (event_line("RUNNING") + "\n" + last + "\n").encode())
    event = read_last_status(store, output)
    assert event.status == Status.FAILED and event.message == "x" * 500


def test_a_last_line_longer_than_the_maximum_is_refused(place, monkeypatch):
    monkeypatch.setattr(tree, "STATUS_TAIL_BYTES", 100)
    monkeypatch.setattr(tree, "STATUS_MAX_LINE_BYTES", 1000)
    store, output = place
    write_status(store, output, (event_line("RUNNING") + "\n" + event_line(message="x" * 2000)).encode())
    with pytest.raises(StatusFileError) as caught:
        read_last_status(store, output)
    assert caught.value.why == "its last line is longer than 1,000 bytes"
    assert caught.value.path == tree.status_path(output)


def test_a_tail_that_starts_exactly_at_a_line_boundary_is_read(place, monkeypatch):
    """The tail's first byte is the newline ending the line before: nothing is cut."""
    monkeypatch.setattr(tree, "STATUS_TAIL_BYTES", 100)
    store, output = place
    first = event_line("RUNNING", message="m" * 150)
    last = event_line("SUCCESS", worker="w")
    last += " " * (99 - len(last) - 1)  # the last line and its newline: 99 bytes
    write_status(store, output, f"{first}\n{last}\n".encode())
    assert len(f"\n{last}\n") == 100
    assert read_last_status(store, output) == StatusEvent(
        date="2026-01-01T00:00:00.000Z", status=Status.SUCCESS, worker="w"
    )


def test_a_single_line_file_just_over_the_tail_is_read_whole(place, monkeypatch):
    """One line longer than the tail but within the maximum: the second read gets all of it."""
    monkeypatch.setattr(tree, "STATUS_TAIL_BYTES", 100)
    store, output = place
    line = event_line("SUCCESS", message="y" * 300)
    write_status(store, output, line.encode())
    assert read_last_status(store, output).message == "y" * 300


def test_a_status_file_of_exactly_the_tail_size_is_read(place, monkeypatch):
    store, output = place
    line = event_line("SUCCESS") + "\n"
    monkeypatch.setattr(tree, "STATUS_TAIL_BYTES", len(line))
    write_status(store, output, line.encode())
    assert read_last_status(store, output).status == Status.SUCCESS


def test_a_bad_line_in_a_stored_history_names_the_file(place):
    store, output = place
    write_status(store, output, (event_line("RUNNING") + "\nnonsense\n").encode())
    with pytest.raises(StatusFileError) as caught:
        read_status(store, output)
    assert caught.value.path == tree.status_path(output)
    assert caught.value.why.startswith("line 2: unknown status 'nonsense'")


def test_a_history_larger_than_one_read_chunk_is_read_whole(place):
    """Local files are read in 1 MiB chunks: the chunks must join without a seam."""
    store, output = place
    lines = [event_line("RUNNING", message=f"{i:06d}" + "m" * 1000) for i in range(1200)]
    write_status(store, output, ("\n".join(lines) + "\n").encode())
    events = read_status(store, output)
    assert [event.message for event in events] == [f"{i:06d}" + "m" * 1000 for i in range(1200)]


def test_a_status_file_that_is_not_utf8_is_refused_naming_the_byte(place):
    store, output = place
    write_status(store, output, b'{"status": "SUCCESS"}\n\xff\xfe')
    with pytest.raises(StatusFileError) as caught:
        read_last_status(store, output)
    assert caught.value.why == "not UTF-8 text (byte 22 of what was read)"
    with pytest.raises(StatusFileError) as caught:
        read_status(store, output)
    assert caught.value.path == tree.status_path(output)
    assert caught.value.why == "not UTF-8 text (byte 22 of what was read)"


def test_a_directory_in_place_of_the_status_file_is_refused(tmp_path):
    output = tmp_path / "step"
    (output / ".executor_status").mkdir(parents=True)
    for read in (read_last_status, read_status):
        with pytest.raises(StatusFileError) as caught:
            read(LocalStore(), str(output))
        assert caught.value.why == "it is a directory, not a file"
        assert caught.value.path == tree.status_path(str(output))


def test_a_file_in_place_of_the_output_directory_is_refused_naming_it(tmp_path):
    """(Read as "no status" until the twenty-second session: the step then failed on its first
    write with a raw NotADirectoryError.)"""
    (tmp_path / "step").write_text("not a directory")
    with pytest.raises(StatusFileError) as caught:
        read_last_status(LocalStore(), str(tmp_path / "step"))
    assert (caught.value.path, caught.value.why, caught.value.what) == (
        str(tmp_path / "step"),
        "it is not a directory",
        "output directory",
    )
    assert read_status(LocalStore(), str(tmp_path / "step")) == []


def test_a_local_status_file_that_cannot_be_opened_is_a_store_error_naming_it(tmp_path):
    """Any OSError but a missing file (here: a name too long) is a storage failure, not 'no status'."""
    output = str(tmp_path / ("x" * 300))
    path = tree.status_path(output)
    for read in (read_last_status, read_status):
        with pytest.raises(StoreError) as caught:
            read(LocalStore(), output)
        assert str(caught.value).startswith(f"cannot read {path}: OSError: [Errno 36] File name too long")


def test_a_local_status_file_that_fails_to_read_is_a_store_error_naming_it(tmp_path, monkeypatch):
    """A read error (EIO) is a storage failure naming the file."""
    import errno

    output = tmp_path / "step"
    output.mkdir()
    (output / ".executor_status").write_text('{"date": "", "status": "SUCCESS"}\n')
    path = tree.status_path(str(output))

    def failing_read(fd, size, *offset):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "read", failing_read)  # read_last_status reads the head
    monkeypatch.setattr(os, "pread", failing_read)  # read_status the whole file
    for read in (read_last_status, read_status):
        with pytest.raises(StoreError) as caught:
            read(LocalStore(), str(output))
        assert str(caught.value) == f"cannot read {path}: OSError: [Errno 5] Input/output error"


def test_an_empty_object_whose_range_read_fails_is_read_whole(monkeypatch):
    """S3 answers a suffix-range GET on an empty object with 416: the reader falls back."""
    store = MemoryStore()
    output = memory_output()
    write_status(store, output, b"")
    real = store.fs.cat_file

    def cat_file(path, start=None, end=None, **kwargs):
        if start is not None:
            raise OSError("416 Requested Range Not Satisfiable")
        return real(path, start=start, end=end, **kwargs)

    monkeypatch.setattr(store.fs, "cat_file", cat_file)
    assert read_last_status(store, output) is None
    write_status(store, output, (event_line("SUCCESS") + "\n").encode())
    assert read_last_status(store, output).status == Status.SUCCESS


def test_a_whole_read_that_fails_on_an_object_store_names_the_file(monkeypatch):
    store = MemoryStore()
    output = memory_output()

    def cat_file(path, start=None, end=None, **kwargs):
        raise OSError("503 Slow Down")

    monkeypatch.setattr(store.fs, "cat_file", cat_file)
    for read in (read_last_status, read_status):
        with pytest.raises(OSError) as caught:
            read(store, output)
        assert str(caught.value) == f"cannot read {tree.status_path(output)}: OSError: 503 Slow Down"


# -- .executor_info ----------------------------------------------------------------------------


def test_info_json_is_one_sorted_field_per_line():
    record = {"b": {"y": 1, "x": [1, 2]}, "a": "é"}
    assert info_json(record) == '{\n  "a": "\\u00e9",\n  "b": {"x": [1, 2], "y": 1}\n}\n'
    assert json.loads(info_json(record)) == record


def test_write_info_and_read_info_round_trip(place):
    store, output = place
    record = {"output_path": output, "name": "s"}
    write_info(store, record)
    assert store.read_text(tree.info_path(output)) == info_json(record)
    assert read_info(store, output) == record


@pytest.mark.parametrize("content", [b"not json", b"[1, 2]", b"\xff", b"[" * 100_000])
def test_an_unreadable_info_file_reads_as_none(tmp_path, content):
    output = tmp_path / "step"
    output.mkdir()
    (output / ".executor_info").write_bytes(content)
    assert read_info(LocalStore(), str(output)) is None


def test_a_missing_info_file_reads_as_none(tmp_path):
    assert read_info(LocalStore(), str(tmp_path / "step")) is None


@dataclass(frozen=True)
class Cfg:
    output_path: object
    value: object
    upstream: object = None


def _noop(config):
    return None


def test_step_info_record_lists_what_reproduce_needs(tmp_path):
    up = ExecutorStep("data/up", _noop, Cfg(this_output_path(), versioned(1)))
    down = ExecutorStep(
        "data/down",
        _noop,
        Cfg(this_output_path(), versioned(2), up.nonblocking()),
        description="d",
        pip_dependency_groups=["cpu"],
        resources={"gpu": 1},
    )
    graph = resolve([down], str(tmp_path))
    resolved = graph.resolved(down)
    record = step_info_record(resolved, graph, {"script": "x.py"})
    up_path = graph.resolved(up).output_path
    assert record["name"] == "data/down"
    assert record["description"] == "d"
    assert record["config_digest"] == resolved.config_digest
    assert record["version_hash"] == resolved.version_hash
    assert record["dependencies"] == [up_path]
    assert record["dependency_steps"] == [{"name": "data/up", "output_path": up_path, "blocking": False}]
    assert record["override_output_path"] is None
    assert record["run"] == {"script": "x.py"}
    assert record["pip_dependency_groups"] == ["cpu"]
    assert record["resources"] == {"gpu": 1}
    assert up_path in json.dumps(record["config_template"])
    assert step_info_record(resolved, graph)["run"] == {}


class Pool:
    """A resource value that is not JSON (e.g. a scheduler's handle)."""


def test_resources_that_are_not_json_are_recorded_as_text(tmp_path):
    s = ExecutorStep("s", _noop, Cfg(this_output_path(), versioned(1)), resources={"pool": Pool()})
    graph = resolve([s], str(tmp_path))
    record = step_info_record(graph.resolved(s), graph)
    assert record["resources"] == {"pool": f"<{__name__}.Pool>"}


# -- leases --------------------------------------------------------------------------------------


def test_a_lease_record_is_marins_lease_as_sorted_json():
    record = LeaseRecord(worker="h:7:ab", heartbeat=2.5)
    assert record.to_bytes() == b'{"timestamp": 2.5, "worker_id": "h:7:ab"}'
    assert LeaseRecord.parse(record.to_bytes()) == record
    assert (record.host, record.pid, record.acquired) == ("h", 7, None)


@pytest.mark.parametrize(
    ("worker", "host", "pid"),
    [
        ("node-1:42:9f3a", "node-1", 42),
        ("node-1:42:9f3a/step:node-2:77:0b1c", "node-2", 77),  # a heavy step's own process holds it
        ("marin-host-140234", "", 0),  # Marin's worker ids say nothing we can parse
        (":42:9f3a", "", 0),
        ("h:4x:9f3a", "", 0),
    ],
)
def test_the_holder_host_and_pid_come_from_the_worker_id(worker, host, pid):
    record = LeaseRecord(worker=worker, heartbeat=1.0)
    assert (record.host, record.pid) == (host, pid)


def test_a_lease_written_before_the_marin_form_is_still_read():
    record = LeaseRecord.parse(
        b'{"acquired": 1.0, "heartbeat": 2.5, "host": "h", "pid": 7, "worker": "h:7:ab"}'
    )
    assert record == LeaseRecord(worker="h:7:ab", heartbeat=2.5, acquired=1.0)


@pytest.mark.parametrize(
    "data",
    [
        b'{"acquired": "then", "heartbeat": 2.5, "host": "h", "pid": 7, "worker": "w"}',
        b'{"acquired": 1.0, "heartbeat": 2.5, "host": "h", "pid": 7, "worker": 3}',
        b'{"acquired": 1.0, "heartbeat": 2.5, "worker": "w"}',
        b'{"timestamp": 2.5, "worker_id": "w", "extra": 1}',
        b'{"timestamp": true, "worker_id": "w"}',
    ],
)
def test_a_malformed_lease_of_either_form_reads_as_none(data):
    assert LeaseRecord.parse(data) is None


@pytest.mark.parametrize("data", [None, b"", b"not json", b"[1]", b'{"worker": "w"}', b'{"x": 1}'])
def test_an_unreadable_lease_reads_as_none(data):
    assert LeaseRecord.parse(data) is None
