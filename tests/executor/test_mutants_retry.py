"""executor/retry.py in this process: which errors are transient or permanent, the one-line
messages, the backoff and `call`'s loop.

The store's fault tests (test_store_faults.py) drive the same code through real S3 and GCS
servers behind a fault proxy; they are slow, so mutation runs leave them out and these tests
pin each rule and message directly (stand-in exception classes named as the clients name
theirs: the rules match by class name, so no client library is needed here).
"""

from __future__ import annotations

import logging

import pytest

from executor import retry
from executor.retry import (
    RetryPolicy,
    bucket_of,
    call,
    is_transient,
    permanent_kind,
    permanent_message,
    status_and_code,
    unreachable,
    unreachable_message,
)


def named(name: str, base: type = Exception) -> type:
    return type(name, (base,), {})


class ClientError(Exception):
    """botocore's shape: a `response` dict."""

    def __init__(self, status=None, code=None, message="boom"):
        super().__init__(message)
        self.response = {"ResponseMetadata": {"HTTPStatusCode": status}, "Error": {"Code": code}}


HttpError = type("HttpError", (Exception,), {"__init__": lambda self, code: setattr(self, "code", code)})
"""gcsfs's shape: a `code` attribute."""


class ResponseError(Exception):
    """aiohttp's shape: a `status` attribute."""

    def __init__(self, status):
        super().__init__(f"status {status}")
        self.status = status


def caused(outer: BaseException, inner: BaseException, implicit: bool = False) -> BaseException:
    if implicit:
        outer.__context__ = inner
    else:
        outer.__cause__ = inner
    return outer


# -- status_and_code -----------------------------------------------------------------------


def test_status_and_code_of_each_client_shape():
    assert status_and_code(ClientError(503, "SlowDown")) == (503, "SlowDown")
    assert status_and_code(ClientError()) == (None, None)
    bare = Exception()
    bare.response = {}
    assert status_and_code(bare) == (None, None)
    assert status_and_code(HttpError(429)) == (429, None)
    assert status_and_code(HttpError("404")) == (404, None)
    assert status_and_code(HttpError("notFound")) == (None, "notFound")
    other = named("OtherError")()
    other.code = 500  # a `code` on a class that is not gcsfs's HttpError means nothing
    assert status_and_code(other) == (None, None)
    assert status_and_code(ResponseError(502)) == (502, None)
    not_int = Exception()
    not_int.status = "502"
    assert status_and_code(not_int) == (None, None)
    assert status_and_code(ValueError("x")) == (None, None)


# -- is_transient --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        ConnectionResetError("reset"),
        TimeoutError("slow"),
        named("ReadTimeoutError")(),
        named("ServerDisconnectedError")(),
        named("RemoteDisconnected")(),
        named("FSTimeoutError")(),
        ClientError(500, "InternalError"),
        ClientError(None, "SlowDown"),
        ClientError(None, "OperationAborted"),
        ClientError(429, None),
        ClientError(509, None),
        HttpError(408),
        HttpError(504),
        ResponseError(502),
        caused(RuntimeError("wrapped"), ClientError(503, None)),
        caused(RuntimeError("wrapped"), ConnectionAbortedError(), implicit=True),
    ],
    ids=lambda error: type(error).__name__,
)
def test_transient_errors(error):
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad"),
        FileNotFoundError("gone"),
        ClientError(404, "NoSuchKey"),
        ClientError(412, "PreconditionFailed"),
        ClientError(400, None),
        HttpError(404),
        ResponseError(501),
        ClientError(403, "AccessDenied"),  # permanent: never retried
        ClientError(None, "NoSuchBucket"),
        named("NoCredentialsError")(),
        # an HTTP answer that is neither ends the search: a transient cause under it is not looked at
        caused(ClientError(404, None), ConnectionResetError()),
    ],
    ids=lambda error: f"{type(error).__name__}-{getattr(error, 'response', {}).get('Error', {}).get('Code')}",
)
def test_errors_that_are_not_transient(error):
    assert not is_transient(error)


