"""Readers of a tampered tree: `marin gc` loses nothing, no command prints a traceback or
sends a terminal control sequence, and odd values in bookkeeping files are taken as unread.

Found by a red-team pass over real trees (ninth session). Each test makes a real tree with
the executor, edits it the way someone with write access to the tree could, and runs the
real command.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from executor import Executor, ExecutorRunError, ExecutorStep, this_output_path
from executor.lease import MAX_CLOCK_AHEAD_S, lease_is_stale, read_lease
from executor.store import open_store
from executor.tree import LEASE_FILE, STATUS_FILE, LeaseRecord, Status, append_status, info_path
from marin.outputs import OutputTree, iso_seconds
from marin.terminal import SafeStream, one_line, printable
from tests.marin import sample_tree
from tests.marin.sample_tree import FAST_LEASES, marin


@pytest.fixture
def tree(tmp_path) -> str:
    """Two steps (`notes/first`, `notes/second`), both SUCCESS and referenced by a manifest."""
    prefix = str(tmp_path / "tree")
    Executor(prefix, lease_config=FAST_LEASES, console=False).run(sample_tree.note_steps("hi"))
    return prefix


def step_dir(prefix: str, name: str = "notes/first") -> str:
    return OutputTree(prefix).find(name).path


def only_manifest(prefix: str) -> str:
    directory = os.path.join(prefix, "experiments")
    (name,) = os.listdir(directory)
    return os.path.join(directory, name)


def edit_json(path: str, change) -> None:
    with open(path) as handle:
        record = json.load(handle)
    change(record)
    with open(path, "w") as handle:
        json.dump(record, handle)


def edit_last_status(path: str, change) -> None:
    status = os.path.join(path, STATUS_FILE)
    with open(status) as handle:
        events = [json.loads(line) for line in handle if line.strip()]
    change(events[-1])
    with open(status, "w") as handle:
        handle.write("".join(json.dumps(event) + "\n" for event in events))


# -- gc: nothing referenced is deleted --------------------------------------------------------
def test_gc_never_deletes_a_referenced_output_through_a_link_inside_the_prefix(tree, capsys):
    os.symlink(os.path.join(tree, "notes"), os.path.join(tree, "alias"))
    first, second = step_dir(tree, "notes/first"), step_dir(tree, "notes/second")

    code, out, err = marin(capsys, "gc", "--prefix", tree, "--yes")

    assert code == 0, out + err
    assert "alias/" not in out, out  # not even listed: its real name is referenced
    for path in (first, second):
        assert os.path.exists(os.path.join(path, STATUS_FILE)), out
        assert os.path.exists(os.path.join(path, "note.txt")), out
    assert OutputTree(tree).find("notes/first").status == "SUCCESS"


@pytest.mark.parametrize("damage", ["too_large", "fifo", "directory", "unknown_word"])
def test_gc_keeps_an_output_whose_status_file_it_could_not_read(tree, capsys, damage):
    path = step_dir(tree)
    status = os.path.join(path, STATUS_FILE)
    if damage == "too_large":
        with open(status, "r+b") as handle:
            handle.truncate(300 * 2**20)  # sparse: costs no disk
    elif damage == "fifo":
        os.remove(status)
        os.mkfifo(status)
    elif damage == "directory":  # was read as "no status file": abandoned, and deleted
        os.remove(status)
        os.mkdir(status)
    else:  # a status word this version does not know (a newer executor's, say)
        with open(status, "a") as handle:
            handle.write(json.dumps({"date": "2026-11-24T03:07:28.570Z", "status": "ARCHIVED"}) + "\n")

    code, out, err = marin(capsys, "gc", "--prefix", tree, "--yes")

    assert code == 0, out + err
    assert "abandoned" not in out, out
    assert "kept notes/first-" in out and "its state is unknown" in out, out
    assert "nothing to collect" in out, out
    assert os.path.exists(os.path.join(path, "note.txt"))


@pytest.mark.parametrize("damage", ["truncated", "too_large", "directory", "no_steps"])
def test_gc_deletes_nothing_as_unreferenced_while_a_manifest_is_unread(tree, capsys, damage):
    """Found by a red-team pass (twenty-second session): one unreadable manifest made `gc --yes`
    delete every successful output it referenced, with no warning."""
    manifest = only_manifest(tree)
    if damage == "truncated":  # a disk that filled up mid-write
        with open(manifest, "r+b") as handle:
            handle.truncate(os.path.getsize(manifest) // 2)
    elif damage == "too_large":
        with open(manifest, "r+b") as handle:
            handle.truncate(300 * 2**20)
    elif damage == "directory":
        os.remove(manifest)
        os.mkdir(manifest)
    else:
        edit_json(manifest, lambda record: record.pop("steps"))

    code, out, err = marin(capsys, "gc", "--prefix", tree, "--yes")

    assert code == 0, out + err
    assert "nothing to collect" in out, out
    assert out.count("could not be read") == 2, out  # one "kept" line per output
    assert os.path.basename(manifest) in out, out
    for name in ("notes/first", "notes/second"):
        assert os.path.exists(os.path.join(step_dir(tree, name), "note.txt")), out


def test_gc_still_collects_a_failed_output_while_a_manifest_is_unread(tree, capsys):
    """An unread manifest spares what it may reference; a failed output is garbage either way."""
    path = step_dir(tree)
    edit_last_status(path, lambda event: event.update(status="FAILED", message="boom"))
    with open(only_manifest(tree), "w") as handle:
        handle.write("{not json")

    code, out, err = marin(capsys, "gc", "--prefix", tree, "--yes")

    assert code == 0, out + err
    assert "deleted 1 output(s)" in out, out
    assert not os.path.exists(path)
    assert os.path.exists(os.path.join(step_dir(tree, "notes/second"), "note.txt"))


@pytest.mark.parametrize("how", ["copied", "moved"])
def test_gc_keeps_the_outputs_of_a_tree_copied_or_moved_to_another_prefix(tree, tmp_path, capsys, how):
    """The manifests keep the absolute paths of the prefix they were written for: read relative
    to it, so that a tree copied (`cp -a`, a bucket downloaded) or moved is still referenced."""
    import shutil

    elsewhere = str(tmp_path / "elsewhere")
    (shutil.copytree(tree, elsewhere, symlinks=True) if how == "copied" else shutil.move(tree, elsewhere))

    code, out, err = marin(capsys, "gc", "--prefix", elsewhere, "--yes")
    assert code == 0, out + err
    assert "nothing to collect" in out, out
    for name in ("notes/first", "notes/second"):
        assert os.path.exists(os.path.join(step_dir(elsewhere, name), "note.txt")), out

    code, out, err = marin(capsys, "tree", "--prefix", elsewhere)
    assert code == 0, out + err
    assert "MISSING" not in out and "SUCCESS" in out, out
    assert tree not in out and "notes/first-" in out, out  # named where they are now


@pytest.mark.parametrize("how", ["copied", "linked"])
def test_show_and_reproduce_read_a_copied_tree_where_it_is_now(tmp_path, capsys, how):
    """A tree copied elsewhere, or read through a link to it: its records name the prefix it was
    written under. `show` listed the inputs there as [missing], and `reproduce` refused them as
    paths outside the prefix (red-team pass, twenty-second session)."""
    import shutil

    original = str(tmp_path / "tree")
    sample_tree.run(original)
    here = str(tmp_path / "here")
    if how == "copied":
        shutil.copytree(original, here, symlinks=True)
        # Nothing may be read from where it was. (Renamed, not deleted: the run's lease keeper may
        # still be dropping the last leases, and a file it writes meanwhile fails rmtree.)
        os.rename(original, str(tmp_path / "gone"))
    else:
        os.symlink(original, here)

    code, out, err = marin(capsys, "show", "checkpoints/curve", "--prefix", here)
    assert code == 0, out + err
    inputs = out.split("inputs:", 1)[1]
    assert f"{here}/" in inputs and "[SUCCESS]" in inputs and "[missing]" not in inputs, out

    code, out, err = marin(
        capsys, "reproduce", "checkpoints/curve", "--prefix", here, "--into", str(tmp_path / "again")
    )
    assert code == 0, out + err
    assert "result: outputs are identical" in out, out


def test_a_recorded_path_is_relocated_only_from_the_prefix_the_output_was_written_under(tmp_path):
    from marin.outputs import StepOutput

    info = {"output_path": "/old/prefix/notes/first-0123abcd"}
    step = StepOutput(
        "/new/place/notes/first-0123abcd", "notes/first-0123abcd", (), preloaded_info=(info, None)
    )
    assert step.relocated("/old/prefix/raw/x-1") == "/new/place/raw/x-1"
    assert step.relocated("/old/prefix") == "/old/prefix"  # the prefix itself names no output
    assert step.relocated("/old/prefixed/raw/x-1") == "/old/prefixed/raw/x-1"  # a sibling
    assert step.relocated("/elsewhere/raw/x-1") == "/elsewhere/raw/x-1"
    assert step.relocated(["not", "a", "path"]) == ["not", "a", "path"]
    unmoved = StepOutput(
        "/old/prefix/notes/first-0123abcd", "notes/first-0123abcd", (), preloaded_info=(info, None)
    )
    assert unmoved.relocated("/old/prefix/raw/x-1") == "/old/prefix/raw/x-1"
    renamed = StepOutput(
        "/new/place/notes/other-0123abcd", "notes/other-0123abcd", (), preloaded_info=(info, None)
    )
    assert renamed.relocated("/old/prefix/raw/x-1") == "/old/prefix/raw/x-1"  # the record is not its own


def test_a_manifest_naming_outputs_outside_its_recorded_prefix_is_not_relocated(tree, tmp_path, capsys):
    """Only paths under the manifest's own recorded prefix are read relative to it."""
    import shutil

    elsewhere = str(tmp_path / "elsewhere")
    shutil.copytree(tree, elsewhere, symlinks=True)
    edit_json(only_manifest(elsewhere), lambda record: record.update(prefix=str(tmp_path / "nowhere")))

    code, out, err = marin(capsys, "gc", "--prefix", elsewhere)

    assert code == 0, out + err
    assert out.count("not referenced by any experiment manifest") == 2, out


