"""Retries for object storage: which errors are transient, how long to back off, and the
one-line errors for the ones that are not.

Object stores fail now and then in ways that go away: a connection reset, a timeout, HTTP
429 or 5xx ("SlowDown", "ServiceUnavailable"). The client libraries retry some of that
themselves before an error reaches us:

- S3 (botocore, under s3fs): 5 attempts ("legacy" retry mode) on connection errors, 429,
  500/502/503/504/509 and throttling codes, backoff `random() * 2**n` seconds; s3fs then
  retries connection errors, timeouts and `SlowDown` 5 more times (0.1 s x 1.7**n).
  `AWS_MAX_ATTEMPTS` / `AWS_RETRY_MODE` change botocore's part.
- GCS (gcsfs): 6 attempts on connection errors, 408, 429, 5xx, backoff `2**n + random()`
  seconds (1 to 32 s).

Every operation of the executor's `Store` on an object store goes through `call` below,
which retries what is still transient after the client gave up, with bounded exponential
backoff and jitter, and logs one WARNING line per retry naming the operation and the path.
The clients' own retries are logged too, as WARNING lines on this module's logger
(`observe_client_retries`): a run that met faults says so in its log.

Settings (environment, read once per store):

- `MARIN_STORAGE_ATTEMPTS` (default 4): attempts per store operation, the first included;
  1 turns our layer off (the clients still retry).
- `MARIN_STORAGE_RETRY_S` (default 60): the most seconds one operation waits between its
  attempts, in total; no retry starts past it.

A permanent error -- a missing bucket, refused or missing credentials -- is never retried:
`permanent_message` words it as one line naming the bucket and the setting to fix, which
the store raises as a `StoreError`.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from typing import TypeVar

from executor.records import dataclass

logger = logging.getLogger(__name__)

T = TypeVar("T")

ATTEMPTS_ENV = "MARIN_STORAGE_ATTEMPTS"
TOTAL_WAIT_ENV = "MARIN_STORAGE_RETRY_S"

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504, 509})
_TRANSIENT_CODES = frozenset(
    {
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
    }
)
_MISSING_BUCKET_CODES = frozenset({"NoSuchBucket"})
_REFUSED_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "AllAccessDisabled",
        "AccountProblem",
        "403",
        "401",
    }
)
_TRANSIENT_NAMES = frozenset(
    {
        # botocore: connection and protocol failures (the HTTPClientError family)
        "HTTPClientError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "EndpointConnectionError",
        "ResponseStreamingError",
        "IncompleteReadError",
        "ResponseParserError",
        # aiohttp
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ClientConnectionError",
        "ClientConnectorError",
        "ClientOSError",
        "ServerTimeoutError",
        "ClientConnectionResetError",
        # requests (gcsfs raises ProxyError for 502), fsspec, http.client
        "ChunkedEncodingError",
        "ProxyError",
        "FSTimeoutError",
        "IncompleteRead",
        "RemoteDisconnected",
    }
)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter for one store operation."""

    attempts: int = 4
    """Attempts in all, the first included (1: no retries)."""

    total_wait_s: float = 60.0
    """No retry starts once this many seconds were spent waiting."""

    first_wait_s: float = 0.2
    """The first wait before jitter; each next one doubles, up to `max_wait_s`."""

    max_wait_s: float = 10.0

    def wait_before(self, retry: int) -> float:
        """Seconds to sleep before retry number `retry` (1-based): full-size backoff times
        a random factor in [0.5, 1], so clients failing together do not retry together."""
        return min(self.max_wait_s, self.first_wait_s * 2 ** (retry - 1)) * random.uniform(0.5, 1.0)

    @classmethod
    def from_env(cls) -> RetryPolicy:
        attempts = _env_number(ATTEMPTS_ENV, int, cls.attempts)
        total = _env_number(TOTAL_WAIT_ENV, float, cls.total_wait_s)
        if attempts < 1 or total < 0:
            raise ValueError(f"${ATTEMPTS_ENV} must be at least 1 and ${TOTAL_WAIT_ENV} at least 0")
        return cls(attempts=attempts, total_wait_s=total)


def _env_number(name: str, kind: type, default):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"${name} must be a number, got {raw!r}") from None


