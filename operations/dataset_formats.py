"""Levanter's dataset formats, turned into the document shards that `operations.tokenize` reads.

Marin's `default_tokenize(name, dataset, tokenizer, format=..., sample_count=...)` hands
Levanter a dataset *format* (`levanter.data.text.TextLmDatasetFormat`,
`ChatLmDatasetFormat`, ...) and tokenizes raw files with it. Here tokenizing reads document
shards (`operations.shards`), so a format becomes the step that makes those shards:

- `TextLmDatasetFormat(text_key=...)`: `operations.documents.make_documents` with
  `text_field=text_key` (JSON Lines, Parquet, plain text, ...). See `text_field_of`.
- `ChatLmDatasetFormat(messages_field=..., chat_template=...)`: `render_chats`, which renders
  every conversation to text with the chat template (the format's, else the tokenizer's)
  through `transformers`' `apply_chat_template`. The text is then tokenized like any other:
  every token counts in the loss. Levanter's `mask_user_turns` (loss on assistant turns
  only) needs per-token loss masks, which the token caches here do not carry yet.
- `sample_documents`: the first `per_shard` documents of every shard (Marin's
  `sample_count`, "at most N documents per shard"; a shard here is a document shard, about
  8 MB of input, not an input file).

`format_kind(format)` reads a format object by its fields, so declaring a step never imports
Levanter. The configs hold plain values; the format's own object is not kept.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import fsspec

from operations.shards import (
    document_writer,
    is_local,
    list_shards,
    map_shards,
    open_compressed,
    read_documents,
    write_stats,
)

logger = logging.getLogger(__name__)

CHAT_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".ndjson", ".parquet")
"""Raw files `render_chats` reads (JSON Lines, optionally compressed, and Parquet)."""

_BOOKKEEPING = frozenset({"manifest.json", "stats.json"})


def format_kind(format: Any) -> str:  # noqa: A002 -- Marin's argument name
    """ "text", "chat" or "supervised" for a Levanter dataset format (or None: "text");
    ValueError for anything else."""
    if format is None:
        return "text"
    name = type(format).__name__
    if name == "TextLmDatasetFormat" or (
        hasattr(format, "text_key") and not hasattr(format, "messages_field")
    ):
        return "text"
    if name == "ChatLmDatasetFormat" or hasattr(format, "messages_field"):
        return "chat"
    if name == "SupervisedLmDatasetFormat":
        return "supervised"
    raise ValueError(
        f"format: {type(format).__module__}.{name} is not a Levanter dataset format this project reads; "
        "use levanter.data.text.TextLmDatasetFormat(text_key=...) or ChatLmDatasetFormat(...)"
    )


def text_field_of(format: Any) -> str:  # noqa: A002
    """The record field holding the text, for a text format (None: "text")."""
    return "text" if format is None else format.text_key


# ---------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class SampleConfig:
    input_path: str
    """Document shards."""

    output_path: str
    """The sampled shards (same names) and stats.json."""

    per_shard: int
    """Documents kept from the start of every shard."""

    workers: int | None = None
    """Parallel processes; None: one per core."""


def sample_documents(config: SampleConfig) -> None:
    """Keep the first `per_shard` documents of every shard."""
    if config.per_shard < 1:
        raise ValueError(f"SampleConfig.per_shard={config.per_shard}: must be >= 1")
    started = time.perf_counter()
    per_shard = map_shards(
        functools.partial(_take_shard, config.per_shard),
        list_shards(config.input_path),
        config.output_path,
        workers=config.workers,
        description=f"first {config.per_shard} documents per shard",
    )
    documents = sum(stats["documents"] for stats in per_shard)
    write_stats(
        config.output_path,
        {
            "shards": len(per_shard),
            "documents": documents,
            "documents_skipped": sum(stats["skipped"] for stats in per_shard),
            "seconds": round(time.perf_counter() - started, 2),
        },
    )


def _take_shard(limit: int, input_shard: str, output_shard: str) -> dict[str, Any]:
    kept = skipped = 0
    with document_writer(output_shard) as write:
        for document in read_documents(input_shard):
            if kept < limit:
                write(document)
                kept += 1
            else:
                skipped += 1
    return {"documents": kept, "skipped": skipped}


# ---------------------------------------------------------------------------- chat


@dataclass(frozen=True)
class ChatDocumentsConfig:
    input_path: str
    """Raw files (a directory searched recursively, or one file): JSON Lines or Parquet records
    holding a list of `{"role": ..., "content": ...}` messages."""

    output_path: str
    """Document shards (one per input file) and stats.json."""

    tokenizer: str
    """Tokenizer directory or Hub id whose chat template renders the conversations."""

    messages_field: str = "messages"
    """Record field holding the conversation."""

    chat_template: str | None = None
    """A Jinja chat template; None: the tokenizer's."""

    source: str = "chat"
    """Every document's `source` field."""

    workers: int | None = None
    """Parallel processes; None: one per core."""


