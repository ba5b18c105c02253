"""Tokenizer: train a byte-level BPE tokenizer on a document set, or adopt an existing one.

Either way the output directory is a Hugging Face tokenizer directory that
`transformers.AutoTokenizer.from_pretrained(output_path)` loads (and so does Levanter,
which loads tokenizers the same way):

    tokenizer.json  tokenizer_config.json  special_tokens_map.json  stats.json

Training streams the documents once through `tokenizers`' BPE trainer
(`train_from_iterator`), so memory is bounded by the trainer's word counts, not by the
corpus. The tokenizer is GPT-2 style: byte-level pre-tokenization (every byte string is
encodable, nothing is ever unknown) and one special token, `<|endoftext|>`, used as
bos/eos/pad/unk by default. The tokenizer itself adds no special tokens when encoding;
Levanter's cache builder appends them per document because `bos_token`/`eos_token` are set.

Determinism: the BPE trainer is deterministic for a fixed input order, and documents are
read in shard order, so identical input gives a byte-identical `tokenizer.json` (tested).

A held-out sample -- the documents that `in_validation(id, heldout_fraction, seed)` selects,
which with equal fraction and seed are the validation documents of `operations.tokenize`
(bar the one document it moves to validation when none hashes there) -- is kept out of
training and used to measure characters per token.

`pretrained` instead copies an existing tokenizer: a local or fsspec directory (its files
are copied, model weights skipped, and the copy must load with AutoTokenizer) or, where
the Hugging Face hub is reachable, a hub name (loaded and saved with `save_pretrained`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec

from operations.shards import DataError, atomic_output, document_text, iter_documents, join, write_stats

logger = logging.getLogger(__name__)

ENDOFTEXT = "<|endoftext|>"
BYTE_ALPHABET_SIZE = 256
# Files of a model checkpoint that a tokenizer never needs; skipped when copying a directory.
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".msgpack",
    ".h5",
    ".onnx",
    ".gguf",
    ".npz",
)
# Held-out texts are measured after training; this caps the memory they take.
MAX_HELDOUT_CHARS = 50_000_000


@dataclass(frozen=True)
class TrainTokenizerConfig:
    output_path: str
    """Directory to write the tokenizer files and stats.json into."""

    input_path: str | None = None
    """Document shards to train on (a directory of shards or one shard). Required unless
    `pretrained` is set; with `pretrained` it is optional and only used to measure
    characters per token."""

    pretrained: str | None = None
    """Adopt this existing tokenizer instead of training: a local or fsspec directory that
    AutoTokenizer loads, or a Hugging Face hub name (needs the hub to be reachable)."""

    vocab_size: int = 8192
    """Target vocabulary size, special tokens and the 256 byte tokens included."""

    min_frequency: int = 2
    """A pair of tokens must occur at least this often to be merged."""

    max_documents: int | None = None
    """Read at most this many documents (in shard order); None reads them all."""

    text_field: str = "text"
    """Document field holding the text."""

    bos_token: str | None = ENDOFTEXT
    """Beginning-of-sequence token. Levanter prepends it to every document when set
    (GPT-2 style: the same token as eos). None: no bos."""

    eos_token: str = ENDOFTEXT
    """End-of-sequence token; Levanter appends it to every document."""

    pad_token: str | None = ENDOFTEXT
    """Padding token (None: none)."""

    unk_token: str | None = ENDOFTEXT
    """Unknown token. A byte-level tokenizer never produces it; set for tools that expect one."""

    heldout_fraction: float = 0.05
    """Fraction of documents (chosen by a hash of their id) kept out of training and used
    to measure characters per token. Matches `operations.tokenize`'s validation split."""

    max_heldout_documents: int = 1000
    """Measure characters per token on at most this many held-out documents."""

    seed: int = 0
    """Seed of the held-out hash (use the same seed as the tokenize step)."""


def in_validation(document_id: str, fraction: float, seed: int = 0) -> bool:
    """Deterministic split: True for about `fraction` of ids, the same ids on every machine."""
    return split_key(document_id, seed) < fraction


