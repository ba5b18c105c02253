"""Raw files -> document shards: the step between a download and everything that reads text.

`make_documents` turns a directory (or glob) of raw files -- plain text and source
code, JSON Lines / JSON, Parquet, HTML -- into the standard document shards of
`operations.shards` (`{"id", "text", "source", "metadata"}` per line, `shard-0000i.jsonl.gz`).

How it works:

1. List the input files recursively, sorted by relative path. Hidden files and folders
   (a name starting with '.') and the download operation's top-level `manifest.json` /
   `stats.json` are ignored; `include` / `exclude` patterns narrow the list further; a
   file whose extension has no reader is skipped and counted (`unsupported_files`).
2. Cut the sorted list into chunks of about `target_shard_bytes` input bytes. Chunk i
   becomes output shard i, so the sharding depends only on the listing: identical input
   gives byte-identical shards. Each chunk is a JSON descriptor (root, files with their
   reader, reading options) handed to `convert_shard` through `map_shards`, which runs
   the chunks in parallel processes, writes each shard atomically and skips shards done
   by an earlier (crashed or failed) run. `.plan.json` records a digest of every chunk
   so a re-run over a changed listing cannot mix old and new shards.
3. Readers. A document's id is deterministic: the relative path for whole-file readers
   (`text`, `html`, a `.json` file holding one record), `<path>:<line>` (1-based, as
   editors show it) for JSON Lines and `<path>:<row>` (0-based) for a JSON list or a
   Parquet table. Metadata holds `path`, `reader`, `line`/`row`, and for records every
   field other than `text_field`.
4. Nothing is dropped uncounted. Inputs that give no document are counted by kind with
   a few examples: `non_utf8` (bytes that are not UTF-8, unless `encoding_errors="replace"`),
   `empty` (empty or whitespace-only text), `malformed_json` (per JSON line, or per
   `.json` file), `missing_text` (a record without a string `text_field`),
   `no_main_content` (HTML whose extraction leaves nothing), `unreadable` (a corrupt
   Parquet / gzip / zstd file; documents read before the damage are kept). The error
   fraction is errors / (documents + errors); above `max_error_fraction` the step writes
   `stats.json` (with an `error` entry) and then raises. An unreadable file counts once
   however many records it held, so it is also judged per file: unreadable files / files
   read above `max_error_fraction` fails the step the same way (`unreadable_reasons` in
   stats.json says what each raised). The shards stay, since they are
   correct; a re-run of the same config resumes them and reaches the same verdict, so a
   failed step never turns into a silent success.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from operations.shards import (
    document_writer,
    is_local,
    join,
    map_shards,
    open_compressed,
    read_json,
    sum_counters,
    write_json_atomic,
    write_stats,
)

logger = logging.getLogger(__name__)

# Plain text, markup and source code: read whole, one document per file.
_TEXT_EXTENSIONS = (  # noqa: SIM905 (a word list reads better than 66 quoted items)
    ".txt .text .md .markdown .rst .tex .org .adoc "
    ".py .pyi .pyx .c .h .cc .cpp .cxx .hh .hpp .hxx .cu .cuh .java .kt .scala .go .rs .swift "
    ".js .mjs .ts .tsx .jsx .cs .fs .m .mm .rb .php .pl .pm .lua .r .jl .hs .ml .ex .exs .erl .clj "
    ".sh .bash .zsh .fish .ps1 .bat .sql .css .scss .toml .yaml .yml .ini .cfg .xml .proto .cmake"
).split()

DEFAULT_READERS: dict[str, str] = {
    **dict.fromkeys(_TEXT_EXTENSIONS, "text"),
    **dict.fromkeys([".jsonl", ".jsonl.gz", ".jsonl.zst", ".ndjson"], "jsonl"),
    **dict.fromkeys([".json", ".json.gz", ".json.zst"], "json"),
    ".parquet": "parquet",
    **dict.fromkeys([".html", ".htm", ".xhtml"], "html"),
}
READERS = ("text", "jsonl", "json", "parquet", "html")
COMPRESSIONS = {"gzip": ".jsonl.gz", "zstd": ".jsonl.zst", "none": ".jsonl"}
HTML_EXTRACTORS = ("resiliparse", "trafilatura")
# Written by operations/download.py at the top of its output; not corpus files.
DOWNLOAD_BOOKKEEPING = frozenset({"manifest.json", "stats.json"})
PLAN_FILE = ".plan.json"
MAX_EXAMPLES = 5
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class DocumentsConfig:
    input_path: str
    """Directory of raw files (searched recursively), a glob (`data/**/*.jsonl.gz`) or one file;
    local path or fsspec URL."""

    output_path: str
    """Where the document shards, `stats.json` and the per-shard bookkeeping go."""

    source: str | None = None
    """Value of every document's `source` field; None: the input directory's name."""

    text_field: str = "text"
    """Field holding the text in JSON / Parquet records; the other fields go into metadata."""

    include: tuple[str, ...] = ()
    """Keep only files whose relative path matches one of these patterns (fnmatch: `*` also
    matches `/`, so `*.py` is every Python file); empty: keep all."""

    exclude: tuple[str, ...] = ()
    """Drop files whose relative path matches one of these patterns (after `include`)."""

    readers: dict[str, str] | None = None
    """Extension -> reader (`text`, `jsonl`, `json`, `parquet`, `html`), longest extension wins;
    None: DEFAULT_READERS. Replaces the whole mapping: extend with `{**DEFAULT_READERS, ...}`."""

    target_shard_bytes: int = 8_000_000
    """Input bytes per output shard (a larger file gets a shard of its own). Compressed
    inputs count at their compressed size."""

    compression: str = "gzip"
    """Output shard compression: `gzip` (.jsonl.gz), `zstd` (.jsonl.zst) or `none` (.jsonl)."""

    html_extractor: str = "resiliparse"
    """Main-content extraction for HTML: `resiliparse` (fast) or `trafilatura` (if installed)."""

    encoding_errors: str = "strict"
    """`strict`: a file (or JSON line) that is not valid UTF-8 is skipped and counted as
    `non_utf8`; `replace`: keep it with U+FFFD for the bad bytes (counted as `replaced_non_utf8`)."""

    max_error_fraction: float = 0.1
    """Fail the step when skipped inputs / (documents + skipped inputs) exceeds this."""

    workers: int | None = None
    """Parallel processes; None: one per core."""


def make_documents(config: DocumentsConfig) -> None:
    """Convert the raw files under `config.input_path` into document shards under `config.output_path`."""
    _validate(config)
    started = time.perf_counter()
    listing = _list_files(config)
    chunks = _chunk(listing.files, config.target_shard_bytes)
    source = config.source or listing.root.rstrip("/").rsplit("/", 1)[-1] or "documents"
    descriptors = [
        json.dumps(
            {
                "root": listing.root_url,
                "files": chunk,
                "source": source,
                "text_field": config.text_field,
                "html_extractor": config.html_extractor,
                "encoding_errors": config.encoding_errors,
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        for chunk in chunks
    ]
    _check_plan(config.output_path, descriptors)
    per_shard = map_shards(
        convert_shard,
        descriptors,
        config.output_path,
        workers=config.workers,
        description=f"documents from {source}",
        output_suffix=COMPRESSIONS[config.compression],
    )
    stats = _summarize(per_shard, listing, config)
    error = _error_fraction_message(stats, config)
    if error:
        stats["error"] = error
    write_stats(config.output_path, stats)
    elapsed = time.perf_counter() - started
    logger.info(
        "%d documents from %d files (%.1f MB) in %.2f s: %.0f documents/s, %.1f MB/s; %d skipped %s",
        stats["documents"],
        stats["files"],
        stats["input_bytes"] / 1e6,
        elapsed,
        stats["documents"] / elapsed,
        stats["input_bytes"] / 1e6 / elapsed,
        stats["error_count"],
        stats["errors"],
    )
    if error:
        raise ValueError(error)


def _validate(config: DocumentsConfig) -> None:
    def bad(field: str, problem: str) -> ValueError:
        return ValueError(f"DocumentsConfig.{field}: {problem}")

    if config.compression not in COMPRESSIONS:
        raise bad("compression", f"{config.compression!r} is not one of {sorted(COMPRESSIONS)}")
    if config.encoding_errors not in ("strict", "replace"):
        raise bad("encoding_errors", f"{config.encoding_errors!r} is not 'strict' or 'replace'")
    if config.html_extractor not in HTML_EXTRACTORS:
        raise bad("html_extractor", f"{config.html_extractor!r} is not one of {list(HTML_EXTRACTORS)}")
    if config.html_extractor == "trafilatura" and importlib.util.find_spec("trafilatura") is None:
        raise bad(
            "html_extractor",
            "'trafilatura' is not installed in this environment; `pip install trafilatura` "
            "or use html_extractor='resiliparse'",
        )
    if not 0.0 <= config.max_error_fraction <= 1.0:
        raise bad("max_error_fraction", f"{config.max_error_fraction} is not between 0 and 1")
    if config.target_shard_bytes <= 0:
        raise bad("target_shard_bytes", f"{config.target_shard_bytes} must be positive")
    if not config.text_field:
        raise bad("text_field", "must name the field that holds the text")
    if isinstance(config.include, str) or isinstance(config.exclude, str):
        raise bad("include/exclude", "give a tuple of patterns, e.g. ('*.py',), not a single string")
    for extension, reader in (config.readers or {}).items():
        if not extension.startswith(".") or reader not in READERS:
            raise bad(
                "readers",
                f"{extension!r}: {reader!r}: keys are extensions like '.txt', values one of {READERS}",
            )


# --- listing and chunking -------------------------------------------------------------


@dataclass(frozen=True)
class _Listing:
    root: str  # the input root as the filesystem names it (no protocol)
    root_url: str  # the same, openable with fsspec from any process
    files: list[tuple[str, str, int]]  # (relative path, reader, size), sorted
    ignored: int  # hidden files, download bookkeeping, our own output
    excluded: int  # filtered out by include / exclude
    unsupported: dict[str, int]  # extension -> count of files with no reader
    unsupported_examples: list[str]


def _list_files(config: DocumentsConfig) -> _Listing:
    fs, path = fsspec.core.url_to_fs(config.input_path)
    path = path.rstrip("/") or "/"
    parts = path.split("/")
    magic = [i for i, part in enumerate(parts) if _GLOB_CHARS & set(part)]
    if magic:
        root = "/".join(parts[: magic[0]]) or "/"
        found = {
            name: info["size"] for name, info in fs.glob(path, detail=True).items() if info["type"] == "file"
        }
    elif fs.isfile(path):
        root = path.rsplit("/", 1)[0] or "/"
        found = {path: fs.size(path)}
    elif fs.isdir(path):
        root = path
        found = _find_files(fs, path)
    else:
        raise FileNotFoundError(
            f"DocumentsConfig.input_path: no such file, directory or glob match: {config.input_path}"
        )
    if not found:
        raise FileNotFoundError(f"DocumentsConfig.input_path: no files under {config.input_path}")

    out_fs, out_root = fsspec.core.url_to_fs(config.output_path)
    own_output = out_root.rstrip("/") + "/" if type(out_fs) is type(fs) else None
    readers = {extension.lower(): reader for extension, reader in (config.readers or DEFAULT_READERS).items()}
    include, exclude = _matcher(config.include), _matcher(config.exclude)
    files, ignored, excluded = [], 0, 0
    unsupported: dict[str, int] = {}
    unsupported_examples: list[str] = []
    for name in sorted(found):
        relative = name[len(root) :].lstrip("/")
        if (
            relative.startswith(".")
            or "/." in relative
            or relative in DOWNLOAD_BOOKKEEPING
            or (own_output and name.startswith(own_output))
        ):
            ignored += 1
            continue
        if (include and not include(relative)) or (exclude and exclude(relative)):
            excluded += 1
            continue
        lower = relative.rsplit("/", 1)[-1].lower()
        # Longest extension first: `a.jsonl.gz` is JSON Lines, not an unknown `.gz`.
        dots = [i for i, char in enumerate(lower) if char == "."]
        reader = next((readers[lower[i:]] for i in dots if lower[i:] in readers), None)
        if reader is None:
            extension = "." + lower.rsplit(".", 1)[-1] if "." in lower else "(none)"
            unsupported[extension] = unsupported.get(extension, 0) + 1
            if len(unsupported_examples) < MAX_EXAMPLES:
                unsupported_examples.append(relative)
            continue
        size = found[name]
        if size is None and os.path.islink(name) and not os.path.exists(name):
            raise ValueError(_broken_link_message(relative, name))
        files.append((relative, reader, os.path.getsize(name) if size is None else int(size)))
    if not files:
        raise ValueError(
            f"DocumentsConfig.input_path: none of the {len(found)} files under {config.input_path} "
            f"has a reader ({ignored} hidden/bookkeeping, {excluded} excluded by include/exclude, "
            f"unsupported extensions {unsupported}); check `include`/`exclude` or map the "
            "extensions in `readers`"
        )
    root_url = root if is_local(config.input_path) else fs.unstrip_protocol(root)
    return _Listing(root, root_url, files, ignored, excluded, unsupported, unsupported_examples)


def _broken_link_message(relative: str, path: str) -> str:
    return (
        f"DocumentsConfig.input_path: {relative} is a broken symbolic link (to {os.readlink(path)}); restore "
        f"its target, remove the link, or leave it out with exclude=({relative!r},)"
    )


def _matcher(patterns: tuple[str, ...]) -> Callable[[str], Any] | None:
    """One compiled regex for a tuple of fnmatch patterns (one match per file, not one per pattern)."""
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(pattern)})" for pattern in patterns)).match


def _find_files(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, int | None]:
    """Every file under `path` with its size; None where it is cheaper to stat the files kept."""
    if isinstance(fs, LocalFileSystem):
        # os.walk lists a 50k-file tree in a fifth of the time fs.find takes (it stats everything).
        return {os.path.join(top, name): None for top, _, names in os.walk(path) for name in names}
    return {name: info["size"] for name, info in fs.find(path, detail=True).items()}


def _chunk(files: list[tuple[str, str, int]], target_bytes: int) -> list[list[list[Any]]]:
    """Consecutive runs of the sorted files with about `target_bytes` each: [[path, reader, size], ...]."""
    chunks: list[list[list[Any]]] = []
    current: list[list[Any]] = []
    size = 0
    for relative, reader, file_size in files:
        if current and size + file_size > target_bytes:
            chunks.append(current)
            current, size = [], 0
        current.append([relative, reader, file_size])
        size += file_size
    if current:
        chunks.append(current)
    return chunks


def _check_plan(output_path: str, descriptors: list[str]) -> None:
    """Refuse to resume shards that were cut from a different listing."""
    plan = {"shards": [hashlib.sha256(d.encode("utf-8")).hexdigest() for d in descriptors]}
    path = join(output_path, PLAN_FILE)
    earlier = read_json(path)
    if earlier is not None and earlier != plan:
        raise ValueError(
            f"{output_path} holds shards from an earlier run over a different file listing or "
            "different reading options (input files changed, or include/exclude/readers/"
            "target_shard_bytes/source/text_field changed without changing the output path); "
            f"delete {output_path} and run again"
        )
    if earlier is None:
        write_json_atomic(path, plan)


# --- one shard ------------------------------------------------------------------------


class _Report:
    """Counters of one shard: what was read, what was written, what was skipped and why."""

    def __init__(self) -> None:
        self.stats: dict[str, Any] = {
            "files": 0,
            "files_by_reader": {},
            "input_bytes": 0,
            "documents": 0,
            "text_chars": 0,
            "errors": {},
            "error_examples": {},
        }

    def file(self, reader: str, size: int) -> None:
        self.stats["files"] += 1
        self.stats["input_bytes"] += size
        by_reader = self.stats["files_by_reader"]
        by_reader[reader] = by_reader.get(reader, 0) + 1

    def error(self, kind: str, where: str, count: int = 1) -> None:
        errors, examples = self.stats["errors"], self.stats["error_examples"]
        errors[kind] = errors.get(kind, 0) + count
        kind_examples = examples.setdefault(kind, [])
        if len(kind_examples) < MAX_EXAMPLES:
            kind_examples.append(where)

    def count(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1


@dataclass(frozen=True)
class _Context:
    root: str
    source: str
    text_field: str
    html_extractor: str
    encoding_errors: str
    report: _Report

    def document(self, id: str, text: str, metadata: dict[str, Any]) -> dict[str, Any]:
        self.report.stats["documents"] += 1
        self.report.stats["text_chars"] += len(text)
        return {"id": id, "text": text, "source": self.source, "metadata": metadata}

    def decode(self, data: bytes, where: str) -> str | None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            if self.encoding_errors == "strict":
                self.report.error("non_utf8", where)
                return None
            self.report.count("replaced_non_utf8")
            text = data.decode("utf-8", errors="replace")
        # A byte-order mark is an encoding artefact, not text.
        return text[1:] if text.startswith("\ufeff") else text


def convert_shard(descriptor: str, output_shard: str) -> dict[str, Any]:
    """Read the files of one chunk (a JSON descriptor from `make_documents`) into one shard."""
    spec = json.loads(descriptor)
    report = _Report()
    context = _Context(
        root=spec["root"],
        source=spec["source"],
        text_field=spec["text_field"],
        html_extractor=spec["html_extractor"],
        encoding_errors=spec["encoding_errors"],
        report=report,
    )
    with document_writer(output_shard) as write:
        for relative, reader, size in spec["files"]:
            report.file(reader, size)
            try:
                for document in _READ[reader](context, relative):
                    write(document)
            except FileNotFoundError:
                path = join(context.root, relative)
                if is_local(path) and os.path.islink(path):
                    raise ValueError(_broken_link_message(relative, path)) from None
                raise  # the input changed under us: not a property of the file to count
            except _unreadable_errors() as error:
                logger.warning("%s: unreadable (%s: %s)", relative, type(error).__name__, error)
                report.error("unreadable", relative)
                reasons = report.stats.setdefault("unreadable_reasons", [])
                if len(reasons) < MAX_EXAMPLES:
                    reasons.append([relative, f"{type(error).__name__}: {' '.join(str(error).split())}"])
    return report.stats


@functools.cache
def _unreadable_errors() -> tuple[type[BaseException], ...]:
    """Corrupt files (truncated gzip/zstd, broken Parquet): counted, not fatal."""
    import pyarrow
    import zstandard

    return (OSError, EOFError, pyarrow.ArrowException, zstandard.ZstdError)


def _read_bytes(context: _Context, relative: str) -> bytes:
    with open_compressed(join(context.root, relative)) as handle:
        return handle.read()


def _read_nonempty_text(context: _Context, relative: str) -> str | None:
    """The decoded file, or None after counting it as non-UTF-8 or empty."""
    text = context.decode(_read_bytes(context, relative), relative)
    if text is not None and not text.strip():
        context.report.error("empty", relative)
        return None
    return text


def _read_text(context: _Context, relative: str) -> Iterator[dict[str, Any]]:
    text = _read_nonempty_text(context, relative)
    if text is None:
        return
    yield context.document(relative, text, {"path": relative, "reader": "text"})


def _read_html(context: _Context, relative: str) -> Iterator[dict[str, Any]]:
    html = _read_nonempty_text(context, relative)
    if html is None:
        return
    metadata: dict[str, Any] = {"path": relative, "reader": "html"}
    if context.html_extractor == "trafilatura":
        import trafilatura

        text = trafilatura.extract(html) or ""
    else:
        from resiliparse.extract.html2text import extract_plain_text
        from resiliparse.parse.html import HTMLTree

        tree = HTMLTree.parse(html)
        text = extract_plain_text(tree, main_content=True)
        if tree.title and tree.title.strip():
            metadata["title"] = tree.title.strip()
    if not text.strip():
        context.report.error("no_main_content", relative)
        return
    yield context.document(relative, text, metadata)


_PROVENANCE_KEYS = ("path", "reader", "line", "row")


def _record_document(
    context: _Context, record: Any, id: str, provenance: dict[str, Any]
) -> dict[str, Any] | None:
    text = record.get(context.text_field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        context.report.error("missing_text", id)
        return None
    if not text.strip():
        context.report.error("empty", id)
        return None
    metadata = dict(provenance)
    for key, value in record.items():
        if key != context.text_field:
            # A record field named like a provenance key keeps its value under another name.
            metadata[f"record_{key}" if key in _PROVENANCE_KEYS else key] = value
    return context.document(id, text, metadata)


def _read_jsonl(context: _Context, relative: str) -> Iterator[dict[str, Any]]:
    blank = True
    # (zstandard's own reader cannot be iterated by line, and reads a truncated file as a short one.)
    with open_compressed(join(context.root, relative)) as handle:
        for number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue  # blank lines separate nothing and hold nothing
            blank = False
            where = f"{relative}:{number}"
            line = context.decode(raw, where)
            if line is None:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                context.report.error("malformed_json", where)
                continue
            document = _record_document(
                context, record, where, {"path": relative, "reader": "jsonl", "line": number}
            )
            if document is not None:
                yield document
    if blank:
        context.report.error("empty", relative)


def _read_json(context: _Context, relative: str) -> Iterator[dict[str, Any]]:
    text = context.decode(_read_bytes(context, relative), relative)
    if text is None:
        return
    if not text.strip():
        context.report.error("empty", relative)
        return
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        if error.msg != "Extra data":
            context.report.error("malformed_json", relative)
            return
        # More than one value: a JSON Lines file named .json (common in dataset dumps).
        yield from _read_jsonl(context, relative)
        return
    if value == []:
        context.report.error("empty", relative)
    elif isinstance(value, list):
        for row, record in enumerate(value):
            where = f"{relative}:{row}"
            document = _record_document(
                context, record, where, {"path": relative, "reader": "json", "row": row}
            )
            if document is not None:
                yield document
    else:
        document = _record_document(context, value, relative, {"path": relative, "reader": "json"})
        if document is not None:
            yield document


def _read_parquet(context: _Context, relative: str) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    with fsspec.open(join(context.root, relative), "rb") as handle:
        table = pq.ParquetFile(handle)
        if context.text_field not in table.schema_arrow.names:
            rows = table.metadata.num_rows
            context.report.error(
                "missing_text", f"{relative} (no column {context.text_field!r})", max(rows, 1)
            )
            return
        row = 0
        # Row batches keep memory bounded by the batch, not the file.
        for batch in table.iter_batches(batch_size=1024):
            for record in batch.to_pylist():
                where = f"{relative}:{row}"
                document = _record_document(
                    context, _jsonable(record), where, {"path": relative, "reader": "parquet", "row": row}
                )
                if document is not None:
                    yield document
                row += 1
        if row == 0:
            context.report.error("empty", relative)


def _jsonable(value: Any) -> Any:
    """Parquet values (timestamps, decimals, bytes) as JSON values."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, bytes):
        import base64

        return base64.b64encode(value).decode("ascii")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


