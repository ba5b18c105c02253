"""The plan and the dry run: actions, reasons, why a hash changed, reuse warnings, and no writes."""

import logging
import os
import subprocess
import sys
import time

import pytest

from executor import Executor, ExecutorRunError, ExecutorStep, output_path_of, this_output_path, versioned
from executor.plan import Action
from executor.tree import LeaseRecord, lease_path
from tests.executor.steps_for_tests import WriteConfig, fail, write_value


def step(name, value=0, inputs=(), fn=write_value, key=None, label="x"):
    config = WriteConfig(
        output_path=this_output_path(), value=versioned(value), inputs=list(inputs), key=key or label
    )
    return ExecutorStep(name, fn, config)


def plan_of(prefix, steps, **kwargs):
    return Executor(prefix, console=False).run(steps, dry_run=True, **kwargs)


def test_a_dry_run_writes_nothing(tmp_path):
    prefix = tmp_path / "prefix"
    a = step("a", 1)
    plan = plan_of(str(prefix), [step("b", 2, inputs=[output_path_of(a)])])
    assert not prefix.exists()
    assert [(row.name, row.action) for row in plan.rows] == [("a", Action.RUN), ("b", Action.BLOCKED)]
    assert plan.rows[0].reason == "no output yet"
    assert plan.rows[1].reason == "no output yet; after dependency a will run"


def test_a_dry_run_after_a_run_plans_skips(tmp_path):
    a = step("a", 1)
    Executor(str(tmp_path), console=False).run([a])
    before = sorted(os.listdir(tmp_path))
    plan = plan_of(str(tmp_path), [a])
    assert [(row.action, row.reason) for row in plan.rows] == [(Action.SKIP, "already succeeded")]
    assert sorted(os.listdir(tmp_path)) == before


def test_the_plan_explains_which_versioned_field_changed_the_hash(tmp_path):
    Executor(str(tmp_path), console=False).run([step("a", 1)])
    executor = Executor(str(tmp_path), console=False)
    old_path = executor.run([step("a", 1)], dry_run=True).rows[0].output_path
    row = plan_of(str(tmp_path), [step("a", 2)]).rows[0]
    assert row.action == Action.RUN
    assert row.previous_output == old_path
    assert row.why_new == ("value: 1 -> 2",)


def test_the_plan_explains_an_upstream_change(tmp_path):
    a1 = step("up", 1)
    Executor(str(tmp_path), console=False).run([step("down", 5, inputs=[output_path_of(a1)])])
    a2 = step("up", 2)
    plan = plan_of(str(tmp_path), [step("down", 5, inputs=[output_path_of(a2)])])
    down = plan.rows[1]
    assert down.name == "down" and down.action == Action.BLOCKED
    assert len(down.why_new) == 1
    assert down.why_new[0].startswith("DEP[0] (up): upstream version ")
    text = plan.format()
    assert "hash differs from" in text and "DEP[0] (up)" in text and "value: 1 -> 2" in text


def test_the_plan_compares_with_the_most_recent_sibling(tmp_path):
    for value in (1, 2, 3):
        Executor(str(tmp_path), console=False).run([step("a", value)])
        time.sleep(0.01)
    row = plan_of(str(tmp_path), [step("a", 4)]).rows[0]
    assert row.why_new == ("value: 3 -> 4",)


def test_a_reused_output_with_other_unversioned_settings_is_flagged(tmp_path, caplog):
    Executor(str(tmp_path), console=False).run([step("a", 1, label="first")])
    with caplog.at_level(logging.WARNING):
        plan = Executor(str(tmp_path), console=False).run([step("a", 1, label="second")])
    row = plan.rows[0]
    assert row.action == Action.SKIP
    assert row.unversioned_changes == ("key: 'first' -> 'second'",)
    assert "key: 'first' -> 'second'" in caplog.text
    assert "WARNING: reusing an output made with other unversioned settings" in plan.format()


def test_identical_reuse_is_not_flagged(tmp_path):
    Executor(str(tmp_path), console=False).run([step("a", 1)])
    assert plan_of(str(tmp_path), [step("a", 1)]).rows[0].unversioned_changes == ()


def test_a_step_held_by_a_live_driver_is_planned_as_wait(tmp_path):
    a = step("a", 1)
    output = plan_of(str(tmp_path), [a]).rows[0].output_path
    holder = LeaseRecord(worker="host:42:abc", heartbeat=time.time())
    Executor(str(tmp_path), console=False).store.write_atomic(lease_path(output), holder.to_bytes())
    b = step("b", 2, inputs=[output_path_of(a)])
    plan = plan_of(str(tmp_path), [b])
    assert plan.rows[0].action == Action.WAIT
    assert "running elsewhere: held by host:42:abc, last heartbeat" in plan.rows[0].reason
    assert plan.rows[1].action == Action.BLOCKED and "a runs elsewhere" in plan.rows[1].reason


def test_a_step_with_a_stale_lease_is_planned_as_a_takeover(tmp_path):
    a = step("a", 1)
    output = plan_of(str(tmp_path), [a]).rows[0].output_path
    dead = LeaseRecord(worker="host:7:dead", heartbeat=time.time() - 3600)
    Executor(str(tmp_path), console=False).store.write_atomic(lease_path(output), dead.to_bytes())
    row = plan_of(str(tmp_path), [a]).rows[0]
    assert row.action == Action.RUN and row.reason.startswith("stale lease of host:7:dead")


def test_failed_steps_are_planned_as_reruns_or_errors(tmp_path):
    bad = step("bad", 1, fn=fail)
    with pytest.raises(ExecutorRunError):
        Executor(str(tmp_path), console=False).run([bad])
    assert plan_of(str(tmp_path), [bad]).rows[0].reason == "failed before; re-running (force_run_failed)"
    row = plan_of(str(tmp_path), [bad], force_run_failed=False).rows[0]
    assert row.action == Action.ERROR and "failed previously" in row.reason


def test_the_plan_table_lists_every_step_with_its_output_path(tmp_path):
    a = step("data/a", 1)
    plan = plan_of(str(tmp_path), [step("data/b", 2, inputs=[output_path_of(a)])])
    text = plan.format()
    assert text.startswith("Plan: 2 steps (1 run, 1 blocked)")
    for row in plan.rows:
        assert row.name in text and row.output_path in text


def test_importing_the_executor_and_a_dry_run_do_not_import_jax_or_levanter(tmp_path):
    code = (
        "import sys\n"
        "from executor import Executor\n"
        "from experiments.tutorials.hello_world import stats\n"
        f"Executor({str(tmp_path)!r}, console=False).run([stats], dry_run=True)\n"
        "heavy = [m for m in ('jax', 'levanter', 'haliax', 'torch', 'numpy') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": repo},
    )
    assert "HEAVY []" in result.stdout
