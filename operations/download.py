"""Download: copy a local path, a glob or a URL into a step's output directory.

One fsspec code path serves every source: a local path or glob (`data/*.jsonl`),
`file://`, `http(s)://`, `s3://`, `gs://` and `hf://` (huggingface_hub's HfFileSystem;
`revision` picks the branch, tag or commit). An http(s) URL is one file, unless it ends
with "/": then it is an index page (like the ones `python -m http.server` serves) whose
links fsspec follows as a directory tree.

The output mirrors the source: `<output_path>/<path relative to the source>` (a single
file lands under its base name), plus `manifest.json` (path, size and sha256 of every
file, sorted by path) and `stats.json` (counts, including what include/exclude and
max_files left out). Files are selected in sorted path order, so the same source and
options give the same files and the same manifest.

Resuming: every file is written under a temporary name and renamed (on object stores, an
upload that is committed only once complete), so a file under its final name is whole.
A re-run keeps a file already there if it matches the manifest of an earlier finished
run (size and sha256) or, when there is none (the earlier run crashed), the size the
source reports; anything else is copied again.

Errors: an unreachable host, a missing file (404, no such bucket or key) or rejected
credentials raise one `DownloadError` that names the URL and says what to check.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import logging
import os
import re
import shutil
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from operations.shards import STATS_FILE, is_local, join, read_json, write_json_atomic, write_stats

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
# Temporary files live in one folder inside the output (same disk, so the final rename is
# atomic); a crash leaves them there, and the next run removes the folder first.
TEMP_DIR = ".download-tmp"
CHUNK_BYTES = 8 * 1024 * 1024
# Read these sequentially in one request (block_size=0) instead of ranged block reads:
# some http servers (python's http.server among them) ignore Range headers.
STREAMED_PROTOCOLS = ("http", "https", "hf")


class DownloadError(ValueError):
    """A source cannot be read: unreachable host, missing file, or rejected credentials."""


@dataclass(frozen=True, kw_only=True)
class DownloadConfig:
    source: str
    """What to copy: a local path or glob (`corpus/**/*.jsonl`), or a URL: `file://`,
    `http(s)://` (one file; an index page of links if it ends with "/"), `s3://bucket/prefix`,
    `gs://bucket/prefix`, `hf://datasets/org/name/sub/dir`."""

    output_path: str
    """Where the copy goes: `<output_path>/<relative path>`, plus manifest.json and stats.json."""

    include: tuple[str, ...] = ("**",)
    """Glob patterns on paths relative to the source; a file is copied if it matches one.
    `**` spans directories (`**/*.py` is every .py file), `*` and `?` stay within one."""

    exclude: tuple[str, ...] = ()
    """Glob patterns relative to the source; a file matching one is left out (and counted).
    On local disk `dir/**` skips the whole directory without listing it."""

    max_files: int | None = None
    """Copy only the first N selected files in sorted path order (None: all of them)."""

    revision: str | None = None
    """hf:// only: the branch, tag or commit to download (None: the default branch)."""

    storage_options: dict[str, Any] = field(default_factory=dict)
    """Options for the source's fsspec filesystem (s3: endpoint_url, key, secret; hf: token).
    They are recorded with the step's config, so prefer credentials from the environment."""

    workers: int = 8
    """Files transferred at once (threads)."""


@dataclass(frozen=True)
class _File:
    rel: str  # path under the source root, "/"-separated; also its path under the output
    path: str  # the path to open on the source filesystem
    size: int | None  # what the source reports; None when it does not say (http listings)


@dataclass(frozen=True)
class _Source:
    url: str
    fs: fsspec.AbstractFileSystem
    protocol: str
    root: str  # the root as the filesystem names it (listing names start with it)
    is_dir: bool
    root_size: int | None
    pattern: str | None  # the glob part of a glob source, relative to the root
    list_kwargs: dict[str, Any]

    def display(self, path: str) -> str:
        """How an error names one file of this source: a local path or a full URL."""
        return path if self.protocol == "file" and "://" not in self.url else self.fs.unstrip_protocol(path)


