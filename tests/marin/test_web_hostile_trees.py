"""The browser over a tampered tree: every page answers (a page or a 4xx refusal, never a
500 with a traceback) and the rest of the content still shows.

Found by a red-team pass over the browser. Each test makes a real tree by running
experiments/tutorials/hello_world.py with the executor, edits it the way someone with
write access to the tree could (wrong JSON types, huge numbers, link loops, names that
are not UTF-8), and asks the real `App` for the pages that read what was edited.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from executor.tree import INFO_FILE, STATUS_FILE
from marin.outputs import human_duration
from marin.web.pages import App, Response
from tests.marin.test_hostile_tree_readers import edit_json

REPO = Path(__file__).resolve().parents[2]
HELLO_WORLD = REPO / "experiments" / "tutorials" / "hello_world.py"


@dataclass(frozen=True)
class Tree:
    prefix: str
    numbers: str
    """`hello_world/numbers`'s output, relative to the prefix."""

    stats: str
    """`hello_world/stats`'s output (reads numbers), relative to the prefix."""

    experiment: str
    """The experiment's id."""

    def path(self, relpath: str) -> str:
        return os.path.join(self.prefix, relpath)

    @property
    def manifest(self) -> str:
        return self.path(f"experiments/{self.experiment}.json")


@pytest.fixture
def tree(tmp_path) -> Tree:
    """hello_world run for real into a fresh prefix: two SUCCESS steps and their manifest."""
    prefix = str(tmp_path / "prefix")
    done = subprocess.run(
        [sys.executable, str(HELLO_WORLD), "--prefix", prefix],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (numbers,) = glob.glob(os.path.join(prefix, "hello_world", "numbers-*"))
    (stats,) = glob.glob(os.path.join(prefix, "hello_world", "stats-*"))
    (manifest,) = glob.glob(os.path.join(prefix, "experiments", "*.json"))
    return Tree(
        prefix=prefix,
        numbers=os.path.relpath(numbers, prefix),
        stats=os.path.relpath(stats, prefix),
        experiment=Path(manifest).stem,
    )


def get(tree: Tree, target: str) -> tuple[int, str]:
    response: Response = App(tree.prefix).handle(target)
    shown = response.body.decode("utf-8", "replace").partition("<main>")[2]
    assert response.status != 500, f"{target}: {shown[:2000]}"
    assert response.stream is None
    return response.status, response.body.decode("utf-8")


def ok(tree: Tree, target: str) -> str:
    status, body = get(tree, target)
    assert status == 200, f"{target}: {status} {body.partition('<main>')[2][:2000]}"
    return body


def edit_status_lines(path: str, change) -> None:
    """`change(events)` may return raw text lines (to write numbers JSON cannot round-trip)."""
    with open(path) as handle:
        events = [json.loads(line) for line in handle if line.strip()]
    lines = change(events) or [json.dumps(event) for event in events]
    with open(path, "w") as handle:
        handle.write("".join(line + "\n" for line in lines))


def every_page(tree: Tree) -> list[str]:
    return [
        "/",
        "/steps",
        f"/exp/{tree.experiment}",
        f"/exp/{tree.experiment}?sizes=1",
        f"/step/{tree.numbers}",
        f"/step/{tree.stats}",
        f"/file/{tree.stats}",
        f"/file/{tree.stats}/stats.json",
        f"/compare/{tree.stats}/stats.json",
        "/leaderboard",
        "/predictions",
    ]


# -- .executor_info fields of the wrong type ----------------------------------------------------
@pytest.mark.parametrize(
    "run",
    [
        "not an object",
        {"git": "main@1234abcd"},
        {"git": ["1234abcd"]},
        {"git": {"commit": ["1234abcd"], "dirty": "yes"}},
    ],
)
def test_a_step_whose_run_record_is_not_an_object_still_shows(tree, run):
    edit_json(tree.path(f"{tree.stats}/{INFO_FILE}"), lambda info: info.update(run=run))

    body = ok(tree, f"/step/{tree.stats}")

    assert "hello_world/stats" in body
    assert "Count, min, max and mean" in body  # the rest of the overview
    assert "stats.json" in body  # and the files


@pytest.mark.parametrize(
    "output_path", [["/elsewhere"], {"path": "/elsewhere"}, 12, None, True, "relative/path"]
)
def test_a_dependency_whose_output_path_is_not_a_string_is_not_followed(tree, output_path):
    def change(info):
        info["dependency_steps"][0]["output_path"] = output_path

    edit_json(tree.path(f"{tree.stats}/{INFO_FILE}"), change)

    body = ok(tree, f"/compare/{tree.stats}/stats.json")
    assert "stats.json across steps" in body
    body = ok(tree, f"/step/{tree.stats}")
    assert "hello_world/numbers" in body  # the dependency is still named


@pytest.mark.parametrize("dependencies", [12, "oops", [["a"]], [{"output_path": ["a"]}], [None]])
def test_dependencies_of_the_wrong_shape_do_not_break_pages(tree, dependencies):
    def change(info):
        del info["dependency_steps"]
        info["dependencies"] = dependencies

    edit_json(tree.path(f"{tree.stats}/{INFO_FILE}"), change)

    for target in every_page(tree):
        get(tree, target)
    assert "hello_world/stats" in ok(tree, f"/step/{tree.stats}")


# -- experiment manifests -----------------------------------------------------------------------
@pytest.mark.parametrize("name", [["hello_world/stats"], {"n": 1}, 12, 1.5, True, None, ""])
def test_a_manifest_step_name_of_the_wrong_type_still_draws_the_graph(tree, name):
    def change(manifest):
        manifest["steps"][1]["name"] = name

    edit_json(tree.manifest, change)

    body = ok(tree, f"/exp/{tree.experiment}")
    assert "hello_world/numbers" in body  # the other step, in the table and the picture
    assert 'class="dag"' in body
    for target in every_page(tree):
        get(tree, target)


@pytest.mark.parametrize(
    "field, value",
    [
        ("output_path", ["a", "b"]),
        ("output_path", {"a": 1}),
        ("output_path", 12),
        ("dependencies", 12),
        ("dependencies", [["x"]]),
        ("dependencies", [{"output_path": ["x"]}]),
        ("version_hash", 1234567890123),
        ("version_hash", {"a": 1}),
        ("outcome", ["succeeded"]),
    ],
)
def test_a_manifest_step_field_of_the_wrong_type_leaves_the_pages_up(tree, field, value):
    def change(manifest):
        manifest["steps"][1][field] = value

    edit_json(tree.manifest, change)

    for target in every_page(tree):
        get(tree, target)
    assert "hello_world/numbers" in ok(tree, f"/exp/{tree.experiment}")
    assert tree.experiment in ok(tree, "/")


@pytest.mark.parametrize(
    "field, value",
    [
        ("git", {"commit": 1234567, "branch": ["main"], "dirty": "no"}),
        ("git", {"commit": ["abc"]}),
        ("git", {"commit": {"a": 1}}),
        ("command_line", [1, 2, None]),
        ("command_line", 12),
        ("command_line", "python x.py"),
        ("steps", [1, "two", None]),
        ("created_date", 12),
        ("user", ["me"]),
    ],
)
def test_a_manifest_field_of_the_wrong_type_leaves_the_pages_up(tree, field, value):
    edit_json(tree.manifest, lambda manifest: manifest.update({field: value}))

    assert tree.experiment in ok(tree, "/")
    assert tree.experiment in ok(tree, f"/exp/{tree.experiment}")
    for target in every_page(tree):
        get(tree, target)


# -- status lines ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "duration",
    ["1" * 400, "-" + "9" * 400, "1e400", '"fast"', "[1]", "{}", "true", "NaN", "Infinity", "-Infinity"],
    ids=lambda duration: duration[:12],
)
def test_a_status_duration_of_any_value_shows_as_a_duration_or_nothing(tree, duration):
    def change(events):
        events[-1]["duration_s"] = "DURATION"
        return [json.dumps(event).replace('"DURATION"', duration) for event in events]

    edit_status_lines(tree.path(f"{tree.stats}/{STATUS_FILE}"), change)

    body = ok(tree, f"/step/{tree.stats}")
    assert "Status history" in body and "SUCCESS" in body
    assert "hello_world/stats" in ok(tree, "/steps")
    assert "hello_world/stats" in ok(tree, f"/exp/{tree.experiment}")


