"""Training through the executor vs bare Levanter: per-step time ratio, tokens/s, MFU, compile time.

    .venv/bin/python bench/train_overhead.py [--model llama_nano] [--batch 8] [--seq-len N]
        [--steps 300] [--skip 20] [--pairs 6] [--cpus 0,1] [--concurrent] [--peak-tflops T] [--out DIR]
        [--data DIR] [--bare-only] [--attention B] [--flash-block-size N] [--remat P]

A tokenized dataset is built once (the tests' code-like corpus, a 400-token BPE tokenizer,
a Levanter cache; more documents when a batch of long sequences needs them; `--data DIR`
keeps it in DIR and reuses it when DIR already holds one). Then the same
`operations.train.TrainConfig` (`--model` from `marin.models.MODELS`, tracker "none", seed 0,
eval and checkpoints only at the end) is trained in fresh processes, two kinds:

- bare: `levanter.main.train_lm.main(operations.train.levanter_config(config))`, nothing else;
- executor: an `ExecutorStep` wrapping `operations.train.train`, run by
  `executor.Executor(prefix, console=False).run([step])`.

`--attention`, `--flash-block-size` and `--remat` set the TrainConfig's attention backend,
flash block size and gradient checkpointing (speed and memory settings; Levanter's defaults
otherwise). With `--bare-only` there are no executor runs and no ratio: `--pairs` bare runs
measure throughput and MFU alone, and they skip the final checkpoint and the Hugging Face
export (both come after the timed steps, so only the wall time changes). That is how the GPU
figures of docs/gpu.md were taken for the largest model.

Runs come in `--pairs` pairs, ordered ABBA (bare+executor, executor+bare, ...), so a slow
spell or a drift in machine load hits both kinds alike. Every child can be pinned to the same
CPUs (`--cpus`, through `sched_setaffinity`, which XLA's CPU thread pool also obeys). With
`--concurrent` the two runs of a pair go side by side, each pinned to one CPU (swapped every
pair): on a machine shared with other work both then see the same load at the same time.

What is measured. Both kinds write the per-step metrics file that `levanter_config` installs
(metrics.jsonl); `throughput/duration` there is Levanter's own wall time of one training step
(hooks and data loading excluded). Per run:

- step s = median of the step durations of steps `--skip` .. last-1 (compilation, warm-up and
  the final step with its checkpoint hooks left out); p10 step s = their 10th percentile, the
  time of a step that other processes did not interrupt;
- tokens/s = batch * seq_len / step s;
- compile s = step 0's duration (tracing + XLA compilation + one step);
- wall s = the child process's wall clock (imports, data loading, eval, checkpoint included).

The overhead figure is per pair: ratio = bare step time / executor step time (= executor
tokens/s over bare tokens/s; < 1 means the executor is slower), once from the median step
times and once from the p10 step times. Reported: every pair's ratios, their medians with a
95% bootstrap interval (pairs resampled), min-of-medians (fastest bare run's step s over the
fastest executor run's: both at their least disturbed) and the fastest-step ratio (the
quickest single steady step of each kind).

`train_overhead_ratio` is the median of the p10 pair ratios, and the verdict
("met": its interval lies at or above the 0.98 target; "not met": below; "undecided":
straddling, or fewer than 3 pairs) uses that interval. Why p10, not the median: on shared
CPUs other processes only ever add time to a step, in bursts that last seconds and land on
one run of a pair more than the other; the median step of a run moves with them (side by
side on a loaded 2-core box: median-step pair ratios 0.71-1.38, p10 ones 0.92-1.20), while
the 10th percentile is a step that ran undisturbed, i.e. the cost of the step itself. Its blind spot: overhead that hits fewer
than 10% of steps (a periodic stall). The executor's periodic work is a lease heartbeat
every 10 s, and a py-spy profile of its training thread shows none (docs/benchmarks.md);
on a quiet machine (a GPU) the two ratios agree and either can be read.

MFU = model FLOPs per token * tokens/s / peak FLOP/s, with the PaLM (Chowdhery et al. 2022,
appendix B) count of training FLOPs per token:

    6 * N + 12 * L * H * Q * T

N = parameters that take part in a matmul (every parameter except the input embedding table;
the output head counts, tied or not), at the dataset's vocabulary; L layers, H query heads,
Q head size (H * Q = hidden size), T training sequence length. The attention term is the
non-causal count, as in PaLM. Peak FLOP/s: `--peak-tflops`, or by the JAX device kind the
child reports: dense bf16 of H100 SXM 989, H100 PCIe 756, H100 NVL 835, H200 989, A100 312
TFLOP/s; no entry (a CPU) prints n/a.

Devices: each child reports the JAX backend and device kind, and an executor run's
`train` logs them ("train: JAX backend gpu, 1 x ...") and records them in stats.json; the
result lines show both, so a GPU run shows it trained on the GPU.

The last line is machine-readable: `train_overhead_ratio=R` (target >= 0.98); with
`--bare-only`, `tokens_per_second=T mfu=M`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
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

PEAK_TFLOPS = (
    # (substring of jax's device_kind, lower case; dense bf16 TFLOP/s). First match wins.
    ("h100 pcie", 756.0),
    ("h100 nvl", 835.0),
    ("h100", 989.0),
    ("h200", 989.0),
    ("a100", 312.0),
)

TOKENS_PER_DOCUMENT = 47
"""About how many tokens one of the tests' corpus documents makes with the 400-token tokenizer."""

