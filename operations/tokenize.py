"""Tokenize: documents -> Levanter token caches (train and validation) that training loads.

The output directory is laid out the way Levanter's LM data config expects a
`cache_dir` to be, so the training step points Levanter at it and nothing is converted:

    <output_path>/train/                      Levanter cache (shard_ledger.json + token arrays)
    <output_path>/validation/                 Levanter cache
    <output_path>/documents/train/*.jsonl.gz  the documents of each split (provenance, rebuilds)
    <output_path>/documents/validation/*.jsonl.gz
    <output_path>/stats.json                  documents, tokens and characters per split

Two phases:

1. Split (`split_documents`): `map_shards` streams every input shard once and writes
   each document to the train or the validation shard of the same index. A document is
   in validation iff `in_validation(id, validation_fraction, seed)` -- a hash of its id,
   so the split does not depend on shard boundaries, order or machine. If no document
   hashes into validation (tiny corpora), the one with the smallest hash is moved there,
   so validation always has at least one document. Resumable and byte-identical per shard.
2. Cache (`build_caches`): Levanter's cache builder tokenizes each split with Levanter's
   `BatchTokenizer` (which prepends bos and appends eos to every document when the
   tokenizer defines them) into Levanter's cache format, resuming per shard. Two ways to
   run it, with byte-identical results (tested):

   - `builder="ray"`: `build_or_load_cache`, driven by the same `UrlSingleDatasetLMConfig`
     that `lm_data_config` gives the training step. It joins the Ray cluster this process
     is connected to, or starts a local one. Shard groups run as Ray tasks, so it scales
     out on a cluster -- but every cache costs three fresh Ray worker processes (builder
     actor, writer task, tokenize task), each importing Levanter and JAX: ~10 s per split
     on a 2-core machine, plus ~6 s to start Ray.
   - `builder="in_process"`: the same per-shard-group loop Levanter's Ray task runs
     (`levanter.store.cache._tokenize_one_shard_group`), called in this process for one
     group of all shards. No Ray, no worker start-up; the HF tokenizer still uses every
     core. On one machine that is what the Ray builder does anyway, minus the fixed costs.
     Its processor is `fast_batch_tokenizer`: Levanter's `BatchTokenizer` (same texts,
     same metadata) encoding through the `tokenizers` backend's `encode_batch_fast`, which
     skips the character offsets transformers asks for and never uses -- about half the
     encoding time. The ids, and so the caches, are Levanter's own (tested).
   - `builder="auto"` (default): "ray" when this process is already connected to Ray (a
     cluster, or a step running inside a Ray task), else "in_process".

   A finished cache is never rebuilt (and is loaded without Ray).

Levanter and JAX are imported inside the functions, so importing `operations` (or a dry
run of an experiment) stays light.

Training loads the result with `lm_data_config(output_path, tokenizer)`:

    data = lm_data_config(tokenized_path, tokenizer_path)     # levanter UrlSingleDatasetLMConfig
    train = data.train_set(Pos, BatchSchedule(batch_size), key=key)
    validation = data.validation_set(Pos)
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from operations.shards import (
    SHARD_STATS_DIR,
    document_text,
    document_writer,
    is_local,
    join,
    list_shards,
    map_shards,
    read_documents,
    read_json,
    shard_name,
    write_json_atomic,
    write_stats,
)
from operations.tokenizer import in_validation, split_key

if TYPE_CHECKING:
    from levanter.data.text import UrlSingleDatasetLMConfig

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation")
DOCUMENTS_DIR = "documents"
BUILDERS = ("auto", "ray", "in_process")
LEDGER_FILE = "shard_ledger.json"
# Levanter copies each extra shard group into the final cache with a Ray task that asks for
# 4 CPUs and 6 GiB; on a smaller Ray cluster it is never scheduled and the build waits forever.
COPY_TASK_CPUS = 4
AUTO_MANY_GROUPS_MIN_CPUS = 8


@dataclass(frozen=True)
class TokenizeConfig:
    input_path: str
    """Document shards to tokenize (a directory of shards or one shard)."""

    tokenizer: str
    """Tokenizer directory (e.g. the output of operations.tokenizer; a local path is safest,
    Levanter loads fsspec URLs too) or a Hugging Face hub name where the hub is reachable.
    Training must use the same tokenizer."""

    output_path: str
    """Directory for the train/ and validation/ caches, the split documents and stats.json."""

    validation_fraction: float = 0.05
    """Fraction of documents (chosen by a hash of their id) that go to validation; at least one does."""

    seed: int = 0
    """Seed of the split hash (the same seed in operations.tokenizer keeps validation out of its training)."""

    text_field: str = "text"
    """Document field holding the text."""

    builder: str = "auto"
    """How Levanter's cache builder runs: "ray", "in_process" or "auto" ("ray" when this
    process is connected to Ray, else "in_process"). The caches are byte-identical either way."""

    num_shard_groups: int | None = None
    """With builder="ray": Levanter's CacheOptions.num_shard_groups (shards are tokenized in
    this many parallel groups, then concatenated in order; the cache is the same either
    way). None: one group when the Ray cluster has fewer than 8 CPUs (Levanter's
    concatenation task needs 4 free CPUs), else Levanter's default (128)."""

    workers: int | None = None
    """Processes for the split phase (default: one per core)."""


