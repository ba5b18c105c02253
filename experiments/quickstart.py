"""Quickstart: a whole study on a laptop, no cloud account -- the README's first command.

    python experiments/quickstart.py                 # about a minute on 2 CPU cores
    python experiments/quickstart.py                 # again: everything cached, seconds
    QUICKSTART_LR=1e-2 python experiments/quickstart.py   # re-runs only train and eval
                                                     # (the default learning rate is 3e-3)
    python experiments/quickstart.py --prefix s3://bucket/qs   # every output on a bucket
                                                     # (or gs://; README: Storage)

On the embedded corpus (the running Python's standard library): download -> documents ->
filter -> dedup -> tokenizer -> tokenize -> train a tiny Llama (Levanter, on the CPU) ->
eval (held-out loss and bits-per-byte). Outputs go under ./marin-output (or
$MARIN_PREFIX, or --prefix: a local directory, s3:// or gs://). It ends with a summary of
what was made and where. QUICKSTART_STEPS, QUICKSTART_MAX_FILES and QUICKSTART_VOCAB shrink
it (the tests run 8 steps on 120 files with a 512-token vocabulary).
"""

import json
import os
import sys

import fsspec

from executor import executor_main
from experiments.tutorials.stdlib_data import build_steps
from marin.defaults import default_eval, default_train
from marin.models import MODELS, SimpleTrainConfig

LEARNING_RATE = float(os.environ.get("QUICKSTART_LR", "3e-3"))
TRAIN_STEPS = int(os.environ.get("QUICKSTART_STEPS", "100"))
MAX_FILES = int(os.environ["QUICKSTART_MAX_FILES"]) if os.environ.get("QUICKSTART_MAX_FILES") else None
VOCAB_SIZE = int(os.environ.get("QUICKSTART_VOCAB", "4096"))


def quickstart_steps(
    max_files=MAX_FILES, steps=TRAIN_STEPS, learning_rate=LEARNING_RATE, vocab_size=VOCAB_SIZE
):
    raw, documents, filtered, deduped, tokenizer, tokenized = build_steps(max_files, vocab_size=vocab_size)
    model = MODELS["llama_nano"]
    train_config = SimpleTrainConfig(
        train_batch_size=8,
        num_train_steps=steps,
        learning_rate=learning_rate,
        steps_per_eval=max(steps // 4, 1),
        max_eval_batches=8,
        steps_per_checkpoint=max(steps // 2, 1),
        seed=0,
    )
    trained = default_train("quickstart-nano", tokenized, model, train_config, tracker="wandb")
    evaluated = default_eval("quickstart-nano", trained, {"stdlib": tokenized}, max_eval_batches=8)
    return {
        "raw": raw,
        "documents": documents,
        "filtered": filtered,
        "dedup": deduped,
        "tokenizer": tokenizer,
        "tokenized": tokenized,
        "train": trained,
        "eval": evaluated,
    }


def _load(path):
    with fsspec.open(path, "r") as handle:  # local, s3:// or gs://
        return json.load(handle)


def summary(executor, steps) -> str:
    """What the run produced, read from the stats files the steps wrote."""
    from operations.train import read_metrics

    out = {name: executor.output_paths[step] for name, step in steps.items()}
    tokens = _load(f"{out['tokenized']}/stats.json")
    vocab = _load(f"{out['tokenizer']}/stats.json").get("vocab_size")
    model = MODELS["llama_nano"]
    metrics = [m for m in read_metrics(out["train"]) if "train/loss" in m]
    results = _load(f"{out['eval']}/results.json")
    stdlib = results["domains"]["stdlib"]
    lines = [
        "",
        "Quickstart summary",
        f"  tokens:        {tokens['train']['tokens']:,} train / {tokens['validation']['tokens']:,} validation",
        f"  parameters:    {model.parameter_count(vocab):,} (llama_nano, vocabulary {vocab:,})",
        f"  final loss:    {metrics[-1]['train/loss']:.3f} (train, step {metrics[-1]['step']})",
        f"  held-out:      loss {stdlib['loss']:.3f}, {stdlib['bpb']:.3f} bits per byte",
        "  outputs:",
        *(f"    {name:<10} {path}" for name, path in out.items()),
        f"  browse:        marin browse --prefix {executor.prefix}   (web: DAG, files, loss curves)",
        f"                 marin ls --prefix {executor.prefix}       (marin show/why/reproduce/gc: docs/cli.md)",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    steps = quickstart_steps()
    executor = executor_main(
        steps=list(steps.values()), description="Quickstart: stdlib -> tiny Llama -> eval"
    )
    if executor is not None and "--dry_run" not in " ".join(sys.argv):
        print(summary(executor, steps))
