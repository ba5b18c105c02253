"""Tests that each catch one deliberate bug (see docs/testing.md for the list).

Every test here was checked by putting its bug in by hand and watching it fail: a step
used both blocking and nonblocking losing its blocking flag, the hash-collision refusal
switched off, and `executor_main` dropping `--force_run_failed` or `--max_concurrent`
on the way from the command line to the runner. No sleeps decide an outcome: where
timing is involved, the buggy order is forced with events, and the correct order is
what must happen.
"""

from __future__ import annotations

import datetime
import enum
import io
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

import executor.graph
import executor.main
import executor.provenance as provenance
import executor.tree
from executor import (
    Executor,
    ExecutorRunError,
    ExecutorStep,
    InputName,
    LeaseConfig,
    StepDefinitionError,
    executor_main,
    get_executor_step,
    output_path_of,
    this_output_path,
    unwrap_versioned_value,
    versioned,
)
from executor.console import ConsoleProgress
from executor.diffing import FieldChange, diff_flat, diff_versions, flatten
from executor.events import RunFinished, StepFailed, StepSkipped, StepStarted, StepSucceeded, StepWaiting
from executor.fingerprint import UnencodableValueError, canonical_json, encode, sha256_hex
from executor.lease import LeaseManager
from executor.plan import Plan
from executor.store import open_store
from executor.template import TemplateError, TrustedCode, decode_template, encode_template
from executor.tree import Status, append_status, lease_path, read_status
from tests.executor.steps_for_tests import CALLS, WriteConfig, fail, write_value


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()


def write_step(name: str, value: Any = 0, fn=write_value, key: str | None = None) -> ExecutorStep:
    return ExecutorStep(
        name=name,
        fn=fn,
        config=WriteConfig(output_path=this_output_path(), value=versioned(value), key=key or name),
    )


# -- a step used both blocking and nonblocking is waited for ---------------------------


@dataclass(frozen=True)
class TwoRefsConfig:
    output_path: Any
    first: Any
    second: Any


UP_STARTED_DOWN = threading.Event()
"""Set by the downstream step when it starts; the upstream waits for it (briefly)."""


def slow_upstream(config: WriteConfig) -> None:
    # If the downstream (wrongly) runs alongside, it starts now, finds no output yet,
    # and fails; if it waits for us as it must, this wait just times out.
    UP_STARTED_DOWN.wait(timeout=0.3)
    write_value(config)


def read_both(config: TwoRefsConfig) -> None:
    seen = [os.path.exists(f"{path}/value.json") for path in (config.first, config.second)]
    UP_STARTED_DOWN.set()
    if not all(seen):
        raise RuntimeError(f"the upstream output was not there when the step started: {seen}")
    os.makedirs(config.output_path, exist_ok=True)
    with open(f"{config.output_path}/value.json", "w") as handle:
        json.dump(seen, handle)


NONBLOCKING_SPELLINGS = {  # step.nonblocking(), output_path_of(step).nonblocking(), InputName(...).nonblocking()
    "step": lambda step: step.nonblocking(),
    "output_path_of": lambda step: output_path_of(step).nonblocking(),
    "InputName": lambda step: InputName(step, None).nonblocking(),
}


@pytest.mark.parametrize("spelling", sorted(NONBLOCKING_SPELLINGS))
@pytest.mark.parametrize("blocking_first", [True, False], ids=["blocking-first", "nonblocking-first"])
@pytest.mark.parametrize("roots", ["down", "up-and-down"])
def test_a_step_used_both_blocking_and_nonblocking_is_waited_for(tmp_path, spelling, blocking_first, roots):
    UP_STARTED_DOWN.clear()
    up = write_step("up", 1, fn=slow_upstream)
    refs = [output_path_of(up), NONBLOCKING_SPELLINGS[spelling](up)]
    if not blocking_first:
        refs.reverse()
    down = ExecutorStep("down", read_both, TwoRefsConfig(this_output_path(), refs[0], refs[1]))
    run = Executor(str(tmp_path), console=False)

    run.run([down] if roots == "down" else [up, down])

    order = [(type(e).__name__, e.name) for e in run.events if isinstance(e, (StepStarted, StepSucceeded))]
    assert order == [
        ("StepStarted", "up"),
        ("StepSucceeded", "up"),
        ("StepStarted", "down"),
        ("StepSucceeded", "down"),
    ]
    assert CALLS == {"up": 1}


# -- hash collisions are refused ---------------------------------------------------------


@pytest.fixture
def colliding_hashes(monkeypatch):
    """Every version hash starts with 00000000: two versions of a name share an output path."""

    def colliding(text: str) -> str:
        return "00000000" + sha256_hex(text)[8:]

    monkeypatch.setattr(executor.graph, "sha256_hex", colliding)


def test_a_stored_output_of_another_version_at_the_same_path_is_refused(tmp_path, colliding_hashes):
    first = Executor(str(tmp_path), console=False)
    first.run([write_step("s", 1)])
    path = first.output_paths[first.steps[0]]
    assert path.endswith("/s-00000000")
    before = Path(path, "value.json").read_text()

    second = Executor(str(tmp_path), console=False)
    with pytest.raises(StepDefinitionError, match="collision") as refused:
        second.run([write_step("s", 2)])

    assert path in str(refused.value)
    assert CALLS == {"s": 1}  # the colliding version never ran...
    assert Path(path, "value.json").read_text() == before  # ...nor touched the stored output
    assert [e.status for e in read_status(first.store, path)] == [Status.RUNNING, Status.SUCCESS]


def test_the_same_version_at_the_same_path_is_still_reused(tmp_path, colliding_hashes):
    Executor(str(tmp_path), console=False).run([write_step("s", 1)])
    Executor(str(tmp_path), console=False).run([write_step("s", 1)])
    assert CALLS == {"s": 1}


def test_two_versions_colliding_in_one_run_are_refused(tmp_path, colliding_hashes):
    with pytest.raises(StepDefinitionError, match="different versions"):
        Executor(str(tmp_path), console=False).run([write_step("s", 1), write_step("s", 2)])
    assert CALLS == {}


# -- executor_main passes its flags through ----------------------------------------------


@pytest.fixture
def cli(monkeypatch, tmp_path):
    """Run `executor_main(steps)` in this process with the given flags; returns (exit code, stderr)."""
    for variable in ("MARIN_PREFIX", "MARIN_LEASE_TIMEOUT", "MARIN_LEASE_HEARTBEAT", "MARIN_LEASE_POLL"):
        monkeypatch.delenv(variable, raising=False)
    prefix = str(tmp_path / "out")

    def run(steps, *flags: str) -> int:
        monkeypatch.setattr(sys, "argv", ["experiment.py", "--prefix", prefix, *flags])
        try:
            executor_main(steps)
        except SystemExit as exit_:
            return exit_.code
        return 0

    return run


def test_force_run_failed_false_refuses_to_rerun_a_failed_step(cli, capsys):
    assert cli([write_step("flaky", fn=fail)]) == 1
    assert CALLS == {"flaky": 1}
    capsys.readouterr()

    assert cli([write_step("flaky")], "--force_run_failed", "false") == 1
    assert CALLS == {"flaky": 1}  # not run again
    assert "force_run_failed" in capsys.readouterr().err

    assert cli([write_step("flaky")], "--force_run_failed", "true") == 0
    assert CALLS == {"flaky": 2}


