"""MinHash dedup throughput: ours (`operations.dedup`) against datatrove 0.9.0's MinHash pipeline.

    .venv/bin/python bench/dedup_bench.py                    # builds the stdlib corpus, prints the ratio
    .venv/bin/python bench/dedup_bench.py --input DIR --work DIR --repeats 3

Both sides read the same jsonl.gz shards, use the same parameters (word 5-grams, 14 bands
of 8 rows, seed 1, lowercase + punctuation to spaces + collapsed whitespace, split on
spaces) and write the kept documents as jsonl.gz shards, one per input shard:

- ours: `deduplicate(DedupConfig(mode="minhash", ...))`, all three passes, with its
  default verification of candidates (estimated Jaccard >= 0.8);
- datatrove: `MinhashDedupSignature` -> `MinhashDedupBuckets` -> `MinhashDedupCluster` ->
  `MinhashDedupFilter` + `JsonlWriter`, each stage a `LocalPipelineExecutor` over a
  `JsonlReader` (one task per shard; 14 tasks for the buckets stage, as it requires), with
  as many workers as ours. datatrove's English word tokenizer needs nltk, which is not
  installed, so it gets a whitespace tokenizer (`str.split`) -- cheaper than nltk, so the
  comparison favours datatrove -- and its number and diacritics normalisation is turned off
  to match ours. Its `xxhash64` passes a str, which xxhash 4.x refuses ("Strings must be
  encoded before hashing"), so the signature step gets the same hash of the UTF-8 bytes.
  datatrove keeps every LSH candidate (no verification).

Throughput is documents in / wall seconds of the whole pipeline (process pools included),
best of `repeats`. `run_dedup_vs_datatrove` returns both docs/s, the ratio (ours /
datatrove) and the removal counts: ours, ours with `threshold=0` (LSH alone, an extra
untimed run; `similar_removals` says whether it is within 10% of datatrove's) and
datatrove's (its reader also skips documents with empty text, uncounted); run alone, the script builds `build_stdlib_corpus` (every `.py` file of
the standard library as a document -- about 1,800 -- plus planted near-duplicates with a
few words changed and exact copies with changed case and whitespace, shuffled over 8
shards) and prints `dedup_vs_datatrove=R` last.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import random
import shutil
import sys
import sysconfig
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import xxhash  # noqa: E402
from datatrove.utils.word_tokenizers import WordTokenizer  # noqa: E402

from operations.dedup import DedupConfig, deduplicate  # noqa: E402
from operations.shards import list_shards, shard_name, write_documents  # noqa: E402

NGRAM_SIZE = 5
NUM_BANDS = 14
ROWS_PER_BAND = 8
SEED = 1


def build_stdlib_corpus(
    output_dir: str, *, shards: int = 8, near_copies: int = 150, exact_copies: int = 100, seed: int = 0
) -> dict[str, int]:
    """Standard-library `.py` files as documents plus planted duplicates, shuffled into shards."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(f for f in glob.glob(f"{root}/**/*.py", recursive=True) if "site-packages" not in f)
    documents = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        relative = os.path.relpath(path, root)
        documents.append({"id": relative, "text": text, "source": "stdlib", "metadata": {}})
    rng = random.Random(seed)
    long_ones = [doc for doc in documents if len(doc["text"].split()) >= 300]
    planted = []
    for number, doc in enumerate(rng.sample(long_ones, near_copies)):
        words = doc["text"].split(" ")
        for position in rng.sample(range(len(words)), 4):  # a few words changed
            words[position] = f"changed{number}"
        planted.append({**doc, "id": f"{doc['id']}#near", "text": " ".join(words)})
    for doc in rng.sample(documents, exact_copies):
        text = "  ".join(doc["text"].upper().split(" "))  # other case and whitespace
        planted.append({**doc, "id": f"{doc['id']}#exact", "text": text})
    everything = documents + planted
    rng.shuffle(everything)
    os.makedirs(output_dir, exist_ok=True)
    for index in range(shards):
        write_documents(os.path.join(output_dir, shard_name(index)), everything[index::shards])
    return {"documents": len(everything), "originals": len(documents), "planted": len(planted)}


def _ours(
    input_dir: str, output_dir: str, workers: int, threshold: float = 0.8
) -> tuple[float, dict[str, Any]]:
    config = DedupConfig(
        input_path=input_dir,
        output_path=output_dir,
        mode="minhash",
        strip_punctuation=True,
        ngram_size=NGRAM_SIZE,
        num_bands=NUM_BANDS,
        rows_per_band=ROWS_PER_BAND,
        seed=SEED,
        threshold=threshold,
        workers=workers,
    )
    start = time.perf_counter()
    deduplicate(config)
    seconds = time.perf_counter() - start
    with open(os.path.join(output_dir, "stats.json")) as handle:
        return seconds, json.load(handle)


