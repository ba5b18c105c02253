"""Buckets for the Levanter parts: token caches, checkpoints and exports on `s3://` and `gs://`.

Levanter writes its token caches and checkpoints through tensorstore, and JAX's serializer
turns an `s3://bucket/key` or `gs://bucket/key` path into a tensorstore kvstore spec
(`{"driver": "s3" | "gcs", "bucket", "path"}`). Everything else Levanter and we write
(ledgers, metadata.json, metrics, stats) goes through fsspec (s3fs, gcsfs). The two read
their configuration differently; `configure()` makes both follow the standard variables,
so a run is pointed at any S3-compatible store or a GCS emulator by the environment alone:

- S3: fsspec (botocore) reads `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
  `AWS_SECRET_ACCESS_KEY`, `AWS_REGION` itself. Tensorstore 0.1.86 reads the credentials
  but not the endpoint: without one it goes to AWS (and, offline, waits forever).
  Worse, JAX 0.7.2's spec builder (`jax.experimental.array_serialization.tensorstore_impl.
  get_tensorstore_spec`, which both Levanter's cache and its checkpointer call) loses the
  scheme of `s3://` paths and gives tensorstore's local file driver a path `s3:/bucket/key`:
  the data lands in a folder named `s3:` under the working directory, without an error.
  `configure()` wraps that builder: `s3://` paths get an s3 kvstore, with `endpoint` from
  `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`, `aws_region` from `AWS_REGION` /
  `AWS_DEFAULT_REGION`, and, when `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` are
  set, credentials of type "environment" (tensorstore's default chain reads the same
  variables but first logs an error for every missing ~/.aws file).
- GCS: gcsfs reads `STORAGE_EMULATOR_HOST`; tensorstore reads `TENSORSTORE_GCS_HTTP_URL`.
  `configure()` sets the latter from the former when only the former is set, and tells
  fsspec to connect to an emulator anonymously (gcsfs would first look for the machine's
  real credentials and its metadata server, as the executor's store also avoids).

The wrap is process-wide and lives in the process that runs the step (the executor's
driver for tokenize, the step's own subprocess or Ray task for train and eval). Levanter's
Ray cache builder runs its tokenize tasks in other Ray workers, which do not have it:
`ray_builder_problem` says so for any S3 output (the same JAX builder, unwrapped there,
would write it to local `s3:` folders on the workers).

What cannot be written to a bucket directly is written to a local temporary directory
under the system's temp dir (`tempfile.gettempdir()`, never the working directory) and
uploaded: `local_staging` (Levanter's log file, W&B's offline files, the HF reference
config). Levanter itself stages its HF export the same way. Inputs that must be read from
local disk -- a tokenizer on a bucket, which transformers loads from a directory -- are
copied by `local_input_copy` into a temporary directory that is removed when the step ends
(`using_input_copies`) (Levanter's own loader would keep them in the Hugging Face hub
cache under the home directory).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import fsspec

logger = logging.getLogger(__name__)

BUCKET_PROTOCOLS = ("s3", "s3a", "gs", "gcs")
STAGING_PREFIX = "marin-staging-"
INPUTS_PREFIX = "marin-inputs-"

_inputs_lock = threading.Lock()
_inputs_root: str | None = None
_input_copies: dict[str, str] = {}
_input_users = 0  # blocks inside `using_input_copies` now, in any thread of this process


def protocol(path: str) -> str | None:
    """The URL scheme of `path` ("s3", "gs", ...), None for a local path or file://."""
    scheme, _ = fsspec.core.split_protocol(path)
    return None if scheme in (None, "file", "local") else scheme


def is_bucket(path: str) -> bool:
    return protocol(path) in BUCKET_PROTOCOLS


