"""The executor's fast paths give exactly what the general code gives.

Each fast path below exists for speed on large DAGs (docs/benchmarks.md); these tests pin
that it changes no byte written and no value read.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from executor import Executor, ExecutorStep, this_output_path, versioned
from executor.fingerprint import dumps_sorted
from executor.lease import LeaseConfig, LeaseManager
from executor.store import LocalStore
from executor.tree import (
    LeaseRecord,
    Status,
    StatusEvent,
    append_status,
    info_json,
    lease_path,
    read_status,
    utc_now_iso,
)
from tests.executor.steps_for_tests import WriteConfig, write_value

VALUES = [
    {"b": 1, "a": [1.5, 'é\n"', None, True, False], "c": {"z": -3, "y": 1e300}},
    "plain",
    "ünïcode",
    0,
    -7,
    2.5,
    None,
    [],
    {},
    {"nan": float("nan"), "inf": float("inf")},
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_dumps_sorted_is_json_dumps_with_sorted_keys(value):
    assert dumps_sorted(value) == json.dumps(value, sort_keys=True)


def test_dumps_sorted_refuses_what_json_refuses():
    with pytest.raises(TypeError):
        dumps_sorted({"x": object()})


def test_info_json_is_one_sorted_field_per_line_and_parses_back():
    record = {"name": "a/b", "config": {"z": 1, "a": "é"}, "version": {"name": "a/b"}, "run": {}}
    text = info_json(record)
    assert json.loads(text) == record
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}"
    assert lines[1:-1] == [
        '  "config": {"a": "\\u00e9", "z": 1},',
        '  "name": "a/b",',
        '  "run": {},',
        '  "version": {"name": "a/b"}',
    ]


def _general_parse(line: str) -> StatusEvent:
    record = json.loads(line)
    return StatusEvent(
        date=record.pop("date"),
        status=Status(record.pop("status")),
        message=record.pop("message"),
        worker=record.pop("worker"),
        extra=record,
    )


@pytest.mark.parametrize("duration", [0.0, 0.001, 12.5, 3, 123456.789])
def test_our_success_line_parses_like_json(tmp_path, duration):
    store = LocalStore()
    append_status(
        store,
        str(tmp_path),
        Status.SUCCESS,
        None,
        "host-1.example:123:ab12cd34",
        duration_s=duration,
        version_hash="a" * 64,
        config_digest="0123456789abcdef" * 4,
    )
    line = (tmp_path / ".executor_status").read_text().splitlines()[-1]
    event = StatusEvent.from_json(line)
    expected = _general_parse(line)
    assert event == expected
    assert list(event.extra) == list(expected.extra)
    assert type(event.extra["duration_s"]) is type(expected.extra["duration_s"])


@pytest.mark.parametrize(
    "change",
    [
        ('"message": null', '"message": "done"'),  # a message: general path
        ('"worker": "w1"', '"worker": "w\\u00fc"'),  # an escape in a string
        ('"version_hash": "' + "a" * 64, '"version_hash": "' + "A" * 64),  # not lower-case hex
        ('"status": "SUCCESS"', '"status": "FAILED"'),
    ],
)
def test_other_lines_take_the_general_parse(change):
    line = json.dumps(
        {
            "config_digest": "b" * 64,
            "date": "2026-01-01T00:00:00.000Z",
            "duration_s": 0.5,
            "message": None,
            "status": "SUCCESS",
            "version_hash": "a" * 64,
            "worker": "w1",
        },
        sort_keys=True,
    )
    assert change[0] in line
    line = line.replace(*change)
    assert StatusEvent.from_json(line) == _general_parse(line)


def test_a_bad_field_in_a_success_like_line_is_still_refused():
    line = (
        '{"config_digest": 5, "date": "2026-01-01T00:00:00.000Z", "duration_s": 0.5, '
        '"message": null, "status": "SUCCESS", "version_hash": "' + "a" * 64 + '", "worker": "w"}'
    )
    with pytest.raises(ValueError, match="config_digest"):
        StatusEvent.from_json(line)


def test_append_adds_the_missing_newline_after_someone_else_rewrote_the_file(tmp_path):
    store = LocalStore()
    append_status(store, str(tmp_path), Status.RUNNING, None, "w")
    path = tmp_path / ".executor_status"
    path.write_text("SUCCESS")  # another tool rewrote it, without a final newline
    append_status(store, str(tmp_path), Status.FAILED, "boom", "w")
    events = read_status(store, str(tmp_path))
    assert [event.status for event in events] == [Status.SUCCESS, Status.FAILED]


def test_append_after_our_own_line_writes_exactly_one_line_each(tmp_path):
    store = LocalStore()
    for status in (Status.RUNNING, Status.FAILED, Status.RUNNING, Status.SUCCESS):
        append_status(store, str(tmp_path), status, None, "w")
    text = (tmp_path / ".executor_status").read_text()
    assert text.count("\n") == 4 and text.endswith("\n") and "\n\n" not in text


def test_utc_now_iso_matches_strftime_across_second_boundaries():
    for moment in (0.5, 1795394134.999, 1795394135.0, 1795394135.001, 1795394134.25, 86399.9999):
        expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment)) + f".{int(moment % 1 * 1000):03d}Z"
        assert utc_now_iso(moment) == expected


def _manager(tmp_path) -> LeaseManager:
    config = LeaseConfig(heartbeat_interval=5.0, timeout=10.0, poll_interval=0.05)
    return LeaseManager(LocalStore(), config, worker_id="me")


def test_expect_absent_does_not_take_a_live_lease(tmp_path):
    other = LeaseRecord(worker="other", heartbeat=time.time())
    (tmp_path / ".executor_status.lock").write_bytes(other.to_bytes())
    manager = _manager(tmp_path)
    try:
        result = manager.try_acquire(str(tmp_path), expect_absent=True)
    finally:
        manager.close()
    assert not result.acquired
    assert result.holder is not None and result.holder.worker == "other"
    assert LeaseRecord.parse((tmp_path / ".executor_status.lock").read_bytes()).worker == "other"


def test_expect_absent_still_takes_over_a_stale_lease(tmp_path):
    stale = LeaseRecord(worker="dead", heartbeat=time.time() - 3600)
    (tmp_path / ".executor_status.lock").write_bytes(stale.to_bytes())
    manager = _manager(tmp_path)
    try:
        result = manager.try_acquire(str(tmp_path), expect_absent=True)
        assert result.acquired and result.holder is not None and result.holder.worker == "dead"
        assert LeaseRecord.parse((tmp_path / ".executor_status.lock").read_bytes()).worker == "me"
        manager.release(str(tmp_path))
    finally:
        manager.close()
    assert not (tmp_path / ".executor_status.lock").exists()


def test_expect_absent_creates_the_lease_and_its_directory(tmp_path):
    output = tmp_path / "new" / "step-1"
    manager = _manager(tmp_path)
    try:
        assert manager.try_acquire(str(output), expect_absent=True).acquired
        record = LeaseRecord.parse((output / ".executor_status.lock").read_bytes())
        assert record.worker == "me"
    finally:
        manager.close()


def test_streams_are_wrapped_during_a_run_and_restored_after(tmp_path):
    before = (sys.stdout, sys.stderr)
    seen = []

    def look(config):
        seen.append(type(sys.stdout).__name__)
        print("hello from the step")

    step = ExecutorStep(
        name="look", fn=look, config=WriteConfig(output_path=this_output_path(), value=versioned("x"))
    )
    Executor(str(tmp_path), console=False).run([step])
    assert seen == ["_TeeStream"]
    assert (sys.stdout, sys.stderr) == before
    (log,) = tmp_path.glob("look-*/.executor_log")
    assert "hello from the step" in log.read_text()


def count_store_reads(monkeypatch) -> list[str]:
    """Paths read through `LocalStore.read_bytes` or `read_tail` (leases, info; not statuses)."""
    seen: list[str] = []
    original, original_tail = LocalStore.read_bytes, LocalStore.read_tail

    def counting(self, path):
        seen.append(path)
        return original(self, path)

    def counting_tail(self, path, limit):
        seen.append(path)
        return original_tail(self, path, limit)

    monkeypatch.setattr(LocalStore, "read_bytes", counting)
    monkeypatch.setattr(LocalStore, "read_tail", counting_tail)
    return seen


def count_status_reads(monkeypatch) -> list[str]:
    """Output paths whose status the plan and the runner read (through `read_last_status`)."""
    import executor.plan
    import executor.runner

    seen: list[str] = []

    def counted(original):
        def counting(store, output_path):
            seen.append(output_path)
            return original(store, output_path)

        return counting

    monkeypatch.setattr(executor.plan, "read_last_status", counted(executor.tree.read_last_status))
    # The plan's reader for local trees (it falls back to read_last_status, counted once here).
    monkeypatch.setattr(
        executor.plan, "read_last_status_local", counted(executor.tree.read_last_status_local)
    )
    monkeypatch.setattr(executor.runner, "read_last_status", counted(executor.tree.read_last_status))
    return seen


def test_the_runner_reads_nothing_it_does_not_need_on_a_cold_step(tmp_path, monkeypatch):
    """A cold step's lease is never read: the plan sees from one listing of the parent that the
    step's directory does not exist, the runner creates the lease without reading it first,
    and confirms and releases it without reading it (it is younger than a heartbeat interval).
    Its status is read once, after the lease is taken."""
    reads = count_store_reads(monkeypatch)
    status_reads = count_status_reads(monkeypatch)
    step = ExecutorStep(
        name="cold", fn=write_value, config=WriteConfig(output_path=this_output_path(), value=versioned("x"))
    )
    executor = Executor(str(tmp_path), console=False)
    executor.run([step])
    output = executor.output_paths[step]
    assert [path for path in reads if path.startswith(output)] == []  # (statuses: tree.read_last_status)
    assert status_reads == [output]


def test_a_cached_rerun_prints_the_plan_and_no_line_per_skipped_step(tmp_path, capfd):
    steps = [
        ExecutorStep(
            name=f"s{i}",
            fn=write_value,
            config=WriteConfig(output_path=this_output_path(), value=versioned(i)),
        )
        for i in range(3)
    ]
    Executor(str(tmp_path)).run(steps)
    capfd.readouterr()
    Executor(str(tmp_path)).run(steps)
    out = capfd.readouterr().out
    assert "Plan: 3 steps (3 skip)" in out
    assert "] skip" not in out  # the plan already lists them
    assert "0 ran, 3 cached, 0 failed" in out.splitlines()[-1]


def test_planned_skips_count_as_done_without_a_line():
    import io

    from executor.console import ConsoleProgress
    from executor.events import StepSkipped, StepStarted

    stream = io.StringIO()
    console = ConsoleProgress(total=3, stream=stream, planned_skips=["/p/a"])
    console(StepSkipped("a", "/p/a", reason="already succeeded"))
    console(StepStarted("b", "/p/b", log_path="/p/b/.executor_log"))
    console(StepSkipped("c", "/p/c", reason="finished by another driver"))
    assert stream.getvalue().splitlines() == [
        "[1/3 done, 1 running, 1 left] start  b  (log: /p/b/.executor_log)",
        "[2/3 done, 1 running, 0 left] skip   c  (finished by another driver)",
    ]


def test_the_plan_reads_neither_status_nor_lease_of_a_step_whose_directory_is_absent(tmp_path, monkeypatch):
    """One listing per parent directory tells the plan which steps have no directory yet;
    a step whose directory exists (here: left by a crashed run, with a stale lease) is read."""
    steps = [
        ExecutorStep(
            name=f"group/s{i}",
            fn=write_value,
            config=WriteConfig(output_path=this_output_path(), value=versioned(i)),
        )
        for i in range(3)
    ]
    executor = Executor(str(tmp_path), console=False)
    plan = executor.run(steps, dry_run=True)
    crashed = plan.rows[1].output_path
    old = LeaseRecord(worker="gone", heartbeat=time.time() - 3600)
    executor.store.write_atomic(lease_path(crashed), old.to_bytes())
    reads = count_store_reads(monkeypatch)
    status_reads = count_status_reads(monkeypatch)
    plan = executor.run(steps, dry_run=True)
    assert [row.reason.split(" (")[0] for row in plan.rows] == [
        "no output yet",
        "stale lease of gone",
        "no output yet",
    ]
    assert reads == [lease_path(crashed)] and status_reads == [crashed]


CACHED_RERUN_SCRIPT = """
import sys
from dataclasses import dataclass

