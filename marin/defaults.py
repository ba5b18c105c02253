"""Default step builders: one call per pipeline stage, with conventional names and versioning.

    raw = default_download("stdlib", python_stdlib_dir(), include=("**/*.py",))
    docs = default_documents("stdlib", raw)
    clean = default_filter("stdlib", docs, default_code_rules())
    unique = default_dedup("stdlib", clean)
    tok = default_train_tokenizer("stdlib-8k", unique, vocab_size=8192)
    tokenized = default_tokenize("stdlib", unique, tok)

Step names follow the output tree's top-level folders: `raw/`, `documents/`, `filtered/`,
`dedup/`, `tokenizers/`, `tokenized/`. Every setting that changes a step's output is
`versioned()` here (so changing it re-runs that step and its dependents, and the plan
says why); settings that only change how the work is done (worker counts) are not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from executor import ExecutorStep, InputName, ResourceConfig, this_output_path, versioned
from marin.corpora import STDLIB_EXCLUDE, STDLIB_INCLUDE, python_stdlib_dir, stdlib_corpus_name
from operations.dedup import DedupConfig, deduplicate
from operations.documents import DocumentsConfig, make_documents
from operations.download import DownloadConfig, download
from operations.filter import FilterConfig, RuleConfig, filter_documents
from operations.tokenize import TokenizeConfig, tokenize
from operations.tokenizer import TrainTokenizerConfig, train_tokenizer

StepInput = ExecutorStep | InputName


def default_download(
    name: str,
    source: str,
    *,
    include: Sequence[str] = ("**",),
    exclude: Sequence[str] = (),
    max_files: int | None = None,
    revision: str | None = None,
    version_source: bool = True,
    storage_options: dict[str, Any] | None = None,
) -> ExecutorStep:
    """`raw/<name>`: a copy of `source` (local path, glob, http(s), s3, gs or hf URL).

    `version_source=False` leaves the location out of the version, for sources whose path
    differs between machines but whose content is identified by `name` (the embedded
    stdlib corpus is one: its name carries the Python version).
    """
    return ExecutorStep(
        name=f"raw/{name}",
        fn=download,
        config=DownloadConfig(
            source=versioned(source) if version_source else source,
            output_path=this_output_path(),
            include=versioned(tuple(include)),
            exclude=versioned(tuple(exclude)),
            max_files=versioned(max_files),
            revision=versioned(revision),
            storage_options=dict(storage_options or {}),
        ),
        description=f"Download {source}",
    )


def stdlib_download(max_files: int | None = None) -> ExecutorStep:
    """`raw/python<version>-stdlib`: the running Python's standard library (the embedded corpus)."""
    return default_download(
        stdlib_corpus_name(),
        python_stdlib_dir(),
        include=STDLIB_INCLUDE,
        exclude=STDLIB_EXCLUDE,
        max_files=max_files,
        version_source=False,
    )


def default_documents(
    name: str,
    raw: StepInput,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    text_field: str = "text",
    target_shard_bytes: int = 8_000_000,
    max_error_fraction: float = 0.1,
) -> ExecutorStep:
    """`documents/<name>`: raw files -> document shards."""
    return ExecutorStep(
        name=f"documents/{name}",
        fn=make_documents,
        config=DocumentsConfig(
            input_path=raw,
            output_path=this_output_path(),
            source=versioned(name),
            text_field=versioned(text_field),
            include=versioned(tuple(include)),
            exclude=versioned(tuple(exclude)),
            target_shard_bytes=versioned(target_shard_bytes),
            max_error_fraction=versioned(max_error_fraction),
        ),
        description=f"Turn raw/{name} into document shards",
    )


def default_filter(name: str, documents: StepInput, rules: Sequence[RuleConfig]) -> ExecutorStep:
    """`filtered/<name>`: documents kept by every rule (stats per rule in stats.json)."""
    return ExecutorStep(
        name=f"filtered/{name}",
        fn=filter_documents,
        config=FilterConfig(
            input_path=documents, output_path=this_output_path(), rules=versioned(tuple(rules))
        ),
        description="Heuristic quality filters: " + ", ".join(type(rule).__name__ for rule in rules),
    )


def default_dedup(
    name: str,
    documents: StepInput,
    *,
    mode: str = "both",
    ngram_size: int = 5,
    num_bands: int = 20,
    rows_per_band: int = 10,
    threshold: float = 0.8,
    ngram_unit: str = "word",
) -> ExecutorStep:
    """`dedup/<name>`: exact and/or MinHash near-duplicate removal, one document kept per cluster."""
    return ExecutorStep(
        name=f"dedup/{name}",
        fn=deduplicate,
        config=DedupConfig(
            input_path=documents,
            output_path=this_output_path(),
            mode=versioned(mode),
            ngram_unit=versioned(ngram_unit),
            ngram_size=versioned(ngram_size),
            num_bands=versioned(num_bands),
            rows_per_band=versioned(rows_per_band),
            threshold=versioned(threshold),
        ),
        description=f"Deduplicate ({mode})",
    )


