"""Eval: held-out loss and bits-per-byte of a checkpoint, one number per domain (Paloma-style).

Each domain is a tokenized dataset (the output of operations.tokenize); its `validation/`
cache is the held-out text. The model is loaded from a Levanter checkpoint (what
operations.train writes under `<run>/checkpoints/step-N`) and evaluated with Levanter's own
`TaggedEvaluator` -- the evaluator the trainer's in-training eval uses -- with one tag per
domain, so the numbers are the ones training logs as `eval/loss`.

The output directory:

    <output_path>/results.json   {"domains": {name: {"loss", "bpb", "tokens", "bytes", "levanter_bpb"}},
                                  "macro_avg_loss", "macro_avg_bpb", "micro_avg_loss",
                                  "checkpoint", "step", "seq_len", "batch_size", "max_eval_batches",
                                  "harness": {"tasks": {task: {metric: value}}, "averages": {...}}}
    <output_path>/stats.json     the same numbers plus seconds

Units: `loss` is the mean next-token cross-entropy in nats per predicted token (Levanter's
per-tag mean); `tokens` is the number of predicted tokens (Levanter's loss mask: every
position but the last of each sequence, padding excluded); `bytes` is the UTF-8 length of
those predicted tokens (`token_byte_lengths`: exact for byte-level BPE; special tokens such
as eos count 0 bytes but their loss counts, as in Levanter). `bpb = loss * tokens / (bytes *
ln 2)`: total bits over total bytes. Levanter's own per-tag bpb is a token-weighted mean of
per-batch bpb with its own byte table (3 bytes for a token holding part of a multi-byte
character), equal only when a domain fits in one batch and is ASCII; it is kept as `levanter_bpb`.

Optionally (`harness_tasks`), lm-eval-harness tasks from local task files run through
Levanter's harness integration on the same loaded model (needs the optional `lm_eval`).

A finished evaluation (results.json present) is not recomputed. JAX and Levanter are
imported inside the functions, so importing this module stays light.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import numbers
import os
import time
from dataclasses import dataclass
from typing import Any

import fsspec

from operations import run_records
from operations.buckets import configure as configure_buckets
from operations.buckets import is_bucket, using_input_copies
from operations.shards import is_local, join, read_json, write_json_atomic, write_stats
from operations.train import LlamaSpec, check_model, check_tokenizer_files

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
VALIDATION_DIR = "validation"


@dataclass(frozen=True)
class EvalConfig:
    checkpoint_path: str
    """A Levanter checkpoint (`<run>/checkpoints/step-N`), or a directory of them (the latest is used)."""

    tokenizer: str
    """Tokenizer directory the model was trained (and the domains tokenized) with."""

    datasets: dict[str, str]
    """Domain name -> tokenized dataset (output of operations.tokenize; its validation/ cache is evaluated).
    Names are Levanter tags: a "/" makes a hierarchy (e.g. "paloma/c4"); results are per leaf name."""

    model: LlamaSpec
    """Shape of the checkpoint's model (the TrainConfig.model of the run)."""

    output_path: str
    """Directory for results.json and stats.json."""

    max_eval_batches: int | None = None
    """Evaluate at most this many batches per domain (Levanter's max_eval_batches); None: all of it."""

    batch_size: int = 8
    """Sequences per evaluation batch (must divide by the number of devices)."""

    seq_len: int | None = None
    """Tokens per evaluated sequence; None: the model's seq_len. Use the training seq_len to compare
    with the training run's eval/loss."""

    mixed_precision: str | None = None
    """jmp policy, e.g. "p=f32,c=bfloat16"; None: that on an accelerator, "f32" on CPU (as operations.train)."""

    harness_tasks: tuple[str, ...] = ()
    """lm-eval-harness task config files (YAML or JSON, one task each, e.g. multiple choice over a local
    `dataset_path: json` file; relative data_files are read next to the config file) run through
    Levanter's harness integration. Needs the `lm_eval` package (0.4.13 tested), which is optional."""

    harness_max_examples: int | None = None
    """Evaluate at most this many documents per harness task; None: all."""

    def __hash__(self) -> int:  # dict field: hash its items so the config stays hashable
        return hash((self.checkpoint_path, self.tokenizer, tuple(sorted(self.datasets.items())), self.model,
                     self.output_path, self.max_eval_batches, self.batch_size, self.seq_len,
                     self.mixed_precision, self.harness_tasks, self.harness_max_examples))  # fmt: skip