def test_a_dry_run_whose_plan_has_error_rows_exits_1_naming_them(cli, capsys, tmp_path):
    """A CI job checking an experiment with `--dry_run true` must not read success from a
    plan that says the run would fail (a step failed before; an unreadable status file)."""
    assert cli([write_step("flaky", fn=fail), write_step("fine")]) == 1
    capsys.readouterr()
    written = sorted(p.name for p in (tmp_path / "out").rglob("*"))

    assert (
        cli([write_step("flaky"), write_step("fine")], "--dry_run", "true", "--force_run_failed", "false")
        == 1
    )
    captured = capsys.readouterr()
    assert "error" in captured.out  # the plan's row, with its reason...
    assert captured.err.strip() == (
        "error: dry run: 1 step(s) would fail: flaky; each error row above says what to do"
    )  # ...and the run's verdict, naming only the failing step
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == written  # nothing written
    assert CALLS == {"flaky": 1, "fine": 1}

    # By default (force_run_failed) the failed step would run again: the dry run is fine.
    assert (
        cli([write_step("flaky"), write_step("fine")], "--dry_run", "true", "--force_run_failed", "true") == 0
    )
    assert capsys.readouterr().err == ""


def test_a_dry_run_with_an_unreadable_status_file_exits_1(cli, capsys, tmp_path):
    assert cli([write_step("fine")]) == 0
    (status,) = (tmp_path / "out").glob("fine-*/.executor_status")
    status.write_bytes(b"\xff\xfe garbage")
    capsys.readouterr()
    assert cli([write_step("fine")], "--dry_run", "true") == 1
    err = capsys.readouterr().err
    assert "1 step(s) would fail: fine" in err
    assert status.read_bytes() == b"\xff\xfe garbage"  # left for the user to look at


def test_failed_steps_rerun_without_the_flag(cli):
    assert cli([write_step("flaky", fn=fail)]) == 1
    assert cli([write_step("flaky")]) == 0
    assert CALLS == {"flaky": 2}


class OverlapProbe:
    """Step function that records how many steps run at once.

    A step waits (up to `patience` seconds) for another to join it and returns as soon as
    one does, so steps that may overlap do, and steps that may not cost `patience` each.
    """

    def __init__(self, patience: float = 0.3):
        self.patience = patience
        self.lock = threading.Lock()
        self.active = 0
        self.most = 0
        self.overlapped = threading.Event()

    def __call__(self, config: WriteConfig) -> None:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
            if self.active > 1:
                self.overlapped.set()
        self.overlapped.wait(timeout=self.patience)
        with self.lock:
            self.active -= 1


@pytest.mark.parametrize("limit", [1, 2])
def test_max_concurrent_from_the_command_line_bounds_the_steps_running_at_once(cli, limit):
    probe = OverlapProbe()
    steps = [write_step(f"p{i}", i, fn=probe) for i in range(3)]
    assert cli(steps, "--max_concurrent", str(limit)) == 0
    assert probe.most == limit  # 1: strictly one after another; 2: they did overlap


# -- what people read: hash-change explanations and console lines, pinned exactly ------------


def test_flatten_names_every_leaf_by_its_dotted_path():
    value = {"model": {"hidden": 64, "layers": [1, {"k": "v"}]}, "empty": {}, "none": [], "lr": 0.1}
    assert flatten(value) == {
        "model.hidden": 64,
        "model.layers[0]": 1,
        "model.layers[1].k": "v",
        "empty": {},
        "none": [],
        "lr": 0.1,
    }
    assert flatten([1, [2]]) == {"[0]": 1, "[1][0]": 2}
    assert flatten(5) == {"": 5}


def test_diff_flat_lists_changed_added_and_removed_fields_in_order():
    old = {"a": 1, "b": 2, "gone": "x", "same": [1], "kind": 1}
    new = {"a": 1, "b": 3, "new": None, "same": [1], "kind": 1.0}
    assert [(c.field, c.old, c.new) for c in diff_flat(old, new)] == [
        ("b", 2, 3),
        ("gone", "x", diff_flat({"x": 1}, {})[0].new),
        ("kind", 1, 1.0),  # equal but of another type: a different version
        ("new", diff_flat({}, {"x": 1})[0].old, None),
    ]
    assert [c.describe() for c in diff_flat(old, new)] == [
        "b: 2 -> 3",
        "gone: removed (was 'x')",
        "kind: 1 -> 1.0",
        "new: added (None)",
    ]
    assert diff_flat({"a": None}, {}) != []  # None is a value, not "missing"


def test_long_values_are_cut_to_sixty_characters():
    assert FieldChange("f", "x" * 58, "y" * 59).describe() == f"f: '{'x' * 58}' -> '{'y' * 56}..."
    assert len(FieldChange("f", 0, "z" * 100).describe().split(" -> ")[1]) == 60


def test_diff_versions_explains_fields_dependencies_and_names():
    old = {
        "name": "a",
        "config": {"lr": 0.1, "gone": 1},
        "dependencies": ["1111111111aaaa", "2222222222bbbb", "3333333333cccc"],
    }
    new = {
        "name": "b",
        "config": {"lr": 0.2, "added": [1]},
        "dependencies": ["1111111111aaaa", "4444444444dddd", "3333333333cccc", "5555555555eeee"],
    }
    assert diff_versions(old, new, ["up/a", "up/b", "up/c", "up/d"]) == [
        "added[0]: added (1)",
        "gone: removed (was 1)",
        "lr: 0.1 -> 0.2",
        "DEP[1] (up/b): upstream version 22222222 -> 44444444",
        "DEP[3] (up/d): new dependency",
        "name: 'a' -> 'b'",
    ]
    assert diff_versions(new, old, ["x"]) == [
        "added[0]: removed (was 1)",
        "gone: added (1)",
        "lr: 0.2 -> 0.1",
        "DEP[1]: upstream version 44444444 -> 22222222",
        "DEP[3]: dependency removed",
        "name: 'b' -> 'a'",
    ]
    assert diff_versions({"config": {"y": 0}}, {"config": {"x": 1, "y": 0}, "dependencies": ["abc"]}) == [
        "x: added (1)",
        "DEP[0]: new dependency",
    ]
    assert diff_versions({"config": {"x": 1, "y": 0}, "dependencies": ["abc"]}, {"config": {"y": 0}}) == [
        "x: removed (was 1)",
        "DEP[0]: dependency removed",
    ]
    assert diff_versions(old, old) == []


def test_console_lines_count_done_running_and_left():
    stream = io.StringIO()
    console = ConsoleProgress(total=4, stream=stream)
    console(StepStarted("a", "/p/a", log_path="/p/a/.executor_log"))
    console(StepStarted("b", "/p/b", log_path="/p/b/.executor_log"))
    console(StepSucceeded("a", "/p/a", duration=1.25))
    console(StepWaiting("c", "/p/c", holder="host:1:abc", heartbeat=1700000000.5))
    console(StepFailed("b", "/p/b", kind="error", error="boom", log_path="/p/b/.executor_log"))
    console(StepSkipped("c", "/p/c", reason="finished by another driver"))
    console(StepFailed("d", "/p/d", kind="dep_failed", error="dependency b failed"))
    console(RunFinished(succeeded=1, skipped=1, failed=2, duration=3.0))
    assert stream.getvalue().splitlines() == [
        "[0/4 done, 1 running, 3 left] start  a  (log: /p/a/.executor_log)",
        "[0/4 done, 2 running, 2 left] start  b  (log: /p/b/.executor_log)",
        "[1/4 done, 1 running, 2 left] ok     a  1.2s",
        "[1/4 done, 1 running, 2 left] wait   c  held by host:1:abc, last heartbeat 2023-11-14T22:13:20.500Z",
        "[2/4 done, 0 running, 2 left] FAIL   b  [error] boom  (log: /p/b/.executor_log)",
        "[3/4 done, 0 running, 1 left] skip   c  (finished by another driver)",
        "[4/4 done, 0 running, 0 left] FAIL   d  [dep_failed] dependency b failed",
        "[4/4 done, 0 running, 0 left] finished in 3.0s: 1 ran, 1 cached, 2 failed",
    ]