def download(config: DownloadConfig) -> None:
    """Copy `config.source` into `config.output_path`; resumable, see the module docstring."""
    _validate(config)
    source = _open_source(config)
    listed, directories_excluded = _list_files(source, config.exclude)
    selected, counts = _select(listed, config, source)
    output = _Output(config.output_path)
    output.start()
    previous = _previous_manifest(config.output_path)
    results = _transfer_all(source, selected, output, previous, config.workers)
    entries = [results[file.rel][0] for file in selected]
    copied = [entry for file, entry in zip(selected, entries, strict=True) if results[file.rel][1]]
    write_json_atomic(
        join(config.output_path, MANIFEST_FILE),
        {"source": config.source, "revision": config.revision, "files": entries},
    )
    stats = {
        "files": len(entries),
        "bytes": sum(entry["size"] for entry in entries),
        "files_copied": len(copied),
        "bytes_copied": sum(entry["size"] for entry in copied),
        "files_already_complete": len(entries) - len(copied),
        "files_excluded": counts["excluded"],
        "files_over_max_files": counts["over_max_files"],
        "directories_excluded": directories_excluded,
    }
    write_stats(config.output_path, stats)
    output.finish()
    logger.info(
        "downloaded %s: %d files, %d bytes (%d copied, %d already complete)",
        config.source,
        stats["files"],
        stats["bytes"],
        stats["files_copied"],
        stats["files_already_complete"],
    )


# -- checking the config -------------------------------------------------------------------


def _validate(config: DownloadConfig) -> None:
    for name in ("include", "exclude"):
        value = getattr(config, name)
        if isinstance(value, str) or not all(isinstance(pattern, str) for pattern in value):
            raise ValueError(f"DownloadConfig.{name} must be a tuple of glob patterns, got {value!r}")
    if not config.include:
        raise ValueError('DownloadConfig.include is empty: nothing would be copied (use ("**",) for all)')
    if config.max_files is not None and config.max_files < 1:
        raise ValueError(f"DownloadConfig.max_files must be at least 1 or None, got {config.max_files}")
    if config.workers < 1:
        raise ValueError(f"DownloadConfig.workers must be at least 1, got {config.workers}")
    protocol = _protocol(config.source)
    if config.revision is not None and protocol != "hf":
        raise ValueError(
            f"DownloadConfig.revision applies to hf:// sources only, but source={config.source!r}; "
            "remove the revision"
        )


def _protocol(url: str) -> str:
    return fsspec.core.split_protocol(url)[0] or "file"


# -- finding the files ---------------------------------------------------------------------


def _open_source(config: DownloadConfig) -> _Source:
    protocol = _protocol(config.source)
    root_url, pattern = config.source, None
    # URLs often hold "?" (queries) and "[": an http(s) source is never a glob.
    if protocol not in ("http", "https") and glob.has_magic(config.source):
        root_url, pattern = _split_glob(config.source)
    fs, root = fsspec.core.url_to_fs(root_url, **config.storage_options)
    list_kwargs = {"revision": config.revision} if config.revision is not None else {}
    with _naming_errors(config.source):
        # Listings are cached per filesystem object; a re-run in the same process must
        # see what is there now.
        fs.invalidate_cache()
        info = fs.info(root, **list_kwargs)
    is_dir = info["type"] == "directory" or (protocol in ("http", "https") and root_url.endswith("/"))
    if pattern is not None and not is_dir:
        raise ValueError(
            f"source {config.source!r}: the part before the glob ({root_url}) is not a directory"
        )
    # info() names the root as listings will (hf adds "@revision" when one is given).
    root = info["name"].rstrip("/") if is_dir else info["name"]
    return _Source(config.source, fs, protocol, root, is_dir, info.get("size"), pattern, list_kwargs)


def _split_glob(url: str) -> tuple[str, str]:
    """`s3://b/data/*/x.json` -> (`s3://b/data`, `*/x.json`): the fixed part and the glob."""
    parts = url.split("/")
    first = next(index for index, part in enumerate(parts) if glob.has_magic(part))
    root = "/".join(parts[:first]) or "."
    if root.endswith(":/"):  # the glob sits right after "s3://"
        raise ValueError(f"source {url!r}: a glob needs a fixed bucket or directory before it")
    return root, "/".join(parts[first:])


