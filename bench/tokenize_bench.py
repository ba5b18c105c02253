"""Tokenize throughput: our tokenize operation (Levanter's cache builder) vs raw `tokenizers` on the same texts.

    .venv/bin/python bench/tokenize_bench.py                  # stdlib corpus x2 (~63 MB)
    .venv/bin/python bench/tokenize_bench.py --repeat 1 --runs 5 --no-ray

Standalone it builds documents from the running Python's standard library (~1,800 .py
files, ~31 MB; `--repeat` copies it under new ids for a larger input), trains a tokenizer
with `operations.tokenizer`, then `run_tokenize_vs_raw` measures, in one process, on the
same texts (every non-empty document):

- raw fast: `tokenizers.Tokenizer.encode_batch_fast` (no character offsets) over the texts
  held in memory, in batches of 128 and of 1,024 documents; the faster of the two in each
  round is the reference (reading the documents is not timed on this side);
- raw: `encode_batch` (with offsets, what transformers asks for), for reference only;
- ours: `operations.tokenize.tokenize(config)` end to end with its default builder (on a
  machine not connected to Ray: Levanter's shard-group loop in this process): reading the
  input shards, the split, tokenizing, writing both caches and stats.json;
- importing Levanter (JAX, Haliax, transformers) once per process: reported apart, and in a
  second ratio;
- ours with builder="ray" (unless `ray=False`): Levanter's Ray cache builder with its own
  processor, Ray's start-up timed separately.

Both sides encode with the same `tokenizers` Rust thread pool (RAYON_NUM_THREADS, default
one thread per core). For each side the bench records wall seconds, CPU seconds of the
process (all threads) and the threads that ran: the process's threads whose CPU time grew
by more than 2% of the wall time (from /proc/self/task).

Rounds alternate which side goes first, so a change in the load of a shared machine hits
both sides of a round alike; ratios are medians of the per-round ratios. The last lines are
machine-readable: `tokenize_vs_fast=R` (raw encode_batch_fast seconds / our seconds,
imports apart: the headline), `tokenize_vs_fast_with_import=R`, `tokenize_vs_fast_cpu=R`
(the same with CPU seconds) and, with Ray, `tokenize_vs_fast_ray=R` (Ray start-up included).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pathlib
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from revision import commit  # noqa: E402

from operations.shards import iter_documents, shard_name, write_documents  # noqa: E402

RAW_BATCHES = (128, 1024)


def _thread_cpu() -> dict[int, float]:
    """CPU seconds of each thread of this process (Linux /proc; empty elsewhere)."""
    ticks = os.sysconf("SC_CLK_TCK")
    times = {}
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        try:
            with open(f"/proc/self/task/{tid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        times[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return times


def measure(fn, *args) -> tuple[Any, dict[str, float]]:
    """Run fn(*args); return its value and wall seconds, process CPU seconds and busy threads."""
    before = _thread_cpu()
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn(*args)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = _thread_cpu()
    busy = sum(1 for tid, seconds in after.items() if seconds - before.get(tid, 0.0) > 0.02 * wall)
    return value, {"s": wall, "cpu_s": cpu, "threads": busy}


def build_stdlib_documents(output_dir: str, *, repeat: int = 1, shards: int = 8) -> dict[str, int]:
    """Document shards of every .py file of the stdlib (site-packages excluded), `repeat` times."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(path for path in root.rglob("*.py") if "site-packages" not in path.parts)
    texts = [
        (str(path.relative_to(root)), path.read_text(encoding="utf-8", errors="replace")) for path in files
    ]
    documents = [
        {"id": f"{name}#{copy}" if copy else name, "text": text, "source": "python-stdlib", "metadata": {}}
        for copy in range(repeat)
        for name, text in texts
    ]
    for index in range(shards):
        write_documents(os.path.join(output_dir, shard_name(index)), documents[index::shards])
    return {"documents": len(documents), "bytes": sum(len(d["text"].encode()) for d in documents)}