def _datatrove(input_dir: str, work_dir: str, workers: int, shards: int) -> tuple[float, int, int]:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig
    from datatrove.utils.text import TextNormConfig

    config = MinhashConfig(
        n_grams=NGRAM_SIZE,
        num_buckets=NUM_BANDS,
        hashes_per_bucket=ROWS_PER_BAND,
        seed=SEED,
        norm_config=TextNormConfig(norm_unicode_diacritics=False, norm_numbers=False),
        hash_config=HashConfig(precision=64, hash_fc="xxhash"),
    )

    def reader() -> JsonlReader:
        return JsonlReader(input_dir, glob_pattern="*.jsonl.gz", text_key="text", id_key="id")

    def stage(pipeline: list, tasks: int, name: str) -> LocalPipelineExecutor:
        return LocalPipelineExecutor(
            pipeline=pipeline,
            tasks=tasks,
            workers=min(workers, tasks),
            logging_dir=os.path.join(work_dir, "logs", name),
        )

    signatures = os.path.join(work_dir, "signatures")
    buckets = os.path.join(work_dir, "buckets")
    remove = os.path.join(work_dir, "remove_ids")
    output = os.path.join(work_dir, "deduplicated")
    start = time.perf_counter()
    signature_step = MinhashDedupSignature(signatures, config, language=WhitespaceTokenizer())
    signature_step._hash_func = xxhash64_of_str
    stage([reader(), signature_step], shards, "sig").run()
    stage([MinhashDedupBuckets(signatures, buckets, config=config)], NUM_BANDS, "buckets").run()
    stage([MinhashDedupCluster(buckets, remove, config=config)], 1, "cluster").run()
    stage([reader(), MinhashDedupFilter(remove), JsonlWriter(output)], shards, "filter").run()
    seconds = time.perf_counter() - start
    with open(os.path.join(work_dir, "logs", "filter", "stats.json")) as handle:
        filter_stats = next(
            block["stats"] for block in json.load(handle) if "MinHash stage 4" in block["name"]
        )
    kept = sum(_count_lines(path) for path in glob.glob(os.path.join(output, "*.jsonl.gz")))
    # datatrove's reader skips documents with empty text (neither kept nor counted as dropped).
    return seconds, filter_stats["dropped"], filter_stats["total"] - kept


def _count_lines(path: str) -> int:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return sum(1 for line in handle if line.strip())


def xxhash64_of_str(text: str) -> int:
    """datatrove 0.9.0's `xxhash64` passes a str, which xxhash 4.x refuses; same hash, encoded first."""
    return xxhash.xxh64_intdigest(text.encode("utf-8"))


class WhitespaceTokenizer(WordTokenizer):
    """Words = `str.split()` (datatrove's English tokenizer needs nltk, not installed here)."""

    def __init__(self) -> None:
        super().__init__("whitespace")

    def word_tokenize(self, text: str) -> list[str]:
        return text.split()

    def sent_tokenize(self, text: str) -> list[str]:
        return [text]

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        return [(0, len(text))]


def run_dedup_vs_datatrove(
    input_dir: str, work_dir: str, *, workers: int | None = None, repeats: int = 1
) -> dict[str, Any]:
    """Time our MinHash dedup and datatrove's on `input_dir` (jsonl.gz shards); best of `repeats`."""
    workers = workers or os.cpu_count() or 1
    shards = len(list_shards(input_dir))
    ours_seconds, dt_seconds = [], []
    for attempt in range(repeats):
        ours_dir = os.path.join(work_dir, f"ours-{attempt}")
        dt_dir = os.path.join(work_dir, f"datatrove-{attempt}")
        for path in (ours_dir, dt_dir):
            shutil.rmtree(path, ignore_errors=True)
        seconds, stats = _ours(input_dir, ours_dir, workers)
        ours_seconds.append(seconds)
        seconds, dt_removed, dt_dropped_check = _datatrove(input_dir, dt_dir, workers, shards)
        assert dt_removed == dt_dropped_check, (dt_removed, dt_dropped_check)
        dt_seconds.append(seconds)
    # Untimed: our LSH alone (every candidate accepted, as datatrove does) for the count check.
    _, unverified = _ours(input_dir, os.path.join(work_dir, "ours-unverified"), workers, threshold=0.0)
    documents = stats["documents_in"]
    ours_rate = documents / min(ours_seconds)
    dt_rate = documents / min(dt_seconds)
    removed = (stats["documents_removed"], unverified["documents_removed"], dt_removed)
    return {
        "documents": documents,
        "shards": shards,
        "workers": workers,
        "parameters": {"ngram_size": NGRAM_SIZE, "num_bands": NUM_BANDS, "rows_per_band": ROWS_PER_BAND},
        "ours_seconds": round(min(ours_seconds), 3),
        "datatrove_seconds": round(min(dt_seconds), 3),
        "ours_docs_per_s": round(ours_rate, 1),
        "datatrove_docs_per_s": round(dt_rate, 1),
        "ratio": round(ours_rate / dt_rate, 3),
        "ours_removed": removed[0],
        "ours_rejected_pairs": stats["rejected_pairs"],
        "ours_removed_threshold_0": removed[1],
        "datatrove_removed": removed[2],
        # Our unverified LSH should remove about what datatrove removes; verification fewer.
        "similar_removals": abs(removed[1] - removed[2]) <= 0.1 * max(removed[1], removed[2], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--input", help="directory of jsonl.gz shards (default: build the stdlib corpus)")
    parser.add_argument("--work", help="scratch directory (default: a temporary one, deleted after)")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="dedup-bench-")
    try:
        input_dir = args.input
        if input_dir is None:
            input_dir = os.path.join(work, "corpus")
            shutil.rmtree(input_dir, ignore_errors=True)
            print("corpus:", json.dumps(build_stdlib_corpus(input_dir)))
        result = run_dedup_vs_datatrove(input_dir, work, workers=args.workers, repeats=args.repeats)
        print(json.dumps(result, indent=2))
        print(f"dedup_vs_datatrove={result['ratio']}")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
