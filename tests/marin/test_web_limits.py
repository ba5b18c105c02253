"""The browser under load: bursts of connections, idle clients, and compressed files that
expand to gigabytes. Real servers on 127.0.0.1, real sockets."""

from __future__ import annotations

import gzip
import html
import http.client
import json
import os
import socket
import threading
import time
import tracemalloc
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from executor.store import open_store
from marin import leaderboard
from marin.web import files, pages, parquet_preview, start_server
from marin.web.safety import PrefixGuard, Refused

BURST = 200
IDLE = 300


@pytest.fixture
def prefix(tmp_path) -> Path:
    root = tmp_path / "prefix"
    root.mkdir()
    (root / "hello.txt").write_text("hello\n")
    return root


def get(port: int, target: str, timeout: float = 30) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_burst_of_connections_waits_in_the_listen_backlog(prefix):
    """200 clients connect while the server is not accepting yet: every handshake completes
    (none dropped or reset), and once it serves, every one gets its page."""
    server = start_server(str(prefix), port=0)  # listening, not accepting
    sockets: list[socket.socket] = []
    try:

        def connect(_index: int) -> socket.socket:
            return socket.create_connection(("127.0.0.1", server.port), timeout=3)

        with ThreadPoolExecutor(50) as pool:
            sockets = list(pool.map(connect, range(BURST)))
        server.start_in_thread()
        for sock in sockets:
            sock.settimeout(30)
            sock.sendall(b"GET /raw/hello.txt HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        replies = [read_all(sock) for sock in sockets]
        assert [reply.split(b"\r\n", 1)[0] for reply in replies] == [b"HTTP/1.0 200 OK"] * BURST
        assert all(reply.endswith(b"\r\n\r\nhello\n") for reply in replies)
    finally:
        for sock in sockets:
            sock.close()
        server.shutdown()


def test_200_concurrent_clients_all_get_answers(prefix):
    server = start_server(str(prefix), port=0).start_in_thread()
    start = threading.Barrier(BURST)
    try:

        def client(_index: int) -> int:
            start.wait()
            return get(server.port, "/raw/hello.txt")[0]

        with ThreadPoolExecutor(BURST) as pool:
            statuses = list(pool.map(client, range(BURST)))
        assert statuses == [200] * BURST
    finally:
        server.shutdown()


def test_idle_connections_do_not_stall_the_server_and_are_closed(prefix):
    server = start_server(str(prefix), port=0, connection_timeout=1.0).start_in_thread()
    idle: list[socket.socket] = []
    try:
        for _ in range(IDLE):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        started = time.monotonic()
        assert get(server.port, "/raw/hello.txt", timeout=10) == (200, b"hello\n")
        assert time.monotonic() - started < 5
        # Each idle client is dropped when its timeout runs out: the server closes it.
        deadline = time.monotonic() + 30
        for sock in idle:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            assert sock.recv(1) == b""
        assert get(server.port, "/raw/hello.txt", timeout=10) == (200, b"hello\n")
    finally:
        for sock in idle:
            sock.close()
        server.shutdown()


def test_connections_past_the_cap_get_503_at_once(prefix):
    server = start_server(str(prefix), port=0, max_connections=5).start_in_thread()
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(5)]
    try:
        time.sleep(0.2)  # let the server accept the five (they then hold every slot)
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        with extra:
            assert read_all(extra).startswith(b"HTTP/1.0 503 Service Unavailable\r\n")
        for sock in held:
            sock.close()
        held = []
        deadline = time.monotonic() + 10
        while (status := get(server.port, "/raw/hello.txt")[0]) != 200 and time.monotonic() < deadline:
            time.sleep(0.05)  # the slots free up as the closed connections' threads end
        assert status == 200
    finally:
        for sock in held:
            sock.close()
        server.shutdown()


def test_a_client_trickling_its_request_is_dropped_when_its_time_is_up(prefix):
    """A byte every 0.3 s never lets a 1 s socket timeout run out; the request's own time does."""
    server = start_server(str(prefix), port=0, connection_timeout=1.0).start_in_thread()
    try:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        with sock:
            started = time.monotonic()
            closed_after = None
            for byte in b"GET /raw/hello.txt HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100:
                try:
                    sock.sendall(bytes([byte]))
                except OSError:  # reset: the server has closed it
                    closed_after = time.monotonic() - started
                    break
                time.sleep(0.3)
                sock.setblocking(False)
                try:
                    if sock.recv(1) == b"":
                        closed_after = time.monotonic() - started
                        break
                except BlockingIOError:
                    pass
                finally:
                    sock.setblocking(True)
            assert closed_after is not None and closed_after < 3.0, closed_after
        # The idle wait for a next request on a kept-alive connection is not cut short: a
        # client that sends its request at once is served as before.
        assert get(server.port, "/raw/hello.txt", timeout=10) == (200, b"hello\n")
    finally:
        server.shutdown()