def default_train_tokenizer(
    name: str,
    documents: StepInput,
    *,
    vocab_size: int = 8192,
    min_frequency: int = 2,
    max_documents: int | None = None,
    heldout_fraction: float = 0.05,
    text_field: str = "text",
    seed: int = 0,
) -> ExecutorStep:
    """`tokenizers/<name>`: a byte-level BPE tokenizer trained on `documents` (AutoTokenizer-loadable)."""
    return ExecutorStep(
        name=f"tokenizers/{name}",
        fn=train_tokenizer,
        config=TrainTokenizerConfig(
            output_path=this_output_path(),
            input_path=documents,
            vocab_size=versioned(vocab_size),
            min_frequency=versioned(min_frequency),
            max_documents=versioned(max_documents),
            heldout_fraction=versioned(heldout_fraction),
            text_field=versioned(text_field),
            seed=versioned(seed),
        ),
        description=f"Train a {vocab_size}-token byte-level BPE tokenizer",
    )


def default_tokenize(
    name: str,
    documents: StepInput,
    tokenizer: StepInput | str,
    *,
    validation_fraction: float = 0.05,
    text_field: str = "text",
    seed: int = 0,
) -> ExecutorStep:
    """`tokenized/<name>`: a Levanter token cache with train/ and validation/ splits.

    `tokenizer` is a tokenizer step (or its output) or a tokenizer directory / hub name.
    """
    return ExecutorStep(
        name=f"tokenized/{name}",
        fn=tokenize,
        config=TokenizeConfig(
            input_path=documents,
            tokenizer=tokenizer if not isinstance(tokenizer, str) else versioned(tokenizer),
            output_path=this_output_path(),
            validation_fraction=versioned(validation_fraction),
            text_field=versioned(text_field),
            seed=versioned(seed),
        ),
        description="Tokenize into a Levanter cache",
    )


TRAIN_FIELDS_THAT_MATTER = (
    "train_batch_size",
    "num_train_steps",
    "learning_rate",
    "weight_decay",
    "warmup",
    "lr_schedule",
    "min_lr_ratio",
    "seq_len",
    "epochs",
    "seed",
)
"""SimpleTrainConfig fields that change the trained model (versioned). Eval, checkpoint and
export cadence are not: they change what is logged or saved along the way, not the model;
nor are `resources` (the same run on other hardware is the same model)."""

DEFAULT_TRAINING_RESOURCES: dict[str, Any] = {"accelerator": "any"}
"""The resources of training and evaluation steps whose SimpleTrainConfig sets none: any
accelerator the driver has (the local runner reads only whether a step declares resources)."""


def _resources(train_config: Any) -> ResourceConfig | dict[str, Any]:
    """`train_config.resources` when set, else DEFAULT_TRAINING_RESOURCES (a fresh copy)."""
    resources = getattr(train_config, "resources", None)
    return dict(DEFAULT_TRAINING_RESOURCES) if resources is None else resources


def default_train(
    name: str,
    tokenized: ExecutorStep,
    model: Any,
    train_config: Any,
    *,
    tokenizer: StepInput | str | None = None,
    tracker: str = "wandb",
) -> ExecutorStep:
    """`checkpoints/<name>`: train `model` (a `LlamaSpec`, see marin.models) on a tokenized step.

    The tokenizer defaults to the one the tokenized step used. The model shape and the
    hyperparameters that change the model are versioned, as in Marin. The step's resources
    are `train_config.resources` (e.g. `ResourceConfig.with_tpu("v4-8")`), by default any
    accelerator; they are not versioned.
    """
    from dataclasses import replace

    from operations.train import TrainConfig, train

    if tokenizer is None:
        tokenizer = tokenized.config.tokenizer
    versioned_train = replace(
        train_config, **{field: versioned(getattr(train_config, field)) for field in TRAIN_FIELDS_THAT_MATTER}
    )
    return ExecutorStep(
        name=f"checkpoints/{name}",
        fn=train,
        config=TrainConfig(
            tokenized_path=tokenized,
            tokenizer=tokenizer if not isinstance(tokenizer, str) else versioned(tokenizer),
            model=versioned(model),
            train=versioned_train,
            output_path=this_output_path(),
            tracker=tracker,
        ),
        description=f"Train {name} for {train_config.num_train_steps} steps",
        resources=_resources(train_config),
    )


def default_eval(
    name: str,
    trained: ExecutorStep,
    datasets: dict[str, StepInput],
    *,
    max_eval_batches: int | None = None,
    batch_size: int = 8,
    resources: ResourceConfig | dict[str, Any] | None = None,
) -> ExecutorStep:
    """`evaluation/<name>`: held-out loss and bits-per-byte per domain for a training step's
    final checkpoint (results.json). `datasets` maps domain names to tokenized steps.
    `resources` default to the training run's (`SimpleTrainConfig.resources`), else any accelerator."""
    from operations.eval import EvalConfig, evaluate

    return ExecutorStep(
        name=f"evaluation/{name}",
        fn=evaluate,
        config=EvalConfig(
            checkpoint_path=trained / "checkpoints",
            tokenizer=trained.config.tokenizer,
            datasets=dict(datasets),
            model=trained.config.model,
            output_path=this_output_path(),
            max_eval_batches=versioned(max_eval_batches),
            batch_size=versioned(batch_size),
        ),
        description=f"Evaluate {trained.name} on {', '.join(datasets)}",
        resources=_resources(getattr(trained.config, "train", None)) if resources is None else resources,
    )