def test_a_cause_deeper_than_eight_links_is_not_looked_at():
    error = ConnectionResetError("at the bottom")
    for _ in range(8):
        error = caused(RuntimeError("wrapper"), error)
    assert not is_transient(error)
    assert is_transient(error.__cause__)  # seven wrappers and the reset: eight links


# -- permanent_kind ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (named("NoCredentialsError")(), "credentials"),
        (named("PartialCredentialsError")(), "credentials"),
        (named("DefaultCredentialsError")(), "credentials"),
        (ClientError(None, "NoSuchBucket"), "bucket"),
        (ClientError(None, "InvalidAccessKeyId"), "credentials"),
        (ClientError(None, "SignatureDoesNotMatch"), "credentials"),
        (ClientError(None, "401"), "credentials"),
        (ClientError(401, None), "credentials"),
        (ClientError(403, None), "credentials"),
        (HttpError(403), "credentials"),
        (PermissionError("no"), "credentials"),
        (Exception("Forbidden: not yours"), "credentials"),
        (Exception("not Forbidden: at the start"), None),
        (caused(RuntimeError("wrapped"), ClientError(None, "NoSuchBucket")), "bucket"),
        (ClientError(404, "NoSuchKey"), None),
        (ConnectionResetError(), None),
    ],
)
def test_permanent_kind(error, kind):
    assert permanent_kind(error) == kind


# -- unreachable and the messages ----------------------------------------------------------


def test_unreachable_means_no_connection_was_made():
    assert unreachable(named("EndpointConnectionError")())
    assert unreachable(caused(RuntimeError("x"), ConnectionRefusedError()))
    assert unreachable(named("gaierror", OSError)())
    assert not unreachable(ConnectionResetError())  # a connection was made, then lost
    assert not unreachable(ClientError(503, None))


def test_bucket_of():
    assert bucket_of("s3://bucket/key/deeper") == "bucket"
    assert bucket_of("gs://bucket") == "bucket"
    assert bucket_of("bucket/key") == "bucket"


@pytest.fixture
def no_endpoints(monkeypatch):
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_unreachable_messages(no_endpoints):
    error = ConnectionRefusedError("refused\nsecond line")
    assert unreachable_message("s3", "s3://b/k", error) == (
        "cannot connect to S3 for bucket 'b' (ConnectionRefusedError: refused): check the network, "
        "or set AWS_ENDPOINT_URL"
    )
    assert unreachable_message("gs", "gs://b/k", error) == (
        "cannot connect to GCS for bucket 'b' (ConnectionRefusedError: refused): check the network"
    )
    no_endpoints.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    assert unreachable_message("s3a", "s3a://b/k", error) == (
        "cannot connect to the S3 server at http://127.0.0.1:1 (AWS_ENDPOINT_URL) for bucket 'b' "
        "(ConnectionRefusedError: refused): start it, or fix AWS_ENDPOINT_URL"
    )
    no_endpoints.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:2")  # the S3-only one wins
    assert "at http://127.0.0.1:2 (AWS_ENDPOINT_URL)" in unreachable_message("s3", "s3://b", error)
    no_endpoints.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:3")
    assert unreachable_message("gs", "gs://b/k", Exception("")) == (
        "cannot connect to the GCS server at http://127.0.0.1:3 (STORAGE_EMULATOR_HOST) for bucket 'b' "
        "(Exception: no message): start it, or fix STORAGE_EMULATOR_HOST"
    )