def test_gc_still_collects_an_output_with_no_status_file(tree, capsys):
    """The check above keys on a status file that exists but was not read, not on any problem."""
    path = step_dir(tree)
    os.remove(os.path.join(path, STATUS_FILE))

    code, out, err = marin(capsys, "gc", "--prefix", tree, "--yes")

    assert code == 0, out + err
    assert "abandoned" in out and "deleted 1 output(s)" in out, out
    assert not os.path.exists(path)
    assert os.path.exists(step_dir(tree, "notes/second"))


def test_gc_keeps_a_failed_output_that_holds_another_experiments_live_output(tmp_path, capsys):
    """One experiment cannot nest outputs; two can. Deleting the failed outer directory would
    take the inner, successful and referenced output with it."""
    prefix = str(tmp_path / "nest")
    outer = ExecutorStep(
        name="n/outer", fn=sample_tree.fail_always, config=sample_tree.NoteConfig(this_output_path(), "o")
    ).with_output_path("n/outer-fixed")
    inner = ExecutorStep(
        name="n/inner", fn=sample_tree.write_note, config=sample_tree.NoteConfig(this_output_path(), "i")
    ).with_output_path("n/outer-fixed/inner")
    with pytest.raises(ExecutorRunError):
        Executor(prefix, lease_config=FAST_LEASES, console=False).run([outer])
    Executor(prefix, lease_config=FAST_LEASES, console=False).run([inner])

    code, out, err = marin(capsys, "gc", "--prefix", prefix, "--yes")

    assert code == 0, out + err
    assert "kept n/outer-fixed: failed" in out and "holds n/outer-fixed/inner" in out, out
    assert os.path.exists(os.path.join(prefix, "n", "outer-fixed", "inner", "note.txt"))
    assert OutputTree(prefix).find("n/inner").status == "SUCCESS"