def evaluate(config: EvalConfig) -> None:
    """Evaluate the checkpoint on every domain; write results.json and stats.json."""
    configure_buckets()  # checkpoint, caches and results may be on s3:// or gs://
    _check(config)
    results_path = join(config.output_path, RESULTS_FILE)
    if read_json(results_path) is not None:
        logger.info("eval: %s already exists", results_path)
        return
    started = time.perf_counter()
    with using_input_copies():  # a tokenizer on a bucket is read through a temporary copy
        results = compute_results(config)
    seconds = time.perf_counter() - started
    write_json_atomic(results_path, results)
    write_stats(config.output_path, {**results, "seconds": round(seconds, 1)})


evaluate.__run_records__ = run_records.EVAL  # type: ignore[attr-defined]


def _check(config: EvalConfig) -> None:
    if not config.datasets:
        raise ValueError("EvalConfig.datasets is empty: give at least one {name: tokenized path}")
    if not config.output_path:
        raise ValueError("EvalConfig.output_path is empty")
    if not _is_count(config.batch_size) or not (
        config.max_eval_batches is None or _is_count(config.max_eval_batches)
    ):
        raise ValueError(
            f"EvalConfig.batch_size={config.batch_size!r}, max_eval_batches={config.max_eval_batches!r}: must be "
            "integers >= 1 (max_eval_batches None: all of each domain)"
        )
    if not (config.seq_len is None or _is_count(config.seq_len)):
        raise ValueError(
            f"EvalConfig.seq_len={config.seq_len!r}: must be an integer >= 1, or None (the model's)"
        )
    check_model(config.model, "EvalConfig.model")
    from operations.tokenize import cache_finished

    for name, path in config.datasets.items():
        if not cache_finished(join(path, VALIDATION_DIR)):
            raise ValueError(
                f"EvalConfig.datasets[{name!r}]={path!r}: no finished Levanter cache at {join(path, VALIDATION_DIR)} "
                "(run operations.tokenize on the domain's documents first)"
            )
    tokenizer = config.tokenizer
    local = (
        isinstance(tokenizer, str)
        and is_local(tokenizer)
        and os.path.isdir(tokenizer.removeprefix("file://"))
    )
    if not (local or (isinstance(tokenizer, str) and is_bucket(tokenizer))):
        raise ValueError(
            f"EvalConfig.tokenizer={tokenizer!r}: must be a tokenizer directory, local or on s3:// / gs:// (the "
            "one the run trained with: its TrainConfig.tokenizer)"
        )
    check_tokenizer_files(tokenizer, "EvalConfig.tokenizer")


