"""operations/download: local trees and globs, resuming, http, s3 (SeaweedFS) and hf:// (a
fake Hub on 127.0.0.1), against real servers the tests start."""

import hashlib
import http.server
import json
import os
import sysconfig
import threading
import time

import pytest

from operations.download import DownloadConfig, DownloadError, _glob_regex, download
from tests.operations.servers import closed_port_url, serve_fake_hub, serve_http

# The S3 fixtures, visible to the tests of this module.


def make_tree(root, files: dict[str, bytes]) -> str:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(root)


def manifest(output) -> dict:
    return json.loads((output / "manifest.json").read_text())


def stats(output) -> dict:
    return json.loads((output / "stats.json").read_text())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


TREE = {
    "a.txt": b"alpha\n",
    "b.py": b"print('b')\n",
    "sub/c.py": b"c = 3\n",
    "sub/d.txt": b"delta\n",
    "sub/deep/f.py": b"f = 6\n",
    "skip/e.py": b"e = 5\n",
}


# -- local sources ---------------------------------------------------------------------------


def test_local_tree_is_filtered_by_include_exclude_and_max_files(tmp_path):
    source = make_tree(tmp_path / "src", TREE)
    out = tmp_path / "out"
    download(
        DownloadConfig(
            source=source, output_path=str(out), include=("**/*.py",), exclude=("skip/**",), max_files=2
        )
    )
    # Sorted order: b.py, sub/c.py, sub/deep/f.py -> the first two.
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "b.py",
        "manifest.json",
        "stats.json",
        "sub/c.py",
    ]
    assert (out / "sub/c.py").read_bytes() == TREE["sub/c.py"]
    assert stats(out) == {
        "files": 2,
        "bytes": len(TREE["b.py"]) + len(TREE["sub/c.py"]),
        "files_copied": 2,
        "bytes_copied": len(TREE["b.py"]) + len(TREE["sub/c.py"]),
        "files_already_complete": 0,
        "files_excluded": 2,  # a.txt, sub/d.txt
        "files_over_max_files": 1,  # sub/deep/f.py
        "directories_excluded": 1,  # skip/, never listed
    }


def test_manifest_lists_path_size_and_sha256_sorted_by_path(tmp_path):
    source = make_tree(tmp_path / "src", TREE)
    out = tmp_path / "out"
    download(DownloadConfig(source=source, output_path=str(out)))
    assert manifest(out) == {
        "source": source,
        "revision": None,
        "files": [{"path": rel, "size": len(TREE[rel]), "sha256": sha256(TREE[rel])} for rel in sorted(TREE)],
    }
    for rel, data in TREE.items():
        assert (out / rel).read_bytes() == data


def test_single_file_source_lands_under_its_base_name(tmp_path):
    make_tree(tmp_path / "src", TREE)
    out = tmp_path / "out"
    download(DownloadConfig(source=str(tmp_path / "src/sub/c.py"), output_path=str(out)))
    assert (out / "c.py").read_bytes() == TREE["sub/c.py"]
    assert [entry["path"] for entry in manifest(out)["files"]] == ["c.py"]


def test_glob_source_copies_matches_relative_to_its_fixed_part(tmp_path):
    make_tree(tmp_path / "src", TREE)
    out = tmp_path / "out"
    download(DownloadConfig(source=f"file://{tmp_path}/src/sub/*.py", output_path=str(out)))
    assert [entry["path"] for entry in manifest(out)["files"]] == ["c.py"]  # * stays in sub/
    download(DownloadConfig(source=str(tmp_path / "src/**/*.py"), output_path=str(tmp_path / "all")))
    assert [entry["path"] for entry in manifest(tmp_path / "all")["files"]] == [
        "b.py",
        "skip/e.py",
        "sub/c.py",
        "sub/deep/f.py",
    ]


