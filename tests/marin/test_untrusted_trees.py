"""Output trees are untrusted input: crafted `.executor_info` files are refused, and nothing runs.

Each test makes a real tree with the executor (one tiny step), edits its `.executor_info`
the way someone with write access to the tree could, and checks that `marin reproduce`
refuses with exit status 2, naming the file, the field and the name, and that a sentinel
file the payload would create does not exist.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc

import pytest

from executor import Executor
from executor.tree import info_path
from marin.outputs import MAX_RECORD_BYTES, OutputTree, TreeFileError
from tests.marin import sample_tree
from tests.marin.sample_tree import FAST_LEASES, marin


@pytest.fixture
def tree(tmp_path) -> str:
    """A one-step tree (`notes/first`, fn tests.marin.sample_tree:write_note)."""
    prefix = str(tmp_path / "tree")
    Executor(prefix, lease_config=FAST_LEASES, console=False).run(sample_tree.note_steps("hi")[:1])
    return prefix


@pytest.fixture
def sentinel(tmp_path) -> str:
    return str(tmp_path / "pwned")


def note_dir(prefix: str) -> str:
    return OutputTree(prefix).find("notes/first").path


def edit(prefix: str, change) -> str:
    """Apply `change` to the step's recorded info; returns the `.executor_info` path."""
    path = info_path(note_dir(prefix))
    with open(path) as handle:
        record = json.load(handle)
    change(record)
    with open(path, "w") as handle:
        json.dump(record, handle)
    return path


def set_text(template) -> callable:
    return lambda record: record["config_template"]["fields"].update(text=template)


def reproduce_refused(capsys, tree: str, tmp_path, *needles: str, ref: str = "notes/first") -> str:
    """Run `marin reproduce` on the crafted tree; assert it refused before running anything."""
    into = tmp_path / "again"
    code, out, err = marin(
        capsys, "reproduce", ref, "--prefix", tree, "--into", str(into), "--allow-code-changes"
    )
    assert code == 2, out + err
    for needle in needles:
        assert needle in err, err
    assert "result:" not in out and "will call" not in out
    assert not into.exists()  # no step ran
    return err


# -- the reported attack and its relatives: a name in config_template ---------------------------
def test_path_tag_naming_os_system_is_refused_and_not_run(capsys, tree, tmp_path, sentinel):
    info = edit(tree, set_text({"__versioned__": {"__path__": "os:system", "value": f"touch {sentinel}"}}))
    reproduce_refused(
        capsys, tree, tmp_path, info, "field 'text'", "os:system is a builtin function", "not a pathlib"
    )
    assert not os.path.exists(sentinel)


def test_builtins_eval_is_refused(capsys, tree, tmp_path, sentinel):
    code = f"__import__('os').system('touch {sentinel}')"
    info = edit(tree, set_text({"__path__": "builtins:eval", "value": code}))
    reproduce_refused(capsys, tree, tmp_path, info, "field 'text'", "builtins:eval is a builtin function")
    assert not os.path.exists(sentinel)


def test_subprocess_run_as_a_dataclass_is_refused(capsys, tree, tmp_path, sentinel):
    payload = {"__dataclass__": "subprocess:run", "fields": {"args": ["touch", sentinel]}}
    info = edit(tree, set_text(payload))
    reproduce_refused(capsys, tree, tmp_path, info, "field 'text'", "subprocess:run is a function")
    assert not os.path.exists(sentinel)


def test_classes_that_are_not_dataclasses_are_refused(capsys, tree, tmp_path):
    info = edit(tree, set_text({"__dataclass__": "collections:OrderedDict", "fields": {"a": 1}}))
    reproduce_refused(capsys, tree, tmp_path, info, "the class collections:OrderedDict, not a dataclass")
    # A class of this project that is not a dataclass (constructing it would read a path).
    edit(tree, set_text({"__dataclass__": "marin.outputs:OutputTree", "fields": {"prefix": "/"}}))
    reproduce_refused(capsys, tree, tmp_path, "marin.outputs:OutputTree, not a dataclass")


def test_a_callable_nested_in_a_list_inside_a_dataclass_is_refused(capsys, tree, tmp_path):
    inner = {
        "__dataclass__": "tests.marin.sample_tree:NoteConfig",
        "fields": {"output_path": "x", "text": {"__tuple__": [1, {"__callable__": "os:system"}]}},
    }
    info = edit(tree, set_text({"__versioned__": [0, inner]}))
    reproduce_refused(capsys, tree, tmp_path, info, "field 'text[1].text'", "os:system is a builtin function")


