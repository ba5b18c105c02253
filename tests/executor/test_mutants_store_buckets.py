"""The store's object-store paths, pinned where mutation testing found no test (or none that
its selection runs): the operation and path each retried call names in its log line, the
time a listing reports, a local append racing another writer for a new directory, and
the bucket stores' own requests -- the bucket check (one try only against an endpoint
nothing listens on; a server's refusal of the method is no missing bucket; an answer that
is not GCS's JSON is no bucket), GCS's upload into a missing bucket, and the conditional
writes, deletes and probe against a real SeaweedFS server.

The mutation run leaves out every test whose name says "s3" (the store contract's slow
SeaweedFS cases), so nothing here is named after it: the S3 store's tests say
"bucket"/"seaweed". Real servers (SeaweedFS, fake-gcs-server) answer wherever the
behaviour is the server's; a small HTTP server in this process stands in for an endpoint
that is no object store at all, and small stand-ins for a filesystem only where the
store's own branching is pinned.
"""

from __future__ import annotations

import http.server
import logging
import os
import threading
import uuid
from collections.abc import Iterator

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from executor import retry
from executor.store import GCSStore, LocalStore, S3Store, Store, StoreError
from tests.operations.servers import free_port


def retry_lines(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "executor.retry"]


def no_waits(store: Store, attempts: int = 2) -> Store:
    """The store with `attempts` tries and no wait between them (the log line says 0.00 s)."""
    store._retry_policy = retry.RetryPolicy(attempts=attempts, first_wait_s=0.0)
    return store


# -- listings --------------------------------------------------------------------------------


class _MtimeFS(MemoryFileSystem):
    """A memory filesystem whose listing gives each file an `mtime` (as fsspec's local and
    SFTP filesystems do) besides its own `created`."""

    protocol = ("mtimefs",)
    store: dict = {}
    pseudo_dirs = [""]

    def ls(self, path, detail=True, **kwargs):
        return [
            {**entry, "mtime": 1_700_000_000.5, "created": 5.0} if entry["type"] == "file" else entry
            for entry in super().ls(path, detail=True, **kwargs)
        ]


def test_a_listing_that_gives_mtime_reports_that_time():
    fs = _MtimeFS()
    fs.store.clear()
    store = Store(fs, "mtimefs")
    store.write_atomic("mtimefs://bucket/d/f", b"abc")
    [info] = store.list_dir("mtimefs://bucket/d")
    assert info.name == "f" and info.size == 3
    assert info.mtime == 1_700_000_000.5  # mtime first, before any other field naming a time


# -- each call names its operation and path when retried -------------------------------------


class _FlakyFS(MemoryFileSystem):
    """A memory filesystem whose next call of each method in `flaky` resets its connection once."""

    protocol = ("flakyfs",)
    cachable = False  # a fresh instance (and set of failures) per test
    store: dict = {}
    pseudo_dirs = [""]

    def __init__(self, *flaky: str, **kwargs):
        super().__init__(**kwargs)
        self.flaky = set(flaky)

    def _fail_once(self, method: str) -> None:
        if method in self.flaky:
            self.flaky.discard(method)
            raise ConnectionResetError(104, "Connection reset by peer")

    def makedirs(self, path, exist_ok=False):
        self._fail_once("makedirs")
        return super().makedirs(path, exist_ok=exist_ok)

    def pipe_file(self, path, value, **kwargs):
        self._fail_once("pipe_file")
        return super().pipe_file(path, value, **kwargs)

    def rm(self, path, recursive=False, maxdepth=None):
        self._fail_once("rm")
        return super().rm(path, recursive=recursive, maxdepth=maxdepth)


@pytest.mark.parametrize(
    "call, method, operation",
    [
        (lambda store, path: store.makedirs(path), "makedirs", "makedirs"),
        (lambda store, path: store.write_atomic(path, b"x"), "pipe_file", "write"),
        (lambda store, path: store.delete_tree(path), "rm", "delete tree"),
    ],
    ids=["makedirs", "write", "delete_tree"],
)
def test_a_retried_call_logs_its_operation_and_path(call, method, operation, caplog):
    fs = _FlakyFS(method)
    fs.store.clear()
    fs.pseudo_dirs[:] = [""]
    store = no_waits(Store(fs, "flakyfs"))
    path = f"flakyfs://bucket/{uuid.uuid4().hex[:8]}/d"
    if operation == "delete tree":
        store.write_atomic(f"{path}/f", b"x")
    with caplog.at_level(logging.WARNING, logger="executor.retry"):
        call(store, path)
    assert retry_lines(caplog) == [
        f"storage: {operation} {path} failed (ConnectionResetError: [Errno 104] Connection reset by peer); "
        "retry 1 of 1 in 0.00 s"
    ]
    assert not fs.flaky  # it did fail once, and the retry went through
    if operation == "delete tree":
        assert not store.exists(f"{path}/f")
    else:
        assert store.exists(path)


# -- a local append racing another writer ----------------------------------------------------


