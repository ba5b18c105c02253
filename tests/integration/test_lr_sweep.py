"""The learning-rate sweep tutorial: shared data, three runs, a table, a loss-curve PNG, the
learning rate it picks, and the same runs ranked by `marin leaderboard`."""

import json
import os

import pytest

from executor import Executor
from experiments.tutorials.lr_sweep import sweep_steps
from marin.cli import main as marin

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_lr_sweep_shares_data_draws_the_loss_curves_and_picks_a_rate(tmp_path, capsys):
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

    with open(os.path.join(report, "choice.json")) as handle:
        choice = json.load(handle)
    ranking = [entry["eval_loss"] for entry in choice["ranking"]]
    assert ranking == sorted(ranking) and choice["eval_loss"] == ranking[0]
    assert choice["chosen"] in ("lr=0.001", "lr=0.01") and choice["why"] in table

    # The leaderboard ranks the same two runs (equal tokens) the same way, naming what differs.
    capsys.readouterr()
    assert marin(["leaderboard", "checkpoints/lr-sweep/", "--prefix", str(tmp_path), "--json"]) == 0
    (group,) = json.loads(capsys.readouterr().out)["groups"]
    assert group["tokens"] == 8 * 6 * 128  # batch x steps x llama_nano's sequence length
    assert [run["eval_loss"] for run in group["runs"]] == sorted(run["eval_loss"] for run in group["runs"])
    for run in group["runs"]:
        with open(os.path.join(run["path"], "stats.json")) as handle:
            assert run["eval_loss"] == json.load(handle)["final_eval_loss"]
    assert all(set(run["differs"]) == {"train.learning_rate"} for run in group["runs"])
