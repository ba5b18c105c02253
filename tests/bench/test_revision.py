"""bench/revision.py: the commit a benchmark table records, and `+dirty` when it should be."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


@pytest.fixture(scope="module")
def revision():
    spec = importlib.util.spec_from_file_location("revision", os.path.join(BENCH, "revision.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def git(root, *args):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "checkout"
    for folder in ("bench", "executor", "docs"):
        (root / folder).mkdir(parents=True)
        (root / folder / "a.py").write_text("x = 1\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "one")
    return root


def test_a_clean_checkout_is_its_short_commit(revision, checkout):
    head = git(checkout, "rev-parse", "--short", "HEAD")
    assert revision.commit(("executor", "bench"), str(checkout)) == head


@pytest.mark.parametrize(
    ("change", "dirty"),
    [
        (("bench", "a.py"), True),  # a changed file
        (("executor", "new.py"), True),  # a new file: a new bench script is code measured too
        (("docs", "a.py"), False),  # outside the paths asked about
    ],
)
def test_dirty_names_changes_under_the_paths_asked_about(revision, checkout, change, dirty, monkeypatch):
    (checkout / change[0] / change[1]).write_text("x = 2\n")
    monkeypatch.chdir(checkout / "bench")  # (paths are the checkout's, wherever the caller is)
    head = git(checkout, "rev-parse", "--short", "HEAD")
    assert revision.commit(("executor", "bench"), str(checkout)) == head + ("+dirty" if dirty else "")


def test_outside_git_it_says_unknown(revision, tmp_path):
    assert revision.commit(("bench",), str(tmp_path)) == "unknown"