_READ = {
    "text": _read_text,
    "jsonl": _read_jsonl,
    "json": _read_json,
    "parquet": _read_parquet,
    "html": _read_html,
}


# --- stats ----------------------------------------------------------------------------


def _summarize(per_shard: list[dict[str, Any]], listing: _Listing, config: DocumentsConfig) -> dict[str, Any]:
    stats = sum_counters(per_shard)
    stats["error_examples"] = {
        kind: examples[:MAX_EXAMPLES] for kind, examples in stats["error_examples"].items()
    }
    error_count = sum(stats["errors"].values())
    inputs = stats["documents"] + error_count
    unreadable = stats["errors"].get("unreadable", 0)
    if "unreadable_reasons" in stats:
        stats["unreadable_reasons"] = stats["unreadable_reasons"][:MAX_EXAMPLES]
    stats.update(
        shards=len(per_shard),
        unreadable_file_fraction=unreadable / stats["files"] if stats["files"] else 0.0,
        error_count=error_count,
        inputs=inputs,
        error_fraction=error_count / inputs if inputs else 0.0,
        max_error_fraction=config.max_error_fraction,
        ignored_files=listing.ignored,
        excluded_files=listing.excluded,
        unsupported_files={
            "count": sum(listing.unsupported.values()),
            "by_extension": listing.unsupported,
            "examples": listing.unsupported_examples,
        },
    )
    return stats