def test_a_refused_method_is_answered_at_once_even_if_its_body_never_comes(prefix):
    server = start_server(str(prefix), port=0, connection_timeout=5.0).start_in_thread()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000000\r\n\r\nab")
            reply = sock.recv(65536)
            assert reply.startswith(b"HTTP/1.0 405 ") or reply.startswith(b"HTTP/1.1 405 "), reply
            assert time.monotonic() - started < 2.0
    finally:
        server.shutdown()


# -- decompression bombs ---------------------------------------------------------------------
MEMBER_BYTES = 64 << 20
BOMB_BYTES = 2 << 30


def write_gzip_bomb(path: Path, byte: bytes) -> None:
    """A gzip file of BOMB_BYTES copies of `byte`, ~2 MB on disk: one gzip member of
    MEMBER_BYTES, compressed once (in 1 MiB pieces) and written BOMB_BYTES // MEMBER_BYTES
    times (a gzip file may hold many members; readers concatenate them)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip header and trailer
    piece = byte * (1 << 20)
    member = b"".join(compressor.compress(piece) for _ in range(MEMBER_BYTES >> 20)) + compressor.flush()
    with open(path, "wb") as handle:
        for _ in range(BOMB_BYTES // MEMBER_BYTES):
            handle.write(member)


@pytest.fixture(scope="module")
def bombs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bombs")
    write_gzip_bomb(root / "one-line.jsonl.gz", b"0")  # one 2 GiB line
    write_gzip_bomb(root / "empty-lines.txt.gz", b"\n")  # 2 Gi empty lines
    return root


def test_the_bomb_is_what_it_claims(bombs):
    path = bombs / "one-line.jsonl.gz"
    assert path.stat().st_size < 4_000_000
    with gzip.open(path, "rb") as handle:
        assert handle.read(1 << 20) == b"0" * (1 << 20)
    # Each member's trailer records its size; the members add up to BOMB_BYTES.
    data = path.read_bytes()
    members = BOMB_BYTES // MEMBER_BYTES
    assert data[: len(data) // members] * members == data
    assert int.from_bytes(data[len(data) // members - 4 : len(data) // members], "little") == MEMBER_BYTES


@pytest.mark.parametrize(("name", "offset"), [("one-line.jsonl.gz", 0), ("empty-lines.txt.gz", 10**10)])
def test_a_decompression_bomb_page_stops_within_the_limits(bombs, name, offset):
    guard = PrefixGuard(str(bombs), open_store(str(bombs)))
    tracemalloc.start()
    started = time.monotonic()
    try:
        page = files.read_page(guard.store, guard.resolve(name), offset)
        elapsed = time.monotonic() - started
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert page.kind == "stopped"
    assert f"at most {files.MAX_READ_BYTES >> 20} MiB" in page.note and "raw" in page.note
    assert elapsed < files.MAX_READ_SECONDS + 5
    assert peak < 16 << 20, peak


def test_a_decompression_bomb_over_http_says_where_it_stopped(bombs):
    server = start_server(str(bombs), port=0).start_in_thread()
    try:
        started = time.monotonic()
        status, body = get(server.port, "/file/one-line.jsonl.gz")
        assert time.monotonic() - started < files.MAX_READ_SECONDS + 5
        assert status == 200 and b"stopped reading one-line.jsonl.gz" in body
    finally:
        server.shutdown()


def test_reading_records_past_the_limits_is_refused(bombs):
    guard = PrefixGuard(str(bombs), open_store(str(bombs)))
    with pytest.raises(files.ReadLimit) as stopped:
        for _record in files.iter_records(guard.store, guard.resolve("empty-lines.txt.gz")):
            pass
    assert stopped.value.status == 413


def test_the_time_limit_stops_a_slow_read(bombs, monkeypatch):
    monkeypatch.setattr(files, "MAX_READ_SECONDS", 0.0)
    guard = PrefixGuard(str(bombs), open_store(str(bombs)))
    page = files.read_page(guard.store, guard.resolve("empty-lines.txt.gz"), 1000)
    assert page.kind == "stopped" and "after 0." in page.note


def test_a_page_keeps_at_most_max_page_bytes_and_links_on(tmp_path):
    line = b'{"id": "x", "text": "' + b"w" * (512 << 10) + b'"}\n'
    (tmp_path / "wide.jsonl").write_bytes(line * 40)  # 20 MiB, 40 lines
    guard = PrefixGuard(str(tmp_path), open_store(str(tmp_path)))
    page = files.read_page(guard.store, guard.resolve("wide.jsonl"), 0, 1000)
    kept = sum(len(text) for _number, text, _cut in page.lines)
    assert files.MAX_PAGE_BYTES <= kept < files.MAX_PAGE_BYTES + len(line)
    assert page.next_offset == len(page.lines) < 40


def test_a_line_page_cut_by_the_read_limit_says_so(tmp_path, monkeypatch):
    """The limit runs out after some lines: the page shows them and says where it stopped."""
    (tmp_path / "many.jsonl").write_bytes(b"".join(b'{"id": "%d", "text": "t"}\n' % i for i in range(2000)))
    monkeypatch.setattr(files, "MAX_READ_BYTES", 4096)
    guard = PrefixGuard(str(tmp_path), open_store(str(tmp_path)))
    page = files.read_page(guard.store, guard.resolve("many.jsonl"), 0, 1000)
    assert page.kind == "lines" and 0 < len(page.lines) < 1000 and page.note
    server = start_server(str(tmp_path), port=0).start_in_thread()
    try:
        status, body = get(server.port, "/file/many.jsonl?limit=1000")
        assert status == 200 and b'class="muted note"' in body
        assert html.escape(page.note).encode() in body
    finally:
        server.shutdown()


# -- hostile files: pipes, devices, deep JSON, parquet bombs ------------------------------------
DEEP = 100_000
"""Nesting far past what Python's JSON parser recurses into (about 1,000)."""


