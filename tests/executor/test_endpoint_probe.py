"""`retry.refused_endpoint`: a run against a set endpoint nobody listens on fails in about a
second, not after the storage client's own retries (gcsfs ~30 s, botocore ~9 s).

The end-to-end checks (the one `error:` line, with real S3 and GCS clients) are in
tests/executor/test_store_faults.py; these pin down the probe itself, on real sockets."""

from __future__ import annotations

import socket
import time

import pytest

from executor import retry
from executor.store import StoreError, open_store
from tests.operations.servers import free_port

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "STORAGE_EMULATOR_HOST")
PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in (*ENDPOINT_VARIABLES, *PROXIES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(retry, "PROBE_PAUSE_S", 0.01)


@pytest.fixture
def listening():
    server = socket.create_server(("127.0.0.1", 0))
    yield server.getsockname()[1]
    server.close()


@pytest.mark.parametrize(
    ("protocol", "variable"),
    [("s3", "AWS_ENDPOINT_URL"), ("s3", "AWS_ENDPOINT_URL_S3"), ("gs", "STORAGE_EMULATOR_HOST")],
)
def test_a_port_nobody_listens_on_is_refused_after_every_try(monkeypatch, protocol, variable):
    port = free_port()
    monkeypatch.setenv(variable, f"http://127.0.0.1:{port}")
    tries = []
    connect = socket.create_connection
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: tries.append(a[0]) or connect(*a, **k))
    error = retry.refused_endpoint(protocol)
    assert isinstance(error, ConnectionRefusedError)
    assert tries == [("127.0.0.1", port)] * retry.PROBE_ATTEMPTS


@pytest.mark.parametrize("protocol", ["s3", "gs"])
def test_a_listening_endpoint_is_not_refused(monkeypatch, listening, protocol):
    monkeypatch.setenv(
        "AWS_ENDPOINT_URL" if protocol == "s3" else "STORAGE_EMULATOR_HOST", f"127.0.0.1:{listening}"
    )
    assert retry.refused_endpoint(protocol) is None


def test_a_server_that_starts_during_the_tries_is_not_refused(monkeypatch):
    """A server still starting gets the pauses between tries."""
    port = free_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    started = []
    sleep = time.sleep

    def start_the_server_while_paused(seconds):
        if not started:
            started.append(socket.create_server(("127.0.0.1", port)))
        sleep(seconds)

    monkeypatch.setattr(retry.time, "sleep", start_the_server_while_paused)
    try:
        assert retry.refused_endpoint("s3") is None
    finally:
        for server in started:
            server.close()
    assert started  # (the first try was refused, then it paused)


def test_a_host_that_does_not_resolve_is_refused(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://no-such-host.invalid:9000")
    resolve = socket.getaddrinfo

    def no_such_host(host, *args, **kwargs):
        # (As a resolver answers NXDOMAIN; some resolvers answer .invalid names with an address.)
        if host == "no-such-host.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    assert isinstance(retry.refused_endpoint("s3"), socket.gaierror)


@pytest.mark.parametrize("proxy", PROXIES)
def test_through_a_proxy_nothing_is_probed(monkeypatch, proxy):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv(proxy, "http://127.0.0.1:3128")
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed through a proxy"))
    assert retry.refused_endpoint("s3") is None


def test_no_endpoint_set_or_another_protocol_probes_nothing(monkeypatch):
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed"))
    assert retry.refused_endpoint("s3") is None  # AWS's own endpoint
    assert retry.refused_endpoint("gs") is None  # Google's own
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    assert retry.refused_endpoint("file") is None
    assert retry.refused_endpoint("memory") is None


def test_a_try_that_times_out_decides_nothing(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://10.255.255.1:4443")

    def timing_out(*args, **kwargs):
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", timing_out)
    assert retry.refused_endpoint("gs") is None


@pytest.mark.parametrize(
    ("endpoint", "address"),
    [
        ("http://127.0.0.1:9000", ("127.0.0.1", 9000)),
        ("http://minio:9000/", ("minio", 9000)),
        ("https://storage.example.org", ("storage.example.org", 443)),
        ("http://storage.example.org/path", ("storage.example.org", 80)),
        ("localhost:4443", ("localhost", 4443)),
        ("http://[::1]:8333", ("::1", 8333)),
        ("http://host:notaport", None),
        ("ftp://host:21", None),
        ("http://", None),
    ],
)
def test_endpoints_are_read_as_host_and_port(endpoint, address):
    assert retry._host_and_port(endpoint) == address


def test_the_run_start_check_names_the_setting_without_the_clients_retries(monkeypatch):
    """Through the store, as a run's first check calls it: one StoreError naming the setting,
    and the client (whose own retries took ~30 s) is never asked."""
    port = free_port()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()
    try:
        store = open_store("gs://tests/p")
        asked = []
        monkeypatch.setattr(store, "_bucket_exists", lambda bucket: asked.append(bucket) or True)
        with pytest.raises(StoreError) as raised:
            store.check_reachable("gs://tests/p")
    finally:
        gcsfs.GCSFileSystem.clear_instance_cache()
    message = str(raised.value)
    assert f"cannot connect to the GCS server at http://127.0.0.1:{port} (STORAGE_EMULATOR_HOST)" in message
    assert "bucket 'tests'" in message
    assert "ConnectionRefusedError" in message and "fix STORAGE_EMULATOR_HOST" in message
    assert asked == []


def test_a_reachable_endpoint_goes_on_to_the_bucket_check(monkeypatch, listening):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{listening}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    try:
        store = open_store("s3://tests/p")
        asked = []
        monkeypatch.setattr(store, "_bucket_exists", lambda bucket: asked.append(bucket) or True)
        store.check_reachable("s3://tests/p")
        store.check_reachable("s3://tests/p")  # (once per store)
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    assert asked == ["tests"]
