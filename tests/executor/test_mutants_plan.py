"""The plan, pinned where mutation testing found no test: every row's reason, status and
lease, blocked rows naming the right dependency, run_only errors, status reads on an object
store in batches, hash collisions without a stored info, and which sibling a new version is
compared with.

Through `Executor.run(dry_run=True)` and `make_plan`, and the plan's rows and table.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid

import pytest

from executor import Executor, ExecutorStep, LeaseConfig, output_path_of, this_output_path, versioned
from executor.graph import StepDefinitionError, resolve
from executor.lease import LeaseManager
from executor.plan import Action, RunOnlyError, compile_run_only, make_plan
from executor.store import open_store
from executor.tree import LeaseRecord, Status, append_status, info_path, lease_path, utc_now_iso
from tests.executor.steps_for_tests import WriteConfig, write_value

QUIET = LeaseConfig(heartbeat_interval=5.0, timeout=60.0, poll_interval=0.05)


def step(name, value=0, inputs=(), key="x"):
    config = WriteConfig(output_path=this_output_path(), value=versioned(value), inputs=list(inputs), key=key)
    return ExecutorStep(name, write_value, config)


def dry_run(prefix, steps, **kwargs):
    return Executor(prefix, console=False, lease_config=QUIET).run(steps, dry_run=True, **kwargs)


def path_of(prefix, declared):
    return resolve([declared], prefix).resolved(declared).output_path


def set_status(prefix, declared, status, message=None):
    append_status(open_store(prefix), path_of(prefix, declared), status, message, "other:1:x")


def put_lease(prefix, declared, heartbeat, worker="host:9:w"):
    record = LeaseRecord(worker=worker, heartbeat=heartbeat)
    open_store(prefix).write_atomic(lease_path(path_of(prefix, declared)), record.to_bytes())
    return record


# -- the reason, status and lease of each kind of row -------------------------------------------


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (None, "no output yet"),
        (Status.RUNNING, "a previous run did not finish (no live lease)"),
        (Status.DEP_FAILED, "a dependency failed in a previous run; trying again"),
        (Status.FAILED, "failed before; re-running (force_run_failed)"),
    ],
)
def test_each_earlier_status_without_a_lease_gives_a_run_row_saying_why(tmp_path, status, reason):
    prefix = str(tmp_path)
    a = step("a", 1)
    if status is not None:
        set_status(prefix, a, status, "m")
    (row,) = dry_run(prefix, [a]).rows
    assert (row.action, row.reason, row.status, row.lease) == (Action.RUN, reason, status, None)
    assert row.why_new == () and row.unversioned_changes == () and row.status_error is None


def test_a_failed_step_without_force_run_failed_is_an_error_naming_its_log_and_the_flag(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1)
    set_status(prefix, a, Status.FAILED, "boom")
    (row,) = dry_run(prefix, [a], force_run_failed=False).rows
    assert row.action == Action.ERROR and row.status == Status.FAILED and row.status_error is None
    assert row.reason == (
        f"failed previously (log: {path_of(prefix, a)}/.executor_log); re-run with --force_run_failed true"
    )


@pytest.mark.parametrize("status", [None, Status.RUNNING])
def test_a_live_lease_makes_a_wait_row_naming_holder_and_heartbeat(tmp_path, status):
    prefix = str(tmp_path)
    a = step("a", 1)
    if status is not None:
        set_status(prefix, a, status)
    now = time.time()
    record = put_lease(prefix, a, heartbeat=now - 1)
    (row,) = dry_run(prefix, [a]).rows
    assert row.action == Action.WAIT and row.status == status and row.lease == record
    assert (
        row.reason == f"running elsewhere: held by host:9:w, last heartbeat {utc_now_iso(record.heartbeat)}"
    )


def test_a_stale_lease_makes_a_run_row_naming_holder_and_last_heartbeat(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1)
    set_status(prefix, a, Status.RUNNING)
    now = time.time()
    record = put_lease(prefix, a, heartbeat=now - QUIET.timeout - 5)
    (row,) = dry_run(prefix, [a]).rows
    assert row.action == Action.RUN and row.status == Status.RUNNING and row.lease == record
    assert row.reason == (
        f"stale lease of host:9:w (last heartbeat {utc_now_iso(record.heartbeat)}) will be taken over"
    )


def test_a_lease_is_judged_by_the_leases_timeout_at_plan_time(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1)
    now = time.time()
    put_lease(prefix, a, heartbeat=now - QUIET.timeout + 5)  # 55 s old of 60
    (row,) = dry_run(prefix, [a]).rows
    assert row.action == Action.WAIT


def test_a_succeeded_step_ignores_any_lease(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1)
    Executor(prefix, console=False).run([a])
    put_lease(prefix, a, heartbeat=time.time())
    (row,) = dry_run(prefix, [a]).rows
    assert (row.action, row.reason, row.status, row.lease) == (
        Action.SKIP,
        "already succeeded",
        Status.SUCCESS,
        None,
    )


# -- blocked rows ------------------------------------------------------------------------------


def test_a_step_after_a_waiting_dependency_is_blocked_naming_it(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1)
    b = step("b", 2, inputs=[output_path_of(a)])
    put_lease(prefix, a, heartbeat=time.time())
    rows = dry_run(prefix, [b]).rows
    assert [(r.name, r.action) for r in rows] == [("a", Action.WAIT), ("b", Action.BLOCKED)]
    assert rows[1].reason == "no output yet; after dependency a runs elsewhere"


def test_an_erroring_dependency_is_named_before_one_that_will_run(tmp_path):
    # b needs a (will run) and e (has an unreadable status file): b is blocked for good
    # by e, so e is the dependency its reason names, though a comes first.
    prefix = str(tmp_path)
    a = step("a", 1)
    e = step("e", 2)
    b = step("b", 3, inputs=[output_path_of(a), output_path_of(e)])
    store = open_store(prefix)
    store.write_atomic(f"{path_of(prefix, e)}/.executor_status", b"\xff\xfe not utf-8\n")
    rows = {row.name: row for row in dry_run(prefix, [b]).rows}
    assert rows["a"].action == Action.RUN and rows["e"].action == Action.ERROR
    assert rows["e"].status_error is not None and rows["e"].reason == str(rows["e"].status_error)
    assert rows["b"].action == Action.BLOCKED
    assert rows["b"].reason == "no output yet; after dependency e has an error (see its row)"


def test_a_dependency_that_failed_before_blocks_without_force_run_failed(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1)
    b = step("b", 2, inputs=[output_path_of(a)])
    set_status(prefix, a, Status.FAILED, "boom")
    rows = dry_run(prefix, [b], force_run_failed=False).rows
    assert [r.action for r in rows] == [Action.ERROR, Action.BLOCKED]
    assert rows[1].reason == "no output yet; after dependency a has an error (see its row)"


def test_a_step_after_a_blocked_dependency_is_blocked_too(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1)
    b = step("b", 2, inputs=[output_path_of(a)])
    c = step("c", 3, inputs=[output_path_of(b)])
    rows = dry_run(prefix, [c]).rows
    assert [r.action for r in rows] == [Action.RUN, Action.BLOCKED, Action.BLOCKED]
    assert rows[2].reason == "no output yet; after dependency b will run"


def test_a_step_after_a_skipped_dependency_is_not_blocked(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1)
    Executor(prefix, console=False).run([a])
    b = step("b", 2, inputs=[output_path_of(a)])
    rows = dry_run(prefix, [b]).rows
    assert [(r.action, r.reason) for r in rows] == [
        (Action.SKIP, "already succeeded"),
        (Action.RUN, "no output yet"),
    ]


def test_a_step_that_waits_itself_is_not_also_blocked(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1)
    b = step("b", 2, inputs=[output_path_of(a)])
    put_lease(prefix, b, heartbeat=time.time())
    rows = dry_run(prefix, [b]).rows
    assert [r.action for r in rows] == [Action.RUN, Action.WAIT]


# -- the table ---------------------------------------------------------------------------------


def test_the_table_counts_actions_in_order_of_first_appearance(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1)
    Executor(prefix, console=False).run([a])
    b = step("b", 2, inputs=[output_path_of(a)])
    c = step("c", 3, inputs=[output_path_of(b)])
    plan = dry_run(prefix, [c])
    assert plan.counts() == {"skip": 1, "run": 1, "blocked": 1}
    assert list(plan.counts()) == ["skip", "run", "blocked"]
    assert plan.format().splitlines()[0] == "Plan: 3 steps (1 skip, 1 run, 1 blocked)"
    assert plan.format().splitlines()[5] == "  blocked c  no output yet; after dependency b will run"


# -- run_only --------------------------------------------------------------------------------


def test_compile_run_only_accepts_none_one_string_or_a_list():
    assert compile_run_only(None) is None
    assert [p.pattern for p in compile_run_only("a.*")] == ["a.*"]
    assert [p.pattern for p in compile_run_only(["a", "b$"])] == ["a", "b$"]
    assert compile_run_only([]) == []


def test_compile_run_only_names_an_invalid_regex():
    with pytest.raises(RunOnlyError) as raised:
        compile_run_only(["ok", "(unclosed"])
    assert str(raised.value).startswith("run_only: invalid regular expression '(unclosed': ")
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_compile_run_only_names_a_pattern_that_is_not_a_string():
    with pytest.raises(RunOnlyError) as raised:
        compile_run_only(["ok", 3])
    assert str(raised.value) == "run_only: expected regexes (strings), got int 3"


def test_run_only_matching_nothing_warns_with_the_patterns_and_every_step_once_sorted(tmp_path, caplog):
    a = step("zeta", 1)
    b = step("alpha", 2, inputs=[output_path_of(a)])
    with caplog.at_level(logging.WARNING, logger="executor.plan"):
        plan = dry_run(str(tmp_path), [b], run_only=["nope", "nada"])
    assert list(plan.rows) == []
    assert [r.getMessage() for r in caplog.records] == [
        "run_only patterns 'nope', 'nada' match no step; the steps are: alpha, zeta"
    ]


def test_run_only_warns_only_about_the_pattern_that_matched_nothing(tmp_path, caplog):
    a, b = step("data/a", 1), step("train/a", 2)
    with caplog.at_level(logging.WARNING, logger="executor.plan"):
        rows = dry_run(str(tmp_path), [a, b], run_only=["^train", "nothing"]).rows
    assert [r.name for r in rows] == ["train/a"]
    assert [r.getMessage() for r in caplog.records] == [
        "run_only pattern 'nothing' matches no step; the steps are: data/a, train/a"
    ]


def test_run_only_warning_lists_at_most_twenty_names(tmp_path, caplog):
    steps = [step(f"s{i:02d}", i) for i in range(25)]
    with caplog.at_level(logging.WARNING, logger="executor.plan"):
        dry_run(str(tmp_path), steps, run_only=["zzz"])
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.endswith("s18, s19, ... (5 more)") and "s20" not in message


def test_run_only_matches_anywhere_in_the_name_as_marin_does(tmp_path):
    a = step("data/a", 1)
    b = step("train/a", 2)
    rows = dry_run(str(tmp_path), [a, b], run_only=["a$"]).rows  # re.search: the end of both names
    assert [r.name for r in rows] == ["data/a", "train/a"]
    rows = dry_run(str(tmp_path), [a, b], run_only=["rain"]).rows
    assert [r.name for r in rows] == ["train/a"]


def test_run_only_takes_dependencies_that_have_not_succeeded_and_leaves_succeeded_ones(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1)
    b = step("b", 2, inputs=[output_path_of(a)])
    c = step("c", 3, inputs=[output_path_of(b)])
    assert [r.name for r in dry_run(prefix, [c], run_only=["c"]).rows] == ["a", "b", "c"]
    Executor(prefix, console=False).run([a])
    set_status(prefix, b, Status.FAILED, "boom")
    assert [r.name for r in dry_run(prefix, [c], run_only=["c"]).rows] == ["b", "c"]


# -- statuses read on an object store ------------------------------------------------------------


def test_statuses_of_many_steps_on_an_object_store_land_on_the_right_rows():
    # memory:// is not local: statuses are read in parallel batches of 64. Every row must
    # get its own step's status (every third step succeeded, every fifth failed).
    prefix = f"memory://plan-{uuid.uuid4().hex}"
    steps = [step(f"s{i:03d}", i) for i in range(150)]
    store = open_store(prefix)
    for i, declared in enumerate(steps):
        if i % 3 == 0:
            set_status(prefix, declared, Status.RUNNING)
            append_status(
                store,
                path_of(prefix, declared),
                Status.SUCCESS,
                None,
                "w",
                version_hash=resolve([declared], prefix).resolved(declared).version_hash,
            )
        elif i % 5 == 0:
            set_status(prefix, declared, Status.FAILED, "boom")
    rows = {row.name: row for row in dry_run(prefix, steps).rows}
    assert len(rows) == 150
    for i in range(150):
        row = rows[f"s{i:03d}"]
        expected = Status.SUCCESS if i % 3 == 0 else Status.FAILED if i % 5 == 0 else None
        assert row.status == expected, row.name
        assert row.action == (Action.SKIP if i % 3 == 0 else Action.RUN), row.name


def test_an_unreadable_status_on_an_object_store_is_an_error_row_for_that_step_only():
    prefix = f"memory://plan-{uuid.uuid4().hex}"
    a, b = step("a", 1), step("b", 2)
    open_store(prefix).write_atomic(f"{path_of(prefix, a)}/.executor_status", b'{"status": "EXPLODED"}\n')
    rows = {row.name: row for row in dry_run(prefix, [a, b]).rows}
    assert rows["a"].action == Action.ERROR and rows["a"].status_error is not None
    assert rows["b"].action == Action.RUN and rows["b"].reason == "no output yet"


# -- succeeded outputs of another version --------------------------------------------------------


def test_a_collision_whose_recorded_versions_look_alike_still_says_the_versions_differ(tmp_path):
    # The stored info records the same version, but the status names another hash: no
    # field explains the difference, and the refusal must not end in an empty list.
    prefix = str(tmp_path)
    a = step("a", 1)
    Executor(prefix, console=False).run([a])
    path = path_of(prefix, a)
    append_status(open_store(prefix), path, Status.SUCCESS, None, "w", version_hash="f" * 64)
    with pytest.raises(StepDefinitionError) as raised:
        dry_run(prefix, [a])
    message = str(raised.value)
    assert message.startswith(f"step 'a': {path} holds a different version of this step ({'f' * 12} vs ")
    assert message.endswith(
        "; (versions differ)). This is a hash collision; rename the step or delete that output"
    )


def test_a_collision_without_a_stored_info_lists_every_field_as_new(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1)
    append_status(open_store(prefix), path_of(prefix, a), Status.SUCCESS, None, "w", version_hash="f" * 64)
    with pytest.raises(StepDefinitionError, match=r"value: added \(1\)"):
        dry_run(prefix, [a])


def test_an_override_path_with_a_look_alike_version_is_reused_saying_versions_differ(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1).with_output_path("fixed")
    Executor(prefix, console=False).run([a])
    append_status(open_store(prefix), f"{prefix}/fixed", Status.SUCCESS, None, "w", version_hash="f" * 64)
    (row,) = dry_run(prefix, [a]).rows
    assert row.action == Action.SKIP and row.unversioned_changes == ("(versions differ)",)


def test_a_success_without_version_or_digest_is_reused_without_warnings(tmp_path):
    # Outputs written by older executors (or Marin) record neither: trusted as they are.
    prefix = str(tmp_path)
    a = step("a", 1)
    append_status(open_store(prefix), path_of(prefix, a), Status.SUCCESS, None, "w")
    (row,) = dry_run(prefix, [a]).rows
    assert (row.action, row.reason, row.unversioned_changes) == (Action.SKIP, "already succeeded", ())


def succeeded_with_another_config(prefix, declared):
    """A SUCCESS of this version whose recorded config digest is another config's."""
    resolved = resolve([declared], prefix).resolved(declared)
    append_status(
        open_store(prefix),
        resolved.output_path,
        Status.SUCCESS,
        None,
        "w",
        version_hash=resolved.version_hash,
        config_digest="0" * 16,
    )


