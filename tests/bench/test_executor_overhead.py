"""bench/executor_overhead.py's verdicts: the cold target is not judged on a slow disk."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")


@pytest.fixture(scope="module")
def overhead():
    sys.path.insert(0, BENCH)  # (it imports its sibling revision, and dataclasses need it in sys.modules)
    try:
        yield importlib.import_module("executor_overhead")
    finally:
        sys.path.remove(BENCH)


def row(overhead, shape, cold, floor, memory):
    """A 1,000-step row with the cold figures given (seconds, one a round) and cached re-runs at 1.1x."""
    return overhead.Row(
        shape=shape,
        size=1000,
        build_hash=[0.02],
        plan=[0.02],
        cold=cold,
        cold_floor=floor,
        warm=[0.022] * len(cold),
        floor=[0.02] * len(cold),
        warm_import=[0.01],
        cold_floor_memory=memory,
    )


def cold_line(lines):
    (line,) = [line for line in lines if line.startswith("target: cold run")]
    return line


def test_a_ratio_under_the_target_on_a_quiet_disk_is_met(overhead):
    rows = [row(overhead, "chain", [0.2, 0.2], [0.1, 0.1], [0.05, 0.05])]  # disk 2x memory: quiet
    lines, values = overhead.targets(rows)
    assert cold_line(lines).endswith("2.00x (worst shape: chain) MET")
    assert values["cold_vs_floor_1000"] == pytest.approx(2.0)
    assert values["cold_floor_disk_vs_memory_1000"] == pytest.approx(2.0)


def test_a_ratio_under_the_target_on_a_slow_disk_is_not_judged(overhead):
    quiet = row(overhead, "chain", [0.2, 0.2], [0.1, 0.1], [0.05, 0.05])
    slow = row(overhead, "fanin", [1.0, 1.0], [0.5, 0.5], [0.04, 0.04])  # disk 12.5x memory
    lines, values = overhead.targets([quiet, slow])
    line = cold_line(lines)
    assert "MET" not in line.replace("NOT JUDGED", "")
    assert "NOT JUDGED: the disk was slow (fanin: 500 us a step on disk, 40 in memory" in line
    assert "chain:" not in line  # only the slow shape is named
    assert values["cold_floor_disk_vs_memory_1000"] == pytest.approx(12.5)


def test_a_ratio_over_the_target_is_not_met_however_slow_the_disk(overhead):
    slow = row(overhead, "chain", [2.0, 2.0], [0.5, 0.5], [0.04, 0.04])  # 4x on a slow disk
    lines, _ = overhead.targets([slow])
    assert cold_line(lines).endswith("4.00x (worst shape: chain) NOT MET")


def test_without_a_memory_floor_the_verdict_is_the_ratio_alone(overhead):
    rows = [row(overhead, "chain", [0.2], [0.1], [])]  # --tmp-dir in memory already
    lines, values = overhead.targets(rows)
    assert cold_line(lines).endswith("MET")
    assert "cold_floor_disk_vs_memory_1000" not in values


def test_memory_is_not_a_disk(overhead, tmp_path):
    if not os.path.isdir(overhead.MEMORY_DIR):
        pytest.skip(f"no {overhead.MEMORY_DIR} here")
    assert overhead.on_disk(overhead.MEMORY_DIR) is False
    assert overhead.on_disk(os.path.join(overhead.MEMORY_DIR, ".")) is False
    assert overhead.on_disk("/nonexistent/place") is False