def _error_fraction_message(stats: dict[str, Any], config: DocumentsConfig) -> str | None:
    if stats["inputs"] == 0:
        return (
            f"documents: no input gave a document or an error under {config.input_path} "
            f"({stats['files']} files read); check the input"
        )
    if stats["unreadable_file_fraction"] > config.max_error_fraction:
        # A damaged file counts once among the records, however many it held: judged per file.
        return (
            f"documents: {stats['errors']['unreadable']} of {stats['files']} files under {config.input_path} are "
            f"unreadable (unreadable_file_fraction {stats['unreadable_file_fraction']:.3f} > "
            f"DocumentsConfig.max_error_fraction={config.max_error_fraction}): "
            f"{'; '.join(f'{name} ({reason})' for name, reason in stats['unreadable_reasons'])}. They are "
            "truncated, damaged or not what their name says; only the records before the damage were kept. "
            f"Details in {join(config.output_path, 'stats.json')}. Download or write them again, leave them out "
            "with exclude, or raise max_error_fraction in a new step version."
        )
    if stats["error_fraction"] <= config.max_error_fraction:
        return None
    examples = "; ".join(
        f"{kind}: {', '.join(paths)}" for kind, paths in sorted(stats["error_examples"].items())
    )
    return (
        f"documents: {stats['error_count']} of {stats['inputs']} inputs under {config.input_path} were skipped "
        f"(error fraction {stats['error_fraction']:.3f} > DocumentsConfig.max_error_fraction="
        f"{config.max_error_fraction}): {dict(sorted(stats['errors'].items()))}. Examples -- {examples}. "
        f"Details in {join(config.output_path, 'stats.json')}. Fix the input, or raise max_error_fraction "
        "(and for non-UTF-8 text consider encoding_errors='replace') in a new step version."
    )