@pytest.mark.parametrize(
    "value, shown",
    [
        (None, ""),
        (12.0, "12.0s"),
        (90, "1.5m"),
        (7200, "2.0h"),
        (10**400, ""),
        (float("inf"), ""),
        (float("nan"), ""),
        ("12", ""),
        (True, ""),
        ([1], ""),
    ],
    ids=lambda value: repr(value)[:12],
)
def test_human_duration_takes_any_value(value, shown):
    assert human_duration(value) == shown


# -- links and names ------------------------------------------------------------------------------
def test_a_bookkeeping_file_that_links_to_itself_is_refused_not_an_error(tree):
    info = tree.path(f"{tree.stats}/{INFO_FILE}")
    os.remove(info)
    os.symlink(info, info)

    status, body = get(tree, f"/file/{tree.stats}/{INFO_FILE}")
    assert status in (403, 404), body
    status, body = get(tree, f"/raw/{tree.stats}/{INFO_FILE}")
    assert status in (403, 404), body
    status, body = get(tree, f"/file/{tree.stats}/{INFO_FILE}/below")
    assert status in (403, 404), body
    assert "stats.json" in ok(tree, f"/file/{tree.stats}")  # the listing leaves it out, shows the rest
    body = ok(tree, f"/step/{tree.stats}")
    assert "not read" in body and "Status history" in body  # says why, shows the rest
    ok(tree, "/steps")


