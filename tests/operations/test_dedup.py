"""operations.dedup: which documents go and which stay, stats, determinism, resume, modes."""

from __future__ import annotations

import gzip
import json
import os
import random
import string
import uuid
from pathlib import Path

import numpy as np
import pytest

from operations.dedup import DedupConfig, _components, deduplicate, normalize_text
from operations.shards import iter_documents, list_shards, read_documents, shard_name, write_documents


def words(seed: int, count: int = 200) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(count)]


def text(seed: int, count: int = 200) -> str:
    return " ".join(words(seed, count))


def changed(base: str, positions: list[int], tag: str) -> str:
    """`base` with the words at `positions` replaced (a near-duplicate)."""
    tokens = base.split(" ")
    for position in positions:
        tokens[position] = f"{tag}{position}"
    return " ".join(tokens)


def doc(doc_id: str, body: str) -> dict:
    return {"id": doc_id, "text": body, "source": "test", "metadata": {}}


def write_shards(directory, shards: list[list[dict]]) -> str:
    for index, documents in enumerate(shards):
        write_documents(os.path.join(directory, shard_name(index)), documents)
    return str(directory)


def kept_ids(output_path: str) -> list[str]:
    return [document["id"] for document in iter_documents(output_path)]


def stats_of(output_path: str) -> dict:
    with open(os.path.join(output_path, "stats.json")) as handle:
        return json.load(handle)


A, B, C, D, N = text(1), text(2), text(3), text(4), text(5)

# Three shards: A is copied exactly (other case/whitespace) into shards 1 and 2, N has two
# near-duplicates (3 words changed each) in shards 1 and 2; B, C, D are distinct.
CORPUS = [
    [doc("a", A), doc("b", B), doc("n", N)],
    [doc("n-near-1", changed(N, [10, 80, 150], "x")), doc("a-upper", "  " + A.upper().replace(" ", "\n\t "))],
    [doc("c", C), doc("a-again", A + "   "), doc("n-near-2", changed(N, [30, 120, 190], "y")), doc("d", D)],
]


@pytest.fixture
def corpus(tmp_path) -> str:
    return write_shards(tmp_path / "in", CORPUS)


def test_keeps_the_first_of_each_cluster_across_shards(corpus, tmp_path):
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=corpus, output_path=out, workers=1))
    assert kept_ids(out) == ["a", "b", "n", "c", "d"]
    # Output shards map 1:1 to the input shards and keep input order.
    assert [[d["id"] for d in read_documents(shard)] for shard in list_shards(out)] == [
        ["a", "b", "n"],
        [],
        ["c", "d"],
    ]


def test_removal_files_name_the_document_each_removed_one_gave_way_to(corpus, tmp_path):
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=corpus, output_path=out, workers=1))
    ids = [[d["id"] for d in shard] for shard in CORPUS]
    gave_way = {}
    for shard in range(len(CORPUS)):
        with np.load(os.path.join(out, ".dedup_work", "removals", shard_name(shard, ".npz"))) as removals:
            for position, kept_shard, kept_position in zip(
                removals["removed"], removals["kept_shard"], removals["kept_position"], strict=True
            ):
                gave_way[ids[shard][position]] = ids[kept_shard][kept_position]
    assert gave_way == {"n-near-1": "n", "a-upper": "a", "a-again": "a", "n-near-2": "n"}


def test_the_earliest_shard_and_position_wins_even_when_it_is_the_copy(tmp_path):
    original, copy = text(7), changed(text(7), [5, 60], "z")
    corpus = write_shards(
        tmp_path / "in",
        [[doc("other", text(8)), doc("copy-first", copy)], [doc("original", original)], []],
    )
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=corpus, output_path=out, workers=1))
    assert kept_ids(out) == ["other", "copy-first"]