def test_links_to_the_prefix_do_not_multiply_the_walk(tree, capsys):
    """Six links to the prefix made `ls` list each output 1,500 times over (k^6 for k links)."""
    for index in range(6):
        os.symlink(tree, os.path.join(tree, f"s{index}"))
    os.symlink(os.path.join(tree, "notes"), os.path.join(tree, "notes", "again"))  # a loop inside

    started = time.monotonic()
    code, out, err = marin(capsys, "ls", "--prefix", tree, "--json")
    assert code == 0, err
    assert time.monotonic() - started < 30
    paths = sorted(os.path.relpath(step["path"], tree) for step in json.loads(out)["steps"])
    assert [path.rsplit("-", 1)[0] for path in paths] == ["notes/first", "notes/second"], paths


def test_outputs_are_listed_and_collected_by_their_real_names_only(tree, capsys):
    """Links sorting before the real directory (`a-alias` -> notes) or naming a step output
    itself (`notes/zz-copy` -> notes/first-...) do not make a second name for an output."""
    first = step_dir(tree)
    os.symlink(os.path.join(tree, "notes"), os.path.join(tree, "a-alias"))
    os.symlink(first, os.path.join(tree, "notes", "zz-copy"))
    with open(os.path.join(tree, "notes", "zz-copy", STATUS_FILE), "a") as handle:  # through the link
        handle.write(json.dumps({"date": "2026-11-24T03:07:28.570Z", "status": "FAILED"}) + "\n")

    code, out, err = marin(capsys, "ls", "--prefix", tree, "--json")
    assert code == 0, err
    paths = sorted(os.path.relpath(step["path"], tree) for step in json.loads(out)["steps"])
    assert paths == sorted(
        os.path.relpath(step_dir(tree, name), tree) for name in ("notes/first", "notes/second")
    )

    code, out, err = marin(capsys, "gc", "--prefix", tree, "--yes")  # first is FAILED now: collected
    assert code == 0, out + err
    assert "notes/first-" in out and "zz-copy" not in out and "a-alias" not in out, out
    assert not os.path.exists(first) and os.path.exists(step_dir(tree, "notes/second"))