def tokenize(config: TokenizeConfig) -> None:
    """Split the documents, build both Levanter caches, write stats.json."""
    _check(config)
    started = time.perf_counter()
    per_shard = split_documents(config)
    split_s = time.perf_counter() - started
    build_caches(config)
    logger.info("tokenize: split %.1f s, caches %.1f s", split_s, time.perf_counter() - started - split_s)
    write_tokenize_stats(config, per_shard)


def _check(config: TokenizeConfig) -> None:
    if not 0.0 < config.validation_fraction < 1.0:
        raise ValueError(
            f"TokenizeConfig.validation_fraction={config.validation_fraction}: must be in (0, 1) "
            "(training needs documents in both splits)"
        )
    if config.builder not in BUILDERS:
        raise ValueError(f"TokenizeConfig.builder={config.builder!r}: must be one of {', '.join(BUILDERS)}")
    if config.num_shard_groups is not None and config.num_shard_groups < 1:
        raise ValueError(f"TokenizeConfig.num_shard_groups={config.num_shard_groups}: must be >= 1 or None")


# ---------------------------------------------------------------------------- split


def split_shard(
    input_shard: str,
    output_shard: str,
    *,
    fraction: float,
    seed: int,
    text_field: str,
    force_validation_id: str | None = None,
) -> dict[str, Any]:
    """Write the documents of `input_shard` to `output_shard` (train) or its validation twin.

    `output_shard` is `<dir>/documents/train/<name>`; validation goes to
    `<dir>/documents/validation/<name>`. Empty texts are counted and skipped.
    """
    base, _train, name = output_shard.rsplit("/", 2)
    validation_shard = join(base, "validation", name)
    counts: dict[str, Any] = {split: {"documents": 0, "chars": 0} for split in SPLITS}
    counts["skipped_empty"] = 0
    first_train: tuple[float, str] | None = None
    with document_writer(validation_shard) as write_validation, document_writer(output_shard) as write_train:
        for index, document in enumerate(read_documents(input_shard)):
            text = document_text(document, text_field, input_shard, index)
            if not text.strip():
                # Would become a bos/eos pair with nothing between: noise for training.
                counts["skipped_empty"] += 1
                continue
            document_id = str(document["id"])
            if document_id == force_validation_id or in_validation(document_id, fraction, seed):
                write_validation(document)
                split = "validation"
            else:
                write_train(document)
                split = "train"
                key = (split_key(document_id, seed), document_id)
                if first_train is None or key < first_train:
                    first_train = key
            counts[split]["documents"] += 1
            counts[split]["chars"] += len(text)
    counts["first_train"] = None if first_train is None else {"bucket": first_train[0], "id": first_train[1]}
    return counts


