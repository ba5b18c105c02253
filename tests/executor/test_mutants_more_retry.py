"""executor/retry.py: what the mutation sample found unpinned by the tests mutation runs select.

test_mutants_retry.py pins the AWS messages in tests whose names the runs' `-k "not s3"` drops,
so the message without an endpoint is pinned again here. The rest is the hooks that make the
client libraries' own retries visible (`observe_client_retries`), with real botocore and gcsfs
objects: the handler registered on a botocore client made before the hook was listed, its
WARNING line word for word (and no line, no error, for a first attempt or a request without
a context), gcsfs's retry DEBUG records passed on, its 401s failing at once, and its
`logger.exception` turned into one line with the arguments filled in. And `call` with a policy
of no attempts calls nothing and raises rather than returning None.
"""

from __future__ import annotations

import inspect
import logging

import pytest

from executor import retry
from executor.retry import RetryPolicy, call, permanent_message

botocore_session = pytest.importorskip("botocore.session")
gcsfs_retry = pytest.importorskip("gcsfs.retry")
import botocore.awsrequest  # noqa: E402
import botocore.handlers  # noqa: E402


def test_permanent_messages_without_an_endpoint_name_aws_and_the_setting(monkeypatch):
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    assert permanent_message("bucket", "s3", "s3://b/k", None) == (
        "the S3 bucket 'b' on AWS (set AWS_ENDPOINT_URL for another server) does not exist: create it, "
        "or fix the prefix (--prefix / MARIN_PREFIX) or AWS_ENDPOINT_URL"
    )


class _FsOnBotocore:
    """s3fs's shape for observe_client_retries: its module, and `_s3`, the client it made."""

    __module__ = "s3fs.core"

    def __init__(self, client):
        self._s3 = client


def _client():
    return botocore_session.get_session().create_client(
        "s3",
        region_name="us-east-1",
        endpoint_url="http://127.0.0.1:1",
        aws_access_key_id="key",
        aws_secret_access_key="secret",
    )


def _request(attempt=None):
    request = botocore.awsrequest.AWSRequest(method="GET", url="http://127.0.0.1:1/b/k")
    if attempt is not None:
        request.context["retries"] = {
            "attempt": attempt,
            "invocation-id": "id",
            "max": 5,
        }  # as botocore sets it
    return request


def _ours(caplog):
    return [r.getMessage() for r in caplog.records if r.name == retry.logger.name]


def test_a_client_made_before_the_hook_logs_its_retries(monkeypatch, caplog):
    monkeypatch.setattr(retry, "_HOOKED_BOTOCORE", False)
    # As before any hook: without our handler, which an earlier test in this process may have listed.
    unhooked = [h for h in botocore.handlers.BUILTIN_HANDLERS if h[1] is not retry._log_botocore_retry]
    monkeypatch.setattr(botocore.handlers, "BUILTIN_HANDLERS", unhooked)
    monkeypatch.setattr(logging.getLogger("s3fs"), "debug", logging.getLogger("s3fs").debug)
    client = _client()  # before the handler is listed
    retry.observe_client_retries(_FsOnBotocore(client))
    caplog.set_level(logging.WARNING, logger=retry.logger.name)
    client.meta.events.emit("request-created.s3.GetObject", request=_request(3), operation_name="GetObject")
    client.meta.events.emit("request-created.s3.GetObject", request=_request(1), operation_name="GetObject")
    assert _ours(caplog) == ["storage: S3 GetObject http://127.0.0.1:1/b/k: retry, attempt 3 (botocore)"]


def test_a_request_without_retry_context_is_a_first_attempt(caplog):
    caplog.set_level(logging.WARNING, logger=retry.logger.name)
    retry._log_botocore_retry(request=None, operation_name="GetObject")
    retry._log_botocore_retry(request=_request(), operation_name="GetObject")
    assert _ours(caplog) == []


def _unwrapped(is_retriable):
    while getattr(is_retriable, "_refusals_fail_fast", False):
        is_retriable = inspect.getclosurevars(is_retriable).nonlocals["original"]
    return is_retriable


@pytest.fixture
def fresh_gcsfs(monkeypatch):
    """gcsfs's logger and retry rule as gcsfs made them, restored afterwards."""
    monkeypatch.setattr(gcsfs_retry, "is_retriable", _unwrapped(gcsfs_retry.is_retriable))
    target = logging.getLogger("gcsfs")
    for attr in ("debug", "exception"):
        if attr in vars(target):
            monkeypatch.delattr(target, attr)
    yield target
    for attr in ("debug", "exception"):
        vars(target).pop(attr, None)  # then monkeypatch puts back what was there


class _FsOnGcsfs:
    __module__ = "gcsfs.core"


def test_gcsfs_retries_are_passed_on_and_its_refusals_fail_fast(fresh_gcsfs, caplog):
    retry.observe_client_retries(_FsOnGcsfs())
    caplog.set_level(logging.WARNING, logger=retry.logger.name)
    fresh_gcsfs.debug("retrying after exception: %s", "HttpError 503")
    fresh_gcsfs.debug("other detail %s", "hidden")
    fresh_gcsfs.exception("%s failed with %s", "_call", "HttpError")
    assert _ours(caplog) == [
        "storage: gcsfs: retrying after exception: HttpError 503",
        "storage: gcsfs: _call failed with HttpError",
    ]
    refused = gcsfs_retry.HttpError({"code": 401, "message": "Invalid Credentials"})
    busy = gcsfs_retry.HttpError({"code": 503, "message": "busy"})
    assert gcsfs_retry.is_retriable(refused) is False
    assert gcsfs_retry.is_retriable(busy) is True
    assert _unwrapped(gcsfs_retry.is_retriable)(refused) is True  # gcsfs alone would retry it


def test_a_policy_of_no_attempts_calls_nothing_and_raises():
    calls = []
    with pytest.raises(AssertionError, match="^unreachable$"):
        call("read", "memory://b/k", calls.append, 1, policy=RetryPolicy(attempts=0))
    assert calls == []
