"""The quickstart end to end at tiny settings: data -> tokenizer -> Levanter training -> eval."""

import json
import os

import pytest

from executor import Executor
from executor.events import StepStarted
from experiments.quickstart import quickstart_steps, summary

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_quickstart_trains_evaluates_and_then_runs_from_cache(tmp_path):
    steps = quickstart_steps(max_files=120, steps=8, learning_rate=3e-3, vocab_size=512)
    executor = Executor(str(tmp_path), console=False)
    executor.run(list(steps.values()))
    text = summary(executor, steps)
    for label in ("tokens:", "parameters:", "final loss:", "bits per byte", "outputs:"):
        assert label in text
    train_dir = executor.output_paths[steps["train"]]
    assert os.path.isdir(os.path.join(train_dir, "checkpoints", "step-7")), "final checkpoint missing"
    with open(os.path.join(executor.output_paths[steps["eval"]], "results.json")) as handle:
        results = json.load(handle)
    assert results["domains"]["stdlib"]["bpb"] > 0

    again = Executor(str(tmp_path), console=False)
    again.run(list(quickstart_steps(max_files=120, steps=8, learning_rate=3e-3, vocab_size=512).values()))
    assert not [e for e in again.events if isinstance(e, StepStarted)]

    changed = Executor(str(tmp_path), console=False)
    plan = changed.run(
        list(quickstart_steps(max_files=120, steps=8, learning_rate=1e-2, vocab_size=512).values()),
        dry_run=True,
    )
    will_run = sorted(row.name for row in plan.rows if row.action.value != "skip")
    assert will_run == ["checkpoints/quickstart-nano", "evaluation/quickstart-nano"]
    train_row = next(row for row in plan.rows if row.name == "checkpoints/quickstart-nano")
    assert train_row.why_new == ("train.learning_rate: 0.003 -> 0.01",)
