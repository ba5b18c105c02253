"""The store, pinned where mutation testing found no test: file modes, large and odd reads,
listings (trailing slashes, files, dangling links, object-store dates), appends to files
without a final newline, compare-and-swap in a missing directory, cleanup after failed
writes, the probe and error messages, and prefix normalisation.

Local disk and memory:// where both apply; a small fsspec filesystem stands in for an
object store where only its listing format matters.
"""

from __future__ import annotations

import datetime
import os
import stat
import time
import uuid

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from executor.store import (
    FileInfo,
    LocalStore,
    MemoryStore,
    Store,
    StoreError,
    is_local,
    normalize_prefix,
    open_store,
)


@pytest.fixture(params=["local", "memory"])
def store_and_root(request, tmp_path):
    if request.param == "local":
        root = str(tmp_path / "prefix")
    else:
        root = f"memory://mutants-{uuid.uuid4().hex}"
    return open_store(root), root


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- opening and naming -----------------------------------------------------------------


def test_open_store_picks_the_backend_by_prefix(tmp_path):
    local = open_store(str(tmp_path))
    assert type(local) is LocalStore and local.protocol == "file"
    assert type(open_store(f"file://{tmp_path}")) is LocalStore
    memory = open_store("memory://bucket/x")
    assert type(memory) is MemoryStore and memory.protocol == "memory"


def test_an_unknown_protocol_names_the_prefix_and_the_backend_to_install():
    with pytest.raises(StoreError) as raised:
        open_store("nosuchproto://bucket/x")
    message = str(raised.value)
    assert message.startswith("no filesystem for 'nosuchproto://bucket/x': ")
    assert message.endswith(
        ". Install the fsspec backend for nosuchproto:// (s3fs for s3://, gcsfs for gs://)"
    )
    assert isinstance(raised.value.__cause__, (ImportError, ValueError))


def test_only_the_local_store_has_local_paths():
    store = open_store("file:///")
    assert store.local_path("file:///x") == "/x"
    other = open_store("memory://y")
    assert other.local_path("memory://y/z") is None


def test_is_local_knows_paths_and_file_urls():
    assert is_local("/data/x") and is_local("relative/x") and is_local("file:///data")
    assert not is_local("memory://x") and not is_local("s3://bucket/x")


def test_normalize_prefix_makes_local_prefixes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert normalize_prefix("~/runs/") == str(tmp_path / "home" / "runs")
    assert normalize_prefix("file://out/") == str(tmp_path / "out")
    assert normalize_prefix("/") == "/"
    assert normalize_prefix("file:///") == "/"
    assert normalize_prefix("s3://bucket/p//") == "s3://bucket/p"


def test_local_store_paths_accept_file_urls(tmp_path):
    store = LocalStore()
    store.write_atomic(f"file://{tmp_path}/a/f", b"x")
    assert (tmp_path / "a" / "f").read_bytes() == b"x"
    assert store.read_bytes(f"file://{tmp_path}/a/f") == b"x"
    assert store.exists(f"file://{tmp_path}/a/f") and not store.exists(f"file://{tmp_path}/a/g")
    assert store.local_path(f"file://{tmp_path}/a/f") == f"{tmp_path}/a/f"
    assert store.fs_path(str(tmp_path)) == str(tmp_path)
    assert [info.name for info in store.list_dir(f"file://{tmp_path}/a")] == ["f"]


def test_the_local_store_offers_fsspecs_local_filesystem_once(tmp_path):
    store = LocalStore()
    (tmp_path / "f").write_bytes(b"abc")
    assert store.fs is store.fs
    assert "file" in store.fs.protocol
    assert store.fs.cat_file(str(tmp_path / "f")) == b"abc"


# -- reads --------------------------------------------------------------------------------


def test_a_file_larger_than_one_read_comes_back_whole(store_and_root):
    store, root = store_and_root
    data = os.urandom(200_000)  # several 64 KiB reads on local disk
    store.write_atomic(f"{root}/big", data)
    assert store.read_bytes(f"{root}/big") == data


