"""Default step builders: one call per pipeline stage, with conventional names and versioning.

The signatures are Marin's (`experiments/defaults.py`), so a Marin experiment script ports by
changing its imports (docs/coming_from_marin.md); this project's own settings are extra
keyword arguments:

    raw = default_download("raw/tinystories", "roneneldan/TinyStories", "main")  # Hub dataset
    tokenized = default_tokenize("tinystories", raw, marin_tokenizer, TextLmDatasetFormat())
    model = default_train("nano", tokenized, versioned(llama_nano), SimpleTrainConfig(...))

and the whole pipeline on the embedded corpus:

    raw = stdlib_download()
    docs = default_documents("stdlib", raw)
    clean = default_filter("stdlib", docs, default_code_rules())
    unique = default_dedup("stdlib", clean)
    tok = default_train_tokenizer("stdlib-8k", unique, vocab_size=8192)
    tokenized = default_tokenize("stdlib", unique, tok)

Step names follow the output tree's top-level folders: `raw/`, `documents/`, `filtered/`,
`dedup/`, `tokenizers/`, `tokenized/`, `checkpoints/`, `evaluation/` (`default_download`
takes the whole name, as Marin's does). Every setting that changes a step's output is
`versioned()` here (so changing it re-runs that step and its dependents, and the plan
says why); settings that only change how the work is done (worker counts) are not.

Tokenizers may be Hugging Face Hub ids anywhere (`"gpt2"`, `marin_tokenizer`): the step's
version holds the id, and the step fetches the tokenizer when it runs (operations.hub), on
the machine that runs it; building or dry-running a script fetches nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from executor import ExecutorStep, InputName, ResourceConfig, this_output_path, versioned
from executor.steps import VersionedValue, ensure_versioned
from marin.corpora import STDLIB_EXCLUDE, STDLIB_INCLUDE, python_stdlib_dir, stdlib_corpus_name
from operations.dataset_formats import (
    ChatDocumentsConfig,
    SampleConfig,
    format_kind,
    render_chats,
    sample_documents,
    text_field_of,
)
from operations.dedup import DedupConfig, deduplicate
from operations.documents import DocumentsConfig, make_documents
from operations.download import DownloadConfig, download
from operations.filter import FilterConfig, RuleConfig, filter_documents
from operations.hub import (
    evaluate_with_hub_tokenizer,
    is_hub_id,
    tokenize_with_hub_tokenizer,
    train_with_hub_tokenizer,
)
from operations.quality_classifier import score_quality
from operations.tokenize import TokenizeConfig, tokenize
from operations.tokenizer import TrainTokenizerConfig, train_tokenizer
from operations.train import ADAM_FIELDS

logger = logging.getLogger(__name__)

StepInput = ExecutorStep | InputName


def is_hub_dataset_id(value: Any) -> bool:
    """`org/name` with nothing of that name on local disk: a Hub dataset, as Marin's defaults decide."""
    return is_hub_id(value) and value.count("/") == 1


def default_download(
    name: str,
    hf_dataset_id: str,
    revision: str | None = None,
    override_output_path: str | None = None,
    *,
    hf_urls_glob: Sequence[str] = (),
    include: Sequence[str] = ("**",),
    exclude: Sequence[str] = (),
    max_files: int | None = None,
    version_source: bool = True,
    storage_options: dict[str, Any] | None = None,
) -> InputName:
    """The step `name` (e.g. "raw/tinystories"): a copy of a Hub dataset, as an input for other steps.

    As Marin's: `hf_dataset_id` is `org/name` on the Hub (`HF_ENDPOINT` picks another Hub),
    `revision` a branch, tag or commit (None: the default branch), `hf_urls_glob` the files to
    take (globs relative to the repository; empty: all), and the files land directly under the
    step's output. `hf_dataset_id` may also be any source `operations.download` reads -- a
    local path or glob, `http(s)://`, `s3://`, `gs://`, `hf://` -- and then `revision` must be
    None. Returns `step.as_input_name()`, like Marin's; `executor_main(steps=[...])` takes it.

    `version_source=False` leaves the location out of the version, for sources whose path
    differs between machines but whose content is identified by `name`.
    """
    return _download_step(
        name,
        hf_dataset_id,
        revision=revision,
        override_output_path=override_output_path,
        include=tuple(hf_urls_glob) or tuple(include),
        exclude=exclude,
        max_files=max_files,
        version_source=version_source,
        storage_options=storage_options,
    ).as_input_name()