def test_a_link_loop_of_two_is_refused_not_an_error(tree):
    one, two = tree.path(f"{tree.stats}/one"), tree.path(f"{tree.stats}/two")
    os.symlink(two, one)
    os.symlink(one, two)
    for target in (f"/file/{tree.stats}/one", f"/raw/{tree.stats}/two", f"/compare/{tree.stats}/one"):
        status, body = get(tree, target)
        assert status in (403, 404), (target, body)
    ok(tree, f"/step/{tree.stats}")


def test_a_path_segment_longer_than_the_filesystem_allows_is_not_found(tree):
    status, _body = get(tree, f"/file/{tree.stats}/{'a' * 300}")
    assert status == 404
    status, _body = get(tree, f"/step/{'a' * 300}")
    assert status == 404


def test_names_that_are_not_utf8_are_shown_escaped_and_the_rest_still_renders(tree):
    prefix = os.fsencode(tree.prefix)
    stats = os.fsencode(tree.path(tree.stats))
    # A step output whose directory name is not UTF-8, a file and a directory in one.
    bad_step = os.path.join(prefix, b"hello_world", b"bad\xff-0123abcd")
    os.mkdir(bad_step)
    for name in (INFO_FILE, STATUS_FILE):
        with open(os.path.join(stats, os.fsencode(name)), "rb") as source:
            data = source.read()
        with open(os.path.join(bad_step, os.fsencode(name)), "wb") as target:
            target.write(data)
    with open(os.path.join(stats, b"bad\xff.txt"), "wb") as handle:
        handle.write(b"latin-1 name\n")
    os.mkdir(os.path.join(stats, b"dir\xfe"))
    os.mkdir(os.path.join(prefix, b"top\xfd"))

    body = ok(tree, "/steps")
    assert tree.numbers in body and tree.stats in body  # the rest of the tree
    assert "bad\\xff-0123abcd" in body  # the odd one, escaped
    body = ok(tree, f"/step/{tree.stats}")
    assert "stats.json" in body and "bad\\xff.txt" in body
    body = ok(tree, f"/file/{tree.stats}")
    assert "stats.json" in body and "bad\\xff.txt" in body and "dir\\xfe" in body
    assert "name not servable" in body
    body = ok(tree, "/file")
    assert "hello_world" in body and "top\\xfd" in body
    for target in every_page(tree):
        get(tree, target)


def test_a_step_that_is_not_utf8_is_named_escaped_where_others_refer_to_it(tree):
    bad_relpath = os.fsdecode(b"hello_world/bad\xff-0123abcd")
    shutil.copytree(tree.path(tree.stats), tree.path(bad_relpath))
    bad_path = tree.path(bad_relpath)

    def add_entry(manifest):
        manifest["steps"].append(dict(manifest["steps"][1], output_path=bad_path, name="bad"))

    edit_json(tree.manifest, add_entry)

    def read_bad(info):
        info["dependency_steps"].append({"name": "bad", "output_path": bad_path, "blocking": True})

    edit_json(tree.path(f"{tree.stats}/{INFO_FILE}"), read_bad)

    body = ok(tree, f"/exp/{tree.experiment}")
    assert "bad\\xff-0123abcd" in body and "name not servable" in body
    assert "hello_world/numbers" in body
    body = ok(tree, f"/step/{tree.stats}")
    assert "name not servable" in body and "hello_world/numbers" in body
    body = ok(tree, f"/step/{tree.numbers}")  # read by stats and by the odd one (the manifest says)
    assert "name not servable" in body and "hello_world/stats" in body
    for target in every_page(tree):
        get(tree, target)