from executor import Executor, ExecutorStep, this_output_path, versioned


@dataclass(frozen=True)
class Config:
    index: int
    output_path: str


def touch(config):
    import os
    os.makedirs(config.output_path, exist_ok=True)


steps = [
    ExecutorStep(name=f"s{i}", fn=touch, config=Config(versioned(i), this_output_path()))
    for i in range(3)
]
events = []
Executor(sys.argv[1], console=False, listeners=[events.append]).run(steps)
print(repr(("executor.runner" in sys.modules, [type(event).__name__ for event in events][3:])))
"""


def test_a_cached_rerun_reports_without_loading_the_runner(tmp_path):
    """Every step cached: the same events as the runner's (one StepSkipped each, RunFinished),
    from `outcomes.skip_all`; the runner's modules are never imported."""
    import ast
    import subprocess

    script = tmp_path / "experiment.py"
    script.write_text(CACHED_RERUN_SCRIPT)
    prefix = str(tmp_path / "out")

    def run() -> tuple[bool, list[str]]:
        done = subprocess.run(
            [sys.executable, str(script), prefix], capture_output=True, text=True, check=True
        )
        return ast.literal_eval(done.stdout.strip().splitlines()[-1])

    loaded, events = run()
    assert loaded and sorted(events) == sorted(["StepStarted", "StepSucceeded"] * 3 + ["RunFinished"])
    assert run() == (False, ["StepSkipped"] * 3 + ["RunFinished"])


