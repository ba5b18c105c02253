"""`marin reproduce` leaves out what a step function declares as records of its run (logs,
timings), and still reports every other difference."""

from __future__ import annotations

import os

from executor import Executor
from marin.cli import main
from marin.outputs import OutputTree
from tests.marin.run_records_study import fit_step


def reproduce(capsys, prefix: str, into: str) -> tuple[int, str]:
    code = main(["reproduce", "checkpoints/fit", "--prefix", prefix, "--into", into])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_declared_run_records_are_listed_not_compared(capsys, tmp_path):
    Executor(str(tmp_path / "tree"), console=False).run([fit_step()])
    code, out = reproduce(capsys, str(tmp_path / "tree"), str(tmp_path / "again"))
    assert code == 0, out
    assert "checkpoints/fit: equal (3 identical file(s))" in out  # metrics.jsonl, stats.json, weights.bin
    assert "not compared (records of the run, as checkpoints/fit's function declares): 3 file(s)" in out
    assert "stats.json: seconds" in out and "stats.json: runs.host" in out and "metrics.jsonl: time/*" in out
    assert "result: outputs are identical" in out
    # What was left out really differs: each run's log has its own name.
    original, copy = (
        OutputTree(str(tmp_path / prefix)).find("checkpoints/fit").path for prefix in ("tree", "again")
    )
    logs = [os.listdir(os.path.join(path, "logs")) for path in (original, copy)]
    assert len(logs[0]) == len(logs[1]) == 1 and logs[0] != logs[1]


def test_a_difference_outside_the_declared_fields_is_still_reported(capsys, tmp_path):
    Executor(str(tmp_path / "tree"), console=False).run([fit_step(drift=True)])
    code, out = reproduce(capsys, str(tmp_path / "tree"), str(tmp_path / "again"))
    assert code == 1, out
    assert "checkpoints/fit: DIFFERENT" in out
    assert "differs: metrics.jsonl" in out and "differs: stats.json" in out
    assert "weights.bin" not in out.split("DIFFERENT")[1]