def test_a_fifo_in_the_tree_is_refused_without_waiting_for_a_writer(prefix):
    """`/raw/` of a FIFO once opened it blocking: each request held a connection slot for
    good, until the browser answered 503 to everyone."""
    os.mkfifo(prefix / "pipe.jsonl")
    server = start_server(str(prefix), port=0).start_in_thread()
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _i: get(server.port, "/raw/pipe.jsonl", timeout=10), range(16)))
        assert {status for status, _body in answers} == {403}
        assert b"not a regular file" in answers[0][1]
        status, body = get(server.port, "/raw/hello.txt")
        assert (status, body) == (200, b"hello\n")
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _i: get(server.port, "/file/pipe.jsonl", timeout=10), range(16)))
        assert {status for status, _body in answers} == {403}  # not "empty file" (its size is 0)
        assert b"not a regular file" in answers[0][1]
        assert get(server.port, "/raw/hello.txt") == (200, b"hello\n")
    finally:
        server.shutdown()


def test_a_fifo_swapped_in_after_the_check_is_refused_once_open(prefix, monkeypatch):
    """A regular file at the check, a FIFO by the open (someone swapped it in between): the
    file is opened without blocking and checked again, so the request is still refused at once
    (the check before the open is skipped here to stand for the swap)."""
    from marin.web import files

    os.mkfifo(prefix / "swapped.jsonl")
    monkeypatch.setattr(files, "_check_regular", lambda target: None)
    server = start_server(str(prefix), port=0).start_in_thread()
    try:
        status, body = get(server.port, "/raw/swapped.jsonl", timeout=10)
        assert status == 403 and b"not a regular file" in body
        assert get(server.port, "/raw/hello.txt") == (200, b"hello\n")
    finally:
        server.shutdown()


def test_a_socket_in_the_tree_is_refused_by_the_viewer_and_raw(prefix, monkeypatch):
    monkeypatch.chdir(prefix)  # a relative name: a socket path may not be longer than 107 bytes
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("sock.jsonl")
    listener.listen(1)
    server = start_server(str(prefix), port=0).start_in_thread()
    try:
        for route in ("file", "raw"):
            status, body = get(server.port, f"/{route}/sock.jsonl", timeout=10)
            assert status == 403 and b"not a regular file" in body, (route, status)
    finally:
        server.shutdown()
        listener.close()


@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero"])
def test_the_file_viewer_refuses_a_device_however_small_its_size(prefix, device):
    """A character device's size is 0: the viewer once called it an empty file without
    looking at what it is (a link inside the prefix resolving to it is what `local` holds)."""
    guard = PrefixGuard(str(prefix), open_store(str(prefix)))
    for name in ["dev.txt", "dev.jsonl", "dev.parquet", "dev.json"]:
        target = files.Target(relpath=name, path=f"{prefix}/{name}", local=device)
        with pytest.raises(Refused) as refused:
            files.read_page(guard.store, target)
        assert refused.value.status == 403 and "not a regular file" in refused.value.message


