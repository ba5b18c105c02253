"""The `marin` CLI over trees written by real executor runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest

from executor import Executor, ExecutorStep, this_output_path, versioned
from executor.lease import LeaseRecord
from executor.provenance import git_state
from executor.tree import Status, append_status, info_path, lease_path
from marin.outputs import OutputTree
from tests.marin import sample_tree
from tests.marin.sample_tree import FAST_LEASES, NoteConfig, fail_always, marin

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def tree_prefix(tmp_path) -> str:
    prefix = str(tmp_path / "tree")
    sample_tree.run(prefix)
    return prefix


def step_dir(prefix: str, name: str) -> str:
    return OutputTree(prefix).find(name).path


def read_info_file(path: str) -> dict:
    with open(info_path(path)) as handle:
        return json.load(handle)


def edit_info(path: str, change) -> None:
    with open(info_path(path)) as handle:
        record = json.load(handle)
    change(record)
    with open(info_path(path), "w") as handle:
        json.dump(record, handle)


# -- ls / show / tree ------------------------------------------------------------------
def test_ls_lists_experiments_and_steps_with_status_and_size(capsys, tree_prefix):
    code, out, _ = marin(capsys, "ls", "--prefix", tree_prefix)
    assert code == 0
    assert "experiments (1)" in out and "steps (6)" in out
    assert re.search(r"SUCCESS .* \d+\.\d KB  dedup/notes-[0-9a-f]{8}$", out, re.MULTILINE), out
    code, out, _ = marin(capsys, "ls", "--prefix", tree_prefix, "--json")
    listing = json.loads(out)
    assert sorted(s["name"] for s in listing["steps"]) == sorted(sample_tree.STEP_NAMES)
    assert all(s["status"] == "SUCCESS" and s["size"] > 0 for s in listing["steps"])


def test_ls_filters_by_status_in_any_case_and_refuses_an_unknown_one(capsys, tree_prefix):
    code, out, _ = marin(capsys, "ls", "--prefix", tree_prefix, "--status", "success", "--json")
    assert code == 0 and len(json.loads(out)["steps"]) == 6
    code, out, _ = marin(capsys, "ls", "--prefix", tree_prefix, "--status", "FAILED", "--json")
    assert code == 0 and json.loads(out)["steps"] == []
    with pytest.raises(SystemExit) as exited:  # argparse: it listed nothing, silently, before
        marin(capsys, "ls", "--prefix", tree_prefix, "--status", "BOGUS")
    assert exited.value.code == 2
    assert "invalid choice: 'BOGUS'" in capsys.readouterr().err


def test_ls_reads_prefix_from_environment_and_fails_clearly_without_a_tree(
    capsys, tree_prefix, monkeypatch, tmp_path
):
    monkeypatch.setenv("MARIN_PREFIX", tree_prefix)
    code, out, _ = marin(capsys, "ls", "--steps-only", "--no-size")
    assert code == 0 and "dedup/notes-" in out and "experiments" not in out
    code, _, err = marin(capsys, "ls", "--prefix", str(tmp_path / "nothing-here"))
    assert code == 2 and "nothing-here" in err and "run an experiment first" in err


def test_show_by_name_hash_and_path(capsys, tree_prefix):
    dedup = OutputTree(tree_prefix).find("dedup/notes")
    for ref in ("dedup/notes", dedup.short_hash[:5], dedup.relpath, dedup.path, dedup.path + "/stats.json"):
        code, out, _ = marin(capsys, "show", "--prefix", tree_prefix, ref)
        assert code == 0, ref
        assert out.startswith("dedup/notes  [SUCCESS]")
        assert "operations.dedup:deduplicate" in out
        assert '"mode": "exact"' in out  # version inputs
        assert "filtered/notes: " in out  # its input
        assert "SUCCESS" in out and "RUNNING" in out  # status history
        assert "stats.json" in out  # files
        assert "dedup: filter" in out  # log tail


def test_show_ambiguous_hash_lists_candidates(capsys, tree_prefix):
    step = OutputTree(tree_prefix).find("dedup/notes")
    twin = os.path.join(tree_prefix, "dedup", f"copy-{step.short_hash}")
    shutil.copytree(step.path, twin)
    edit_info(twin, lambda record: record.update(name="dedup/copy"))
    code, _, err = marin(capsys, "show", "--prefix", tree_prefix, step.short_hash[:6])
    assert code == 2
    assert "ambiguous" in err and step.relpath in err and f"dedup/copy-{step.short_hash}" in err
    code, _, err = marin(capsys, "show", "--prefix", tree_prefix, "no-such-step")
    assert code == 2 and "no step output matches 'no-such-step'" in err


def test_tree_prints_the_dag_with_statuses(capsys, tree_prefix):
    code, out, _ = marin(capsys, "tree", "--prefix", tree_prefix)
    assert code == 0
    lines = out.splitlines()
    raw = next(i for i, line in enumerate(lines) if "raw/notes-" in line)
    dedup = next(i for i, line in enumerate(lines) if "dedup/notes-" in line)
    curve = next(i for i, line in enumerate(lines) if "checkpoints/curve-" in line)
    assert raw < dedup < curve
    assert lines[raw].startswith("raw/notes-") and "[SUCCESS]" in lines[raw]
    assert "└─ " in lines[curve] or "├─ " in lines[curve]
    assert len(lines[curve]) - len(lines[curve].lstrip(" │├└─")) > len(lines[dedup]) - len(
        lines[dedup].lstrip(" │├└─")
    )


# -- why / diff ---------------------------------------------------------------------------
def test_why_explains_a_hyperparameter_change(capsys, tree_prefix):
    sample_tree.run(tree_prefix, learning_rate=0.02)
    code, out, _ = marin(capsys, "why", "--prefix", tree_prefix, "checkpoints/curve")
    assert code == 0
    assert "learning_rate: 0.01 -> 0.02" in out
    assert "upstream version" not in out  # the data did not change


def test_why_follows_an_upstream_change_to_the_edited_field(capsys, tree_prefix):
    sample_tree.run(tree_prefix, seed=7)
    code, out, _ = marin(capsys, "why", "--prefix", tree_prefix, "dedup/notes")
    assert code == 0
    assert "DEP[0] (filtered/notes): upstream version" in out
    assert "seed: 0 -> 7" in out
    assert out.index("filtered/notes") < out.index("documents/notes") < out.index("seed: 0 -> 7")


def test_why_with_one_version_and_diff_of_two(capsys, tree_prefix):
    code, out, _ = marin(capsys, "why", "--prefix", tree_prefix, "dedup/notes")
    assert code == 0 and "only output" in out
    sample_tree.run(tree_prefix, learning_rate=0.5)
    tree = OutputTree(tree_prefix)
    old, new = sorted(tree.versions_of("checkpoints/curve"), key=lambda s: s.last_event.date)
    code, out, _ = marin(capsys, "diff", "--prefix", tree_prefix, old.short_hash, new.relpath)
    assert code == 0 and "learning_rate: 0.01 -> 0.5" in out


# -- reproduce ------------------------------------------------------------------------------
def test_reproduce_matches(capsys, tree_prefix, tmp_path):
    code, out, _ = marin(
        capsys, "reproduce", "checkpoints/curve", "--prefix", tree_prefix, "--into", str(tmp_path / "again")
    )
    assert code == 0, out
    assert "rebuilt 5 step(s) with identical version hashes" in out
    assert "checkpoints/curve: equal" in out and "result: outputs are identical" in out
    original = OutputTree(tree_prefix).find("checkpoints/curve")
    copy = OutputTree(str(tmp_path / "again")).find("checkpoints/curve")
    assert copy.relpath == original.relpath  # same version hash, new prefix
    with (
        open(os.path.join(copy.path, "metrics.jsonl")) as a,
        open(os.path.join(original.path, "metrics.jsonl")) as b,
    ):
        assert a.read() == b.read()


def test_reproduce_by_path_reports_a_difference(capsys, tree_prefix, tmp_path):
    stamp = OutputTree(tree_prefix).find("analysis/stamp")
    code, out, _ = marin(capsys, "reproduce", stamp.path, "--into", str(tmp_path / "again"))
    assert code == 1
    assert "analysis/stamp: DIFFERENT" in out
    assert "differs: stamp.txt" in out
    assert "constant.txt.gz" not in out.split("analysis/stamp: DIFFERENT")[1]  # the equal file is not listed
    assert "result: outputs differ" in out


def test_reproduce_refuses_unimportable_code(capsys, tree_prefix, tmp_path):
    curve = step_dir(tree_prefix, "checkpoints/curve")
    edit_info(curve, lambda record: record.update(fn_name="vanished_module.train:run"))
    code, _, err = marin(
        capsys, "reproduce", "checkpoints/curve", "--prefix", tree_prefix, "--into", str(tmp_path / "x")
    )
    assert code == 2
    assert "vanished_module.train:run is not importable" in err and "checkpoints/curve" in err
    assert not os.path.exists(tmp_path / "x")

    def rename_type(record):
        record["config_template"]["__dataclass__"] = "tests.marin.sample_tree:NoSuchConfig"

    edit_info(curve, lambda record: record.update(fn_name="tests.marin.sample_tree:write_curve"))
    edit_info(curve, rename_type)
    code, _, err = marin(
        capsys, "reproduce", "checkpoints/curve", "--prefix", tree_prefix, "--into", str(tmp_path / "x")
    )
    assert code == 2 and "NoSuchConfig" in err


def test_reproduce_refuses_another_git_commit_unless_allowed(capsys, tree_prefix, tmp_path):
    path = step_dir(tree_prefix, "raw/notes")
    recorded = read_info_file(path)["run"]["git"]
    if not recorded.get("commit"):
        pytest.skip("the tests are not running from a git checkout")
    edit_info(path, lambda record: record["run"]["git"].update(commit="0123456789abcdef" * 2 + "01234567"))
    code, _, err = marin(
        capsys, "reproduce", "raw/notes", "--prefix", tree_prefix, "--into", str(tmp_path / "x")
    )
    assert code == 2
    assert "raw/notes was made by git commit 0123456789ab" in err
    assert recorded["commit"][:12] in err and "--allow-code-changes" in err
    code, out, _ = marin(
        capsys,
        "reproduce",
        "raw/notes",
        "--prefix",
        tree_prefix,
        "--into",
        str(tmp_path / "x"),
        "--allow-code-changes",
    )
    assert code == 0 and "going on" in out and "raw/notes: equal" in out


def test_reproduce_from_outside_git_checks_the_commit_of_the_projects_checkout(capsys, tmp_path, monkeypatch):
    """`cd /tmp/run && python ~/marin/experiments/tutorials/hello_world.py`, then `marin
    reproduce` from the same directory: the run recorded the commit of the checkout holding
    the script, and reproduce compares that checkout's commit, not the (absent) git state
    of the directory it runs from."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if git_state(str(elsewhere))["root"] is not None or git_state(REPO)["root"] != REPO:
        pytest.skip("needs a temporary directory outside git and the tests in a git checkout")
    script = os.path.join(REPO, "experiments", "tutorials", "hello_world.py")
    subprocess.run(
        [sys.executable, script, "--prefix", str(tmp_path / "tree")],
        check=True,
        cwd=elsewhere,
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
    )
    stats = OutputTree(str(tmp_path / "tree")).find("hello_world/stats")
    recorded = read_info_file(stats.path)["run"]["git"]
    assert recorded["root"] == REPO and recorded["commit"]
    monkeypatch.chdir(elsewhere)
    into = str(tmp_path / "again")
    code, out, err = marin(
        capsys, "reproduce", "hello_world/stats", "--prefix", str(tmp_path / "tree"), "--into", into
    )
    assert code == 0, err
    assert "hello_world/stats: equal" in out and "no git commit" not in out + err
    # The commit is still checked: another recorded commit is refused, naming the checkout.
    edit_info(
        stats.path, lambda record: record["run"]["git"].update(commit="0123456789abcdef" * 2 + "01234567")
    )
    code, _, err = marin(
        capsys, "reproduce", "hello_world/stats", "--prefix", str(tmp_path / "tree"), "--into", into + "2"
    )
    assert code == 2
    assert f"this checkout ({REPO}) is at {recorded['commit'][:12]}" in err