def test_recorded_paths_that_no_file_name_spells_are_not_followed(tree):
    lone = f"{tree.prefix}/hello_world/\ud800"

    def change_info(info):
        info["dependency_steps"][0]["output_path"] = lone
        info["dependencies"] = [lone]

    edit_json(tree.path(f"{tree.stats}/{INFO_FILE}"), change_info)

    def change_manifest(manifest):
        manifest["steps"][0]["output_path"] = lone
        manifest["steps"][1]["dependencies"] = [lone]

    edit_json(tree.manifest, change_manifest)

    for target in every_page(tree):
        get(tree, target)
    assert "hello_world/numbers" in ok(tree, f"/exp/{tree.experiment}")
    assert "hello_world/numbers" in ok(tree, f"/step/{tree.stats}")


def test_strings_in_bookkeeping_that_are_not_unicode_text_are_shown_escaped(tree):
    # JSON may spell a lone surrogate (`"\ud800"`), which no UTF-8 page can hold.
    lone = "\ud800x\udcff"

    def change_info(info):
        info["name"] = "hello_world/" + lone
        info["description"] = lone
        info["run"]["git"]["commit"] = lone

    edit_json(tree.path(f"{tree.stats}/{INFO_FILE}"), change_info)

    def change_manifest(manifest):
        manifest["steps"][1]["name"] = lone
        manifest["steps"][1]["outcome"] = lone
        manifest["description"] = lone

    edit_json(tree.manifest, change_manifest)
    edit_status_lines(
        tree.path(f"{tree.stats}/{STATUS_FILE}"),
        lambda events: events[-1].update(message=lone, worker=lone),
    )

    for target in every_page(tree):
        status, body = get(tree, target)
        assert status == 200, target
    assert "\\ud800x" in ok(tree, f"/step/{tree.stats}")
    assert "hello_world/numbers" in ok(tree, f"/exp/{tree.experiment}")


# -- training curves ------------------------------------------------------------------------------
def test_metrics_with_numbers_past_a_float_are_skipped(tree):
    lines = [
        '{"step": 0, "train/loss": 3.0}',
        '{"step": 1, "train/loss": ' + "9" * 400 + "}",
        '{"step": ' + "1" * 400 + ', "train/loss": 2.0}',
        '{"step": 2, "train/loss": Infinity, "eval/loss": NaN}',
        '{"step": Infinity, "train/loss": 1.0}',
        '{"step": NaN, "train/loss": 1.0}',
        '{"step": 3, "train/loss": 1.5, "eval/loss": 1.75}',
    ]
    with open(tree.path(f"{tree.stats}/metrics.jsonl"), "w") as handle:
        handle.write("\n".join(lines) + "\n")

    body = ok(tree, f"/train/{tree.stats}")
    assert "train/loss" in body and "1.5" in body
    ok(tree, f"/step/{tree.stats}")


@pytest.mark.parametrize("how", ["copied", "linked"])
def test_a_copied_or_linked_tree_is_browsed_where_it_is_now(tmp_path, how):
    """Records name absolute paths under the prefix a run wrote them to: a copied tree, or one
    served through a link to it, showed every step as "(outside the prefix)" (red-team pass,
    twenty-second session)."""
    import http.client

    from executor import Executor
    from marin.outputs import OutputTree
    from marin.web import start_server
    from tests.marin import sample_tree

    original = str(tmp_path / "tree")
    Executor(original, console=False).run(sample_tree.build_steps()[:3])
    here = str(tmp_path / "here")
    if how == "copied":
        shutil.copytree(original, here, symlinks=True)
        os.rename(
            original, str(tmp_path / "gone")
        )  # (not rmtree: see the test above in test_hostile_tree_readers)
    else:
        os.symlink(original, here)
    tree = OutputTree(here)
    (experiment,) = tree.experiments
    documents = tree.find("documents/notes")

    server = start_server(here, port=0)
    server.start_in_thread()
    try:
        pages = {}
        for target in (f"/exp/{experiment.id}", f"/step/{documents.relpath}"):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            connection.request("GET", target)
            response = connection.getresponse()
            pages[target] = (response.status, response.read().decode())
            connection.close()
    finally:
        server.shutdown()
    for target, (status, body) in pages.items():
        assert status == 200, (target, body[:500])
        assert "outside the prefix" not in body, (target, body)
    experiment_page = pages[f"/exp/{experiment.id}"][1]
    assert f"/step/{documents.relpath}" in experiment_page
    step_page = pages[f"/step/{documents.relpath}"][1]
    assert "/step/raw/notes-" in step_page  # upstream, linked where it is now
    assert "/step/filtered/notes-" in step_page  # downstream (from the manifest)