def test_a_changed_config_digest_without_a_stored_info_says_which_fields_is_unknown(tmp_path):
    """Without the recorded config there is nothing to compare with: every field listed as
    'added' (as before) claimed even the versioned ones had changed."""
    prefix = str(tmp_path)
    a = step("a", 1, key="k")
    succeeded_with_another_config(prefix, a)
    (row,) = dry_run(prefix, [a]).rows
    assert row.action == Action.SKIP and row.reason == "already succeeded"
    assert row.unversioned_changes == (
        f"which ones is unknown: {row.output_path}/.executor_info cannot be read",
    )


# -- which earlier output a new version is compared with -------------------------------------------


def test_a_new_version_is_compared_with_the_sibling_whose_last_status_is_newest(tmp_path):
    prefix = str(tmp_path)
    for value in (1, 2, 3):
        Executor(prefix, console=False).run([step("s", value)])
    paths = {value: path_of(prefix, step("s", value)) for value in (1, 2, 3)}
    # value 1's output is touched last: its newest status line decides, not its directory name.
    time.sleep(0.01)
    append_status(open_store(prefix), paths[1], Status.SUCCESS, None, "w")
    (row,) = dry_run(prefix, [step("s", 4)]).rows
    assert row.previous_output == paths[1] and row.why_new == ("value: 1 -> 4",)


