"""Know before training: an isoflop grid of tiny Llamas, a scaling-law fit, a prediction written
down before the big run starts, the big run, and the comparison -- all on the CPU.

    python experiments/tutorials/scaling_law.py --prefix /tmp/scaling   # cold: ~7 minutes
    python experiments/tutorials/scaling_law.py --prefix /tmp/scaling   # again: all cached, <1 s

1. data: the embedded corpus (the running Python's standard library), stdlib_data.py's
   download -> documents -> filter -> dedup -> a 512-token BPE, then the files cut into pieces
   of ~1,000 characters in a seeded random order (`shuffled/stdlib`: training reads the token
   cache in order, see `shuffle_chunks`) and tokenized once: every run reads the same tokens;
2. `checkpoints/isoflop/stdlib/<budget>-<model>`: at each of BUDGETS, SIZES_PER_BUDGET tiny
   Llamas around the expected optimum, each trained for budget / (training FLOPs per token)
   tokens in whole steps of 8 x 128 tokens; one learning rate for all (LEARNING_RATE), 10%
   warm-up, cosine decay to 10% at each run's own end; the loss is the held-out loss at the end;
3. `analysis/scaling/stdlib`: per budget the loss-minimising size (a parabola in ln N), power
   laws N*(C), D*(C), L*(C) through the minima, a bootstrap over the runs (fit.json,
   isoflops.png, frontier.png, summary.md);
4. `predictions/stdlib-target`: the predicted final loss of TARGET_MODEL trained for
   TARGET_BUDGET FLOPs (10x the largest budget of the grid) with its 90% interval, written once,
   read-only, with the version hash of every run and of the fit it came from;
5. `checkpoints/stdlib-target`: the target run. The prediction is one of its inputs: it cannot
   start before the prediction exists, and it records the prediction's digest before its first
   step (preregistration.json);
6. `analysis/prediction/stdlib-target`: predicted vs actual, inside the interval or not, and
   whether the pre-registration holds (report.json, prediction.png, summary.md).

MEASURED (2 CPU cores shared with other jobs, no GPU, cold prefix, 2026-11-23): 425 s wall
(636 s CPU), 23 steps, 13 of them trainings; a re-run: all 23 cached, 0.5 s. All three budgets
had a bracketed minimum (N* = 4.4e3, 9.3e3, 1.5e4 compute parameters; N*(C) ~ C^0.53,
L*(C) ~ C^-0.095); predicted 2.960 (90% interval 2.530 .. 3.630), actual 2.970: inside, error
+0.010 nats (+0.3%). Expect errors of several percent rather than this: an earlier version of
this grid (budgets 3e10, 1e11, 3e11, target 3e12) missed by -0.196 (-6.4%), also inside its
interval. docs/scaling.md says what to expect at real scale.

The target model is named here, before anything runs (the fit only chooses its predicted loss):
that is what makes the prediction a pre-registration. `scaling_steps(...)` takes smaller
settings; tests/integration/test_scaling_law.py runs a reduced version.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from executor import ExecutorStep, ResourceConfig, executor_main, this_output_path, versioned
from experiments.tutorials.stdlib_data import build_steps
from marin.models import LlamaSpec
from marin.scaling import (
    LearningRateRule,
    default_prediction,
    default_prediction_report,
    default_preregistered_train,
    default_scaling_fit,
    isoflop_grid,
)
from operations.shards import iter_documents, join, shard_name, write_documents, write_stats
from operations.tokenize import TokenizeConfig, tokenize

VOCAB_SIZE = 512
"""The tokenizer's vocabulary. Small, so that the output head (d x V) does not dwarf the blocks."""

BUDGETS = (2e10, 6e10, 2e11)
"""The grid's FLOP budgets (training FLOPs: 6 N D plus attention, as Levanter counts them)."""

TARGET_BUDGET = 2e12
"""The budget of the predicted run: 10x the largest of the grid."""

TARGET_MODEL = "d64l2"
"""The model of the predicted run (a member of FAMILY), fixed before anything runs. The fit put
the compute-optimal size at 2e12 near 5.4e4 compute parameters; d64l2 has 1.1e5, so the
prediction includes the off-optimum term (curvature x (ln N - ln N*)^2, here 0.08 nats)."""

SIZES_PER_BUDGET = 4
TOKENS_PER_PARAMETER = 80.0
"""Where each budget's window of sizes is centred. At these tiny sizes the optimum lies near a
hundred tokens per compute parameter, not Chinchilla's 20: short runs gain more from steps than
from width."""

LEARNING_RATE = LearningRateRule(base=1e-2, width_exponent=0.0)
"""One peak learning rate for every width. (In a trial at 1e11 FLOPs it beat the 1/width rule
from 3e-3 at width 64 by 0.02 to 0.04 nats at widths 16 and 32.)"""

BATCH_SIZE = 8