def test_a_python_function_in_a_config_is_refused_outside_the_project(capsys, tree, tmp_path):
    info = edit(tree, set_text({"__callable__": "subprocess:run"}))
    err = reproduce_refused(capsys, tree, tmp_path, info, "field 'text'", "subprocess:run is defined in")
    assert "subprocess.py, outside" in err


def test_a_dataclass_tag_naming_a_function_is_refused(capsys, tree, tmp_path, sentinel):
    payload = {"__dataclass__": "tests.marin.sample_tree:write_note", "fields": {"config": None}}
    info = edit(tree, set_text(payload))
    reproduce_refused(
        capsys, tree, tmp_path, info, "tests.marin.sample_tree:write_note is a function", "not a dataclass"
    )


def test_an_enum_tag_naming_a_non_enum_is_refused(capsys, tree, tmp_path):
    info = edit(tree, set_text({"__enum__": "os:environ", "name": "PATH"}))
    reproduce_refused(capsys, tree, tmp_path, info, "field 'text'", "os:environ is a os._Environ object")
    edit(tree, set_text({"__enum__": "marin.outputs:OutputTree", "name": "prefix"}))
    reproduce_refused(capsys, tree, tmp_path, "the class marin.outputs:OutputTree, not an Enum")


# -- the step function ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fn_name", "why"),
    [
        ("os:system", "os:system is a builtin function"),
        ("builtins:eval", "builtins:eval is a builtin function"),
        ("subprocess:run", "subprocess:run is defined in"),
        ("collections:OrderedDict", "the class collections:OrderedDict"),
    ],
)
def test_step_functions_outside_the_project_are_refused(capsys, tree, tmp_path, fn_name, why):
    info = edit(tree, lambda record: record.update(fn_name=fn_name))
    reproduce_refused(capsys, tree, tmp_path, info, "field 'fn_name'", why)