def test_an_empty_file_reads_as_empty_not_missing(store_and_root):
    store, root = store_and_root
    store.write_atomic(f"{root}/empty", b"")
    assert store.read_bytes(f"{root}/empty") == b""
    assert store.read_text(f"{root}/empty") == ""


def test_reading_a_directory_or_a_path_under_a_file_is_none(store_and_root):
    store, root = store_and_root
    store.write_atomic(f"{root}/d/f", b"x")
    assert store.read_bytes(f"{root}/d") is None
    assert store.read_bytes(f"{root}/d/f/below") is None
    assert store.read_text(f"{root}/d") is None


def test_read_text_decodes_utf8(store_and_root):
    store, root = store_and_root
    store.write_atomic(f"{root}/t", "naïve – ünïcode".encode())
    assert store.read_text(f"{root}/t") == "naïve – ünïcode"


# -- listings -------------------------------------------------------------------------------


def test_list_dir_is_sorted_and_keeps_the_callers_spelling_without_a_trailing_slash(store_and_root):
    store, root = store_and_root
    for name in ("b", "c", "a"):
        store.write_atomic(f"{root}/d/{name}", name * 3)
    listing = store.list_dir(f"{root}/d/")
    assert [info.name for info in listing] == ["a", "b", "c"]
    assert [info.path for info in listing] == [f"{root}/d/a", f"{root}/d/b", f"{root}/d/c"]
    assert all(info.size == 3 and not info.is_dir for info in listing)


def test_list_dir_gives_each_entry_a_modification_time(store_and_root):
    store, root = store_and_root
    before = time.time()
    store.write_atomic(f"{root}/d/f", b"x")
    (info,) = store.list_dir(f"{root}/d")
    assert isinstance(info.mtime, float)
    assert before - 5 <= info.mtime <= time.time() + 5


def test_listing_a_file_or_a_missing_path_is_empty(store_and_root):
    store, root = store_and_root
    store.write_atomic(f"{root}/d/f", b"x")
    assert store.list_dir(f"{root}/d/f") == []
    assert store.list_dir(f"{root}/nothing/here") == []


def test_a_directory_lists_as_a_directory(store_and_root):
    store, root = store_and_root
    store.write_atomic(f"{root}/d/sub/f", b"12")
    (info,) = store.list_dir(f"{root}/d")
    assert info == FileInfo(path=f"{root}/d/sub", name="sub", is_dir=True, size=info.size, mtime=info.mtime)


def test_local_listing_follows_links_and_keeps_dangling_ones(tmp_path):
    store = LocalStore()
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_bytes(b"12345")
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    entries = {info.name: info for info in store.list_dir(str(tmp_path))}
    assert set(entries) == {"real", "link", "dangling"}
    assert entries["link"].is_dir and entries["real"].is_dir
    assert not entries["dangling"].is_dir
    assert entries["dangling"].path == f"{tmp_path}/dangling"
    assert entries["dangling"].mtime == os.lstat(tmp_path / "dangling").st_mtime
    (tmp_path / "real" / "g").symlink_to(tmp_path / "real" / "f")
    (g,) = [info for info in store.list_dir(str(tmp_path / "real")) if info.name == "g"]
    assert g.size == 5  # the size of the file the link points to


class _ObjectStoreLikeFS(MemoryFileSystem):
    """A memory filesystem whose listing reports times as object stores do (datetime `LastModified`)."""

    protocol = ("objlike",)
    store: dict = {}
    pseudo_dirs = [""]

    def ls(self, path, detail=True, **kwargs):
        # Object stores may list a directory's own marker object ("d/") among its children.
        out = [{"name": self._strip_protocol(path).rstrip("/") + "/", "type": "directory", "size": 0}]
        for entry in super().ls(path, detail=True, **kwargs):
            entry = dict(entry)
            created = entry.pop("created", None)
            if entry["type"] == "file":
                entry["LastModified"] = datetime.datetime.fromtimestamp(created, tz=datetime.UTC)
            out.append(entry)
        return out


