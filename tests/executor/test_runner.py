"""The runner on a real prefix: order, caching, failures, parallelism, selection, logs, events."""

import json
import logging
import os
import sys
import threading
from pathlib import Path

import pytest

from executor import (
    Executor,
    ExecutorRunError,
    ExecutorStep,
    output_path_of,
    this_output_path,
    versioned,
)
from executor.events import StepFailed, StepPlanned, StepSkipped, StepStarted, StepSucceeded
from executor.tree import Status, read_info, read_status
from tests.executor.steps_for_tests import CALLS, WriteConfig, fail, noop, write_value


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()


def write_step(name, value=0, inputs=(), key=None, fn=write_value, **kwargs):
    return ExecutorStep(
        name=name,
        fn=fn,
        config=WriteConfig(
            output_path=this_output_path(), value=versioned(value), inputs=list(inputs), key=key or name
        ),
        **kwargs,
    )


def statuses(executor, step):
    return [event.status for event in read_status(executor.store, executor.output_paths[step])]


def test_steps_run_in_dependency_order_and_write_their_outputs(any_prefix):
    a = write_step("a", 1)
    b = write_step("b", 2, inputs=[output_path_of(a)])
    executor = Executor(any_prefix, console=False)
    executor.run([b])
    assert statuses(executor, a) == [Status.RUNNING, Status.SUCCESS]
    assert statuses(executor, b) == [Status.RUNNING, Status.SUCCESS]
    out = executor.store.read_text(f"{executor.output_paths[b]}/value.json")
    assert json.loads(out) == [2, [1]]
    started = [e.name for e in executor.events if isinstance(e, StepStarted)]
    assert started == ["a", "b"]


def test_step_info_records_what_ran(tmp_path):
    a = write_step("data/a", 1, description="the first step", resources={"cpu": 1})
    b = write_step("data/b", 2, inputs=[a / "sub"], fn=noop)
    executor = Executor(str(tmp_path), console=False)
    executor.run([b])
    info = read_info(executor.store, executor.output_paths[b])
    assert info["name"] == "data/b"
    assert info["fn_name"] == "tests.executor.steps_for_tests:noop"
    assert info["output_path"] == executor.output_paths[b]
    assert info["config"]["output_path"] == executor.output_paths[b]
    assert info["config"]["inputs"] == [executor.output_paths[a] + "/sub"]
    assert info["version"]["config"] == {"value": 2, "inputs[0]": "DEP[0]/sub"}
    # Marin's ExecutorStepInfo form: dependencies as output paths, config as `asdict` gives it.
    assert info["dependencies"] == [executor.output_paths[a]]
    assert info["dependency_steps"] == [
        {"name": "data/a", "output_path": executor.output_paths[a], "blocking": True}
    ]
    assert "__type__" not in json.dumps(info["config"])
    assert info["config_types"] == {"": "WriteConfig"}
    info_a = read_info(executor.store, executor.output_paths[a])
    assert info_a["description"] == "the first step"
    assert info_a["resources"] == {"cpu": 1}


def test_a_second_run_skips_steps_that_succeeded(any_prefix):
    a = write_step("a", 1)
    b = write_step("b", 2, inputs=[output_path_of(a)])
    Executor(any_prefix, console=False).run([b])
    assert CALLS == {"a": 1, "b": 1}
    again = Executor(any_prefix, console=False)
    again.run([b])
    assert CALLS == {"a": 1, "b": 1}
    assert {e.name for e in again.events if isinstance(e, StepSkipped)} == {"a", "b"}
    assert not [e for e in again.events if isinstance(e, StepStarted)]


def test_changing_a_versioned_value_reruns_that_step_and_its_dependents_only(tmp_path):
    a = write_step("a", 1)
    side = write_step("side", 5)
    b = write_step("b", 2, inputs=[output_path_of(a)])
    Executor(str(tmp_path), console=False).run([b, side])
    a2 = write_step("a", 10)
    b2 = write_step("b", 2, inputs=[output_path_of(a2)])
    Executor(str(tmp_path), console=False).run([b2, side])
    assert CALLS == {"a": 2, "b": 2, "side": 1}