def _download_step(
    name: str,
    source: str,
    *,
    revision: str | None = None,
    override_output_path: str | None = None,
    include: Sequence[str] = ("**",),
    exclude: Sequence[str] = (),
    max_files: int | None = None,
    version_source: bool = True,
    storage_options: dict[str, Any] | None = None,
) -> ExecutorStep:
    if is_hub_dataset_id(source):
        source = f"hf://datasets/{source}"
    elif revision is not None and not source.startswith("hf://"):
        raise ValueError(
            f"default_download({name!r}): revision={revision!r} applies to Hub datasets only, and "
            f"{source!r} is not one (no such local path either? a Hub id is 'org/name'); drop the revision"
        )
    at = f" revision {revision}" if revision else ""
    return ExecutorStep(
        name=name,
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
        description=f"Download {source}{at}",
        override_output_path=override_output_path,
    )


def stdlib_download(max_files: int | None = None) -> ExecutorStep:
    """`raw/python<version>-stdlib`: the running Python's standard library (the embedded corpus).

    Its location differs between machines and is left out of the version: the name carries
    the Python version."""
    return _download_step(
        f"raw/{stdlib_corpus_name()}",
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


DOCUMENT_STEP_FUNCTIONS = frozenset(
    {make_documents, filter_documents, deduplicate, score_quality, sample_documents, render_chats}
)
"""Step functions whose output is document shards: `default_tokenize` reads such a step as it is.
Anything else (a download, a path, a Hub dataset) is raw files and gets a documents step first."""


def default_tokenize(
    name: str,
    dataset: StepInput | str,
    tokenizer: StepInput | str,
    format: Any = None,  # noqa: A002 -- Marin's argument name
    *,
    sample_count: int | VersionedValue[int] | None = None,
    is_validation: bool = False,
    validation_fraction: float = 0.05,
    text_field: str | None = None,
    seed: int = 0,
    revision: str | None = None,
) -> ExecutorStep:
    """`tokenized/<name>`: a Levanter token cache with train/ and validation/ splits.

    As Marin's: `dataset` is a step or an `InputName` (document shards, or raw files such as a
    download's), a path or URL of raw files, or a Hub dataset id (`org/name`: downloaded first,
    as `raw/org/name`, at `revision`); `tokenizer` a Hub id, a tokenizer directory, or a
    tokenizer step; `format` a Levanter dataset format (None: `TextLmDatasetFormat()`):
    `TextLmDatasetFormat(text_key=...)` names the field holding the text,
    `ChatLmDatasetFormat(...)` renders conversations with a chat template (see
    operations.dataset_formats: no loss masks yet); `sample_count` keeps at most that many
    documents per shard.

    Raw inputs become document shards in a `documents/<name>` step first (and a sample in
    `sampled/<name>`): tokenizing reads shards. Tokenizing then splits documents into train
    and validation by a hash of their id (`validation_fraction`, `seed`); Marin's
    `is_validation=True` (the whole dataset as a validation set) is not supported.
    """
    if is_validation:
        raise ValueError(
            f"default_tokenize({name!r}): is_validation=True is not supported; every tokenized step "
            "here has its own validation split (validation_fraction), which default_eval reads"
        )
    kind = format_kind(format)
    if kind == "supervised":
        raise ValueError(
            f"default_tokenize({name!r}): SupervisedLmDatasetFormat is not supported yet; use "
            "TextLmDatasetFormat or ChatLmDatasetFormat"
        )
    if kind == "text" and format is not None and text_field is not None and text_field != format.text_key:
        raise ValueError(
            f"default_tokenize({name!r}): text_field={text_field!r} and format.text_key={format.text_key!r} "
            "name the same field; give one"
        )
    record_field = text_field or (text_field_of(format) if kind == "text" else "text")
    tokenizer_value = tokenizer.value if isinstance(tokenizer, VersionedValue) else tokenizer
    tokenizer_config = ensure_versioned(tokenizer) if isinstance(tokenizer_value, str) else tokenizer

    documents, shard_text_field = _documents_of(
        name, dataset, kind, format, record_field, tokenizer_config, revision
    )
    if sample_count is not None:
        count = sample_count.value if isinstance(sample_count, VersionedValue) else sample_count
        documents = ExecutorStep(
            name=f"sampled/{name}",
            fn=sample_documents,
            config=SampleConfig(
                input_path=documents, output_path=this_output_path(), per_shard=ensure_versioned(sample_count)
            ),
            description=f"The first {count} documents of every shard",
        )
    hub = is_hub_id(tokenizer_value)
    return ExecutorStep(
        name=f"tokenized/{name}",
        fn=tokenize_with_hub_tokenizer if hub else tokenize,
        config=TokenizeConfig(
            input_path=documents,
            tokenizer=tokenizer_config,
            output_path=this_output_path(),
            validation_fraction=versioned(validation_fraction),
            text_field=versioned(shard_text_field),
            seed=versioned(seed),
        ),
        description=f"Tokenize with the {tokenizer_value} tokenizer"
        if hub
        else "Tokenize into a Levanter cache",
    )


def _documents_of(
    name: str,
    dataset: StepInput | str,
    kind: str,
    format: Any,  # noqa: A002
    record_field: str,
    tokenizer: Any,
    revision: str | None,
) -> tuple[StepInput, str]:
    """The document shards `default_tokenize` reads for `dataset`, and their text field."""
    if isinstance(dataset, ExecutorStep | InputName):
        producer = dataset if isinstance(dataset, ExecutorStep) else dataset.step
        if kind == "text" and producer is not None and producer.fn in DOCUMENT_STEP_FUNCTIONS:
            return dataset, record_field
        raw: Any = dataset
    elif isinstance(dataset, str):
        if is_hub_dataset_id(dataset):
            raw = default_download(f"raw/{dataset}", dataset, revision)
        else:
            if revision is not None:
                raise ValueError(
                    f"default_tokenize({name!r}): revision={revision!r} applies to Hub datasets only, "
                    f"and {dataset!r} is not one"
                )
            raw = versioned(dataset)
    else:
        raise ValueError(
            f"default_tokenize({name!r}): dataset must be a step, an InputName, a path or a Hub dataset id, "
            f"got {type(dataset).__name__}"
        )
    if kind == "chat":
        step = ExecutorStep(
            name=f"documents/{name}",
            fn=render_chats,
            config=ChatDocumentsConfig(
                input_path=raw,
                output_path=this_output_path(),
                tokenizer=tokenizer,
                messages_field=versioned(format.messages_field),
                chat_template=versioned(format.chat_template),
                source=versioned(name),
            ),
            description="Render conversations with the chat template",
        )
        if getattr(format, "mask_user_turns", False):
            logger.warning(
                "default_tokenize(%r): ChatLmDatasetFormat(mask_user_turns=True): the loss covers every "
                "token here (no loss masks yet), user turns included",
                name,
            )
        return step, "text"
    step = ExecutorStep(
        name=f"documents/{name}",
        fn=make_documents,
        config=DocumentsConfig(
            input_path=raw,
            output_path=this_output_path(),
            source=versioned(name),
            text_field=versioned(record_field),
        ),
        description=f"Raw files -> document shards (text in {record_field!r})",
    )
    return step, "text"


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

TRAIN_FIELDS_VERSIONED_WHEN_SET = (
    *ADAM_FIELDS,  # beta1, beta2, epsilon, max_grad_norm, decay, rewarmup, cycle_length, skip_bad_steps
    "z_loss_weight",
    "initialize_from_checkpoint_path",
    "initialize_from_hf",
)
"""SimpleTrainConfig fields that change the trained model too, but are versioned only when set:
None (Levanter's default) leaves the field out of the version, so the steps declared before
these fields existed keep their output paths. A step or `output_path_of(...)` given as an
initial checkpoint is an input of the training step (its version is part of this one's)."""

DEFAULT_TRAINING_RESOURCES: dict[str, Any] = {"accelerator": "any"}
"""The resources of training and evaluation steps whose SimpleTrainConfig sets none: any
accelerator the driver has (the local runner reads only whether a step declares resources)."""


def _resources(train_config: Any) -> ResourceConfig | dict[str, Any]:
    """`train_config.resources` when set, else DEFAULT_TRAINING_RESOURCES (a fresh copy)."""
    resources = getattr(train_config, "resources", None)
    return dict(DEFAULT_TRAINING_RESOURCES) if resources is None else resources


def default_train(
    name: str,
    tokenized: StepInput,
    model_config: Any,
    train_config: Any,
    tags: Sequence[str] = (),
    use_default_validation: bool = True,
    eval_harness_tasks: Sequence[Any] = (),
    wandb_name: str | None = None,
    wandb_group: str | None = None,
    override_output_path: str | None = None,
    *,
    tokenizer: StepInput | str | None = None,
    tracker: str = "wandb",
) -> ExecutorStep:
    """`checkpoints/<name>`: train a model on a tokenized step (Marin's signature).

    `model_config`: a `LlamaSpec` such as `marin.models.llama_nano` (or `versioned(...)` of
    one), or Levanter's `LlamaConfig` (its shape is kept). `train_config`:
    `marin.models.SimpleTrainConfig` (Marin's fields) or the `TrainSettings` it converts to.
    The tokenizer is the one the tokenized step used (a Hub id is fetched when training
    runs), else `tokenizer`. The model shape and the hyperparameters that change the model
    are versioned, as in Marin: those of TRAIN_FIELDS_THAT_MATTER always; Adam's betas,
    epsilon and clipping, the schedule's decay, rewarmup and cycles, skip_bad_steps, the
    z-loss and the initial checkpoint (TRAIN_FIELDS_VERSIONED_WHEN_SET) only when set, so
    leaving them unset keeps the output path a step had before they existed.
    `train_config.resources` (default: any accelerator) are the step's and not versioned.

    `tags`, `wandb_name` and `wandb_group` label the W&B run (as in Marin; the tags also show
    in the step's description) and are not versioned: `wandb_name` None names the run after
    its id (a hash of the output path, which is also how a resumed run finds its W&B run),
    `wandb_group` None takes `$WANDB_GROUP` as Marin does, else no group. Marin's other
    arguments: `use_default_validation` adds nothing here (there are no default validation
    sets yet; the tokenized step's validation split is evaluated during training);
    `eval_harness_tasks` must be empty (run harness tasks after training, with operations.eval).
    """
    from dataclasses import replace

    from marin.models import as_llama_spec
    from operations.train import TrainConfig, train

    if eval_harness_tasks:
        raise ValueError(
            f"default_train({name!r}): eval_harness_tasks during training are not supported; pass "
            "eval_harness_tasks=() and evaluate the checkpoint with operations.eval (harness_tasks)"
        )
    if isinstance(tags, str):
        raise ValueError(f"default_train({name!r}): tags={tags!r} is a string; pass a list of tags")
    if not isinstance(tokenized, ExecutorStep | InputName):
        raise ValueError(
            f"default_train({name!r}): tokenized must be a default_tokenize step (or an InputName of "
            f"one), got {type(tokenized).__name__} (data mixtures are not supported yet)"
        )
    if tokenizer is None:
        producer = tokenized if isinstance(tokenized, ExecutorStep) else tokenized.step
        tokenizer = getattr(getattr(producer, "config", None), "tokenizer", None)
        if tokenizer is None:
            raise ValueError(
                f"default_train({name!r}): cannot tell the tokenizer of {tokenized!r}; pass tokenizer=..."
            )
    tokenizer_value = tokenizer.value if isinstance(tokenizer, VersionedValue) else tokenizer
    model_value = model_config.value if isinstance(model_config, VersionedValue) else model_config
    model = as_llama_spec(model_value)
    settings = (
        train_config.to_train_settings() if hasattr(train_config, "to_train_settings") else train_config
    )
    versions = {field: versioned(getattr(settings, field)) for field in TRAIN_FIELDS_THAT_MATTER}
    for field in TRAIN_FIELDS_VERSIONED_WHEN_SET:
        value = getattr(settings, field)
        if value is not None:
            versions[field] = value if isinstance(value, ExecutorStep | InputName) else versioned(value)
    versioned_train = replace(settings, **versions)
    hub = is_hub_id(tokenizer_value)
    tagged = f" [{', '.join(tags)}]" if tags else ""
    return ExecutorStep(
        name=f"checkpoints/{name}",
        fn=train_with_hub_tokenizer if hub else train,
        config=TrainConfig(
            tokenized_path=tokenized,
            tokenizer=ensure_versioned(tokenizer) if isinstance(tokenizer_value, str) else tokenizer,
            model=versioned(model),
            train=versioned_train,
            output_path=this_output_path(),
            tracker=tracker,
            wandb_name=wandb_name,
            wandb_group=wandb_group if wandb_group is not None else os.environ.get("WANDB_GROUP"),
            wandb_tags=tuple(tags),
        ),
        description=f"Train {name} for {settings.num_train_steps} steps{tagged}",
        resources=_resources(settings),
        override_output_path=override_output_path,
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

    tokenizer = trained.config.tokenizer
    hub = is_hub_id(tokenizer.value if isinstance(tokenizer, VersionedValue) else tokenizer)
    return ExecutorStep(
        name=f"evaluation/{name}",
        fn=evaluate_with_hub_tokenizer if hub else evaluate,
        config=EvalConfig(
            checkpoint_path=trained / "checkpoints",
            tokenizer=tokenizer,
            datasets=dict(datasets),
            model=trained.config.model,
            output_path=this_output_path(),
            max_eval_batches=versioned(max_eval_batches),
            batch_size=versioned(batch_size),
        ),
        description=f"Evaluate {trained.name} on {', '.join(datasets)}",
        resources=_resources(getattr(trained.config, "train", None)) if resources is None else resources,
    )
