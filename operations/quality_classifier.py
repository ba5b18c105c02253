"""A fastText quality classifier: train it on good and bad documents, then score and filter a corpus.

Two operations:

- `train_quality_classifier(TrainQualityClassifierConfig)` reads a positive and a
  negative set of document shards, holds out a deterministic validation split (by a
  hash of each document's id), trains a supervised fastText model with the labels
  `__label__positive` / `__label__negative`, and writes `model.bin` and `stats.json`
  (document counts per class and split, train and validation accuracy, precision and
  recall of the positive label, model size, the fastText parameters).
- `score_quality(ScoreQualityConfig)` writes the probability of one label (by default
  `positive`) into every document's `metadata["quality_score"]` (rounded to 6 decimals;
  the stored value is the one compared with the threshold), keeps documents with a
  score >= `threshold`, and writes `stats.json` with kept/dropped counts and a
  10-bin score histogram. Shards map 1:1 via `map_shards` (parallel, atomic, resumable,
  byte-identical on rerun). To score without dropping anything use `threshold=0.0`; to
  filter on scores later, use `operations.filter.MinQualityScore`.

fastText sees each document as one line: lowercased, whitespace (newlines included)
collapsed to single spaces (`normalize_text`); the same normalisation is used in
training and scoring.

Determinism: training runs fastText with `thread=1` and a fixed `seed`, the training
file's order is a seeded hash order, and the matrix memory fastText leaves uninitialised
is zero-filled (`_zero_filled_allocations`, glibc), so the same inputs and config give a
byte-identical `model.bin`, in one process or several (checked by the tests; fastText's
multi-threaded Hogwild training would not). The validation split depends on the ids only,
not on the seed, so models trained with different seeds are validated on the same documents.

Memory: the training file is written to local temporary disk while streaming the
inputs; only (sort key, offset, length) per document is held in memory to shuffle it.
Note fastText's model size is about (vocabulary + `bucket`) x `dim` x 4 bytes, hence
the small default `bucket` (fastText's own default of 2M buckets gives ~0.5 GB at dim 64).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import fsspec

from operations.shards import (
    atomic_output,
    document_writer,
    is_local,
    iter_documents,
    join,
    list_shards,
    map_shards,
    read_documents,
    sum_counters,
    write_stats,
)

POSITIVE = "positive"
NEGATIVE = "negative"
MODEL_FILE = "model.bin"
SCORE_KEY = "quality_score"
_WHITESPACE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """fastText's view of a document: lowercase, whitespace collapsed, one line."""
    return _WHITESPACE.sub(" ", text.lower()).strip()


