"""Throughput and peak memory of every data operation on the embedded stdlib corpus.

    .venv/bin/python bench/data_ops.py [--workers N] [--out DIR] [--rounds N]

Runs download -> documents -> filter -> dedup -> tokenizer -> tokenize on the running
Python's standard library (~1,790 .py files), each operation in a fresh process so its
peak memory and CPU time (its own, all its threads, and its worker processes') are its own.
Prints a table of documents/s, MB/s, CPU seconds, the cores that actually ran (CPU seconds
/ wall seconds: worker processes and the Rust thread pools of `tokenizers` included), MB/s
per core used (MB / CPU seconds) and peak RSS, then the two comparisons, measured in the
same run on the same data (`bench/tokenize_bench.py`, `bench/dedup_bench.py`):

    tokenize_vs_fast=R     raw `tokenizers` encode_batch_fast seconds over our tokenize
                           step's seconds on the same texts, Levanter import apart
                           (target >= 0.8; higher is better)
    dedup_vs_datatrove=R   datatrove's MinHash pipeline seconds (its best worker count)
                           over ours, same parameters, same input (target >= 1.5)

Not a test: run it by hand; record the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [REPO, HERE]


def _run_operation(name: str, work: str, workers: int) -> dict:
    """Child process: run one operation on the previous stage's output; print its figures."""
    from marin.corpora import STDLIB_EXCLUDE, STDLIB_INCLUDE, python_stdlib_dir
    from operations.dedup import DedupConfig, deduplicate
    from operations.documents import DocumentsConfig, make_documents
    from operations.download import DownloadConfig, download
    from operations.filter import FilterConfig, default_code_rules, filter_documents
    from operations.tokenize import TokenizeConfig, tokenize
    from operations.tokenizer import TrainTokenizerConfig, train_tokenizer

    path = {stage: os.path.join(work, stage) for stage in STAGES}
    cpu_before = sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )
    start = time.perf_counter()
    if name == "download":
        download(
            DownloadConfig(
                source=python_stdlib_dir(),
                output_path=path["download"],
                include=STDLIB_INCLUDE,
                exclude=STDLIB_EXCLUDE,
                workers=workers,
            )
        )
    elif name == "documents":
        make_documents(
            DocumentsConfig(
                input_path=path["download"],
                output_path=path["documents"],
                target_shard_bytes=2_000_000,
                workers=workers,
            )
        )
    elif name == "filter":
        filter_documents(
            FilterConfig(
                input_path=path["documents"],
                output_path=path["filter"],
                rules=default_code_rules(),
                workers=workers,
            )
        )
    elif name == "dedup":
        deduplicate(DedupConfig(input_path=path["filter"], output_path=path["dedup"], workers=workers))
    elif name == "tokenizer":
        train_tokenizer(
            TrainTokenizerConfig(input_path=path["dedup"], output_path=path["tokenizer"], vocab_size=8192)
        )
    elif name == "tokenize":
        tokenize(
            TokenizeConfig(
                input_path=path["dedup"], tokenizer=path["tokenizer"], output_path=path["tokenize"]
            )
        )
    seconds = time.perf_counter() - start
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU of every thread of this process and of its (reaped) worker processes, since start.
    cpu = sum(usage.ru_utime + usage.ru_stime for usage in (own, children)) - cpu_before
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "peak_rss_mb": max(own.ru_maxrss, children.ru_maxrss) / 1024,
    }


STAGES = ["download", "documents", "filter", "dedup", "tokenizer", "tokenize"]
PARALLELISM = {
    "download": "{workers} threads",
    "documents": "{workers} processes",
    "filter": "{workers} processes",
    "dedup": "{workers} processes (passes 1, 3)",
    "tokenizer": "tokenizers' Rust pool ({cores} threads)",
    "tokenize": "tokenizers' Rust pool ({cores} threads)",
}
"""What each stage is configured to run on; the table's `cores used` is what it did use."""


INPUT_OF = {
    "download": None,
    "documents": None,
    "filter": "documents",
    "dedup": "filter",
    "tokenizer": "dedup",
}
"""Where each stage's input documents are; None: the raw files (counted by download's stats)."""


def _input_figures(work: str, stage: str) -> tuple[int, float]:
    """Documents (or files) and MB that a stage read."""
    from operations.shards import iter_documents

    source = INPUT_OF.get(stage, "dedup")
    if source is None:
        with open(os.path.join(work, "download", "stats.json")) as handle:
            stats = json.load(handle)
        return stats["files"], stats["bytes"] / 1e6
    count, size = 0, 0
    for document in iter_documents(os.path.join(work, source)):
        count += 1
        size += len(document["text"].encode("utf-8"))
    return count, size / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", help="also write results.json here")
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds of each comparison (medians)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_run_operation(args.child, args.work, args.workers)))
        return

    from dedup_bench import format_table as dedup_table
    from dedup_bench import run_dedup_vs_datatrove
    from tokenize_bench import commit, print_ratios, run_tokenize_vs_raw
    from tokenize_bench import format_table as tokenize_table

    revision = commit()  # before measuring: others may commit while it runs
    work = tempfile.mkdtemp(prefix="data-ops-bench-")
    rows = []
    try:
        for stage in STAGES:
            print(f"[{time.strftime('%H:%M:%S')}] {stage} ...", file=sys.stderr, flush=True)
            result = subprocess.run(
                [sys.executable, __file__, "--child", stage, "--work", work, "--workers", str(args.workers)],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise SystemExit(f"{stage} failed:\n{result.stdout}\n{result.stderr}")
            figures = json.loads(result.stdout.strip().splitlines()[-1])
            documents, megabytes = _input_figures(work, stage)
            seconds, cpu = figures["seconds"], figures["cpu_seconds"]
            rows.append(
                {
                    "operation": stage,
                    "documents": documents,
                    "MB": round(megabytes, 1),
                    "seconds": round(seconds, 2),
                    "docs/s": round(documents / seconds),
                    "MB/s": round(megabytes / seconds, 1),
                    "CPU s": round(cpu, 2),
                    "cores used": round(cpu / seconds, 2),
                    "MB/s per core used": round(megabytes / cpu, 1),
                    "configured": PARALLELISM[stage].format(workers=args.workers, cores=os.cpu_count()),
                    "peak RSS MB": round(figures["peak_rss_mb"]),
                }
            )
        print(f"[{time.strftime('%H:%M:%S')}] comparisons ...", file=sys.stderr, flush=True)
        dedup = run_dedup_vs_datatrove(
            os.path.join(work, "filter"), os.path.join(work, "dedup-vs-datatrove"), rounds=args.rounds
        )
        tokenize = run_tokenize_vs_raw(
            os.path.join(work, "dedup"),
            os.path.join(work, "tokenizer"),
            os.path.join(work, "tokenize-vs-raw"),
            runs=args.rounds,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"data operations on the Python {sys.version.split()[0]} stdlib, {os.cpu_count()} cores, commit {revision}\n"
    )
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")
    print("\ndedup vs datatrove, on the filter output:")
    print(dedup_table(dedup, revision))
    print("\ntokenize vs raw tokenizers, on the dedup output:")
    print(tokenize_table(tokenize, revision))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as handle:
            json.dump(
                {"commit": revision, "rows": rows, "dedup": dedup, "tokenize": tokenize}, handle, indent=2
            )
    print_ratios(tokenize)
    print(f"dedup_vs_datatrove={dedup['ratio']:.3f}")


if __name__ == "__main__":
    main()
