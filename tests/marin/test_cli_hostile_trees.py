"""`marin tree` on DAGs of any shape: a chain thousands of steps deep is drawn, not a
RecursionError nor megabytes of spaces, and an ordinary DAG is drawn exactly as before.

Found by a red-team pass (a 1,500-step dependency chain). The trees are written by real
executor runs of the step function below.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import pytest

from executor import Executor, ExecutorStep, this_output_path, versioned
from tests.marin import sample_tree
from tests.marin.sample_tree import FAST_LEASES, marin


@dataclass(frozen=True)
class JoinConfig:
    output_path: str
    left: str | None = None
    right: str | None = None
    text: str = ""


def write_join(config: JoinConfig) -> None:
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "join.txt"), "w") as handle:
        handle.write(f"{config.text} {config.left} {config.right}\n")


def step(name: str, left: ExecutorStep | None = None, right: ExecutorStep | None = None) -> ExecutorStep:
    return ExecutorStep(
        name=name, fn=write_join, config=JoinConfig(this_output_path(), left, right, versioned(name))
    )


def drawn(out: str) -> list[str]:
    """The DAG's lines, with the hashes and durations (which vary run to run) left out."""
    lines = [re.sub(r"-[0-9a-f]{8}  ", "  ", line) for line in out.splitlines()[1:]]
    return [re.sub(r"(\[\w+\]).*", r"\1", line) for line in lines]


def test_a_chain_thousands_of_steps_deep_is_drawn(tmp_path, capsys):
    prefix = str(tmp_path / "tree")
    chain = [step("chain/0")]
    for index in range(1, 1500):
        chain.append(step(f"chain/{index}", chain[-1]))
    Executor(prefix, lease_config=FAST_LEASES, console=False).run(chain)

    code, out, err = marin(capsys, "tree", "--prefix", prefix)

    assert code == 0, err[-2000:]
    lines = drawn(out)
    assert len(lines) == 1500
    assert lines[0] == "chain/0  [SUCCESS]"
    assert lines[1] == "└─ chain/1  [SUCCESS]"
    # Indented up to MAX_TREE_INDENT levels, then drawn at that one with the depth said:
    # the output grows with the number of steps, not with their square.
    assert lines[20] == "   " * 19 + "└─ chain/20  [SUCCESS]"
    assert lines[21] == lines[-1].replace("1499", "21") == "   " * 19 + "└─ chain/21  [SUCCESS]"
    raw = out.splitlines()[1:]
    assert "(depth" not in raw[20] and raw[21].endswith("  (depth 21)") and raw[-1].endswith("  (depth 1499)")
    assert max(len(line) for line in raw) < 150 and len(out) < 1500 * 150


def test_a_dag_with_branches_and_shared_steps_is_drawn_as_before(tmp_path, capsys):
    # Drawn by the recursive renderer this replaced; the iterative one must draw the same.
    prefix = str(tmp_path / "tree")
    root = step("dag/root")
    left, right, alone = step("dag/left", root), step("dag/right", root), step("dag/alone")
    join = step("dag/join", left, right)
    under_left = step("dag/under-left", left)
    tail = step("dag/tail", join, alone)
    Executor(prefix, lease_config=FAST_LEASES, console=False).run(
        [root, left, right, alone, join, under_left, tail]
    )

    code, out, err = marin(capsys, "tree", "--prefix", prefix)

    assert code == 0, err
    assert drawn(out) == [
        "dag/root  [SUCCESS]",
        "├─ dag/left  [SUCCESS]",
        "│  ├─ dag/join  [SUCCESS]",
        "│  │  └─ dag/tail  [SUCCESS]",
        "│  └─ dag/under-left  [SUCCESS]",
        "└─ dag/right  [SUCCESS]",
        "   └─ dag/join  (see above)",
        "dag/alone  [SUCCESS]",
        "└─ dag/tail  (see above)",
    ]