def split_key(document_id: str, seed: int = 0) -> float:
    """A number in [0, 1) fixed by (id, seed); `in_validation` compares it with the fraction."""
    digest = hashlib.blake2b(f"{seed}\0{document_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def special_tokens(config: TrainTokenizerConfig) -> list[str]:
    """The distinct special tokens of `config`, eos first (it gets id 0)."""
    tokens = [config.eos_token, config.bos_token, config.pad_token, config.unk_token]
    return list(dict.fromkeys(token for token in tokens if token is not None))


def train_tokenizer(config: TrainTokenizerConfig) -> None:
    """Train (or copy) a tokenizer into `config.output_path`; write stats.json."""
    _check(config)
    with tempfile.TemporaryDirectory(prefix="tokenizer-") as staging:
        if config.pretrained is not None:
            stats = _adopt_pretrained(config, staging)
        else:
            stats = _train(config, staging)
        tokenizer = _load_or_explain(staging, config.pretrained or "the trained tokenizer")
        stats.update(_describe(tokenizer))
        if config.pretrained is not None and config.input_path is not None:
            stats["heldout"] = _measure(tokenizer, _heldout_texts(config))
        # Publish only a tokenizer that loaded; stats.json last marks the output complete.
        _publish(staging, config.output_path)
    write_stats(config.output_path, stats)


def _check(config: TrainTokenizerConfig) -> None:
    where = "TrainTokenizerConfig"
    if config.pretrained is None and config.input_path is None:
        raise ValueError(
            f"{where}: set input_path (documents to train on) or pretrained (a tokenizer to copy)"
        )
    if config.pretrained is None:
        floor = BYTE_ALPHABET_SIZE + len(special_tokens(config))
        if config.vocab_size <= floor:
            raise ValueError(
                f"{where}.vocab_size={config.vocab_size}: must exceed {floor} "
                f"(256 byte tokens + {floor - BYTE_ALPHABET_SIZE} special tokens)"
            )
    if config.min_frequency < 1:
        raise ValueError(f"{where}.min_frequency={config.min_frequency}: must be >= 1")
    if not 0.0 <= config.heldout_fraction < 1.0:
        raise ValueError(f"{where}.heldout_fraction={config.heldout_fraction}: must be in [0, 1)")
    if config.max_documents is not None and config.max_documents < 1:
        raise ValueError(f"{where}.max_documents={config.max_documents}: must be >= 1 or None")


def document_texts(input_path: str, text_field: str, max_documents: int | None) -> Iterator[tuple[str, str]]:
    """(id, text) of each document under `input_path`, in shard order, validated."""
    from tqdm.auto import tqdm

    documents = tqdm(iter_documents(input_path), desc="documents", unit="doc", total=max_documents)
    try:
        for index, document in enumerate(documents):
            if max_documents is not None and index >= max_documents:
                return
            text = document_text(document, text_field, input_path, index)
            yield str(document["id"]), text
    except DataError as error:  # a damaged shard, a line that is not a document (file and line named)
        raise DataError(f"tokenizer: {error}") from None
    finally:
        documents.close()


def _train(config: TrainTokenizerConfig, staging: str) -> dict[str, Any]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    assert config.input_path is not None
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=special_tokens(config),
        # All 256 bytes, so that any text can be encoded even if the corpus lacks some bytes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    counts = {"documents": 0, "chars": 0, "bytes": 0, "skipped_empty": 0}
    heldout: list[str] = []
    heldout_chars = 0

    def training_texts() -> Iterator[str]:
        nonlocal heldout_chars
        for document_id, text in document_texts(config.input_path, config.text_field, config.max_documents):
            if not text:
                counts["skipped_empty"] += 1
            elif in_validation(document_id, config.heldout_fraction, config.seed):
                if len(heldout) < config.max_heldout_documents and heldout_chars < MAX_HELDOUT_CHARS:
                    heldout.append(text)
                    heldout_chars += len(text)
            else:
                counts["documents"] += 1
                counts["chars"] += len(text)
                counts["bytes"] += len(text.encode("utf-8"))
                yield text

    tokenizer.train_from_iterator(training_texts(), trainer=trainer)
    if counts["documents"] == 0:
        raise ValueError(
            f"{config.input_path}: no training documents (after {counts['skipped_empty']} empty and the held-out "
            f"ones); add documents or lower heldout_fraction"
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=config.bos_token,
        eos_token=config.eos_token,
        pad_token=config.pad_token,
        unk_token=config.unk_token,
        # Decoding must give back the exact text (code!), not "cleaned up" spacing.
        clean_up_tokenization_spaces=False,
        # GPT-2's inputs; the default adds token_type_ids, which Levanter would store as a second field.
        model_input_names=["input_ids", "attention_mask"],
    )
    fast.save_pretrained(staging)
    return {
        "kind": "trained",
        "requested_vocab_size": config.vocab_size,
        "min_frequency": config.min_frequency,
        "training": counts,
        "heldout": _measure(fast, heldout),
    }


def _heldout_texts(config: TrainTokenizerConfig) -> list[str]:
    assert config.input_path is not None
    texts: list[str] = []
    for document_id, text in document_texts(config.input_path, config.text_field, config.max_documents):
        if text and in_validation(document_id, config.heldout_fraction, config.seed):
            texts.append(text)
            if len(texts) >= config.max_heldout_documents:
                break
    return texts


def _measure(tokenizer: Any, texts: list[str]) -> dict[str, Any]:
    """Characters per token of `tokenizer` on `texts` (no special tokens added)."""
    tokens = 0
    for start in range(0, len(texts), 256):
        batch = tokenizer(texts[start : start + 256], add_special_tokens=False, verbose=False)["input_ids"]
        tokens += sum(len(ids) for ids in batch)
    chars = sum(len(text) for text in texts)
    return {
        "documents": len(texts),
        "chars": chars,
        "tokens": tokens,
        "chars_per_token": round(chars / tokens, 4) if tokens else None,
    }


def _describe(tokenizer: Any) -> dict[str, Any]:
    return {
        "vocab_size": len(tokenizer),
        "special_tokens": {
            name: getattr(tokenizer, name) for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        },
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }


def _load_or_explain(directory: str, what: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(directory)
    except Exception as error:
        raise ValueError(
            f"{what}: AutoTokenizer.from_pretrained cannot load it ({type(error).__name__}: {error}); "
            "point pretrained at a directory holding tokenizer.json or the files of a Hugging Face tokenizer"
        ) from error


def _adopt_pretrained(config: TrainTokenizerConfig, staging: str) -> dict[str, Any]:
    source = config.pretrained
    assert source is not None
    fs, root = fsspec.core.url_to_fs(source)
    if fs.isdir(root):
        copied = []
        for entry in sorted(fs.ls(root, detail=True), key=lambda e: e["name"]):
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if entry["type"] != "file" or name.endswith(WEIGHT_SUFFIXES) or name.startswith("."):
                continue
            if name == "stats.json":  # the source's own stats, if it came from this operation
                continue
            fs.get(entry["name"], os.path.join(staging, name))
            copied.append(name)
        if not copied:
            raise ValueError(f"pretrained={source!r}: directory has no tokenizer files")
        return {"kind": "copied", "source": source, "files": copied}
    if _looks_like_path(source):
        raise FileNotFoundError(f"pretrained={source!r}: no such tokenizer directory")
    # A Hugging Face hub name; only works where the hub is reachable.
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(source).save_pretrained(staging)
    return {"kind": "hub", "source": source, "files": sorted(os.listdir(staging))}


def _looks_like_path(name: str) -> bool:
    return "://" in name or name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.path.exists(name)


def _publish(staging: str, output_path: str) -> None:
    """Copy every staged file into `output_path`, each one atomically."""
    for name in sorted(os.listdir(staging)):
        with (
            open(os.path.join(staging, name), "rb") as source,
            atomic_output(join(output_path, name)) as target,
        ):
            target.write(source.read())
    logger.info("tokenizer written to %s", output_path)