def test_an_object_store_listing_turns_datetimes_into_timestamps_and_keeps_missing_times_empty():
    fs = _ObjectStoreLikeFS()
    fs.store.clear()
    store = Store(fs, "objlike")
    store.write_atomic("objlike://bucket/d/f", b"abcd")
    store.makedirs("objlike://bucket/d/sub")
    entries = {info.name: info for info in store.list_dir("objlike://bucket/d")}
    assert set(entries) == {"f", "sub"}
    (raw,) = [e for e in MemoryFileSystem.ls(fs, "objlike://bucket/d", detail=True) if e["type"] == "file"]
    assert entries["f"].mtime == pytest.approx(raw["created"])
    assert isinstance(entries["f"].mtime, float)
    assert entries["f"].size == 4 and not entries["f"].is_dir
    assert entries["sub"].mtime is None and entries["sub"].is_dir and entries["sub"].size == 0


# -- writes -------------------------------------------------------------------------------


def test_local_files_are_created_readable_by_all_as_open_would(tmp_path):
    store = LocalStore()
    expected = 0o666 & ~umask()
    # In a new directory (created on the first miss) and in an existing one.
    store.write_atomic(str(tmp_path / "a" / "written"), b"x")
    store.write_atomic(str(tmp_path / "written"), b"x")
    store.append_line(str(tmp_path / "b" / "appended"), b"x")
    store.append_line(str(tmp_path / "appended"), b"x")
    store.compare_and_swap(str(tmp_path / "c" / "swapped"), None, b"x")
    store.compare_and_swap(str(tmp_path / "swapped"), None, b"x")
    for name in ("a/written", "written", "b/appended", "appended", "c/swapped", "swapped"):
        assert mode(str(tmp_path / name)) == expected, name


def test_write_atomic_accepts_text_and_bytes(store_and_root):
    store, root = store_and_root
    store.write_atomic(f"{root}/t", "é")
    store.write_atomic(f"{root}/b", b"\xff\x00")
    assert store.read_bytes(f"{root}/t") == "é".encode()
    assert store.read_bytes(f"{root}/b") == b"\xff\x00"


def test_a_failed_local_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    store = LocalStore()
    (tmp_path / "target").mkdir()  # os.replace onto a non-empty directory fails
    (tmp_path / "target" / "keep").write_bytes(b"old")
    with pytest.raises(OSError):
        store.write_atomic(str(tmp_path / "target"), b"new")
    assert sorted(os.listdir(tmp_path)) == ["target"]
    assert (tmp_path / "target" / "keep").read_bytes() == b"old"


def test_makedirs_creates_nested_directories_and_tolerates_existing_ones(store_and_root):
    store, root = store_and_root
    store.makedirs(f"{root}/x/y/z")
    store.makedirs(f"{root}/x/y/z")
    store.write_atomic(f"{root}/x/y/z/f", b"1")
    assert [info.name for info in store.list_dir(f"{root}/x/y")] == ["z"]


# -- appends --------------------------------------------------------------------------------


def test_append_line_creates_the_file_and_its_parents_and_adds_newlines(store_and_root):
    store, root = store_and_root
    store.append_line(f"{root}/new/dir/log", "one")
    store.append_line(f"{root}/new/dir/log", b"two")
    assert store.read_bytes(f"{root}/new/dir/log") == b"one\ntwo\n"


def test_append_line_to_a_file_without_a_final_newline_starts_a_new_line(store_and_root):
    # A status file from elsewhere (Marin's one-word format) has no final newline: the new
    # line must not be glued to the old word.
    store, root = store_and_root
    store.write_atomic(f"{root}/status", b"SUCCESS")
    store.append_line(f"{root}/status", "RUNNING")
    assert store.read_bytes(f"{root}/status") == b"SUCCESS\nRUNNING\n"


def test_append_line_to_an_empty_file_adds_no_blank_line(store_and_root):
    store, root = store_and_root
    store.write_atomic(f"{root}/status", b"")
    store.append_line(f"{root}/status", "x")
    assert store.read_bytes(f"{root}/status") == b"x\n"


