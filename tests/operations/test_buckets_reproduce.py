"""`marin reproduce` across storages: the quickstart made on local disk is reproduced into an S3
prefix, that copy into a GCS prefix, and that one back onto local disk; every rebuilt output
(Levanter cache, checkpoints, HF export, metrics, eval results) equals its original file for
file, but for what the step functions declare as records of their run (logs, W&B files,
timings; see executor.run_records), which is listed, not compared."""

from __future__ import annotations

import re

import pytest

from executor import Executor
from experiments.quickstart import quickstart_steps
from marin.cli import main
from tests.operations.buckets import new_bucket, storage_environment

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 8  # the quickstart's steps at the integration test's tiny settings, all reproduced


def reproduce(capsys, source: str, into: str) -> str:
    code = main(["reproduce", "evaluation/quickstart-nano", "--prefix", source, "--into", into])
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert code == 0, output[-6000:]
    return output


def test_the_quickstart_reproduces_from_local_disk_into_buckets_and_back(
    request, capsys, tmp_path, monkeypatch
):
    s3, gcs = new_bucket(request, "s3"), new_bucket(request, "gs")
    # Run from the checkout (marin reproduce checks its git commit against the recorded one).
    with storage_environment(monkeypatch, s3, gcs):
        local = str(tmp_path / "local")
        steps = quickstart_steps(max_files=120, steps=8, learning_rate=3e-3, vocab_size=512)
        Executor(local, console=False).run(list(steps.values()))
        back = str(tmp_path / "back")
        for source, into in ((local, s3.prefix), (s3.prefix, gcs.prefix), (gcs.prefix, back)):
            output = reproduce(capsys, source, into)
            assert f"reproduced {STEPS} step(s) into {into}" in output
            verdicts = re.findall(r"^  (\S+): (equal|DIFFERENT)", output, flags=re.MULTILINE)
            assert len(verdicts) == STEPS and {verdict for _, verdict in verdicts} == {"equal"}, output
            assert "result: outputs are identical" in output
            # Training's log, W&B run and timings are left out by its declaration, not by accident.
            assert "checkpoints/quickstart-nano: equal" in output
            assert re.search(
                r"not compared \(records of the run, as checkpoints/quickstart-nano's function", output
            )
        assert s3.files("checkpoints") and gcs.files("checkpoints")
