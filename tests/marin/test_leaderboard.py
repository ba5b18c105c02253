"""`marin leaderboard` and the browser's /leaderboard: runs ranked on equal tokens (issue 14).

The tree is written the way training steps write theirs (`.executor_info`, `.executor_status`,
`stats.json`, `metrics.jsonl`), with known losses, so the expected order is known. A real
sweep is ranked in tests/integration/test_lr_sweep.py.
"""

from __future__ import annotations

import json
import os

import pytest

from marin.cli import main as marin
from marin.leaderboard import rank, training_runs
from marin.outputs import OutputTree
from marin.web.pages import App

TRAIN_FN = "operations.train:train"


def write_run(
    prefix,
    name: str,
    *,
    loss: float | None,
    bpb: float | None = None,
    tokens: int | None = 1024,
    lr: float = 0.01,
    width: int = 64,
    status: str = "SUCCESS",
    fn: str = TRAIN_FN,
    stats_text: str | None = None,
    batch: int = 2,
    steps: int = 4,
) -> str:
    path = os.path.join(prefix, f"{name}-{abs(hash((name, lr, width))) % 16**8:08x}")
    os.makedirs(path)
    version = {
        "name": name,
        "config": {"model": {"hidden_dim": width}, "train.learning_rate": lr, "tokenized_path": "DEP[0]"},
        "dependencies": ["f" * 64],
    }
    info = {
        "name": name,
        "fn_name": fn,
        "config": {"train": {"train_batch_size": batch, "num_train_steps": steps}, "model": {"seq_len": 128}},
        "version": version,
        "dependencies": [os.path.join(prefix, "tokenized/data-1a2b3c4d")],
        "output_path": path,
    }
    with open(os.path.join(path, ".executor_info"), "w") as handle:
        json.dump(info, handle)
    with open(os.path.join(path, ".executor_status"), "w") as handle:
        handle.write(json.dumps({"date": "2026-11-23T10:00:00", "status": status}) + "\n")
    stats = {"final_eval_loss": loss, "parameter_count": 1000 * width, "median_tokens_per_second": 2500.0}
    with open(os.path.join(path, "stats.json"), "w") as handle:
        handle.write(stats_text if stats_text is not None else json.dumps(stats))
    metrics = [{"step": 0, "train/loss": 9.0}]
    if tokens is not None:
        metrics.append({"step": steps - 1, "throughput/total_tokens": tokens})
    if bpb is not None:
        metrics.append({"step": steps - 1, "eval/loss": loss, "eval/bpb": bpb})
    with open(os.path.join(path, "metrics.jsonl"), "w") as handle:
        handle.write("\n".join(json.dumps(m) for m in metrics) + "\n")
    return path


@pytest.fixture
def board(tmp_path) -> str:
    prefix = str(tmp_path / "tree")
    write_run(prefix, "checkpoints/a", loss=3.2, bpb=1.40, lr=0.01)
    write_run(prefix, "checkpoints/b", loss=2.9, bpb=1.45, lr=0.003)  # best loss, worse bpb
    write_run(prefix, "checkpoints/c", loss=3.5, bpb=1.30, lr=0.03)
    write_run(prefix, "checkpoints/long", loss=2.5, bpb=1.1, tokens=4096, lr=0.01)  # more tokens
    write_run(prefix, "checkpoints/no-eval", loss=None, lr=0.1)
    write_run(prefix, "checkpoints/failed", loss=1.0, status="FAILED")
    write_run(prefix, "evaluation/not-training", loss=0.5, fn="operations.eval:evaluate")
    return prefix


def names(group) -> list[str]:
    return [run.step.name for run in group.ranked]


def test_runs_are_ranked_within_groups_of_equal_tokens(board):
    groups = rank(training_runs(OutputTree(board)), "loss")
    assert [group.tokens for group in groups] == [4096, 1024]
    assert names(groups[0]) == ["checkpoints/long"]
    # Lower loss first; a run with no eval loss last; failed runs and non-training steps absent.
    assert names(groups[1]) == ["checkpoints/b", "checkpoints/a", "checkpoints/c", "checkpoints/no-eval"]