def _list_files(source: _Source, exclude: tuple[str, ...]) -> tuple[list[_File], int]:
    """Every file under the source with its path relative to the root, and how many
    directories were skipped whole by `dir/**` excludes."""
    if not source.is_dir:
        return [_File(_relative_name(source, source.root), source.root, source.root_size)], 0
    fs = source.fs
    directories_excluded = 0
    with _naming_errors(source.url):
        if source.pattern is not None:
            found = fs.glob(f"{source.root}/{source.pattern}", detail=True, **source.list_kwargs)
            found = {name: info for name, info in found.items() if info.get("type") != "directory"}
        elif isinstance(fs, LocalFileSystem) and _pruning_patterns(exclude):
            # On local disk find() is itself a directory walk, so walking here costs
            # nothing more and lets `dir/**` excludes skip whole trees (a site-packages
            # next to the standard library). Object stores and the Hub list a whole
            # prefix in one paginated request, which find() does, so they never walk.
            found, directories_excluded = _walk_pruned(fs, source.root, _pruning_patterns(exclude))
        else:
            found = fs.find(source.root, detail=True, **source.list_kwargs)
    files = []
    prefix = source.root + "/"
    for name, info in found.items():
        if not name.startswith(prefix):  # e.g. a link on an index page to elsewhere
            continue
        rel = name[len(prefix) :]
        if source.protocol in ("http", "https"):
            parts = urllib.parse.urlsplit(rel)
            if parts.query or parts.fragment:  # an index page's sort links, not files
                continue
            rel = urllib.parse.unquote(parts.path)
        files.append(_File(rel, name, info.get("size")))
    return files, directories_excluded


def _relative_name(source: _Source, path: str) -> str:
    if source.protocol in ("http", "https"):
        path = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
    return path.rstrip("/").rsplit("/", 1)[-1]


def _pruning_patterns(exclude: tuple[str, ...]) -> list[re.Pattern[str]]:
    """Directory patterns from `X/**` excludes: everything under a directory matching X
    is excluded, so the directory need not be listed."""
    return [_glob_regex(pattern[: -len("/**")]) for pattern in exclude if pattern.endswith("/**")]