def s3_endpoint() -> str | None:
    """The S3 endpoint the AWS SDKs would use: `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL`."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_kvstore_options() -> dict[str, Any]:
    """Tensorstore s3 kvstore members from the standard AWS variables (empty on plain AWS without them)."""
    options: dict[str, Any] = {}
    endpoint = s3_endpoint()
    if endpoint:
        options["endpoint"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["aws_region"] = region
    if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        options["aws_credentials"] = {"type": "environment"}
    return options


def _gcs_emulator() -> str | None:
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    if not host or host == "default":
        return None
    return host if host.startswith(("http://", "https://")) else f"http://{host}"


def configure() -> None:
    """Make tensorstore (Levanter's caches and checkpoints) and fsspec follow the standard
    storage variables in this process. Idempotent; reads the environment at each call."""
    emulator = _gcs_emulator()
    if emulator:
        os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", emulator)
        for name in ("gs", "gcs"):
            fsspec.config.conf.setdefault(name, {}).setdefault("token", "anon")
    _wrap_s3_spec_builder()


def _wrap_s3_spec_builder() -> None:
    import functools

    from jax.experimental.array_serialization import serialization, tensorstore_impl

    original = tensorstore_impl.get_tensorstore_spec
    if getattr(original, "_marin_wrapped", False):
        return

    @functools.wraps(original)
    def get_tensorstore_spec(ckpt_path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        path = str(ckpt_path)
        scheme = protocol(path)
        if scheme not in ("s3", "s3a"):
            return original(ckpt_path, *args, **kwargs)
        # JAX 0.7.2 normalises "s3://b/k" to "s3:/b/k" and restores only schemes matching
        # [a-z]+, so "s3" falls through to the local file driver (a folder named "s3:").
        # Build the spec for the same path on gs:// (same layout, OCDBT and per-process
        # paths included), then make its bucket kvstore an s3 one.
        spec = original("gs://" + path.split("://", 1)[1], *args, **kwargs)
        _to_s3(spec)
        return spec

    get_tensorstore_spec._marin_wrapped = True  # type: ignore[attr-defined]
    tensorstore_impl.get_tensorstore_spec = get_tensorstore_spec
    # The serializer (Levanter's checkpoints, and its caches through `ser.get_tensorstore_spec`)
    # holds its own partial of the original.
    serialization.get_tensorstore_spec = functools.partial(get_tensorstore_spec, driver="zarr", ocdbt=False)


def _to_s3(spec: dict[str, Any]) -> None:
    """Turn the gcs bucket kvstore inside a tensorstore spec (at any depth) into an s3 one."""
    for value in spec.values():
        if isinstance(value, dict):
            if value.get("driver") == "gcs":
                value["driver"] = "s3"
                value.update(s3_kvstore_options())
            else:
                _to_s3(value)


def ray_builder_problem(output_path: str) -> str | None:
    """Why Levanter's Ray cache builder cannot write `output_path`, or None if it can."""
    if protocol(output_path) in ("s3", "s3a"):
        return (
            "Levanter's Ray tokenize tasks write through JAX's tensorstore spec builder in other "
            "processes, where it is not fixed for s3:// (the caches would land in local 's3:' folders "
            "on the workers)"
        )
    return None


@contextlib.contextmanager
def local_staging(destination: str, name: str, preload: tuple[str, ...] = ()) -> Iterator[str]:
    """A local directory for files a library can only write locally, uploaded to `destination`.

    For a local `destination` it is `destination` itself (created). For a URL it is a
    fresh directory under the system temp dir, holding first a copy of the `preload`
    subdirectories of `destination` (so that a log file is appended to, not replaced); on
    exit, also after an error (a failed run keeps its logs), its files are uploaded to
    `destination` and it is removed. A process killed meanwhile uploads nothing.
    """
    if protocol(destination) is None:
        local = destination.removeprefix("file://")
        os.makedirs(local, exist_ok=True)
        yield local
        return
    staging = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{name}-")
    try:
        for subdirectory in preload:
            download_directory(
                f"{destination.rstrip('/')}/{subdirectory}", os.path.join(staging, subdirectory)
            )
        yield staging
    finally:
        try:
            upload_directory(staging, destination)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _relative_parts(url: str, root: str, key: str) -> list[str]:
    """The parts of `key` below `root`. A key is untrusted: one with empty, '.' or '..' parts
    (which would write outside the local copy) is refused."""
    relative = key[len(root) + 1 :] if key.startswith(root + "/") else ""
    parts = relative.split("/")
    if not relative or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"{url}: object {key!r} has an unsafe name (empty, '.' or '..' parts); not copied")
    return parts


