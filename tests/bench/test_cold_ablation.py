"""bench/cold_ablation.py measures what it says: each variant leaves out exactly its part of a
cold step's bookkeeping, and every part is back for the next variant."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench")


@pytest.fixture(scope="module")
def ablation():
    sys.path.insert(0, BENCH)  # (it imports its sibling executor_overhead)
    try:
        spec = importlib.util.spec_from_file_location(
            "cold_ablation", os.path.join(BENCH, "cold_ablation.py")
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(BENCH)


def tree_facts(prefix: str) -> dict[str, object]:
    """What a run of the 3-step chain left: the step directories and their bookkeeping."""
    steps = sorted(glob.glob(os.path.join(prefix, "chain", "step-*")))
    statuses = []
    for step in steps:
        with open(os.path.join(step, ".executor_status")) as handle:
            statuses.append([json.loads(line)["status"] for line in handle])
    return {
        "steps": len(steps),
        "done": all(os.path.exists(os.path.join(step, "done")) for step in steps),
        "info": [os.path.exists(os.path.join(step, ".executor_info")) for step in steps],
        "statuses": statuses,
        "leases left": glob.glob(os.path.join(prefix, "chain", "*", ".executor_status.lock")),
        "manifests": len(glob.glob(os.path.join(prefix, "experiments", "*.json"))),
    }


SHIPPED = {
    "steps": 3,
    "done": True,
    "info": [True] * 3,
    "statuses": [["RUNNING", "SUCCESS"]] * 3,
    "leases left": [],
    "manifests": 1,
}


@pytest.mark.parametrize(
    ("variant", "differs"),
    [
        ("as shipped", {}),
        ("heartbeats in a thread (no keeper messages)", {}),
        ("no experiment manifest", {"manifests": 0}),
        ("no .executor_info", {"info": [False] * 3}),
        ("no RUNNING line", {"statuses": [["SUCCESS"]] * 3}),
        ("no status read after the lease", {}),
        ("no lease", {}),
        (
            "none of the above",
            {"manifests": 0, "info": [False] * 3, "statuses": [["SUCCESS"]] * 3},
        ),
    ],
)
def test_each_variant_leaves_out_its_part_and_puts_it_back(ablation, tmp_path, variant, differs):
    ablated = str(tmp_path / "ablated")
    elapsed = ablation.run_variant(variant, "chain", ablated, size=3)
    assert elapsed > 0
    assert tree_facts(ablated) == {**SHIPPED, **differs}
    # The next run has every part back.
    shipped = str(tmp_path / "shipped")
    ablation.run_variant("as shipped", "chain", shipped, size=3)
    assert tree_facts(shipped) == SHIPPED


def test_the_lease_variants_take_no_lease(ablation, tmp_path, monkeypatch):
    """ "no lease" writes no lease file and tells no keeper; the shipped run does both."""
    from executor.store import LocalStore

    creates = []
    swap = LocalStore.compare_and_swap

    def recording(self, path, expected, new):
        if path.endswith(".executor_status.lock"):
            creates.append(path)
        return swap(self, path, expected, new)

    monkeypatch.setattr(LocalStore, "compare_and_swap", recording)
    ablation.run_variant("no lease", "chain", str(tmp_path / "a"), size=3)
    assert creates == []
    ablation.run_variant("as shipped", "chain", str(tmp_path / "b"), size=3)
    assert len(creates) == 3


def test_the_status_read_variant_reads_no_status_after_the_lease(ablation, tmp_path, monkeypatch):
    import executor.runner as runner

    reads = []
    read = runner.read_last_status
    monkeypatch.setattr(
        runner, "read_last_status", lambda store, path: reads.append(path) or read(store, path)
    )
    ablation.run_variant("no status read after the lease", "chain", str(tmp_path / "a"), size=3)
    assert reads == []
    ablation.run_variant("as shipped", "chain", str(tmp_path / "b"), size=3)
    assert len(reads) == 3


def test_the_table_has_one_row_a_variant_and_ratios_to_the_floor(ablation):
    times = {name: [2.0, 4.0] for name in ablation.VARIANTS}
    times[ablation.FLOOR] = [1.0, 2.0]
    text = ablation.table(times)
    rows = [line for line in text.splitlines()[2:]]
    assert len(rows) == len(ablation.VARIANTS) + 1
    assert "| as shipped | 3000 | 1500 | 2.00x |" in rows
    assert rows[-1] == "| the floor | 1500 | 0 | 1.00x |"
