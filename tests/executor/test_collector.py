"""The executor and the cyclic garbage collector: paused while a run plans and reports (not
while steps run), what a pause made promoted to the oldest generation, and its pass over every
live object at exit skipped (executor.collector) unless $MARIN_GC_AT_EXIT=1."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from dataclasses import dataclass

import pytest

from executor import Executor, ExecutorStep, this_output_path, versioned

SCRIPT = """
import atexit
import gc
import os
import sys
from dataclasses import dataclass

from executor import Executor, ExecutorStep, this_output_path, versioned

# Registered before the run: runs after the executor's exit handler (atexit is last-in, first-out).
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, flush=True))


@dataclass(frozen=True)
class Config:
    index: int
    output_path: str


def work(config):
    os.makedirs(config.output_path, exist_ok=True)


print("frozen before the run:", gc.get_freeze_count() > 0)
Executor(sys.argv[1], console=False).run(
    [ExecutorStep(name="s", fn=work, config=Config(versioned(1), this_output_path()))]
)
print("frozen after the run:", gc.get_freeze_count() > 0)
"""


def _run(tmp_path, **env: str) -> str:
    script = tmp_path / "experiment.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, **env},
    ).stdout


def test_the_collectors_last_pass_is_skipped_only_at_exit(tmp_path):
    out = _run(tmp_path)
    # Nothing is frozen while the script runs: garbage made during the run is still collected.
    assert "frozen before the run: False" in out and "frozen after the run: False" in out
    assert "frozen at exit: True" in out


def test_marin_gc_at_exit_keeps_the_last_pass(tmp_path):
    out = _run(tmp_path, MARIN_GC_AT_EXIT="1")
    assert "frozen at exit: False" in out


# -- the collector paused while a run plans and reports ---------------------------------------

_SEEN_IN_STEP: list[bool] = []


def _note_collector(config) -> None:
    _SEEN_IN_STEP.append(gc.isenabled())
    os.makedirs(config.output_path, exist_ok=True)


@dataclass(frozen=True)
class _Config:
    index: int
    output_path: str


def _steps():
    return [
        ExecutorStep(name=f"gc/s{i}", fn=_note_collector, config=_Config(versioned(i), this_output_path()))
        for i in range(3)
    ]


def test_the_collector_is_paused_while_planning_and_on_while_steps_run(tmp_path):
    seen_by_listener = []
    _SEEN_IN_STEP.clear()
    executor = Executor(
        str(tmp_path), console=False, listeners=[lambda event: seen_by_listener.append(gc.isenabled())]
    )
    assert gc.isenabled()
    executor.run(_steps())
    assert gc.isenabled()  # on again after the run
    # Planned events (the plan) came while it was paused; the steps ran with it on.
    assert seen_by_listener[:3] == [False, False, False]
    assert _SEEN_IN_STEP == [True, True, True]
    seen_by_listener.clear()
    executor.run(_steps())  # all cached: paused from the start to the report
    assert seen_by_listener and not any(seen_by_listener)
    assert gc.isenabled()


def test_the_collector_is_on_again_after_a_run_that_raises(tmp_path):
    bad = ExecutorStep(name="gc/bad", fn=_note_collector, config=_Config(versioned(1), this_output_path()))
    with pytest.raises(ValueError):
        Executor(str(tmp_path), console=False).run([bad, bad.with_output_path("experiments/x")])
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled(tmp_path):
    gc.disable()
    try:
        _SEEN_IN_STEP.clear()
        Executor(str(tmp_path), console=False).run(_steps())
        assert not gc.isenabled()
        assert _SEEN_IN_STEP == [False, False, False]
    finally:
        gc.enable()


@pytest.mark.parametrize("disabled_before", [False, True])
def test_import_leaves_the_collector_as_it_found_it(disabled_before):
    """On, with what the import made in the oldest generation (nothing frozen); or off, as the
    caller left it, and nothing moved."""
    code = (
        "import gc\n"
        + ("gc.disable()\n" if disabled_before else "")
        + "import executor\n"
        + "from executor.executor import Executor\n"
        + "oldest = any(obj is Executor.__dict__['run'] for obj in gc.get_objects(generation=2))\n"
        + "print(gc.isenabled(), gc.get_freeze_count(), oldest)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [str(not disabled_before), "0", str(not disabled_before)]


# -- what a pause made, promoted to the oldest generation --------------------------------------


@pytest.mark.parametrize("cached", [False, True])
def test_what_a_run_planned_is_promoted_to_the_oldest_generation(tmp_path, cached):
    if cached:
        Executor(str(tmp_path), console=False).run(_steps())
    gc.collect()  # (every generation's count at zero: unpromoted, the rows would be young or middle)
    plan = Executor(str(tmp_path), console=False).run(_steps())
    oldest = {id(obj) for obj in gc.get_objects(generation=2)}
    assert all(id(row) in oldest for row in plan.rows)


def test_garbage_made_before_and_during_a_run_is_still_collected(tmp_path):
    """Promoted, not frozen: a full collection still frees reference cycles made before the
    run and during it."""

    class Node:
        pass

    def cycle():
        node = Node()
        node.self = node
        return weakref.ref(node)

    before = cycle()
    seen_in_run = []
    Executor(str(tmp_path), console=False, listeners=[lambda event: seen_in_run.append(cycle())]).run(
        _steps()
    )
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert before() is None
    assert seen_in_run and all(ref() is None for ref in seen_in_run)


def test_a_program_that_froze_objects_keeps_them_frozen(tmp_path):
    """Promoting is `gc.freeze()` then `gc.unfreeze()`: it would thaw what a program froze on
    purpose (before forking workers, to spare their copy-on-write), so it is skipped then."""
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        Executor(str(tmp_path), console=False).run(_steps())
        assert gc.get_freeze_count() > frozen // 2 > 0  # (frozen objects can still be freed)
    finally:
        gc.unfreeze()
