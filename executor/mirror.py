"""Mirrored paths: data under the prefix that is copied there from elsewhere on first use.

Marin's `mirrored("raw/dclm", budget_gb=10)` names a path relative to the prefix; its
`MirrorFileSystem` reads it from the local regional bucket, copying it there from another
`marin-*` bucket the first time, within a transfer budget. Here one prefix is one storage,
so the step sees the plain `<prefix>/<path>`, and the copy happens before the step runs:

- the places to copy from are the prefixes in `$MARIN_MIRROR_SOURCES` (comma-separated:
  `gs://other-region/marin,s3://colleague/tree,/mnt/shared`), tried in order; the first
  that holds the path is the source;
- a file, or a directory's files, missing at the destination or of another size there
  are copied (so a copy cut short by a crash is finished by the next run, and an output
  already complete costs one listing of the source and one of the destination);
- the bytes to copy are counted first: more than `budget_gb` and nothing is copied, and
  the step fails with a message naming the field, the size and the budget;
- each file is written atomically (a temporary name renamed on local disk; one upload on
  an object store), so no reader sees half a file;
- with no source configured, or none holding it, a path already present is used as it
  is, and a missing one fails the step before it starts, naming the field and the sources.

Object keys listed from a source are untrusted: a key with a `..` part is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from executor.graph import Mirror
from executor.records import dataclass

SOURCES_VARIABLE = "MARIN_MIRROR_SOURCES"
"""Environment variable listing the prefixes mirrored paths are copied from."""

COPY_CHUNK_BYTES = 8 << 20
"""Bytes read and written at a time while copying a file."""

GB = 10**9


class MirrorError(Exception):
    """A mirrored path cannot be made present; the message names the step's field and the fix."""


@dataclass(frozen=True)
class MirrorResult:
    """What `ensure_mirrored` did for one mirrored path."""

    path: str
    """The destination, `<prefix>/<relative path>`."""

    source: str | None
    """Where files were copied from (None: nothing was copied)."""

    files_copied: int
    bytes_copied: int


def mirror_sources(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The prefixes in `$MARIN_MIRROR_SOURCES`, in order (empty entries ignored)."""
    raw = (os.environ if environ is None else environ).get(SOURCES_VARIABLE, "")
    return tuple(entry.strip().rstrip("/") for entry in raw.split(",") if entry.strip())


def ensure_mirrored(
    step_name: str,
    mirror: Mirror,
    sources: Sequence[str],
    log: Callable[[str], None] = print,
) -> MirrorResult:
    """Make `mirror.path` hold what the first source holding it has (see the module docstring)."""
    from fsspec.core import url_to_fs

    where = f"step {step_name!r}, field {mirror.field!r}: mirrored path {mirror.relative_path!r}"
    destination_fs, destination = url_to_fs(mirror.path)
    for source_prefix in sources:
        source_fs, source = url_to_fs(f"{source_prefix}/{mirror.relative_path}")
        wanted = _files(source_fs, source, f"{where} in {source_prefix}")
        if wanted is None:
            continue
        present = _files(destination_fs, destination, where) or {}
        missing = {relative: size for relative, size in wanted.items() if present.get(relative) != size}
        total = sum(missing.values())
        if total > mirror.budget_gb * GB:
            raise MirrorError(
                f"{where}: {len(missing)} file(s), {total / GB:.2f} GB, to copy from {source_prefix}, over "
                f"its budget of {mirror.budget_gb:g} GB; raise budget_gb in mirrored() or copy it yourself"
            )
        for index, (relative, size) in enumerate(sorted(missing.items()), start=1):
            log(f"mirror {mirror.relative_path}: {index}/{len(missing)} {relative or '.'} ({size:,} bytes)")
            _copy_file(source_fs, _join(source, relative), destination_fs, _join(destination, relative))
        if missing:
            log(
                f"mirror {mirror.relative_path}: copied {len(missing)} file(s), {total:,} bytes, from {source_prefix}"
            )
        return MirrorResult(mirror.path, source_prefix if missing else None, len(missing), total)
    if destination_fs.exists(destination):
        return MirrorResult(mirror.path, None, 0, 0)
    tried = ", ".join(sources) if sources else f"none: ${SOURCES_VARIABLE} is not set"
    raise MirrorError(
        f"{where}: not under the prefix ({mirror.path}) and no mirror source holds it (sources: {tried}); "
        f"set {SOURCES_VARIABLE} to the prefixes (comma-separated) to copy it from, or put it there"
    )


def _files(fs: Any, root: str, where: str) -> dict[str, int] | None:
    """{path relative to `root` ("" for `root` itself when it is a file): size}, or None when absent."""
    try:
        info = fs.info(root)
    except FileNotFoundError:
        return None
    if info.get("type") != "directory":
        return {"": int(info.get("size") or 0)}
    found: dict[str, int] = {}
    for path, detail in fs.find(root, detail=True).items():
        if detail.get("type") == "directory":
            continue
        relative = _relative(fs, root, path, where)
        found[relative] = int(detail.get("size") or 0)
    return found


def _relative(fs: Any, root: str, path: str, where: str) -> str:
    base = fs._strip_protocol(root).rstrip("/") + "/"
    full = fs._strip_protocol(path)
    relative = full[len(base) :] if full.startswith(base) else ""
    parts = relative.split("/")
    if not relative or any(part in ("", ".", "..") for part in parts):
        raise MirrorError(f"{where}: listed {path!r}, not a clean path under {root!r}: refused")
    return relative


def _join(root: str, relative: str) -> str:
    return f"{root.rstrip('/')}/{relative}" if relative else root


def _copy_file(source_fs: Any, source: str, destination_fs: Any, destination: str) -> None:
    parent = destination.rsplit("/", 1)[0]
    local = "file" in (
        destination_fs.protocol if isinstance(destination_fs.protocol, tuple) else (destination_fs.protocol,)
    )
    if local:
        destination_fs.makedirs(parent, exist_ok=True)
        target = f"{destination}.mirror-{os.urandom(4).hex()}.tmp"
    else:
        target = destination  # one upload, visible only once complete
    import shutil

    try:
        with source_fs.open(source, "rb") as reader, destination_fs.open(target, "wb") as writer:
            shutil.copyfileobj(reader, writer, COPY_CHUNK_BYTES)
        if local:
            os.replace(target, destination)
    finally:
        if local and os.path.exists(target):
            os.unlink(target)