def test_a_module_outside_the_project_is_neither_imported_nor_called(capsys, tree, tmp_path, monkeypatch):
    """A module on sys.path but outside the project and the checkout (as a colleague's tree might name)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    imported, called = tmp_path / "imported", tmp_path / "called"
    (elsewhere / "evil_steps.py").write_text(
        f"open({str(imported)!r}, 'w').close()\ndef run(config):\n    open({str(called)!r}, 'w').close()\n"
    )
    monkeypatch.syspath_prepend(str(elsewhere))
    info = edit(tree, lambda record: record.update(fn_name="evil_steps:run"))
    reproduce_refused(
        capsys, tree, tmp_path, info, "field 'fn_name'", "module 'evil_steps' would be imported"
    )
    assert not imported.exists() and not called.exists()
    # Already imported by someone else: its function is still refused, by where it is defined.
    monkeypatch.setitem(sys.modules, "evil_steps", None)  # so that teardown removes it again
    del sys.modules["evil_steps"]
    __import__("evil_steps")  # (a later run in this process must find it unimported)
    os.remove(imported)
    reproduce_refused(capsys, tree, tmp_path, "evil_steps:run is defined in", "evil_steps.py, outside")
    assert not called.exists()


def test_recorded_directories_are_not_put_on_the_import_path(capsys, tree, tmp_path):
    planted = tmp_path / "planted"
    planted.mkdir()
    sentinel = tmp_path / "imported"
    (planted / "planted_steps.py").write_text(f"open({str(sentinel)!r}, 'w').close()\ndef run(c): pass\n")

    def change(record):
        record["fn_name"] = "planted_steps:run"
        record["run"].update(cwd=str(planted), git={"root": str(planted), "commit": "0" * 40})

    info = edit(tree, change)
    reproduce_refused(capsys, tree, tmp_path, info, "planted_steps", "no module of that name")
    assert not sentinel.exists() and str(planted) not in sys.path


def test_git_is_not_run_in_a_recorded_directory(capsys, tree, tmp_path):
    """A recorded git root whose config runs a command (core.fsmonitor) is never visited."""
    planted = tmp_path / "repo"
    sentinel = tmp_path / "git-ran"
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {sentinel}\n")
    hook.chmod(0o755)
    git = ["git", "-C", str(planted), "-c", "user.name=x", "-c", "user.email=x@example.com"]
    subprocess.run(["git", "init", "-q", str(planted)], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    subprocess.run([*git, "config", "core.fsmonitor", str(hook)], check=True)
    edit(tree, lambda record: record["run"].update(git={"root": str(planted), "commit": "0" * 40}))
    code, out, err = marin(
        capsys, "reproduce", "notes/first", "--prefix", tree, "--into", str(tmp_path / "again")
    )
    assert code == 2 and "was made by git commit 000000000000" in err
    assert not sentinel.exists()


def test_an_experiment_script_outside_the_checkout_is_not_loaded(capsys, tree, tmp_path):
    script = tmp_path / "study.py"
    sentinel = tmp_path / "script-ran"
    script.write_text(f"open({str(sentinel)!r}, 'w').close()\ndef write_note(config): pass\n")

    def change(record):
        record["fn_name"] = "__main__:write_note"
        record["run"]["script"] = str(script)

    info = edit(tree, change)
    reproduce_refused(
        capsys, tree, tmp_path, info, "field 'run.script'", str(script), "is not a file inside this checkout"
    )
    assert not sentinel.exists()


def test_a_dependency_outside_the_prefix_is_refused(capsys, tree, tmp_path):
    info = edit(
        tree,
        lambda record: record.update(
            dependency_steps=[{"name": "x", "output_path": str(tmp_path / "elsewhere")}]
        ),
    )
    reproduce_refused(
        capsys, tree, tmp_path, info, "field 'dependency_steps[0].output_path'", "not a path inside"
    )


def test_a_marin_style_dependency_outside_the_prefix_is_refused(capsys, tree, tmp_path):
    """Marin records dependencies as bare output paths; those are checked the same way."""

    def change(record):
        record.pop("dependency_steps", None)
        record["dependencies"] = [str(tmp_path / "elsewhere")]

    info = edit(tree, change)
    reproduce_refused(capsys, tree, tmp_path, info, "field 'dependencies[0]'", "not a path inside")


# -- the files themselves -------------------------------------------------------------------------
def test_a_huge_executor_info_is_refused_without_reading_it(capsys, tree, tmp_path):
    path = info_path(note_dir(tree))
    with open(path, "w") as handle:
        handle.write('{"name": "notes/first", "pad": "' + "x" * (40 << 20) + '"}')
    tracemalloc.start()
    started = time.monotonic()
    try:
        err = reproduce_refused(capsys, tree, tmp_path, path, "more than the 4,194,304 bytes")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 10
    assert peak < 2 * MAX_RECORD_BYTES, peak  # never the 40 MB
    assert "41,943,0" in err  # the size it holds
    # Every reader: ls lists the step and warns; show says what was not read.
    code, out, err = marin(capsys, "ls", "--prefix", tree, "--no-size")
    assert code == 0 and "notes/first-" in out and "more than the" in err
    code, out, _ = marin(capsys, "show", "--prefix", tree, "notes/first")
    assert code == 0 and "NOT READ:" in out


def test_read_record_stops_at_the_bound_for_a_file_that_grows(tmp_path, tree):
    """A FIFO (or /dev/zero behind a link) is not a regular file: refused, not read forever."""
    step = note_dir(tree)
    os.remove(info_path(step))
    os.mkfifo(info_path(step))
    with pytest.raises(TreeFileError, match="not a regular file"):
        OutputTree(tree).read_record(info_path(step))


def test_a_symlinked_executor_info_out_of_the_prefix_is_not_read(capsys, tree, tmp_path):
    path = info_path(note_dir(tree))
    outside = tmp_path / "outside.json"
    os.replace(path, outside)  # a perfectly good record, but not in the tree
    os.symlink(outside, path)
    err = reproduce_refused(capsys, tree, tmp_path, path, "outside the prefix")
    assert str(outside) in err
    code, out, _ = marin(capsys, "show", "--prefix", tree, "notes/first")
    assert code == 0 and "NOT READ:" in out and "outside the prefix" in out


def test_gc_leaves_links_out_of_the_prefix_and_foreign_manifest_paths_alone(capsys, tree, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    (victim / ".executor_status").write_text('{"date": "", "status": "FAILED"}\n')
    os.symlink(victim, os.path.join(tree, "notes", "linked-0badc0de"))
    manifest = OutputTree(tree).experiments[0].path
    with open(manifest) as handle:
        record = json.load(handle)
    record["steps"].append({"name": "evil", "output_path": str(victim)})
    with open(manifest, "w") as handle:
        json.dump(record, handle)
    code, out, _ = marin(capsys, "gc", "--prefix", tree, "--yes")
    assert code == 0 and "victim" not in out and "linked-" not in out
    assert (victim / "precious.txt").exists()


def test_a_huge_manifest_is_skipped_with_a_warning(capsys, tree):
    manifest = OutputTree(tree).experiments[0].path
    with open(manifest, "w") as handle:
        handle.write("[" + "0," * (MAX_RECORD_BYTES // 2 + 10) + "0]")
    code, out, err = marin(capsys, "ls", "--prefix", tree, "--no-size")
    assert code == 0 and "experiments (0)" in out and f"{manifest} holds" in err


# -- what still works, and the flags ---------------------------------------------------------------
def test_a_legitimate_reproduce_lists_the_functions_it_will_call(capsys, tree, tmp_path):
    code, out, err = marin(
        capsys,
        "reproduce",
        "notes/first",
        "--prefix",
        tree,
        "--into",
        str(tmp_path / "again"),
        "--allow-code-changes",
    )
    assert code == 0, out + err
    source = os.path.realpath(sample_tree.__file__)
    assert f"notes/first: tests.marin.sample_tree:write_note (its function), defined in {source}" in out
    assert out.index("will call") < out.index("running into")
    assert "result: outputs are identical" in out


def test_reproduce_prefix_names_the_tree_and_the_old_usage_fails_helpfully(capsys, tree, tmp_path):
    code, _, err = marin(capsys, "reproduce", "notes/first", "--prefix", str(tmp_path / "check"))
    assert code == 2 and "--into" in err and "--prefix now names the tree to read" in err
    assert not (tmp_path / "check").exists()
    code, _, err = marin(
        capsys, "reproduce", "notes/first", "--from", tree, "--prefix", str(tmp_path / "check")
    )
    assert code == 2 and "--from was removed" in err and "--into" in err
    code, _, err = marin(capsys, "reproduce", "notes/first", "--prefix", tree, "--into", tree + "/inside")
    assert code == 2 and "overlaps the tree" in err


def test_malformed_records_read_as_empty_and_every_command_still_answers(capsys, tree):
    step = note_dir(tree)
    with open(info_path(step), "w") as handle:
        json.dump({"name": 5, "version": [1], "run": "x", "dependencies": "abc", "config": 3}, handle)
    with open(os.path.join(step, ".executor_status"), "w") as handle:
        handle.write('[1, 2]\n{"status": "SUCCESS", "date": 7}\n')
    manifest = OutputTree(tree).experiments[0].path
    with open(manifest, "w") as handle:
        json.dump({"steps": [7, {"output_path": ["x"], "dependencies": [[1]]}], "git": "x"}, handle)
    for command in (["ls"], ["show", step], ["tree"], ["why", step], ["diff", step, step], ["gc"]):
        code, out, err = marin(capsys, command[0], "--prefix", tree, *command[1:])
        assert code == 0, (command, out, err)
    code, out, _ = marin(capsys, "show", "--prefix", tree, step)
    assert "is not a status history: not read" in out


def test_a_step_name_that_climbs_out_of_the_new_prefix_is_refused(capsys, tree, tmp_path):
    step = note_dir(tree)
    info = edit(tree, lambda record: record.update(name="../../escaped"))
    reproduce_refused(capsys, tree, tmp_path, info, "escaped", ref=step)
    assert not (tmp_path / "escaped").exists() and not (tmp_path.parent / "escaped").exists()


def test_a_log_that_is_a_device_or_a_link_out_is_not_read(capsys, tree):
    log = os.path.join(note_dir(tree), ".executor_log")
    if os.path.exists(log):
        os.remove(log)
    os.symlink("/dev/zero", log)
    code, out, _ = marin(capsys, "show", "--prefix", tree, "notes/first")
    assert code == 0 and "leads outside the prefix" in out
    os.remove(log)
    os.mkfifo(log)
    code, out, _ = marin(capsys, "show", "--prefix", tree, "notes/first")
    assert code == 0 and "is not a regular file" in out


# -- the working directory inside the tree, and installed modules named by a tree ---------------
def test_reproduce_refuses_to_run_from_inside_the_tree(capsys, tree, tmp_path, monkeypatch):
    """From inside the tree, its files would come first on the import path (a `random.py`
    there ran on `import random`) and git would read its `.git` (a `core.fsmonitor` there ran
    a command): refused before anything is imported or git runs."""
    sentinel = tmp_path / "planted-ran"
    (tmp_path / "tree" / "random.py").write_text(f"open({str(sentinel)!r}, 'w').close()\n")
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {sentinel}.git\n")
    hook.chmod(0o755)
    git = ["git", "-C", tree, "-c", "user.name=x", "-c", "user.email=x@example.com"]
    subprocess.run(["git", "init", "-q", tree], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    subprocess.run([*git, "config", "core.fsmonitor", str(hook)], check=True)
    for where in [tree, os.path.join(note_dir(tree))]:
        monkeypatch.chdir(where)
        code, out, err = marin(
            capsys, "reproduce", "notes/first", "--prefix", tree, "--into", str(tmp_path / "again")
        )
        assert code == 2, out + err
        assert "is inside the tree being read" in err and "from your own checkout" in err, err
    assert not sentinel.exists() and not os.path.exists(f"{sentinel}.git")
    assert not (tmp_path / "again").exists()


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("antigravity:X", "installed code that nothing loaded so far imports"),  # opens a web browser
        ("this:X", "installed code that nothing loaded so far imports"),  # prints the Zen of Python
    ],
)
def test_installed_modules_with_import_side_effects_are_not_imported(capsys, tree, tmp_path, name, why):
    info = edit(tree, set_text({"__dataclass__": name, "fields": {}}))
    code, out, err = run_isolated(tree, tmp_path)
    assert code == 2, out + err
    assert info in err and "field 'text'" in err and name in err and why in err, err
    assert "Zen of Python" not in out and "usage:" not in err


def run_isolated(tree: str, tmp_path) -> tuple[int, str, str]:
    """`marin reproduce` in a fresh process: what it imports cannot leak from the tests' own."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "marin.cli",
            "reproduce",
            "notes/first",
            "--prefix",
            tree,
            "--into",
            str(tmp_path / "again"),
            "--allow-code-changes",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "BROWSER": f"touch {tmp_path / 'browser-ran'}"},
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        check=False,
    )
    assert not (tmp_path / "browser-ran").exists()
    return result.returncode, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            lambda record: record.update(config_template="just a string"),
            "config must be a dataclass instance",
        ),
        (
            lambda record: record.update(override_output_path="../elsewhere"),
            "override_output_path '../elsewhere'",
        ),
    ],
    ids=["config-a-string", "override-climbs"],
)
def test_a_recorded_step_that_cannot_be_declared_names_its_file(capsys, tree, tmp_path, change, why):
    """It was refused only at resolve, after the list of calls, naming no .executor_info."""
    info = edit(tree, change)
    err = reproduce_refused(capsys, tree, tmp_path, info, why)
    assert "cannot be resolved" not in err