def test_console_writes_to_stdout_by_default(capfd):
    ConsoleProgress(total=1)(RunFinished(succeeded=0, skipped=1, failed=0, duration=0.0))
    assert (
        capfd.readouterr().out
        == "[0/1 done, 0 running, 1 left] finished in 0.0s: 0 ran, 1 cached, 0 failed\n"
    )


# -- messages and small values people rely on --------------------------------------------------


def test_a_step_nonblocking_reference_alone_neither_runs_nor_waits_for_the_upstream(tmp_path):
    up = write_step("up", 1)
    down = ExecutorStep("down", read_nothing, TwoRefsConfig(this_output_path(), up.nonblocking(), None))
    run = Executor(str(tmp_path), console=False)
    run.run([down])
    assert CALLS == {}
    up_path = run.output_paths[up]
    assert run.configs[down].first == up_path
    assert [row.name for row in run.plan.rows] == ["down"]
    assert up.nonblocking() == InputName(up, None, block_on_step=False)
    assert output_path_of(up, "x").nonblocking().block_on_step is False


def read_nothing(config: TwoRefsConfig) -> None:
    os.makedirs(config.output_path, exist_ok=True)


def test_input_names_print_their_owner_sub_path_and_blocking():
    up = write_step("up")
    assert repr(up) == "ExecutorStep(name='up')"
    assert repr(up / "a") == "InputName('up', 'a')"
    assert repr(up.nonblocking()) == "InputName('up', None, nonblocking)"
    assert repr(InputName.hardcoded("raw/x")) == "InputName('<hardcoded>', 'raw/x')"


def test_sub_paths_join_with_exactly_one_slash():
    up = write_step("up")
    assert (up / "a/").cd("/b").name == "a/b"
    assert up.cd("a").cd("b/").name == "a/b/"
    assert (up / "").cd("c").name == "c"
    assert output_path_of(up).cd("").name is None
    assert InputName.hardcoded("/data/raw/").cd("/x").name == "/data/raw/x"
    assert InputName.hardcoded("raw").cd("").name == "raw"


def test_unencodable_values_name_the_field_the_value_and_its_type():
    value = object()
    with pytest.raises(UnencodableValueError) as refused:
        encode(value)
    assert refused.value.field_path == ""
    assert refused.value.value is value
    assert str(refused.value).startswith("field '<root>': value of type builtins.object has no deterministic")
    with pytest.raises(UnencodableValueError) as nested:
        encode({"a": [1, float("nan")]})
    assert nested.value.field_path == "a[1]"
    assert str(nested.value) == "field 'a[1]': nan has no canonical encoding; use a finite number"


def test_two_different_steps_on_one_path_are_refused_with_every_difference(tmp_path):
    def other_fn(config):
        pass

    first = ExecutorStep("s", write_value, WriteConfig(this_output_path(), versioned(1), key="a"))
    second = ExecutorStep(
        "s", other_fn, WriteConfig(this_output_path(), versioned(2), key="b"), override_output_path="s-fixed"
    )
    first = first.with_output_path("s-fixed")
    with pytest.raises(StepDefinitionError) as refused:
        Executor(str(tmp_path), console=False).run([first, second])
    assert str(refused.value) == (
        f"steps 's' and 's' both resolve to the output path {tmp_path}/s-fixed but have different versions; "
        f"different functions (tests.executor.steps_for_tests:write_value vs {__name__}:"
        "test_two_different_steps_on_one_path_are_refused_with_every_difference.<locals>.other_fn); "
        "different config fields: key, value. Give one a different name, version the field "
        "that tells them apart, or remove the override_output_path"
    )


def test_the_collision_refusal_says_which_versions_and_fields_differ(tmp_path, colliding_hashes):
    first = Executor(str(tmp_path), console=False)
    first.run([write_step("s", 1)])
    old = first.graph.steps[0]
    second = Executor(str(tmp_path), console=False)
    with pytest.raises(StepDefinitionError) as refused:
        second.run([write_step("s", 2)])
    new_hash = resolve_one(write_step("s", 2), str(tmp_path)).version_hash
    assert str(refused.value) == (
        f"step 's': {old.output_path} holds a different version of this step "
        f"({old.version_hash[:12]} vs {new_hash[:12]}; value: 1 -> 2). This is a hash collision; "
        "rename the step or delete that output"
    )


def resolve_one(step: ExecutorStep, prefix: str):
    return executor.graph.resolve([step], prefix).resolved(step)


def test_an_override_path_holding_another_version_is_reused_with_the_differences_listed(tmp_path):
    Executor(str(tmp_path), console=False).run([write_step("s", 1).with_output_path("fixed")])
    again = Executor(str(tmp_path), console=False)
    again.run([write_step("s", 2).with_output_path("fixed")])
    (row,) = again.plan.rows
    assert row.action.value == "skip"
    assert row.reason == "already succeeded (override_output_path: stored output has another version)"
    assert row.status == Status.SUCCESS
    assert row.unversioned_changes == ("value: 1 -> 2",)
    assert CALLS == {"s": 1}


def test_the_plan_table_shows_actions_paths_reasons_and_warnings(tmp_path):
    Executor(str(tmp_path), console=False).run([write_step("a", 1)])
    a_old = ExecutorStep("a", write_value, WriteConfig(this_output_path(), versioned(1), key="a"))
    seen = Executor(str(tmp_path), console=False)
    seen.run([a_old])
    assert seen.plan.format() == (
        f"Plan: 1 steps (1 skip)\n  skip    a  already succeeded\n{' ' * 13}-> {seen.output_paths[a_old]}"
    )
    # An unversioned change on a reused step, and a new version of a step seen before.
    changed = ExecutorStep("a", write_value, WriteConfig(this_output_path(), versioned(1), key="other"))
    older = write_step("longer-name", 5)
    older_path = Executor(str(tmp_path), console=False).run([older]).rows[0].output_path
    plan = Executor(str(tmp_path), console=False).run([changed, write_step("longer-name", 6)], dry_run=True)
    paths = {row.name: row.output_path for row in plan.rows}
    assert plan.counts() == {"skip": 1, "run": 1}
    pad = " " * 23  # under the action (7) and the longest name (11)
    assert plan.format().splitlines() == [
        "Plan: 2 steps (1 skip, 1 run)",
        "  skip    a            already succeeded",
        f"{pad}-> {paths['a']}",
        f"{pad}WARNING: reusing an output made with other unversioned settings:",
        f"{pad}  key: 'a' -> 'other'",
        "  run     longer-name  no output yet",
        f"{pad}-> {paths['longer-name']}",
        f"{pad}hash differs from {older_path}:",
        f"{pad}  value: 5 -> 6",
    ]


