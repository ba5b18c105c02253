"""Deduplicate documents: exact duplicates and MinHash near-duplicates, one kept per cluster.

Two ways for documents to be duplicates:

- *exact*: the same text after normalisation (lowercase unless `lowercase=False`,
  punctuation turned into spaces if `strip_punctuation`, whitespace runs collapsed to one
  space, outer whitespace stripped), compared by a 128-bit xxh3 hash of that text;
- *near*: a high Jaccard similarity of their sets of n-grams (`ngram_size` words, or
  characters with `ngram_unit="char"`, of the normalised text), found with MinHash and
  locality-sensitive hashing (LSH): a document's signature is `num_bands * rows_per_band`
  minimum hash values; two documents become candidates when all `rows_per_band` values
  of one band agree, which happens for at least one band with probability
  `1 - (1 - J**rows)**bands` for Jaccard J. Candidates are then *verified*: their
  Jaccard estimated from the full signatures must reach `threshold`, which drops LSH's
  false positives (set `threshold=0` to keep every candidate, as datatrove does).

Duplicate pairs are joined transitively into clusters (A~B and B~C put A, B and C in
one cluster, so a removed document can be less similar than `threshold` to the kept
one; `stats.json` shows estimated Jaccards of sample pairs). Each cluster keeps the
document that comes first in (shard index, position in shard) order, so which document
survives never depends on worker count or timing.

The step runs in three passes, each one resumable after a crash:

1. signatures, per shard in parallel (`map_shards`): stream the shard, write
   `<output_path>/.dedup_work/signatures/shard-NNNNN.npz` (exact hashes, per-band LSH
   keys, MinHash signatures; about 1 KB per document with the default 200 hashes);
2. clustering, in one process: exact groups by hash; per band, sort the LSH keys and
   take candidate pairs inside equal-key runs (each document with the run's first and
   with its predecessor); verify; connected components (keeping the smallest index).
   Memory: the hashes and band keys of all documents (16 + 8 * num_bands bytes each),
   plus the signatures of candidate documents only. Results:
   `.dedup_work/removals/shard-NNNNN.npz` (the removed positions of each shard, and the
   (shard, position) of the document each one gave way to) and `.dedup_work/clusters.json`;
3. filtering, per shard in parallel (`map_shards`): output shard i holds the kept
   documents of input shard i, in input order, written byte-identically on every run.

No pass holds the corpus' texts: a pass-1 worker holds one batch of `batch_documents`
texts plus its shard's signatures, pass 2 the per-document hashes described above, a
pass-3 worker one document at a time plus its shard's removal list. `.dedup_work/` is kept after a
successful run (it is what lets a deleted output shard be rebuilt alone); a re-run into
the same `output_path` with different parameters is refused rather than mixing results.

Hashes are stable across machines and library versions: xxh3 for words and text, and
MinHash permutations `h(x) = ((a * x + b) mod 2**64) >> 32` on 32-bit shingle hashes
(multiply-add-shift universal hashing, cheaper than `mod (2**61 - 1)`), with `a` and `b`
from splitmix64 of `seed`, not from numpy's generators whose streams may change.

`stats.json`: documents in/out, exact and near duplicates removed, clusters (size > 1),
largest cluster, candidate/verified/rejected pairs, documents with no n-gram (empty), a
sample of (removed, kept) pairs with ids, kind, estimated Jaccard and excerpts, and the
parameters (with the LSH threshold implied by bands and rows).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import fsspec
import numpy as np
import xxhash

from operations.shards import (
    DataError,
    atomic_output,
    document_writer,
    join,
    list_input_shards,
    map_shards,
    read_documents,
    read_json,
    read_numbered_documents,
    refuse_output_among_inputs,
    shard_name,
    write_json_atomic,
    write_stats,
)

WORK_DIR = ".dedup_work"
EXCERPT_CHARS = 200


@dataclass(frozen=True)
class DedupConfig:
    input_path: str
    """Directory of document shards (or one shard) to deduplicate; local path or fsspec URL."""

    output_path: str
    """Directory for the kept documents (`shard-NNNNN.jsonl.gz`, 1:1 with the input shards),
    `stats.json`, and the intermediate files under `.dedup_work/`."""

    mode: Literal["exact", "minhash", "both"] = "both"
    """"exact": only identical normalised texts; "minhash": only MinHash near-duplicates
    (which include identical texts); "both": exact first, then MinHash over the documents
    left, so removals are counted as exact or near."""

    lowercase: bool = True
    """Lowercase the text before hashing and n-gramming."""

    strip_punctuation: bool = False
    """Replace Unicode punctuation by spaces before hashing and n-gramming (off by default
    because punctuation carries meaning in code; datatrove's default is on)."""

    ngram_unit: Literal["word", "char"] = "word"
    """What a MinHash n-gram is made of: whitespace-separated words, or characters of the
    normalised text (better for code and for languages without spaces)."""

    ngram_size: int = 5
    """n-gram length in `ngram_unit`s. Documents shorter than this have one n-gram (all of
    their words); empty documents have none and are only exact-deduplicated."""

    num_bands: int = 20
    """LSH bands; MinHash uses `num_bands * rows_per_band` hash functions."""

    rows_per_band: int = 10
    """MinHash values per band; with `num_bands` they set the similarity at which pairs
    become likely candidates, about `(1 / num_bands) ** (1 / rows_per_band)` (0.74 here)."""

    threshold: float = 0.8
    """Smallest estimated Jaccard (fraction of equal signature values) for a candidate pair
    to count as duplicates; 0 accepts every LSH candidate."""

    seed: int = 1
    """Seed of the MinHash hash functions (changing it changes which pairs are found)."""

    sample_pairs: int = 20
    """How many (removed, kept) pairs to show in stats.json, spread over the corpus."""

    batch_documents: int = 1000
    """Documents hashed together in one vectorised batch (bounds memory per worker)."""

    workers: int | None = None
    """Parallel worker processes for the per-shard passes (default: one per core)."""

    def validate(self) -> None:
        """Raise ValueError naming the bad field. Called by `deduplicate`, not at construction:
        an experiment builds configs holding `versioned(...)` wrappers, checked once filled in."""

        def bad(field: str, problem: str) -> ValueError:
            return ValueError(f"DedupConfig.{field}: {problem}")

        if self.mode not in ("exact", "minhash", "both"):
            raise bad("mode", f"got {self.mode!r}; use 'exact', 'minhash' or 'both'")
        if self.ngram_unit not in ("word", "char"):
            raise bad("ngram_unit", f"got {self.ngram_unit!r}; use 'word' or 'char'")
        for field in ("ngram_size", "num_bands", "rows_per_band", "batch_documents"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(field, f"must be a positive integer, got {getattr(self, field)!r}")
        if not 0.0 <= self.threshold <= 1.0:
            raise bad("threshold", f"must be between 0 and 1, got {self.threshold!r}")
        if self.sample_pairs < 0:
            raise bad("sample_pairs", f"must be >= 0, got {self.sample_pairs!r}")

    @property
    def num_perm(self) -> int:
        return self.num_bands * self.rows_per_band


# --- stable hashing ------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1
_FMIX1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX2 = np.uint64(0xC4CEB9FE1A85EC53)
_U32 = np.uint64(32)
_U33 = np.uint64(33)


def _splitmix64(seed: int, count: int) -> np.ndarray:
    """`count` pseudo-random 64-bit integers from `seed`, identical everywhere."""
    state = seed & _MASK64
    out = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        out.append(z ^ (z >> 31))
    return np.array(out, dtype=np.uint64)


def _fmix64(values: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser (in place): spreads every input bit over all outputs."""
    values ^= values >> _U33
    values *= _FMIX1
    values ^= values >> _U33
    values *= _FMIX2
    values ^= values >> _U33
    return values


@functools.cache
def _punctuation_table() -> dict[int, str]:
    # Unicode punctuation (categories P*) lives in planes 0 and 1 only; scanning those
    # (not all 1.1M code points) keeps this at ~20 ms per worker process.
    return {code: " " for code in range(0x20000) if unicodedata.category(chr(code))[0] == "P"}


def normalize_text(text: str, *, lowercase: bool = True, strip_punctuation: bool = False) -> str:
    """The text exact duplicates are compared on, and n-grams are cut from."""
    if lowercase:
        text = text.lower()
    if strip_punctuation:
        text = text.translate(_punctuation_table())
    return " ".join(text.split())


# --- pass 1: signatures --------------------------------------------------------------------


@dataclass(frozen=True)
class _SignatureParams:
    """What pass 1 needs from the config (small and picklable for worker processes)."""

    exact: bool
    minhash: bool
    lowercase: bool
    strip_punctuation: bool
    ngram_unit: str
    ngram_size: int
    num_bands: int
    rows_per_band: int
    seed: int
    batch_documents: int


@dataclass(frozen=True)
class _Hashers:
    perm_a: np.ndarray  # (num_perm,) multipliers of the MinHash permutations
    perm_b: np.ndarray  # (num_perm,) offsets
    gram_mult: np.ndarray  # (ngram_size,) multipliers combining element hashes into an n-gram hash
    band_mult: np.ndarray  # (rows_per_band,) multipliers combining a band's rows into an LSH key


@functools.cache
def _hashers(seed: int, num_perm: int, ngram_size: int, rows_per_band: int) -> _Hashers:
    # Odd multipliers are invertible mod 2**64, so no multiplier collapses distinct inputs.
    return _Hashers(
        perm_a=_splitmix64(seed, num_perm) | np.uint64(1),
        perm_b=_splitmix64(seed ^ 0x5BD1E995, num_perm),
        gram_mult=_splitmix64(0x2545F4914F6CDD1D, ngram_size) | np.uint64(1),
        band_mult=_splitmix64(0x27BB2EE687B0B0FD, rows_per_band) | np.uint64(1),
    )


def _element_hashes(texts: list[str], unit: str) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of the words (or characters) of normalised texts, concatenated, and counts per text."""
    if unit == "word":
        # One encode per document, then split the bytes: cheaper than encoding every word.
        words = [text.encode("utf-8", "surrogatepass").split(b" ") if text else [] for text in texts]
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        flat = itertools.chain.from_iterable(words)
        hashes = np.fromiter(map(xxhash.xxh3_64_intdigest, flat), dtype=np.uint64, count=int(lengths.sum()))
        return hashes, lengths
    joined = "".join(texts)
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    codepoints = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.uint64)
    return _fmix64(codepoints * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x632BE59BD9B4E019)), lengths


def _shingles(elements: np.ndarray, lengths: np.ndarray, hashers: _Hashers) -> tuple[np.ndarray, np.ndarray]:
    """32-bit hashes of every n-gram of every document (as uint64), and the count per document.

    An n-gram's hash is fmix64(sum_k element[i + k] * mult[k]) -- order-sensitive, computed
    for all positions at once; documents shorter than n contribute one n-gram of all their
    elements, empty ones none.
    """
    n = len(hashers.gram_mult)
    total = len(elements)
    starts = np.cumsum(lengths) - lengths
    ends_of = np.repeat(starts + lengths, lengths)
    positions = np.arange(total, dtype=np.int64)
    padded = np.concatenate([elements, np.zeros(n - 1, dtype=np.uint64)])
    combined = elements * hashers.gram_mult[0]
    for k in range(1, n):
        term = padded[k : k + total] * hashers.gram_mult[k]
        term[positions + k >= ends_of] = 0
        combined += term
    valid = positions + n <= ends_of
    short = np.flatnonzero((lengths > 0) & (lengths < n))
    valid[starts[short]] = True
    per_document = np.maximum(lengths - n + 1, np.minimum(lengths, 1))
    return _fmix64(combined[valid]) >> _U32, per_document


def _minhash(
    shingles: np.ndarray, per_document: np.ndarray, hashers: _Hashers, chunk: int = 1024
) -> np.ndarray:
    """MinHash signatures (documents x num_perm, uint32); all-ones rows for documents without n-grams.

    Shingles of consecutive documents are processed in fixed-size chunks (so the
    shingles x permutations block stays in cache), reducing each chunk per document with
    `minimum.reduceat` and merging documents that straddle chunk boundaries.
    """
    a, b = hashers.perm_a, hashers.perm_b
    signatures = np.full((len(per_document), len(a)), 0xFFFFFFFF, dtype=np.uint64)
    owner = np.repeat(np.arange(len(per_document)), per_document)
    block = np.empty((chunk, len(a)), dtype=np.uint64)
    for start in range(0, len(shingles), chunk):
        values = shingles[start : start + chunk]
        docs = owner[start : start + chunk]
        out = block[: len(values)]
        np.multiply(values[:, None], a[None, :], out=out)
        out += b
        out >>= _U32
        firsts = np.flatnonzero(np.concatenate(([True], docs[1:] != docs[:-1])))
        mins = np.minimum.reduceat(out, firsts, axis=0)
        rows = docs[firsts]
        signatures[rows] = np.minimum(signatures[rows], mins)
    return signatures.astype(np.uint32)


def _band_keys(signatures: np.ndarray, num_bands: int, hashers: _Hashers) -> np.ndarray:
    """One 64-bit key per (document, band); equal rows give equal keys."""
    rows = signatures.astype(np.uint64).reshape(len(signatures), num_bands, -1)
    return _fmix64((rows * hashers.band_mult).sum(axis=2, dtype=np.uint64))


def _batches(shard: str, size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for line, document in read_numbered_documents(shard):
        text = document.get("text")
        if not isinstance(text, str):
            raise DataError(
                f"{shard}, line {line} (id {document.get('id')!r}): field 'text' is missing or not a string "
                f"(got {'null' if text is None else type(text).__name__}); every document needs a text string "
                "to deduplicate -- fix the shard, or make the shards with operations.documents, which skips "
                "and counts such records"
            )
        batch.append(text)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _signature_shard(params: _SignatureParams, input_shard: str, output_shard: str) -> dict[str, Any]:
    """Pass 1 for one shard: exact hashes, band keys and signatures -> an .npz work file."""
    hashers = _hashers(
        params.seed, params.num_bands * params.rows_per_band, params.ngram_size, params.rows_per_band
    )
    exact, keys, signatures, counts = [], [], [], []
    for texts in _batches(input_shard, params.batch_documents):
        normalized = [
            normalize_text(text, lowercase=params.lowercase, strip_punctuation=params.strip_punctuation)
            for text in texts
        ]
        if params.exact:
            digests = [
                xxhash.xxh3_128_intdigest(text.encode("utf-8", "surrogatepass")) for text in normalized
            ]
            exact.append(np.array([[d >> 64, d & _MASK64] for d in digests], dtype=np.uint64))
        if params.minhash:
            elements, lengths = _element_hashes(normalized, params.ngram_unit)
            shingles, per_document = _shingles(elements, lengths, hashers)
            batch_signatures = _minhash(shingles, per_document, hashers)
            signatures.append(batch_signatures)
            keys.append(_band_keys(batch_signatures, params.num_bands, hashers))
            counts.append(per_document)
    num_perm = params.num_bands * params.rows_per_band
    arrays = {
        "exact": np.concatenate(exact) if exact else np.zeros((0, 2), np.uint64),
        "band_keys": np.concatenate(keys) if keys else np.zeros((0, params.num_bands), np.uint64),
        "signatures": np.concatenate(signatures) if signatures else np.zeros((0, num_perm), np.uint32),
        "has_shingles": np.concatenate(counts) > 0 if counts else np.zeros(0, bool),
    }
    documents = sum(len(x) for x in (exact or signatures))
    with atomic_output(output_shard) as handle:
        np.savez(handle, **arrays)
    return {
        "documents": documents,
        "documents_without_shingles": int((~arrays["has_shingles"]).sum()) if params.minhash else 0,
    }


# --- pass 2: clustering --------------------------------------------------------------------


def _load(path: str, *names: str) -> dict[str, np.ndarray]:
    with fsspec.open(path, "rb") as handle, np.load(handle) as data:
        return {name: data[name] for name in names}


def _candidate_pairs(keys: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Pairs (low, high) of global indices sharing a key: each with its run's first and its predecessor."""
    order = np.argsort(keys, kind="stable")  # stable + ascending members: runs list indices in order
    sorted_keys = keys[order]
    ids = members[order]
    same = sorted_keys[1:] == sorted_keys[:-1]
    if not same.any():
        return np.zeros((0, 2), dtype=np.int64)
    position = np.arange(len(ids))
    run_start = np.maximum.accumulate(np.where(np.concatenate(([True], ~same)), position, 0))
    later = np.flatnonzero(np.concatenate(([False], same)))
    with_previous = np.stack([ids[later - 1], ids[later]], axis=1)
    far = later[run_start[later] < later - 1]
    with_first = np.stack([ids[run_start[far]], ids[far]], axis=1)
    return np.concatenate([with_previous, with_first])


def _components(pairs: np.ndarray, size: int) -> np.ndarray:
    """For every node, the smallest node of its connected component (hook-to-min + pointer jumping)."""
    labels = np.arange(size, dtype=np.int64)
    if len(pairs) == 0:
        return labels
    left, right = pairs[:, 0], pairs[:, 1]
    while True:
        low, high = labels[left], labels[right]
        if np.array_equal(low, high):
            return labels
        smaller = np.minimum(low, high)
        # labels[x] <= x always and every label is a root here, so hooking roots to the
        # smaller root keeps each label inside its component and converges to its minimum.
        np.minimum.at(labels, low, smaller)
        np.minimum.at(labels, high, smaller)
        while True:
            jumped = labels[labels]
            if np.array_equal(jumped, labels):
                break
            labels = jumped


def _gather_signatures(sig_files: list[str], offsets: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Signatures of the given (sorted, unique) global indices, loading one shard at a time."""
    shard_of = np.searchsorted(offsets, indices, side="right") - 1
    parts = []
    for shard in np.unique(shard_of):
        wanted = indices[shard_of == shard] - offsets[shard]
        parts.append(_load(sig_files[shard], "signatures")["signatures"][wanted])
    return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.uint32)


def _similarity(sig_a: np.ndarray, sig_b: np.ndarray, chunk: int = 65536) -> np.ndarray:
    out = np.empty(len(sig_a), dtype=np.float64)
    for start in range(0, len(sig_a), chunk):
        stop = start + chunk
        out[start:stop] = (sig_a[start:stop] == sig_b[start:stop]).mean(axis=1)
    return out


def _exact_pairs(exact: np.ndarray) -> np.ndarray:
    """(first occurrence, copy) for every document whose 128-bit text hash appeared before."""
    if len(exact) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    order = np.lexsort((exact[:, 1], exact[:, 0]))  # stable: equal hashes stay in index order
    sorted_hashes = exact[order]
    same = np.concatenate(([False], (sorted_hashes[1:] == sorted_hashes[:-1]).all(axis=1)))
    run_start = np.maximum.accumulate(np.where(same, 0, np.arange(len(order))))
    return np.stack([order[run_start[same]], order[same]], axis=1)


def _near_pairs(
    config: DedupConfig, loaded: list[dict[str, np.ndarray]], eligible: np.ndarray, sig_files: list[str]
) -> tuple[np.ndarray, dict[str, int]]:
    """Verified near-duplicate pairs among `eligible` documents (LSH candidates, then Jaccard check)."""
    from tqdm.auto import tqdm

    offsets = np.concatenate(([0], np.cumsum([len(part["has_shingles"]) for part in loaded]))).astype(
        np.int64
    )
    total = int(offsets[-1])
    members = np.flatnonzero(eligible)
    # Select per shard so the full key table is never held twice.
    band_keys = np.concatenate(
        [part["band_keys"][eligible[offsets[i] : offsets[i + 1]]] for i, part in enumerate(loaded)]
    )
    candidates = [np.zeros((0, 2), dtype=np.int64)] + [
        _candidate_pairs(band_keys[:, band], members)
        for band in tqdm(range(config.num_bands), desc="dedup: LSH bands", leave=False)
    ]
    del band_keys
    candidate = np.concatenate(candidates)
    codes = np.unique(candidate[:, 0] * total + candidate[:, 1])  # one entry per pair over all bands
    left, right = codes // total, codes % total
    nodes = np.unique(np.concatenate([left, right]))
    signatures = _gather_signatures(sig_files, offsets, nodes)
    similarity = _similarity(
        signatures[np.searchsorted(nodes, left)], signatures[np.searchsorted(nodes, right)]
    )
    accepted = similarity >= config.threshold
    counts = {
        "candidate_pairs": len(codes),
        "verified_pairs": int(accepted.sum()),
        "rejected_pairs": int((~accepted).sum()),
    }
    return np.stack([left[accepted], right[accepted]], axis=1), counts


def _cluster(config: DedupConfig, sig_files: list[str], counts: list[int], work: str) -> dict[str, Any]:
    """Pass 2: decide which documents go, write one removal file per shard, return the summary."""
    from tqdm.auto import tqdm

    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    total = int(offsets[-1])
    use_exact = config.mode in ("exact", "both")
    use_minhash = config.mode in ("minhash", "both")
    names = (("exact",) if use_exact else ()) + (("band_keys", "has_shingles") if use_minhash else ())
    loaded = [_load(path, *names) for path in tqdm(sig_files, desc="dedup: load hashes", leave=False)]

    pairs = [np.zeros((0, 2), dtype=np.int64)]
    is_exact_copy = np.zeros(total, dtype=bool)
    if use_exact:
        exact_pairs = _exact_pairs(np.concatenate([part["exact"] for part in loaded]))
        is_exact_copy[exact_pairs[:, 1]] = True
        pairs.append(exact_pairs)
    summary: dict[str, Any] = {"candidate_pairs": 0, "verified_pairs": 0, "rejected_pairs": 0}
    if use_minhash:
        has_shingles = np.concatenate([part["has_shingles"] for part in loaded])
        # Exact copies stand in for their first occurrence (same signature), so only
        # first occurrences take part in LSH.
        near_pairs, near_counts = _near_pairs(config, loaded, has_shingles & ~is_exact_copy, sig_files)
        pairs.append(near_pairs)
        summary.update(near_counts)
    del loaded

    labels = _components(np.concatenate(pairs), total)
    removed = np.flatnonzero(labels != np.arange(total))
    sizes = np.bincount(labels, minlength=total) if total else np.zeros(0, dtype=np.int64)
    samples = _pick_samples(config, removed, labels, is_exact_copy, sig_files, offsets)
    sample_positions = {int(i) for sample in samples for i in (sample["removed"], sample["kept"])}

    for shard in range(len(sig_files)):
        low, high = offsets[shard], offsets[shard + 1]
        mine = removed[(removed >= low) & (removed < high)]
        kept = labels[mine]
        kept_shard = np.searchsorted(offsets, kept, side="right") - 1
        excerpt = np.array(sorted(i - low for i in sample_positions if low <= i < high), dtype=np.int64)
        with atomic_output(_removal_path(work, shard)) as handle:
            np.savez(
                handle,
                removed=(mine - low).astype(np.int64),
                # The document each removed one was clustered with and gave way to.
                kept_shard=kept_shard.astype(np.int64),
                kept_position=(kept - offsets[kept_shard]).astype(np.int64),
                excerpt=excerpt,
                documents=high - low,
            )

    summary.update(
        documents_in=total,
        documents_removed=len(removed),
        exact_duplicates_removed=int(is_exact_copy.sum()),
        near_duplicates_removed=int(len(removed) - is_exact_copy.sum()),
        clusters=int((sizes > 1).sum()),
        largest_cluster=int(sizes.max()) if total else 0,
        documents_in_clusters=int(sizes[sizes > 1].sum()),
        samples=[
            {
                **sample,
                "removed": _locate(sample["removed"], offsets),
                "kept": _locate(sample["kept"], offsets),
            }
            for sample in samples
        ],
    )
    return summary


def _pick_samples(
    config: DedupConfig,
    removed: np.ndarray,
    labels: np.ndarray,
    is_exact_copy: np.ndarray,
    sig_files: list[str],
    offsets: np.ndarray,
) -> list[dict[str, Any]]:
    """Up to `sample_pairs` (removed, kept) pairs, evenly spread over the removed documents."""
    if config.sample_pairs == 0 or len(removed) == 0:
        return []
    picks = removed[np.unique(np.linspace(0, len(removed) - 1, config.sample_pairs).astype(np.int64))]
    kept = labels[picks]
    similarity = np.ones(len(picks))
    if config.mode != "exact":
        nodes = np.unique(np.concatenate([picks, kept]))
        signatures = _gather_signatures(sig_files, offsets, nodes)
        similarity = _similarity(
            signatures[np.searchsorted(nodes, picks)], signatures[np.searchsorted(nodes, kept)]
        )
    return [
        {
            "removed": int(pick),
            "kept": int(keep),
            "kind": "exact" if is_exact_copy[pick] else "near",
            "estimated_jaccard": round(float(sim), 4),
        }
        for pick, keep, sim in zip(picks, kept, similarity, strict=True)
    ]


def _locate(index: int, offsets: np.ndarray) -> dict[str, int]:
    shard = int(np.searchsorted(offsets, index, side="right") - 1)
    return {"shard": shard, "position": int(index - offsets[shard])}


def _removal_path(work: str, shard: int) -> str:
    return join(work, "removals", shard_name(shard, ".npz"))


# --- pass 3: filtering ---------------------------------------------------------------------


def _filter_shard(work: str, input_shard: str, output_shard: str) -> dict[str, Any]:
    """Pass 3 for one shard: copy the kept documents, collect excerpts of sampled ones."""
    # Output shard i pairs with input shard i, whose removals pass 2 wrote under the same index.
    index = int(re.fullmatch(r"shard-(\d+)\..*", output_shard.rsplit("/", 1)[-1]).group(1))
    removal_path = _removal_path(work, index)
    arrays = _load(removal_path, "removed", "excerpt", "documents")
    expected = int(arrays["documents"])
    removed = set(arrays["removed"].tolist())
    wanted = set(arrays["excerpt"].tolist())
    excerpts: dict[str, dict[str, Any]] = {}
    seen = kept = 0
    with document_writer(output_shard) as write:
        for position, document in enumerate(read_documents(input_shard)):
            seen += 1
            if position in wanted:
                excerpts[str(position)] = {
                    "id": document.get("id"),
                    "excerpt": document["text"][:EXCERPT_CHARS],
                }
            if position not in removed:
                write(document)
                kept += 1
    if seen != expected:
        raise ValueError(
            f"{input_shard} has {seen} documents now but had {expected} when its signatures were "
            f"computed; the input changed during the step. Delete {work.rsplit('/', 1)[0]} and run again."
        )
    return {
        "documents_in": seen,
        "documents_out": kept,
        "documents_removed": seen - kept,
        "excerpts": excerpts,
    }


# --- the step ------------------------------------------------------------------------------


def _parameters(config: DedupConfig) -> dict[str, Any]:
    fields = dataclasses.asdict(config)
    for unversioned in ("output_path", "workers", "batch_documents"):
        fields.pop(unversioned)
    return fields


def deduplicate(config: DedupConfig) -> None:
    """Remove exact and/or near-duplicate documents; keep the first of each cluster."""
    config.validate()
    inputs = list_input_shards(config.input_path, "dedup")
    refuse_output_among_inputs(inputs, config.output_path, "dedup")
    work = join(config.output_path, WORK_DIR)
    parameters = _parameters(config)
    previous = read_json(join(work, "parameters.json"))
    if previous is not None and previous != json.loads(json.dumps(parameters)):
        raise ValueError(
            f"{work} holds intermediate files from a run with other parameters "
            f"({ {k: v for k, v in previous.items() if parameters.get(k) != v} }); use a fresh "
            f"output_path, or delete {config.output_path} to start over"
        )
    if previous is None:
        write_json_atomic(join(work, "parameters.json"), parameters)

    sig_params = _SignatureParams(
        exact=config.mode in ("exact", "both"),
        minhash=config.mode in ("minhash", "both"),
        lowercase=config.lowercase,
        strip_punctuation=config.strip_punctuation,
        ngram_unit=config.ngram_unit,
        ngram_size=config.ngram_size,
        num_bands=config.num_bands,
        rows_per_band=config.rows_per_band,
        seed=config.seed,
        batch_documents=config.batch_documents,
    )
    sig_dir = join(work, "signatures")
    per_shard = map_shards(
        functools.partial(_signature_shard, sig_params),
        inputs,
        sig_dir,
        workers=config.workers,
        description="dedup: signatures",
        output_suffix=".npz",
    )
    sig_files = [join(sig_dir, shard_name(i, ".npz")) for i in range(len(inputs))]
    counts = [stats["documents"] for stats in per_shard]
    if not sum(counts):
        raise DataError(
            f"dedup: no documents in the {len(inputs)} input shard(s) under {config.input_path}: the step "
            "before wrote empty shards -- check its stats.json"
        )

    clusters_path = join(work, "clusters.json")
    summary = read_json(clusters_path)
    if summary is None:
        summary = _cluster(config, sig_files, counts, work)
        write_json_atomic(clusters_path, summary)

    filtered = map_shards(
        functools.partial(_filter_shard, work),
        inputs,
        config.output_path,
        workers=config.workers,
        description="dedup: filter",
    )
    documents_out = sum(stats["documents_out"] for stats in filtered)
    assert documents_out == summary["documents_in"] - summary["documents_removed"]

    def describe(where: dict[str, int]) -> dict[str, Any]:
        excerpt = filtered[where["shard"]]["excerpts"][str(where["position"])]
        return {**where, "shard_file": inputs[where["shard"]].rsplit("/", 1)[-1], **excerpt}

    write_stats(
        config.output_path,
        {
            "documents_in": summary["documents_in"],
            "documents_out": documents_out,
            "documents_removed": summary["documents_removed"],
            "exact_duplicates_removed": summary["exact_duplicates_removed"],
            "near_duplicates_removed": summary["near_duplicates_removed"],
            "clusters": summary["clusters"],
            "largest_cluster": summary["largest_cluster"],
            "documents_in_clusters": summary["documents_in_clusters"],
            "candidate_pairs": summary["candidate_pairs"],
            "verified_pairs": summary["verified_pairs"],
            "rejected_pairs": summary["rejected_pairs"],
            "documents_without_shingles": sum(stats["documents_without_shingles"] for stats in per_shard),
            "shards": len(inputs),
            "sample_pairs": [
                {
                    "kind": sample["kind"],
                    "estimated_jaccard": sample["estimated_jaccard"],
                    "removed": describe(sample["removed"]),
                    "kept": describe(sample["kept"]),
                }
                for sample in summary["samples"]
            ],
            "parameters": {
                **{k: v for k, v in parameters.items() if k != "input_path"},
                "num_perm": config.num_perm if config.mode != "exact" else 0,
                "lsh_threshold": (
                    round((1 / config.num_bands) ** (1 / config.rows_per_band), 4)
                    if config.mode != "exact"
                    else None
                ),
            },
        },
    )
