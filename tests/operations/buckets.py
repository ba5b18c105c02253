"""A fresh prefix on a real bucket (S3 on SeaweedFS, GCS on fake-gcs-server), given to the code
the way a user gives it: by the standard environment variables alone.

`bucket` (parametrized "s3" and "gs"; narrow it with
`@pytest.mark.parametrize("bucket", ["s3"], indirect=True)`) and `bucket_env` (its variables,
and only those storage variables, in this process's environment) are fixtures, provided to
every test under tests/ by tests/operations/conftest.py; `child_env` is the environment for a
child process.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# Storage settings a developer's shell may hold: the tests give their own or none.
STORAGE_VARIABLES = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "STORAGE_EMULATOR_HOST",
    "TENSORSTORE_GCS_HTTP_URL",
    "MARIN_PREFIX",
)
# What W&B keeps per user whatever the output path (its service's logs, artifact staging).
WANDB_HOME_STATE = (".cache/wandb", ".local/share/wandb", ".config/wandb")


@dataclass(frozen=True)
class Bucket:
    prefix: str
    """A fresh prefix on the server: s3://tests/<random> or gs://tests/<random>."""
    env: dict[str, str]
    """The standard variables that point clients at the server."""
    fs: Any
    """An fsspec filesystem on the server that caches no listings."""

    def files(self, under: str = "") -> dict[str, int]:
        """Every object under the prefix (or `under` below it): relative path -> size."""
        root = self.prefix.split("://", 1)[1] + (f"/{under}" if under else "")
        self.fs.invalidate_cache()
        return {path[len(root) + 1 :]: info["size"] for path, info in self.fs.find(root, detail=True).items()}


def new_bucket(request: pytest.FixtureRequest, kind: str) -> Bucket:
    """A fresh prefix on the session's S3 ("s3") or GCS ("gs") server."""
    if kind == "s3":
        server = request.getfixturevalue("s3_server")
        env = {
            "AWS_ENDPOINT_URL": server.endpoint_url,
            "AWS_ACCESS_KEY_ID": server.key,
            "AWS_SECRET_ACCESS_KEY": server.secret,
            "AWS_REGION": "us-east-1",
        }
    else:
        server = request.getfixturevalue("gcs_server")
        env = {"STORAGE_EMULATOR_HOST": server.endpoint_url}
    return Bucket(server.new_prefix(), env, server.filesystem())


@contextlib.contextmanager
def storage_environment(monkeypatch: pytest.MonkeyPatch, *buckets: Bucket) -> Iterator[None]:
    """These buckets' variables (and only those storage variables) in this process's environment.

    fsspec keeps one filesystem per protocol and options, whatever the environment was when it
    was made: one made for another test's server settings would be reused here, and ours after
    this test. They are dropped before and after. What `operations.buckets.configure` sets is
    restored afterwards (by `monkeypatch`, at the end of the test).
    """
    import fsspec

    for name in STORAGE_VARIABLES:
        # Set, then delete: restored as it is now even if `configure` sets it meanwhile.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for bucket in buckets:
        for name, value in bucket.env.items():
            monkeypatch.setenv(name, value)
    for protocol in ("gs", "gcs"):
        monkeypatch.setitem(fsspec.config.conf, protocol, dict(fsspec.config.conf.get(protocol, {})))
    forget_cached_filesystems()
    try:
        yield
    finally:
        forget_cached_filesystems()


@pytest.fixture(params=["s3", "gs"])
def bucket(request) -> Bucket:
    return new_bucket(request, request.param)


@pytest.fixture
def bucket_env(bucket: Bucket, monkeypatch) -> Iterator[Bucket]:
    """The bucket's variables (and only those storage variables) in this process's environment."""
    with storage_environment(monkeypatch, bucket):
        yield bucket


def forget_cached_filesystems() -> None:
    import gcsfs
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    gcsfs.GCSFileSystem.clear_instance_cache()


def child_env(bucket: Bucket, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in STORAGE_VARIABLES}
    # Not WANDB_SERVICE: children would share this process's W&B service (see test_train).
    env.pop("WANDB_SERVICE", None)
    env.update(bucket.env, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), **extra)
    return env
