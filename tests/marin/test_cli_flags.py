"""The `marin` CLI's --prefix and $MARIN_PREFIX: every command reads them as experiment scripts do.

An empty value (an unset shell variable: `marin gc --prefix "$OUT" --yes`) is refused in one
line with exit status 2, never read as "not given": that pointed the command at
$MARIN_PREFIX or ./marin-output, and `gc --yes` deleted there.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from executor.tree import Status, append_status
from marin.outputs import OutputTree
from tests.marin.sample_tree import marin

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

COMMANDS = [
    ["ls"],
    ["show", "x"],
    ["tree"],
    ["why", "x"],
    ["diff", "a", "b"],
    ["reproduce", "x", "--into", "NEW"],
    ["gc", "--yes"],
    ["leaderboard"],
    ["predictions"],
    ["browse", "--port", "0"],
]


def abandoned_output(prefix: str) -> str:
    """A tree whose one output `marin gc --yes` deletes (RUNNING, with no lease: abandoned)."""
    path = f"{prefix}/abandoned/step-0badc0de"
    append_status(OutputTree(prefix).store, path, Status.RUNNING, worker="gone")
    return path


@pytest.fixture(autouse=True)
def no_server(monkeypatch):
    """`marin browse` that got past the prefix would serve until killed: fail instead."""

    def start_server(*args, **kwargs):
        raise AssertionError(f"marin browse started a server on {args}")

    monkeypatch.setattr("marin.web.start_server", start_server)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("empty", ["", "  "], ids=["empty", "spaces"])
@pytest.mark.parametrize("command", COMMANDS, ids=[command[0] for command in COMMANDS])
def test_an_empty_prefix_is_refused_by_every_command(capsys, monkeypatch, tmp_path, command, empty):
    victim = abandoned_output(str(tmp_path / "from-env"))
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "from-env"))
    monkeypatch.chdir(tmp_path)
    code, out, err = marin(capsys, *command, "--prefix", empty)
    assert code == 2, (out, err)
    assert one_line(err) == (
        f"marin {command[0]}: --prefix is empty: give a directory or a URL (s3://bucket/path)"
    )
    assert os.path.isdir(victim)  # gc --yes deleted it, in $MARIN_PREFIX's tree
    assert sorted(os.listdir(tmp_path)) == ["from-env"]  # nothing made in the working directory


@pytest.mark.parametrize("empty", ["", " "], ids=["empty", "space"])
@pytest.mark.parametrize("command", COMMANDS, ids=[command[0] for command in COMMANDS])
def test_an_empty_marin_prefix_is_refused_by_every_command(capsys, monkeypatch, tmp_path, command, empty):
    victim = abandoned_output(str(tmp_path / "marin-output"))
    monkeypatch.setenv("MARIN_PREFIX", empty)
    monkeypatch.chdir(tmp_path)
    code, out, err = marin(capsys, *command)
    assert code == 2, (out, err)
    assert one_line(err) == (
        f"marin {command[0]}: MARIN_PREFIX is set but empty: set it to a directory or a URL "
        "(s3://bucket/path), or unset it to use ./marin-output"
    )
    assert os.path.isdir(victim)  # gc --yes deleted it: ./marin-output was read instead


def test_without_prefix_or_marin_prefix_the_default_tree_is_read(capsys, monkeypatch, tmp_path):
    abandoned_output(str(tmp_path / "marin-output"))
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    monkeypatch.chdir(tmp_path)
    code, out, _ = marin(capsys, "gc")
    assert code == 0 and "abandoned/step-0badc0de" in out


def test_a_given_prefix_wins_over_an_empty_marin_prefix(capsys, monkeypatch, tmp_path):
    """MARIN_PREFIX is not read when --prefix is given, so its emptiness does not matter."""
    abandoned_output(str(tmp_path / "tree"))
    monkeypatch.setenv("MARIN_PREFIX", "")
    code, out, _ = marin(capsys, "gc", "--prefix", str(tmp_path / "tree"))
    assert code == 0 and "abandoned/step-0badc0de" in out


@pytest.mark.parametrize(
    ("flag", "env"),
    [(["--prefix", ""], None), (["--prefix", " "], None), ([], ""), ([], "  ")],
    ids=["empty-flag", "blank-flag", "empty-env", "blank-env"],
)
def test_experiment_scripts_and_marin_refuse_the_same_empty_prefix_alike(
    capsys, monkeypatch, tmp_path, flag, env
):
    environ = {key: value for key, value in os.environ.items() if key != "MARIN_PREFIX"}
    environ["PYTHONPATH"] = REPO
    if env is not None:
        environ["MARIN_PREFIX"] = env
        monkeypatch.setenv("MARIN_PREFIX", env)
    else:
        environ["MARIN_PREFIX"] = str(tmp_path / "from-env")
        monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "from-env"))
    script = os.path.join(REPO, "experiments", "tutorials", "hello_world.py")
    result = subprocess.run(
        [sys.executable, script, *flag, "--dry_run", "true"],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result
    experiment_line = one_line(result.stderr)
    monkeypatch.chdir(tmp_path)
    code, _, err = marin(capsys, "ls", *flag)
    assert code == 2
    assert experiment_line.removeprefix("error: ") == one_line(err).removeprefix("marin ls: ")
    assert os.listdir(tmp_path) == []