def _chain(error: BaseException):
    """`error` and its causes (explicit first, then implicit), at most 8 deep."""
    seen = 0
    while error is not None and seen < 8:
        yield error
        error = error.__cause__ or error.__context__
        seen += 1


def status_and_code(error: BaseException) -> tuple[int | None, str | None]:
    """HTTP status and service error code carried by a botocore ClientError, gcsfs
    HttpError or aiohttp ClientResponseError; (None, None) for anything else."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status, response.get("Error", {}).get("Code")
    code = getattr(error, "code", None)  # gcsfs HttpError
    if isinstance(code, (int, str)) and type(error).__name__ == "HttpError":
        try:
            return int(code), None
        except ValueError:
            return None, str(code)
    status = getattr(error, "status", None)  # aiohttp ClientResponseError
    if isinstance(status, int):
        return status, None
    return None, None


def is_transient(error: BaseException) -> bool:
    """Whether `error` (as s3fs or gcsfs raise it, after their own retries) may go away
    if the same request is made again."""
    if permanent_kind(error) is not None:
        return False
    for link in _chain(error):
        if isinstance(link, (ConnectionError, TimeoutError)):
            return True
        if type(link).__name__ in _TRANSIENT_NAMES:
            return True
        status, code = status_and_code(link)
        if status in _TRANSIENT_STATUS or code in _TRANSIENT_CODES:
            return True
        if status is not None or code is not None:
            return False  # an HTTP answer that is neither: 404, 412, 400, ...
    return False


def permanent_kind(error: BaseException) -> str | None:
    """ "bucket" (the bucket does not exist), "credentials" (refused or missing), else None."""
    for link in _chain(error):
        name = type(link).__name__
        if name in ("NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError"):
            return "credentials"
        status, code = status_and_code(link)
        if code in _MISSING_BUCKET_CODES:
            return "bucket"
        if code in _REFUSED_CODES or status in (401, 403):
            return "credentials"
        if isinstance(link, PermissionError) or str(link).startswith("Forbidden:"):
            return "credentials"  # s3fs's and gcsfs's names for 403
    return None


_UNREACHABLE_NAMES = frozenset(
    {
        "EndpointConnectionError",  # botocore: could not connect
        "ConnectTimeoutError",
        "ClientConnectorError",  # aiohttp (gcsfs): could not connect
        "ClientConnectorDNSError",
        "ConnectionRefusedError",
        "gaierror",  # the host name does not resolve
    }
)


def unreachable(error: BaseException) -> bool:
    """Whether `error` means no connection could be made at all (nothing listens there, the
    name does not resolve): the request never reached a server."""
    return any(type(link).__name__ in _UNREACHABLE_NAMES for link in _chain(error))


def unreachable_message(protocol: str, path: str, error: BaseException) -> str:
    """One line naming the endpoint, the bucket and the setting to fix, for `unreachable`."""
    bucket = bucket_of(path)
    why = f" ({type(error).__name__}: {_first_line(error)})"
    if protocol in ("s3", "s3a"):
        endpoint = _s3_endpoint()
        if endpoint:
            return (
                f"cannot connect to the S3 server at {endpoint} (AWS_ENDPOINT_URL) for bucket {bucket!r}"
                f"{why}: start it, or fix AWS_ENDPOINT_URL"
            )
        return f"cannot connect to S3 for bucket {bucket!r}{why}: check the network, or set AWS_ENDPOINT_URL"
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        return (
            f"cannot connect to the GCS server at {emulator} (STORAGE_EMULATOR_HOST) for bucket "
            f"{bucket!r}{why}: start it, or fix STORAGE_EMULATOR_HOST"
        )
    return f"cannot connect to GCS for bucket {bucket!r}{why}: check the network"


PROBE_ATTEMPTS = 3
"""Connections `refused_endpoint` tries before it calls the endpoint refused."""

PROBE_PAUSE_S = 0.5
"""Seconds between those tries (a server that is just starting gets about a second)."""

PROBE_TIMEOUT_S = 2.0
"""Seconds one try waits to connect; a try that times out decides nothing (the clients' own
retries then do, as before)."""

_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def refused_endpoint(protocol: str) -> BaseException | None:
    """The error of connecting to the endpoint the user set for `protocol` (`AWS_ENDPOINT_URL`,
    `STORAGE_EMULATOR_HOST`) when every one of PROBE_ATTEMPTS connections was refused or its
    host does not resolve; None when one connected, nothing decided, or no endpoint is set.

    A run checks its bucket before it reads anything. Against an endpoint nobody listens on --
    a typo, a server not started -- that check waited out the client's own retries first (gcsfs:
    six tries, ~30 s; botocore: five, ~9 s) before saying so. A plain TCP connection answers in
    about a second. Only a set endpoint is probed (AWS's and Google's own are not), and not
    through a proxy: with a proxy variable set, a direct connection proves nothing.
    """
    if protocol in ("s3", "s3a"):
        endpoint = _s3_endpoint()
    elif protocol in ("gs", "gcs"):
        endpoint = os.environ.get("STORAGE_EMULATOR_HOST")
    else:
        return None
    if not endpoint or any(os.environ.get(name) or os.environ.get(name.lower()) for name in _PROXY_VARIABLES):
        return None
    address = _host_and_port(endpoint)
    if address is None:
        return None
    import socket

    refused: BaseException | None = None
    for attempt in range(PROBE_ATTEMPTS):
        if attempt:
            time.sleep(PROBE_PAUSE_S)
        try:
            socket.create_connection(address, timeout=PROBE_TIMEOUT_S).close()
            return None
        except (ConnectionRefusedError, socket.gaierror) as error:
            refused = error
        except OSError:  # a timeout, no route: not a plain "nobody is there"; the client decides
            return None
    return refused


def _host_and_port(endpoint: str) -> tuple[str, int] | None:
    """(host, port) of `http://host:port/...`, `https://host`, or `host:port` (how
    STORAGE_EMULATOR_HOST is often written); None when it cannot be read as one."""
    from urllib.parse import urlsplit

    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    try:
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.scheme not in ("http", "https"):
        return None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _s3_endpoint() -> str | None:
    """The endpoint the AWS SDKs use: `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL`."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def bucket_of(path: str) -> str:
    """`s3://bucket/key` -> `bucket`."""
    return path.split("://", 1)[-1].split("/", 1)[0]