def test_append_line_after_a_complete_line_adds_no_blank_line(store_and_root):
    store, root = store_and_root
    store.write_atomic(f"{root}/status", b"a\n")
    store.append_line(f"{root}/status", "b")
    assert store.read_bytes(f"{root}/status") == b"a\nb\n"


def test_a_failed_local_append_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    store = LocalStore()
    path = tmp_path / "status"
    path.write_bytes(b"first\n")
    real_write = os.write

    def failing_write(fd, data):
        real_write(fd, bytes(data)[:3])  # part of the line reaches the file, then the disk fills
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(OSError, match="No space left"):
        store.append_line(str(path), "second")
    monkeypatch.undo()
    assert path.read_bytes() == b"first\n"


def test_a_short_local_append_is_cut_off_and_reported(tmp_path, monkeypatch):
    store = LocalStore()
    path = tmp_path / "status"
    path.write_bytes(b"first\n")
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data)[:2]))
    with pytest.raises(OSError) as raised:
        store.append_line(str(path), "second")
    monkeypatch.undo()
    assert str(raised.value) == f"short write appending to {path}: 2 of 7 bytes"
    assert path.read_bytes() == b"first\n"


def test_a_local_write_finishes_after_short_writes(tmp_path, monkeypatch):
    # os.write may write less than asked: the rest must follow, in order.
    store = LocalStore()
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data)[:3]))
    store.write_atomic(str(tmp_path / "f"), b"0123456789")
    store.compare_and_swap(str(tmp_path / "g"), None, b"abcdefgh")
    monkeypatch.undo()
    assert (tmp_path / "f").read_bytes() == b"0123456789"
    assert (tmp_path / "g").read_bytes() == b"abcdefgh"


# -- deletes ---------------------------------------------------------------------------------


def test_delete_tree_of_a_file_or_a_missing_path(store_and_root):
    store, root = store_and_root
    store.write_atomic(f"{root}/f", b"x")
    store.delete_tree(f"{root}/f")
    assert store.read_bytes(f"{root}/f") is None
    store.delete_tree(f"{root}/missing")
    store.delete(f"{root}/missing")


def test_delete_tree_of_a_link_removes_the_link_not_what_it_points_to(tmp_path):
    store = LocalStore()
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_bytes(b"keep")
    os.symlink(tmp_path / "real", tmp_path / "link")
    store.delete_tree(str(tmp_path / "link"))
    assert not os.path.lexists(tmp_path / "link")
    assert (tmp_path / "real" / "f").read_bytes() == b"keep"


def test_delete_tree_removes_nested_directories(store_and_root):
    store, root = store_and_root
    store.write_atomic(f"{root}/t/a/b/f", b"x")
    store.write_atomic(f"{root}/t/g", b"y")
    store.write_atomic(f"{root}/keep", b"z")
    store.delete_tree(f"{root}/t")
    assert store.list_dir(f"{root}/t") == []
    assert [info.name for info in store.list_dir(root)] == ["keep"]


# -- compare-and-swap --------------------------------------------------------------------------


def test_compare_and_swap_creates_a_file_in_a_missing_directory(store_and_root):
    store, root = store_and_root
    assert store.compare_and_swap(f"{root}/new/dir/lock", None, "mine")
    assert store.read_bytes(f"{root}/new/dir/lock") == b"mine"
    assert not store.compare_and_swap(f"{root}/new/dir/lock", None, "theirs")
    assert store.read_bytes(f"{root}/new/dir/lock") == b"mine"


def test_compare_and_swap_on_a_missing_file_in_a_missing_directory_with_an_expectation_fails(store_and_root):
    store, root = store_and_root
    assert not store.compare_and_swap(f"{root}/none/lock", b"old", b"new")
    assert store.read_bytes(f"{root}/none/lock") is None
    assert not store.compare_and_swap(f"{root}/none/lock2", "old", None)