def test_permanent_messages_on_s3(no_endpoints):
    error = ClientError(None, "NoSuchBucket", message="The bucket does not exist\nmore")
    assert permanent_message("bucket", "s3", "s3://b/k", error) == (
        "the S3 bucket 'b' on AWS (set AWS_ENDPOINT_URL for another server) does not exist "
        "(ClientError: The bucket does not exist): create it, or fix the prefix (--prefix / MARIN_PREFIX) "
        "or AWS_ENDPOINT_URL"
    )
    assert permanent_message("credentials", "s3", "s3://b/k", None) == (
        "S3 refused the credentials for bucket 'b' on AWS (set AWS_ENDPOINT_URL for another server): "
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) to a key allowed to read and write it"
    )
    no_endpoints.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert permanent_message("bucket", "s3a", "s3a://b", None) == (
        "the S3 bucket 'b' at http://127.0.0.1:9 (AWS_ENDPOINT_URL) does not exist: create it, or fix the "
        "prefix (--prefix / MARIN_PREFIX) or AWS_ENDPOINT_URL"
    )


def test_permanent_messages_on_gcs(no_endpoints):
    assert permanent_message("bucket", "gs", "gs://b/k", None) == (
        "the GCS bucket 'b' does not exist: create it, or fix the prefix (--prefix / MARIN_PREFIX) "
        "or STORAGE_EMULATOR_HOST for an emulator"
    )
    assert permanent_message("credentials", "gcs", "gcs://b/k", HttpError(403)) == (
        "GCS refused the credentials for bucket 'b' (HttpError: 403): set "
        "GOOGLE_APPLICATION_CREDENTIALS to a service account key allowed to read and write it "
        "(or run `gcloud auth application-default login`)"
    )
    no_endpoints.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443")
    assert permanent_message("bucket", "gs", "gs://b/k", None) == (
        "the GCS bucket 'b' at http://127.0.0.1:4443 (STORAGE_EMULATOR_HOST) does not exist: create it, "
        "or fix the prefix (--prefix / MARIN_PREFIX)"
    )
    assert permanent_message("credentials", "gs", "gs://b", None).startswith(
        "GCS refused the credentials for bucket 'b' at http://127.0.0.1:4443 (STORAGE_EMULATOR_HOST): set "
    )


# -- the policy ----------------------------------------------------------------------------