def test_ranking_by_bits_per_byte_changes_the_order(board):
    groups = rank(training_runs(OutputTree(board)), "bpb")
    assert names(groups[1])[:3] == ["checkpoints/c", "checkpoints/a", "checkpoints/b"]


def test_each_run_says_what_differs_from_the_others_of_its_group(board):
    (_, group) = rank(training_runs(OutputTree(board)), "loss")
    differs = {run.step.name: group.differences[run.step.path] for run in group.ranked}
    assert differs["checkpoints/b"] == {"train.learning_rate": 0.003}
    assert differs["checkpoints/no-eval"] == {"train.learning_rate": 0.1}


def test_tokens_come_from_the_config_when_the_metrics_do_not_say(tmp_path):
    prefix = str(tmp_path / "tree")
    write_run(prefix, "checkpoints/x", loss=3.0, tokens=None, batch=4, steps=10)
    (group,) = rank(training_runs(OutputTree(prefix)), "loss")
    assert group.tokens == 4 * 10 * 128


@pytest.mark.parametrize(
    "stats_text",
    [
        "not json",
        "[1, 2]",
        '{"final_eval_loss": "low"}',
        '{"final_eval_loss": NaN}',
        '{"parameter_count": -5}',
    ],
)
def test_unreadable_or_odd_stats_never_rank_a_run_or_break_the_board(tmp_path, stats_text):
    prefix = str(tmp_path / "tree")
    write_run(prefix, "checkpoints/good", loss=3.0)
    write_run(prefix, "checkpoints/odd", loss=None, stats_text=stats_text)
    (group,) = rank(training_runs(OutputTree(prefix)), "loss")
    assert names(group)[0] == "checkpoints/good"
    assert all(run.eval_loss is None for run in group.ranked[1:])
    assert all(run.parameters is None or run.parameters >= 0 for run in group.ranked)


def test_a_name_pattern_selects_runs(board):
    groups = rank(training_runs(OutputTree(board), "checkpoints/[ab]$"), "loss")
    assert [names(group) for group in groups] == [["checkpoints/b", "checkpoints/a"]]


def test_the_command_prints_the_table_and_refuses_a_bad_pattern(board, capsys):
    assert marin(["leaderboard", "--prefix", board]) == 0
    out = capsys.readouterr().out
    assert out.index("4,096 tokens") < out.index("1,024 tokens")
    first = next(line for line in out.splitlines() if line.startswith("1 ") and "checkpoints/b-" in line)
    assert "2.9000" in first and "train.learning_rate=0.003" in first
    assert "BPB: the trainer's last eval/loss and eval/bpb" in out  # not the eval step's exact bpb
    assert marin(["leaderboard", "([", "--prefix", board]) == 2
    assert "valid name pattern" in capsys.readouterr().err
    assert (
        marin(["leaderboard", "(" * 5000 + ")" * 5000, "--prefix", board]) == 2
    )  # past the parser's recursion
    assert "valid name pattern: nested too deeply" in capsys.readouterr().err
    nested = "(" * 5000 + ")" * 5000
    assert App(board).handle(f"/leaderboard?q={nested}").status == 400
    assert App(board).handle(f"/predictions?q={nested}").status == 400


@pytest.mark.parametrize("pattern", ["(a+)+$", "(a|ab)*c", "(x)\\1", "a.*b.*c.*d", "a" * 201])
def test_a_web_pattern_that_could_backtrack_for_ages_is_refused(board, pattern):
    """`(a+)+$` against a long step name backtracks 2**n times holding the GIL: one request
    (even from another site, through the user's browser) stalled the whole server."""
    from urllib.parse import quote

    for route in ("leaderboard", "predictions"):
        response = App(board).handle(f"/{route}?q={quote(pattern)}")
        assert response.status == 400, (route, pattern)
        assert b"q: " in response.body
    assert App(board).handle(f"/leaderboard?q={quote('^checkpoints/.*$')}").status == 200


def test_the_browser_page_shows_the_same_ranking(board):
    response = App(board).handle("/leaderboard?by=bpb&q=checkpoints/")
    assert response.status == 200
    html = response.body.decode()
    order = [html.index(f"checkpoints/{name}-") for name in ("c", "a", "b")]
    assert order == sorted(order)
    assert App(board).handle("/leaderboard?by=accuracy").status == 400