# -- values that used to raise in a reader ----------------------------------------------------
@pytest.mark.parametrize("outcome", [["x"], 5, {"a": 1}, None, ""])
def test_ls_reads_a_manifest_whose_outcome_is_not_a_word(tree, capsys, outcome):
    edit_json(only_manifest(tree), lambda record: record["steps"][0].update(outcome=outcome))

    code, out, err = marin(capsys, "ls", "--prefix", tree)

    assert code == 0, out + err
    assert "?:1" in out and "succeeded:1" in out, out


@pytest.mark.parametrize(
    "date, seconds",
    [
        ("2026-11-24T03:07:28.570Z", 1795489648.57),
        ("2026-11-24T03:07:28.5+01:00", 1795486048.5),  # an offset is valid ISO-8601
        ("2026-11-24T03:07:28", 1795489648.0),  # no zone: UTC, as the executor writes
        ("2026-11-24T03:07:28.abcZ", None),
        ("not a date", None),
        ("", None),
        (None, None),
        (17, None),
    ],
)
def test_iso_seconds_reads_iso_dates_and_nothing_else(date, seconds):
    found = iso_seconds(date)
    assert found == pytest.approx(seconds) if seconds is not None else found is None


@pytest.mark.parametrize("date", ["2026-11-24T03:07:28.abcZ", "2026-11-24T03:07:28.5+01:00"])
def test_ls_and_tree_read_odd_dates(tree, capsys, date):
    edit_last_status(step_dir(tree), lambda event: event.update(date=date))
    edit_json(only_manifest(tree), lambda record: record.update(created_date=date))

    for command in (["ls"], ["tree"], ["show", "notes/first"]):
        code, out, err = marin(capsys, *command, "--prefix", tree)
        assert code == 0, (command, out + err)


@pytest.mark.parametrize("duration", [10**400, float("nan"), float("inf"), "12", True])
def test_a_duration_that_is_no_number_of_seconds_is_not_shown(tree, capsys, duration):
    # json.dumps writes NaN/Infinity, as a tampered file may hold them.
    edit_last_status(step_dir(tree), lambda event: event.update(duration_s=duration))

    assert OutputTree(tree).find("notes/first").duration_s is None
    code, out, err = marin(capsys, "ls", "--prefix", tree, "--json")
    assert code == 0, out + err
    (first,) = [step for step in json.loads(out)["steps"] if step["name"] == "notes/first"]
    assert first["duration_s"] is None
    assert marin(capsys, "tree", "--prefix", tree)[0] == 0