# -- offsets past the end --------------------------------------------------------------------
FAR_OFFSETS = ["99999999999999999999999", "100000000000000", str(1 << 62)]


@pytest.fixture
def big_files(prefix) -> Path:
    (prefix / "big.txt").write_bytes(b"a line of text\n" * 140_000)  # 2 MiB: paged by bytes
    (prefix / "big.json").write_text(json.dumps({"values": list(range(300_000))}))  # > 1 MiB: as text
    (prefix / "rows.jsonl").write_text("".join(json.dumps({"id": i, "text": "t"}) + "\n" for i in range(10)))
    (prefix / "rows.jsonl.gz").write_bytes(gzip.compress((prefix / "rows.jsonl").read_bytes()))
    write_parquet(prefix / "rows.parquet", [{"id": i} for i in range(10)])
    return prefix


@pytest.mark.parametrize("offset", FAR_OFFSETS)
def test_a_far_offset_gives_the_empty_last_page_not_an_error(big_files, offset, capsys):
    server = start_server(str(big_files), port=0).start_in_thread()
    try:
        for name in ["big.txt", "big.json", "rows.jsonl", "rows.jsonl.gz", "rows.parquet", "hello.txt"]:
            status, body = get(server.port, f"/file/{name}?offset={offset}")
            assert status == 200, (name, body[-3000:])
            assert b'class="next"' not in body, name
        for name in ["big.txt", "big.json"]:
            size = (big_files / name).stat().st_size
            status, body = get(server.port, f"/file/{name}?offset={offset}")
            assert b"is past the end of the file" in body
            assert f"no bytes after {size}".encode() in body
            # "previous" leads back to the file's last page, not to another offset past its end
            assert f'/file/{name}?offset={size - files.TEXT_PAGE_BYTES}" class="prev"'.encode() in body
        status, body = get(server.port, f"/file/rows.parquet?offset={offset}")
        assert b"no rows after 10" in body and b"/file/rows.parquet?offset=0&amp;limit=50" in body
    finally:
        server.shutdown()
    assert "Traceback" not in capsys.readouterr().err


def test_an_offset_at_or_past_the_end_of_a_text_file(big_files, monkeypatch):
    guard = PrefixGuard(str(big_files), open_store(str(big_files)))
    target = guard.resolve("big.txt")
    size = (big_files / "big.txt").stat().st_size
    last = files.read_page(guard.store, target, size - 15)
    assert (last.kind, last.text, last.next_offset) == ("text", "a line of text\n", None)
    for offset in (size, size + 1, 1 << 62):
        page = files.read_page(guard.store, target, offset)
        assert (page.kind, page.text, page.next_offset, page.total) == ("text", "", None, size)
        assert page.prev_offset == size - files.TEXT_PAGE_BYTES and "past the end" in page.note
    # A size not known beforehand (or a file that shrank): the failing seek gives the same page.
    monkeypatch.setattr(files, "file_size", lambda store, target: None)
    page = files.read_page(guard.store, target, 1 << 62)
    assert (page.kind, page.text, page.next_offset) == ("text", "", None)


def test_open_raw_refuses_what_is_not_a_regular_file(prefix):
    guard = PrefixGuard(str(prefix), open_store(str(prefix)))
    (prefix / "dir").mkdir()
    os.symlink("/dev/zero", prefix / "zero.txt")  # a device reached through a link inside the tree
    for name in ["dir", "zero.txt"]:
        target = guard.resolve(name) if name == "dir" else None
        if target is None:
            target = files.Target(relpath=name, path=f"{prefix}/{name}", local="/dev/zero")
        with pytest.raises(Refused) as refused, files.open_raw(guard.store, target):
            pass
        assert refused.value.status == 403 and "not a regular file" in refused.value.message


def test_json_nested_past_the_parser_is_shown_as_text_not_an_error(prefix):
    deep = "[" * DEEP + "]" * DEEP
    (prefix / "deep.json").write_text(deep)
    document = json.dumps({"id": "doc-1", "text": "a readable document"})
    (prefix / "docs.jsonl").write_text(f"{document}\n{deep}\n{document.replace('doc-1', 'doc-2')}\n")
    server = start_server(str(prefix), port=0).start_in_thread()
    try:
        status, body = get(server.port, "/file/deep.json")
        assert status == 200 and b"[[[[" in body
        status, body = get(server.port, "/file/docs.jsonl")
        assert status == 200 and b"doc-1" in body and b"doc-2" in body, body[-2000:]
    finally:
        server.shutdown()
    guard = PrefixGuard(str(prefix), open_store(str(prefix)))
    records = list(files.iter_records(guard.store, guard.resolve("docs.jsonl")))
    assert [record and record["id"] for _number, record in records] == ["doc-1", None, "doc-2"]
    assert "doc-1" in pages._line_html(0, document, False)
    assert "[[[[" in pages._line_html(1, deep, False)
    assert leaderboard._last_metrics(f'{{"loss": 2.0}}\n{deep}\n{{"step": 3}}\n') == {"loss": 2.0, "step": 3}