def render_chats(config: ChatDocumentsConfig) -> None:
    """Render every conversation under `input_path` to text: one document per record."""
    from operations.hub import resolve_tokenizer

    started = time.perf_counter()
    files = _chat_files(config.input_path)
    tokenizer = resolve_tokenizer(config.tokenizer)
    _template(tokenizer, config.chat_template)  # fail here, not in every worker
    root = config.input_path.rstrip("/")
    per_shard = map_shards(
        functools.partial(
            _render_file, tokenizer, config.chat_template, config.messages_field, config.source, root
        ),
        files,
        config.output_path,
        workers=config.workers,
        description=f"chats from {config.input_path}",
    )
    stats = {
        "files": len(files),
        "documents": sum(shard["documents"] for shard in per_shard),
        "missing_messages": sum(shard["missing_messages"] for shard in per_shard),
        "seconds": round(time.perf_counter() - started, 2),
    }
    write_stats(config.output_path, stats)
    if stats["documents"] == 0:
        raise ValueError(
            f"{config.input_path}: no record has a list in {config.messages_field!r} "
            f"({stats['missing_messages']} records without); set the format's messages_field"
        )


def _chat_files(input_path: str) -> list[str]:
    fs, root = fsspec.core.url_to_fs(input_path)
    if fs.isfile(root):
        names = [root]
    else:
        names = sorted(fs.find(root))
    files = [
        name if is_local(input_path) else fs.unstrip_protocol(name)
        for name in names
        if name.lower().endswith(CHAT_SUFFIXES)
        and not any(part.startswith(".") for part in name[len(root) :].split("/"))
        and name.rsplit("/", 1)[-1] not in _BOOKKEEPING
    ]
    if not files:
        raise FileNotFoundError(
            f"{input_path}: no JSON Lines or Parquet files ({', '.join(CHAT_SUFFIXES)}) with conversations"
        )
    return files


@functools.cache
def _load_tokenizer(tokenizer: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer)


def _template(tokenizer: str, chat_template: str | None) -> str:
    template = chat_template or _load_tokenizer(tokenizer).chat_template
    if not template:
        raise ValueError(
            f"tokenizer {tokenizer}: it has no chat template; give ChatLmDatasetFormat(chat_template=...)"
        )
    return template


def _records(path: str) -> Any:
    """(position, record) of every record of one JSON Lines or Parquet file."""
    if path.lower().endswith(".parquet"):
        import pyarrow.parquet as pq

        with fsspec.open(path, "rb") as handle:
            table = pq.read_table(handle)
        yield from enumerate(table.to_pylist())
        return
    # (A truncated .zst file is an error here, not a short file: `open_compressed`.)
    with open_compressed(path) as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                yield number, json.loads(line)


def _render_file(
    tokenizer: str,
    chat_template: str | None,
    messages_field: str,
    source: str,
    root: str,
    input_file: str,
    output_shard: str,
) -> dict[str, Any]:
    template = _template(tokenizer, chat_template)
    render = _load_tokenizer(tokenizer).apply_chat_template
    relative = input_file[len(root) :].lstrip("/") or input_file.rsplit("/", 1)[-1]
    documents = missing = 0
    with document_writer(output_shard) as write:
        for position, record in _records(input_file):
            messages = record.get(messages_field) if isinstance(record, dict) else None
            if not isinstance(messages, list) or not messages:
                missing += 1
                continue
            text = render(messages, tokenize=False, chat_template=template)
            metadata = {"path": relative, "messages": len(messages)}
            write({"id": f"{relative}:{position}", "text": text, "source": source, "metadata": metadata})
            documents += 1
    return {"documents": documents, "missing_messages": missing}
