"""`remove_leftover_temp_files`: what a failed or killed attempt left half-written goes.

An atomic write puts its bytes under `.tmp-<hex>-<name>` and renames the file when it is
whole; a writer killed in between leaves the temporary file. Before a step's next attempt
(holding its lease) the runner removes every such file under the step's output, at any
depth, on local disk and on object stores, and nothing else: checkpoints, resume state
and the executor's own files stay, and nothing behind a symbolic link is touched.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from executor import Executor, ExecutorRunError, ExecutorStep, output_path_of, this_output_path
from executor.store import LocalStore, open_store
from executor.tree import Status, read_last_status, remove_leftover_temp_files

LEFTOVERS = [
    ".tmp-0123456789abcdef0123456789abcdef-shard-00000.jsonl.gz",  # operations' atomic_output
    ".tmp-5d3a9c1e07f2a41b3c000001-value.json",  # Store.write_atomic (salt, pid, counter)
    "checkpoints/step-100/.tmp-ab12-model.safetensors",
    "deep/er/still/.tmp-ff-x",
]

KEPT = [
    "value.json",
    "checkpoints/step-100/model.safetensors",
    "checkpoints/step-100/.resume_state.json",
    ".shard_stats/shard-00000.jsonl.gz.json",
    ".tmpfile",  # no `.tmp-<hex>-` prefix
    ".tmp-not-hex-name",
    "tmp-0123-x",
    ".tmp-0123-.executor_status.lock",  # the lease holder's heartbeat may be writing it now
    ".executor_status",
    ".executor_info",
]


@pytest.fixture
def store_and_output(store_and_root):
    """A step output directory on local disk, memory:// and a real S3 server (SeaweedFS)."""
    store, root = store_and_root
    return store, f"{root}/step-0123abcd"


def relative_files(store, output: str) -> list[str]:
    return sorted(path[len(output) + 1 :] for path in store.find_files(output))


def test_every_leftover_temp_file_goes_and_nothing_else(store_and_output):
    store, output = store_and_output
    for name in LEFTOVERS + KEPT:
        store.write_atomic(f"{output}/{name}", b"x")
    assert remove_leftover_temp_files(store, output) == len(LEFTOVERS)
    assert relative_files(store, output) == sorted(KEPT)


def test_nothing_to_remove_removes_nothing(store_and_output):
    store, output = store_and_output
    assert remove_leftover_temp_files(store, output) == 0  # no directory yet
    for name in KEPT:
        store.write_atomic(f"{output}/{name}", b"x")
    assert remove_leftover_temp_files(store, output) == 0
    assert relative_files(store, output) == sorted(KEPT)


def test_a_sibling_output_with_the_same_stem_is_not_touched(store_and_output):
    store, output = store_and_output
    store.write_atomic(f"{output}/.tmp-ab-x", b"x")
    store.write_atomic(f"{output}-other/.tmp-ab-x", b"x")
    try:
        assert remove_leftover_temp_files(store, output) == 1
        assert store.read_bytes(f"{output}-other/.tmp-ab-x") == b"x"
    finally:
        store.delete_tree(f"{output}-other")


def test_nothing_behind_a_symbolic_link_is_removed(tmp_path):
    output, outside = tmp_path / "step", tmp_path / "outside"
    (output / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / ".tmp-ab-shard").write_bytes(b"not ours")
    os.symlink(outside, output / "linked")
    os.symlink(outside / ".tmp-ab-shard", output / "sub" / ".tmp-cd-link")
    store = open_store(str(output))
    assert remove_leftover_temp_files(store, str(output)) == 1  # the link itself
    assert not os.path.lexists(output / "sub" / ".tmp-cd-link")
    assert (outside / ".tmp-ab-shard").read_bytes() == b"not ours"
    assert os.path.islink(output / "linked")


KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from executor.store import LocalStore
    from operations.shards import atomic_output

    output = sys.argv[1]
    LocalStore().write_atomic(output + "/value.json", b"whole")
    with atomic_output(output + "/part/shard-00000.jsonl") as handle:
        handle.write(b"half a shard")
        handle.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_the_temp_file_of_a_writer_killed_mid_write_goes(tmp_path):
    output = tmp_path / "step"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(output)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode == -signal.SIGKILL
    leftovers = [name for name in os.listdir(output / "part") if name.startswith(".tmp-")]
    assert len(leftovers) == 1  # what the killed attempt left
    assert remove_leftover_temp_files(open_store(str(output)), str(output)) == 1
    assert os.listdir(output / "part") == []
    assert (output / "value.json").read_bytes() == b"whole"


# -- the runner calls it: an output marked SUCCESS holds no earlier attempt's temp file ---------
ATTEMPTS: list[str] = []


@dataclass(frozen=True)
class LeftoverConfig:
    output_path: str


def fail_once_leaving_a_temp_file(config: LeftoverConfig) -> None:
    """First call: a half-written atomic write is left behind and the step fails. Then: it works."""
    os.makedirs(os.path.join(config.output_path, "checkpoints"), exist_ok=True)
    ATTEMPTS.append("seen")
    if len(ATTEMPTS) == 1:
        with open(os.path.join(config.output_path, "checkpoints", "step-1.ckpt"), "w") as handle:
            handle.write("resume from here")
        with open(os.path.join(config.output_path, ".tmp-0123abcd-result.json"), "w") as handle:
            handle.write('{"half": ')
        raise RuntimeError("killed in the middle of a write")
    with open(os.path.join(config.output_path, "result.json"), "w") as handle:
        handle.write('{"whole": true}')


def test_a_retried_step_marked_success_holds_no_temp_file_of_the_failed_attempt(tmp_path, caplog):
    ATTEMPTS.clear()
    step = ExecutorStep(
        name="leftover", fn=fail_once_leaving_a_temp_file, config=LeftoverConfig(this_output_path())
    )
    prefix = str(tmp_path / "prefix")
    with pytest.raises(ExecutorRunError):
        Executor(prefix, console=False).run([step])
    with caplog.at_level(logging.INFO, logger="executor.runner"):
        output = Executor(prefix, console=False).run([step]).rows[0].output_path
    # The log says what was removed and from which step.
    assert "step leftover: removed 1 temporary file(s) an earlier attempt left" in caplog.messages

    assert read_last_status(LocalStore(), output).status == Status.SUCCESS
    names = sorted(
        os.path.relpath(os.path.join(root, name), output)
        for root, _, files in os.walk(output)
        for name in files
    )
    assert ".tmp-0123abcd-result.json" not in names
    assert "checkpoints/step-1.ckpt" in names and "result.json" in names  # resume state stays
    assert len(ATTEMPTS) == 2


def test_a_first_attempt_lists_nothing(tmp_path, monkeypatch):
    """A cold step (no earlier attempt, a new directory) pays no walk of its output."""
    import executor.runner

    calls, listed = [], []
    monkeypatch.setattr(executor.runner, "remove_leftover_temp_files", lambda *args: calls.append(args) or 0)
    found_files = executor.runner.Runner._found_files
    monkeypatch.setattr(
        executor.runner.Runner,
        "_found_files",
        lambda self, path: listed.append(path) or found_files(self, path),
    )
    ATTEMPTS.clear()
    ATTEMPTS.append("pretend the first attempt was made")  # the step succeeds at once
    step = ExecutorStep(
        name="cold", fn=fail_once_leaving_a_temp_file, config=LeftoverConfig(this_output_path())
    )
    Executor(str(tmp_path / "prefix"), console=False).run([step])
    assert calls == []
    assert listed == []  # the plan found no directory: not even listed once made