# -- a tampered tree (found by a red-team pass): odd values are taken as unread -----------------
HUGE = 10**400
"""What json.loads reads from 400 digits: an int no float can hold (math.isfinite raises)."""


def run_named(prefix: str, name: str):
    (run,) = [run for run in training_runs(OutputTree(prefix)) if run.step.name == name]
    return run


def every_view(prefix: str, capsys) -> str:
    """The board as each command and option prints it: all exit 0, no traceback."""
    out = ""
    for args in ([], ["--json"], ["--by", "bpb"], ["--by", "bpb", "--json"]):
        assert marin(["leaderboard", "--prefix", prefix, *args]) == 0, args
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err
        out += captured.out
    return out


@pytest.mark.parametrize("fn", [{"a": 1}, ["operations.train:train"], 5, None])
def test_a_step_whose_function_is_not_a_name_is_not_a_training_run(tmp_path, capsys, fn):
    prefix = str(tmp_path / "tree")
    write_run(prefix, "checkpoints/good", loss=3.0)
    write_run(prefix, "checkpoints/odd", loss=2.0, fn=fn)

    assert [run.step.name for run in training_runs(OutputTree(prefix))] == ["checkpoints/good"]
    out = every_view(prefix, capsys)
    assert "checkpoints/good-" in out and "checkpoints/odd" not in out


@pytest.mark.parametrize(
    "where, key, field",
    [
        ("stats", "final_eval_loss", "eval_loss"),
        ("stats", "parameter_count", "parameters"),
        ("stats", "median_tokens_per_second", "tokens_per_second"),
        ("metrics", "eval/bpb", "eval_bpb"),
        ("metrics", "throughput/mfu", "mfu"),
    ],
)
def test_a_number_too_large_for_a_float_is_no_number(tmp_path, capsys, where, key, field):
    prefix = str(tmp_path / "tree")
    write_run(prefix, "checkpoints/good", loss=3.0, bpb=1.2)
    odd = write_run(prefix, "checkpoints/odd", loss=2.0, bpb=1.1)
    if where == "stats":
        stats = {"final_eval_loss": 2.0, "parameter_count": 64000, "median_tokens_per_second": 2500.0}
        with open(os.path.join(odd, "stats.json"), "w") as handle:
            json.dump({**stats, key: HUGE}, handle)
    else:
        with open(os.path.join(odd, "metrics.jsonl"), "a") as handle:
            handle.write(json.dumps({"step": 3, key: HUGE}) + "\n")

    assert getattr(run_named(prefix, "checkpoints/odd"), field) is None
    assert "checkpoints/odd-" in every_view(prefix, capsys)


def test_tokens_too_many_for_a_float_are_taken_from_the_config(tmp_path, capsys):
    prefix = str(tmp_path / "tree")
    write_run(prefix, "checkpoints/good", loss=3.0)
    write_run(prefix, "checkpoints/odd", loss=2.0, tokens=HUGE)

    (group,) = rank(training_runs(OutputTree(prefix)), "loss")
    assert group.tokens == 2 * 4 * 128 and names(group) == ["checkpoints/odd", "checkpoints/good"]
    assert "1,024 tokens (2 runs)" in every_view(prefix, capsys)


def test_an_input_index_of_thousands_of_digits_is_shown_as_written(tmp_path, capsys):
    # int() refuses more than 4300 digits (ValueError): the value is left as it was recorded.
    prefix = str(tmp_path / "tree")
    write_run(prefix, "checkpoints/good", loss=3.0)
    odd = write_run(prefix, "checkpoints/odd", loss=2.0)
    with open(os.path.join(odd, ".executor_info")) as handle:
        info = json.load(handle)
    info["version"]["config"]["tokenized_path"] = "DEP[" + "9" * 5000 + "]"
    with open(os.path.join(odd, ".executor_info"), "w") as handle:
        json.dump(info, handle)

    assert run_named(prefix, "checkpoints/odd").version_config["tokenized_path"].startswith("DEP[999")
    assert "checkpoints/odd-" in every_view(prefix, capsys)