@pytest.mark.parametrize("stamp", [10**400, 1e300, -1e18, -1, 253402300800])
def test_a_lease_time_no_clock_can_show_is_unreadable(tree, capsys, stamp):
    path = step_dir(tree)
    store = open_store(tree)
    append_status(store, path, Status.RUNNING, worker="someone")
    with open(os.path.join(path, LEASE_FILE), "w") as handle:
        json.dump({"timestamp": stamp, "worker_id": "host:1:x"}, handle)

    assert read_lease(store, path) is None  # as if there were none: taken over
    for command in (["show", "notes/first"], ["gc"], ["ls"]):
        code, out, err = marin(capsys, *command, "--prefix", tree)
        assert code == 0, (command, out + err)
    plan = Executor(tree, lease_config=FAST_LEASES, console=False).run(
        sample_tree.note_steps("hi"), dry_run=True
    )
    assert [row.name for row in plan.rows if row.action.value == "run"] == ["notes/first"]


def test_a_lease_dated_far_in_the_future_is_stale_and_the_step_runs(tree):
    """A heartbeat more than a day ahead is no live driver's: otherwise it blocked the step for good."""
    now = time.time()
    held = LeaseRecord(worker="w", heartbeat=now + 3600)  # a clock an hour fast: still believed
    assert not lease_is_stale(held, 10.0, now=now)
    assert not lease_is_stale(LeaseRecord(worker="w", heartbeat=now + MAX_CLOCK_AHEAD_S), 10.0, now=now)
    assert lease_is_stale(LeaseRecord(worker="w", heartbeat=now + MAX_CLOCK_AHEAD_S + 1), 10.0, now=now)

    path = step_dir(tree)
    append_status(open_store(tree), path, Status.RUNNING, worker="someone")
    with open(os.path.join(path, LEASE_FILE), "w") as handle:
        json.dump({"timestamp": now + 30 * 86400, "worker_id": "host:1:x"}, handle)
    started = time.monotonic()
    Executor(tree, lease_config=FAST_LEASES, console=False).run(sample_tree.note_steps("hi"))
    assert time.monotonic() - started < 60
    assert OutputTree(tree).find("notes/first").status == "SUCCESS"


def test_a_lease_dated_an_hour_ahead_that_never_changes_is_taken_over_after_the_timeout(tree, caplog):
    """Found by a red-team pass (twenty-second session): a lease dated within a day ahead is
    believed, and one that no driver refreshes blocked its step until that date. A live holder
    rewrites its lease every heartbeat interval: bytes unchanged for the timeout, by the
    waiting driver's own clock, are a dead holder's (or a paused one's, which the protocol
    already lets others take over)."""
    import logging

    path = step_dir(tree)
    append_status(open_store(tree), path, Status.RUNNING, worker="someone")
    with open(os.path.join(path, LEASE_FILE), "w") as handle:
        json.dump({"timestamp": time.time() + 3600, "worker_id": "evil:1:x"}, handle)
    plan = Executor(tree, lease_config=FAST_LEASES, console=False).run(
        sample_tree.note_steps("hi"), dry_run=True
    )
    (row,) = [row for row in plan.rows if row.name == "notes/first"]
    assert (
        row.action.value == "wait" and "(dated ahead of this machine's clock: taken over if it" in row.reason
    )
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="executor.lease"):
        Executor(tree, lease_config=FAST_LEASES, console=False).run(sample_tree.note_steps("hi"))
    waited = time.monotonic() - started
    assert OutputTree(tree).find("notes/first").status == "SUCCESS"
    assert waited >= FAST_LEASES.timeout  # not at once: the holder might have been alive
    assert waited < 3600
    (message,) = [m for m in caplog.messages if "took over the lease" in m]
    assert "from evil:1:x: unchanged for more than" in message and "its heartbeat is dated" in message