def test_identical_sources_give_byte_identical_manifests(tmp_path):
    source = make_tree(tmp_path / "src", TREE)
    for name, workers in (("one", 1), ("many", 8)):
        download(DownloadConfig(source=source, output_path=str(tmp_path / name), workers=workers))
    assert (tmp_path / "one/manifest.json").read_bytes() == (tmp_path / "many/manifest.json").read_bytes()


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("**", ["a", "a/b/c.py"], []),
        ("**/*.py", ["x.py", "a/b/x.py"], ["x.pyc", "a/x.txt"]),
        ("*.py", ["x.py"], ["a/x.py"]),
        ("site-packages/**", ["site-packages/x/y.py"], ["a/site-packages/x.py", "site-packagesx/y"]),
        ("**/__pycache__/**", ["__pycache__/x.pyc", "a/__pycache__/x.pyc"], ["a/__pycache__"]),
        ("data/?.txt", ["data/1.txt"], ["data/12.txt", "data/a/b.txt"]),
        ("[ab]*.txt", ["a1.txt", "b.txt"], ["c.txt"]),
        ("[!ab]*.txt", ["c.txt"], ["a.txt"]),
    ],
)
def test_glob_patterns_span_directories_only_with_double_star(pattern, matches, misses):
    regex = _glob_regex(pattern)
    assert [path for path in matches if regex.fullmatch(path)] == matches
    assert [path for path in misses if regex.fullmatch(path)] == []


def test_the_standard_library_corpus_downloads_quickly(tmp_path):
    stdlib = sysconfig.get_path("stdlib")
    expected = {}
    for directory, dirs, files in os.walk(stdlib):
        rel_dir = os.path.relpath(directory, stdlib)
        if rel_dir == "site-packages":
            dirs.clear()
            continue
        for name in files:
            if name.endswith(".py"):
                expected[os.path.normpath(os.path.join(rel_dir, name)).replace(os.sep, "/")] = None
    out = tmp_path / "stdlib"
    start = time.perf_counter()
    download(
        DownloadConfig(
            source=stdlib, output_path=str(out), include=("**/*.py",), exclude=("site-packages/**",)
        )
    )
    elapsed = time.perf_counter() - start
    assert [entry["path"] for entry in manifest(out)["files"]] == sorted(expected)
    assert stats(out)["files"] == len(expected) > 1000
    assert elapsed < 30, f"downloading the standard library took {elapsed:.1f} s"


# -- resuming --------------------------------------------------------------------------------


def test_rerun_copies_only_missing_or_damaged_files(tmp_path):
    source = make_tree(tmp_path / "src", TREE)
    out = tmp_path / "out"
    config = DownloadConfig(source=source, output_path=str(out))
    download(config)
    untouched_mtime = (out / "sub/deep/f.py").stat().st_mtime_ns
    (out / "a.txt").unlink()  # missing
    (out / "b.py").write_bytes(b"X" * len(TREE["b.py"]))  # same size, other bytes: the checksum catches it
    (out / "sub/c.py").write_bytes(b"c")  # truncated
    download(config)
    assert stats(out)["files_copied"] == 3
    assert stats(out)["files_already_complete"] == len(TREE) - 3
    for rel, data in TREE.items():
        assert (out / rel).read_bytes() == data
    assert (out / "sub/deep/f.py").stat().st_mtime_ns == untouched_mtime


def test_rerun_after_a_crash_midway_keeps_the_files_already_finished(tmp_path):
    files = {f"{letter}.txt": letter.encode() * 100 for letter in "abcdefgh"}
    src = tmp_path / "src"
    make_tree(src, files)
    # A dangling link in the middle makes the first run fail there, as a crash would.
    (src / "d.txt").unlink()
    (src / "d.txt").symlink_to(src / "missing")
    out = tmp_path / "out"
    config = DownloadConfig(source=str(src), output_path=str(out), workers=1)
    with pytest.raises(DownloadError, match=f"cannot download {src}/d.txt: not found"):
        download(config)
    done = sorted(p.name for p in out.iterdir() if p.is_file())
    # Stopped at the first failure; no manifest, no half-written d.txt.
    assert done == ["a.txt", "b.txt", "c.txt"]
    (src / "d.txt").unlink()
    (src / "d.txt").write_bytes(files["d.txt"])
    download(config)
    assert stats(out)["files_already_complete"] == 3
    assert stats(out)["files_copied"] == len(files) - 3
    assert [entry["sha256"] for entry in manifest(out)["files"]] == [
        sha256(files[rel]) for rel in sorted(files)
    ]


