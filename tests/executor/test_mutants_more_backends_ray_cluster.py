"""executor/backends/ray_cluster.py: a gang member's first line reaches its console at once.

GangMember.run prints where process `index` of a gang runs before calling the step function.
Ray sends an actor's stdout to the driver from a file, block-buffered: without the flush, the
line would reach the console only with whatever the step prints later, or not at all if the
process is killed. The console stream here records what it held at each flush, and the step
function looks at it before doing anything.
"""

from __future__ import annotations

import os
import sys
import types

import pytest

from executor.backends import ray_cluster as rc
from tests.executor.backend_stand_ins import FlushRecorder


@pytest.fixture(autouse=True)
def _process_state_restored():
    """GangMember sets what a step's own process would keep (os.environ, sys.path)."""
    environ, path = dict(os.environ), list(sys.path)
    yield
    os.environ.clear()
    os.environ.update(environ)
    sys.path[:] = path


_CONSOLE: list[FlushRecorder] = []
_SEEN_BY_STEP: list[list[str]] = []


def _step(config):
    """What the console had been flushed with when the step started (a module-level function:
    cloudpickle sends it by name, so it sees this module's lists, not copies)."""
    _SEEN_BY_STEP.append(list(_CONSOLE[-1].flushed))


def test_a_gang_member_flushes_where_it_runs_before_the_step_starts(tmp_path, monkeypatch):
    cloudpickle = pytest.importorskip("cloudpickle")
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(
        ray, "get_runtime_context", lambda: types.SimpleNamespace(get_node_id=lambda: "node-7")
    )
    spec = types.SimpleNamespace(name="train", prefix=str(tmp_path), output_path=f"{tmp_path}/train-1")
    console = FlushRecorder()
    _CONSOLE[:] = [console]
    _SEEN_BY_STEP.clear()
    blob = cloudpickle.dumps((_step, None))
    monkeypatch.setattr(sys, "stdout", console)
    result = rc.GangMember().run(blob, [], spec, 1, 2, {})
    monkeypatch.undo()
    assert result == {"outcome": "succeeded", "error": None}
    (flushed,) = _SEEN_BY_STEP
    assert flushed and flushed[-1] == (
        f"[executor] train: process 1 of 2 on Ray node node-7, process {os.getpid()}\n"
    )