def test_stats_count_exact_and_near_duplicates_and_show_sample_pairs(corpus, tmp_path):
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=corpus, output_path=out, workers=1))
    stats = stats_of(out)
    assert stats["documents_in"] == 9
    assert stats["documents_out"] == 5
    assert stats["documents_removed"] == 4
    assert stats["exact_duplicates_removed"] == 2
    assert stats["near_duplicates_removed"] == 2
    assert stats["clusters"] == 2
    assert stats["largest_cluster"] == 3
    assert stats["documents_in_clusters"] == 6
    assert stats["shards"] == 3
    pairs = {(p["removed"]["id"], p["kept"]["id"]): p for p in stats["sample_pairs"]}
    assert set(pairs) == {("n-near-1", "n"), ("a-upper", "a"), ("a-again", "a"), ("n-near-2", "n")}
    assert pairs[("a-upper", "a")]["kind"] == "exact"
    assert pairs[("a-upper", "a")]["estimated_jaccard"] == 1.0
    near = pairs[("n-near-1", "n")]
    assert near["kind"] == "near"
    assert 0.8 <= near["estimated_jaccard"] < 1.0
    assert near["removed"] == {"shard": 1, "position": 0, "shard_file": "shard-00001.jsonl.gz", "id": "n-near-1",
                               "excerpt": changed(N, [10, 80, 150], "x")[:200]}  # fmt: skip
    assert stats["parameters"]["num_perm"] == 200
    assert stats["parameters"]["mode"] == "both"
    assert stats["parameters"]["lsh_threshold"] == pytest.approx((1 / 20) ** (1 / 10), abs=1e-4)


def test_sample_pairs_is_capped(corpus, tmp_path):
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=corpus, output_path=out, sample_pairs=1, workers=1))
    assert len(stats_of(out)["sample_pairs"]) == 1


def test_output_is_byte_identical_across_runs_and_worker_counts(corpus, tmp_path):
    outputs = []
    for name, workers in (("one", 1), ("two", 2), ("again", 1)):
        out = str(tmp_path / name)
        deduplicate(DedupConfig(input_path=corpus, output_path=out, workers=workers))
        outputs.append({p: Path(out, p).read_bytes() for p in os.listdir(out) if not p.startswith(".")})
    assert outputs[0] == outputs[1] == outputs[2]
    assert set(outputs[0]) == {
        "shard-00000.jsonl.gz",
        "shard-00001.jsonl.gz",
        "shard-00002.jsonl.gz",
        "stats.json",
    }


def test_a_deleted_output_shard_is_rebuilt_alone_with_the_same_bytes(corpus, tmp_path):
    out = str(tmp_path / "out")
    config = DedupConfig(input_path=corpus, output_path=out, workers=1)
    deduplicate(config)

    def snapshot() -> dict[str, tuple[int, bytes]]:
        files = {}
        for root, _, names in os.walk(out):
            for name in names:
                path = os.path.join(root, name)
                files[os.path.relpath(path, out)] = (os.stat(path).st_mtime_ns, Path(path).read_bytes())
        return files

    before = snapshot()
    os.remove(os.path.join(out, "shard-00002.jsonl.gz"))
    deduplicate(config)
    after = snapshot()
    assert {name: data for name, (_, data) in after.items()} == {
        name: data for name, (_, data) in before.items()
    }
    rewritten = {name for name in before if before[name][0] != after[name][0]}
    # Only the deleted shard, its counters and the summed stats are written again.
    assert rewritten == {"shard-00002.jsonl.gz", ".shard_stats/shard-00002.jsonl.gz.json", "stats.json"}


