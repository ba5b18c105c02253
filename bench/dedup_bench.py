"""MinHash dedup throughput: ours (`operations.dedup`) against datatrove 0.9.0's MinHash pipeline.

    .venv/bin/python bench/dedup_bench.py                    # builds the stdlib corpus, prints the ratio
    .venv/bin/python bench/dedup_bench.py --input DIR --work DIR --rounds 5

Both sides read the same jsonl.gz shards, run the same algorithm with the same parameters
and write the kept documents as jsonl.gz shards (gzip level 3 on both sides), one per input
shard:

- normalisation: lowercase, whitespace runs collapsed to one space, stripped; punctuation
  and numbers kept, no diacritics folding (datatrove: `TextNormConfig(remove_punctuation=
  False, norm_numbers=False, norm_unicode_diacritics=False)`; ours: `lowercase=True,
  strip_punctuation=False`). datatrove's punctuation list also holds symbols ($ + < = > ^ ` | ~)
  that ours (Unicode P*) does not, so punctuation stays on both sides;
- words split on whitespace (datatrove's English tokenizer needs nltk, which is not
  installed; it gets `str.split`, cheaper than nltk), shingles of 5 words, 14 bands of 8
  rows (112 hashes), seed 1;
- LSH candidates are duplicates, joined into clusters by connected components, all but one
  document of each cluster removed: ours with `threshold=0` (no verification, as datatrove
  does); ours with its default verification (estimated Jaccard >= 0.8) is timed too;
- ours: `deduplicate(DedupConfig(mode="minhash", ...))`, all three passes, with its default
  worker processes (one per core);
- datatrove: `MinhashDedupSignature` -> `MinhashDedupBuckets` -> `MinhashDedupCluster` ->
  `MinhashDedupFilter` + `JsonlWriter`, each stage a `LocalPipelineExecutor` over a
  `JsonlReader` (one task per shard; 14 tasks for the buckets stage, as it requires), with
  1 and with 2 workers; the faster setting (median) is datatrove's figure. Its `xxhash64`
  passes a str, which xxhash 4.x refuses ("Strings must be encoded before hashing"), so the
  signature step gets the same hash of the UTF-8 bytes. Its writer gets gzip level 3
  (fsspec's gzip default is level 9).

Rounds alternate the order of the sides; the ratio is the median over rounds of datatrove
seconds (best setting) / our seconds. Removals are compared document by document
(untimed): each side's removed ids, and for every document removed by one side only, why:
it is shorter than 5 words (datatrove computes no signature for it, ours one shingle of all
its words), it is in a cluster on both sides but the other side kept it (ours keeps the
first of a cluster, datatrove the root of its union-find), or only one side's LSH made it a
candidate (hash functions differ; the exact Jaccard of its 5-gram set with its nearest
cluster mate is given). Run alone, the script builds `build_stdlib_corpus` (every `.py` file
of the standard library as a document -- about 1,800 -- plus planted near-duplicates with a
few words changed and exact copies with changed case and whitespace, shuffled over 8 shards)
and prints a table and `dedup_vs_datatrove=R` last.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import random
import shutil
import statistics
import struct
import sys
import sysconfig
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fsspec  # noqa: E402
import numpy as np  # noqa: E402
import xxhash  # noqa: E402
from datatrove.utils.word_tokenizers import WordTokenizer  # noqa: E402
from revision import commit  # noqa: E402

from operations.dedup import DedupConfig, deduplicate  # noqa: E402
from operations.shards import list_shards, read_documents, shard_name, write_documents  # noqa: E402

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
    input_dir: str, output_dir: str, threshold: float, workers: int | None = None
) -> tuple[float, dict[str, Any]]:
    config = DedupConfig(
        input_path=input_dir,
        output_path=output_dir,
        mode="minhash",
        lowercase=True,
        strip_punctuation=False,
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


GZIP_LEVEL = 3
GZIP3 = "gzip_level3"


def _register_gzip3() -> None:
    """An fsspec compression writing gzip level 3 (ours; fsspec's "gzip" writes level 9)."""
    if GZIP3 not in fsspec.compression.compr:
        fsspec.compression.register_compression(
            GZIP3, lambda f, **kwargs: gzip.GzipFile(fileobj=f, compresslevel=GZIP_LEVEL, **kwargs), []
        )


def _datatrove(input_dir: str, work_dir: str, workers: int, shards: int) -> float:
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

    class Gzip3JsonlWriter(JsonlWriter):
        """datatrove's JsonlWriter writing gzip level 3 like ours (registered in each worker)."""

        def __init__(self, output_folder: str) -> None:
            super().__init__(output_folder, compression="gzip")
            self.output_mg.compression = GZIP3

        def write(self, document: Any, rank: int = 0, **kwargs: Any) -> None:
            _register_gzip3()
            super().write(document, rank, **kwargs)

    config = MinhashConfig(
        n_grams=NGRAM_SIZE,
        num_buckets=NUM_BANDS,
        hashes_per_bucket=ROWS_PER_BAND,
        seed=SEED,
        norm_config=TextNormConfig(
            remove_punctuation=False, norm_unicode_diacritics=False, norm_numbers=False
        ),
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
    stage([reader(), MinhashDedupFilter(remove), Gzip3JsonlWriter(output)], shards, "filter").run()
    return time.perf_counter() - start


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


# --- which documents each side removed, and why they differ (untimed) ----------------------


def _read_ids(directory: str) -> list[list[str]]:
    """Ids of the documents of each shard under `directory`, in order."""
    return [[doc["id"] for doc in read_documents(shard)] for shard in list_shards(directory)]


def _clusters_ours(work_dir: str, shard_ids: list[list[str]]) -> dict[str, str]:
    """Removed id -> the id it gave way to, from our removal files."""
    gave_way = {}
    for shard, path in enumerate(
        sorted(glob.glob(os.path.join(work_dir, ".dedup_work", "removals", "*.npz")))
    ):
        with np.load(path) as data:
            for position, kept_shard, kept_position in zip(
                data["removed"], data["kept_shard"], data["kept_position"], strict=True
            ):
                gave_way[shard_ids[shard][position]] = shard_ids[kept_shard][kept_position]
    return gave_way


def _clusters_datatrove(work_dir: str, input_dir: str) -> list[set[str]]:
    """datatrove's clusters: connected components of the pairs its buckets stage wrote (.dups)."""
    # Its reader skips documents with empty text, so its document index counts only the others.
    indexed = [
        [doc["id"] for doc in read_documents(shard) if doc.get("text")] for shard in list_shards(input_dir)
    ]
    parent: dict[str, str] = {}

    def root(node: str) -> str:
        while parent.setdefault(node, node) != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for path in glob.glob(os.path.join(work_dir, "buckets", "**", "*.dups"), recursive=True):
        with open(path, "rb") as handle:
            for f1, d1, f2, d2 in struct.iter_unpack("<4I", handle.read()):
                parent[root(indexed[f1][d1])] = root(indexed[f2][d2])
    clusters: dict[str, set[str]] = {}
    for node in parent:
        clusters.setdefault(root(node), set()).add(node)
    return [members for members in clusters.values() if len(members) > 1]


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = " ".join(text.lower().split()).split(" ")
    return {tuple(words[i : i + NGRAM_SIZE]) for i in range(len(words) - NGRAM_SIZE + 1)}


def compare_removals(input_dir: str, ours_dir: str, datatrove_dir: str) -> dict[str, Any]:
    """Each side's removed ids, and a reason for every document removed by one side only."""
    shard_ids = _read_ids(input_dir)
    all_ids = [i for ids in shard_ids for i in ids]
    texts = {doc["id"]: doc["text"] for shard in list_shards(input_dir) for doc in read_documents(shard)}
    ours_removed = set(all_ids) - {i for ids in _read_ids(ours_dir) for i in ids}
    # datatrove's reader skips documents with empty text: neither kept nor removed.
    read_by_datatrove = {i for i in all_ids if texts[i]}
    dt_kept = {i for ids in _read_ids(os.path.join(datatrove_dir, "deduplicated")) for i in ids}
    dt_removed = read_by_datatrove - dt_kept
    gave_way = _clusters_ours(ours_dir, shard_ids)
    ours_cluster_of: dict[str, set[str]] = {}
    for removed, kept in gave_way.items():
        members = ours_cluster_of.setdefault(kept, {kept})
        members.add(removed)
        ours_cluster_of[removed] = members
    dt_cluster_of = {
        node: members for members in _clusters_datatrove(datatrove_dir, input_dir) for node in members
    }

    def reason(doc: str, this: dict[str, set[str]], other: dict[str, set[str]]) -> dict[str, Any]:
        words = len(texts[doc].split())
        if words < NGRAM_SIZE:
            return {"id": doc, "reason": f"shorter than {NGRAM_SIZE} words ({words})"}
        if doc in other:
            return {"id": doc, "reason": "in a cluster on both sides; the other side kept it"}
        mine = _shingles(texts[doc])
        nearest = max(
            (
                len(mine & _shingles(texts[m])) / max(1, len(mine | _shingles(texts[m])))
                for m in this[doc] - {doc}
            ),
            default=0.0,
        )
        return {
            "id": doc,
            "reason": "only this side's LSH found it",
            "jaccard_to_nearest_mate": round(nearest, 3),
        }

    only_ours = sorted(ours_removed - dt_removed)
    only_dt = sorted(dt_removed - ours_removed)
    return {
        "ours_removed": len(ours_removed),
        "datatrove_removed": len(dt_removed),
        "removed_by_both": len(ours_removed & dt_removed),
        "empty_skipped_by_datatrove_reader": len(all_ids) - len(read_by_datatrove),
        "ours_in_clusters": len({m for members in ours_cluster_of.values() for m in members}),
        "datatrove_in_clusters": len(dt_cluster_of),
        "only_ours": [reason(doc, ours_cluster_of, dt_cluster_of) for doc in only_ours],
        "only_datatrove": [reason(doc, dt_cluster_of, ours_cluster_of) for doc in only_dt],
    }


# --- the benchmark -------------------------------------------------------------------------


def run_dedup_vs_datatrove(input_dir: str, work_dir: str, *, rounds: int = 3) -> dict[str, Any]:
    """Seconds of ours (threshold 0 and 0.8) and datatrove (1 and 2 workers) over interleaved rounds."""
    shards = len(list_shards(input_dir))
    sides = {
        "ours": lambda out: _ours(input_dir, out, threshold=0.0)[0],
        "ours_verified": lambda out: _ours(input_dir, out, threshold=0.8)[0],
        "datatrove_1": lambda out: _datatrove(input_dir, out, 1, shards),
        "datatrove_2": lambda out: _datatrove(input_dir, out, 2, shards),
    }
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    for index in range(rounds):
        order = list(sides) if index % 2 == 0 else list(reversed(sides))
        for name in order:
            out = os.path.join(work_dir, name)
            shutil.rmtree(out, ignore_errors=True)
            seconds[name].append(sides[name](out))
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    best = min(("datatrove_1", "datatrove_2"), key=medians.get)
    ratios = [dt / ours for dt, ours in zip(seconds[best], seconds["ours"], strict=True)]
    with open(os.path.join(work_dir, "ours", "stats.json")) as handle:
        stats = json.load(handle)
    return {
        "documents": stats["documents_in"],
        "shards": shards,
        "cores": os.cpu_count(),
        "rounds": rounds,
        "parameters": {
            "ngram_size": NGRAM_SIZE,
            "num_bands": NUM_BANDS,
            "rows_per_band": ROWS_PER_BAND,
            "seed": SEED,
            "gzip_level": GZIP_LEVEL,
        },
        "seconds": {name: [round(s, 2) for s in values] for name, values in seconds.items()},
        "median_seconds": {name: round(value, 2) for name, value in medians.items()},
        "datatrove_best": best,
        "ratios": [round(r, 3) for r in ratios],
        "ratio": round(statistics.median(ratios), 3),
        "ratio_verified": round(
            statistics.median(
                dt / ours for dt, ours in zip(seconds[best], seconds["ours_verified"], strict=True)
            ),
            3,
        ),
        "ours_verified_removed": _ours_removed(os.path.join(work_dir, "ours_verified")),
        "removals": compare_removals(input_dir, os.path.join(work_dir, "ours"), os.path.join(work_dir, best)),
    }


def _ours_removed(output_dir: str) -> int:
    with open(os.path.join(output_dir, "stats.json")) as handle:
        return json.load(handle)["documents_removed"]


def format_table(result: dict[str, Any], commit: str) -> str:
    removals = result["removals"]
    lines = [
        f"commit {commit}; {result['documents']} documents in {result['shards']} shards, {result['cores']} cores; "
        f"medians of {result['rounds']} interleaved rounds",
        "",
        "| side | workers | seconds (median) | docs/s | datatrove best s / this s | removed |",
        "|---|---|---|---|---|---|",
    ]
    best = result["median_seconds"][result["datatrove_best"]]
    rows = [
        ("ours, LSH only (threshold 0)", "ours", "2 processes (passes 1, 3)", removals["ours_removed"]),
        (
            "ours, verified (Jaccard >= 0.8)",
            "ours_verified",
            "2 processes (passes 1, 3)",
            result["ours_verified_removed"],
        ),
        ("datatrove 0.9.0", "datatrove_1", "1", None),
        ("datatrove 0.9.0", "datatrove_2", "2", None),
    ]
    for name, key, workers, removed in rows:
        s = result["median_seconds"][key]
        if removed is None:
            removed = removals["datatrove_removed"] if key == result["datatrove_best"] else "(same)"
        lines.append(
            f"| {name} | {workers} | {s:.2f} | {result['documents'] / s:.0f} | {best / s:.3f} | {removed} |"
        )
    lines += [
        "",
        f"rounds, datatrove best / ours: {result['ratios']}; verified: {result['ratio_verified']}",
        f"removed by both {removals['removed_by_both']}; in clusters: ours {removals['ours_in_clusters']}, "
        f"datatrove {removals['datatrove_in_clusters']}; empty texts (datatrove's reader skips them, ours "
        f"keeps them): {removals['empty_skipped_by_datatrove_reader']}",
    ]
    for side in ("only_ours", "only_datatrove"):
        reasons: dict[str, int] = {}
        for item in removals[side]:
            reasons[item["reason"]] = reasons.get(item["reason"], 0) + 1
        lines.append(f"removed {side.replace('_', ' by ')}: {len(removals[side])} {reasons}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--input", help="directory of jsonl.gz shards (default: build the stdlib corpus)")
    parser.add_argument("--work", help="scratch directory (default: a temporary one, deleted after)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    revision = commit()  # before measuring: others may commit while it runs
    work = args.work or tempfile.mkdtemp(prefix="dedup-bench-")
    try:
        input_dir = args.input
        if input_dir is None:
            input_dir = os.path.join(work, "corpus")
            shutil.rmtree(input_dir, ignore_errors=True)
            print("corpus:", json.dumps(build_stdlib_corpus(input_dir)))
        result = run_dedup_vs_datatrove(input_dir, work, rounds=args.rounds)
        print(json.dumps(result, indent=2))
        print(format_table(result, revision))
        print(f"dedup_vs_datatrove={result['ratio']}")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