def test_siblings_without_a_readable_info_or_of_another_length_are_ignored(tmp_path):
    prefix = str(tmp_path)
    Executor(prefix, console=False).run([step("s", 1)])
    old = path_of(prefix, step("s", 1))
    newer = step("s", 2)
    Executor(prefix, console=False).run([newer])
    newer_path = path_of(prefix, newer)
    os.remove(info_path(newer_path))  # its info is gone: it cannot explain anything
    # A directory one character longer, with a newer status and an info: not a sibling.
    shutil.copytree(newer_path, newer_path + "0")
    shutil.copy(info_path(old), info_path(newer_path + "0"))
    append_status(open_store(prefix), newer_path + "0", Status.SUCCESS, None, "w")
    # A plain file with a sibling's name: not an output.
    open(f"{prefix}/s-0000000f", "w").close()
    (row,) = dry_run(prefix, [step("s", 3)]).rows
    assert row.previous_output == old and row.why_new == ("value: 1 -> 3",)


def test_a_sibling_without_any_status_still_explains_a_new_version(tmp_path):
    prefix = str(tmp_path)
    Executor(prefix, console=False).run([step("s", 1)])
    old = path_of(prefix, step("s", 1))
    os.remove(f"{old}/.executor_status")
    (row,) = dry_run(prefix, [step("s", 2)]).rows
    assert row.previous_output == old and row.why_new == ("value: 1 -> 2",)


