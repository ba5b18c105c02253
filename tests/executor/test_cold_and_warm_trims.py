"""The system calls and locks taken out of a step's bookkeeping change nothing a user sees.

Each trim (docs/benchmarks.md, "2026-11-23, seventh session") is pinned here against the
general path it shortcuts: the plan's status reader for local trees, the step's digest cached
without a lock, temporary names drawn without `getrandom`, the lease directory made without
`makedirs`, and the keeper's liveness checked on failure rather than before every message.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from executor import Executor, ExecutorStep, lease_keeper, this_output_path, versioned
from executor.graph import resolve
from executor.lease import LeaseConfig, LeaseManager
from executor.lease_keeper import shared_keeper
from executor.store import LocalStore
from executor.tree import (
    STATUS_TAIL_BYTES,
    OurSuccessLine,
    Status,
    StatusFileError,
    append_status,
    lease_path,
    read_last_status,
    read_last_status_local,
    status_path,
)
from tests.executor.steps_for_tests import WriteConfig, write_value

OUR_SUCCESS = (
    '{"config_digest": "' + "a" * 64 + '", "date": "2026-11-23T10:00:00.123Z", "duration_s": 0.5, '
    '"message": null, "status": "SUCCESS", "version_hash": "' + "b" * 64 + '", "worker": "host:1:abc"}'
)
RUNNING = '{"date": "2026-11-23T10:00:00.000Z", "message": null, "status": "RUNNING", "worker": "w"}'

STATUS_FILES = {
    "our success line": (RUNNING + "\n" + OUR_SUCCESS + "\n").encode(),
    "our success line, no final newline": (RUNNING + "\n" + OUR_SUCCESS).encode(),
    "success with an integer duration": OUR_SUCCESS.replace('"duration_s": 0.5', '"duration_s": 3').encode(),
    "success with an exponent duration": OUR_SUCCESS.replace(
        '"duration_s": 0.5', '"duration_s": 1e-05'
    ).encode(),
    "success then CRLF": (OUR_SUCCESS + "\r\n").encode(),
    "success then blank lines": (OUR_SUCCESS + "\n\n\n").encode(),
    "running last": (OUR_SUCCESS + "\n" + RUNNING + "\n").encode(),
    "success with a message": OUR_SUCCESS.replace('"message": null', '"message": "ok"').encode(),
    "success with a non-ASCII worker": OUR_SUCCESS.replace("host:1:abc", "hôst").encode(),
    "a success line written by someone else": b'{"status": "SUCCESS"}\n',
    "Marin's one-word format": b"SUCCESS",
    "empty": b"",
    "only newlines": b"\n\n",
    "garbage": b"{not json\n",
    "not UTF-8": b"\xff\xfe\n",
    "a digest too short": OUR_SUCCESS.replace("a" * 64, "a" * 63).encode(),
    "an unknown status": b'{"status": "DONE"}\n',
    "a long history": (RUNNING + "\n") * (STATUS_TAIL_BYTES // len(RUNNING) + 5)
    + OUR_SUCCESS.encode().decode(),
}


def _outcome(reader, store, output_path):
    try:
        event = reader(store, output_path)
    except StatusFileError as error:
        return ("error", str(error))
    if event is None:
        return None
    if isinstance(event, OurSuccessLine):  # the local reader's matched SUCCESS line: its hashes
        return (event.status, event.version_hash, event.config_digest)
    return (event.date, event.status, event.message, event.worker, event.extra)


def _hashes(outcome):
    """A general reader's outcome cut to what an `OurSuccessLine` holds (status and hashes)."""
    if outcome is None or outcome[0] == "error":
        return outcome
    return (outcome[1], outcome[4].get("version_hash"), outcome[4].get("config_digest"))


@pytest.mark.parametrize("content", list(STATUS_FILES.values()), ids=list(STATUS_FILES))
def test_the_local_status_reader_reads_what_the_general_one_reads(tmp_path, content):
    output = tmp_path / "step-0"
    output.mkdir()
    (output / ".executor_status").write_bytes(content if isinstance(content, bytes) else content.encode())
    store = LocalStore()
    local, general = (
        _outcome(read_last_status_local, store, str(output)),
        _outcome(read_last_status, store, str(output)),
    )
    if local is not None and len(local) == 3:  # an OurSuccessLine: the general reader's hashes
        assert general[1] == Status.SUCCESS and local == _hashes(general)
    else:
        assert local == general