def test_a_lease_whose_bytes_keep_changing_is_never_taken_over_by_observation(tmp_path, monkeypatch):
    """The rule keys on unchanged bytes: a holder that heartbeats keeps its lease however long.
    Deterministic: the lease module's clocks are the test's."""
    import types

    import executor.lease
    from executor.lease import LeaseConfig, LeaseManager

    clock = {"monotonic": 1000.0, "wall": time.time()}
    monkeypatch.setattr(
        executor.lease,
        "time",
        types.SimpleNamespace(
            monotonic=lambda: clock["monotonic"],
            time=lambda: clock["wall"],
            strftime=time.strftime,
            gmtime=time.gmtime,
        ),
    )
    store = open_store(str(tmp_path))
    output = str(tmp_path / "step-0123abcd")
    os.makedirs(output)
    waiter = LeaseManager(
        store, LeaseConfig(heartbeat_interval=10, timeout=60, heartbeat_process=False), "waiter"
    )

    def holder_writes(beat: int) -> None:  # dated an hour ahead of the waiter's clock
        with open(os.path.join(output, LEASE_FILE), "w") as handle:
            json.dump({"timestamp": clock["wall"] + 3600 + beat, "worker_id": "live:1:x"}, handle)

    for beat in range(30):  # five timeouts' worth of heartbeats: never taken
        holder_writes(beat)
        assert not waiter.try_acquire(output).acquired
        clock["monotonic"] += 10
        clock["wall"] += 10
    clock["monotonic"] += 40  # the holder stops: 50 s since the waiter saw these bytes appear
    assert not waiter.try_acquire(output).acquired
    clock["monotonic"] += 11  # 61 s unchanged
    assert waiter.try_acquire(output).acquired
    assert waiter.holds(output)


def test_diff_reads_a_version_whose_config_is_not_an_object(tree, capsys):
    edit_json(
        info_path(step_dir(tree)),
        lambda record: record.update(version={"config": [1], "dependencies": "x"}),
    )

    code, out, err = marin(capsys, "diff", "notes/second", "notes/first", "--prefix", tree)

    assert code == 0, out + err


# -- reproduce: a rebuilt step that fails ------------------------------------------------------
def test_reproduce_says_in_one_line_that_a_rebuilt_step_failed(tree, tmp_path, capsys):
    # A project function that fails on this config: accepted by the checks (it is the
    # project's), so the rebuild runs it and it fails.
    edit_json(info_path(step_dir(tree)), lambda record: record.update(fn_name="marin.cli:main"))
    into = str(tmp_path / "again")

    code, out, err = marin(
        capsys, "reproduce", "notes/first", "--prefix", tree, "--into", into, "--allow-code-changes"
    )

    assert code == 3, out + err
    # The step's own traceback is shown as a run shows it (and kept in its log); marin's is not.
    assert "cmd_reproduce" not in err and "ExecutorRunError" not in err, err
    summary = err[err.index("marin reproduce: the rebuild into") :].splitlines()
    assert summary[0].endswith("failed, so nothing was compared:"), err
    assert summary[1].startswith("  - notes/first: TypeError: ") and "(log: " in summary[1], err
    assert len(summary) == 2, err
    assert "result:" not in out


# -- the terminal ------------------------------------------------------------------------------
def test_printable_escapes_controls_and_keeps_line_breaks():
    assert printable("a\x1b[2Jb\tc\nd\x07\x9b\x7f") == "a\\x1b[2Jb\tc\nd\\x07\\x9b\\x7f"
    assert printable("10%\r20%\r\n") == "10%\n20%\n"
    assert one_line("x\nSUCCESS  fake\r\t\x1b") == "x\\nSUCCESS  fake\\r\\t\\x1b"
    assert printable("plain text, ünïcode ✓") == "plain text, ünïcode ✓"


def test_safe_stream_writes_escaped_text_and_passes_the_rest_through(tmp_path):
    with open(tmp_path / "out.txt", "w") as handle:
        stream = SafeStream(handle)
        assert stream.write("\x1b]52;c;ZWNobw==\x07ok\n") == len("\x1b]52;c;ZWNobw==\x07ok\n")
        stream.flush()
        assert stream.fileno() == handle.fileno()
    assert (tmp_path / "out.txt").read_text() == "\\x1b]52;c;ZWNobw==\\x07ok\n"