def write_parquet(path: Path, rows: list[dict], row_group_size: int | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size, compression="zstd")


def test_a_parquet_page_bomb_stops_in_the_preview_process(prefix, monkeypatch):
    """A parquet data page is decoded whole, however few rows are asked for: a file of a few
    hundred KB declares a page bigger than the preview process may use. Here the limit is
    lowered to 128 MiB and the page is 192 MiB (the default is 512 MiB; the test keeps its
    own memory small)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setattr(parquet_preview, "MEMORY_LIMIT_BYTES", 128 << 20)
    value = "a" * (4 << 20)
    table = pa.table({"text": pa.array([value] * 48, pa.large_string())})
    pq.write_table(table, prefix / "bomb.parquet", compression="zstd", use_dictionary=False)
    del table
    assert (prefix / "bomb.parquet").stat().st_size < 1 << 20
    metadata = pq.ParquetFile(prefix / "bomb.parquet").metadata
    assert metadata.row_group(0).total_byte_size > 192 << 20
    guard = PrefixGuard(str(prefix), open_store(str(prefix)))
    started = time.monotonic()
    page = files.read_page(guard.store, guard.resolve("bomb.parquet"), 0, 5)
    assert time.monotonic() - started < parquet_preview.WALL_SECONDS
    assert page.kind == "stopped", page
    assert "more than 128 MiB of memory" in page.note and "raw" in page.note
    server = start_server(str(prefix), port=0).start_in_thread()
    try:
        status, body = get(server.port, "/file/bomb.parquet")
        assert status == 200 and b"more than 128 MiB of memory" in body
        assert get(server.port, "/raw/hello.txt") == (200, b"hello\n")
    finally:
        server.shutdown()


def test_parquet_cells_and_pages_are_bounded(prefix):
    columns = {f"c{index}": "x" * 5000 for index in range(20)}
    write_parquet(prefix / "wide.parquet", [{"id": row, **columns} for row in range(1000)], 250)
    guard = PrefixGuard(str(prefix), open_store(str(prefix)))
    page = files.read_page(guard.store, guard.resolve("wide.parquet"), 10, 1000)
    assert page.kind == "table" and page.total == 1000
    assert page.rows[0][0] == "10"
    cell = page.rows[0][1]
    assert cell == "x" * parquet_preview.CELL_CHARS + "\u2026"
    kept = sum(len(cell) for row in page.rows for cell in row)
    assert len(page.rows) < 990 and kept < parquet_preview.MAX_PAGE_BYTES + 21 * 1001
    assert page.next_offset == 10 + len(page.rows)


def test_a_parquet_preview_that_does_not_answer_in_time_is_stopped(prefix, monkeypatch):
    write_parquet(prefix / "rows.parquet", [{"id": 1}])
    monkeypatch.setattr(parquet_preview, "WALL_SECONDS", 0.0)
    guard = PrefixGuard(str(prefix), open_store(str(prefix)))
    page = files.read_page(guard.store, guard.resolve("rows.parquet"))
    assert page.kind == "stopped" and "without an answer" in page.note


def test_a_file_that_is_not_parquet_says_so(prefix):
    (prefix / "fake.parquet").write_bytes(b"PAR1" + os.urandom(3000) + b"PAR1")
    guard = PrefixGuard(str(prefix), open_store(str(prefix)))
    page = files.read_page(guard.store, guard.resolve("fake.parquet"))
    assert page.kind == "binary" and "parquet" in page.note, page


def test_a_parquet_preview_imports_nothing_from_the_working_directory(prefix, monkeypatch):
    """`marin browse` run from inside the tree: the preview process must not import the
    tree's files as modules (`python -m` puts the working directory first on sys.path)."""
    write_parquet(prefix / "rows.parquet", [{"id": 1}])
    sentinel = prefix.parent / "planted-ran"
    for module in ["typing", "ast", "uuid", "marin"]:
        (prefix / f"{module}.py").write_text(f"open({str(sentinel)!r}, 'w').close()\n")
    monkeypatch.chdir(prefix)
    guard = PrefixGuard(str(prefix), open_store(str(prefix)))
    page = files.read_page(guard.store, guard.resolve("rows.parquet"))
    assert page.kind == "table" and page.rows == [["1"]], page
    assert not sentinel.exists()