def download_directory(url: str, local: str) -> int:
    """Copy every object under `url` to the same relative path under `local`; returns the count."""
    fs, root = fsspec.core.url_to_fs(url)
    root = root.rstrip("/")
    files = fs.find(root)
    for file in files:
        target = os.path.join(local, *_relative_parts(url, root, file))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs.get_file(file, target)
    return len(files)


def upload_directory(local: str, destination: str) -> int:
    """Copy every file under `local` to the same relative path under `destination`; returns the count.

    Symbolic links are skipped (object stores have none; W&B's `latest-run` and `debug.log` links
    point into run folders that are uploaded themselves)."""
    fs, root = fsspec.core.url_to_fs(destination)
    count = 0
    for directory, _, files in os.walk(local):
        for file in files:
            source = os.path.join(directory, file)
            if os.path.islink(source):
                continue
            relative = os.path.relpath(source, local)
            fs.put_file(source, f"{root.rstrip('/')}/{relative}")
            count += 1
    return count


@contextlib.contextmanager
def using_input_copies() -> Iterator[None]:
    """Run a step that may call `local_input_copy`: the copies are removed when the last such
    block of this process ends (steps running at once in threads share them). Copies made
    outside any block are removed at exit; a process killed meanwhile leaves its copies."""
    global _input_users
    with _inputs_lock:
        _input_users += 1
    try:
        yield
    finally:
        with _inputs_lock:
            _input_users -= 1
            if _input_users == 0:
                _remove_input_copies()


def _remove_input_copies() -> None:
    global _inputs_root
    if _inputs_root is not None:
        shutil.rmtree(_inputs_root, ignore_errors=True)
    _inputs_root = None
    _input_copies.clear()


atexit.register(_remove_input_copies)


def local_input_copy(url: str) -> str:
    """A local copy of the bucket directory `url` (a tokenizer: a few small files; model weights
    are skipped), made once under the system temp dir and kept until `using_input_copies` ends."""
    global _inputs_root
    with _inputs_lock:
        if url in _input_copies and os.path.isdir(_input_copies[url]):
            return _input_copies[url]
        if _inputs_root is None or not os.path.isdir(_inputs_root):
            _inputs_root = tempfile.mkdtemp(prefix=INPUTS_PREFIX)
        fs, root = fsspec.core.url_to_fs(url)
        root = root.rstrip("/")
        from operations.tokenizer import WEIGHT_SUFFIXES  # files a tokenizer never needs

        files = [f for f in fs.find(root) if not f.endswith(WEIGHT_SUFFIXES)]
        if not files:
            raise FileNotFoundError(f"{url}: no files there (expected a directory, e.g. a tokenizer)")
        local = os.path.join(_inputs_root, hashlib.sha256(url.encode()).hexdigest()[:16])
        staging = tempfile.mkdtemp(prefix=".partial-", dir=_inputs_root)
        for file in files:
            try:
                parts = _relative_parts(url, root, file)
            except ValueError:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            target = os.path.join(staging, *parts)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fs.get_file(file, target)
        shutil.rmtree(local, ignore_errors=True)  # a copy removed while in use (not by us)
        os.replace(staging, local)
        _input_copies[url] = local
        logger.info("copied %d file(s) of %s to %s (removed when the step ends)", len(files), url, local)
        return local
