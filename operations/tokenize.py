"""Tokenize: documents -> Levanter token caches (train and validation) that training loads.

The output directory is laid out the way Levanter's LM data config expects a
`cache_dir` to be, so the training step points Levanter at it and nothing is converted:

    <output_path>/train/                      Levanter cache (shard_ledger.json + token arrays)
    <output_path>/validation/                 Levanter cache
    <output_path>/.split_counts/<shard>.json  per input shard: documents and characters per split
    <output_path>/stats.json                  documents, tokens and characters per split

The split is decided on the fly: a document is in validation iff
`in_validation(id, validation_fraction, seed)` -- a hash of its id, so the split does not
depend on shard boundaries, order or machine. `SplitSource` is a Levanter sharded data
source over the *input* shards that yields the documents of one split (empty texts are
counted and skipped), so no split copy of the corpus is ever written: each cache build
streams the input shards once and keeps its split's documents.

Levanter's cache builder then tokenizes each split with Levanter's `BatchTokenizer` (which
prepends bos and appends eos to every document when the tokenizer defines them) into
Levanter's cache format, resuming per shard. Validation is built first: while streaming
every document, its source records each input shard's counts in `.split_counts/`. If no
document hashes into validation (tiny corpora), the train document with the smallest
hash is moved there (the validation cache is rebuilt with it, before the train cache is
built without it), so validation always has at least one document. Two ways to run the
builder, with byte-identical results (tested):

- `builder="ray"`: Levanter's `build_or_load_cache` with Levanter's own processor. It
  joins the Ray cluster this process is connected to, or starts a local one. Shard groups
  run as Ray tasks, so it scales out on a cluster -- but every cache costs three fresh Ray
  worker processes (builder actor, writer task, tokenize task), each importing Levanter
  and JAX: ~10 s per split on a 2-core machine, plus ~6 s to start Ray.
- `builder="in_process"`: the same per-shard-group loop Levanter's Ray task runs
  (`levanter.store.cache._tokenize_one_shard_group`), called in this process for one
  group of all shards. No Ray, no worker start-up; the `tokenizers` backend still encodes
  each batch on every core (its Rust thread pool). Its processor is
  `fast_batch_tokenizer`: Levanter's `BatchTokenizer` (same texts, same metadata) encoding
  through the backend's `encode_batch_fast`, which skips the character offsets
  transformers asks for and never uses -- about half the encoding time. The ids, and so
  the caches, are Levanter's own (tested).
- `builder="auto"` (default): "ray" when this process is already connected to Ray (a
  cluster, or a step running inside a Ray task), else "in_process".

A finished cache is never rebuilt (and is loaded without Ray).

Buckets: input, output and tokenizer may be on `s3://` or `gs://` (see `operations.buckets`,
which makes tensorstore follow the standard variables and keeps JAX from writing `s3://`
caches to a local folder named `s3:`). Levanter's Ray builder is refused for an `s3://`
output: its tasks run in Ray workers, which lack that fix.

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
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fsspec
import orjson

from operations.buckets import configure as configure_buckets
from operations.buckets import is_bucket, local_input_copy, ray_builder_problem, using_input_copies
from operations.ray_util import ensure_ray, ray_connected
from operations.shards import (
    DataError,
    is_local,
    join,
    list_input_shards,
    list_shards,
    numbered_lines,
    parse_document_line,
    read_json,
    write_json_atomic,
    write_stats,
)
from operations.tokenizer import in_validation, split_key

if TYPE_CHECKING:
    from levanter.data.text import UrlSingleDatasetLMConfig

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation")
COUNTS_DIR = ".split_counts"
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
    """Tokenizer directory (e.g. the output of operations.tokenizer), local or on s3:// / gs://
    (read through a temporary local copy), or a Hugging Face hub name where the hub is
    reachable. Training must use the same tokenizer."""

    output_path: str
    """Directory for the train/ and validation/ caches, the split counts and stats.json."""

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
    """Unused: the split is made while tokenizing, so there is no separate pass to run in
    worker processes (the tokenizers backend encodes on every core). Kept so existing
    configs and experiment scripts still construct."""


def tokenize(config: TokenizeConfig) -> None:
    """Build both Levanter caches (validation first), then write stats.json."""
    _check(config)
    configure_buckets()
    with using_input_copies():  # a tokenizer on a bucket is read through a temporary copy
        started = time.perf_counter()
        build_caches(config)
        logger.info("tokenize: caches %.1f s", time.perf_counter() - started)
        write_tokenize_stats(config)


# Files a tokenizer directory holds (transformers' AutoTokenizer reads one of them at least).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
)


_TOKENIZER_FIX = (
    "give the output directory of a tokenizer step (operations.tokenizer.train_tokenizer, "
    "default_train_tokenizer) or a Hugging Face hub name"
)


def _looks_like_a_path(name: str) -> bool:
    """A local path rather than a Hugging Face hub id (`name` or `namespace/name`)."""
    return name.startswith(("/", "./", "../", "~", "file://")) or name.count("/") > 1


def _check_tokenizer(tokenizer: str) -> None:
    """Refuse a local tokenizer path that does not exist or holds no tokenizer, before anything
    is written (transformers would ask the hub for it and fail with an unrelated message).
    Buckets and hub names are checked when the tokenizer loads."""
    if not isinstance(tokenizer, str) or not tokenizer:
        raise ValueError(f"TokenizeConfig.tokenizer={tokenizer!r}: give a tokenizer directory or a hub name")
    if not is_local(tokenizer):
        return
    path = os.path.expanduser(_local_path(tokenizer))
    fix = _TOKENIZER_FIX
    if os.path.isdir(path):
        if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
            raise ValueError(
                f"TokenizeConfig.tokenizer={tokenizer!r}: the directory has no tokenizer files "
                f"({', '.join(TOKENIZER_FILES[:2])}, ...); {fix}"
            )
    elif os.path.exists(path):
        raise ValueError(f"TokenizeConfig.tokenizer={tokenizer!r}: a file, not a tokenizer directory; {fix}")
    elif _looks_like_a_path(tokenizer):
        raise ValueError(f"TokenizeConfig.tokenizer={tokenizer!r}: no such directory; {fix}")


def _check_tokenizer_loads(data: Any, tokenizer: str) -> None:
    """Load the tokenizer before any cache is built; a name that is neither a tokenizer directory
    nor on the hub is one line naming the field (transformers' own message spans many)."""
    try:
        data.the_tokenizer  # noqa: B018 (loads and caches it)
    except (OSError, ValueError) as error:
        lines = str(error).strip().splitlines()
        raise ValueError(
            f"TokenizeConfig.tokenizer={tokenizer!r}: cannot load it -- not a tokenizer directory here, and as a "
            f"Hugging Face hub name: {type(error).__name__}: {lines[0] if lines else ''}; {_TOKENIZER_FIX}"
        ) from error


def _check(config: TokenizeConfig) -> None:
    _check_tokenizer(config.tokenizer)
    if not 0.0 < config.validation_fraction < 1.0:
        raise ValueError(
            f"TokenizeConfig.validation_fraction={config.validation_fraction}: must be in (0, 1) "
            "(training needs documents in both splits)"
        )
    if config.builder not in BUILDERS:
        raise ValueError(f"TokenizeConfig.builder={config.builder!r}: must be one of {', '.join(BUILDERS)}")
    if config.num_shard_groups is not None and config.num_shard_groups < 1:
        raise ValueError(f"TokenizeConfig.num_shard_groups={config.num_shard_groups}: must be >= 1 or None")
    if config.builder == "ray":
        problem = ray_builder_problem(config.output_path)
        if problem:
            raise ValueError(
                f"TokenizeConfig.builder='ray' with output_path={config.output_path!r}: {problem}; "
                "use builder='in_process' (or 'auto' outside Ray)"
            )


# ---------------------------------------------------------------------------- split


@dataclass(frozen=True)
class SplitSource:
    """The documents of one split of the input shards, as a Levanter sharded data source.

    Levanter's cache builder needs only `shard_names` and `open_shard_at_row`; a shard is
    named by its input file's name (unique within the input directory). Each row is
    `{"id": id, text_field: text}`. Streaming a shard to its end with `counts_dir` set writes
    `<counts_dir>/<shard>.json`: that shard's documents and characters per split, its empty
    texts and its train document with the smallest split hash (`split_counts` reads them).
    Plain and picklable, so Ray tasks can read it too.
    """

    shards: tuple[str, ...]
    split: str
    fraction: float
    seed: int
    text_field: str = "text"
    force_validation_id: str | None = None
    counts_dir: str | None = None

    @property
    def shard_names(self) -> Sequence[str]:
        return [shard.rstrip("/").rsplit("/", 1)[-1] for shard in self.shards]

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def open_shard(self, shard_name: str) -> Iterator[dict[str, str]]:
        return self.open_shard_at_row(shard_name, 0)

    def open_shard_at_row(self, shard_name: str, row: int) -> Iterator[dict[str, str]]:
        """The rows of this split in `shard_name` from the `row`-th on (counting this split's rows)."""
        index = self.shard_names.index(shard_name)
        counts: dict[str, Any] = {split: {"documents": 0, "chars": 0} for split in SPLITS}
        counts["skipped_empty"] = 0
        first_train: tuple[float, str, int] | None = None
        mine = 0
        for document_id, text in _read_texts(self.shards[index], self.text_field):
            if not text.strip():
                # Would become a bos/eos pair with nothing between: noise for training.
                counts["skipped_empty"] += 1
                continue
            if document_id == self.force_validation_id or in_validation(
                document_id, self.fraction, self.seed
            ):
                split = "validation"
            else:
                split = "train"
                key = (split_key(document_id, self.seed), document_id, len(text))
                if first_train is None or key < first_train:
                    first_train = key
            counts[split]["documents"] += 1
            counts[split]["chars"] += len(text)
            if split == self.split:
                if mine >= row:
                    yield {"id": document_id, self.text_field: text}
                mine += 1
        if self.counts_dir is not None and self.force_validation_id is None:
            counts["first_train"] = (
                None
                if first_train is None
                else {"bucket": first_train[0], "id": first_train[1], "chars": first_train[2]}
            )
            write_json_atomic(join(self.counts_dir, shard_name + ".json"), counts)

    def __iter__(self) -> Iterator[dict[str, str]]:
        for name in self.shard_names:
            yield from self.open_shard(name)


def _read_texts(shard: str, text_field: str) -> Iterator[tuple[str, str]]:
    """(id, text) of every document of one shard; bad input is one `DataError` line naming the
    step, the shard, the line and the fix."""
    try:
        for number, line in numbered_lines(shard):
            document = parse_document_line(shard, number, line, orjson.loads)
            text = document.get(text_field)
            if not isinstance(text, str):
                raise DataError(
                    f"{shard}: document {document.get('id', f'#{number}')!r} has no string field "
                    f"{text_field!r} (line {number}: got {'null' if text is None else type(text).__name__}); "
                    "set text_field to the field holding the text"
                )
            if "id" not in document:
                raise DataError(
                    f"{shard}: document #{number} has no 'id' field (line {number}); every document needs one"
                )
            yield str(document["id"]), text
    except DataError as error:
        raise DataError(f"tokenize: {error}") from None


def split_source(config: TokenizeConfig, split: str, force_validation_id: str | None = None) -> SplitSource:
    """The source of `split`; the validation source records the split counts as it streams."""
    return SplitSource(
        shards=tuple(_absolute(shard) for shard in list_input_shards(config.input_path, "tokenize")),
        split=split,
        fraction=config.validation_fraction,
        seed=config.seed,
        text_field=config.text_field,
        force_validation_id=force_validation_id,
        counts_dir=_absolute(join(config.output_path, COUNTS_DIR)) if split == "validation" else None,
    )


def split_counts(config: TokenizeConfig) -> list[dict[str, Any]]:
    """Each input shard's split counts: recorded while the validation cache was built, else counted now."""
    source = split_source(config, "validation")
    per_shard = []
    for name in source.shard_names:
        counts = read_json(join(source.counts_dir, name + ".json"))
        if counts is None:
            for _ in source.open_shard(name):  # streams the shard to its end: writes its counts
                pass
            counts = read_json(join(source.counts_dir, name + ".json"))
        per_shard.append(counts)
    return per_shard


def forced_validation_id(per_shard: list[dict[str, Any]], input_path: str = "") -> str | None:
    """None if some document hashes into validation, else the train document with the smallest hash."""
    if sum(counts["validation"]["documents"] for counts in per_shard):
        return None
    candidates = [
        (counts["first_train"]["bucket"], counts["first_train"]["id"])
        for counts in per_shard
        if counts["first_train"] is not None
    ]
    if not candidates:
        skipped = sum(counts["skipped_empty"] for counts in per_shard)
        raise DataError(
            f"tokenize: {input_path}: no non-empty documents to tokenize ({len(per_shard)} shard(s), "
            f"{skipped} empty text(s) skipped); check the step that made them (its stats.json)"
        )
    return min(candidates)[1]


def _split_totals(config: TokenizeConfig, per_shard: list[dict[str, Any]]) -> dict[str, Any]:
    """Documents and characters per split over all shards, with the forced validation document moved."""
    totals: dict[str, Any] = {
        split: {name: sum(counts[split][name] for counts in per_shard) for name in ("documents", "chars")}
        for split in SPLITS
    }
    totals["skipped_empty"] = sum(counts["skipped_empty"] for counts in per_shard)
    forced = forced_validation_id(per_shard, config.input_path)
    if forced is not None:
        chars = next(
            c["first_train"]["chars"] for c in per_shard if (c["first_train"] or {}).get("id") == forced
        )
        for split, sign in (("train", -1), ("validation", 1)):
            totals[split]["documents"] += sign
            totals[split]["chars"] += sign * chars
    if totals["train"]["documents"] == 0:
        raise ValueError(
            f"{config.input_path}: every document went to validation; add documents or lower validation_fraction"
        )
    return totals


# ---------------------------------------------------------------------------- Levanter


def lm_data_config(
    tokenized_path: str,
    tokenizer_path: str,
    *,
    text_field: str = "text",
    cache_options: Any = None,
) -> UrlSingleDatasetLMConfig:
    """Levanter's LM data config for the output of `tokenize`: what the training step uses.

    `cache_dir` is `tokenized_path`, so Levanter loads `train/` and `validation/` as they
    are. It lists no document URLs: the caches are built by `tokenize` (from `SplitSource`),
    never by Levanter from this config.
    """
    from levanter.data.text import TextLmDatasetFormat, UrlSingleDatasetLMConfig
    from levanter.store.cache import CacheOptions

    configure_buckets()  # the caches may be on s3:// or gs://
    if is_bucket(tokenizer_path):
        tokenizer = local_input_copy(tokenizer_path)  # transformers loads from local directories
    else:
        tokenizer = _absolute(tokenizer_path) if _is_local_dir(tokenizer_path) else tokenizer_path
    data = UrlSingleDatasetLMConfig(
        tokenizer=tokenizer,
        cache_dir=_absolute(tokenized_path),
        train_urls=[],
        validation_urls=[],
        format=TextLmDatasetFormat(text_key=text_field),
        cache_options=cache_options if cache_options is not None else CacheOptions.default(),
    )
    if tokenizer != tokenizer_path:
        # Levanter records the tokenizer's name in each cache's ledger and compares it on load:
        # the bucket's URL, not the temporary copy's path (different in every process).
        data.the_tokenizer.name_or_path = tokenizer_path
    return data


def _local_path(path: str) -> str:
    return path.removeprefix("file://")


def _absolute(path: str) -> str:
    # Ray workers need not share this process's working directory.
    return os.path.abspath(_local_path(path)) if is_local(path) else path


def _is_local_dir(path: str) -> bool:
    return is_local(path) and os.path.isdir(_local_path(path))


def build_caches(config: TokenizeConfig) -> None:
    """Build (or finish) the train and validation caches with Levanter's builder."""
    pending = [split for split in SPLITS if not cache_finished(join(config.output_path, split))]
    if not pending:
        return
    builder = config.builder
    if builder == "auto":
        builder = "ray" if ray_connected() and not ray_builder_problem(config.output_path) else "in_process"
    logger.info("building %s cache(s) with Levanter's builder (%s)", ", ".join(pending), builder)
    if builder == "ray":
        _build_with_ray(config, pending)
    else:
        _build_in_process(config, pending)


def _build_splits(config: TokenizeConfig, pending: list[str], build: Any) -> None:
    """Call `build(split, source, cache_dir)` for the pending splits: validation first, then train.

    Building validation streams every document and records the split counts; if none hashed
    into validation, the validation cache is rebuilt holding the forced document, and the
    train cache is built without it.
    """
    if "validation" in pending:
        build("validation", split_source(config, "validation"), _cache_dir(config, "validation"))
    forced = forced_validation_id(split_counts(config), config.input_path)
    if forced is not None and _cache_rows(_cache_dir(config, "validation")) == 0:
        logger.info("no document hashed into validation; moving %r there", forced)
        _remove(_cache_dir(config, "validation"))
        build("validation", split_source(config, "validation", forced), _cache_dir(config, "validation"))
    if "train" in pending:
        build("train", split_source(config, "train", forced), _cache_dir(config, "train"))


def _cache_dir(config: TokenizeConfig, split: str) -> str:
    return _absolute(join(config.output_path, split))


def _cache_rows(cache_dir: str) -> int:
    ledger = read_json(join(cache_dir, LEDGER_FILE))
    return int(ledger["total_num_rows"]) if ledger else 0


def _remove(path: str) -> None:
    fs, root = fsspec.core.url_to_fs(path)
    if fs.exists(root):
        fs.rm(root, recursive=True)


def cache_finished(cache_dir: str) -> bool:
    ledger = read_json(join(cache_dir, LEDGER_FILE))
    return bool(ledger and ledger.get("is_finished"))


def _build_with_ray(config: TokenizeConfig, pending: list[str]) -> None:
    """Levanter's Ray cache builder (`build_lm_dataset_cache`, Levanter's own processor) per split."""
    from levanter.data.text import build_lm_dataset_cache
    from levanter.store.cache import CacheOptions

    cpus = ensure_ray()
    shards = len(list_shards(config.input_path))
    groups = config.num_shard_groups
    if groups is None:
        groups = 1 if cpus < AUTO_MANY_GROUPS_MIN_CPUS else CacheOptions.default().num_shard_groups
    if min(groups, shards) > 1 and cpus < COPY_TASK_CPUS:
        raise ValueError(
            f"TokenizeConfig.num_shard_groups={groups}: the Ray cluster has {cpus:g} CPUs but Levanter's "
            f"cache copy task needs {COPY_TASK_CPUS}; use num_shard_groups=1 (or None) on this machine"
        )
    data = lm_data_config(config.output_path, config.tokenizer, text_field=config.text_field)
    _check_tokenizer_loads(data, config.tokenizer)

    def build(split: str, source: SplitSource, cache_dir: str) -> None:
        cache = build_lm_dataset_cache(
            cache_dir,
            source,
            data.format,
            data.the_tokenizer,
            CacheOptions(num_shard_groups=groups),
            data.enforce_eos,
            monitors=False,
        )
        cache.await_finished(await_cleanup=True)

    _build_splits(config, pending, build)


def _build_in_process(config: TokenizeConfig, pending: list[str]) -> None:
    from levanter.store.cache import CacheOptions, _tokenize_one_shard_group
    from tqdm.auto import tqdm

    data = lm_data_config(config.output_path, config.tokenizer, text_field=config.text_field)
    _check_tokenizer_loads(data, config.tokenizer)
    processor = fast_batch_tokenizer(data)
    options = CacheOptions(num_shard_groups=1)

    def build(split: str, source: SplitSource, cache_dir: str) -> None:
        shards = list(source.shard_names)
        _discard_foreign_partial_cache(cache_dir, shards)
        with tqdm(total=len(shards), desc=f"tokenize {split}", unit="shard") as progress:

            def report(update: Any, _ledger: Any) -> None:
                progress.update(update.new_shards)

            # Levanter's own shard-group loop (what its Ray task runs), for one group of all
            # shards: it reads, tokenizes, writes the cache and its ledger, resumes per shard.
            _tokenize_one_shard_group(cache_dir, source, shards, processor, options, report, False)

    _build_splits(config, pending, build)


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
    ledger = read_json(join(cache_dir, LEDGER_FILE))
    if ledger is None or ledger.get("is_finished") or set(ledger.get("shard_rows", {})) == set(shards):
        return
    logger.warning("%s: unfinished cache from a different shard grouping; rebuilding it", cache_dir)
    _remove(cache_dir)


def _cache_summary(cache_dir: str) -> dict[str, Any]:
    from levanter.data.text import cached_token_count

    ledger = read_json(join(cache_dir, LEDGER_FILE))
    assert ledger is not None and ledger["is_finished"], cache_dir
    return {
        "documents": ledger["total_num_rows"],
        "tokens": int(cached_token_count(_absolute(cache_dir))),
        "preprocessor": (ledger.get("metadata") or {}).get("preprocessor_metadata"),
    }


def write_tokenize_stats(config: TokenizeConfig) -> None:
    """stats.json from the split counts and the finished caches (which must agree)."""
    totals = _split_totals(config, split_counts(config))
    stats: dict[str, Any] = {
        "skipped_empty": totals["skipped_empty"],
        "validation_fraction": config.validation_fraction,
        "seed": config.seed,
    }
    preprocessor = None
    for split in SPLITS:
        cache = _cache_summary(join(config.output_path, split))
        documents = totals[split]["documents"]
        if cache["documents"] != documents:
            raise RuntimeError(
                f"{config.output_path}/{split}: the Levanter cache holds {cache['documents']} documents but "
                f"the split has {documents}; delete {split}/ and re-run"
            )
        preprocessor = cache["preprocessor"]
        stats[split] = {"documents": documents, "tokens": cache["tokens"], "chars": totals[split]["chars"]}
    stats["documents"] = sum(stats[split]["documents"] for split in SPLITS)
    stats["tokens"] = sum(stats[split]["tokens"] for split in SPLITS)
    # What Levanter recorded: tokenizer, vocab size, whether it added bos/eos per document.
    stats["levanter_preprocessor"] = preprocessor
    write_stats(config.output_path, stats)