def test_no_command_sends_a_control_sequence_from_the_tree(tree, capsys):
    path = step_dir(tree)
    evil = "\x1b]0;TITLE\x07\x1b[2J"
    edit_json(info_path(path), lambda record: record.update(description=f"desc {evil}", fn_name=f"{evil}x:y"))
    edit_last_status(path, lambda event: event.update(message=f"boom {evil}", worker=f"w{evil}"))
    with open(os.path.join(path, ".executor_log"), "w") as handle:
        handle.write(f"line one\n\x1b]52;c;ZWNobw==\x07 clipboard\n{evil}\n")
    fake = os.path.join(tree, "notes", f"x{evil}\nSUCCESS  fake-11111111")
    os.makedirs(fake)
    with open(os.path.join(fake, STATUS_FILE), "w") as handle:
        handle.write(
            json.dumps({"date": "2026-11-24T03:07:28.570Z", "status": "FAILED", "message": evil}) + "\n"
        )

    seen = ""
    for command in (["ls"], ["show", "notes/first"], ["tree"], ["gc"], ["why", "notes/first"]):
        code, out, err = marin(capsys, *command, "--prefix", tree)
        assert code in (0, 2), (command, out + err)
        assert "\x1b" not in out + err and "\x07" not in out + err, (command, out + err)
        seen += out + err
    assert "\\x1b]0;TITLE\\x07" in seen  # shown, escaped
    assert "\\x1b]52;c;ZWNobw==\\x07 clipboard" in seen
    # the newline in the directory name does not start a row of its own
    assert not any(line.startswith("SUCCESS  fake-11111111") for line in seen.splitlines()), seen
    assert "\\nSUCCESS  fake-11111111" in seen


def test_names_that_are_not_utf8_or_hold_line_breaks_are_escaped_in_show(tree, capsys):
    path = step_dir(tree)
    with open(os.fsencode(os.path.join(path, "f")) + b"\x1b[31m\x9b\r\nname", "w") as handle:
        handle.write("x")
    edit_last_status(path, lambda event: event.update(worker="w\rFAKE  SUCCESS", message="a\nb"))
    fake = os.path.join(tree, "notes", "x\nSUCCESS  fake-11111111")
    os.makedirs(fake)
    with open(os.path.join(fake, STATUS_FILE), "w") as handle:
        handle.write(json.dumps({"date": "2026-11-24T03:07:28.570Z", "status": "FAILED"}) + "\n")

    code, out, err = marin(capsys, "show", "notes/first", "--prefix", tree)
    assert code == 0, err
    assert "\udc9b" not in out and "\x9b" not in out and "\x1b" not in out
    assert "f\\x1b[31m\\x9b\\r\\nname" in out  # the file, on one line
    assert "w\\rFAKE  SUCCESS a\\nb" in out  # the status event, on one line
    assert not any(line.startswith(("name", "FAKE", "b")) for line in out.splitlines()), out

    code, out, err = marin(capsys, "show", "SUCCESS", "--prefix", tree)  # no such step: suggestions
    assert code == 2
    assert "x\\nSUCCESS  fake-11111111" in err and not any(
        line.startswith("SUCCESS  fake") for line in err.splitlines()
    ), err


def test_a_strict_utf8_console_gets_escapes_not_a_traceback(tmp_path):
    """Under PYTHONIOENCODING=utf-8:strict (a real UTF-8 locale) a surrogate escape could not be
    printed at all."""
    import subprocess
    import sys

    prefix = str(tmp_path / "tree")
    Executor(prefix, lease_config=FAST_LEASES, console=False).run(sample_tree.note_steps("hi")[:1])
    path = step_dir(prefix)
    with open(os.fsencode(os.path.join(path, "bad")) + b"\xff\x9b", "w") as handle:
        handle.write("x")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run(
        [sys.executable, "-m", "marin.cli", "show", "notes/first", "--prefix", prefix],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict", "PYTHONPATH": root},
        cwd=root,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert b"bad\\xff\\x9b" in done.stdout


@pytest.mark.parametrize("kind", ["socket", "loop"])
@pytest.mark.parametrize("name", [".executor_info", ".executor_status", LEASE_FILE])
def test_a_bookkeeping_file_that_cannot_be_opened_is_not_read(tree, capsys, monkeypatch, kind, name):
    """A socket (ENXIO) or a link loop (ELOOP) in one file's place took down every reader."""
    import socket

    target = os.path.join(step_dir(tree), name)
    if os.path.lexists(target):
        os.remove(target)
    if kind == "socket":
        listener = socket.socket(socket.AF_UNIX)
        monkeypatch.chdir(step_dir(tree))  # a socket's path is limited to 107 bytes
        listener.bind(name)
        monkeypatch.undo()
    else:
        os.symlink(target, target)
    try:
        for command in (["ls"], ["ls", "--json"], ["show", "notes/first"], ["gc"], ["tree"]):
            code, out, err = marin(capsys, *command, "--prefix", tree)
            assert code == 0, (command, out + err)
            assert "Traceback" not in out + err
    finally:
        if kind == "socket":
            listener.close()