def test_skip_all_refuses_a_plan_with_steps_to_run(tmp_path):
    from executor.outcomes import skip_all

    step = ExecutorStep(
        name="a", fn=write_value, config=WriteConfig(value=versioned(1), output_path=this_output_path())
    )
    plan = Executor(str(tmp_path), console=False).run([step], dry_run=True)
    events = []
    with pytest.raises(ValueError, match="1 step\\(s\\) are not cached"):
        skip_all(plan.rows, events.append)


def test_skip_all_reports_what_the_runner_reports_for_a_cached_plan(tmp_path):
    """Same outcomes and the same event sequence (types, fields but time) as `Runner.run`."""
    from executor.events import RunFinished
    from executor.outcomes import Outcome, skip_all
    from executor.runner import Runner

    steps = [
        ExecutorStep(
            name=f"s{i}",
            fn=write_value,
            config=WriteConfig(value=versioned(i), output_path=this_output_path()),
        )
        for i in range(3)
    ]
    executor = Executor(str(tmp_path), console=False)
    executor.run(steps)
    plan = executor.run(steps, dry_run=True)
    ours, theirs = [], []
    summary = skip_all(plan.rows, ours.append)
    leases = LeaseManager(LocalStore(), LeaseConfig(), "worker")
    runner_summary = Runner(plan, LocalStore(), leases, theirs.append).run()
    assert (
        summary.outcomes == runner_summary.outcomes == {row.output_path: Outcome.SKIPPED for row in plan.rows}
    )
    assert summary.failures == runner_summary.failures == []

    def without_time(event):
        fields = dict(vars(event))
        fields.pop("time")
        fields.pop("duration", None)
        return type(event).__name__, fields

    assert [without_time(e) for e in ours] == [without_time(e) for e in theirs]
    assert isinstance(ours[-1], RunFinished) and (ours[-1].skipped, ours[-1].succeeded, ours[-1].failed) == (
        3,
        0,
        0,
    )


def test_a_cached_rerun_lists_no_directory_and_a_cold_run_lists_each_parent_once(tmp_path, monkeypatch):
    listed = []
    original = LocalStore.child_names
    monkeypatch.setattr(
        LocalStore, "child_names", lambda self, path: listed.append(path) or original(self, path)
    )
    steps = [
        ExecutorStep(
            name=f"{group}/s{i}",
            fn=write_value,
            config=WriteConfig(output_path=this_output_path(), value=versioned(i)),
        )
        for group in ("a", "b")
        for i in range(3)
    ]
    Executor(str(tmp_path), console=False).run(steps)
    assert sorted(listed) == [f"{tmp_path}/a", f"{tmp_path}/b"]
    listed.clear()
    Executor(str(tmp_path), console=False).run(steps)
    assert listed == []