VALIDATION_FRACTION = 0.05


def build_data(root: str, documents: int) -> tuple[str, str]:
    """A tokenized dataset and its tokenizer under `root` (the tests' corpus maker)."""
    from operations.tokenize import TokenizeConfig, tokenize
    from operations.tokenizer import TrainTokenizerConfig, train_tokenizer
    from tests.operations.test_tokenizer import make_corpus

    docs, tokenizer, tokenized = (os.path.join(root, name) for name in ("docs", "tokenizer", "tokenized"))
    make_corpus(docs, documents=documents, shards=2)
    train_tokenizer(TrainTokenizerConfig(input_path=docs, output_path=tokenizer, vocab_size=400))
    tokenize(TokenizeConfig(docs, tokenizer, tokenized, validation_fraction=VALIDATION_FRACTION, workers=1))
    return tokenized, tokenizer


def documents_needed(batch: int, seq_len: int) -> int:
    """Enough documents that the validation split holds a couple of full batches."""
    return max(2000, math.ceil(2 * batch * seq_len / (VALIDATION_FRACTION * TOKENS_PER_DOCUMENT)))


def train_config(args: argparse.Namespace, output_path: str):
    from marin.models import model_spec
    from operations.train import SimpleTrainConfig, TrainConfig

    return TrainConfig(
        tokenized_path=args.tokenized,
        tokenizer=args.tokenizer,
        model=model_spec(args.model),
        train=SimpleTrainConfig(
            train_batch_size=args.batch,
            num_train_steps=args.steps,
            learning_rate=3e-3,
            seq_len=args.seq_len,
            # Eval and checkpoints only at the end, so the steady steps are training steps.
            steps_per_eval=10 * args.steps,
            max_eval_batches=1,
            steps_per_checkpoint=10 * args.steps,
            checkpoint_minutes=None,
            epochs=args.epochs,  # cycle the small corpus rather than refuse the run
            seed=0,
        ),
        output_path=output_path,
        tracker="none",
        attention_backend=args.attention,
        flash_attention_block_size=args.flash_block_size,
        gradient_checkpointing=remat_policy(args.remat),
    )


def remat_policy(value: str | None) -> bool | str:
    """--remat's text as TrainConfig.gradient_checkpointing (true/false as booleans)."""
    if value is None or value.lower() == "true":
        return True
    if value.lower() == "false":
        return False
    return value


def without_saves(lm_config):
    """Levanter's config with no final checkpoint and no Hugging Face export (--bare-only)."""
    import dataclasses
    import datetime

    from levanter.checkpoint import CheckpointerConfig

    checkpointer = CheckpointerConfig(
        base_path=lm_config.trainer.checkpointer.base_path,
        save_interval=datetime.timedelta(days=365),
        keep=[],
        append_run_id_to_base_path=False,
    )
    trainer = dataclasses.replace(lm_config.trainer, checkpointer=checkpointer)
    return dataclasses.replace(lm_config, trainer=trainer, hf_save_path=None)