def split_documents(config: TokenizeConfig) -> list[dict[str, Any]]:
    """Phase 1: write documents/{train,validation}/ shards; returns each input shard's counters."""
    inputs = list_shards(config.input_path)
    train_dir = _documents_dir(config.output_path, "train")
    split = functools.partial(
        split_shard, fraction=config.validation_fraction, seed=config.seed, text_field=config.text_field
    )
    per_shard = map_shards(split, inputs, train_dir, workers=config.workers, description="split")
    if sum(stats["validation"]["documents"] for stats in per_shard) == 0:
        # Too few documents for the fraction: move the train document with the smallest hash,
        # so the choice is as deterministic as the split itself.
        candidates = [
            (stats["first_train"]["bucket"], stats["first_train"]["id"], index)
            for index, stats in enumerate(per_shard)
            if stats["first_train"] is not None
        ]
        if not candidates:
            raise ValueError(f"{config.input_path}: no non-empty documents to tokenize")
        _, document_id, index = min(candidates)
        output_shard = join(train_dir, shard_name(index))
        per_shard[index] = split(inputs[index], output_shard, force_validation_id=document_id)
        write_json_atomic(join(train_dir, SHARD_STATS_DIR, shard_name(index) + ".json"), per_shard[index])
    if sum(stats["train"]["documents"] for stats in per_shard) == 0:
        raise ValueError(
            f"{config.input_path}: every document went to validation; add documents or lower validation_fraction"
        )
    return per_shard


def _documents_dir(output_path: str, split: str) -> str:
    return join(output_path, DOCUMENTS_DIR, split)


# ---------------------------------------------------------------------------- Levanter


def lm_data_config(
    tokenized_path: str,
    tokenizer_path: str,
    *,
    text_field: str = "text",
    include_raw_paths: bool = True,
    cache_options: Any = None,
) -> UrlSingleDatasetLMConfig:
    """Levanter's LM data config for the output of `tokenize`: what the training step uses.

    `cache_dir` is `tokenized_path`, so Levanter loads `train/` and `validation/` as they
    are. With `include_raw_paths` the split documents are listed too (provenance, and
    Levanter could rebuild a deleted cache from them).
    """
    from levanter.data.text import TextLmDatasetFormat, UrlSingleDatasetLMConfig
    from levanter.store.cache import CacheOptions

    tokenized_path = _absolute(tokenized_path)
    urls = {split: _split_shards(tokenized_path, split) if include_raw_paths else [] for split in SPLITS}
    return UrlSingleDatasetLMConfig(
        tokenizer=_absolute(tokenizer_path) if _is_local_dir(tokenizer_path) else tokenizer_path,
        cache_dir=tokenized_path,
        train_urls=urls["train"],
        validation_urls=urls["validation"],
        format=TextLmDatasetFormat(text_key=text_field),
        cache_options=cache_options if cache_options is not None else CacheOptions.default(),
    )


def _split_shards(tokenized_path: str, split: str) -> list[str]:
    try:
        return list_shards(_documents_dir(tokenized_path, split))
    except FileNotFoundError:
        return []


def _local_path(path: str) -> str:
    return path.removeprefix("file://")


def _absolute(path: str) -> str:
    # Ray workers need not share this process's working directory.
    return os.path.abspath(_local_path(path)) if is_local(path) else path


def _is_local_dir(path: str) -> bool:
    return is_local(path) and os.path.isdir(_local_path(path))


def build_caches(config: TokenizeConfig) -> None:
    """Phase 2: build (or finish) the train and validation caches with Levanter's builder."""
    pending = [split for split in SPLITS if not cache_finished(join(config.output_path, split))]
    if not pending:
        return
    builder = config.builder
    if builder == "auto":
        builder = "ray" if ray_connected() else "in_process"
    logger.info("building %s cache(s) with Levanter's builder (%s)", ", ".join(pending), builder)
    if builder == "ray":
        _build_with_ray(config, pending)
    else:
        _build_in_process(config, pending)


def cache_finished(cache_dir: str) -> bool:
    ledger = read_json(join(cache_dir, LEDGER_FILE))
    return bool(ledger and ledger.get("is_finished"))


def ray_connected() -> bool:
    """True if this process is connected to Ray or told where a cluster is (RAY_ADDRESS)."""
    ray = sys.modules.get("ray")
    return bool(os.environ.get("RAY_ADDRESS")) or (ray is not None and ray.is_initialized())