def test_the_local_status_reader_parses_our_success_line_itself(tmp_path, monkeypatch):
    """The line our runner writes never reaches the general parser (that is the point)."""
    import executor.tree

    output = tmp_path / "step-0"
    output.mkdir()
    (output / ".executor_status").write_text(RUNNING + "\n" + OUR_SUCCESS + "\n")
    monkeypatch.setattr(executor.tree, "read_last_status", lambda *_: pytest.fail("general path taken"))
    line = read_last_status_local(LocalStore(), str(output))
    assert isinstance(line, OurSuccessLine) and line.status == Status.SUCCESS
    assert (line.version_hash, line.config_digest) == ("b" * 64, "a" * 64)


def test_the_local_status_reader_on_missing_files_and_directories(tmp_path):
    store = LocalStore()
    assert read_last_status_local(store, str(tmp_path / "absent")) is None
    (tmp_path / "file").write_text("x")
    # Its parent is a file: the step's first write would fail (ENOTDIR), so the plan says it.
    with pytest.raises(
        StatusFileError, match=f"the output directory {tmp_path / 'file'}: it is not a directory"
    ):
        read_last_status_local(store, str(tmp_path / "file"))
    (tmp_path / "step" / ".executor_status").mkdir(parents=True)
    with pytest.raises(StatusFileError, match="directory"):
        read_last_status_local(store, str(tmp_path / "step"))


def test_a_cached_rerun_plans_every_step_skipped_through_the_local_reader(tmp_path):
    steps = [
        ExecutorStep(name=f"s{i}", fn=write_value, config=WriteConfig(this_output_path(), versioned(i)))
        for i in range(5)
    ]
    Executor(str(tmp_path), console=False).run(steps)
    plan = Executor(str(tmp_path), console=False).run(steps, dry_run=True)
    assert [row.action.value for row in plan.rows] == ["skip"] * 5
    assert [row.unversioned_changes for row in plan.rows] == [()] * 5


@pytest.mark.parametrize(
    "built_at_resolve", [False, True], ids=["config built lazily", "config built at once"]
)
def test_a_step_digest_is_computed_once_and_kept(tmp_path, monkeypatch, built_at_resolve):
    """Where `resolve` can encode the concrete config without building it, it digests it then
    (once, with the version); otherwise on first read. Either way once, and kept."""
    import executor.graph
    import executor.walker

    calls = []
    original = executor.graph.canonical_json
    monkeypatch.setattr(executor.graph, "canonical_json", lambda value: calls.append(1) or original(value))
    if built_at_resolve:  # as for a config class with a __post_init__ (tests/executor/test_lazy_config.py)
        monkeypatch.setattr(
            executor.graph, "encode_mapped", lambda config, on_marker: executor.walker.UNBUILT
        )
    graph = resolve([ExecutorStep(name="s", fn=write_value, config=WriteConfig(this_output_path(), 1))], "/p")
    step = graph.steps[0]
    assert len(calls) == (1 if built_at_resolve else 2)  # the version; and the digest when lazy
    assert ("config_digest" in step.__dict__) is not built_at_resolve
    first = step.config_digest
    assert step.config_digest == first and len(calls) == 2
    assert step.__dict__["config_digest"] == first
    assert type(step).config_digest.__doc__.startswith("Hash of the whole concrete config")


def test_temporary_names_are_unique_and_a_leftover_one_is_stepped_around(tmp_path, monkeypatch):
    import executor.store

    store = LocalStore()
    names = {executor.store._temp_name("x") for _ in range(1000)}
    assert len(names) == 1000 and all(name.startswith(".tmp-") and name.endswith("-x") for name in names)
    # A file left by a killed process with our pid and salt, under the next name we draw:
    upcoming = executor.store._temp_name("f")
    monkeypatch.setattr(executor.store, "_temp_name", lambda name: upcoming)
    (tmp_path / upcoming).write_text("left over")
    store.write_atomic(str(tmp_path / "f"), b"new")
    assert (tmp_path / "f").read_bytes() == b"new"
    assert (tmp_path / upcoming).read_text() == "left over"  # not ours to remove
    assert sorted(os.listdir(tmp_path)) == sorted([upcoming, "f"])


def test_a_lease_is_created_in_a_directory_whose_parents_are_missing(tmp_path):
    store = LocalStore()
    deep = tmp_path / "a" / "b" / "c"
    assert store.compare_and_swap(str(deep / ".executor_status.lock"), None, b"mine")
    assert (deep / ".executor_status.lock").read_bytes() == b"mine"
    shallow = tmp_path / "d"  # the usual case: the parent exists, the step's directory not
    assert store.compare_and_swap(str(shallow / ".executor_status.lock"), None, b"mine")
    assert not store.compare_and_swap(str(shallow / ".executor_status.lock"), None, b"other")