def test_a_failing_step_marks_dependents_dep_failed_and_lets_independent_branches_finish(any_prefix):
    bad = write_step("bad", fn=fail)
    child = write_step("child", inputs=[output_path_of(bad)])
    grandchild = write_step("grandchild", inputs=[output_path_of(child)])
    independent = write_step("independent", 3)
    executor = Executor(any_prefix, console=False)
    with pytest.raises(ExecutorRunError) as raised:
        executor.run([grandchild, independent])
    assert statuses(executor, bad)[-1] == Status.FAILED
    assert statuses(executor, child) == [Status.DEP_FAILED]
    assert statuses(executor, grandchild) == [Status.DEP_FAILED]
    assert statuses(executor, independent)[-1] == Status.SUCCESS
    assert "child" not in CALLS and "grandchild" not in CALLS
    message = str(raised.value)
    assert "bad" in message and "boom in bad" in message
    assert f"{executor.output_paths[bad]}/.executor_log" in message
    kinds = {e.name: e.kind for e in executor.events if isinstance(e, StepFailed)}
    assert kinds == {"bad": "error", "child": "dep_failed", "grandchild": "dep_failed"}


def test_a_failed_log_holds_the_traceback(tmp_path):
    bad = write_step("bad", fn=fail)
    executor = Executor(str(tmp_path), console=False)
    with pytest.raises(ExecutorRunError):
        executor.run([bad])
    log = executor.store.read_text(f"{executor.output_paths[bad]}/.executor_log")
    assert "Traceback" in log and "RuntimeError: boom in bad" in log


def test_previously_failed_steps_rerun_by_default(tmp_path):
    executor = Executor(str(tmp_path), console=False)
    with pytest.raises(ExecutorRunError):
        executor.run([write_step("flaky", fn=fail)])
    Executor(str(tmp_path), console=False).run([write_step("flaky")])  # same version, fixed function
    assert CALLS["flaky"] == 2
    assert statuses(executor, executor.steps[0]) == [
        Status.RUNNING,
        Status.FAILED,
        Status.RUNNING,
        Status.SUCCESS,
    ]


def test_previously_failed_steps_are_an_error_without_force_run_failed(tmp_path):
    with pytest.raises(ExecutorRunError):
        Executor(str(tmp_path), console=False).run([write_step("flaky", fn=fail)])
    other = write_step("other", 1)
    with pytest.raises(ValueError, match="failed previously"):
        Executor(str(tmp_path), console=False).run([write_step("flaky"), other], force_run_failed=False)
    assert CALLS == {"flaky": 1}


def test_a_step_calling_sys_exit_fails_instead_of_exiting(tmp_path):
    def exits(config):
        sys.exit(3)

    with pytest.raises(ExecutorRunError, match="SystemExit"):
        Executor(str(tmp_path), console=False).run([write_step("exits", fn=exits)])


def _concurrency_probe(limit_seen: list, lock: threading.Lock, active: list, release: threading.Event):
    def probe(config):
        with lock:
            active[0] += 1
            limit_seen.append(active[0])
        release.wait(0.3)
        with lock:
            active[0] -= 1

    return probe


def test_independent_steps_run_in_parallel(tmp_path):
    barrier = threading.Barrier(4, timeout=10)

    def meet(config):  # only returns if all four steps are running at the same time
        barrier.wait()

    steps = [write_step(f"p{i}", i, fn=meet) for i in range(4)]
    Executor(str(tmp_path), console=False).run(steps)


def test_max_concurrent_bounds_parallelism(tmp_path):
    seen, lock, active, release = [], threading.Lock(), [0], threading.Event()
    probe = _concurrency_probe(seen, lock, active, release)
    steps = [write_step(f"p{i}", i, fn=probe) for i in range(6)]
    Executor(str(tmp_path), console=False).run(steps, max_concurrent=2)
    assert max(seen) == 2


def test_run_only_runs_matching_steps_and_their_unfinished_blocking_dependencies(tmp_path):
    a = write_step("raw/a", 1)
    b = write_step("tok/b", 2, inputs=[output_path_of(a)])
    c = write_step("train/c", 3, inputs=[output_path_of(b)])
    executor = Executor(str(tmp_path), console=False)
    executor.run([c], run_only=["tok/"])
    assert CALLS == {"raw/a": 1, "tok/b": 1}
    assert statuses(executor, c) == []
    Executor(str(tmp_path), console=False).run([c], run_only=["train/.*"])
    assert CALLS == {"raw/a": 1, "tok/b": 1, "train/c": 1}


def test_run_only_does_not_select_succeeded_dependencies(tmp_path):
    a = write_step("raw/a", 1)
    b = write_step("tok/b", 2, inputs=[output_path_of(a)])
    Executor(str(tmp_path), console=False).run([a])
    executor = Executor(str(tmp_path), console=False)
    executor.run([b], run_only=["tok/b"])
    assert [row.name for row in executor.plan.rows] == ["tok/b"]