def _is_count(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def checkpoint_step(checkpoint_path: str) -> tuple[str, int]:
    """(the checkpoint directory, its step): `checkpoint_path` itself, or the latest checkpoint under it."""
    from levanter.checkpoint import discover_latest_checkpoint

    metadata = read_json(join(checkpoint_path, "metadata.json"))
    if metadata is None:
        latest = discover_latest_checkpoint(checkpoint_path)
        if latest is None:
            raise FileNotFoundError(
                f"EvalConfig.checkpoint_path={checkpoint_path!r}: no Levanter checkpoint (metadata.json) "
                "there or below; point it at <run>/checkpoints/step-N or <run>/checkpoints"
            )
        checkpoint_path = str(latest)
        metadata = read_json(join(checkpoint_path, "metadata.json"))
    return checkpoint_path, int(metadata["step"])


def checkpoint_shapes(checkpoint: str) -> dict[str, tuple[int, ...]]:
    """Shape of every array of a Levanter checkpoint's model, by Levanter's key path (dots):
    read from the tensorstore (zarr) metadata, not the arrays."""
    fs, root = fsspec.core.url_to_fs(join(checkpoint, "model"))
    root = root.rstrip("/")
    shapes = {}
    for name in (".zarray", "zarr.json"):
        for path in fs.glob(f"{root}/**/{name}"):
            with fs.open(path, "r") as handle:
                shape = json.load(handle).get("shape")
            if shape is not None:  # (zarr 3 groups have a zarr.json too)
                shapes[path[len(root) + 1 : -len(name) - 1].replace("/", ".")] = tuple(shape)
    return shapes


def check_checkpoint_shapes(config: EvalConfig, checkpoint: str, model: Any, vocab_size: int) -> None:
    """Before loading: every array of the model that `config.model` and the tokenizer build is in
    the checkpoint with the same shape, and the checkpoint has no other. Levanter would raise a
    shape error from deep inside Haliax, or -- for a checkpoint with an output head that a tied
    model lacks -- load what fits and evaluate another model than the one trained."""
    import haliax as hax
    import jax.tree_util as jtu
    from levanter.utils.jax_utils import leaf_key_paths

    def leaf(value: Any) -> bool:
        return value is None or hax.is_named_array(value)

    keys = jtu.tree_leaves(leaf_key_paths(model, is_leaf=leaf), is_leaf=lambda value: value is None)
    arrays = jtu.tree_leaves(model, is_leaf=leaf)
    expected = {
        key: tuple(array.array.shape) for key, array in zip(keys, arrays, strict=True) if array is not None
    }
    found = checkpoint_shapes(checkpoint)
    if not found:
        raise FileNotFoundError(
            f"EvalConfig.checkpoint_path={config.checkpoint_path!r}: {checkpoint} has no model arrays (model/ is "
            "missing or empty): an incomplete checkpoint; point it at another step-N"
        )
    differing = sorted(key for key in expected.keys() & found.keys() if expected[key] != found[key])
    if not differing and expected.keys() == found.keys():
        return
    embeddings = "embeddings.token_embeddings.weight"
    there, here = found.get(embeddings), expected.get(embeddings)
    if there and here and there[0] != here[0] and there[1:] == here[1:]:
        rounded = f" (rounded up to {here[0]} for the devices)" if here[0] != vocab_size else ""
        raise ValueError(
            f"EvalConfig.tokenizer={config.tokenizer!r} has {vocab_size} tokens{rounded}, but the checkpoint "
            f"{checkpoint} has a vocabulary of {there[0]}: give the tokenizer the run trained with"
        )
    held = _described_shape(found)
    differing_fields = [
        f"{name}: {value} in the checkpoint, {getattr(config.model, name)} in EvalConfig.model"
        for name, value in held.items()
        if getattr(config.model, name) != value
    ]
    if not differing_fields:  # (not Levanter's Llama layout, or a difference the shape fields do not show)
        differing_fields = [
            f"{key}: {found[key]} in the checkpoint, {expected[key]} here" for key in differing
        ]
        differing_fields += [
            f"{key}: not in the checkpoint" for key in sorted(expected.keys() - found.keys())
        ]
        differing_fields += [
            f"{key}: only in the checkpoint" for key in sorted(found.keys() - expected.keys())
        ]
    raise ValueError(
        f"EvalConfig.model does not describe the checkpoint {checkpoint} ({'; '.join(differing_fields[:4])}"
        f"{'; ...' if len(differing_fields) > 4 else ''}): give the TrainConfig.model of the run"
    )


def _described_shape(found: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The LlamaSpec fields a checkpoint's arrays show (Levanter's Llama layout); {} when they do not."""
    query = found.get("transformer.layers.stacked.self_attn.q_proj.weight")
    gate = found.get("transformer.layers.stacked.mlp.gate_proj.weight")
    if query is None or gate is None or len(query) != 5 or len(gate) != 3:
        return {}
    layers, kv_heads, per_group, _head_size, hidden = query
    return {
        "hidden_dim": hidden,
        "intermediate_dim": gate[1],
        "num_layers": layers,
        "num_heads": kv_heads * per_group,
        "num_kv_heads": kv_heads,
        "tie_word_embeddings": "lm_head.weight" not in found,
    }


def compute_results(config: EvalConfig) -> dict[str, Any]:
    """Load the checkpoint, run Levanter's TaggedEvaluator over the domains, return results.json's content."""
    import equinox as eqx
    import haliax as hax
    import jax
    import jmp
    import numpy as np
    from haliax.partitioning import round_axis_for_partitioning
    from levanter.checkpoint import load_checkpoint
    from levanter.distributed import RayConfig
    from levanter.eval import TaggedEvaluator
    from levanter.trainer import TrainerConfig
    from levanter.utils.jax_utils import use_cpu_device

    from operations.tokenize import lm_data_config
    from operations.train import check_vocabulary

    checkpoint, step = checkpoint_step(config.checkpoint_path)
    precision = config.mixed_precision
    if precision is None:
        precision = "f32" if jax.default_backend() == "cpu" else "p=f32,c=bfloat16"
    trainer = TrainerConfig(
        train_batch_size=config.batch_size,
        mp=jmp.get_policy(precision),
        ray=RayConfig(auto_start_cluster=False),
        require_accelerator=False,
    )
    # levanter.initialize would derive this (and set up tracking and logging we do not want here).
    devices = trainer.data_axis_size
    if config.batch_size % devices:
        raise ValueError(f"EvalConfig.batch_size={config.batch_size}: must divide by the {devices} devices")
    trainer = dataclasses.replace(trainer, per_device_eval_parallelism=config.batch_size // devices)
    model_config = config.model.to_levanter(seq_len=config.seq_len or config.model.seq_len)
    Pos = model_config.Pos
    EvalBatch = trainer.EvalBatch
    max_examples = None if config.max_eval_batches is None else config.max_eval_batches * EvalBatch.size

    names = list(config.datasets)
    data_configs = {name: lm_data_config(path, config.tokenizer) for name, path in config.datasets.items()}
    tokenizer = data_configs[names[0]].the_tokenizer
    for name, path in config.datasets.items():
        check_vocabulary(
            path, config.tokenizer, len(tokenizer), "EvalConfig.tokenizer", f"EvalConfig.datasets[{name!r}]"
        )
    tagged = [(data_configs[name].validation_set(Pos), [name]) for name in names]

    compute_mapping = trainer.compute_axis_mapping
    parameter_mapping = trainer.parameter_axis_mapping
    with trainer.use_device_mesh(), hax.axis_mapping(parameter_mapping):
        evaluator = TaggedEvaluator(
            EvalBatch,
            tagged,
            tokenizer,
            max_examples_per_dataset=max_examples,
            axis_mapping=compute_mapping,
            mp=trainer.mp,
        )
        # Exact token and byte counts of what Levanter evaluates: observe its batches (padding
        # included, masked out) as they go through its accumulator. (Its own token totals are
        # float32 running sums, inexact past 2**24 tokens.)
        table = token_byte_lengths(tokenizer)
        counted = {
            key: np.zeros(len(evaluator.dataset.tag_to_index), dtype=np.int64) for key in ("tokens", "bytes")
        }
        accumulate = evaluator.accum_for_batch

        def observed(model, state, batch, tags):
            tokens = np.asarray(batch.tokens.array)
            mask = np.asarray(batch.loss_mask.array, dtype=np.int64)
            tag_matrix = np.asarray(tags.array, dtype=np.int64)
            next_bytes = table[np.roll(tokens, -1, axis=1)]  # position i predicts token i + 1
            counted["tokens"] += mask.sum(axis=1) @ tag_matrix
            counted["bytes"] += (mask * next_bytes).sum(axis=1) @ tag_matrix
            return accumulate(model, state, batch, tags)

        evaluator.accum_for_batch = observed

        Vocab = round_axis_for_partitioning(hax.Axis("vocab", len(tokenizer)), parameter_mapping)
        with use_cpu_device():
            model = eqx.filter_eval_shape(model_config.build, Vocab, key=jax.random.PRNGKey(0))
            check_checkpoint_shapes(config, checkpoint, model, len(tokenizer))
            model = load_checkpoint(model, checkpoint, subpath="model", discover_latest=False)
        model = hax.shard_with_axis_mapping(model, parameter_mapping)
        result = evaluator.evaluate(model)
        harness = run_harness(config, model, tokenizer, trainer, Pos.size) if config.harness_tasks else None

    domains = {}
    for name in names:
        index = evaluator.dataset.tag_to_index[name]
        loss = float(result.tag_micro_losses[name])
        tokens = int(counted["tokens"][index])
        n_bytes = int(counted["bytes"][index])
        domains[name] = {
            "loss": loss,
            "bpb": loss * tokens / (n_bytes * math.log(2)) if n_bytes else None,
            "tokens": tokens,
            "bytes": n_bytes,
            "levanter_bpb": float(result.tag_micro_bpb[name]),
        }
    bpbs = [d["bpb"] for d in domains.values() if d["bpb"] is not None]
    extra = {} if harness is None else {"harness": harness}
    return {
        **extra,
        "domains": domains,
        "macro_avg_loss": float(np.mean([d["loss"] for d in domains.values()])),
        "macro_avg_bpb": float(np.mean(bpbs)) if bpbs else None,
        "micro_avg_loss": float(result.micro_avg_loss),
        "checkpoint": checkpoint,
        "step": step,
        "seq_len": Pos.size,
        "batch_size": EvalBatch.size,
        "max_eval_batches": config.max_eval_batches,
    }


def harness_task(path: str) -> dict[str, Any]:
    """An lm-eval task config file as the dict Levanter's harness config takes (local data files made absolute)."""
    import os

    import yaml

    with fsspec.open(path, "r") as handle:
        task = yaml.safe_load(handle)  # JSON is YAML too
    if not isinstance(task, dict) or "task" not in task:
        raise ValueError(
            f"EvalConfig.harness_tasks: {path} is not an lm-eval task config (a mapping with 'task')"
        )
    data_files = (task.get("dataset_kwargs") or {}).get("data_files")
    if data_files is not None:
        base = os.path.dirname(os.path.abspath(path))

        def absolute(name: Any) -> Any:
            if isinstance(name, str) and "://" not in name and not os.path.isabs(name):
                return os.path.join(base, name)
            return name

        if isinstance(data_files, dict):
            data_files = {split: absolute(name) for split, name in data_files.items()}
        else:
            data_files = absolute(data_files)
        task["dataset_kwargs"] = {**task["dataset_kwargs"], "data_files": data_files}
    return task


def run_harness(config: EvalConfig, model: Any, tokenizer: Any, trainer: Any, seq_len: int) -> dict[str, Any]:
    """Run the harness tasks with Levanter's `run_lm_eval_harness`; {"tasks": {task: {metric: value}}, "averages"}."""
    try:
        import lm_eval.api.group
        import lm_eval.api.task
        import lm_eval.tasks
    except ImportError as error:
        raise ImportError(
            "EvalConfig.harness_tasks needs lm-eval-harness: pip install 'lm-eval==0.4.13' "
            "(with its dependencies; torch is not needed)"
        ) from error
    import levanter.eval_harness as levanter_harness

    # Levanter 1.2.dev1644 was written against an lm-eval whose `lm_eval.tasks` re-exported these two
    # classes; 0.4.13 does not (0.4.10-0.4.11 still do, but cannot load an unregistered inline task).
    for name, module in (("ConfigurableTask", lm_eval.api.task), ("ConfigurableGroup", lm_eval.api.group)):
        if not hasattr(lm_eval.tasks, name):
            setattr(lm_eval.tasks, name, getattr(module, name))

    harness_config = levanter_harness.LmEvalHarnessConfig(
        task_spec=[harness_task(path) for path in config.harness_tasks],
        max_examples=config.harness_max_examples,
        max_length=seq_len,
    )
    compute_averages = levanter_harness._compute_averages
    try:
        # lm-eval 0.4.13 adds string entries ("name") to each task's results, which Levanter's
        # averaging passes to np.mean: average the numbers only.
        levanter_harness._compute_averages = lambda outputs: compute_averages(_numeric_results(outputs))
        outputs = levanter_harness.run_lm_eval_harness(
            harness_config, model, tokenizer, trainer.EvalBatch, trainer.compute_axis_mapping, trainer.mp
        )
    finally:
        levanter_harness._compute_averages = compute_averages
    numbers = _numeric_results(outputs)
    return {"tasks": numbers["results"], "averages": outputs.get("averages", {})}


def _numeric_results(outputs: dict[str, Any]) -> dict[str, Any]:
    def numeric(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    results = {
        task: {key: value for key, value in metrics.items() if numeric(value)}
        for task, metrics in outputs["results"].items()
    }
    return {**outputs, "results": results}


def token_byte_lengths(tokenizer: Any) -> Any:
    """UTF-8 bytes of each token id (special tokens: 0), as a numpy array.

    Byte-level BPE tokens (GPT-2 style, what operations.tokenizer trains) spell their bytes
    one character per byte, so the count is exact even for tokens holding part of a
    multi-byte character. Levanter's `byte_length_of_token` decodes such a token to U+FFFD
    (3 bytes) instead; it is used only for tokenizers that are not byte-level.
    """
    import numpy as np
    from levanter.utils.hf_utils import byte_length_of_token
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    byte_chars = set(bytes_to_unicode().values())
    vocab = tokenizer.get_vocab()
    special = set(tokenizer.all_special_ids)
    byte_level = all(set(token) <= byte_chars for token, index in vocab.items() if index not in special)
    table = np.zeros(max(len(tokenizer), max(vocab.values()) + 1), dtype=np.int64)
    for token, index in vocab.items():
        if index in special:
            continue
        table[index] = len(token) if byte_level else byte_length_of_token(tokenizer, index)
    return table


def read_results(output_path: str) -> dict[str, Any]:
    """The results.json of an evaluation."""
    with fsspec.open(join(output_path, RESULTS_FILE), "r") as handle:
        return json.load(handle)