def test_an_append_whose_new_directory_another_writer_made_meanwhile_still_appends(tmp_path, monkeypatch):
    target = str(tmp_path / "new" / "status")
    real_open = os.open
    raced = []

    def open_racing(path, flags, *args, **kwargs):
        try:
            return real_open(path, flags, *args, **kwargs)
        except FileNotFoundError:
            if path == target and not raced:
                raced.append(path)
                os.mkdir(os.path.dirname(path))  # the other writer, between our miss and makedirs
            raise

    store = LocalStore()
    monkeypatch.setattr(os, "open", open_racing)
    store.append_line(target, "RUNNING")
    monkeypatch.undo()
    assert raced == [target]
    with open(target, "rb") as f:
        assert f.read() == b"RUNNING\n"


# -- stand-in endpoints that are no object store ---------------------------------------------


class _Answer(http.server.BaseHTTPRequestHandler):
    """Answers each request with the server's answer for its method: (status, headers, body)."""

    def log_message(self, format, *args):  # noqa: A002 -- the base class's signature
        pass

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.requests.append((self.command, self.path))
        status, headers, body = self.server.answers.get(self.command, self.server.answers["*"])
        self.send_response(status)
        for name, value in {"Content-Type": "text/html", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _answer  # noqa: N815 -- http.server's naming


@pytest.fixture
def answering() -> Iterator:
    """Start an HTTP server on 127.0.0.1 answering every request with (status, body), or per
    method as `answers` says ({method: (status, headers, body)}); yields a function that
    starts one and returns (url, server)."""
    servers = []

    def start(status: int, body: bytes, answers: dict | None = None):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
        server.answers = {"*": (status, {}, body), **(answers or {})}
        server.requests = []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def bucket_store(endpoint: str, **options) -> S3Store:
    import s3fs

    fs = s3fs.S3FileSystem(
        skip_instance_cache=True, endpoint_url=endpoint, key="key", secret="secret", **options
    )
    fs.retries = 1  # s3fs's own loop: one try (a class attribute, not an option)
    return S3Store(fs, "s3")


def gcs_store(endpoint: str) -> GCSStore:
    import gcsfs

    fs = gcsfs.GCSFileSystem(skip_instance_cache=True, endpoint_url=endpoint, token="anon", project="tests")
    return GCSStore(fs, "gs")


def test_a_bucket_endpoint_nothing_listens_on_is_tried_once_not_again_under_the_policy(monkeypatch, caplog):
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    # The connection probe passed (the server went away just after it, or a proxy variable
    # turned the probe off): the bucket check's own request meets the closed port.
    monkeypatch.setattr(retry, "refused_endpoint", lambda protocol: None)
    # One try by the client itself, so that only our policy could add any.
    store = no_waits(bucket_store(endpoint, config_kwargs={"retries": {"max_attempts": 1}}), 3)
    calls = []
    real = store._bucket_exists
    monkeypatch.setattr(store, "_bucket_exists", lambda bucket: calls.append(bucket) or real(bucket))
    with caplog.at_level(logging.WARNING, logger="executor.retry"), pytest.raises(StoreError) as raised:
        store.check_reachable("s3://tests/p")
    assert str(raised.value).startswith(
        f"cannot connect to the S3 server at {endpoint} (AWS_ENDPOINT_URL) for bucket 'tests' ("
    )
    assert str(raised.value).endswith(": start it, or fix AWS_ENDPOINT_URL")
    assert calls == ["tests"]
    # (botocore's own attempts are logged too, once an earlier test has hooked it: not ours)
    assert [line for line in retry_lines(caplog) if not line.endswith("(botocore)")] == []


def test_a_bucket_server_refusing_the_method_is_no_missing_bucket(answering, monkeypatch):
    # 405 to HEAD /bucket: s3fs raises it as EPERM, the store as refused access -- never as
    # a bucket that does not exist (only a 404 or NoSuchBucket says that).
    endpoint, server = answering(405, b"<html>Method Not Allowed</html>")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    store = bucket_store(endpoint)
    with pytest.raises(StoreError) as raised:
        store.check_reachable("s3://tests/p")
    assert str(raised.value).startswith(
        f"S3 refused the credentials for bucket 'tests' at {endpoint} (AWS_ENDPOINT_URL) (PermissionError: "
    )
    assert "does not exist" not in str(raised.value)
    assert retry.status_and_code(raised.value.__cause__.__cause__) == (405, "405")
    assert server.requests == [("HEAD", "/tests")]


NO_SUCH_KEY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NoSuchKey</Code>'
    b"<Message>The specified key does not exist.</Message><Key>p/lease</Key></Error>"
)