def test_an_empty_plan_says_so(tmp_path):
    assert Plan(rows=(), graph=None).format() == "Plan: nothing selected."
    assert Plan(rows=(), graph=None).counts() == {}


def test_dependents_of_a_failed_step_are_marked_dep_failed_with_its_name(tmp_path):
    up = write_step("up", fn=fail)
    down = ExecutorStep("down", write_value, WriteConfig(this_output_path(), versioned(2), [up], "down"))
    run = Executor(str(tmp_path), console=False)
    with pytest.raises(ExecutorRunError) as failed:
        run.run([down])
    (event,) = [e for e in run.events if isinstance(e, StepFailed) and e.name == "down"]
    assert (event.output_path, event.kind, event.error) == (
        run.output_paths[down],
        "dep_failed",
        "dependency up failed",
    )
    (status,) = read_status(run.store, run.output_paths[down])
    assert (status.status, status.message) == (Status.DEP_FAILED, "dependency up failed")
    assert status.worker is not None and status.worker.count(":") == 2
    assert run.store.read_bytes(f"{run.output_paths[down]}/.executor_status.lock") is None
    up_path = run.output_paths[up]
    assert str(failed.value) == (
        f"1 step(s) failed: ['up']\n  - up [failed] RuntimeError: boom in up\n      log: {up_path}/.executor_log"
    )


def test_a_new_version_is_explained_against_the_latest_sibling_of_the_same_name_only(tmp_path):
    for value in (1, 2):
        Executor(str(tmp_path), console=False).run([write_step("group/s", value)])
    group = tmp_path / "group"
    latest = max(group.iterdir(), key=lambda d: (d / ".executor_status").read_text())
    # Decoys the finder must skip: an unreadable sibling (sorted first), and another step's
    # output whose directory name has the same length and the very same status time.
    (group / "s-00000000").mkdir()
    shutil.copytree(latest, group / "q-00000000")
    plan = Executor(str(tmp_path), console=False).run([write_step("group/s", 3)], dry_run=True)
    (row,) = plan.rows
    assert row.previous_output == str(latest)
    assert row.why_new == ("value: 2 -> 3",)


def test_an_override_path_is_not_compared_with_siblings(tmp_path):
    Executor(str(tmp_path), console=False).run([write_step("s", 1)])
    plan = Executor(str(tmp_path), console=False).run(
        [write_step("s", 2).with_output_path("s-custom")], dry_run=True
    )
    (row,) = plan.rows
    assert (row.previous_output, row.why_new) == (None, ())


def test_a_step_log_holds_its_prints_and_log_records_and_the_streams_still_work(tmp_path):
    seen = {}

    def chatty(config: WriteConfig) -> None:
        print("printed line")
        sys.stdout.flush()
        seen["encoding"] = sys.stdout.encoding
        seen["isatty"] = sys.stderr.isatty()
        logging.getLogger("chatty.step").warning("warned %s", 7)
        print("to stderr", file=sys.stderr)

    run = Executor(str(tmp_path), console=False)
    run.run([write_step("chatty", fn=chatty)])
    log = Path(run.output_paths[run.steps[0]], ".executor_log").read_text()
    lines = log.splitlines()
    assert lines[0] == "printed line"
    assert lines[1].endswith(" WARNING chatty.step: warned 7")
    assert lines[2] == "to stderr"
    assert len(lines) == 3 and log.endswith("\n")
    assert seen["encoding"] and isinstance(seen["isatty"], bool)


def test_get_executor_step_and_unwrap_versioned_value():
    up = write_step("up")
    assert get_executor_step(up) is up
    assert get_executor_step(up / "x") is up
    with pytest.raises(ValueError, match=r"InputName\('<hardcoded>', 'raw'\) does not refer to a step"):
        get_executor_step(InputName.hardcoded("raw"))
    assert unwrap_versioned_value(versioned(3)) == 3
    assert unwrap_versioned_value([3]) == [3]


@pytest.mark.parametrize("prefix", ["local", "memory"])
def test_store_makedirs_creates_nested_directories(tmp_path, prefix):
    root = str(tmp_path) if prefix == "local" else f"memory://makedirs-{os.getpid()}-{id(tmp_path)}"
    store = open_store(root)
    assert store.protocol == ("file" if prefix == "local" else "memory")
    store.makedirs(f"{root}/a/b/c")
    store.makedirs(f"{root}/a/b/c")  # twice is fine
    assert store.exists(f"{root}/a/b/c")
    assert [info.name for info in store.list_dir(f"{root}/a")] == ["b"]
    assert store.list_dir(f"{root}/a")[0].is_dir


def test_losing_a_lease_is_logged_with_its_path(tmp_path, caplog):
    store = open_store(str(tmp_path))
    leases = LeaseManager(store, LeaseConfig(heartbeat_interval=30, timeout=60), "w")
    output = f"{tmp_path}/step"
    try:
        assert leases.try_acquire(output).acquired
        store.write_atomic(lease_path(output), b"taken")
        with caplog.at_level(logging.ERROR, logger="executor.lease"):
            assert not leases.refresh(output)
        assert [r.getMessage() for r in caplog.records if r.name == "executor.lease"] == [
            f"lost the lease on {output}: another driver took it over"
        ]
    finally:
        leases.close()


def test_an_interrupted_run_marks_its_running_steps_failed_and_frees_their_leases(tmp_path):
    started, release = threading.Event(), threading.Event()

    def blocks(config: WriteConfig) -> None:
        started.set()
        release.wait(timeout=30)

    def interrupt_when_started() -> None:
        if started.wait(timeout=30):
            os.kill(os.getpid(), signal.SIGINT)

    # Python's own Ctrl-C handler, whatever the host process (a test runner) installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    run = Executor(str(tmp_path), console=False)
    helper = threading.Thread(target=interrupt_when_started)
    helper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run.run([write_step("blocks", fn=blocks)])
    finally:
        release.set()
        helper.join(timeout=30)
        signal.signal(signal.SIGINT, previous)
    path = run.output_paths[run.steps[0]]
    history = read_status(run.store, path)
    assert [(e.status, e.message) for e in history] == [
        (Status.RUNNING, None),
        (Status.FAILED, "interrupted"),
    ]
    assert run.store.read_bytes(lease_path(path)) is None


# -- config templates (marin reproduce): exact records, exact refusals ---------------------------


class Shade(enum.Enum):
    DARK = 1


@dataclass(frozen=True)
class Holder:
    value: Any = None
    other: Any = None


class WithStatic:
    @staticmethod
    def helper() -> None:
        pass


def no_steps(path: str):
    raise AssertionError(f"no input expected, got {path}")