def test_a_new_steps_lease_directory_is_made_before_it_is_opened(tmp_path, monkeypatch):
    """A cold step's directory does not exist when its lease is created: it is made first, so
    the directory is opened (for its lock) once, not first tried and missed."""
    opened: list[tuple[str, str]] = []
    real_open = os.open

    def recording_open(path, flags, *args, **kwargs):
        try:
            fd = real_open(path, flags, *args, **kwargs)
        except OSError as error:
            opened.append((str(path), type(error).__name__))
            raise
        opened.append((str(path), "ok"))
        return fd

    monkeypatch.setattr(os, "open", recording_open)
    directory = tmp_path / "step-abc"
    assert LocalStore().compare_and_swap(str(directory / ".executor_status.lock"), None, b"mine")
    monkeypatch.undo()
    assert [outcome for path, outcome in opened if path == str(directory)] == ["ok"]
    assert (directory / ".executor_status.lock").read_bytes() == b"mine"


def test_a_keeper_killed_between_messages_is_replaced_and_the_lease_still_kept(tmp_path):
    """Liveness is asked at most once a second; a keeper that died meanwhile is found by the
    next message (a broken pipe, or no "ready" line when it died before saying it was up, as it
    does here when this test runs first), which then goes to a new keeper (not to our thread)."""
    keeper = shared_keeper(str(tmp_path))
    assert keeper.alive()
    os.kill(keeper.pid, signal.SIGKILL)
    keeper.wait(timeout=10)
    assert keeper.usable()  # seen running under a second ago: not asked again yet
    manager = LeaseManager(
        LocalStore(), LeaseConfig(heartbeat_interval=0.2, timeout=5), "host:1:w", keeper_prefix=str(tmp_path)
    )
    output = str(tmp_path / "step")
    try:
        assert manager.try_acquire(output).acquired
        replacement = lease_keeper._KEEPERS["file"]
        assert replacement is not keeper and replacement.alive() and not keeper.usable()
        assert manager._thread is None  # the lease went to the new keeper, not to a thread
        written = os.stat(lease_path(output)).st_mtime
        stop = threading.Event()
        stop.wait(0.8)
        assert os.stat(lease_path(output)).st_mtime > written  # the new keeper refreshes it
        append_status(manager.store, output, Status.SUCCESS, None, manager.worker_id)
    finally:
        manager.release(output)
        manager.close()
    assert not os.path.exists(lease_path(output)) and os.path.exists(status_path(output))


def test_the_local_status_reader_names_the_file_it_refuses_or_cannot_read(tmp_path, monkeypatch):
    """A link in the status file's place (here a loop) is refused as a status file error naming
    it; a read that fails (EIO) is a StoreError naming it, as the general reader says -- never
    a bare OSError."""
    import errno

    from executor.store import StoreError
    from executor.tree import StatusFileError

    output = tmp_path / "step"
    output.mkdir()
    os.symlink(".executor_status", output / ".executor_status")
    with pytest.raises(StatusFileError, match=r"step/\.executor_status.*symbolic link"):
        read_last_status_local(LocalStore(), str(output))
    os.remove(output / ".executor_status")
    (output / ".executor_status").write_text('{"date": "", "status": "SUCCESS"}\n')

    def failing_read(fd, size):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "read", failing_read)
    with pytest.raises(StoreError, match=r"cannot read .*step/\.executor_status.*Input/output error"):
        read_last_status_local(LocalStore(), str(output))


def test_a_dataclass_seen_before_encodes_its_fields_as_the_first_time():
    """`encode` takes a shortcut for leaf fields of a dataclass type it has seen; a field
    that is no plain leaf (a non-finite float, an enum, a nested value) still goes the long way."""
    import dataclasses
    import enum

    from executor.fingerprint import UnencodableValueError, encode

    class Colour(enum.Enum):
        RED = "red"

    @dataclasses.dataclass(frozen=True)
    class Point:
        x: object
        y: object = None

    for _ in range(2):  # the first call registers the type, the second takes the shortcut
        assert encode(Point(1, "a")) == {"__type__": Point.__qualname__, "x": 1, "y": "a"}
        assert encode(Point(True, None)) == {"__type__": Point.__qualname__, "x": True, "y": None}
        assert encode(Point(float("inf")), strict=False)["x"] == "inf"
        with pytest.raises(UnencodableValueError, match="x"):
            encode(Point(float("nan")))
        assert encode(Point(Colour.RED))["x"] == encode(Colour.RED)
        assert encode(Point([1, (2, 3)]))["x"] == [1, [2, 3]]
        assert encode(Point((1, 2), {"k": (3,)})) == {
            "__type__": Point.__qualname__,
            "x": [1, 2],
            "y": {"k": [3]},
        }


# -- records made without __init__ (executor.records, eighth session) -----------------------


