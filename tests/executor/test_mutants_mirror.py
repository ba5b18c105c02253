"""executor/mirror.py called directly: what `ensure_mirrored` returns and logs, its messages
word for word, the sources variable, and the refusal of untrusted listings.

test_mirrored.py runs mirrored paths through whole executor runs (and from S3 and GCS); these
pin the details a whole run does not show.
"""

from __future__ import annotations

import os

import fsspec
import pytest

from executor.graph import Mirror
from executor.mirror import (
    COPY_CHUNK_BYTES,
    GB,
    SOURCES_VARIABLE,
    MirrorError,
    MirrorResult,
    _copy_file,
    _relative,
    ensure_mirrored,
    mirror_sources,
)


def write_tree(root, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def mirror(prefix, relative: str, budget_gb: float = 1.0) -> Mirror:
    return Mirror("data", relative, f"{prefix}/{relative}", budget_gb)


def test_constants():
    assert (SOURCES_VARIABLE, GB, COPY_CHUNK_BYTES) == ("MARIN_MIRROR_SOURCES", 10**9, 8 * 1024 * 1024)


def test_sources_are_read_in_order_trimmed_and_without_empty_entries(monkeypatch):
    assert mirror_sources({SOURCES_VARIABLE: " gs://a/p/ , ,s3://b ,/mnt/c//"}) == (
        "gs://a/p",
        "s3://b",
        "/mnt/c",
    )
    assert mirror_sources({}) == ()
    assert mirror_sources({SOURCES_VARIABLE: ""}) == ()
    monkeypatch.setenv(SOURCES_VARIABLE, "/x,/y")
    assert mirror_sources() == ("/x", "/y")  # the process environment by default


def test_a_directory_is_copied_from_the_first_source_holding_it_with_one_log_line_a_file(tmp_path):
    empty, source, prefix = tmp_path / "empty", tmp_path / "source", tmp_path / "prefix"
    empty.mkdir()
    write_tree(source, {"raw/c/b.txt": "beta", "raw/c/a.txt": "alpha", "raw/c/sub/d.txt": "delta"})
    lines: list[str] = []
    result = ensure_mirrored("s", mirror(prefix, "raw/c"), [str(empty), str(source)], log=lines.append)
    assert result == MirrorResult(f"{prefix}/raw/c", str(source), 3, 14)
    assert lines == [
        "mirror raw/c: 1/3 a.txt (5 bytes)",
        "mirror raw/c: 2/3 b.txt (4 bytes)",
        "mirror raw/c: 3/3 sub/d.txt (5 bytes)",
        f"mirror raw/c: copied 3 file(s), 14 bytes, from {source}",
    ]
    assert (prefix / "raw/c/sub/d.txt").read_text() == "delta"
    assert sorted(os.listdir(prefix / "raw/c")) == ["a.txt", "b.txt", "sub"]  # no temporary files left

    lines.clear()  # complete now: nothing to copy, nothing logged
    again = ensure_mirrored("s", mirror(prefix, "raw/c"), [str(source)], log=lines.append)
    assert again == MirrorResult(f"{prefix}/raw/c", None, 0, 0) and lines == []


def test_a_single_file_is_listed_under_its_own_name(tmp_path):
    source, prefix = tmp_path / "source", tmp_path / "prefix"
    write_tree(source, {"raw/one.txt": "only"})
    lines: list[str] = []
    result = ensure_mirrored("s", mirror(prefix, "raw/one.txt"), [str(source)], log=lines.append)
    assert result == MirrorResult(f"{prefix}/raw/one.txt", str(source), 1, 4)
    assert lines[0] == "mirror raw/one.txt: 1/1 . (4 bytes)"
    assert (prefix / "raw/one.txt").read_text() == "only"


def test_a_file_of_another_size_is_copied_again_and_an_equal_one_is_not(tmp_path):
    source, prefix = tmp_path / "source", tmp_path / "prefix"
    write_tree(source, {"raw/c/a.txt": "alpha", "raw/c/b.txt": "beta"})
    write_tree(prefix, {"raw/c/a.txt": "ALPHA", "raw/c/b.txt": "be"})  # same size (kept), cut short
    result = ensure_mirrored("s", mirror(prefix, "raw/c"), [str(source)], log=lambda line: None)
    assert (result.files_copied, result.bytes_copied) == (1, 4)
    assert (prefix / "raw/c/a.txt").read_text() == "ALPHA" and (prefix / "raw/c/b.txt").read_text() == "beta"


def test_the_budget_is_checked_before_anything_is_copied(tmp_path):
    source, prefix = tmp_path / "source", tmp_path / "prefix"
    write_tree(source, {"raw/big/a.bin": "x" * 600, "raw/big/b.bin": "y" * 400})
    exactly = ensure_mirrored("s", mirror(prefix, "raw/big", budget_gb=1000 / GB), [str(source)], log=print)
    assert exactly.bytes_copied == 1000  # a budget equal to the size is enough
    with pytest.raises(MirrorError) as refused:
        ensure_mirrored("train", mirror(tmp_path / "other", "raw/big", budget_gb=999 / GB), [str(source)])
    assert str(refused.value) == (
        f"step 'train', field 'data': mirrored path 'raw/big': 2 file(s), 0.00 GB, to copy from {source}, "
        "over its budget of 9.99e-07 GB; raise budget_gb in mirrored() or copy it yourself"
    )
    assert not (tmp_path / "other").exists()


def test_without_a_source_a_present_path_is_used_and_a_missing_one_is_refused(tmp_path):
    prefix = tmp_path / "prefix"
    write_tree(prefix, {"raw/here/a.txt": "local"})
    assert ensure_mirrored("s", mirror(prefix, "raw/here"), []) == MirrorResult(
        f"{prefix}/raw/here", None, 0, 0
    )
    with pytest.raises(MirrorError) as unset:
        ensure_mirrored("s", mirror(prefix, "raw/nowhere"), [])
    assert str(unset.value) == (
        f"step 's', field 'data': mirrored path 'raw/nowhere': not under the prefix ({prefix}/raw/nowhere) "
        "and no mirror source holds it (sources: none: $MARIN_MIRROR_SOURCES is not set); set "
        "MARIN_MIRROR_SOURCES to the prefixes (comma-separated) to copy it from, or put it there"
    )
    with pytest.raises(MirrorError) as none_hold:
        ensure_mirrored("s", mirror(prefix, "raw/nowhere"), ["/a", "/b"])
    assert "(sources: /a, /b); set MARIN_MIRROR_SOURCES" in str(none_hold.value)


def test_a_listed_key_that_is_not_a_clean_path_under_the_root_is_refused():
    fs = fsspec.filesystem("memory")
    assert _relative(fs, "/root", "/root/a/b.txt", "here") == "a/b.txt"
    assert _relative(fs, "/root/", "/root/a", "here") == "a"
    for path in ("/root/../etc/passwd", "/root/a//b", "/root/./a", "/elsewhere/a", "/root", "/root/"):
        with pytest.raises(MirrorError) as refused:
            _relative(fs, "/root", path, "here")
        assert str(refused.value) == f"here: listed {path!r}, not a clean path under '/root': refused"


def test_a_copy_that_fails_leaves_no_temporary_file(tmp_path):
    local = fsspec.filesystem("file")

    class Reader:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, size=-1):
            raise OSError("read failed")  # after the temporary destination file was opened

    class Broken:
        def open(self, path, mode):
            return Reader()

    destination = tmp_path / "out" / "f.bin"
    with pytest.raises(OSError, match="read failed"):
        _copy_file(Broken(), "src", local, str(destination))
    assert os.listdir(tmp_path / "out") == []  # the parent was made; nothing else is left


def test_a_copy_to_an_object_store_writes_the_destination_in_one_upload(tmp_path):
    memory = fsspec.filesystem("memory")
    (tmp_path / "f.bin").write_bytes(b"z" * 100)
    _copy_file(fsspec.filesystem("file"), str(tmp_path / "f.bin"), memory, "/mirror-test/f.bin")
    try:
        assert memory.cat_file("/mirror-test/f.bin") == b"z" * 100
        assert memory.ls("/mirror-test", detail=False) == ["/mirror-test/f.bin"]  # no temporary name
    finally:
        memory.rm("/mirror-test", recursive=True)