def test_encode_template_records_each_kind_exactly():
    up = write_step("up")
    where = {id(up): "/p/up-1"}
    record = encode_template(
        Holder(
            value=[
                None,
                True,
                3,
                1.5,
                "s",
                Shade.DARK,
                (1, "t"),
                {"b", "a"},
                frozenset({2}),
                {"k": 1},
                {"__x__": 1},
                {1: "one"},
                b"\x01\xff",
                PurePosixPath("a/b"),
                up,
                up / "sub",
                up.nonblocking(),
                InputName.hardcoded("raw/x"),
                this_output_path("o"),
                versioned(4),
                write_value,
                object,
            ],
            other=Holder(),
        ),
        lambda step: where[id(step)],
    )
    assert record == {
        "__dataclass__": f"{__name__}:Holder",
        "fields": {
            "value": [
                None,
                True,
                3,
                1.5,
                "s",
                {"__enum__": f"{__name__}:Shade", "name": "DARK"},
                {"__tuple__": [1, "t"]},
                {"__set__": ["a", "b"], "frozen": False},
                {"__set__": [2], "frozen": True},
                {"k": 1},
                {"__dict__": [["__x__", 1]]},
                {"__dict__": [[1, "one"]]},
                {"__bytes__": "01ff"},
                {"__path__": "pathlib:PurePosixPath", "value": "a/b"},
                {"__input__": "/p/up-1", "name": None, "nonblocking": False},
                {"__input__": "/p/up-1", "name": "sub", "nonblocking": False},
                {"__input__": "/p/up-1", "name": None, "nonblocking": True},
                {"__hardcoded__": "raw/x", "name": None},
                {"__output__": "o"},
                {"__versioned__": 4},
                {"__callable__": "tests.executor.steps_for_tests:write_value"},
                {"__callable__": "builtins:object"},
            ],
            "other": {"__dataclass__": f"{__name__}:Holder", "fields": {"value": None, "other": None}},
        },
    }
    opaque = encode_template(threading.Lock(), lambda step: "")
    assert set(opaque) == {"__opaque__", "repr"} and opaque["__opaque__"] == "_thread.lock"


def test_decode_template_rebuilds_each_kind():
    up = write_step("up")
    values = [
        None,
        [1, [2]],
        Shade.DARK,
        (1, ("t",)),
        {"b", "a"},
        frozenset({2}),
        {"k": {"j": 1}},
        {"__x__": 1},
        {1: "one", (2, 3): "pair"},
        b"\x01\xff",
        PurePosixPath("a/b"),
        up / "sub",
        up.nonblocking(),
        InputName.hardcoded("raw/x"),
        this_output_path("o"),
        versioned({"deep": [Shade.DARK]}),
        Holder(value=Holder(other=(1,))),
    ]
    for value in values:
        record = json.loads(json.dumps(encode_template(value, lambda step: "/p/up-1")))
        rebuilt = decode_template(record, lambda path: {"/p/up-1": up}[path])
        assert rebuilt == value, value
        assert type(rebuilt) is type(value), value


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"a": {"__tuple__": "x"}}, "field 'a': '__tuple__' is str, not what the template format has"),
        (
            {"a": {"b": [{"__bytes__": 1}]}},
            "field 'a.b[0]': '__bytes__' is int, not what the template format has",
        ),
        ({"__bytes__": "zz"}, "field '<root>': '__bytes__' is not hex (non-hexadecimal number found"),
        ({"__dict__": [[1]]}, "field '<root>': '__dict__' holds [1], not a [key, value] pair"),
        ({"__dict__": "x"}, "field '<root>': '__dict__' is str, not what the template format has"),
        (
            {"__dict__": [[[1], 2]]},
            "field '<root>': a recorded dict key is unhashable (unhashable type: 'list')",
        ),
        (
            {"__set__": [[1]]},
            "field '<root>': a recorded set holds unhashable items (unhashable type: 'list')",
        ),
        ({"__set__": 5}, "field '<root>': '__set__' is int, not what the template format has"),
        ({"__input__": 5}, "field '<root>': '__input__' is int, not what the template format has"),
        ({"__input__": "/p", "name": 5}, "field '<root>': 'name' is int, not what the template format has"),
        (
            {"__hardcoded__": None},
            "field '<root>': '__hardcoded__' is NoneType, not what the template format has",
        ),
        ({"__output__": 3}, "field '<root>': '__output__' is int, not what the template format has"),
        (
            {"__path__": "pathlib:PurePosixPath", "value": 3},
            "field '<root>': 'value' is int, not what the template format has",
        ),
        (
            {"__dataclass__": f"{__name__}:Holder", "fields": []},
            "field '<root>': 'fields' is list, not what the template format has",
        ),
        (
            {"x": {"__dataclass__": f"{__name__}:Holder", "fields": {"nope": 1}}},
            f"field 'x': {__name__}:Holder no longer accepts the recorded fields (",
        ),
        (
            {"__enum__": f"{__name__}:Shade", "name": "LIGHT"},
            f"field '<root>': {__name__}:Shade has no member 'LIGHT'",
        ),
        (
            {"__enum__": f"{__name__}:Shade", "name": 1},
            "field '<root>': 'name' is int, not what the template",
        ),
        (
            {"v": {"__opaque__": "socket.socket", "repr": "<s>"}},
            "field 'v' held a socket.socket (<s>), which was not recorded in a form that can be rebuilt",
        ),
    ],
    ids=lambda value: "case",
)
def test_malformed_template_records_are_refused_naming_the_field(record, message):
    with pytest.raises(TemplateError) as refused:
        decode_template(record, lambda path: None)
    assert str(refused.value).startswith(message)


def test_deeply_nested_records_are_refused_not_a_recursion_error():
    record: Any = 1
    for _ in range(5000):
        record = [record]
    with pytest.raises(
        TemplateError, match=r"field '<root>': the recorded config is nested too deeply: refused"
    ):
        decode_template(record, no_steps)


def test_trusted_code_compares_whole_directories(tmp_path):
    pkg, sibling, checkout = tmp_path / "pkg", tmp_path / "pkg2", tmp_path / "checkout"
    for directory in (pkg, sibling, checkout / "site", checkout / "trees"):
        directory.mkdir(parents=True)
    policy = TrustedCode(
        packages=[str(pkg)],
        checkout=str(checkout),
        installed=[str(checkout / "site")],
        excluded=[str(checkout / "trees")],
    )
    assert policy.may_run(str(pkg / "m.py"))
    assert policy.may_run(str(pkg))
    assert not policy.may_run(str(sibling / "m.py"))  # /pkg2 is not under /pkg
    assert not policy.may_run(None) and not policy.may_run("")
    assert policy.may_run(str(checkout / "exp.py"))
    assert not policy.may_run(str(checkout / "site" / "lib.py"))  # installed code: types only
    assert policy.may_import(str(checkout / "site" / "lib.py"))
    assert not policy.may_run(str(checkout / "trees" / "x.py"))
    assert not policy.may_import(str(checkout / "trees" / "x.py"))
    assert not policy.may_import(str(sibling / "m.py"))
    assert not TrustedCode(packages=[str(pkg)]).may_run(str(checkout / "exp.py"))
    excluded_package = TrustedCode(packages=[str(pkg)], excluded=[str(pkg / "out")])
    assert not excluded_package.may_run(str(pkg / "out" / "m.py"))
    assert (
        policy.describe_allowed()
        == f"the trusted code ({os.path.realpath(pkg)}, {os.path.realpath(checkout)})"
    )
    assert TrustedCode().describe_allowed() == "trusted code (none is configured)"