def test_a_step_whose_record_the_tools_cannot_read_is_warned_about_when_it_runs(tmp_path, caplog):
    """A large unversioned config makes an .executor_info over what `marin` reads: the run
    warns, naming the step and the limit; the record is still written whole."""
    import logging
    from dataclasses import dataclass

    from executor import ExecutorStep, this_output_path
    from executor.tree import INFO_READ_BY_TOOLS_BYTES, read_info

    assert INFO_READ_BY_TOOLS_BYTES == MAX_RECORD_BYTES  # the executor warns at what marin reads

    @dataclass(frozen=True)
    class ManyFiles:
        files: list
        output_path: str

    def touch(config):
        os.makedirs(config.output_path, exist_ok=True)

    files = [f"/data/shard-{i:07d}.jsonl.gz" for i in range(MAX_RECORD_BYTES // 30)]
    big = ExecutorStep(name="big", fn=touch, config=ManyFiles(files, this_output_path()))
    small = ExecutorStep(name="small", fn=touch, config=ManyFiles(files[:10], this_output_path()))
    executor = Executor(str(tmp_path), console=False)
    with caplog.at_level(logging.WARNING, logger="executor.tree"):
        executor.run([big, small])
    warnings = [record.getMessage() for record in caplog.records if record.name == "executor.tree"]
    assert len(warnings) == 1 and warnings[0].startswith("step big: its .executor_info is ")
    assert f"over the {MAX_RECORD_BYTES:,} that marin ls" in warnings[0]
    path = executor.output_paths[big]
    assert read_info(executor.store, path)["config"]["files"] == files  # written whole
    with pytest.raises(TreeFileError, match="more than the"):
        OutputTree(str(tmp_path)).read_record(info_path(path))