def run_tokenize_vs_raw(
    documents_dir: str, tokenizer_dir: str, work_dir: str, *, ray: bool = False, runs: int = 3
) -> dict:
    """Seconds, CPU seconds and threads of raw encode_batch(_fast) and of our tokenize; their ratios.

    See the module docstring. Levanter is imported once, before the first round, and timed.
    """
    from tokenizers import Tokenizer

    os.makedirs(work_dir, exist_ok=True)
    texts = [doc["text"] for doc in iter_documents(documents_dir) if doc["text"].strip()]
    result: dict[str, Any] = {
        "cores": os.cpu_count(),
        "rayon_threads": os.environ.get("RAYON_NUM_THREADS", f"unset (= {os.cpu_count()} cores)"),
        "documents": len(texts),
        "megabytes": round(sum(len(text.encode()) for text in texts) / 1e6, 1),
        "runs": runs,
    }
    raw = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))

    def encode_all(encode, batch: int) -> int:
        tokens = 0
        for start in range(0, len(texts), batch):
            tokens += sum(len(encoding.ids) for encoding in encode(texts[start : start + batch]))
        return tokens

    # Importing Levanter (JAX, Haliax, transformers) is a cost of the first tokenize in a process.
    _, imported = measure(importlib.import_module, "levanter.data.text")
    result["import"] = imported

    rounds = []
    for index in range(runs):
        round_: dict[str, Any] = {}

        def run_raw(round_: dict[str, Any] = round_) -> None:
            for batch in RAW_BATCHES:
                round_["raw_tokens"], round_[f"fast_{batch}"] = measure(
                    encode_all, raw.encode_batch_fast, batch
                )
            _, round_["offsets"] = measure(encode_all, raw.encode_batch, RAW_BATCHES[-1])

        def run_ours(round_: dict[str, Any] = round_) -> None:
            tokens, round_["ours"] = measure(_run_ours, documents_dir, tokenizer_dir, work_dir, "auto")
            round_["ours_tokens"] = tokens

        for step in (run_raw, run_ours) if index % 2 == 0 else (run_ours, run_raw):
            step()
        round_["fast"] = min((round_[f"fast_{batch}"] for batch in RAW_BATCHES), key=lambda m: m["s"])
        round_["ratio"] = round_["fast"]["s"] / round_["ours"]["s"]
        round_["ratio_with_import"] = round_["fast"]["s"] / (round_["ours"]["s"] + imported["s"])
        round_["ratio_cpu"] = round_["fast"]["cpu_s"] / round_["ours"]["cpu_s"]
        round_["ratio_offsets"] = round_["offsets"]["s"] / round_["ours"]["s"]
        rounds.append(round_)

    def median_of(side: str, field: str) -> float:
        return statistics.median(round_[side][field] for round_ in rounds)

    for side in ("fast", "fast_128", "fast_1024", "offsets", "ours"):
        result[side] = {field: round(median_of(side, field), 2) for field in ("s", "cpu_s", "threads")}
    result["tokens"] = {"raw": rounds[0]["raw_tokens"], "ours": rounds[0]["ours_tokens"]}
    for name in ("ratio", "ratio_with_import", "ratio_cpu", "ratio_offsets"):
        result[name] = round(statistics.median(round_[name] for round_ in rounds), 3)
    result["rounds"] = [
        {
            "fast_s": round(r["fast"]["s"], 2),
            "fast_batch": next(b for b in RAW_BATCHES if r[f"fast_{b}"] is r["fast"]),
            "ours_s": round(r["ours"]["s"], 2),
            "fast_cpu_s": round(r["fast"]["cpu_s"], 2),
            "ours_cpu_s": round(r["ours"]["cpu_s"], 2),
            "ratio": round(r["ratio"], 3),
        }
        for r in rounds
    ]
    if ray:
        from operations.tokenize import ensure_ray

        _, started = measure(ensure_ray)
        _, with_ray = measure(_run_ours, documents_dir, tokenizer_dir, os.path.join(work_dir, "ray"), "ray")
        result["ray_start"], result["ray"] = started, with_ray
        result["ratio_ray"] = round(result["fast"]["s"] / (started["s"] + with_ray["s"]), 3)
    return result


