"""Throughput and peak memory of every data operation on the embedded stdlib corpus.

    .venv/bin/python bench/data_ops.py [--workers N] [--out DIR] [--tokenize-runs N]

Runs download -> documents -> filter -> dedup -> tokenizer -> tokenize on the running
Python's standard library (~1,790 .py files), each operation in a fresh process so its
peak memory (its own and its worker processes') is its own. Prints a table of
documents/s and MB/s (also per core used) and peak RSS, then two ratios measured in the
same run:

    tokenize_vs_raw=R      our tokenize step (Levanter's cache builder) tokens/s over raw
                           `tokenizers` encode_batch on the same texts   (target >= 0.9)
                           (and tokenize_vs_raw_fast=R: over encode_batch_fast, stricter)
    dedup_vs_datatrove=R   our MinHash dedup documents/s over datatrove's MinHash
                           pipeline on the same input                     (target >= 1.0)

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
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"seconds": seconds, "peak_rss_mb": max(own, children) / 1024}


STAGES = ["download", "documents", "filter", "dedup", "tokenizer", "tokenize"]
PARALLEL = {"download", "documents", "filter", "dedup"}  # use `workers` processes/threads


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
        "--tokenize-runs", type=int, default=3, help="interleaved rounds of tokenize_vs_raw (median)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_run_operation(args.child, args.work, args.workers)))
        return

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
            cores = args.workers if stage in PARALLEL else 1
            rows.append(
                {
                    "operation": stage,
                    "documents": documents,
                    "MB": round(megabytes, 1),
                    "seconds": round(figures["seconds"], 2),
                    "docs_per_s": round(documents / figures["seconds"]),
                    "MB_per_s": round(megabytes / figures["seconds"], 1),
                    "MB_per_s_per_core": round(megabytes / figures["seconds"] / cores, 1),
                    "cores": cores,
                    "peak_rss_mb": round(figures["peak_rss_mb"]),
                }
            )
        print(f"[{time.strftime('%H:%M:%S')}] ratios ...", file=sys.stderr, flush=True)
        from dedup_bench import run_dedup_vs_datatrove
        from tokenize_bench import run_tokenize_vs_raw

        dedup = run_dedup_vs_datatrove(os.path.join(work, "filter"), os.path.join(work, "dedup-vs-datatrove"))
        tokenize = run_tokenize_vs_raw(
            os.path.join(work, "dedup"),
            os.path.join(work, "tokenizer"),
            os.path.join(work, "tokenize-vs-raw"),
            runs=args.tokenize_runs,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"data operations on the Python {sys.version.split()[0]} stdlib, {os.cpu_count()} cores\n")
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")
    print()
    print(
        f"dedup: ours {dedup['ours_docs_per_s']:.0f} docs/s, datatrove {dedup['datatrove_docs_per_s']:.0f} docs/s"
    )
    print(
        f"tokenize: ours {tokenize['ours_tokens_per_s']:.0f} tokens/s ({tokenize['total_s']} s = import "
        f"{tokenize['import_s']} + split {tokenize['split_s']} + caches {tokenize['caches_s']} + stats "
        f"{tokenize['stats_s']}), raw encode_batch {tokenize['raw_tokens_per_s']:.0f} tokens/s "
        f"({tokenize['raw_s']} s), raw encode_batch_fast {tokenize['raw_fast_tokens_per_s']:.0f} tokens/s "
        f"({tokenize['raw_fast_s']} s)"
    )
    print(f"tokenize rounds: tokenize_vs_raw {tokenize['ratios']} (medians above)")
    print(f"tokenize_vs_raw={tokenize['ratio']:.3f}")
    print(f"tokenize_vs_raw_fast={tokenize['ratio_fast']:.3f}")
    print(f"dedup_vs_datatrove={dedup['ratio']:.3f}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as handle:
            json.dump({"rows": rows, "dedup": dedup, "tokenize": tokenize}, handle, indent=2)


if __name__ == "__main__":
    main()