def _unit_hash(*parts: Any) -> float:
    """A deterministic number in [0, 1) from `parts` (same on every machine and run)."""
    digest = hashlib.blake2b("\0".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


# --- training ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainQualityClassifierConfig:
    """Train a fastText classifier separating positive (good) from negative (bad) documents."""

    positive_path: str
    """Document shards (a directory or one shard) of good documents."""
    negative_path: str
    """Document shards of bad documents."""
    output_path: str
    """Where `model.bin` and `stats.json` go."""
    epochs: int = 5
    """fastText `epoch`: passes over the training file."""
    lr: float = 0.1
    """fastText learning rate."""
    word_ngrams: int = 2
    """fastText `wordNgrams`: longest word n-gram used as a feature."""
    dim: int = 64
    """Size of the word vectors."""
    bucket: int = 50_000
    """Hash buckets for n-gram features; the model is about (vocabulary + bucket) x dim x 4 bytes."""
    min_count: int = 1
    """Words seen fewer times are left out of the vocabulary."""
    seed: int = 0
    """Seeds fastText and the training-file order; same seed, same model bytes."""
    max_docs_per_class: int | None = 100_000
    """Use at most this many documents of each class (the first ones, in shard order); None: all."""
    validation_fraction: float = 0.1
    """Share of each class held out for validation (chosen by a hash of the id, not by order)."""


def _labelled_lines(path: str, label: str, limit: int | None) -> Iterator[tuple[str, str]]:
    """(id, fastText line, or "" for an empty document) for the first `limit` documents under `path`."""
    for number, document in enumerate(iter_documents(path), 1):
        if limit is not None and number > limit:
            return
        text = document.get("text") if isinstance(document, dict) else None
        if not isinstance(text, str) or "id" not in document:
            raise ValueError(
                f"{path}: document {number} needs a string 'text' and an 'id' (got keys "
                f"{sorted(document) if isinstance(document, dict) else type(document).__name__})"
            )
        normalized = normalize_text(text)
        yield str(document["id"]), f"__label__{label} {normalized}" if normalized else ""


def _write_splits(config: TrainQualityClassifierConfig, workdir: str) -> dict[str, Any]:
    """Write `train.txt` (seeded hash order) and `validation.txt`; return the counts."""
    from tqdm.auto import tqdm

    raw_path = os.path.join(workdir, "raw.txt")
    order: list[tuple[float, int, int]] = []  # (sort key, offset, length) of each training line
    counts: dict[str, dict[str, int]] = {}
    with open(raw_path, "wb") as raw, open(os.path.join(workdir, "validation.txt"), "wb") as validation:
        for label, path in ((POSITIVE, config.positive_path), (NEGATIVE, config.negative_path)):
            counts[label] = {"train": 0, "validation": 0, "empty": 0}
            lines = _labelled_lines(path, label, config.max_docs_per_class)
            for document_id, line in tqdm(lines, desc=f"read {label}", unit="doc", leave=False):
                if not line:
                    counts[label]["empty"] += 1
                    continue
                data = (line + "\n").encode("utf-8")
                if _unit_hash("validation", document_id) < config.validation_fraction:
                    validation.write(data)
                    counts[label]["validation"] += 1
                else:
                    order.append((_unit_hash(config.seed, label, document_id), raw.tell(), len(data)))
                    raw.write(data)
                    counts[label]["train"] += 1
    for label in (POSITIVE, NEGATIVE):
        if counts[label]["train"] == 0:
            path = config.positive_path if label == POSITIVE else config.negative_path
            raise ValueError(
                f"no {label} training documents under {path} (after holding out validation_fraction="
                f"{config.validation_fraction}); give it non-empty documents"
            )
    order.sort()
    with open(raw_path, "rb") as raw, open(os.path.join(workdir, "train.txt"), "wb") as train:
        for _, offset, length in order:
            raw.seek(offset)
            train.write(raw.read(length))
    os.unlink(raw_path)
    return counts


@contextlib.contextmanager
def _zero_filled_allocations() -> Iterator[None]:
    """Make glibc's malloc return zero-filled memory while fastText trains.

    With `thread=1`, fastText seeds only the first tenth of its input matrix (one block of
    ten per thread) and relies on the rest being zero. With fasttext-numpy2 those rows are
    whatever the allocator hands back: zeros from fresh pages in a new process, but stale
    data once the process has freed a bigger block -- we measured "Encountered NaN" (and
    models that differ for the same seed) on a training that followed a bigger one in the
    same process. glibc's M_PERTURB=255 makes every allocation large enough to hold a
    matrix zero-filled, which restores the zero rows and makes training deterministic
    within and across processes. Elsewhere (not glibc) this does nothing.
    """
    libc = _glibc()
    if libc is None:
        yield
        return
    libc.mallopt(_M_PERTURB, 255)
    try:
        yield
    finally:
        libc.mallopt(_M_PERTURB, 0)


_M_PERTURB = -6  # glibc malloc.h


@functools.cache
def _glibc() -> Any:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL(None)
    return libc if hasattr(libc, "mallopt") else None


def _evaluate(model: Any, path: str) -> dict[str, Any]:
    """Accuracy, and precision/recall of the positive label, of `model` on a labelled file."""
    tp = fp = fn = correct = total = 0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            label, _, text = line.rstrip("\n").partition(" ")
            predicted = model.predict(text, k=1)[0][0]
            total += 1
            correct += predicted == label
            positive, predicted_positive = (
                label == f"__label__{POSITIVE}",
                predicted == f"__label__{POSITIVE}",
            )
            tp += positive and predicted_positive
            fp += predicted_positive and not positive
            fn += positive and not predicted_positive
    return {
        "examples": total,
        "accuracy": correct / total if total else None,
        "precision": tp / (tp + fp) if tp + fp else None,
        "recall": tp / (tp + fn) if tp + fn else None,
    }


def train_quality_classifier(config: TrainQualityClassifierConfig) -> None:
    """Train the classifier; write `model.bin` and `stats.json` under `config.output_path`."""
    import fasttext

    if not 0.0 <= config.validation_fraction < 1.0:
        raise ValueError(
            f"TrainQualityClassifierConfig.validation_fraction must be in [0, 1), got {config.validation_fraction}"
        )
    with tempfile.TemporaryDirectory(prefix="quality-classifier-") as workdir:
        counts = _write_splits(config, workdir)
        try:
            with _zero_filled_allocations():
                model = fasttext.train_supervised(
                    input=os.path.join(workdir, "train.txt"),
                    epoch=config.epochs,
                    lr=config.lr,
                    wordNgrams=config.word_ngrams,
                    dim=config.dim,
                    bucket=config.bucket,
                    minCount=config.min_count,
                    seed=config.seed,
                    thread=1,  # fastText is deterministic only single-threaded
                    verbose=0,
                )
        except RuntimeError as error:
            raise ValueError(
                f"fastText training failed ({error}) for {config.output_path}; if it says NaN, the training "
                "diverged: lower TrainQualityClassifierConfig.lr"
            ) from error
        train_metrics = _evaluate(model, os.path.join(workdir, "train.txt"))
        validation_metrics = _evaluate(model, os.path.join(workdir, "validation.txt"))
        model_file = os.path.join(workdir, MODEL_FILE)
        model.save_model(model_file)
        with open(model_file, "rb") as source, atomic_output(join(config.output_path, MODEL_FILE)) as target:
            shutil.copyfileobj(source, target)
        model_bytes = os.path.getsize(model_file)
    write_stats(
        config.output_path,
        {
            "documents": counts,
            "train": train_metrics,
            "validation": validation_metrics,
            "labels": list(model.labels),
            "vocabulary": len(model.words),
            "model_bytes": model_bytes,
            "params": {key: value for key, value in asdict(config).items() if not key.endswith("_path")},
        },
    )


# --- scoring ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoreQualityConfig:
    """Score every document with a trained classifier and keep those scoring >= threshold."""

    input_path: str
    """Document shards (a directory or one shard) to score."""
    model_path: str
    """A fastText model file, or the output directory of `train_quality_classifier` (uses its model.bin)."""
    output_path: str
    """Where the kept, scored shards and `stats.json` go."""
    threshold: float = 0.5
    """Keep documents whose score is >= this; 0.0 keeps (and scores) everything."""
    label: str = POSITIVE
    """The label whose probability is the score (without fastText's `__label__` prefix)."""
    metadata_key: str = SCORE_KEY
    """The `metadata` field the score is written to."""
    workers: int | None = None
    """Parallel processes over shards (None: one per core)."""


def _model_file(model_path: str) -> str:
    return model_path if model_path.endswith((".bin", ".ftz")) else join(model_path, MODEL_FILE)


@functools.cache
def _load_model(model_file: str) -> Any:
    """The fastText model, loaded once per process (copied to local disk first if remote)."""
    from fasttext.FastText import _FastText  # load_model() without its stderr warning

    if is_local(model_file):
        local = model_file.removeprefix("file://")
        if not os.path.exists(local):
            raise FileNotFoundError(
                f"no fastText model at {model_file}; train one with train_quality_classifier or fix model_path"
            )
        return _FastText(model_path=local)
    with tempfile.TemporaryDirectory(prefix="quality-model-") as workdir:
        local = os.path.join(workdir, MODEL_FILE)
        with fsspec.open(model_file, "rb") as source, open(local, "wb") as target:
            shutil.copyfileobj(source, target)
        return _FastText(model_path=local)


def _histogram_bin(score: float) -> str:
    index = min(int(score * 10), 9)
    return f"{index / 10:.1f}-{(index + 1) / 10:.1f}"


def score_shard(config: ScoreQualityConfig, input_shard: str, output_shard: str) -> dict[str, Any]:
    """Score and filter one shard (the per-shard function given to `map_shards`); returns its counters."""
    model = _load_model(_model_file(config.model_path))
    label = f"__label__{config.label}"
    if label not in model.labels:
        raise ValueError(
            f"label {config.label!r} is not in the model {_model_file(config.model_path)} "
            f"(its labels: {', '.join(item.removeprefix('__label__') for item in model.labels)}); "
            "fix ScoreQualityConfig.label"
        )
    counts = {"input": 0, "kept": 0, "dropped": 0}
    histogram = {_histogram_bin(index / 10): 0 for index in range(10)}
    score_sum = 0.0
    with document_writer(output_shard) as write:
        for number, document in enumerate(read_documents(input_shard), 1):
            text = document.get("text") if isinstance(document, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"{input_shard}, document {number}: field 'text' must be a string")
            metadata = document.get("metadata")
            if metadata is None:
                metadata = document["metadata"] = {}
            if not isinstance(metadata, dict):
                raise ValueError(
                    f"{input_shard}, document {number}: field 'metadata' must be an object, "
                    f"got {type(metadata).__name__}"
                )
            labels, probabilities = model.predict(normalize_text(text), k=-1)
            probability = dict(zip(labels, probabilities, strict=True)).get(label, 0.0)
            score = round(min(max(float(probability), 0.0), 1.0), 6)
            metadata[config.metadata_key] = score
            counts["input"] += 1
            score_sum += score
            histogram[_histogram_bin(score)] += 1
            if score >= config.threshold:
                counts["kept"] += 1
                write(document)
            else:
                counts["dropped"] += 1
    return {"documents": counts, "score_histogram": histogram, "score_sum": score_sum}


def score_quality(config: ScoreQualityConfig) -> None:
    """Score every document under `config.input_path`; keep those >= threshold (see the module docstring)."""
    inputs = list_shards(config.input_path)
    _load_model(_model_file(config.model_path))  # fail early, in the driver, on a missing model
    per_shard = map_shards(
        functools.partial(score_shard, config),
        inputs,
        config.output_path,
        workers=config.workers,
        description="score quality",
    )
    totals = sum_counters(per_shard)
    scored = totals["documents"]["input"]
    totals["mean_score"] = round(totals.pop("score_sum") / scored, 6) if scored else None
    totals["threshold"] = config.threshold
    totals["label"] = config.label
    totals["shards"] = len(inputs)
    write_stats(config.output_path, totals)