def test_pairs_below_the_threshold_are_kept(tmp_path):
    base = text(11)
    # The last 50 of 200 words differ: about 0.6 Jaccard over word 5-grams.
    half = " ".join(base.split(" ")[:150] + words(12, 50))
    corpus = write_shards(tmp_path / "in", [[doc("base", base), doc("similar", half)]])
    # Bands of 2 rows make the pair an LSH candidate with near certainty; verification decides.
    strict = DedupConfig(
        input_path=corpus, output_path=str(tmp_path / "strict"), num_bands=32, rows_per_band=2, workers=1
    )
    deduplicate(strict)
    assert kept_ids(strict.output_path) == ["base", "similar"]
    assert stats_of(strict.output_path)["rejected_pairs"] == 1
    loose = DedupConfig(
        input_path=corpus,
        output_path=str(tmp_path / "loose"),
        num_bands=32,
        rows_per_band=2,
        threshold=0.4,
        workers=1,
    )
    deduplicate(loose)
    assert kept_ids(loose.output_path) == ["base"]
    assert 0.4 <= stats_of(loose.output_path)["sample_pairs"][0]["estimated_jaccard"] < 0.8


def test_exact_mode_removes_only_identical_normalised_texts(corpus, tmp_path):
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=corpus, output_path=out, mode="exact", workers=1))
    assert kept_ids(out) == ["a", "b", "n", "n-near-1", "c", "n-near-2", "d"]
    stats = stats_of(out)
    assert (stats["exact_duplicates_removed"], stats["near_duplicates_removed"]) == (2, 0)
    assert stats["parameters"]["num_perm"] == 0


def test_minhash_mode_finds_identical_texts_as_near_duplicates(corpus, tmp_path):
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=corpus, output_path=out, mode="minhash", workers=1))
    assert kept_ids(out) == ["a", "b", "n", "c", "d"]
    stats = stats_of(out)
    assert (stats["exact_duplicates_removed"], stats["near_duplicates_removed"]) == (0, 4)


def test_empty_documents_are_exact_duplicates_but_never_minhashed(tmp_path):
    corpus = write_shards(tmp_path / "in", [[doc("e1", ""), doc("e2", "  \n"), doc("x", text(20))]])
    both, minhash = str(tmp_path / "both"), str(tmp_path / "minhash")
    deduplicate(DedupConfig(input_path=corpus, output_path=both, workers=1))
    deduplicate(DedupConfig(input_path=corpus, output_path=minhash, mode="minhash", workers=1))
    assert kept_ids(both) == ["e1", "x"]
    assert kept_ids(minhash) == ["e1", "e2", "x"]
    assert stats_of(minhash)["documents_without_shingles"] == 2


def test_short_documents_have_one_ngram_of_all_their_words(tmp_path):
    corpus = write_shards(
        tmp_path / "in", [[doc("s1", "Hello  World"), doc("s2", "hello world"), doc("s3", "world hello")]]
    )
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=corpus, output_path=out, mode="minhash", workers=1))
    assert kept_ids(out) == ["s1", "s3"]


def test_char_ngrams_catch_renamed_identifiers_in_code(tmp_path):
    code = "\n".join(f"def function_{i}(value):\n    return value * {i} + offset_{i}" for i in range(30))
    renamed = code.replace("function_7(", "function_seven(").replace("offset_3", "shift_3")
    other = "\n".join(f"class Thing{i}:\n    size = {i * 13}" for i in range(40))
    corpus = write_shards(
        tmp_path / "in", [[doc("code", code), doc("renamed", renamed), doc("other", other)]]
    )
    out = str(tmp_path / "out")
    deduplicate(
        DedupConfig(
            input_path=corpus, output_path=out, mode="minhash", ngram_unit="char", ngram_size=8, workers=1
        )
    )
    assert kept_ids(out) == ["code", "other"]


def test_fsspec_paths_work(corpus):
    # memory:// is per process, hence one worker; the same code path serves s3:// and gs://.
    out = f"memory://dedup-{uuid.uuid4().hex}/out"
    deduplicate(DedupConfig(input_path=corpus, output_path=out, workers=1))
    assert kept_ids(out) == ["a", "b", "n", "c", "d"]


def test_a_document_without_text_is_a_clear_error(tmp_path):
    corpus = write_shards(tmp_path / "in", [[doc("ok", "fine"), {"id": "broken", "body": "no text field"}]])
    with pytest.raises(
        ValueError, match=r"shard-00000\.jsonl\.gz, line 2 \(id 'broken'\): field 'text' is missing"
    ):
        deduplicate(DedupConfig(input_path=corpus, output_path=str(tmp_path / "out"), workers=1))


