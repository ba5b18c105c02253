"""The web browser over raw HTTP: what it refuses, and how it pages files.

The traversal attempts go through http.client, which sends the request target exactly
as written (a browser would normalise `..` and `%2e%2e` before sending). A secret file
sits next to the prefix, with symlinks to it inside the prefix; no response may contain
it.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import pathlib
import re
import socket
import sys
import tracemalloc
import uuid

import fsspec
import pytest

from executor.store import open_store
from marin.web import start_server
from marin.web.files import MAX_LINE_BYTES, TEXT_PAGE_BYTES, read_page
from marin.web.safety import PrefixGuard, Refused


@pytest.fixture(scope="module")
def server(web_server):
    return web_server


def request(server, target: str, method: str = "GET", headers: dict | None = None, body: bytes | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.putrequest(
            method, target, skip_host=bool(headers and "Host" in headers), skip_accept_encoding=True
        )
        for key, value in (headers or {}).items():
            connection.putheader(key, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_start_server_api(web_tree):
    server = start_server(web_tree.prefix, port=0)
    try:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", server.url)
        assert server.port != 0
        assert server.start_in_thread() is server
        status, headers, body = request(server, "/")
        assert status == 200
        assert headers["Content-Type"].startswith("text/html")
        assert "script-src" not in headers["Content-Security-Policy"]  # no scripts allowed at all
        assert web_tree.experiment.encode() in body
    finally:
        server.shutdown()


def test_pages_answer_and_head_has_no_body(server, web_tree):
    dedup = web_tree.steps["dedup/notes"]
    curve = web_tree.steps["checkpoints/curve"]
    pages = [
        "/",
        "/steps",
        f"/exp/{web_tree.experiment}",
        f"/exp/{web_tree.failing_experiment}",
        f"/step/{dedup}",
        f"/train/{curve}",
        f"/file/{dedup}",
        f"/file/{dedup}/shard-00003.jsonl.gz",
        f"/file/{dedup}/stats.json",
        f"/compare/{dedup}/shard-00003.jsonl.gz",
        f"/raw/{dedup}/stats.json",
    ]
    for target in pages:
        status, headers, body = request(server, target)
        assert status == 200, target
        assert body, target
        head_status, head_headers, head_body = request(server, target, "HEAD")
        assert head_status == 200 and head_body == b"", target
        assert head_headers["Content-Type"] == headers["Content-Type"]


TRAVERSALS = [
    "/file/..",
    "/file/../secret.txt",
    "/raw/../secret.txt",
    "/raw/../../etc/passwd",
    "/file/%2e%2e/secret.txt",
    "/raw/%2E%2E/secret.txt",
    "/raw/.%2e/secret.txt",
    "/raw/%2e./secret.txt",
    "/raw/%2e%2e%2fsecret.txt",
    "/raw/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "/file/%252e%252e/secret.txt",
    "/raw/%252e%252e%252fsecret.txt",
    "/raw/%25252e%25252e/secret.txt",
    "/file/..%2fsecret.txt",
    "/raw/..%2f..%2fetc%2fpasswd",
    "/raw/{dedup}/..%2f..%2f..%2fsecret.txt",
    "/raw/{dedup}/../../../secret.txt",
    "/etc/passwd",
    "//etc/passwd",
    "/file//etc/passwd",
    "/raw//etc/passwd",
    "/raw/%2fetc%2fpasswd",
    "/raw/%2Fetc/passwd",
    "/raw/{secret_path}",
    "/raw/{secret_path_encoded}",
    "/file/..\\secret.txt",
    "/raw/..\\..\\etc\\passwd",
    "/raw/%5c..%5csecret.txt",
    "/raw/..%5csecret.txt",
    "/raw/..%255csecret.txt",
    "/raw/%c0%ae%c0%ae/secret.txt",
    "/raw/%e0%80%ae%e0%80%ae/secret.txt",
    "/raw/{dedup}/leak.txt",
    "/file/{dedup}/leak.txt",
    "/compare/{dedup}/leak.txt",
    "/raw/{dedup}/up/secret.txt",
    "/file/{dedup}/up",
    "/file/{dedup}/up/secret.json",
    "/raw/evil/bookkeeping-0123abcd/.executor_info",
    "/step/evil/bookkeeping-0123abcd",
    "/raw/{dedup}/stats.json%00.txt",
    "/raw/{dedup}/%00",
    "/file/%00/../secret.txt",
    "/step/..",
    "/step/%2e%2e",
    "/train/..%2f..",
    "/exp/..%2fsecret",
    "/exp/../../secret.txt",
    "/compare/../secret.txt",
    "/file/./../secret.txt",
    "/file/%2e/secret.txt",
    "/raw/~/secret.txt",
    "/secret.txt",
    "/..",
    "/%2e%2e/secret.txt",
    "http://127.0.0.1/../secret.txt",
]


def test_traversal_attempts_are_refused(server, web_tree):
    dedup = web_tree.steps["dedup/notes"]
    root = os.path.dirname(web_tree.prefix)
    assert pathlib.Path(root, "secret.txt").read_text().strip() == web_tree.secret
    for template in TRAVERSALS:
        target = template.format(
            dedup=dedup,
            secret_path=web_tree.secret_path.lstrip("/"),
            secret_path_encoded=web_tree.secret_path.replace("/", "%2f"),
        )
        status, _headers, body = request(server, target)
        assert status in (400, 403, 404), (target, status)
        assert web_tree.secret.encode() not in body, target
        assert b"root:x:0:0" not in body, target


def test_symlinked_bookkeeping_and_log_are_never_read(server, web_tree):
    """A step whose .executor_info / log / lease point out of the prefix shows none of it."""
    for target in ["/steps", "/", f"/step/{web_tree.steps['evil/logleak']}", "/file/evil"]:
        status, _headers, body = request(server, target)
        assert status == 200, target
        assert web_tree.secret.encode() not in body, target
    _status, _headers, body = request(server, f"/step/{web_tree.steps['evil/logleak']}")
    assert b"log refused" in body and b"lease file refused" in body


def test_symlink_inside_the_prefix_is_served(server, web_tree):
    status, _headers, body = request(server, f"/raw/{web_tree.steps['dedup/notes']}/alias.json")
    assert status == 200
    assert json.loads(body)["documents_removed"] == 3


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND"])
def test_only_get_and_head(server, web_tree, method):
    before = sorted(os.listdir(os.path.join(web_tree.prefix, web_tree.steps["dedup/notes"])))
    status, headers, body = request(
        server, f"/raw/{web_tree.steps['dedup/notes']}/stats.json", method, body=b"x=1"
    )
    assert status == 405
    assert headers["Allow"] == "GET, HEAD"
    assert b"documents_removed" not in body
    assert sorted(os.listdir(os.path.join(web_tree.prefix, web_tree.steps["dedup/notes"]))) == before


def test_foreign_host_header_is_refused(server):
    """Bound to loopback, the server answers only to loopback names (DNS rebinding)."""
    assert request(server, "/", headers={"Host": "attacker.example"})[0] == 403
    assert request(server, "/", headers={"Host": f"localhost:{server.port}"})[0] == 200
    assert request(server, "/", headers={"Host": f"127.0.0.1:{server.port}"})[0] == 200
    # Two Host headers, the first a loopback name: refused, whichever one a client would honour.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\nHost: attacker.example\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.0 403"), reply[:200]


def test_bad_query_values(server, web_tree):
    target = f"/file/{web_tree.steps['dedup/notes']}/shard-00003.jsonl.gz"
    assert request(server, target + "?offset=abc")[0] == 400
    status, _headers, body = request(server, target + "?offset=-5")
    assert status == 200 and b"doc-010.txt" in body


def test_guard_unit(tmp_path):
    (tmp_path / "prefix" / "a").mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("x")
    os.symlink(tmp_path / "outside.txt", tmp_path / "prefix" / "a" / "out")
    guard = PrefixGuard(str(tmp_path / "prefix"), open_store(str(tmp_path / "prefix")))
    assert guard.resolve("a").local == str((tmp_path / "prefix" / "a").resolve())
    for bad in ["../outside.txt", "a/../../outside.txt", "a/out", "a//b", "a/\\b", "a/%2e", "a/\x00"]:
        with pytest.raises(Refused):
            guard.resolve(bad)
    assert guard.resolve_recorded(str(tmp_path / "outside.txt")) is None
    assert guard.resolve_recorded(str(tmp_path / "prefix" / "a")).relpath == "a"


def test_a_sibling_whose_name_extends_the_prefix_is_outside(tmp_path):
    """`out2` starts with `out` but is not under it: a plain startswith would let it in."""
    prefix, sibling = tmp_path / "out", tmp_path / "out2"
    prefix.mkdir()
    sibling.mkdir()
    (sibling / "secret.txt").write_text("sibling secret")
    os.symlink(sibling / "secret.txt", prefix / "file-link")
    os.symlink(sibling, prefix / "dir-link")
    guard = PrefixGuard(str(prefix), open_store(str(prefix)))
    assert not guard.inside(str(sibling.resolve())) and not guard.inside(
        str(sibling.resolve() / "secret.txt")
    )
    for bad in ["file-link", "dir-link", "dir-link/secret.txt"]:
        with pytest.raises(Refused):
            guard.resolve(bad)
    assert guard.resolve_recorded(str(sibling / "secret.txt")) is None
    assert guard.resolve_recorded(str(sibling)) is None
    server = start_server(str(prefix), port=0).start_in_thread()
    try:
        for target in [
            "/file/file-link",
            "/raw/file-link",
            "/file/dir-link/secret.txt",
            "/raw/dir-link/secret.txt",
        ]:
            status, _headers, body = request(server, target)
            assert status == 403 and b"sibling secret" not in body, target
    finally:
        server.shutdown()


# -- paging -------------------------------------------------------------------
@pytest.fixture(scope="module")
def files_prefix(tmp_path_factory) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    prefix = tmp_path_factory.mktemp("files")
    rows = [{"id": f"row-{index:04d}", "text": f"text of row {index}"} for index in range(1000)]
    lines = "".join(json.dumps(row) + "\n" for row in rows).encode()
    with gzip.open(prefix / "rows.jsonl.gz", "wb") as handle:
        handle.write(lines)
    (prefix / "rows.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    (prefix / "rows.jsonl").write_bytes(lines)
    pq.write_table(pa.Table.from_pylist(rows), prefix / "rows.parquet", row_group_size=100)
    text = "".join(f"line {index:06d} " + "x" * 50 + "\n" for index in range(6000))
    (prefix / "notes.txt").write_text(text)
    (prefix / "weights.bin").write_bytes(os.urandom(5000))
    (prefix / "blob").write_bytes(b"\x00\x01\x02" * 1000)
    (prefix / "config.json").write_text(json.dumps({"a": {"b": [1, 2, 3]}}))
    (prefix / "long.jsonl").write_bytes(
        b'{"id": "huge", "text": "' + b"y" * (3 * MAX_LINE_BYTES) + b'"}\n{"id": "after"}\n'
    )
    # Big enough that reading it whole would show in the memory peak (~24 MB of JSON lines).
    with open(prefix / "big.jsonl", "w") as handle:
        for index in range(60000):
            handle.write(json.dumps({"id": index, "text": "z" * 400}) + "\n")
    return str(prefix)


def page_of(prefix: str, name: str, offset: int = 0, limit: int = 50):
    guard = PrefixGuard(prefix, open_store(prefix))
    return read_page(guard.store, guard.resolve(name), offset, limit)


@pytest.mark.parametrize(
    ("name", "module"), [("rows.jsonl.zst", "zstandard"), ("rows.parquet", "pyarrow.parquet")]
)
def test_a_file_kind_whose_package_is_missing_gets_a_page_saying_what_to_install(
    files_prefix, monkeypatch, name, module
):
    """The browser comes with the core install; .zst and parquet need the `data` extra."""
    monkeypatch.setitem(sys.modules, module, None)  # `import` now raises ImportError
    with pytest.raises(Refused) as refused:
        page_of(files_prefix, name)
    assert refused.value.status == 501
    assert module.split(".")[0] in refused.value.message and ".[data]" in refused.value.message
    server = start_server(files_prefix, port=0).start_in_thread()
    try:
        status, _headers, body = request(server, f"/file/{name}")
        assert status == 501 and b".[data]" in body, body[:500]
    finally:
        server.shutdown()


@pytest.mark.parametrize("name", ["rows.jsonl.gz", "rows.jsonl.zst", "rows.jsonl"])
def test_json_lines_pages(files_prefix, name):
    first = page_of(files_prefix, name, 0, 50)
    assert first.kind == "lines"
    assert [number for number, _text, _cut in first.lines] == list(range(50))
    assert json.loads(first.lines[0][1])["id"] == "row-0000"
    assert first.next_offset == 50 and first.prev_offset is None
    later = page_of(files_prefix, name, 990, 50)
    assert [json.loads(text)["id"] for _n, text, _c in later.lines] == [
        f"row-{i:04d}" for i in range(990, 1000)
    ]
    assert later.next_offset is None and later.prev_offset == 940


def test_parquet_pages_read_row_slices(files_prefix):
    page = page_of(files_prefix, "rows.parquet", 250, 20)
    assert page.kind == "table" and page.total == 1000
    assert page.columns == ["id", "text"]
    assert [row[0] for row in page.rows] == [f"row-{i:04d}" for i in range(250, 270)]
    assert page.next_offset == 270 and page.prev_offset == 230
    across = page_of(files_prefix, "rows.parquet", 95, 10)  # spans two row groups
    assert [row[0] for row in across.rows] == [f"row-{i:04d}" for i in range(95, 105)]
    assert page_of(files_prefix, "rows.parquet", 995, 50).next_offset is None


def test_text_pages_are_byte_ranges_cut_at_newlines(files_prefix):
    pieces, offset = [], 0
    while offset is not None:
        page = page_of(files_prefix, "notes.txt", offset)
        assert page.kind == "text"
        assert len(page.text.encode()) <= TEXT_PAGE_BYTES
        assert page.text.endswith("\n")
        pieces.append(page.text)
        offset = page.next_offset
    assert len(pieces) > 4
    assert "".join(pieces) == pathlib.Path(files_prefix, "notes.txt").read_text()


def test_binary_json_and_long_lines(files_prefix):
    assert page_of(files_prefix, "weights.bin").note == "binary, 5000 bytes"
    assert page_of(files_prefix, "blob").kind == "binary"
    json_page = page_of(files_prefix, "config.json")
    assert json_page.kind == "json" and json.loads(json_page.text) == {"a": {"b": [1, 2, 3]}}
    long = page_of(files_prefix, "long.jsonl")
    assert [(number, cut) for number, _text, cut in long.lines] == [(0, True), (1, False)]
    assert len(long.lines[0][1]) <= MAX_LINE_BYTES
    assert json.loads(long.lines[1][1]) == {"id": "after"}


def test_a_page_never_loads_the_file_whole(files_prefix):
    size = os.path.getsize(os.path.join(files_prefix, "big.jsonl"))
    assert size > 20_000_000
    tracemalloc.start()
    try:
        page = page_of(files_prefix, "big.jsonl", 100, 50)
        last = page_of(files_prefix, "big.jsonl", 59990, 50)  # streams past 59,990 lines, keeps none
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [number for number, _t, _c in page.lines] == list(range(100, 150))
    assert [json.loads(text)["id"] for _n, text, _c in last.lines] == list(range(59990, 60000))
    assert peak < 2_000_000, peak


def test_memory_store_tree(web_tree):
    """On a non-local store (fsspec memory://) pages read through fsspec, not the disk."""
    prefix = f"memory://web-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    for dirpath, _dirs, names in os.walk(web_tree.prefix):
        for name in names:
            source = os.path.join(dirpath, name)
            if os.path.islink(source):
                continue
            relative = os.path.relpath(source, web_tree.prefix)
            data = pathlib.Path(source).read_bytes()
            if name.startswith(".executor") or relative.startswith("experiments/"):
                data = data.replace(web_tree.prefix.encode(), prefix.encode())
            with fs.open(f"{prefix}/{relative}", "wb") as handle:
                handle.write(data)
    server = start_server(prefix, port=0).start_in_thread()
    try:
        dedup = web_tree.steps["dedup/notes"]
        status, _h, body = request(server, f"/exp/{web_tree.experiment}")
        assert status == 200 and body.count(b'data-status="SUCCESS"') >= 6
        documents = web_tree.steps["documents/notes"]
        status, _h, body = request(server, f"/file/{documents}/shard-00003.jsonl.gz?limit=2")
        assert status == 200 and b"doc-009.txt" in body and b"doc-011.txt" not in body
        assert b"?offset=2&amp;limit=2" in body
        status, _h, body = request(server, f"/compare/{dedup}/shard-00003.jsonl.gz")
        assert status == 200 and b"dropped by filtered/notes" in body and b"dropped by dedup/notes" in body
        status, _h, body = request(server, f"/train/{web_tree.steps['checkpoints/curve']}")
        assert status == 200 and b'data-key="train/loss"' in body
        assert request(server, "/raw/../secret.txt")[0] in (403, 404)
    finally:
        server.shutdown()
        fs.rm(prefix, recursive=True)