def permanent_message(kind: str, protocol: str, path: str, error: BaseException | None) -> str:
    """One line naming the bucket and the setting to fix, for a `permanent_kind`."""
    bucket = bucket_of(path)
    why = "" if error is None else f" ({type(error).__name__}: {_first_line(error)})"
    if protocol in ("s3", "s3a"):
        endpoint = _s3_endpoint()
        where = (
            f" at {endpoint} (AWS_ENDPOINT_URL)"
            if endpoint
            else " on AWS (set AWS_ENDPOINT_URL for another server)"
        )
        if kind == "bucket":
            return (
                f"the S3 bucket {bucket!r}{where} does not exist{why}: create it, or fix the prefix "
                f"(--prefix / MARIN_PREFIX) or AWS_ENDPOINT_URL"
            )
        return (
            f"S3 refused the credentials for bucket {bucket!r}{where}{why}: set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) to a key allowed to read and write it"
        )
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    where = f" at {emulator} (STORAGE_EMULATOR_HOST)" if emulator else ""
    if kind == "bucket":
        return (
            f"the GCS bucket {bucket!r}{where} does not exist{why}: create it, or fix the prefix "
            "(--prefix / MARIN_PREFIX)" + ("" if emulator else " or STORAGE_EMULATOR_HOST for an emulator")
        )
    return (
        f"GCS refused the credentials for bucket {bucket!r}{where}{why}: set "
        "GOOGLE_APPLICATION_CREDENTIALS to a service account key allowed to read and write it "
        "(or run `gcloud auth application-default login`)"
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"


def call(
    operation: str,
    path: str,
    fn: Callable[..., T],
    *args,
    policy: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
    retry_unreachable: bool = True,
    **kwargs,
) -> T:
    """`fn(*args, **kwargs)`, again after a transient error while `policy` allows; one
    WARNING line per retry naming `operation` and `path`. The last error is raised as it
    came when the attempts or the total wait run out, or at once when it is not transient
    (or, with `retry_unreachable=False`, when no connection could be made: the client
    library has already tried that several times)."""
    waited = 0.0
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            if attempt == policy.attempts or not is_transient(error):
                raise
            if not retry_unreachable and unreachable(error):
                raise
            wait = policy.wait_before(attempt)
            if waited + wait > policy.total_wait_s:
                raise
            logger.warning(
                "storage: %s %s failed (%s: %s); retry %d of %d in %.2f s",
                operation,
                path,
                type(error).__name__,
                _first_line(error),
                attempt,
                policy.attempts - 1,
                wait,
            )
            sleep(wait)
            waited += wait
    raise AssertionError("unreachable")  # the loop returns or raises


# -- the clients' own retries, made visible ------------------------------------------------

_HOOKED_BOTOCORE = False


def observe_client_retries(fs) -> None:
    """Log the retries the client library under `fs` makes by itself, as WARNING lines on
    this module's logger, in this process and in processes forked from it (data steps'
    workers): botocore's through a handler on every S3 client's `request-created` event
    (named in botocore's list of built-in handlers, so every client made from now on has
    it), naming the operation, URL and attempt; s3fs's and gcsfs's by passing on their
    DEBUG records of a retry (their other DEBUG records stay hidden)."""
    global _HOOKED_BOTOCORE
    module = type(fs).__module__
    if module.startswith("s3fs"):
        _bridge_logger("s3fs", "Retryable error", "s3fs")
        if not _HOOKED_BOTOCORE:
            import botocore.handlers

            botocore.handlers.BUILTIN_HANDLERS.append(("request-created.s3", _log_botocore_retry))
            _HOOKED_BOTOCORE = True
            client = getattr(fs, "_s3", None)  # a client made before the handler was listed
            if client is not None:
                client.meta.events.register("request-created.s3", _log_botocore_retry)
    elif module.startswith("gcsfs"):
        _bridge_logger("gcsfs", "retrying after exception", "gcsfs")
        _gcsfs_refusals_fail_fast()


def _gcsfs_refusals_fail_fast() -> None:
    """gcsfs retries an HTTP 401 ("Invalid Credentials") five times, ~30 s, in case a token
    expired; google-auth already refreshes a token before each request that needs it, so a
    401 is refused credentials and fails at once here (with our one-line message). gcsfs
    also logs the final error with its traceback (`logger.exception`) before raising it to
    us: that becomes one WARNING line, since the error is reported where it is handled."""
    import gcsfs.retry

    if not getattr(gcsfs.retry.is_retriable, "_refusals_fail_fast", False):
        original = gcsfs.retry.is_retriable

        def is_retriable(exception):
            if isinstance(exception, gcsfs.retry.HttpError) and exception.code in (401, "401"):
                return False
            return original(exception)

        is_retriable._refusals_fail_fast = True
        gcsfs.retry.is_retriable = is_retriable  # looked up by name at each retry decision
    target = logging.getLogger("gcsfs")
    if not getattr(target.exception, "_one_line", False):

        def exception(msg, *args, **kwargs):
            logger.warning("storage: gcsfs: %s", str(msg) % args if args else msg)

        exception._one_line = True
        target.exception = exception


def _log_botocore_retry(request=None, operation_name=None, **_):
    attempt = getattr(request, "context", {}).get("retries", {}).get("attempt", 1)
    if attempt > 1:
        logger.warning(
            "storage: S3 %s %s: retry, attempt %d (botocore)", operation_name, request.url, attempt
        )


def _bridge_logger(name: str, marker: str, client: str) -> None:
    """Pass on the DEBUG records of a retry that logger `name` is asked to make as WARNING
    lines of ours. Its `debug` method is wrapped on that one logger object: no level
    changes, so its other DEBUG records (and its children's) stay as configured."""
    target = logging.getLogger(name)
    if getattr(target.debug, "_passes_retries_on", False):
        return
    original = target.debug

    def debug(msg, *args, **kwargs):
        if marker in str(msg):
            logger.warning("storage: %s: %s", client, str(msg) % args if args else msg)
        original(msg, *args, **kwargs)

    debug._passes_retries_on = True
    target.debug = debug