def test_rerunning_into_the_same_output_with_other_parameters_is_refused(corpus, tmp_path):
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=corpus, output_path=out, workers=1))
    with pytest.raises(ValueError, match="other parameters.*threshold"):
        deduplicate(DedupConfig(input_path=corpus, output_path=out, threshold=0.5, workers=1))


@pytest.mark.parametrize(
    "field, value", [("mode", "fuzzy"), ("ngram_unit", "token"), ("ngram_size", 0), ("threshold", 1.5)]
)
def test_bad_config_values_are_rejected(field, value, tmp_path):
    with pytest.raises(ValueError, match=f"DedupConfig.{field}"):
        deduplicate(
            DedupConfig(input_path=str(tmp_path), output_path=str(tmp_path / "out"), **{field: value})
        )
    assert not (tmp_path / "out").exists()


def test_normalisation_ignores_case_and_whitespace_and_optionally_punctuation():
    assert normalize_text("  Hello,\n\tWORLD  ") == "hello, world"
    assert normalize_text("Hello,  World!", strip_punctuation=True) == "hello world"
    assert normalize_text("Hello World", lowercase=False) == "Hello World"


def test_components_label_every_node_with_its_smallest_member():
    rng = np.random.default_rng(0)
    size = 300
    pairs = rng.integers(0, size, size=(200, 2))
    labels = _components(pairs, size)
    # Reference: plain union-find.
    parent = list(range(size))

    def find(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for left, right in pairs.tolist():
        low, high = sorted((find(left), find(right)))
        parent[high] = low
    assert labels.tolist() == [find(node) for node in range(size)]


@pytest.mark.parametrize("unit", ["word", "char"])
def test_lone_surrogates_from_json_escapes_do_not_break_hashing(tmp_path, unit):
    # JSON may escape a lone surrogate ("\\ud800"); json.loads returns it in the str, which
    # strict UTF-8 encoding refuses. The copy is removed, so only hashing sees it here.
    clean = text(30)
    odd = changed(clean, [100], "\ud800")
    (tmp_path / "in").mkdir()
    with gzip.open(tmp_path / "in" / "shard-00000.jsonl.gz", "wt", encoding="utf-8") as handle:
        for document in (doc("clean", clean), doc("odd", odd)):
            handle.write(json.dumps(document) + "\n")  # ensure_ascii: the surrogate stays escaped
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=str(tmp_path / "in"), output_path=out, ngram_unit=unit, workers=1))
    assert kept_ids(out) == ["clean"]


@pytest.mark.parametrize("mode", ["exact", "minhash", "both"])
def test_shards_without_documents_give_empty_output_shards(tmp_path, mode):
    # (Input without any document is refused: tests/operations/test_bad_data_input.py.)
    corpus = write_shards(tmp_path / "in", [[], [doc("only", "a few words")], []])
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=corpus, output_path=out, mode=mode, workers=1))
    assert len(list_shards(out)) == 3
    assert kept_ids(out) == ["only"]
    stats = stats_of(out)
    assert (stats["documents_in"], stats["documents_out"], stats["clusters"]) == (1, 1, 0)


def test_an_input_shard_changed_between_passes_is_a_clear_error(corpus, tmp_path):
    out = str(tmp_path / "out")
    config = DedupConfig(input_path=corpus, output_path=out, workers=1)
    deduplicate(config)
    write_shards(tmp_path / "in", [CORPUS[0], [*CORPUS[1], doc("late", text(40))], CORPUS[2]])
    os.remove(os.path.join(out, "shard-00001.jsonl.gz"))
    with pytest.raises(ValueError, match=r"shard-00001\.jsonl\.gz has 3 documents now but had 2"):
        deduplicate(config)