def child(mode: str, args: argparse.Namespace) -> None:
    """Train once in this (fresh) process; the last line printed is a JSON object."""
    from operations.train import describe_devices

    if mode == "bare":
        from levanter.main.train_lm import main

        from operations.train import levanter_config

        lm_config = levanter_config(train_config(args, args.output))
        main(without_saves(lm_config) if args.bare_only else lm_config)
        output = args.output
    else:
        from dataclasses import replace

        from executor import Executor, ExecutorStep, this_output_path
        from operations.train import train

        config = train_config(args, "unused")
        step = ExecutorStep(
            name="bench/train", fn=train, config=replace(config, output_path=this_output_path())
        )
        executor = Executor(args.output, console=False)
        executor.run([step])
        output = executor.output_paths[step]
    devices = describe_devices()
    print(json.dumps({"output": output, "backend": devices["backend"], "device_kind": devices["kind"]}))


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (q in [0, 1])."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def start(mode: str, out: str, args: argparse.Namespace, cpus: set[int] | None) -> tuple:
    """Launch one child (pinned to `cpus` if given); `finish` collects it."""
    command = [sys.executable, os.path.abspath(__file__), "--child", mode, "--model", args.model]
    command += ["--steps", str(args.steps), "--batch", str(args.batch), "--epochs", str(args.epochs)]
    command += ["--tokenized", args.tokenized, "--tokenizer", args.tokenizer, "--output", out]
    if args.seq_len:
        command += ["--seq-len", str(args.seq_len)]
    for flag, value in (
        ("--attention", args.attention),
        ("--flash-block-size", args.flash_block_size),
        ("--remat", args.remat),
    ):
        if value is not None:
            command += [flag, str(value)]
    if args.bare_only:
        command += ["--bare-only"]
    # The repository first, then whatever the caller's PYTHONPATH holds (e.g. extra packages).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    log = open(out + ".stderr", "w+")  # noqa: SIM115 (closed in finish)
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO, env=env, preexec_fn=pin
    )
    return mode, process, log, time.perf_counter(), cpus


def finish(launched: tuple, args: argparse.Namespace) -> dict:
    from operations.train import read_metrics

    mode, process, log, started, cpus = launched
    stdout, _ = process.communicate()
    wall = time.perf_counter() - started
    log.seek(0)
    errors = log.read()
    log.close()
    if process.returncode != 0:
        sys.exit(f"{mode} run failed (exit {process.returncode}):\n{errors[-4000:]}")
    info = json.loads(stdout.strip().splitlines()[-1])
    metrics = read_metrics(info["output"])
    durations = {m["step"]: m["throughput/duration"] for m in metrics if "throughput/duration" in m}
    steady = [durations[s] for s in sorted(durations) if args.skip <= s < args.steps - 1]
    if len(steady) < 5:
        sys.exit(f"{mode}: only {len(steady)} steady steps; raise --steps or lower --skip")
    logged = recorded = None
    if mode == "executor":
        # `train` logs the devices to the step's log and records them in stats.json.
        with open(os.path.join(info["output"], ".executor_log"), errors="replace") as handle:
            logged = next((line for line in handle if "train: JAX backend" in line), None)
        with open(os.path.join(info["output"], "stats.json")) as handle:
            recorded = json.load(handle).get("devices")
    gflops = [
        m["throughput/gflops_per_second"]
        for m in metrics
        if m["step"] >= args.skip and "throughput/gflops_per_second" in m
    ]
    return {
        "mode": mode,
        "cpus": sorted(cpus) if cpus else None,
        "backend": info["backend"],
        "device_kind": info["device_kind"],
        "compile_s": durations.get(0),
        "step_s": statistics.median(steady),
        "p10_step_s": quantile(steady, 0.1),
        "min_step_s": min(steady),
        "wall_s": wall,
        "levanter_gflops_per_s": statistics.median(gflops) if gflops else None,
        "devices_logged": logged[logged.index("JAX backend") :].strip() if logged else None,
        "devices_recorded": recorded,
        "steady_durations": steady,
    }


def flops_per_token(spec, vocab_size: int, seq_len: int) -> int:
    """PaLM's training FLOPs per token: 6 * matmul parameters + 12 * layers * hidden * seq_len."""
    matmul_parameters = spec.parameter_count(vocab_size)
    if not spec.tie_word_embeddings:
        matmul_parameters -= vocab_size * spec.hidden_dim  # the input embedding is a lookup
    head_dim = spec.hidden_dim // spec.num_heads
    return 6 * matmul_parameters + 12 * spec.num_layers * spec.num_heads * head_dim * seq_len