def test_names_are_resolved_strictly(monkeypatch):
    policy = TrustedCode()
    assert policy.resolve(f"{__name__}:Holder") is Holder
    assert policy.resolve(f"{__name__}:WithStatic.helper") is WithStatic.helper
    assert TrustedCode(aliases={"__main__": sys.modules[__name__]}).resolve("__main__:Holder") is Holder
    refusals = {
        5: "field 'f': 5 is not a `module:qualname` name",
        "a:b:c": "field 'f': 'a:b:c' is not a `module:qualname` name",
        "nocolon": "field 'f': 'nocolon' is not a `module:qualname` name",
        f"{__name__}:no_steps.<locals>.g": f"field 'f': {__name__}:no_steps.<locals>.g is not importable "
        "(defined inside a function)",
        f"{__name__}:Holder.1x": f"field 'f': {__name__}:Holder.1x is not importable: bad name '1x'",
        "__main__:x": "field 'f': __main__:x is not importable: it was defined in an experiment script (__main__) "
        "that was not loaded",
        "not-a-module:x": "field 'f': not-a-module:x is not importable: 'not-a-module' is not a module name",
        "no_such_module_zz:x": "field 'f': no_such_module_zz:x is not importable: cannot import module "
        "'no_such_module_zz': no module of that name is installed",
        f"{__name__}:Missing": f"field 'f': {__name__}:Missing is not importable: '{__name__}' has no attribute 'Missing'",
    }
    for name, message in refusals.items():
        with pytest.raises(TemplateError) as refused:
            policy.resolve(name, "f")
        assert str(refused.value) == message
    monkeypatch.setitem(sys.modules, "blocked_module_zz", None)
    with pytest.raises(TemplateError, match="module 'blocked_module_zz' is blocked from importing"):
        policy.resolve("blocked_module_zz:x")


def test_kinds_are_checked_with_a_description_of_what_was_found():
    policy = TrustedCode()
    cases = [
        (
            policy.dataclass_type,
            "builtins:len",
            "builtins:len is a builtin function, not a dataclass: refused",
        ),
        (policy.dataclass_type, f"{__name__}:Shade", f"the enum {__name__}:Shade, not a dataclass"),
        (policy.enum_type, f"{__name__}:Holder", f"the dataclass {__name__}:Holder, not an Enum"),
        (policy.enum_type, f"{__name__}:WithStatic", f"the class {__name__}:WithStatic, not an Enum"),
        (policy.path_type, "os:path", "the module posixpath, not a pathlib path type"),
        (policy.path_type, f"{__name__}:no_steps", f"a function ({__name__}:no_steps), not a pathlib"),
        (
            policy.path_type,
            f"{__name__}:UP_STARTED_DOWN",
            "a threading.Event object, not a pathlib path type",
        ),
    ]
    for check, name, message in cases:
        with pytest.raises(TemplateError) as refused:
            check(name, "f")
        assert message in str(refused.value)
        assert str(refused.value).startswith(f"field 'f': {name} is ")
    assert policy.path_type("pathlib:PurePosixPath") is PurePosixPath
    assert policy.enum_type(f"{__name__}:Shade") is Shade
    assert policy.dataclass_type(f"{__name__}:Holder") is Holder


# -- the command line, in this process (test_bad_cli.py runs the same cases in subprocesses) -----


def abc_steps() -> list[ExecutorStep]:
    a = write_step("a", 1)
    b = ExecutorStep("b", write_value, WriteConfig(this_output_path(), versioned(2), [a], "b"))
    return [a, b, write_step("c", 3)]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--max_concurrent", "abc"], ["--max_concurrent", "'abc'", "(expected a whole number)"]),
        (["--max_concurrent", "0"], ["--max_concurrent must be at least 1, got 0"]),
        (["--max_concurrent"], ["--max_concurrent", "expected one argument (see --help)"]),
        (["--run_only", "["], ["--run_only: invalid regular expression '['"]),
        (["--run_only=["], ["--run_only: invalid regular expression '['"]),
        (["--run_only", '["a", "("]'], ["--run_only: invalid regular expression '('"]),
        (["--run_only", "[1, 2]"], ["--run_only '[1, 2]': expected a regex or a JSON list of regexes"]),
        (["--dry_run", "maybe"], ["--dry_run", "'maybe'", "(expected true or false)"]),
        (["--no_such_flag", "1"], ["unrecognized arguments: --no_such_flag 1 (see --help)"]),
        (["--lease_timeout", "0"], ["--lease_timeout must be a positive number of seconds, got 0.0"]),
        (["--lease_poll", "soon"], ["--lease_poll", "'soon'", "(expected a number of seconds)"]),
        (
            ["--lease_timeout", "5", "--lease_heartbeat", "5"],
            ["--lease_heartbeat (5s) must be smaller than --lease_timeout (5s)"],
        ),
        (["--config_path", "/no/such/flags.yaml"], ["cannot read the flags", "FileNotFoundError"]),
    ],
    ids=lambda value: "case",
)
def test_bad_flags_exit_2_with_one_error_line(cli, capsys, args, fragments):
    assert cli(abc_steps(), *args) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.strip()]
    assert line.startswith("error: ")
    for fragment in fragments:
        assert fragment in line
    assert CALLS == {}


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"MARIN_LEASE_TIMEOUT": "abc"}, "MARIN_LEASE_TIMEOUT='abc' is not a number of seconds"),
        ({"MARIN_LEASE_POLL": "-1"}, "MARIN_LEASE_POLL must be a positive number of seconds, got -1.0"),
        (
            {"MARIN_LEASE_HEARTBEAT": "100"},
            "MARIN_LEASE_HEARTBEAT (100s) must be smaller than the default --lease_timeout (60s)",
        ),
        (
            {"MARIN_LEASE_TIMEOUT": "5"},
            "the default --lease_heartbeat (10s) must be smaller than MARIN_LEASE_TIMEOUT (5s)",
        ),
    ],
    ids=lambda value: "case",
)
def test_bad_lease_variables_exit_2_naming_the_variable(cli, capsys, monkeypatch, env, fragment):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli(abc_steps(), "--dry_run", "true") == 2
    assert f"error: {fragment}" in capsys.readouterr().err


def test_run_only_flags_select_steps_in_every_spelling(cli):
    assert cli(abc_steps(), "--run_only", "c") == 0
    assert CALLS == {"c": 1}
    assert cli(abc_steps(), "--run_only=b") == 0  # and its unfinished dependency a
    assert CALLS == {"c": 1, "b": 1, "a": 1}
    CALLS.clear()
    assert cli(abc_steps(), "--run_only", '["[ab]"]', "--force_run_failed", "true") == 0
    assert CALLS == {}  # a and b succeeded already


def test_a_run_only_regex_starting_with_a_character_class_is_a_regex(cli):
    assert cli(abc_steps(), "--run_only", "[c]") == 0
    assert CALLS == {"c": 1}


def test_lease_flags_and_variables_reach_the_executor(cli, monkeypatch):
    captured = {}
    real = executor.main.Executor

    def spy(*args, **kwargs):
        captured.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(executor.main, "Executor", spy)
    monkeypatch.setenv("MARIN_LEASE_POLL", "0.25")
    assert cli(abc_steps(), "--lease_timeout", "30", "--lease_heartbeat", "3", "--dry_run", "true") == 0
    assert captured["lease_config"] == LeaseConfig(timeout=30.0, heartbeat_interval=3.0, poll_interval=0.25)


def test_the_prefix_comes_from_the_flag_then_marin_prefix_then_the_default(monkeypatch, tmp_path):
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    assert executor.main.resolve_prefix("/given") == "/given"
    assert executor.main.resolve_prefix(None) == "./marin-output"
    monkeypatch.setenv("MARIN_PREFIX", "/from/env")
    assert executor.main.resolve_prefix(None) == "/from/env"
    assert executor.main.resolve_prefix("/given") == "/given"


