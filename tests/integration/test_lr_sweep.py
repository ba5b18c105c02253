"""The learning-rate sweep tutorial: shared data, three runs, a table and a loss-curve PNG."""

import os

import pytest

from executor import Executor
from experiments.tutorials.lr_sweep import sweep_steps

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_lr_sweep_shares_data_and_draws_the_loss_curves(tmp_path):
    steps = sweep_steps(learning_rates=(1e-3, 1e-2), max_files=80, steps=6, vocab_size=384)
    executor = Executor(str(tmp_path), console=False)
    executor.run(steps)
    names = [step.name for step in executor.graph.steps]
    assert sum(name.startswith("tokenized/") for name in names) == 1  # one dataset for all runs
    assert sum(name.startswith("checkpoints/lr-sweep/") for name in names) == 2
    report = executor.output_paths[steps[-1]]
    with open(os.path.join(report, "results.md")) as handle:
        table = handle.read()
    assert "| lr=0.001 |" in table and "| lr=0.01 |" in table
    with open(os.path.join(report, "loss_curves.png"), "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(os.path.join(report, "loss_curves.png")) > 10_000