def test_backoff_doubles_from_the_first_wait_up_to_the_cap_with_jitter(monkeypatch):
    policy = RetryPolicy(first_wait_s=0.2, max_wait_s=1.0)
    monkeypatch.setattr(retry.random, "uniform", lambda low, high: high)
    assert [policy.wait_before(n) for n in (1, 2, 3, 4, 5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    monkeypatch.setattr(retry.random, "uniform", lambda low, high: low)
    assert policy.wait_before(2) == pytest.approx(0.2)
    seen = []
    monkeypatch.setattr(retry.random, "uniform", lambda low, high: seen.append((low, high)) or 1.0)
    policy.wait_before(1)
    assert seen == [(0.5, 1.0)]


def test_policy_defaults_and_settings_from_the_environment(monkeypatch):
    monkeypatch.delenv(retry.ATTEMPTS_ENV, raising=False)
    monkeypatch.delenv(retry.TOTAL_WAIT_ENV, raising=False)
    assert RetryPolicy.from_env() == RetryPolicy(attempts=4, total_wait_s=60.0)
    assert (RetryPolicy().first_wait_s, RetryPolicy().max_wait_s) == (0.2, 10.0)
    monkeypatch.setenv(retry.ATTEMPTS_ENV, "")
    monkeypatch.setenv(retry.TOTAL_WAIT_ENV, "")
    assert RetryPolicy.from_env() == RetryPolicy(attempts=4, total_wait_s=60.0)
    monkeypatch.setenv(retry.ATTEMPTS_ENV, "1")
    monkeypatch.setenv(retry.TOTAL_WAIT_ENV, "0")
    assert RetryPolicy.from_env() == RetryPolicy(attempts=1, total_wait_s=0.0)
    monkeypatch.setenv(retry.TOTAL_WAIT_ENV, "2.5")
    assert RetryPolicy.from_env().total_wait_s == 2.5
    assert retry.ATTEMPTS_ENV == "MARIN_STORAGE_ATTEMPTS" and retry.TOTAL_WAIT_ENV == "MARIN_STORAGE_RETRY_S"


@pytest.mark.parametrize(
    ("attempts", "total", "message"),
    [
        ("0", "1", "$MARIN_STORAGE_ATTEMPTS must be at least 1 and $MARIN_STORAGE_RETRY_S at least 0"),
        ("2", "-1", "$MARIN_STORAGE_ATTEMPTS must be at least 1 and $MARIN_STORAGE_RETRY_S at least 0"),
        ("two", "1", "$MARIN_STORAGE_ATTEMPTS must be a number, got 'two'"),
        ("2.5", "1", "$MARIN_STORAGE_ATTEMPTS must be a number, got '2.5'"),
        ("2", "soon", "$MARIN_STORAGE_RETRY_S must be a number, got 'soon'"),
    ],
)
def test_bad_settings_are_refused_naming_the_variable(monkeypatch, attempts, total, message):
    monkeypatch.setenv(retry.ATTEMPTS_ENV, attempts)
    monkeypatch.setenv(retry.TOTAL_WAIT_ENV, total)
    with pytest.raises(ValueError) as refused:
        RetryPolicy.from_env()
    assert str(refused.value) == message


# -- call ----------------------------------------------------------------------------------


class Flaky:
    """Fails with the given errors in turn, then returns 'ok'."""

    def __init__(self, *errors):
        self.errors = list(errors)
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def fixed_waits(monkeypatch, wait: float = 0.5) -> None:
    monkeypatch.setattr(RetryPolicy, "wait_before", lambda self, retry: wait * retry)


def test_call_returns_at_once_when_nothing_fails():
    fn, sleeps = Flaky(), []
    assert call("read", "s3://b/k", fn, 1, key=2, policy=RetryPolicy(), sleep=sleeps.append) == "ok"
    assert fn.calls == [((1,), {"key": 2})] and sleeps == []


def test_call_retries_transient_errors_logging_each_retry(monkeypatch, caplog):
    fixed_waits(monkeypatch)
    fn, sleeps = Flaky(ConnectionResetError("reset\ndetail"), ClientError(503, "SlowDown")), []
    with caplog.at_level(logging.WARNING, logger="executor.retry"):
        assert call("write", "s3://b/k", fn, policy=RetryPolicy(attempts=3), sleep=sleeps.append) == "ok"
    assert len(fn.calls) == 3 and sleeps == [0.5, 1.0]
    assert [record.getMessage() for record in caplog.records] == [
        "storage: write s3://b/k failed (ConnectionResetError: reset); retry 1 of 2 in 0.50 s",
        "storage: write s3://b/k failed (ClientError: boom); retry 2 of 2 in 1.00 s",
    ]
    assert all(record.levelno == logging.WARNING for record in caplog.records)


def test_call_gives_up_after_the_last_attempt_with_the_last_error(monkeypatch):
    fixed_waits(monkeypatch)
    last = ConnectionResetError("third")
    fn, sleeps = Flaky(ConnectionResetError("first"), ConnectionResetError("second"), last), []
    with pytest.raises(ConnectionResetError) as raised:
        call("read", "p", fn, policy=RetryPolicy(attempts=3), sleep=sleeps.append)
    assert raised.value is last and len(fn.calls) == 3 and sleeps == [0.5, 1.0]


def test_one_attempt_means_no_retry():
    fn = Flaky(ConnectionResetError())
    with pytest.raises(ConnectionResetError):
        call("read", "p", fn, policy=RetryPolicy(attempts=1), sleep=pytest.fail)
    assert len(fn.calls) == 1


def test_call_raises_a_permanent_or_plain_error_at_once():
    for error in (ClientError(404, "NoSuchKey"), ClientError(403, "AccessDenied"), ValueError("bug")):
        fn = Flaky(error)
        with pytest.raises(type(error)) as raised:
            call("read", "p", fn, policy=RetryPolicy(attempts=5), sleep=pytest.fail)
        assert raised.value is error and len(fn.calls) == 1


def test_call_stops_before_a_wait_past_the_total(monkeypatch):
    fixed_waits(monkeypatch)  # waits 0.5, 1.0, 1.5, ...: 0.5 + 1.0 = 1.5 fits in 1.5, 3.0 does not
    fn, sleeps = Flaky(*[ConnectionResetError(str(n)) for n in range(5)]), []
    with pytest.raises(ConnectionResetError) as raised:
        call("read", "p", fn, policy=RetryPolicy(attempts=10, total_wait_s=1.5), sleep=sleeps.append)
    assert sleeps == [0.5, 1.0] and str(raised.value) == "2" and len(fn.calls) == 3


def test_an_unreachable_server_is_retried_only_when_asked(monkeypatch):
    fixed_waits(monkeypatch)
    refused = named("EndpointConnectionError", ConnectionError)
    fn = Flaky(refused("nothing listens"))
    with pytest.raises(refused):
        call("read", "p", fn, policy=RetryPolicy(), sleep=pytest.fail, retry_unreachable=False)
    assert len(fn.calls) == 1
    fn, sleeps = Flaky(refused("nothing listens")), []
    assert call("read", "p", fn, policy=RetryPolicy(), sleep=sleeps.append) == "ok"
    assert sleeps == [0.5]


TRANSIENT_CODES = [
    "SlowDown",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "TooManyRequests",
    "BandwidthLimitExceeded",
    "OperationAborted",
]
TRANSIENT_NAMES = [
    "HTTPClientError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "EndpointConnectionError",
    "ResponseStreamingError",
    "IncompleteReadError",
    "ResponseParserError",
    "ClientPayloadError",
    "ServerDisconnectedError",
    "ClientConnectionError",
    "ClientConnectorError",
    "ClientOSError",
    "ServerTimeoutError",
    "ClientConnectionResetError",
    "ChunkedEncodingError",
    "ProxyError",
    "FSTimeoutError",
    "IncompleteRead",
    "RemoteDisconnected",
]
REFUSED_CODES = [
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
    "AccountProblem",
    "403",
    "401",
]
UNREACHABLE_NAMES = [
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ClientConnectorError",
    "ClientConnectorDNSError",
    "ConnectionRefusedError",
    "gaierror",
]


def test_every_listed_service_code_status_and_client_error_is_classified():
    """Written out here, not read from the module: dropping one from its list must fail."""
    for code in TRANSIENT_CODES:
        assert is_transient(ClientError(None, code)), code
    for status in (408, 429, 500, 502, 503, 504, 509):
        assert is_transient(ClientError(status, None)), status
    for status in (400, 404, 409, 412, 501, 505):
        assert not is_transient(ClientError(status, None)), status
    for name in TRANSIENT_NAMES:
        assert is_transient(named(name)()), name
    for code in REFUSED_CODES:
        assert permanent_kind(ClientError(None, code)) == "credentials", code
        assert not is_transient(ClientError(503, code)), code
    for name in UNREACHABLE_NAMES:
        assert unreachable(named(name)()), name
    assert not unreachable(named("ReadTimeoutError")())


def test_a_message_that_merely_starts_with_forbidden_is_no_refusal():
    assert permanent_kind(Exception("Forbidden fruit")) is None
    assert permanent_kind(Exception("Forbidden:")) == "credentials"


def test_the_total_wait_counts_every_wait_so_far(monkeypatch):
    monkeypatch.setattr(RetryPolicy, "wait_before", lambda self, retry: 0.5)
    fn, sleeps = Flaky(*[ConnectionResetError(str(n)) for n in range(9)]), []
    with pytest.raises(ConnectionResetError):
        call("read", "p", fn, policy=RetryPolicy(attempts=10, total_wait_s=1.2), sleep=sleeps.append)
    assert sleeps == [0.5, 0.5]  # a third would make 1.5 s in all