def _build_with_ray(config: TokenizeConfig, pending: list[str]) -> None:
    from levanter.store.cache import CacheOptions

    cpus = ensure_ray()
    shards = len(_split_shards(config.output_path, "train"))
    groups = config.num_shard_groups
    if groups is None:
        groups = 1 if cpus < AUTO_MANY_GROUPS_MIN_CPUS else CacheOptions.default().num_shard_groups
    if min(groups, shards) > 1 and cpus < COPY_TASK_CPUS:
        raise ValueError(
            f"TokenizeConfig.num_shard_groups={groups}: the Ray cluster has {cpus:g} CPUs but Levanter's "
            f"cache copy task needs {COPY_TASK_CPUS}; use num_shard_groups=1 (or None) on this machine"
        )
    data = lm_data_config(
        config.output_path,
        config.tokenizer,
        text_field=config.text_field,
        cache_options=CacheOptions(num_shard_groups=groups),
    )
    # Start every pending split before waiting on any: their start-up costs overlap.
    caches = [data.build_or_load_cache(split, monitors=False) for split in pending]
    for split, cache in zip(pending, caches, strict=True):
        if cache is None:
            raise RuntimeError(f"Levanter built no {split} cache (no {split} documents?)")
        cache.await_finished(await_cleanup=True)


def _build_in_process(config: TokenizeConfig, pending: list[str]) -> None:
    from levanter.store.cache import CacheOptions, _tokenize_one_shard_group
    from tqdm.auto import tqdm

    data = lm_data_config(config.output_path, config.tokenizer, text_field=config.text_field)
    processor = fast_batch_tokenizer(data)
    options = CacheOptions(num_shard_groups=1)
    for split in pending:
        source = data.get_shard_source(split)
        shards = list(source.shard_names)
        cache_dir = _absolute(join(config.output_path, split))
        _discard_foreign_partial_cache(cache_dir, shards)
        with tqdm(total=len(shards), desc=f"tokenize {split}", unit="shard") as progress:

            def report(update: Any, _ledger: Any, progress: Any = progress) -> None:
                progress.update(update.new_shards)

            # Levanter's own shard-group loop (what its Ray task runs), for one group of all
            # shards: it reads, tokenizes, writes the cache and its ledger, resumes per shard.
            _tokenize_one_shard_group(cache_dir, source, shards, processor, options, report, False)


def fast_batch_tokenizer(data: UrlSingleDatasetLMConfig) -> Any:
    """Levanter's `BatchTokenizer` for `data`, encoding through the `tokenizers` backend directly.

    Levanter's processor calls the transformers tokenizer, which asks the backend for
    character offsets (half the encoding time of a byte-level BPE on code) and converts every
    encoding to Python lists and dicts, only to keep `input_ids`. This subclass makes the
    same texts ("<bos> " + text + " <eos>" where Levanter adds them) and calls the backend's
    `encode_batch_fast` (no offsets) with the special tokens transformers would add, so the
    ids are the same; anything outside that plain case (attention masks, padding,
    truncation, Levanter's long-string workaround, a tokenizer class that overrides
    encoding, outputs besides input_ids) goes through Levanter's own `__call__`. Being a
    `BatchTokenizer` built as `preprocessor_for_format` builds it, its metadata -- which
    Levanter records in the ledger and checks on load -- is Levanter's (tested: the caches
    are byte-identical to those of Levanter's own processor).
    """
    return _fast_batch_tokenizer_class()(
        data.the_tokenizer, enforce_bos=True, enforce_eos=data.enforce_eos, text_field=data.format.text_key
    )