def test_an_unknown_storage_scheme_exits_2_naming_the_url(cli, capsys, monkeypatch):
    monkeypatch.setattr(
        sys, "argv", ["experiment.py", "--prefix", "nosuchscheme://bucket/x", "--dry_run", "true"]
    )
    with pytest.raises(SystemExit) as exit_:
        executor_main(abc_steps())
    assert exit_.value.code == 2
    assert "nosuchscheme://bucket/x" in capsys.readouterr().err


# -- provenance: what an experiment manifest records ------------------------------------------------


def git(cwd, *args: str) -> str:
    import subprocess

    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        },
    ).stdout.strip()


def test_git_state_records_commit_branch_root_and_dirtiness(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    script = repo / "study.py"
    script.write_text("print(1)\n")
    git(repo, "add", "study.py")
    git(repo, "commit", "-q", "-m", "one")
    commit = git(repo, "rev-parse", "HEAD")
    clean = provenance.git_state(str(script))
    assert clean == {"commit": commit, "dirty": False, "branch": "main", "root": str(repo.resolve())}
    assert provenance.git_state(str(repo)) == clean  # a directory works too
    script.write_text("print(2)\n")
    assert provenance.git_state(str(script))["dirty"] is True
    (repo / "untracked.txt").write_text("x")
    script.write_text("print(1)\n")
    assert provenance.git_state(str(script))["dirty"] is False  # untracked files do not count
    outside = tmp_path / "plain"
    outside.mkdir()
    assert provenance.git_state(str(outside)) == {"commit": None, "dirty": None, "branch": None, "root": None}


def test_package_versions_are_read_from_the_installed_distributions():
    import importlib.metadata

    versions = provenance.package_versions()
    assert versions["pytest"] == importlib.metadata.version("pytest")
    assert versions["typing-extensions"] == importlib.metadata.version("typing_extensions")
    assert list(versions) == sorted(versions)


def test_collect_provenance_describes_this_process(tmp_path):
    record = provenance.collect_provenance(str(tmp_path / "study.py"))
    assert record["caller_path"] == str(tmp_path / "study.py")
    assert record["command_line"] == sys.argv
    assert record["cwd"] == os.getcwd()
    assert record["host"] == os.uname().nodename
    assert record["python"] == sys.version.split()[0]
    assert record["git"]["commit"] is None
    assert "pytest" in record["packages"]
    assert set(record) == {
        "caller_path",
        "command_line",
        "cwd",
        "user",
        "host",
        "git",
        "python",
        "platform",
        "packages",
    }


def test_the_experiment_manifest_is_named_after_the_script_and_the_step_versions(tmp_path):
    graph = executor.graph.resolve([write_step("a", 1), write_step("b", 2)], str(tmp_path))
    digest = provenance.experiment_hash(graph)
    assert digest == sha256_hex(canonical_json(sorted(s.version_hash for s in graph.steps)))[:8]
    assert provenance.experiment_info_path("/base", "/x/y/study.py", graph) == f"/base/study-{digest}.json"
    assert provenance.experiment_info_path("/base", None, graph) == f"/base/interactive-{digest}.json"
    again = executor.graph.resolve([write_step("b", 2), write_step("a", 1)], "memory://elsewhere")
    assert provenance.experiment_hash(again) == digest


def test_a_cached_rerun_rewrites_a_missing_manifest_with_its_start_date_and_provenance(tmp_path):
    # Nothing runs on the re-run, so the manifest is written once, after the run: with that
    # run's start date and the provenance gathered for it (not the empty record of a run
    # that wrote no manifest before its steps).
    Executor(str(tmp_path), console=False).run(abc_steps())
    again = Executor(str(tmp_path), console=False)
    again.run(abc_steps(), dry_run=True)
    manifest_path = Path(again.executor_info_path)
    manifest_path.unlink()
    before = executor.tree.utc_now_iso()

    def slow_listener(event):  # the run takes a measurable time between its start and its end
        if isinstance(event, RunFinished):
            time.sleep(0.2)

    again.listeners.append(slow_listener)
    again.run(abc_steps())
    manifest = json.loads(manifest_path.read_text())
    assert before <= manifest["created_date"] <= manifest["finished_date"]
    created, finished = (
        datetime.datetime.fromisoformat(manifest[key].replace("Z", "+00:00"))
        for key in ("created_date", "finished_date")
    )
    assert (finished - created).total_seconds() >= 0.19  # the start of the run, not of the write
    assert manifest["python"] == sys.version.split()[0]
    assert manifest["cwd"] == os.getcwd() and "packages" in manifest and "git" in manifest
    assert {step["outcome"] for step in manifest["steps"]} == {"skipped"}


def test_the_manifest_records_each_step_and_its_outcome(tmp_path):
    run = Executor(str(tmp_path), console=False, description="the study")
    run.run(abc_steps())
    manifest = json.loads(Path(run.executor_info_path).read_text())
    assert manifest["description"] == "the study"
    assert manifest["prefix"] == str(tmp_path)
    assert manifest["finished_date"] >= manifest["created_date"]
    steps = {step["name"]: step for step in manifest["steps"]}
    b = run.graph.by_path[run.output_paths[run.steps[1]]]
    assert steps["b"] == {
        "name": "b",
        "output_path": b.output_path,
        "version_hash": b.version_hash,
        "fn_name": "tests.executor.steps_for_tests:write_value",
        "config": {key: value for key, value in b.config_record.items() if key != "__type__"},
        "config_types": {"": "WriteConfig"},
        "description": None,
        "override_output_path": None,
        "version": b.version,
        "dependencies": [run.output_paths[run.steps[0]]],
        "outcome": "succeeded",
    }
    assert {name: step["outcome"] for name, step in steps.items()} == {
        "a": "succeeded",
        "b": "succeeded",
        "c": "succeeded",
    }


# -- another driver holds the step ------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["success", "failure"])
def test_a_waiting_driver_reports_what_the_holder_did(tmp_path, outcome):
    fast = LeaseConfig(heartbeat_interval=5.0, timeout=60.0, poll_interval=0.02)
    step = write_step("shared", 1)
    path = executor.graph.resolve([step], str(tmp_path)).resolved(step).output_path
    store = open_store(str(tmp_path))
    holder = LeaseManager(store, fast, "other-host:1:abc")
    assert holder.try_acquire(path).acquired

    def finish_when_waited_on(event) -> None:
        if isinstance(event, StepWaiting):
            assert event.holder == "other-host:1:abc"
            status = Status.SUCCESS if outcome == "success" else Status.FAILED
            append_status(store, path, status, None if outcome == "success" else "boom", holder.worker_id)
            holder.release(path)

    run = Executor(str(tmp_path), console=False, lease_config=fast, listeners=[finish_when_waited_on])
    try:
        if outcome == "success":
            run.run([step])
            (skipped,) = [e for e in run.events if isinstance(e, StepSkipped)]
            assert skipped.reason == "finished by another driver"
        else:
            with pytest.raises(ExecutorRunError) as failed:
                run.run([step])
            (failure,) = failed.value.failures
            assert (failure.outcome.value, failure.error) == (
                "failed_elsewhere",
                "failed in another driver (other-host:1:abc): boom",
            )
    finally:
        holder.close()
    assert CALLS == {}
    assert [row.action.value for row in run.plan.rows] == ["wait"]
    assert run.plan.rows[0].reason.startswith("running elsewhere: held by other-host:1:abc, last heartbeat ")


# -- the Executor facade ---------------------------------------------------------------------


def test_a_failing_listener_is_logged_and_does_not_stop_the_run(tmp_path, caplog):
    def broken(event) -> None:
        raise RuntimeError("listener bug")

    seen = []
    run = Executor(str(tmp_path), console=False, listeners=[broken, seen.append])
    with caplog.at_level(logging.ERROR, logger="executor.executor"):
        run.run([write_step("a", 1)])
    assert CALLS == {"a": 1}
    assert [type(e).__name__ for e in seen] == [
        "StepPlanned",
        "StepStarted",
        "StepSucceeded",
        "RunFinished",
    ]
    assert seen == run.events
    messages = [r.getMessage() for r in caplog.records if r.name == "executor.executor"]
    assert len(messages) == 4 and all(
        m.startswith("event listener ") and " failed on " in m for m in messages
    )


def test_executor_paths_and_results_after_a_run(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="Executor: prefix is empty; pass --prefix or set MARIN_PREFIX"):
        Executor("")
    monkeypatch.chdir(tmp_path)
    run = Executor("rel/prefix/", console=False)
    assert run.prefix == str(tmp_path / "rel" / "prefix")
    assert run.executor_info_base_path == f"{run.prefix}/experiments"
    assert Executor(str(tmp_path), "other/", console=False).executor_info_base_path == str(tmp_path / "other")
    steps = abc_steps()
    plan = run.run(steps)
    assert plan is run.plan
    assert run.steps == steps
    assert set(run.output_paths) == set(steps) == set(run.configs) == set(run.versions)
    assert run.versions[steps[0]]["name"] == "a"
    assert run.configs[steps[1]].inputs == [run.output_paths[steps[0]]]
    assert run.executor_info_path.startswith(f"{run.prefix}/experiments/")
    with pytest.raises(ValueError, match="max_concurrent must be at least 1, got 0"):
        run.run(steps, max_concurrent=0)


def test_a_cached_rerun_writes_nothing_new(tmp_path):
    Executor(str(tmp_path), console=False).run(abc_steps())
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    again = Executor(str(tmp_path), console=False)
    again.run(abc_steps())
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == before
    assert {row.action.value for row in again.plan.rows} == {"skip"}


def test_steps_that_failed_before_are_listed_when_force_run_failed_is_off(tmp_path):
    with pytest.raises(ExecutorRunError):
        Executor(str(tmp_path), console=False).run([write_step("x", fn=fail), write_step("y", fn=fail)])
    with pytest.raises(ValueError) as refused:
        Executor(str(tmp_path), console=False).run([write_step("x"), write_step("y")], force_run_failed=False)
    lines = str(refused.value).splitlines()
    assert lines[0] == "steps failed previously and force_run_failed is off:"
    assert [line.split(":")[0] for line in lines[1:]] == ["  - x", "  - y"]


def test_an_empty_record_flattens_to_no_fields():
    """A version with nothing recorded explains a change as the added fields alone."""
    assert flatten({}) == {} and flatten([]) == {}
    assert flatten({"a": {}}) == {"a": {}}  # an empty field is still a field
    changes = diff_flat(flatten({}), flatten({"lr": 0.1}))
    assert [(c.field, c.new) for c in changes] == [("lr", 0.1)] and "added" in changes[0].describe()


# -- survivors of the twelfth session's mutmut sample, pinned in this process (their
# -- command-line tests in test_bad_cli.py run subprocesses, which mutmut does not see)


def test_a_flag_given_twice_is_a_usage_error_naming_it(cli, capsys):
    assert cli([write_step("a")], "--dry_run", "true", "--dry_run", "false") == executor.main.EXIT_USAGE
    assert "--dry_run" in capsys.readouterr().err
    assert CALLS == {}


def test_a_run_only_pattern_nested_too_deeply_says_so(cli, capsys):
    assert (
        cli([write_step("a")], "--run_only", json.dumps(["(" * 5000 + ")" * 5000]))
        == executor.main.EXIT_USAGE
    )
    err = capsys.readouterr().err
    assert "--run_only: invalid regular expression" in err and "nested too deeply" in err
    assert "recursion" not in err.lower()


def test_one_step_instead_of_a_list_is_refused_with_the_fix(tmp_path):
    step = write_step("b")
    with pytest.raises(
        StepDefinitionError, match=r"^steps must be a list of steps, got ExecutorStep 'b': pass \[step\]$"
    ):
        Executor(str(tmp_path), console=False).run(step)


def test_a_lease_too_big_to_be_one_is_refused_naming_its_file(tmp_path):
    from executor.lease import MAX_LEASE_BYTES, read_lease
    from executor.store import NotRegularFileError

    output = tmp_path / "a-1"
    output.mkdir()
    lease = lease_path(str(output))
    Path(lease).write_bytes(b"x" * (MAX_LEASE_BYTES + 1))
    with pytest.raises(NotRegularFileError) as refused:
        read_lease(open_store(str(tmp_path)), str(output))
    assert refused.value.path == lease and str(refused.value).startswith(f"{lease}: it is over")


def test_a_lone_carriage_return_starts_a_new_line_in_printed_logs():
    from executor.terminal import printable

    assert printable("50%\r100%\r\ndone\r") == "50%\n100%\ndone\n"


def test_a_memory_prefix_needs_no_bucket():
    from executor.store import StoreError, normalize_prefix

    assert normalize_prefix("memory:///runs") == "memory:///runs"
    with pytest.raises(StoreError):
        normalize_prefix("s3:///runs")


# -- fifteenth session: survivors of a 1-in-20 mutmut sample of executor/ ---------------------


def test_every_step_record_says_which_run_wrote_it(tmp_path, monkeypatch):
    """`.executor_info`'s "run": the experiment manifest, the script, the working directory and
    the git and Python the run came from (the runner's `run_record`)."""
    monkeypatch.chdir(tmp_path)
    step = ExecutorStep(name="recorded", fn=write_value, config=WriteConfig(this_output_path(), 1))
    executor = Executor(str(tmp_path / "out"), console=False)
    executor.run([step])
    with open(os.path.join(executor.output_paths[step], ".executor_info")) as handle:
        run = json.load(handle)["run"]
    assert set(run) == {"experiment", "script", "cwd", "git", "python"}
    assert run["experiment"] == executor.executor_info_path
    assert run["cwd"] == str(tmp_path)


def test_a_run_with_steps_to_run_checks_the_prefix_is_writable_even_with_a_manifest(tmp_path, monkeypatch):
    """Steps that will run: the prefix is checked first (one line naming it if it cannot be
    written), whether or not this experiment's manifest exists already. A fully cached re-run
    with a manifest checks nothing."""
    steps = [ExecutorStep(name="w", fn=write_value, config=WriteConfig(this_output_path(), 1))]
    prefix = str(tmp_path / "out")
    checked = []

    def run() -> Executor:
        executor = Executor(prefix, console=False)
        real = executor.store.check_writable
        monkeypatch.setattr(executor.store, "check_writable", lambda p: (checked.append(p), real(p)))
        executor.run(steps)
        return executor

    first = run()
    assert checked == [prefix] and os.path.exists(first.executor_info_path)
    checked.clear()
    run()  # cached, manifest there
    assert checked == []
    shutil.rmtree(first.output_paths[steps[0]])  # the step must run again; the manifest stays
    run()
    assert checked == [prefix]