class _TruncatingHandler(http.server.BaseHTTPRequestHandler):
    """Promises 1000 bytes and hangs up after 100: a connection that drops mid-file."""

    def log_message(self, format, *args):  # noqa: A002
        pass

    def do_HEAD(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()

    def do_GET(self):  # noqa: N802
        self.do_HEAD()
        self.wfile.write(b"x" * 100)
        self.wfile.flush()
        self.close_connection = True


def test_a_dropped_connection_never_leaves_a_file_that_looks_complete(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TruncatingHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/big.bin"
    try:
        with pytest.raises(DownloadError, match=f"cannot download {url}"):
            download(DownloadConfig(source=url, output_path=str(tmp_path / "out")))
    finally:
        server.shutdown()
        server.server_close()
    leftovers = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert leftovers == []


def test_temporary_files_left_by_a_crash_are_removed(tmp_path):
    source = make_tree(tmp_path / "src", TREE)
    out = tmp_path / "out"
    make_tree(out, {".download-tmp/0123abcd": b"half a file"})
    download(DownloadConfig(source=source, output_path=str(out)))
    assert not (out / ".download-tmp").exists()


# -- bad input -------------------------------------------------------------------------------


def test_revision_is_rejected_for_sources_other_than_hf(tmp_path):
    with pytest.raises(ValueError, match="revision applies to hf:// sources only"):
        download(DownloadConfig(source=str(tmp_path), output_path=str(tmp_path / "o"), revision="v1"))


def test_include_given_as_a_string_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="include must be a tuple of glob patterns"):
        download(DownloadConfig(source=str(tmp_path), output_path=str(tmp_path / "o"), include="*.py"))


def test_nothing_selected_is_an_error_naming_the_patterns(tmp_path):
    source = make_tree(tmp_path / "src", TREE)
    with pytest.raises(ValueError, match=r"6 files found, none selected by include=\('\*\*/\*\.rs',\)"):
        download(DownloadConfig(source=source, output_path=str(tmp_path / "o"), include=("**/*.rs",)))


def test_a_source_file_named_like_the_manifest_must_be_excluded(tmp_path):
    source = make_tree(tmp_path / "src", {"manifest.json": b"{}", "x.txt": b"x"})
    with pytest.raises(ValueError, match=r"overwrite the download's own manifest.json.*exclude"):
        download(DownloadConfig(source=source, output_path=str(tmp_path / "o")))
    download(DownloadConfig(source=source, output_path=str(tmp_path / "o"), exclude=("manifest.json",)))
    assert [entry["path"] for entry in manifest(tmp_path / "o")["files"]] == ["x.txt"]


def test_a_missing_local_path_is_named(tmp_path):
    with pytest.raises(DownloadError, match=f"cannot download {tmp_path}/nope: not found"):
        download(DownloadConfig(source=str(tmp_path / "nope"), output_path=str(tmp_path / "o")))


# -- http --------------------------------------------------------------------------------------


@pytest.fixture
def site(tmp_path):
    """A directory served over http; python's http.server ignores Range requests."""
    root = tmp_path / "site"
    make_tree(root, {"dir/a b.txt": b"spaced", "dir/sub/c.txt": b"nested", "one.txt": b"single"})
    # Larger than a read chunk plus fsspec's read-ahead block, so a ranged reader would
    # need a second Range request, which this server would not honour.
    (root / "big.bin").write_bytes(os.urandom(14 * 1024 * 1024))
    with serve_http(root) as url:
        yield root, url


def test_http_single_file(site, tmp_path):
    root, url = site
    download(DownloadConfig(source=f"{url}/big.bin", output_path=str(tmp_path / "out")))
    assert (tmp_path / "out/big.bin").read_bytes() == (root / "big.bin").read_bytes()
    assert manifest(tmp_path / "out")["files"][0]["sha256"] == sha256((root / "big.bin").read_bytes())


def test_http_directory_index_is_followed_as_a_tree(site, tmp_path):
    _, url = site
    out = tmp_path / "out"
    download(DownloadConfig(source=f"{url}/dir/", output_path=str(out)))
    assert [entry["path"] for entry in manifest(out)["files"]] == ["a b.txt", "sub/c.txt"]
    assert (out / "a b.txt").read_bytes() == b"spaced"
    assert (out / "sub/c.txt").read_bytes() == b"nested"


def test_http_index_page_links_with_queries_are_not_files(tmp_path):
    # An Apache-style index: sort links ("?C=N;O=D") next to the files.
    index = '<a href="?C=N;O=D">Name</a> <a href="?C=S;O=A">Size</a> <a href="x.txt">x.txt</a>'
    make_tree(tmp_path / "site", {"d/index.html": index.encode(), "d/x.txt": b"x"})
    with serve_http(tmp_path / "site") as url:
        download(DownloadConfig(source=f"{url}/d/", output_path=str(tmp_path / "out")))
    assert [entry["path"] for entry in manifest(tmp_path / "out")["files"]] == ["x.txt"]


def test_http_404_is_one_error_naming_the_url(site, tmp_path):
    _, url = site
    with pytest.raises(DownloadError, match=f"cannot download {url}/missing.txt: not found"):
        download(DownloadConfig(source=f"{url}/missing.txt", output_path=str(tmp_path / "out")))


def test_http_closed_port_is_one_error_naming_the_url(tmp_path):
    url = closed_port_url("/data.txt")
    with pytest.raises(DownloadError, match=f"cannot download {url}: cannot connect to the host"):
        download(DownloadConfig(source=url, output_path=str(tmp_path / "out")))


# -- s3 (SeaweedFS on 127.0.0.1) -------------------------------------------------------------


def upload(s3_server, prefix: str, files: dict[str, bytes]) -> None:
    s3_server.filesystem().pipe(
        {f"{prefix.removeprefix('s3://')}/{rel}": data for rel, data in files.items()}
    )


def test_s3_prefix_is_mirrored(s3_server, s3_prefix, tmp_path):
    upload(s3_server, s3_prefix, {f"corpus/{rel}": data for rel, data in TREE.items()})
    upload(s3_server, s3_prefix, {"corpus-other/x.txt": b"not under the prefix"})
    out = tmp_path / "out"
    download(
        DownloadConfig(
            source=f"{s3_prefix}/corpus",
            output_path=str(out),
            exclude=("skip/**",),
            storage_options=s3_server.storage_options,
        )
    )
    expected = sorted(rel for rel in TREE if not rel.startswith("skip/"))
    assert [entry["path"] for entry in manifest(out)["files"]] == expected
    for rel in expected:
        assert (out / rel).read_bytes() == TREE[rel]


def test_s3_bad_credentials_are_one_error_naming_the_url(s3_server, s3_prefix, tmp_path):
    upload(s3_server, s3_prefix, {"corpus/a.txt": b"a"})
    options = {**s3_server.storage_options, "secret": "wrong-secret"}
    with pytest.raises(DownloadError, match=f"cannot download {s3_prefix}/corpus: access denied"):
        download(
            DownloadConfig(
                source=f"{s3_prefix}/corpus", output_path=str(tmp_path / "o"), storage_options=options
            )
        )


def test_output_on_s3_is_written_and_resumed(s3_env, s3_prefix, tmp_path):
    source = make_tree(tmp_path / "src", TREE)
    config = DownloadConfig(source=source, output_path=f"{s3_prefix}/copy")
    download(config)
    fs = s3_env.filesystem()
    root = f"{s3_prefix.removeprefix('s3://')}/copy"
    assert fs.cat(f"{root}/sub/c.py") == TREE["sub/c.py"]
    fs.rm(f"{root}/a.txt")
    download(config)
    written = json.loads(fs.cat(f"{root}/stats.json"))
    assert (written["files_copied"], written["files_already_complete"]) == (1, len(TREE) - 1)
    assert fs.cat(f"{root}/a.txt") == TREE["a.txt"]


# -- hf:// through HfFileSystem, against a fake Hub on 127.0.0.1 -----------------------------

HUB = {
    ("dataset", "org/corpus"): {
        "main": {"data/a.txt": b"main a", "data/sub/b.txt": b"main b", "README.md": b"readme"},
        "v1": {"data/a.txt": b"v1 a", "data/sub/b.txt": b"v1 b", "data/sub/deep/c.txt": b"v1 c"},
    }
}


@pytest.mark.parametrize(
    ("revision", "expected"),
    [
        (None, {"a.txt": b"main a", "sub/b.txt": b"main b"}),
        ("v1", {"a.txt": b"v1 a", "sub/b.txt": b"v1 b", "sub/deep/c.txt": b"v1 c"}),
    ],
)
def test_hf_directory_at_a_revision(revision, expected, tmp_path):
    out = tmp_path / "out"
    with serve_fake_hub(HUB) as endpoint:
        download(
            DownloadConfig(
                source="hf://datasets/org/corpus/data",
                output_path=str(out),
                revision=revision,
                storage_options={"endpoint": endpoint, "token": False},
            )
        )
    assert [entry["path"] for entry in manifest(out)["files"]] == sorted(expected)
    for rel, data in expected.items():
        assert (out / rel).read_bytes() == data


def test_hf_unknown_revision_is_one_error_naming_the_url(tmp_path):
    with serve_fake_hub(HUB) as endpoint, pytest.raises(DownloadError, match="corpus/data: no such revision"):
        download(
            DownloadConfig(
                source="hf://datasets/org/corpus/data",
                output_path=str(tmp_path / "out"),
                revision="v9",
                storage_options={"endpoint": endpoint, "token": False},
            )
        )
