"""Experiment scripts' own steps on buckets: the lr sweep's report step reads its runs' metrics
and eval results from s3:// or gs:// and writes its table and picture there (no local file)."""

from __future__ import annotations

import json
import os

import pytest

from experiments.tutorials.lr_sweep import SweepReportConfig, report_sweep

pytestmark = pytest.mark.integration


def test_the_lr_sweep_report_reads_and_writes_a_bucket(bucket_env, tmp_path, monkeypatch):
    bucket = bucket_env
    monkeypatch.chdir(tmp_path)
    labels, train_paths, eval_paths = [], [], []
    for index, lr in enumerate((1e-3, 1e-2)):
        run = f"{bucket.prefix}/checkpoints/run{index}"
        lines = [{"step": step, "train/loss": 5.0 - step * (index + 1) / 10} for step in range(6)]
        lines.append({"step": 5, "eval/loss": 4.5 - index})
        bucket.fs.pipe(f"{run}/metrics.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode())
        evaluation = f"{bucket.prefix}/evaluation/run{index}"
        results = {"domains": {"stdlib": {"loss": 4.25 - index, "bpb": 1.5 - index / 4}}}
        bucket.fs.pipe(f"{evaluation}/results.json", json.dumps(results).encode())
        labels.append(f"lr={lr:g}")
        train_paths.append(run)
        eval_paths.append(evaluation)
    report = f"{bucket.prefix}/analysis/lr-sweep"

    report_sweep(SweepReportConfig(tuple(labels), train_paths, eval_paths, report))

    table = bucket.fs.cat(f"{report}/results.md").decode()
    assert "| lr=0.001 | 4.500 | 4.250 | 1.500 |" in table
    assert "| lr=0.01 | 4.000 | 3.250 | 1.250 |" in table
    picture = bucket.fs.cat(f"{report}/loss_curves.png")
    assert picture[:8] == b"\x89PNG\r\n\x1a\n" and len(picture) > 10_000
    assert os.listdir(tmp_path) == []  # nothing landed in the working directory (a folder "s3:")


def test_the_lr_sweep_report_names_a_missing_eval_result(bucket_env):
    bucket = bucket_env
    run = f"{bucket.prefix}/checkpoints/run"
    bucket.fs.pipe(f"{run}/metrics.jsonl", b'{"step": 0, "train/loss": 5.0}\n')
    missing = f"{bucket.prefix}/evaluation/run"
    with pytest.raises(FileNotFoundError, match=f"{missing}/results.json"):
        report_sweep(SweepReportConfig(("lr=0.1",), [run], [missing], f"{bucket.prefix}/report"))
