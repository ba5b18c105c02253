"""Tokenize throughput: our tokenize operation (Levanter's cache builder) vs raw `tokenizers`.

    .venv/bin/python bench/tokenize_bench.py                  # stdlib corpus x2 (~63 MB)
    .venv/bin/python bench/tokenize_bench.py --repeat 1 --no-ray

Standalone it builds documents from the running Python's standard library (~1,800 .py
files, ~31 MB; `--repeat` copies it under new ids for a larger input), trains a tokenizer
with `operations.tokenizer`, then `run_tokenize_vs_raw` measures, on the same texts:

- raw: `tokenizers.Tokenizer.encode_batch` over the document texts (in memory, batches of
  1,024 documents; reading the documents is not timed) -- the reference of the ratio;
- raw fast: the same with `encode_batch_fast` (no character offsets), the call our
  default builder makes: a stricter reference, reported beside it;
- ours: `operations.tokenize` end to end with its default builder (on a machine not
  connected to Ray: Levanter's shard-group loop in this process), timed phase by phase --
  importing Levanter, splitting the documents, building both caches, writing stats.json
  (`tokenize(config)` is exactly the last three);
- ours with builder="ray" (unless `ray=False`): Levanter's Ray cache builder, with Ray's
  start-up timed separately (zero when this process already has Ray).

Tokens/s on each side use that side's own token count (ours includes the bos/eos
Levanter adds to each document: ~0.1% more). The last lines are machine-readable:
`tokenize_vs_raw=R` (default builder, end to end), `tokenize_vs_raw_fast=R` (the same over
raw `encode_batch_fast`), `tokenize_vs_raw_ray=R` (Ray builder, Ray start-up included) and
`tokenize_vs_raw_ray_up=R` (Ray builder, Ray already running).
"""

from __future__ import annotations

import argparse
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

from operations.shards import iter_documents, shard_name, write_documents  # noqa: E402

RAW_BATCH = 1024


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
    """Tokens/s of our tokenize operation and of raw encode_batch on the same texts, and their ratio.

    `runs` rounds, each timing raw encode_batch, raw encode_batch_fast and ours back to back
    (which side goes first alternates), so a change in the load of a shared machine hits both
    sides of a round alike; the ratio is the median of the rounds' ratios, the other figures
    are medians too (`ratios` lists every round's). Levanter is imported once, in the first
    round; its import time is charged to ours in every round.
    """
    from tokenizers import Tokenizer

    os.makedirs(work_dir, exist_ok=True)
    texts = [doc["text"] for doc in iter_documents(documents_dir) if doc["text"].strip()]
    result: dict[str, Any] = {
        "cores": os.cpu_count(),
        "documents": len(texts),
        "megabytes": round(sum(len(text.encode()) for text in texts) / 1e6, 1),
        "runs": runs,
    }
    raw = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))

    def encode_all(encode) -> tuple[int, float]:
        started = time.perf_counter()
        tokens = 0
        for start in range(0, len(texts), RAW_BATCH):
            tokens += sum(len(encoding.ids) for encoding in encode(texts[start : start + RAW_BATCH]))
        return tokens, time.perf_counter() - started

    import_s = None

    def run_ours() -> dict[str, Any]:
        nonlocal import_s
        if import_s is None:
            # Importing Levanter (JAX, Haliax, transformers) is a cost of the first tokenize in a process.
            started = time.perf_counter()
            import levanter.data.text  # noqa: F401

            import_s = time.perf_counter() - started
        return _run_ours(documents_dir, tokenizer_dir, os.path.join(work_dir, "default"), "auto")

    rounds = []
    for index in range(runs):
        if index % 2:
            ours = run_ours()
        raw_tokens, raw_s = encode_all(raw.encode_batch)
        raw_fast_tokens, raw_fast_s = encode_all(raw.encode_batch_fast)
        if not index % 2:
            ours = run_ours()
        total_s = import_s + ours["op_s"]
        rounds.append(
            dict(
                ours,
                raw_tokens=raw_tokens,
                raw_s=raw_s,
                raw_fast_s=raw_fast_s,
                raw_tokens_per_s=raw_tokens / raw_s,
                raw_fast_tokens_per_s=raw_fast_tokens / raw_fast_s,
                total_s=total_s,
                ours_tokens_per_s=ours["tokens"] / total_s,
                ratio=ours["tokens"] / total_s / (raw_tokens / raw_s),
                ratio_fast=ours["tokens"] / total_s / (raw_fast_tokens / raw_fast_s),
            )
        )

    result["import_s"] = round(import_s, 2)
    for name, value in rounds[0].items():
        if isinstance(value, float):
            median = statistics.median(round_[name] for round_ in rounds)
            result[name] = median if name.endswith("per_s") or name.startswith("ratio") else round(median, 2)
        else:
            result[name] = value
    result["ratios"] = [round(round_["ratio"], 3) for round_ in rounds]
    result["rounds"] = [
        {
            name: round(value, 3)
            for name, value in round_.items()
            if name.endswith("_s") or name.startswith("ratio")
        }
        for round_ in rounds
    ]
    raw_tokens_per_s = result["raw_tokens_per_s"]
    if ray:
        with_ray = _run_ours(documents_dir, tokenizer_dir, os.path.join(work_dir, "ray"), "ray")
        result.update({f"ray_{name}": value for name, value in with_ray.items()})
        ray_total_s = import_s + with_ray["ray_start_s"] + with_ray["op_s"]
        result["ray_total_s"] = round(ray_total_s, 2)
        result["ratio_ray"] = with_ray["tokens"] / ray_total_s / raw_tokens_per_s
        result["ratio_ray_up"] = with_ray["tokens"] / with_ray["op_s"] / raw_tokens_per_s
    return result