def peak_tflops(device_kind: str) -> float | None:
    kind = device_kind.lower()
    return next((peak for key, peak in PEAK_TFLOPS if key in kind), None)


def bootstrap_median(values: list[float], reps: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of `values`."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(reps))
    return medians[int(0.025 * reps)], medians[int(0.975 * reps) - 1]


def verdict(low: float, high: float, pairs: int) -> str:
    if pairs < 3:
        return "undecided (fewer than 3 pairs)"
    if low >= RATIO_TARGET:
        return "met"
    if high < RATIO_TARGET:
        return "not met"
    return "undecided (the interval straddles the target: more pairs or a quieter machine)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="llama_nano", help="a name from marin.models.MODELS")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's)")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--skip", type=int, default=20, help="first steps left out of the steady state")
    parser.add_argument("--pairs", "--repeats", type=int, default=6, help="bare/executor pairs, ABBA order")
    parser.add_argument("--cpus", help="pin every run to these CPUs, e.g. 0 or 0,1 (default: no pinning)")
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help="run each pair side by side, one CPU each (swapped every pair), so both see the same load",
    )
    parser.add_argument(
        "--peak-tflops", type=float, help="peak FLOP/s of one device for MFU (default: by device)"
    )
    parser.add_argument("--documents", type=int, help="corpus documents (default: enough for the batch)")
    parser.add_argument("--out", help="keep everything here (default: a temporary directory, deleted)")
    parser.add_argument("--data", help="build the dataset here, or reuse the one already here")
    parser.add_argument(
        "--bare-only",
        action="store_true",
        help="bare runs only (no ratio), without the final checkpoint and HF export: throughput and MFU",
    )
    parser.add_argument(
        "--attention",
        help="TrainConfig.attention_backend: jax_flash, vanilla, nvte, ... (default: Levanter's)",
    )
    parser.add_argument("--flash-block-size", type=int, help="TrainConfig.flash_attention_block_size")
    parser.add_argument(
        "--remat", help="TrainConfig.gradient_checkpointing: true (default), false, offload, recompute, ..."
    )
    parser.add_argument("--child", choices=("bare", "executor"), help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--tokenized", help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args)
        return

    from marin.models import model_spec

    spec = model_spec(args.model)
    seq_len = args.seq_len or spec.seq_len
    args.cpu_set = {int(c) for c in args.cpus.split(",")} if args.cpus else None
    root = args.out or tempfile.mkdtemp(prefix="train-overhead-")
    os.makedirs(root, exist_ok=True)
    try:
        started = time.perf_counter()
        data_root = args.data or os.path.join(root, "data")
        if args.data and os.path.isfile(os.path.join(data_root, "tokenized", "stats.json")):
            args.tokenized, args.tokenizer = (os.path.join(data_root, n) for n in ("tokenized", "tokenizer"))
            made = f"reused from {data_root}"
        else:
            documents = args.documents or documents_needed(args.batch, seq_len)
            args.tokenized, args.tokenizer = build_data(data_root, documents)
            made = f"{documents} documents, built in {time.perf_counter() - started:.1f} s"
        with open(os.path.join(args.tokenized, "stats.json")) as handle:
            data_stats = json.load(handle)
        vocab_size = data_stats["levanter_preprocessor"]["vocab_size"]
        sequences = max(1, data_stats["train"]["tokens"] // seq_len)
        args.epochs = math.ceil(args.steps * args.batch / sequences) + 1
        print(
            f"dataset: {data_stats['train']['tokens']} training tokens, vocabulary {vocab_size}, {made}",
            flush=True,
        )
        modes = ("bare",) if args.bare_only else ("bare", "executor")
        runs: dict[str, list[dict]] = {mode: [] for mode in modes}
        cpu_list = sorted(args.cpu_set or os.sched_getaffinity(0))
        if args.concurrent and len(cpu_list) < 2:
            sys.exit("--concurrent needs at least two CPUs")
        for pair in range(args.pairs):
            # ABBA: the order (or, run side by side, the CPU) alternates, so drift in machine
            # load or a busier CPU does not favour one side.
            order = modes if pair % 2 == 0 else modes[::-1]
            if args.concurrent and not args.bare_only:
                launched = [
                    start(mode, os.path.join(root, f"{mode}-{pair}"), args, {cpu_list[i]})
                    for i, mode in enumerate(order)
                ]
                results = [finish(one, args) for one in launched]
            else:
                results = [
                    finish(start(mode, os.path.join(root, f"{mode}-{pair}"), args, args.cpu_set), args)
                    for mode in order
                ]
            for result in results:
                runs[result["mode"]].append(result)
                print(json.dumps({k: v for k, v in result.items() if k != "steady_durations"}), flush=True)
        if args.out:
            with open(os.path.join(root, "results.json"), "w") as handle:
                json.dump(runs, handle)
    finally:
        if not args.out:
            shutil.rmtree(root, ignore_errors=True)

    tokens_per_step = args.batch * seq_len
    per_token = flops_per_token(spec, vocab_size, seq_len)
    device_kind = runs["bare"][0]["device_kind"]
    peak = args.peak_tflops or peak_tflops(device_kind)
    print(
        f"\n{args.model} ({spec.parameter_count(vocab_size):,} parameters at vocabulary {vocab_size}), "
        f"batch {args.batch} x seq {seq_len}, {args.steps} steps, steady = steps {args.skip}..{args.steps - 2}; "
        f"{runs['bare'][0]['backend']} ({device_kind}), Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs{f', pinned to {args.cpus}' if args.cpus else ''}"
        f"{'; pairs run side by side, one CPU each' if args.concurrent else ''}"
    )
    print(
        f"model FLOPs per token {per_token:,} (6N + 12*L*H*Q*T); peak {f'{peak} TFLOP/s' if peak else 'n/a'}; "
        f"attention {args.attention or 'default'}, flash block {args.flash_block_size or 'default'}, "
        f"remat {args.remat or 'true'}"
    )
    print(
        f"medians over {args.pairs} runs each{'; bare only, no final checkpoint or export' if args.bare_only else ''}"
    )
    print(f"{'run':<10}{'compile s':>11}{'step ms':>9}{'p10 ms':>8}{'tokens/s':>11}{'MFU':>8}{'wall s':>8}")
    mfus = {}
    for mode in modes:
        step_s = statistics.median(r["step_s"] for r in runs[mode])
        tokens = tokens_per_step / step_s
        mfus[mode] = per_token * tokens / (peak * 1e12) if peak else None
        mfu = f"{mfus[mode]:.1%}" if peak else "n/a"
        print(
            f"{mode:<10}{statistics.median(r['compile_s'] for r in runs[mode]):>11.2f}{step_s * 1000:>9.2f}"
            f"{statistics.median(r['p10_step_s'] for r in runs[mode]) * 1000:>8.2f}{tokens:>11,.0f}{mfu:>8}"
            f"{statistics.median(r['wall_s'] for r in runs[mode]):>8.1f}"
        )
    if args.bare_only:
        step_s = statistics.median(r["step_s"] for r in runs["bare"])
        mfu = f"{mfus['bare']:.3f}" if peak else "n/a"
        print(f"tokens_per_second={tokens_per_step / step_s:.0f} mfu={mfu}")
        return
    pairs = list(zip(runs["bare"], runs["executor"], strict=True))
    median_ratios = [b["step_s"] / e["step_s"] for b, e in pairs]
    p10_ratios = [b["p10_step_s"] / e["p10_step_s"] for b, e in pairs]
    for name, ratios in (("median", median_ratios), ("p10", p10_ratios)):
        low, high = bootstrap_median(ratios)
        print(
            f"pair ratios, {name} step (bare / executor): {', '.join(f'{r:.3f}' for r in ratios)}; "
            f"median {statistics.median(ratios):.3f}, 95% bootstrap interval [{low:.3f}, {high:.3f}]"
        )
    min_of_medians = min(r["step_s"] for r in runs["bare"]) / min(r["step_s"] for r in runs["executor"])
    fastest = min(r["min_step_s"] for r in runs["bare"]) / min(r["min_step_s"] for r in runs["executor"])
    print(f"min-of-medians ratio {min_of_medians:.3f}; fastest-step ratio {fastest:.3f}")
    # The verdict and the headline use the p10 step times: see the module docstring.
    low, high = bootstrap_median(p10_ratios)
    print(f"target >= {RATIO_TARGET}: {verdict(low, high, len(p10_ratios))}")
    print(f"train_overhead_ratio={statistics.median(p10_ratios):.3f}")


if __name__ == "__main__":
    main()