def test_only_a_step_that_has_never_run_is_compared_with_siblings(tmp_path):
    prefix = str(tmp_path)
    Executor(prefix, console=False).run([step("s", 1)])
    again = step("s", 2)
    set_status(prefix, again, Status.RUNNING)
    (row,) = dry_run(prefix, [again]).rows
    assert row.action == Action.RUN and (row.previous_output, row.why_new) == (None, ())


def test_siblings_explain_each_step_in_a_shared_directory(tmp_path):
    # The listing of a directory is read once and reused for the next step in it.
    prefix = str(tmp_path)
    Executor(prefix, console=False).run([step("g/a", 1), step("g/b", 1)])
    rows = dry_run(prefix, [step("g/a", 2), step("g/b", 3)]).rows
    assert [r.why_new for r in rows] == [("value: 1 -> 2",), ("value: 1 -> 3",)]


def test_make_plan_with_a_graph_and_leases_directly(tmp_path):
    prefix = str(tmp_path)
    a = step("a", 1)
    graph = resolve([a], prefix)
    store = open_store(prefix)
    leases = LeaseManager(store, QUIET, "w")
    plan = make_plan(graph, [a], store, leases, run_only="a", force_run_failed=False)
    assert [(r.name, r.action, r.reason) for r in plan.rows] == [("a", Action.RUN, "no output yet")]
    assert plan.graph is graph


def test_fields_a_config_class_gained_unset_are_no_unversioned_change(tmp_path):
    """An output made before its config class gained an optional field (recorded without it)
    is reused quietly while the new field is unset; a field that differs is still named."""
    import json

    prefix = str(tmp_path)
    a = ExecutorStep("a", write_value, WriteConfig(output_path=this_output_path(), value=None, key="k"))
    Executor(prefix, console=False).run([a])
    path = info_path(path_of(prefix, a))
    with open(path) as handle:
        info = json.load(handle)
    for field in ("value", "inputs"):  # None and [] today, absent when it ran
        del info["config"][field]
    info["config"]["key"] = "other"
    with open(path, "w") as handle:
        json.dump(info, handle)
    succeeded_with_another_config(prefix, a)
    (row,) = dry_run(prefix, [a]).rows
    assert row.unversioned_changes == ("key: 'other' -> 'k'",)