def test_nonblocking_parents_are_not_run(tmp_path):
    parent = write_step("parent", 1)
    child = write_step("child", 2, inputs=[output_path_of(parent).nonblocking()])
    executor = Executor(str(tmp_path), console=False)
    with pytest.raises(ExecutorRunError):  # child reads the parent's file, which does not exist
        executor.run([child])
    assert "parent" not in CALLS
    assert executor.configs[child].inputs == [executor.output_paths[parent]]


def test_nonblocking_parents_run_when_selected_by_run_only(tmp_path):
    parent = write_step("parent", 1)
    child = write_step("child", 2, inputs=[output_path_of(parent).nonblocking()])
    Executor(str(tmp_path), console=False).run([child], run_only=["parent"])
    assert CALLS == {"parent": 1}


def test_nonblocking_parents_run_when_a_blocking_child_needs_them(tmp_path):
    parent = write_step("parent", 1)
    lazy = write_step("lazy", 2, inputs=[output_path_of(parent).nonblocking()], fn=noop)
    eager = write_step("eager", 3, inputs=[output_path_of(parent)])
    Executor(str(tmp_path), console=False).run([lazy, eager])
    assert CALLS == {"parent": 1, "lazy": 1, "eager": 1}


def test_events_are_typed_and_ordered(tmp_path):
    a = write_step("a", 1)
    executor = Executor(str(tmp_path), console=False)
    executor.run([a])
    kinds = [type(e).__name__ for e in executor.events]
    assert kinds == ["StepPlanned", "StepStarted", "StepSucceeded", "RunFinished"]
    planned = executor.events[0]
    assert isinstance(planned, StepPlanned) and planned.action == "run" and planned.reason == "no output yet"
    assert isinstance(executor.events[2], StepSucceeded) and executor.events[2].duration >= 0


def test_listeners_receive_every_event(tmp_path):
    received = []
    Executor(str(tmp_path), console=False, listeners=[received.append]).run([write_step("a", 1)])
    assert [type(e).__name__ for e in received] == [
        "StepPlanned",
        "StepStarted",
        "StepSucceeded",
        "RunFinished",
    ]


def test_each_step_log_holds_only_its_own_output(tmp_path):
    barrier = threading.Barrier(2, timeout=10)

    def chatty(config):
        barrier.wait()  # both steps print at the same time, on different threads
        for i in range(20):
            print(f"stdout {config.key} {i}")
            logging.getLogger("chatty").warning("logging %s %d", config.key, i)
            print(f"stderr {config.key} {i}", file=sys.stderr)

    x, y = write_step("x", 1, fn=chatty), write_step("y", 2, fn=chatty)
    executor = Executor(str(tmp_path), console=False)
    executor.run([x, y])
    for step, me, other in ((x, "x", "y"), (y, "y", "x")):
        log = executor.store.read_text(f"{executor.output_paths[step]}/.executor_log")
        for i in range(20):
            assert f"stdout {me} {i}" in log and f"logging {me} {i}" in log and f"stderr {me} {i}" in log
        assert f" {other} " not in log


def test_the_console_shows_progress_lines(tmp_path, capfd):
    a = write_step("a", 1)
    b = write_step("b", 2, inputs=[output_path_of(a)])
    Executor(str(tmp_path)).run([b])
    out = capfd.readouterr().out
    assert "Plan: 2 steps" in out
    assert "[1/2 done, 0 running, 1 left] ok     a" in out
    assert "[2/2 done, 0 running, 0 left] finished" in out


def test_the_experiment_manifest_records_steps_and_provenance(tmp_path):
    a = write_step("a", 1)
    executor = Executor(str(tmp_path), console=False, description="a study")
    executor.run([a])
    path = executor.executor_info_path
    assert path.startswith(f"{tmp_path}/experiments/") and path.endswith(".json")
    with open(path) as handle:
        record = json.load(handle)
    assert record["description"] == "a study"
    assert record["steps"][0]["name"] == "a"
    assert record["steps"][0]["output_path"] == executor.output_paths[a]
    assert record["steps"][0]["outcome"] == "succeeded"
    for key in ("caller_path", "command_line", "user", "host", "python", "packages", "git", "created_date"):
        assert key in record
    assert record["packages"]["fsspec"]
    assert set(record["git"]) == {"commit", "dirty", "branch", "root"}
    assert record["git_commit"] == record["git"]["commit"]  # Marin's ExecutorInfo field
    # Every field of Marin's ExecutorStepInfo, with what the step's .executor_info says.
    step = record["steps"][0]
    info = read_info(executor.store, executor.output_paths[a])
    for key in ("name", "fn_name", "config", "description", "override_output_path", "version", "output_path"):
        assert step[key] == info[key], key
    assert step["dependencies"] == [] and step["config"]["value"] == 1
    assert step["version"]["name"] == "a"