@functools.cache
def _fast_batch_tokenizer_class() -> type:
    import numpy as np
    from levanter.data.text import BatchTokenizer
    from transformers import PreTrainedTokenizerFast

    class FastBatchTokenizer(BatchTokenizer):
        @functools.cached_property
        def _backend(self) -> Any:
            tokenizer = self.tokenizer
            plain = (
                isinstance(tokenizer, PreTrainedTokenizerFast)
                and all(
                    getattr(type(tokenizer), name) is getattr(PreTrainedTokenizerFast, name)
                    for name in ("__call__", "_call_one", "batch_encode_plus", "_batch_encode_plus")
                )
                and not self.return_attention_mask
                and self.padding is False
                and not self._needs_long_sequence_workaround
                and list(self.output_exemplar) == ["input_ids"]
                and not getattr(tokenizer, "split_special_tokens", False)
            )
            return tokenizer.backend_tokenizer if plain else None

        def __call__(self, batch: Any) -> list[dict]:
            backend = self._backend
            # transformers turns these off for each call (no truncation, no padding, special
            # tokens matched): if the backend has them on, let it do so.
            if backend is None or backend.truncation or backend.padding or backend.encode_special_tokens:
                return super().__call__(batch)
            texts = [example[self.text_field] for example in batch]
            if self._need_to_add_bos:
                texts = [self.tokenizer.bos_token + " " + text for text in texts]
            if self._need_to_add_eos:
                texts = [text + " " + self.tokenizer.eos_token for text in texts]
            encodings = backend.encode_batch_fast(texts, add_special_tokens=True)
            # np.asarray of the id list is what Levanter's writer does with the lists it gets.
            return [{"input_ids": np.asarray(encoding.ids)} for encoding in encodings]

    return FastBatchTokenizer


def _discard_foreign_partial_cache(cache_dir: str, shards: list[str]) -> None:
    """Remove an unfinished cache whose ledger tracks other shards (left by a Ray build in groups)."""
    import fsspec

    ledger = read_json(join(cache_dir, LEDGER_FILE))
    if ledger is None or ledger.get("is_finished") or set(ledger.get("shard_rows", {})) == set(shards):
        return
    logger.warning("%s: unfinished cache from a different shard grouping; rebuilding it", cache_dir)
    fs, root = fsspec.core.url_to_fs(cache_dir)
    fs.rm(root, recursive=True)


_RAY_LOCK = threading.Lock()


def ensure_ray() -> float:
    """Connect to Ray, starting a local instance if this process has none; returns its CPU count.

    A started instance is left running for later steps in this process (starting one costs
    seconds) and is shut down when the process exits.
    """
    import ray

    with _RAY_LOCK:
        if not ray.is_initialized():
            started = time.perf_counter()
            ray.init(include_dashboard=False, configure_logging=False)
            logger.info("started Ray in %.1f s", time.perf_counter() - started)
    return float(ray.cluster_resources().get("CPU", 0))


def _cache_summary(cache_dir: str) -> dict[str, Any]:
    from levanter.data.text import cached_token_count

    ledger = read_json(join(cache_dir, LEDGER_FILE))
    assert ledger is not None and ledger["is_finished"], cache_dir
    return {
        "documents": ledger["total_num_rows"],
        "tokens": int(cached_token_count(_absolute(cache_dir))),
        "preprocessor": (ledger.get("metadata") or {}).get("preprocessor_metadata"),
    }


def write_tokenize_stats(config: TokenizeConfig, per_shard: list[dict[str, Any]]) -> None:
    """Phase 3: stats.json from the split counters and the finished caches (which must agree)."""
    stats: dict[str, Any] = {
        "skipped_empty": sum(shard["skipped_empty"] for shard in per_shard),
        "validation_fraction": config.validation_fraction,
        "seed": config.seed,
    }
    preprocessor = None
    for split in SPLITS:
        cache = _cache_summary(join(config.output_path, split))
        documents = sum(shard[split]["documents"] for shard in per_shard)
        if cache["documents"] != documents:
            raise RuntimeError(
                f"{config.output_path}/{split}: the Levanter cache holds {cache['documents']} documents but "
                f"the split wrote {documents}; delete {split}/ and re-run"
            )
        preprocessor = cache["preprocessor"]
        stats[split] = {
            "documents": documents,
            "tokens": cache["tokens"],
            "chars": sum(shard[split]["chars"] for shard in per_shard),
        }
    stats["documents"] = sum(stats[split]["documents"] for split in SPLITS)
    stats["tokens"] = sum(stats[split]["tokens"] for split in SPLITS)
    # What Levanter recorded: tokenizer, vocab size, whether it added bos/eos per document.
    stats["levanter_preprocessor"] = preprocessor
    write_stats(config.output_path, stats)