# -- links leading out of an output are not written through on the next attempt ----------------
def test_a_rerun_does_not_write_through_a_link_leading_out_of_its_output(tmp_path, caplog):
    """A FAILED output from someone else's tree: `result.json -> <a file of yours>`, and a
    link to a directory outside. The next attempt wrote through them (a plain open(..., "w"))."""
    ATTEMPTS.clear()
    step = ExecutorStep(
        name="leftover", fn=fail_once_leaving_a_temp_file, config=LeftoverConfig(this_output_path())
    )
    prefix = tmp_path / "prefix"
    with pytest.raises(ExecutorRunError):
        Executor(str(prefix), console=False).run([step])
    output = Path(Executor(str(prefix), console=False).run([step], dry_run=True).rows[0].output_path)
    victim, elsewhere = tmp_path / "victim.txt", tmp_path / "elsewhere"
    victim.write_text("mine")
    elsewhere.mkdir()
    os.symlink(victim, output / "result.json")
    os.symlink(elsewhere, output / "checkpoints" / "more")
    os.symlink("step-1.ckpt", output / "checkpoints" / "latest")  # inside the output: kept
    with caplog.at_level(logging.WARNING, logger="executor.runner"):
        Executor(str(prefix), console=False).run([step])
    assert victim.read_text() == "mine" and list(elsewhere.iterdir()) == []
    assert not os.path.islink(output / "result.json")
    assert (output / "result.json").read_text() == '{"whole": true}'
    assert not os.path.lexists(output / "checkpoints" / "more")
    assert os.path.islink(output / "checkpoints" / "latest")
    (message,) = [m for m in caplog.messages if "symbolic link" in m]
    assert "step leftover: removed 2 symbolic link(s) leading out of its output" in message
    assert str(output / "result.json") in message
    from executor.tree import remove_links_leading_out

    assert remove_links_leading_out(open_store(str(prefix)), str(output)) == []  # nothing left


# -- a shared tree: links planted before a step's first attempt, links in place of directories --
@dataclass(frozen=True)
class WriteConfig:
    output_path: str


def write_result(config: WriteConfig) -> None:
    with open(os.path.join(config.output_path, "result.json"), "w") as handle:
        handle.write('{"whole": true}')


def write_step(name: str = "group/write") -> ExecutorStep:
    return ExecutorStep(name=name, fn=write_result, config=WriteConfig(this_output_path()))


def planned_output(prefix: Path, step: ExecutorStep) -> Path:
    rows = Executor(str(prefix), console=False).run([step], dry_run=True).rows
    (row,) = [row for row in rows if row.name == step.name]
    return Path(row.output_path)


def test_a_first_attempt_does_not_write_through_links_planted_in_its_directory(tmp_path, caplog):
    """Found by a red-team pass (twenty-second session): the links were removed only before a
    re-run, so a directory left with no status file had the first attempt write through them."""
    prefix, step = tmp_path / "prefix", write_step()
    output = planned_output(prefix, step)
    output.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    os.symlink(victim, output / "result.json")
    (output / ".tmp-0123abcd-result.json").write_text("planted")
    with caplog.at_level(logging.INFO, logger="executor.runner"):
        Executor(str(prefix), console=False).run([step])
    assert victim.read_text() == "mine"
    assert (output / "result.json").read_text() == '{"whole": true}'
    assert not (output / ".tmp-0123abcd-result.json").exists()  # not inside an output marked SUCCESS
    assert read_last_status(LocalStore(), str(output)).status == Status.SUCCESS
    assert any("removed 1 symbolic link(s) leading out of its output" in m for m in caplog.messages)