def test_the_manifest_is_the_compact_dump_of_its_record_with_each_steps_own_outcome(tmp_path, monkeypatch):
    """Both manifest writes (at the start: no outcomes; at the end: each step's) are exactly
    `json.dumps(record, separators=(",", ":"))`, whatever the entries' encoding reuses."""
    import executor.executor as executor_module

    texts: list[str] = []
    real_write = executor_module.write_experiment_info

    def write_and_keep(store, path, *args, **kwargs):
        steps_json = real_write(store, path, *args, **kwargs)
        with open(path, encoding="ascii") as handle:  # ASCII: json.dumps's default escapes
            texts.append(handle.read())
        return steps_json

    monkeypatch.setattr(executor_module, "write_experiment_info", write_and_keep)
    ok = write_step("data/ok", "größe ✓")
    broken = write_step("broken", 2, fn=fail, description='says "hi"\n')
    after = write_step("after", 3, inputs=[output_path_of(broken)])
    executor = Executor(str(tmp_path), console=False, description="Studie: λ")
    with pytest.raises(ExecutorRunError):
        executor.run([ok, after])
    assert len(texts) == 2
    for text in texts:
        assert text == json.dumps(json.loads(text), separators=(",", ":")) + "\n"
    started, finished = (json.loads(text) for text in texts)
    assert [s["outcome"] for s in started["steps"]] == [None, None, None]
    assert {s["name"]: s["outcome"] for s in finished["steps"]} == {
        "data/ok": "succeeded",
        "broken": "failed",
        "after": "dep_failed",
    }
    assert finished["description"] == "Studie: λ" and finished["finished_date"]
    assert next(s for s in finished["steps"] if s["name"] == "broken")["description"] == 'says "hi"\n'
    assert [{k: v for k, v in s.items() if k != "outcome"} for s in started["steps"]] == [
        {k: v for k, v in s.items() if k != "outcome"} for s in finished["steps"]
    ]


def test_executor_info_base_path_inside_a_steps_output_is_refused_before_anything_runs(tmp_path):
    """Through the API (executor_main refuses the flag itself, exit 2): manifests inside a
    step's output would mix with its files and go with it when the output is removed."""
    from executor.graph import resolve

    a = write_step("a", 1)
    base = resolve([a], str(tmp_path / "out")).resolved(a).output_path + "/manifests"
    run = Executor(str(tmp_path / "out"), base, console=False)
    with pytest.raises(ValueError, match=r"executor_info_base_path .* is inside the output of step 'a'"):
        run.run([a])
    assert CALLS == {}
    assert not os.path.exists(base)


def test_executor_info_base_path_moves_the_manifest(tmp_path):
    executor = Executor(str(tmp_path / "out"), str(tmp_path / "manifests"), console=False)
    executor.run([write_step("a", 1)])
    assert os.path.dirname(executor.executor_info_path) == str(tmp_path / "manifests")
    assert os.path.exists(executor.executor_info_path)


def test_steps_that_ask_for_the_whole_machine_run_one_at_a_time_beside_light_steps(tmp_path):
    """A plain-dict `resources` (the older form) takes the whole machine on the local backend:
    such steps run one at a time, each in its own process, while light steps go on."""
    from tests.executor.steps_for_heavy import IntervalConfig, record_interval

    light_marker = tmp_path / "light-ran"
    heavy = [
        ExecutorStep(
            name=f"heavy{i}",
            fn=record_interval,
            config=IntervalConfig(
                output_path=this_output_path(), index=versioned(i), wait_for=str(light_marker)
            ),
            resources={"accelerator": "any"},
        )
        for i in range(3)
    ]
    light = write_step("light", 9, fn=lambda config: light_marker.write_text("x"))
    executor = Executor(str(tmp_path), console=False)
    executor.run([*heavy, light], max_concurrent=4)
    intervals = sorted(
        json.loads((Path(executor.output_paths[step]) / "interval.json").read_text()) for step in heavy
    )
    for (_, end, _), (start, _, _) in zip(intervals, intervals[1:], strict=False):
        assert end <= start, intervals  # never two at once
    assert {pid for _, _, pid in intervals}.isdisjoint({os.getpid()})  # not in the driver