def tiny_llama(width: int, layers: int) -> LlamaSpec:
    """A tiny Llama: heads of 32 (one below width 64), SwiGLU twice as wide, sequences of 128."""
    heads = max(1, width // 32)
    return LlamaSpec(
        hidden_dim=width,
        intermediate_dim=2 * width,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        seq_len=128,
    )


FAMILY = {
    f"d{width}l{layers}": tiny_llama(width, layers)
    for width, layers in ((4, 1), (8, 1), (16, 1), (24, 1), (32, 1), (48, 1), (64, 1), (64, 2), (96, 2))
}
"""The model shapes; at each budget the grid keeps SIZES_PER_BUDGET of them around the optimum."""


@dataclass(frozen=True)
class ShuffleChunksConfig:
    input_path: str
    """Document shards (the deduplicated stdlib files)."""

    output_path: str
    chunk_chars: int = 1000
    """Pieces of about this many characters, cut at line ends."""

    shards: int = 4
    seed: int = 0


def shuffle_chunks(config: ShuffleChunksConfig) -> None:
    """Cut every document into pieces of about `chunk_chars` characters (at line ends) and write
    the pieces in a seeded random order.

    Training reads the token cache in order (no shuffling), and a stdlib file can be hundreds of
    training sequences long: without this, the runs of a grid, which stop at different points of
    the stream, would end on different files, and their final losses would differ by which
    module they saw last (by up to 0.7 nats here) rather than by size."""
    started = time.perf_counter()
    pieces = []
    for document in iter_documents(config.input_path):
        text, start = document["text"], 0
        while start < len(text):
            end = text.find("\n", start + config.chunk_chars)
            end = len(text) if end < 0 else end + 1
            pieces.append({"id": f"{document['id']}#{len(pieces)}", "text": text[start:end]})
            start = end
    random.Random(config.seed).shuffle(pieces)
    for index in range(config.shards):
        write_documents(join(config.output_path, shard_name(index)), pieces[index :: config.shards])
    write_stats(
        config.output_path,
        {"pieces": len(pieces), "shards": config.shards, "seconds": round(time.perf_counter() - started, 2)},
    )


def shuffled_data(max_files: int | None, vocab_size: int) -> list[ExecutorStep]:
    """stdlib_data's download -> documents -> filter -> dedup -> tokenizer, then the documents cut
    into shuffled pieces (`shuffled/...`) and tokenized with that tokenizer (`tokenized/...`)."""
    raw, documents, filtered, deduped, tokenizer, _ = build_steps(max_files, vocab_size=vocab_size)
    name = "stdlib" if max_files is None else f"stdlib-{max_files}"
    shuffled = ExecutorStep(
        name=f"shuffled/{name}",
        fn=shuffle_chunks,
        config=ShuffleChunksConfig(
            input_path=deduped,
            output_path=this_output_path(),
            chunk_chars=versioned(1000),
            shards=versioned(4),
            seed=versioned(0),
        ),
        description="The stdlib cut into pieces of ~1,000 characters, in a random order",
    )
    tokenized = ExecutorStep(
        name=f"tokenized/{name}-shuffled",
        fn=tokenize,
        config=TokenizeConfig(
            input_path=shuffled,
            tokenizer=tokenizer,
            output_path=this_output_path(),
            validation_fraction=versioned(0.05),
            seed=versioned(0),
            text_field=versioned("text"),
        ),
        description="Tokenize the shuffled pieces into a Levanter cache",
    )
    return [raw, documents, filtered, deduped, tokenizer, shuffled, tokenized]


def scaling_steps(
    budgets=BUDGETS,
    target_budget: float = TARGET_BUDGET,
    target_model: str = TARGET_MODEL,
    family=FAMILY,
    *,
    sizes_per_budget: int = SIZES_PER_BUDGET,
    tokens_per_parameter: float = TOKENS_PER_PARAMETER,
    min_steps: int = 20,
    max_files: int | None = None,
    vocab_size: int = VOCAB_SIZE,
    bootstrap_samples: int = 1000,
    learning_rate: LearningRateRule = LEARNING_RATE,
    batch_size: int = BATCH_SIZE,
    max_eval_batches: int = 16,
    name: str = "stdlib",
) -> dict[str, ExecutorStep | tuple[ExecutorStep, ...]]:
    """The study's steps by role: data, grid, fit, prediction, target, report."""
    *data, tokenized = shuffled_data(max_files, vocab_size)
    grid = isoflop_grid(
        name,
        tokenized,
        budgets,
        family,
        vocab_size=vocab_size,
        batch_size=batch_size,
        learning_rate=learning_rate,
        warmup=0.1,
        min_lr_ratio=0.1,
        min_steps=min_steps,
        sizes_per_budget=sizes_per_budget,
        tokens_per_parameter=tokens_per_parameter,
        max_eval_batches=max_eval_batches,
        # One CPU each: two runs at a time on a 2-core machine (their start-up overlaps).
        resources=ResourceConfig.with_cpu(1),
    )
    fit = default_scaling_fit(name, grid, bootstrap_samples=bootstrap_samples)
    target = grid.target(f"{name}-target", family[target_model], target_budget, model_name=target_model)
    prediction = default_prediction(f"{name}-target", fit, target)
    trained = default_preregistered_train(f"{name}-target", grid, target, prediction)
    report = default_prediction_report(f"{name}-target", prediction, trained)
    return {
        "data": (*data, tokenized),
        "grid": grid.steps,
        "fit": fit,
        "prediction": prediction,
        "target": trained,
        "report": report,
    }


def all_steps(steps: dict) -> list[ExecutorStep]:
    """The steps of `scaling_steps(...)` as one list."""
    out: list[ExecutorStep] = []
    for value in steps.values():
        out.extend(value if isinstance(value, tuple) else (value,))
    return out


if __name__ == "__main__":
    import fsspec

    steps = scaling_steps()
    executor = executor_main(
        steps=all_steps(steps), description="Isoflop grid, fit, pre-registered prediction, target run"
    )
    for role in ("fit", "prediction", "report"):
        fs, path = fsspec.core.url_to_fs(f"{executor.output_paths[steps[role]]}/summary.md")
        if fs.exists(path):
            print(fs.cat_file(path).decode("utf-8"))