def _walk_pruned(
    fs: fsspec.AbstractFileSystem, root: str, prune: list[re.Pattern[str]]
) -> tuple[dict[str, dict[str, Any]], int]:
    found: dict[str, dict[str, Any]] = {}
    pruned = 0
    for directory, dirs, files in fs.walk(root, detail=True, topdown=True, on_error="raise"):
        rel_dir = directory[len(root) :].strip("/")
        for name in list(dirs):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if any(pattern.fullmatch(rel) for pattern in prune):
                del dirs[name]  # topdown walk: removing it here skips the subtree
                pruned += 1
        for info in files.values():
            found[info["name"]] = info
    return found, pruned


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex for a glob on "/"-separated paths: `**` spans directories (`**/` also
    matches no directory at all), `*` and `?` stay within one, `[abc]`/`[!abc]` are sets."""
    out, index = [], 0
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
            continue
        if pattern.startswith("**", index):
            out.append(".*")
            index += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and (end := pattern.find("]", index + 2)) != -1:
            body = pattern[index + 1 : end]
            negate = body.startswith("!")
            body = re.escape(body[1:] if negate else body).replace("\\-", "-")
            out.append(f"[{'^' if negate else ''}{body}]")
            index = end + 1
            continue
        else:
            out.append(re.escape(char))
        index += 1
    return re.compile("".join(out))


def _select(
    files: list[_File], config: DownloadConfig, source: _Source
) -> tuple[list[_File], dict[str, int]]:
    include = [_glob_regex(pattern) for pattern in config.include]
    exclude = [_glob_regex(pattern) for pattern in config.exclude]
    files = sorted(files, key=lambda file: file.rel)
    if source.is_dir:
        kept = [
            file
            for file in files
            if any(p.fullmatch(file.rel) for p in include) and not any(p.fullmatch(file.rel) for p in exclude)
        ]
    else:
        kept = files  # one named file: the patterns are for picking within directories
    excluded = len(files) - len(kept)
    over = 0
    if config.max_files is not None and len(kept) > config.max_files:
        over = len(kept) - config.max_files
        kept = kept[: config.max_files]
    if not kept:
        raise ValueError(
            f"nothing to download from {config.source}: {len(files)} files found, none selected by "
            f"include={config.include!r}, exclude={config.exclude!r}"
        )
    for file in kept:
        parts = file.rel.split("/")
        if file.rel.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"{source.display(file.path)}: cannot mirror a path with empty, . or .. parts")
        if file.rel in (MANIFEST_FILE, STATS_FILE) or parts[0] == TEMP_DIR:
            raise ValueError(
                f"{source.display(file.path)} would overwrite the download's own {file.rel} in the output: "
                f"exclude it (exclude=({file.rel!r},)) or download a subdirectory"
            )
    return kept, {"excluded": excluded, "over_max_files": over}


# -- writing the output --------------------------------------------------------------------


class _Output:
    """The output directory: sizes, checksums and atomic writes of files in it."""

    def __init__(self, output_path: str):
        self.local = is_local(output_path)
        self.fs, self.root = fsspec.core.url_to_fs(output_path)
        self.temp_dir = os.path.join(self.root, TEMP_DIR)

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def start(self) -> None:
        if self.local:
            shutil.rmtree(self.temp_dir, ignore_errors=True)  # left by a crashed run
            os.makedirs(self.temp_dir, exist_ok=True)
        else:
            self.fs.invalidate_cache()

    def finish(self) -> None:
        if self.local:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def size(self, rel: str) -> int | None:
        """The size of a finished file, or None if there is none."""
        try:
            if self.local:
                return os.stat(self.path(rel)).st_size
            info = self.fs.info(self.path(rel))
        except FileNotFoundError:
            return None
        return info["size"] if info["type"] == "file" else None

    def sha256(self, rel: str, progress) -> str:
        digest = hashlib.sha256()
        with self.fs.open(self.path(rel), "rb") as handle:
            while chunk := handle.read(CHUNK_BYTES):
                digest.update(chunk)
                progress.update(len(chunk))
        return digest.hexdigest()

    @contextlib.contextmanager
    def writer(self, rel: str) -> Iterator[IO[bytes]]:
        """A handle whose bytes appear under `rel` only if the block ends without error."""
        target = self.path(rel)
        if self.local:
            temp = os.path.join(self.temp_dir, uuid.uuid4().hex)
            try:
                with open(temp, "wb") as handle:
                    yield handle
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.replace(temp, target)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp)
            return
        # Object stores: with autocommit off the object is published by commit() only
        # (S3: the multipart upload completes); discard() aborts it.
        handle = self.fs.open(target, "wb", autocommit=False)
        try:
            yield handle
        except BaseException:
            with contextlib.suppress(Exception):
                handle.discard()
            raise
        handle.close()
        handle.commit()


def _previous_manifest(output_path: str) -> dict[str, dict[str, Any]]:
    try:
        manifest = read_json(join(output_path, MANIFEST_FILE))
    except ValueError as error:  # only a hint for resuming: without it files are re-checked by size
        logger.warning("ignoring unreadable %s in %s: %s", MANIFEST_FILE, output_path, error)
        return {}
    if not isinstance(manifest, dict):
        return {}
    return {entry["path"]: entry for entry in manifest.get("files", []) if isinstance(entry, dict)}


# -- transferring --------------------------------------------------------------------------


def _transfer_all(
    source: _Source,
    files: list[_File],
    output: _Output,
    previous: dict[str, dict[str, Any]],
    workers: int,
) -> dict[str, tuple[dict[str, Any], bool]]:
    """Copy or verify every file on `workers` threads; returns rel -> (manifest entry, copied)."""
    from tqdm.auto import tqdm

    sizes = [file.size for file in files]
    total = sum(sizes) if all(size is not None for size in sizes) else None
    progress = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="download", leave=False)
    results: dict[str, tuple[dict[str, Any], bool]] = {}
    stop = threading.Event()

    def run(file: _File) -> tuple[dict[str, Any], bool]:
        # After the first failure the files not started yet are skipped, so the error
        # surfaces at once; transfers under way finish (each one is atomic anyway).
        if stop.is_set():
            raise _Skipped
        try:
            return _fetch(source, file, output, previous.get(file.rel), progress)
        except BaseException:
            stop.set()
            raise

    first_error: BaseException | None = None
    try:
        with ThreadPoolExecutor(max_workers=min(workers, len(files))) as pool:
            futures = {pool.submit(run, file): file for file in files}
            try:
                for future in as_completed(futures):
                    error = future.exception()
                    if error is None:
                        results[futures[future].rel] = future.result()
                        progress.set_postfix_str(f"{len(results)}/{len(files)} files", refresh=False)
                    elif not isinstance(error, _Skipped) and first_error is None:
                        first_error = error
            except BaseException:  # KeyboardInterrupt: let the workers wind down quickly
                stop.set()
                raise
    finally:
        progress.close()
    if first_error is not None:
        raise first_error
    return results


class _Skipped(Exception):
    """A file not started because another one failed."""


def _fetch(
    source: _Source, file: _File, output: _Output, recorded: dict[str, Any] | None, progress
) -> tuple[dict[str, Any], bool]:
    """Keep the output file if it is complete, else copy it; returns (entry, copied)."""
    existing = output.size(file.rel)
    if existing is not None and _looks_complete(existing, file, recorded):
        digest = output.sha256(file.rel, progress)
        if recorded is None or digest == recorded.get("sha256"):
            return {"path": file.rel, "size": existing, "sha256": digest}, False
    size, digest = _copy(source, file, output, progress)
    return {"path": file.rel, "size": size, "sha256": digest}, True


def _looks_complete(existing: int, file: _File, recorded: dict[str, Any] | None) -> bool:
    if file.size is not None and existing != file.size:
        return False  # the source changed, or this is not our file
    if recorded is not None:
        return existing == recorded.get("size")  # the checksum is compared next
    # No manifest (the run that wrote it crashed): files are renamed into place only when
    # whole, so one of the size the source reports is the one we wrote.
    return file.size is not None


def _copy(source: _Source, file: _File, output: _Output, progress) -> tuple[int, str]:
    url = source.display(file.path)
    digest = hashlib.sha256()
    size = 0
    open_kwargs = {"block_size": 0} if source.protocol in STREAMED_PROTOCOLS else {}
    with output.writer(file.rel) as writer:
        with _naming_errors(url):
            reader = source.fs.open(file.path, "rb", **open_kwargs)
        with reader:
            while True:
                with _naming_errors(url):
                    chunk = reader.read(CHUNK_BYTES)
                if not chunk:
                    break
                digest.update(chunk)
                writer.write(chunk)
                size += len(chunk)
                progress.update(len(chunk))
        if file.size is not None and size != file.size:
            # Raised inside the writer, so the short file is never published.
            raise DownloadError(
                f"cannot download {url}: read {size} bytes but the source reported {file.size} "
                "(it changed during the download or the connection dropped); run again"
            )
    return size, digest.hexdigest()


# -- errors --------------------------------------------------------------------------------

_NOT_FOUND = "not found. Check the path or URL (host, bucket, key, repository, revision)"
_DENIED = (
    "access denied. Check the credentials: pass them in storage_options (s3: key and secret; "
    "gs: token; hf: token) or set them in the environment (AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS, HF_TOKEN)"
)
_UNREACHABLE = (
    "cannot connect to the host. Check the host name and port, that the server is up, and the "
    "network (for an S3-compatible store: storage_options endpoint_url)"
)
_HUB_REPOSITORY = (
    "no such repository, or it is private or gated. Check the name (hf://datasets/org/name/... for "
    "datasets, hf://org/name/... for models) and, for a private or gated one, pass a token "
    "(storage_options token, or HF_TOKEN in the environment)"
)
_TIMEOUT = "the server did not answer in time. Check the network and the server, then run again"
_CONNECTION_ERRORS = {
    "ClientConnectorError",  # aiohttp (http, gcs)
    "ClientConnectorDNSError",
    "ServerDisconnectedError",
    "EndpointConnectionError",  # botocore (s3)
    "ConnectTimeoutError",
    "NewConnectionError",  # urllib3 (hf through requests)
    "NameResolutionError",
    "MaxRetryError",
}
_DENIED_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
}
_NOT_FOUND_CODES = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}
_TRANSFER_MODULES = (
    "aiohttp",
    "botocore",
    "aiobotocore",
    "requests",
    "urllib3",
    "huggingface_hub",
    "gcsfs",
    "google",
)


@contextlib.contextmanager
def _naming_errors(url: str) -> Iterator[None]:
    """Turn the many ways a transfer fails (fsspec, aiohttp, botocore, requests, the Hub)
    into one DownloadError that names `url` and says what to do."""
    try:
        yield
    except DownloadError:
        raise
    except NotImplementedError as error:
        if not url.startswith("hf://"):
            raise
        # HfFileSystem's answer to a path that names no repository it can find.
        raise DownloadError(
            f"cannot download {url}: no such repository. hf:// URLs look like hf://datasets/org/name/path "
            f"(datasets), hf://org/name/path (models) or hf://spaces/org/name/path (cause: {_describe(error)})"
        ) from error
    except Exception as error:
        if not _is_transfer_error(error):
            raise
        raise DownloadError(
            f"cannot download {url}: {_diagnose(error)} (cause: {_describe(error)})"
        ) from error


def _is_transfer_error(error: BaseException) -> bool:
    return isinstance(error, OSError) or type(error).__module__.split(".")[0] in _TRANSFER_MODULES


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _status(error: BaseException) -> int | str | None:
    """An HTTP status or S3 error code carried by an exception, if any."""
    status = getattr(error, "status", None)  # aiohttp.ClientResponseError
    if isinstance(status, int):
        return status
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # botocore.exceptions.ClientError
        return response.get("Error", {}).get("Code") or response.get("ResponseMetadata", {}).get(
            "HTTPStatusCode"
        )
    status = getattr(response, "status_code", None)  # requests.HTTPError (the Hub)
    return status if isinstance(status, int) else None


def _diagnose(error: BaseException) -> str:
    chain = _chain(error)
    names = {type(cause).__name__ for cause in chain}
    # The Hub answers 401 for a repository that does not exist and for a private one.
    if "RepositoryNotFoundError" in names or "GatedRepoError" in names:
        return _HUB_REPOSITORY
    if "RevisionNotFoundError" in names:
        return "no such revision. Check DownloadConfig.revision (a branch, tag or commit of the repository)"
    # fsspec often re-raises as FileNotFoundError(url) from the real cause, so look at
    # the causes first and at the wrapper last.
    for cause in chain:
        status = _status(cause)
        if status in (401, 403) or status in _DENIED_CODES:
            return _DENIED
        if status == 404 or status in _NOT_FOUND_CODES:
            return _NOT_FOUND
        if type(cause).__name__ in _CONNECTION_ERRORS or isinstance(cause, ConnectionError):
            return _UNREACHABLE
    for cause in chain:
        if isinstance(cause, PermissionError):
            return _DENIED
        if isinstance(cause, FileNotFoundError):
            return _NOT_FOUND
        if isinstance(cause, TimeoutError):
            return _TIMEOUT
    return "the transfer failed"


def _describe(error: BaseException) -> str:
    """The error and, when it only wraps another, the root cause: `A: x <- B: y`."""
    chain = _chain(error)
    parts = [error] if len(chain) == 1 else [error, chain[-1]]
    return " <- ".join(f"{type(part).__name__}: {part}".strip().rstrip(":") for part in parts)
