"""A tree written by Marin's executor plans without errors (issue 12 item 3).

Marin writes `.executor_status` as one word (`SUCCESS`; older versions a JSON-lines log
that includes `WAITING`) and its lease `.executor_status.lock` as
`{"worker_id": ..., "timestamp": ...}`, refreshed every 30 s and stale after 90 s. The
files below are written byte for byte as Marin's `StatusFile` writes them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass

import pytest

from executor import Executor, ExecutorStep, LeaseConfig, this_output_path, versioned
from executor.graph import resolve
from executor.plan import Action
from executor.store import open_store
from executor.tree import (
    LeaseRecord,
    Status,
    lease_path,
    read_status,
    recorded_config,
    split_config_types,
    status_path,
)
from tests.executor.steps_for_tests import WriteConfig, write_value

LEASES = LeaseConfig(heartbeat_interval=5.0, timeout=90.0, poll_interval=0.05)


def step(name: str) -> ExecutorStep:
    return ExecutorStep(name, write_value, WriteConfig(output_path=this_output_path(), value=versioned(name)))


def output_of(prefix: str, declared: ExecutorStep) -> str:
    return resolve([declared], prefix).resolved(declared).output_path


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def read_json(path: str) -> dict:
    with open(path) as handle:
        return json.load(handle)


def marin_lease(worker: str, timestamp: float) -> str:
    return json.dumps({"worker_id": worker, "timestamp": timestamp})  # Marin: json.dumps(asdict(Lease))


def plan_rows(prefix: str, steps: list[ExecutorStep]) -> dict[str, tuple[Action, str]]:
    plan = Executor(prefix, console=False, lease_config=LEASES).run(steps, dry_run=True)
    return {row.name: (row.action, row.reason) for row in plan.rows}


@pytest.mark.parametrize(
    ("status_text", "action", "reason"),
    [
        ("SUCCESS", Action.SKIP, "already succeeded"),
        ("FAILED", Action.RUN, "failed before"),
        ("DEP_FAILED", Action.RUN, "a dependency failed"),
        ("RUNNING", Action.RUN, "did not finish"),
        (
            '{"date": "2025-01-01T00:00:00", "status": "WAITING", "message": null}\n',
            Action.RUN,
            "never started",
        ),
        (
            '{"date": "2025-01-01T00:00:00", "status": "WAITING"}\n'
            '{"date": "2025-01-01T00:01:00", "status": "RUNNING"}\n'
            '{"date": "2025-01-01T00:02:00", "status": "SUCCESS"}\n',
            Action.SKIP,
            "already succeeded",
        ),
    ],
    ids=["word-success", "word-failed", "word-dep-failed", "word-running", "legacy-waiting", "legacy-log"],
)
def test_every_status_marin_writes_plans_without_error(tmp_path, status_text, action, reason):
    prefix = str(tmp_path)
    declared = step("marin/step")
    write(status_path(output_of(prefix, declared)), status_text)
    got_action, got_reason = plan_rows(prefix, [declared])["marin/step"]
    assert got_action == action and reason in got_reason, got_reason


def test_a_waiting_status_is_read_as_such(tmp_path):
    prefix = str(tmp_path)
    declared = step("marin/waiting")
    write(status_path(output_of(prefix, declared)), '{"date": "2025-01-01T00:00:00", "status": "WAITING"}\n')
    (event,) = read_status(open_store(prefix), output_of(prefix, declared))
    assert event.status == Status.WAITING


def test_a_live_marin_lease_is_respected_and_a_stale_one_taken_over(tmp_path):
    prefix = str(tmp_path)
    live, stale = step("marin/live"), step("marin/stale")
    for declared, age in ((live, 10.0), (stale, 300.0)):
        output = output_of(prefix, declared)
        write(status_path(output), "RUNNING")
        write(lease_path(output), marin_lease("marin-host-140234", time.time() - age))
    rows = plan_rows(prefix, [live, stale])
    assert rows["marin/live"][0] == Action.WAIT and "held by marin-host-140234" in rows["marin/live"][1]
    assert (
        rows["marin/stale"][0] == Action.RUN and "stale lease of marin-host-140234" in rows["marin/stale"][1]
    )


@pytest.mark.parametrize(
    "text",
    [
        '{"worker_id": 3, "timestamp": 1.0}',
        '{"worker_id": "w", "timestamp": "soon"}',
        '{"worker_id": "w", "timestamp": NaN}',
    ],
)
def test_a_malformed_marin_lease_reads_as_no_lease(text):
    assert LeaseRecord.parse(text.encode()) is None


def test_marin_lease_fields_map_to_ours():
    record = LeaseRecord.parse(marin_lease("w-1", 1234.5).encode())
    assert record == LeaseRecord(worker="w-1", heartbeat=1234.5)


@dataclass
class MarinLease:
    """Marin's lease record and reader (rigging/filesystem/distributed_lock.py at 12b68263):
    `Lease(**json.loads(data))`, stale once its timestamp is 90 s old."""

    worker_id: str
    timestamp: float

    def is_stale(self, now: float) -> bool:
        return now - self.timestamp > 90.0


@dataclass(frozen=True)
class LeaseSeen:
    output_path: str
    key: str = versioned("seen")


def record_own_lease(config: LeaseSeen) -> None:
    """A step that copies the lease file it runs under into its output."""
    with open(lease_path(config.output_path), "rb") as handle:
        seen = handle.read()
    write(os.path.join(config.output_path, "lease_seen"), seen.decode())


@pytest.mark.parametrize("keeper", [True, False], ids=["keeper-process", "thread"])
def test_marins_reader_reads_the_lease_of_a_running_step(tmp_path, keeper):
    """Marin's executor, looking at a step we run, sees a live lease (and so waits)."""
    declared = ExecutorStep("ours/running", record_own_lease, LeaseSeen(output_path=this_output_path()))
    leases = LeaseConfig(heartbeat_interval=0.05, timeout=90.0, poll_interval=0.05, heartbeat_process=keeper)
    executor = Executor(str(tmp_path), console=False, lease_config=leases)
    executor.run([declared])
    with open(os.path.join(executor.output_paths[declared], "lease_seen")) as handle:
        seen = json.load(handle)
    lease = MarinLease(**seen)
    assert not lease.is_stale(time.time())
    assert LeaseRecord(worker=lease.worker_id, heartbeat=0).pid == os.getpid()