def test_a_manifest_entry_whose_output_path_is_not_a_string_is_a_missing_step(tmp_path):
    """With the tree's steps already read, the lookup by path raised TypeError (unhashable list)."""
    import json

    from marin.outputs import OutputTree

    prefix = str(tmp_path / "tree")
    a = step("a")
    Executor(prefix, lease_config=FAST_LEASES, console=False).run([step("b", a)])
    manifests = os.path.join(prefix, "experiments")
    (name,) = os.listdir(manifests)
    with open(os.path.join(manifests, name)) as handle:
        record = json.load(handle)
    record["steps"][0]["output_path"] = ["not", "a", "path"]
    with open(os.path.join(manifests, name), "w") as handle:
        json.dump(record, handle)
    for read_all_first in (True, False):
        tree = OutputTree(prefix)
        if read_all_first:
            assert len(tree.steps) == 2
        (experiment,) = tree.experiments
        loaded = [found for _entry, found in tree.experiment_steps(experiment)]
        assert loaded[0] is None and loaded[1] is not None


def test_reproduce_walks_a_chain_thousands_of_steps_deep(tmp_path, capsys):
    """The recursive walk upstream ran out of stack some 500 steps in, inside a JSON parse,
    and reproduce then called a valid `.executor_info` "not valid JSON"."""
    prefix = str(tmp_path / "tree")
    chain = [step("chain/0")]
    for index in range(1, 1500):
        chain.append(step(f"chain/{index}", chain[-1]))
    Executor(prefix, lease_config=FAST_LEASES, console=False).run(chain)

    code, out, err = marin(
        capsys,
        "reproduce",
        "chain/1499",
        "--prefix",
        prefix,
        "--into",
        str(tmp_path / "again"),
        "--allow-code-changes",
    )

    assert code == 0, err[-2000:]
    assert "not valid JSON" not in err
    assert "rebuilt 1500 step(s) with identical version hashes" in out
    assert "outputs are identical" in out


# -- bad flags and a taken port: one line, no traceback (red-team pass, twenty-second session) --
@pytest.mark.parametrize(
    "into, expected",
    [
        ("foo://x", "--into: no filesystem for 'foo://x'"),
        ("s3://", "--into: prefix 's3://' names no bucket"),
        ("", "--into is empty"),
        ("  ", "--into is empty"),
    ],
)
def test_reproduce_refuses_a_bad_into_in_one_line(tmp_path, capsys, into, expected):
    prefix = str(tmp_path / "tree")
    Executor(prefix, console=False).run(sample_tree.note_steps("hi"))
    code, out, err = marin(capsys, "reproduce", "notes/first", "--prefix", prefix, "--into", into)
    assert code == 2, out + err
    assert err.startswith("marin reproduce: ") and expected in err, err
    assert "Traceback" not in out + err
    assert os.listdir(tmp_path) == ["tree"]  # nothing made anywhere


@pytest.mark.parametrize("port", ["99999", "-1", "x", "1e3"])
def test_browse_refuses_a_port_that_is_not_one(tmp_path, capsys, port):
    with pytest.raises(SystemExit) as raised:  # argparse: usage, the flag named, exit 2
        marin(capsys, "browse", "--prefix", str(tmp_path), "--port", port)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "argument --port:" in err and "Traceback" not in err, err


def test_browse_on_a_taken_port_says_so_in_one_line(tmp_path, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = marin(capsys, "browse", "--prefix", str(tmp_path), "--port", str(port))
    assert code == 2, out + err
    assert f"marin browse: cannot listen on 127.0.0.1:{port}: Address already in use" in err, err
    assert "--port 0 for any free one" in err and "Traceback" not in err


def test_browse_on_a_host_that_does_not_resolve_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    import socket

    def no_such_host(*args, **kwargs):  # deterministic: no resolver is asked
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    code, out, err = marin(
        capsys, "browse", "--prefix", str(tmp_path), "--host", "no.such.invalid", "--port", "0"
    )
    assert code == 2, out + err
    assert "marin browse: cannot listen on no.such.invalid:0: Name or service not known" in err, err