def _run_ours(documents_dir: str, tokenizer_dir: str, work_dir: str, builder: str) -> int:
    """`tokenize(config)` into a fresh directory; returns the tokens it wrote (bos/eos included)."""
    from operations.tokenize import TokenizeConfig, tokenize

    output = os.path.join(work_dir, builder)
    shutil.rmtree(output, ignore_errors=True)
    tokenize(
        TokenizeConfig(input_path=documents_dir, tokenizer=tokenizer_dir, output_path=output, builder=builder)
    )
    with open(os.path.join(output, "stats.json")) as handle:
        return json.load(handle)["tokens"]


def format_table(result: dict[str, Any], commit: str) -> str:
    """A markdown table of the medians, with the commit and the rounds."""
    lines = [
        f"commit {commit}; {result['documents']} documents, {result['megabytes']} MB, "
        f"{result['cores']} cores, RAYON_NUM_THREADS {result['rayon_threads']}; medians of {result['runs']} rounds",
        "",
        "| side | seconds | CPU seconds | threads that ran | raw fast s / this s |",
        "|---|---|---|---|---|",
    ]
    rows = [
        ("raw encode_batch_fast, best batch (reference)", result["fast"]),
        ("raw encode_batch_fast, batches of 128", result["fast_128"]),
        ("raw encode_batch_fast, batches of 1,024", result["fast_1024"]),
        ("raw encode_batch (offsets), batches of 1,024", result["offsets"]),
        ("ours: tokenize(config), imports apart", result["ours"]),
        ("importing Levanter (once per process)", result["import"]),
    ]
    for name, m in rows:
        ratio = f"{result['fast']['s'] / m['s']:.3f}" if m is not result["import"] else "--"
        lines.append(f"| {name} | {m['s']:.2f} | {m['cpu_s']:.2f} | {m['threads']:g} | {ratio} |")
    lines += [
        "",
        f"tokens: raw {result['tokens']['raw']:,}, ours {result['tokens']['ours']:,} (bos/eos per document)",
        "rounds (raw fast s, ours s, ratio): "
        + ", ".join(f"({r['fast_s']}, {r['ours_s']}, {r['ratio']})" for r in result["rounds"]),
    ]
    if "ray" in result:
        lines.append(
            f"ours with builder='ray': {result['ray']['s']:.2f} s + Ray start {result['ray_start']['s']:.2f} s"
        )
    return "\n".join(lines)


def print_ratios(result: dict[str, Any]) -> None:
    print(f"tokenize_vs_fast_with_import={result['ratio_with_import']:.3f}")
    print(f"tokenize_vs_fast_cpu={result['ratio_cpu']:.3f}")
    if "ratio_ray" in result:
        print(f"tokenize_vs_fast_ray={result['ratio_ray']:.3f}")
    print(f"tokenize_vs_fast={result['ratio']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2, help="copies of the stdlib corpus (1 = ~31 MB)")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds of raw and ours (medians)")
    parser.add_argument("--no-ray", action="store_true", help="skip the run with Levanter's Ray builder")
    parser.add_argument("--work-dir", help="keep inputs and outputs here (default: a temporary directory)")
    args = parser.parse_args()

    from operations.tokenizer import TrainTokenizerConfig, train_tokenizer

    revision = commit()  # before measuring: others may commit while it runs
    work = args.work_dir or tempfile.mkdtemp(prefix="tokenize-bench-")
    try:
        documents = os.path.join(work, "documents")
        shutil.rmtree(documents, ignore_errors=True)
        corpus = build_stdlib_documents(documents, repeat=args.repeat, shards=args.shards)
        tokenizer = os.path.join(work, "tokenizer")
        started = time.perf_counter()
        train_tokenizer(
            TrainTokenizerConfig(input_path=documents, output_path=tokenizer, vocab_size=args.vocab_size)
        )
        train_s = time.perf_counter() - started
        result = run_tokenize_vs_raw(
            documents, tokenizer, os.path.join(work, "bench"), ray=not args.no_ray, runs=args.runs
        )
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)

    print(
        f"\ncorpus: {corpus['documents']} documents, {corpus['bytes'] / 1e6:.1f} MB; tokenizer training {train_s:.1f} s"
    )
    print(json.dumps(result, indent=2))
    print(format_table(result, revision))
    print_ratios(result)


if __name__ == "__main__":
    main()