def test_a_refreshed_lease_keeps_marins_form():
    """The keeper (and a heavy step's heartbeat process) rewrite the lease from its bytes."""
    from executor.lease_keeper import with_fresh_heartbeat

    before = time.time()
    refreshed = with_fresh_heartbeat(LeaseRecord(worker="h:1:ab", heartbeat=1.0).to_bytes())
    lease = MarinLease(**json.loads(refreshed))
    assert lease.worker_id == "h:1:ab" and lease.timestamp >= before
    assert refreshed == LeaseRecord(worker="h:1:ab", heartbeat=lease.timestamp).to_bytes()


# -- .executor_info: config as `dataclasses.asdict` gives it, dependencies as output paths ----------


@dataclass(frozen=True)
class Optimizer:
    learning_rate: float = 0.1
    betas: tuple = (0.9, 0.95)


@dataclass(frozen=True)
class Nested:
    output_path: str
    input_path: str
    optimizer: Optimizer
    schedule: list
    label: str = "x"


def read_nothing(config: Nested) -> None:
    os.makedirs(config.output_path, exist_ok=True)


def nested_steps() -> tuple[ExecutorStep, ExecutorStep]:
    up = step("up")
    down = ExecutorStep(
        "down",
        read_nothing,
        Nested(
            output_path=this_output_path(),
            input_path=up / "value.json",
            optimizer=versioned(Optimizer()),
            schedule=[Optimizer(0.5), {"warmup": 10}],
        ),
    )
    return up, down


def test_the_recorded_config_is_what_dataclasses_asdict_gives(tmp_path):
    """Marin's ExecutorStepInfo records `asdict(config)` (tuples as JSON lists) and the
    upstream output paths; the class names go to `config_types`, beside it."""
    up, down = nested_steps()
    executor = Executor(str(tmp_path), console=False, lease_config=LEASES)
    executor.run([down])
    graph = resolve([down], str(tmp_path))
    info = read_json(os.path.join(graph.resolved(down).output_path, ".executor_info"))
    concrete = graph.resolved(down).config
    assert info["config"] == json.loads(json.dumps(dataclasses.asdict(concrete)))
    assert info["dependencies"] == [graph.resolved(up).output_path]
    assert info["config_types"] == {"": "Nested", "optimizer": "Optimizer", "schedule[0]": "Optimizer"}


def test_the_class_names_come_back_for_comparisons():
    up, down = nested_steps()
    record = resolve([down], "/p").resolved(down).config_record
    plain, types = split_config_types(record)
    assert recorded_config({"config": plain, "config_types": types}) == record
    assert recorded_config({"config": record}) == record  # written before config_types existed


@pytest.mark.parametrize("form", ["current", "types inline (before issue 12)"])
def test_a_reused_output_reports_only_real_unversioned_changes_whatever_its_info_form(tmp_path, form):
    """The unversioned-change warning compares the recorded config with today's: a class name
    moved to `config_types` (or still inline in an older tree) is no change; a label is."""
    up, down = nested_steps()
    prefix = str(tmp_path)
    Executor(prefix, console=False, lease_config=LEASES).run([down])
    info_file = os.path.join(resolve([down], prefix).resolved(down).output_path, ".executor_info")
    info = read_json(info_file)
    if form != "current":
        info["config"] = recorded_config(info)
        del info["config_types"]
        write(info_file, json.dumps(info))
    plan = Executor(prefix, console=False, lease_config=LEASES).run([down], dry_run=True)
    assert {row.name: row.unversioned_changes for row in plan.rows}["down"] == ()

    relabelled = ExecutorStep("down", read_nothing, dataclasses.replace(down.config, label="y"))
    plan = Executor(prefix, console=False, lease_config=LEASES).run([relabelled], dry_run=True)
    assert {row.name: row.unversioned_changes for row in plan.rows}["down"] == ("label: 'x' -> 'y'",)
