"""Training through the executor vs bare Levanter: steady-state tokens/s ratio and compile time.

    .venv/bin/python bench/train_overhead.py [--steps 80] [--batch 8] [--out DIR]

One tiny tokenized dataset is built once (the tests' code-like corpus, a 400-token BPE
tokenizer, a Levanter cache). Then the same `operations.train.TrainConfig` (nano Llama,
batch 8, tracker "none", same seed) is trained twice, each in a fresh process:

- bare: `levanter.main.train_lm.main(operations.train.levanter_config(config))`, nothing else;
- executor: an `ExecutorStep` wrapping `operations.train.train`, run by
  `executor.Executor(prefix, console=False).run([step])`.

Both runs get the per-step metrics file that `levanter_config` installs (metrics.jsonl), so
the figures come from the same Levanter numbers: steady tokens/s is the median of
`throughput/tokens_per_second` over the steps after the first --skip (compilation and
warm-up excluded); compile is the first step's `throughput/duration` (tracing + XLA
compilation + one step); wall is the child process's wall clock (imports included). Each kind runs --repeats times,
alternating which goes first; the table shows medians.
The last line is machine-readable: `train_overhead_ratio=R` (executor / bare, target >= 0.98).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

RATIO_TARGET = 0.98
"""Executor steady-state tokens/s at least this fraction of bare Levanter's."""


def build_data(root: str) -> tuple[str, str]:
    """A tokenized dataset and its tokenizer under `root` (the tests' corpus maker, more documents)."""
    from operations.tokenize import TokenizeConfig, tokenize
    from operations.tokenizer import TrainTokenizerConfig, train_tokenizer
    from tests.operations.test_tokenizer import make_corpus

    docs, tokenizer, tokenized = (os.path.join(root, name) for name in ("docs", "tokenizer", "tokenized"))
    make_corpus(docs, documents=2000, shards=2)
    train_tokenizer(TrainTokenizerConfig(input_path=docs, output_path=tokenizer, vocab_size=400))
    tokenize(TokenizeConfig(docs, tokenizer, tokenized, validation_fraction=0.05, workers=1))
    return tokenized, tokenizer


def train_config(tokenized: str, tokenizer: str, output_path: str, steps: int, batch: int):
    from marin.models import MODELS
    from operations.train import SimpleTrainConfig, TrainConfig

    return TrainConfig(
        tokenized_path=tokenized,
        tokenizer=tokenizer,
        model=MODELS["llama_nano"],
        train=SimpleTrainConfig(
            train_batch_size=batch,
            num_train_steps=steps,
            learning_rate=3e-3,
            # Eval and checkpoints only at the end, so the steady steps are training steps.
            steps_per_eval=10 * steps,
            max_eval_batches=1,
            steps_per_checkpoint=10 * steps,
            checkpoint_minutes=None,
            epochs=20,  # cycle the small corpus rather than refuse the run
            seed=0,
        ),
        output_path=output_path,
        tracker="none",
    )


def child(mode: str, args: argparse.Namespace) -> None:
    """Train once in this (fresh) process; print the output directory as the last line."""
    if mode == "bare":
        from levanter.main.train_lm import main

        from operations.train import levanter_config

        config = train_config(args.tokenized, args.tokenizer, args.output, args.steps, args.batch)
        main(levanter_config(config))
        print(args.output)
        return
    from dataclasses import replace

    from executor import Executor, ExecutorStep, this_output_path
    from operations.train import train

    config = train_config(args.tokenized, args.tokenizer, "unused", args.steps, args.batch)
    step = ExecutorStep(name="bench/train", fn=train, config=replace(config, output_path=this_output_path()))
    executor = Executor(args.output, console=False)
    executor.run([step])
    print(executor.output_paths[step])


def measure(mode: str, tokenized: str, tokenizer: str, out: str, args: argparse.Namespace) -> dict:
    from operations.train import read_metrics

    command = [sys.executable, os.path.abspath(__file__), "--child", mode, "--steps", str(args.steps)]
    command += ["--batch", str(args.batch), "--tokenized", tokenized, "--tokenizer", tokenizer]
    command += ["--output", out]
    env = {**os.environ, "PYTHONPATH": REPO}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{mode} run failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    output_path = done.stdout.strip().splitlines()[-1]
    metrics = [m for m in read_metrics(output_path) if "throughput/tokens_per_second" in m]
    steady = [m["throughput/tokens_per_second"] for m in metrics if m["step"] >= args.skip]
    durations = {m["step"]: m["throughput/duration"] for m in metrics if "throughput/duration" in m}
    return {
        "mode": mode,
        "steps_logged": len(metrics),
        "compile_s": durations.get(0),
        "steady_tokens_per_s": statistics.median(steady),
        "steady_step_s": statistics.median(durations[s] for s in durations if s >= args.skip),
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=80, help="training steps per run")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--skip", type=int, default=10, help="first steps left out of the steady state")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind (alternating order)")
    parser.add_argument("--out", help="keep everything here (default: a temporary directory, deleted)")
    parser.add_argument("--child", choices=("bare", "executor"), help=argparse.SUPPRESS)
    parser.add_argument("--tokenized", help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args)
        return

    root = args.out or tempfile.mkdtemp(prefix="train-overhead-")
    try:
        started = time.perf_counter()
        tokenized, tokenizer = build_data(os.path.join(root, "data"))
        print(f"dataset built in {time.perf_counter() - started:.1f} s", flush=True)
        runs: dict[str, list[dict]] = {"bare": [], "executor": []}
        for repeat in range(args.repeats):
            # Alternate the order: on shared cores a slow spell should not always hit the same side.
            for mode in ("bare", "executor") if repeat % 2 == 0 else ("executor", "bare"):
                out = os.path.join(root, f"{mode}-{repeat}")
                runs[mode].append(measure(mode, tokenized, tokenizer, out, args))
                print(json.dumps(runs[mode][-1]), flush=True)
    finally:
        if not args.out:
            shutil.rmtree(root, ignore_errors=True)

    print(
        f"\nnano Llama, batch {args.batch}, {args.steps} steps, steady = median over steps >= {args.skip}; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    rows = [
        {
            key: statistics.median(r[key] for r in runs[mode]) if key != "mode" else mode
            for key in runs[mode][0]
        }
        for mode in ("bare", "executor")
    ]
    print(f"medians over {args.repeats} runs each")
    print(f"{'run':<10}{'compile s':>11}{'steady tok/s':>14}{'step ms':>9}{'wall s':>9}")
    for row in rows:
        print(
            f"{row['mode']:<10}{row['compile_s']:>11.2f}{row['steady_tokens_per_s']:>14.0f}"
            f"{row['steady_step_s'] * 1000:>9.1f}{row['wall_s']:>9.1f}"
        )
    pairs = [
        e["steady_tokens_per_s"] / b["steady_tokens_per_s"]
        for b, e in zip(runs["bare"], runs["executor"], strict=True)
    ]
    print("per-repeat ratios: " + ", ".join(f"{r:.3f}" for r in pairs))
    ratio = rows[1]["steady_tokens_per_s"] / rows[0]["steady_tokens_per_s"]
    print(f"target: >= {RATIO_TARGET}")
    print(f"train_overhead_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