def test_reproduce_refuses_when_the_rebuilt_hash_differs(capsys, tree_prefix, tmp_path):
    curve = step_dir(tree_prefix, "checkpoints/curve")
    edit_info(curve, lambda r: r["config_template"]["fields"].update(learning_rate={"__versioned__": 0.3}))
    code, _, err = marin(
        capsys, "reproduce", "checkpoints/curve", "--prefix", tree_prefix, "--into", str(tmp_path / "x")
    )
    assert code == 2
    assert "do not hash the same" in err and "learning_rate: 0.01 -> 0.3" in err


@pytest.mark.parametrize("in_git", [False, True], ids=["plain_directory", "own_git_repository"])
def test_reproduce_a_step_defined_in_the_experiment_script(capsys, tmp_path, monkeypatch, in_git):
    """A study script of the user's own, outside this project: in a plain directory (no commit
    to check), or in a git repository of its own, whose commit the run records and reproduce
    checks there (not this project's checkout, which holds only the executor)."""
    study = tmp_path / "study"
    study.mkdir()
    script = study / "study.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            from dataclasses import dataclass
            from executor import ExecutorStep, executor_main, this_output_path, versioned

            @dataclass(frozen=True)
            class Config:
                output_path: str
                words: int = 3

            def count(config: Config) -> None:
                os.makedirs(config.output_path, exist_ok=True)
                with open(os.path.join(config.output_path, "count.txt"), "w") as handle:
                    handle.write(" ".join(str(i) for i in range(config.words)))

            step = ExecutorStep(name="study/count", fn=count, config=Config(this_output_path(), versioned(5)))

            if __name__ == "__main__":
                executor_main([step])
            """
        )
    )
    if in_git:
        git = ["git", "-C", str(study), "-c", "user.name=t", "-c", "user.email=t@example.com"]
        for command in (["init", "-q"], ["add", "study.py"], ["commit", "-q", "-m", "study"]):
            subprocess.run([*git, *command], check=True, capture_output=True)
    prefix = tmp_path / "tree"
    env = {**os.environ, "PYTHONPATH": REPO}
    subprocess.run(
        [sys.executable, str(script), "--prefix", str(prefix)], check=True, env=env, capture_output=True
    )
    info = read_info_file(OutputTree(str(prefix)).find("study/count").path)
    assert info["fn_name"] == "__main__:count" and info["run"]["script"] == str(script)
    recorded = info["run"]["git"]["commit"]
    assert (recorded == git_state(str(study))["commit"]) if in_git else recorded is None
    monkeypatch.chdir(study)  # the script is loaded only from the checkout reproduce runs in
    code, out, err = marin(
        capsys, "reproduce", "study/count", "--prefix", str(prefix), "--into", str(tmp_path / "again")
    )
    assert code == 0, out + err
    assert f"study/count: __main__:count (its function), defined in {os.path.realpath(script)}" in out
    assert "study/count: equal" in out
    assert ("no git commit was recorded" in out) != in_git


# -- gc --------------------------------------------------------------------------------------
def test_gc_lists_then_deletes_only_garbage(capsys, tree_prefix):
    failing = ExecutorStep(
        name="broken/step", fn=fail_always, config=NoteConfig(this_output_path(), versioned("x"))
    )
    with pytest.raises(Exception, match="planted failure"):
        Executor(tree_prefix, lease_config=FAST_LEASES, console=False).run([failing])
    # An abandoned output (a driver died before writing a lease) and a running one.
    tree = OutputTree(tree_prefix)
    store = tree.store
    abandoned, running = f"{tree_prefix}/abandoned/step-0badc0de", f"{tree_prefix}/live/step-0000cafe"
    for path in (abandoned, running):
        append_status(store, path, Status.RUNNING, worker="gone")
    now = time.time()
    store.write_atomic(lease_path(running), LeaseRecord("w", heartbeat=now).to_bytes())
    # Outputs of an experiment whose manifest was deleted are unreferenced.
    Executor(tree_prefix, lease_config=FAST_LEASES, console=False).run(sample_tree.note_steps("orphan"))
    orphan_manifests = [
        e.path
        for e in OutputTree(tree_prefix).experiments
        if any(s["name"] == "notes/first" for s in e.steps)
    ]
    for path in orphan_manifests:
        os.remove(path)

    code, out, _ = marin(capsys, "gc", "--prefix", tree_prefix)
    assert code == 0
    # Rows of the SIZE / OUTPUT / WHY table: "1.2 KB  broken/step-1a2b3c4d  failed: ..."
    rows = [re.match(r"^[\d.]+ [KMGT]?B\s+(\S+)\s+(.*)$", line) for line in out.splitlines()]
    listed = {row.group(1): row.group(0) for row in rows if row}
    assert len(listed) == 4, out
    assert any(
        path.startswith("broken/step-") and "failed: RuntimeError: planted failure" in line
        for path, line in listed.items()
    )
    assert any(path.startswith("abandoned/step-") and "abandoned" in line for path, line in listed.items())
    assert any(path.startswith("notes/first-") and "not referenced" in line for path, line in listed.items())
    assert not any(path.startswith("live/") for path in listed)
    assert not any(path.startswith(("dedup/", "raw/", "checkpoints/")) for path in listed)
    assert "--yes" in out
    assert os.path.isdir(abandoned)  # listing deletes nothing

    code, out, _ = marin(capsys, "gc", "--prefix", tree_prefix, "--yes")
    assert code == 0 and "deleted 4 output(s)" in out
    remaining = {step.name for step in OutputTree(tree_prefix).steps}
    assert remaining == {*sample_tree.STEP_NAMES, "live/step"}
    code, out, _ = marin(capsys, "gc", "--prefix", tree_prefix)
    assert "nothing to collect" in out


# -- other storage ---------------------------------------------------------------------------
def test_cli_on_s3(capsys, s3_env):
    prefix = s3_env.new_prefix()
    Executor(prefix, lease_config=FAST_LEASES, console=False).run(sample_tree.note_steps("one"))
    Executor(prefix, lease_config=FAST_LEASES, console=False).run(sample_tree.note_steps("two"))
    code, out, _ = marin(capsys, "ls", "--prefix", prefix)
    assert code == 0 and "experiments (2)" in out and "steps (4)" in out and out.count("SUCCESS") == 4
    code, out, _ = marin(capsys, "show", "--prefix", prefix, "notes/first")
    assert code == 0 and "note.txt" in out
    code, out, _ = marin(capsys, "why", "--prefix", prefix, "notes/first")
    assert code == 0 and "text: 'one' -> 'two'" in out
    code, out, _ = marin(capsys, "gc", "--prefix", prefix)
    assert code == 0 and "nothing to collect" in out


def test_ls_on_s3_descends_into_every_namespace(capsys, s3_env):
    """Several top-level directories that are not steps themselves (step names with '/'):
    `marin ls` on an object store lists the steps inside each, not the directories."""
    prefix = s3_env.new_prefix()
    steps = [
        *sample_tree.note_steps("one"),
        ExecutorStep(name="more/third", fn=sample_tree.write_note, config=NoteConfig(this_output_path())),
        ExecutorStep(name="other/fourth", fn=sample_tree.write_note, config=NoteConfig(this_output_path())),
    ]
    Executor(prefix, lease_config=FAST_LEASES, console=False).run(steps)
    code, out, _ = marin(capsys, "ls", "--prefix", prefix)
    assert code == 0, out
    assert "steps (4)" in out and out.count("SUCCESS") == 4, out
    for name in ("notes/first-", "notes/second-", "more/third-", "other/fourth-"):
        assert name in out, out
    assert "UNKNOWN" not in out, out


def test_cli_on_memory_store(capsys):
    prefix = "memory://cli-test"
    Executor(prefix, lease_config=FAST_LEASES, console=False).run(sample_tree.note_steps("m"))
    code, out, _ = marin(capsys, "ls", "--prefix", prefix)
    assert code == 0 and "notes/first-" in out and "notes/second-" in out


def test_marin_command_is_installed():
    result = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "marin"), "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0
    for command in ("ls", "show", "tree", "why", "diff", "reproduce", "gc", "browse"):
        assert command in result.stdout


def test_marin_browse_prints_its_url_and_serves_the_tree(tree_prefix):
    marin_command = os.path.join(os.path.dirname(sys.executable), "marin")
    process = subprocess.Popen(
        [marin_command, "browse", "--prefix", tree_prefix, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = process.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+)/?", line)
        assert match, line
        with urllib.request.urlopen(match.group(1) + "/", timeout=30) as response:
            page = response.read().decode()
        assert response.status == 200
        assert OutputTree(tree_prefix).experiments[0].id in page
    finally:
        process.terminate()
        process.wait(timeout=30)