def test_a_conditional_delete_answered_no_such_key_is_a_lost_swap(answering, monkeypatch):
    # AWS answers a conditional delete of an object deleted since the read with 404
    # NoSuchKey (SeaweedFS with 412, which says the same by its status alone): the swap is
    # lost, as when the object changed, and no error comes out.
    endpoint, server = answering(
        404,
        NO_SUCH_KEY,
        {
            "GET": (200, {"Content-Type": "application/octet-stream", "ETag": '"abc"'}, b"mine"),
            "DELETE": (404, {"Content-Type": "application/xml"}, NO_SUCH_KEY),
        },
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    store = no_waits(bucket_store(endpoint), 1)
    assert store.compare_and_swap("s3://tests/p/lease", b"mine", None) is False
    assert server.requests == [("GET", "/tests/p/lease"), ("DELETE", "/tests/p/lease")]


def test_a_gcs_endpoint_answering_no_json_is_no_bucket(answering, monkeypatch):
    endpoint, server = answering(200, b"<html>a web server, not GCS</html>")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    store = no_waits(gcs_store(endpoint), 1)
    with pytest.raises(ValueError, match="Expecting value"):
        store.check_reachable("gs://tests/p")
    assert [method for method, _ in server.requests] == ["GET"]
    assert server.requests[0][1].startswith("/storage/v1/b/tests")


def test_a_gcs_conditional_write_answered_with_no_json_is_not_taken_for_done(answering, monkeypatch):
    # The object is absent (404), and the upload that should create it is answered 200 with a
    # page: the swap fails instead of counting as done.
    endpoint, server = answering(
        200, b"<html>a web server, not GCS</html>", {"GET": (404, {}, b"<html>not found</html>")}
    )
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    store = no_waits(gcs_store(endpoint), 1)
    with pytest.raises(ValueError, match="Expecting value"):
        store.compare_and_swap("gs://tests/p/lease", None, b"mine")
    assert [method for method, _ in server.requests] == ["GET", "POST"]
    assert server.requests[1][1].startswith("/upload/storage/v1/b/tests/o?")


# -- GCS: fake-gcs-server --------------------------------------------------------------------


def test_a_gcs_write_into_a_missing_bucket_names_the_bucket(gcs_env):
    bucket = f"missing-{uuid.uuid4().hex[:8]}"
    store = gcs_store(gcs_env.endpoint_url)
    with pytest.raises(StoreError) as raised:
        store.write_atomic(f"gs://{bucket}/p/f", b"data")
    assert str(raised.value).startswith(
        f"the GCS bucket {bucket!r} at {gcs_env.endpoint_url} (STORAGE_EMULATOR_HOST) does not exist ("
    )
    assert str(raised.value).endswith("): create it, or fix the prefix (--prefix / MARIN_PREFIX)")
    assert isinstance(raised.value.__cause__, FileNotFoundError)


# -- the bucket store against SeaweedFS ------------------------------------------------------


@pytest.fixture
def seaweed(s3_server, monkeypatch):
    """A bucket store on the session's SeaweedFS server and a fresh prefix in its bucket."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return S3Store(s3_server.filesystem(), "s3"), s3_server.new_prefix()


def test_seaweed_compare_and_swap_creates_replaces_and_deletes(seaweed):
    store, prefix = seaweed
    path = f"{prefix}/lease"
    assert store.compare_and_swap(path, None, b"one")
    assert not store.compare_and_swap(path, None, b"two")
    assert store.read_bytes(path) == b"one"
    assert store.compare_and_swap(path, b"one", b"two")
    assert not store.compare_and_swap(path, b"one", b"three")
    assert store.read_bytes(path) == b"two"
    assert store.compare_and_swap(path, b"two", None)
    assert store.read_bytes(path) is None


def test_seaweed_delete_of_an_object_deleted_since_the_read_is_a_lost_swap(seaweed, monkeypatch):
    store, prefix = seaweed
    path = f"{prefix}/lease"
    store.write_atomic(path, b"mine")
    real_read = store._read_versioned

    def read_then_another_deletes(p):
        answer = real_read(p)
        store.fs.rm(store.fs._strip_protocol(p))  # another driver, between our read and delete
        return answer

    monkeypatch.setattr(store, "_read_versioned", read_then_another_deletes)
    assert store.compare_and_swap(path, b"mine", None) is False


def test_a_conditional_write_failing_with_no_server_answer_raises_that_error(seaweed, monkeypatch):
    store, prefix = seaweed
    no_waits(store, 1)
    real_call = store.fs.call_s3

    def timing_out(method, *args, **kwargs):
        if method == "put_object":
            raise TimeoutError("timed out")  # socket.timeout: s3fs raises it as it came, after its retries
        return real_call(method, *args, **kwargs)

    monkeypatch.setattr(store.fs, "call_s3", timing_out)
    with pytest.raises(TimeoutError, match="^timed out$"):
        store.compare_and_swap(f"{prefix}/lease", None, b"mine")
    assert store.read_bytes(f"{prefix}/lease") is None


def test_seaweed_check_writable_finds_conditional_writes_honoured_and_leaves_no_probe(seaweed, caplog):
    store, prefix = seaweed
    with caplog.at_level(logging.WARNING, logger="executor.store"):
        store.check_writable(prefix)
    assert [r for r in caplog.records if r.name == "executor.store"] == []
    store.fs.invalidate_cache()
    assert store.list_dir(prefix) == []