@pytest.mark.parametrize("where", ["output", "parent"])
def test_a_step_reached_through_a_link_out_of_the_prefix_is_refused_and_nothing_written_there(
    tmp_path, capsys, where
):
    """`<prefix>/group/write-<hash> -> elsewhere` (or `<prefix>/group -> elsewhere`): its lease,
    records, log and output went into `elsewhere`, with the writer's permissions."""
    from tests.marin.sample_tree import FAST_LEASES

    prefix, step = tmp_path / "prefix", write_step()
    dependent = ExecutorStep(
        name="after",
        fn=write_result_after,
        config=AfterConfig(this_output_path(), output_path_of(step, "result.json")),
    )
    other = write_step("other")
    output = planned_output(prefix, step)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = output if where == "output" else output.parent
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, link)

    with pytest.raises(ExecutorRunError) as raised:
        Executor(str(prefix), console=False, lease_config=FAST_LEASES).run([step, dependent, other])

    assert list(elsewhere.iterdir()) == []  # no lease, no status, no info, no log, no output
    message = str(raised.value)
    assert f"{link} is a symbolic link to {elsewhere}, outside the prefix {prefix}" in message, message
    assert "Remove the link" in message
    refused = [line for line in message.splitlines() if "group/write [failed]" in line]
    following = message.splitlines()[message.splitlines().index(refused[0]) + 1 :]
    assert not (following and following[0].strip().startswith("log:")), message  # none was written
    assert (planned_output(prefix, other) / "result.json").exists()  # unrelated steps still run
    after = planned_output(prefix, dependent)
    assert read_last_status(LocalStore(), str(after)).status == Status.DEP_FAILED  # inside: recorded
    capsys.readouterr()


@dataclass(frozen=True)
class AfterConfig:
    output_path: str
    upstream: str


def write_result_after(config: AfterConfig) -> None:
    write_result(WriteConfig(config.output_path))


def test_a_link_that_stays_inside_the_prefix_is_followed(tmp_path):
    """Only links leading out of the prefix are refused: an alias inside it writes inside it."""
    prefix, step = tmp_path / "prefix", write_step()
    output = planned_output(prefix, step)
    (prefix / "real-group").mkdir(parents=True)
    os.symlink(prefix / "real-group", output.parent)
    Executor(str(prefix), console=False).run([step])
    assert (prefix / "real-group" / output.name / "result.json").read_text() == '{"whole": true}'


def test_an_override_output_path_outside_the_prefix_is_the_users_own_choice(tmp_path):
    """The guard is for names under the prefix: a path the experiment declares is written."""
    target = tmp_path / "declared"
    step = ExecutorStep(
        name="declared",
        fn=write_result,
        config=WriteConfig(this_output_path()),
        override_output_path=str(target),
    )
    Executor(str(tmp_path / "prefix"), console=False).run([step])
    assert (target / "result.json").exists()


def fail_once_on_any_store(config: LeftoverConfig) -> None:
    """`fail_once_leaving_a_temp_file` through fsspec, for object stores."""
    import fsspec

    ATTEMPTS.append("seen")
    if len(ATTEMPTS) == 1:
        with fsspec.open(f"{config.output_path}/.tmp-0123abcd-result.json", "w") as handle:
            handle.write('{"half": ')
        raise RuntimeError("killed in the middle of a write")
    with fsspec.open(f"{config.output_path}/result.json", "w") as handle:
        handle.write('{"whole": true}')


def test_a_retried_step_on_an_object_store_holds_no_temp_file_of_the_failed_attempt(tmp_path):
    """On an object store a re-run is known by its status alone (there are no links to find
    by listing a first attempt's output): the cleanup keys on it."""
    import uuid

    ATTEMPTS.clear()
    prefix = f"memory://temp-files-{uuid.uuid4().hex}"
    step = ExecutorStep(name="leftover", fn=fail_once_on_any_store, config=LeftoverConfig(this_output_path()))
    with pytest.raises(ExecutorRunError):
        Executor(prefix, console=False).run([step])
    output = Executor(prefix, console=False).run([step]).rows[0].output_path
    store = open_store(prefix)
    try:
        assert read_last_status(store, output).status == Status.SUCCESS
        names = [info.name for info in store.list_dir(output)]
        assert "result.json" in names and ".tmp-0123abcd-result.json" not in names, names
    finally:
        store.delete_tree(prefix)