def _run_ours(documents_dir: str, tokenizer_dir: str, output: str, builder: str) -> dict[str, Any]:
    """Our operation, phase by phase; `tokenize(config)` is split + caches + stats."""
    from operations.tokenize import (
        TokenizeConfig,
        build_caches,
        ensure_ray,
        ray_connected,
        split_documents,
        write_tokenize_stats,
    )

    phases: dict[str, float] = {}

    def timed(name: str, fn, *args):
        begin = time.perf_counter()
        value = fn(*args)
        phases[name] = time.perf_counter() - begin
        return value

    shutil.rmtree(output, ignore_errors=True)
    config = TokenizeConfig(
        input_path=documents_dir, tokenizer=tokenizer_dir, output_path=output, builder=builder
    )
    if builder == "ray":
        timed("ray_start_s", ensure_ray)
    per_shard = timed("split_s", split_documents, config)
    effective = "ray" if builder == "ray" or ray_connected() else "in_process"
    timed("caches_s", build_caches, config)
    timed("stats_s", write_tokenize_stats, config, per_shard)
    with open(os.path.join(output, "stats.json")) as handle:
        tokens = json.load(handle)["tokens"]
    result: dict[str, Any] = {name: round(seconds, 2) for name, seconds in phases.items()}
    op_s = phases["split_s"] + phases["caches_s"] + phases["stats_s"]
    result.update(builder=effective, tokens=tokens, op_s=round(op_s, 2))
    return result


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
        f"\ncorpus: {corpus['documents']} documents, {corpus['bytes'] / 1e6:.1f} MB; {result['cores']} cores"
    )
    print(f"tokenizer training: {train_s:.1f} s")
    print(json.dumps(result, indent=2))
    print(f"raw encode_batch: {result['raw_tokens_per_s']:,.0f} tokens/s ({result['raw_s']} s)")
    print(
        f"raw encode_batch_fast: {result['raw_fast_tokens_per_s']:,.0f} tokens/s ({result['raw_fast_s']} s)"
    )
    print(
        f"ours ({result['builder']}): {result['ours_tokens_per_s']:,.0f} tokens/s ({result['total_s']} s = import "
        f"{result['import_s']} + split {result['split_s']} + caches {result['caches_s']} + stats {result['stats_s']})"
    )
    if "ratio_ray" in result:
        print(
            f"ours (ray): {result['ray_total_s']} s = import {result['import_s']} + Ray start "
            f"{result['ray_ray_start_s']} + split {result['ray_split_s']} + caches {result['ray_caches_s']} "
            f"+ stats {result['ray_stats_s']}"
        )
    print(f"rounds: tokenize_vs_raw {result['ratios']} (medians above)")
    print(f"tokenize_vs_raw={result['ratio']:.3f}")
    print(f"tokenize_vs_raw_fast={result['ratio_fast']:.3f}")
    if "ratio_ray" in result:
        print(f"tokenize_vs_raw_ray={result['ratio_ray']:.3f}")
        print(f"tokenize_vs_raw_ray_up={result['ratio_ray_up']:.3f}")


if __name__ == "__main__":
    main()