def _same_record(fast, slow) -> None:
    """`fast` is what the constructor makes: every field and nothing more, equal, frozen."""
    import dataclasses

    assert type(fast) is type(slow)
    assert not hasattr(type(fast), "__post_init__")  # `record` would skip it
    assert set(vars(fast)) == {f.name for f in dataclasses.fields(fast)} == set(vars(slow))
    assert fast == slow and repr(fast) == repr(slow)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(fast, dataclasses.fields(fast)[0].name, None)


def test_a_cached_steps_records_are_what_their_constructors_make(tmp_path):
    """The status event, plan row and two events a cached step gets are built by `record`."""
    from executor.events import StepPlanned, StepSkipped
    from executor.plan import Action, PlannedStep
    from executor.tree import StatusEvent

    output = tmp_path / "step-0"
    output.mkdir()
    (output / ".executor_status").write_text(OUR_SUCCESS + "\n")
    extra = {"config_digest": "a" * 64, "duration_s": 0.5, "version_hash": "b" * 64}
    _same_record(
        read_last_status(LocalStore(), str(output)),
        StatusEvent(date="2026-11-23T10:00:00.123Z", status=Status.SUCCESS, worker="host:1:abc", extra=extra),
    )

    prefix = str(tmp_path / "tree")
    for value in (1, 2):  # the second run changes an unversioned field: a warning on the row
        step = ExecutorStep(name="cached", fn=write_value, config=WriteConfig(this_output_path(), value))
        executor = Executor(prefix, console=False)
        (row,) = executor.run([step]).rows
    changes = row.unversioned_changes
    assert row.action == Action.SKIP and len(changes) == 1 and "value" in changes[0]
    _same_record(
        row,
        PlannedStep(row.step, Action.SKIP, "already succeeded", Status.SUCCESS, unversioned_changes=changes),
    )
    planned = [event for event in executor.events if type(event) is StepPlanned]
    skipped = [event for event in executor.events if type(event) is StepSkipped]
    assert len(planned) == len(skipped) == 1
    expected = StepPlanned(
        "cached", row.output_path, action="skip", reason="already succeeded", time=planned[0].time
    )
    _same_record(planned[0], expected)
    _same_record(
        skipped[0], StepSkipped("cached", row.output_path, reason="already succeeded", time=skipped[0].time)
    )


def test_a_resolved_step_is_what_its_constructor_makes(tmp_path):
    """`resolve` builds each ResolvedStep with `record`: every field, nothing more, frozen (the
    class compares by identity, so field by field here)."""
    import dataclasses

    from executor import mirrored, output_path_of
    from executor.graph import ResolvedStep

    first = ExecutorStep(name="first", fn=write_value, config=WriteConfig(this_output_path(), versioned(1)))
    other = ExecutorStep(name="other", fn=write_value, config=WriteConfig(this_output_path(), 2))
    value = [output_path_of(first), other.nonblocking(), mirrored("raw/data", budget_gb=1)]
    last = ExecutorStep(name="last", fn=write_value, config=WriteConfig(this_output_path(), value))
    resolved = resolve([last], str(tmp_path)).steps
    assert [step.name for step in resolved] == ["first", "other", "last"]
    assert resolved[2].blocking_deps == (resolved[0].output_path,)
    assert resolved[2].nonblocking_deps == (resolved[1].output_path,) and resolved[2].mirrors
    assert not hasattr(ResolvedStep, "__post_init__")  # `record` would skip it
    for step in resolved:
        made = ResolvedStep(**{field.name: getattr(step, field.name) for field in dataclasses.fields(step)})
        # (`resolve` digests a config it can encode without building it: a cached value)
        assert {name: value for name, value in vars(step).items() if name != "config_digest"} == vars(made)
        assert repr(step) == repr(made) and step.config_digest == made.config_digest
        with pytest.raises(dataclasses.FrozenInstanceError):
            step.name = "renamed"


def test_our_success_line_of_another_version_with_the_same_config_is_a_collision(tmp_path):
    """The plan's fast path compares both hashes of our SUCCESS line: a line in our exact
    format whose config digest matches but whose version hash does not is refused as a hash
    collision, not reused."""
    from executor.graph import StepDefinitionError

    prefix = str(tmp_path)
    step = ExecutorStep(name="same", fn=write_value, config=WriteConfig(this_output_path(), versioned(1)))
    Executor(prefix, console=False).run([step])
    (resolved,) = resolve([step], prefix).steps
    store = LocalStore()
    line = append_status(
        store,
        resolved.output_path,
        Status.SUCCESS,
        None,
        "host:1:abc",
        duration_s=0.5,
        version_hash="f" * 64,
        config_digest=resolved.config_digest,
    )
    assert isinstance(read_last_status_local(store, resolved.output_path), OurSuccessLine)  # the fast path
    assert line.extra["config_digest"] == resolved.config_digest
    with pytest.raises(StepDefinitionError, match="hash collision"):
        Executor(prefix, console=False).run([step], dry_run=True)