def test_compare_and_swap_compares_text_and_bytes_alike(store_and_root):
    store, root = store_and_root
    store.write_atomic(f"{root}/lock", "é")
    assert store.compare_and_swap(f"{root}/lock", "é", "ü")
    assert store.compare_and_swap(f"{root}/lock", "ü".encode(), b"v")
    assert not store.compare_and_swap(f"{root}/lock", "ü", "w")
    assert store.read_bytes(f"{root}/lock") == b"v"


def test_compare_and_swap_from_absent_to_absent(store_and_root):
    store, root = store_and_root
    assert store.compare_and_swap(f"{root}/lock", None, None)
    assert store.read_bytes(f"{root}/lock") is None
    store.write_atomic(f"{root}/lock", b"x")
    assert not store.compare_and_swap(f"{root}/lock", None, None)
    assert store.read_bytes(f"{root}/lock") == b"x"


def test_compare_and_swap_deletes_only_the_expected_content(store_and_root):
    store, root = store_and_root
    store.write_atomic(f"{root}/lock", b"theirs")
    assert not store.compare_and_swap(f"{root}/lock", b"mine", None)
    assert store.read_bytes(f"{root}/lock") == b"theirs"
    assert store.compare_and_swap(f"{root}/lock", b"theirs", None)
    assert not store.exists(f"{root}/lock")


def test_a_failed_local_create_leaves_no_file(tmp_path, monkeypatch):
    store = LocalStore()

    def failing_write(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(OSError):
        store.compare_and_swap(str(tmp_path / "lock"), None, b"mine")
    monkeypatch.undo()
    assert not os.path.exists(tmp_path / "lock")
    assert store.compare_and_swap(str(tmp_path / "lock"), None, b"mine")  # and the lock is free again


# -- prefix checks ---------------------------------------------------------------------------


def test_check_writable_leaves_no_probe_and_creates_the_prefix(store_and_root):
    store, root = store_and_root
    store.check_writable(f"{root}/fresh/")
    assert store.list_dir(f"{root}/fresh") == []


def test_check_writable_names_the_prefix_the_error_and_what_to_check(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError) as raised:
        LocalStore().check_writable(str(tmp_path / "file" / "out"))
    message = str(raised.value)
    assert message.startswith(f"cannot write to the prefix {tmp_path}/file/out: NotADirectoryError: ")
    assert message.endswith(
        ". Check that it exists or can be created, that you have write access, and that any credentials are set"
    )
    assert isinstance(raised.value.__cause__, NotADirectoryError)


def test_check_writable_removes_its_probe_on_success_only(tmp_path, monkeypatch):
    store = LocalStore()
    written = []
    real_write = store.write_atomic

    def recording_write(path, data):
        written.append(path)
        real_write(path, data)

    monkeypatch.setattr(store, "write_atomic", recording_write)
    store.check_writable(str(tmp_path) + "/")
    (probe,) = written
    assert (
        probe.startswith(f"{tmp_path}/.write-probe-") and len(probe) == len(f"{tmp_path}/.write-probe-") + 32
    )
    assert os.listdir(tmp_path) == []


def test_check_readable_accepts_a_missing_prefix(store_and_root):
    store, root = store_and_root
    store.check_readable(f"{root}/not/yet")


def test_check_readable_names_the_prefix_and_the_error(tmp_path, monkeypatch):
    store = LocalStore()

    def failing_list(path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(store, "list_dir", failing_list)
    with pytest.raises(StoreError) as raised:
        store.check_readable(str(tmp_path))
    assert (
        str(raised.value)
        == f"cannot read the prefix {tmp_path}: PermissionError: [Errno 13] Permission denied"
    )
    assert isinstance(raised.value.__cause__, PermissionError)


def test_names_ending_in_any_character_are_listed_and_normalised_intact(store_and_root):
    # Only slashes are trimmed (a set of characters wrongly given to rstrip would eat more).
    store, root = store_and_root
    store.write_atomic(f"{root}/d/fileX", b"x")
    assert [info.name for info in store.list_dir(f"{root}/d")] == ["fileX"]
    assert normalize_prefix("s3://bucket/runX/") == "s3://bucket/runX"
