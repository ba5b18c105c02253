"""Tests that each catch one deliberate bug in the data operations (see docs/testing.md).

- dedup ignoring `lowercase` (always or never lowercasing, in exact and MinHash modes);
- the duplicate-line filter ignoring `min_line_chars` (or off by one at the boundary);
- tokenize rebuilding caches that are already finished (the builder must not even be
  called; the split documents are not rewritten either).

Each was checked by putting the bug in by hand and watching the test fail. All run in
one process (`workers=1`) and without Levanter, so mutation testing can afford them.
"""

from __future__ import annotations

import json
import os
import random
import string

import pytest

import operations.tokenize as tokenize_module
from operations.dedup import DedupConfig, deduplicate
from operations.filter import FilterConfig, MaxDuplicateLineFraction, filter_documents
from operations.shards import iter_documents, list_shards, shard_name, write_documents
from operations.tokenize import TokenizeConfig, build_caches, cache_finished, split_documents


def prose(seed: int, count: int = 120) -> str:
    rng = random.Random(seed)
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=7)) for _ in range(count))


def write_corpus(directory, documents: list[dict], shards: int = 1) -> str:
    for index in range(shards):
        write_documents(os.path.join(directory, shard_name(index)), documents[index::shards])
    return str(directory)


def kept(output_path: str) -> list[str]:
    return sorted(document["id"] for document in iter_documents(output_path))


def stats(output_path: str) -> dict:
    with open(os.path.join(output_path, "stats.json")) as handle:
        return json.load(handle)


# -- dedup: lowercase ----------------------------------------------------------------------

BODY = prose(1)
CASED_CORPUS = [
    {"id": "lower", "text": BODY},
    {"id": "upper", "text": BODY.upper()},
    {"id": "title", "text": BODY.title()},
    {"id": "other", "text": prose(2)},
]


@pytest.mark.parametrize("mode", ["exact", "minhash", "both"])
def test_dedup_lowercase_true_treats_case_variants_as_duplicates(tmp_path, mode):
    source = write_corpus(tmp_path / "in", CASED_CORPUS)
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=source, output_path=out, mode=mode, lowercase=True, workers=1))
    assert kept(out) == ["lower", "other"]
    assert stats(out)["documents_removed"] == 2


@pytest.mark.parametrize("mode", ["exact", "minhash", "both"])
def test_dedup_lowercase_false_keeps_case_variants_apart(tmp_path, mode):
    source = write_corpus(tmp_path / "in", CASED_CORPUS)
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=source, output_path=out, mode=mode, lowercase=False, workers=1))
    assert kept(out) == ["lower", "other", "title", "upper"]
    assert stats(out)["documents_removed"] == 0
    assert stats(out)["parameters"]["lowercase"] is False


def test_dedup_lowercase_is_the_default(tmp_path):
    source = write_corpus(tmp_path / "in", CASED_CORPUS)
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=source, output_path=out, workers=1))
    assert kept(out) == ["lower", "other"]


def test_dedup_refuses_to_resume_with_another_lowercase_setting(tmp_path):
    source = write_corpus(tmp_path / "in", CASED_CORPUS)
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=source, output_path=out, mode="exact", workers=1))
    with pytest.raises(ValueError, match="lowercase"):
        deduplicate(DedupConfig(input_path=source, output_path=out, mode="exact", lowercase=False, workers=1))


# -- filter: min_line_chars ----------------------------------------------------------------

UNIQUE_LINES = [prose(seed, 8) for seed in range(10)]


def with_repeated_lines(line: str, copies: int) -> str:
    """Ten unique long lines plus `copies` copies of `line`: the copies are most of the lines."""
    return "\n".join(UNIQUE_LINES + [line] * copies)


@pytest.mark.parametrize(
    ("min_line_chars", "dropped"),
    [(1, True), (4, True), (5, False), (50, False)],
    ids=["all-lines", "boundary-counts", "just-above", "only-long-lines"],
)
def test_min_line_chars_decides_which_repeated_lines_count(min_line_chars, dropped):
    # "}  }" is 4 characters after stripping: it counts when min_line_chars <= 4.
    document = {"id": "d", "text": with_repeated_lines("  }  }  ", 30)}
    rule = MaxDuplicateLineFraction(max_fraction=0.5, min_line_chars=min_line_chars)
    assert rule.build()(document) == ("duplicate_lines" if dropped else None)


def test_min_line_chars_ignores_short_lines_when_counting_the_fraction():
    # 10 unique long lines, 4 copies of a long line (3 duplicates), 20 copies of "}".
    text = "\n".join(UNIQUE_LINES + [UNIQUE_LINES[0]] * 3 + ["}"] * 20)
    counted = MaxDuplicateLineFraction(max_fraction=3 / 13 - 1e-9, min_line_chars=2)
    assert counted.build()({"id": "d", "text": text}) == "duplicate_lines"  # 3 of 13 long lines
    lenient = MaxDuplicateLineFraction(max_fraction=3 / 13 + 1e-9, min_line_chars=2)
    assert lenient.build()({"id": "d", "text": text}) is None


def test_filter_documents_honours_min_line_chars(tmp_path):
    documents = [
        {"id": "braces", "text": with_repeated_lines("}", 30)},
        {"id": "repeats", "text": with_repeated_lines("the same long line again and again", 30)},
        {"id": "clean", "text": "\n".join(UNIQUE_LINES)},
    ]
    source = write_corpus(tmp_path / "in", documents)
    strict, lenient = str(tmp_path / "strict"), str(tmp_path / "lenient")
    filter_documents(
        FilterConfig(
            source, strict, (MaxDuplicateLineFraction(max_fraction=0.5, min_line_chars=1),), workers=1
        )
    )
    filter_documents(
        FilterConfig(
            source, lenient, (MaxDuplicateLineFraction(max_fraction=0.5, min_line_chars=3),), workers=1
        )
    )
    assert kept(strict) == ["clean"]
    assert kept(lenient) == ["braces", "clean"]
    assert stats(lenient)["rule_configs"][0]["min_line_chars"] == 3


def test_min_line_chars_zero_still_ignores_blank_lines():
    text = "\n".join(UNIQUE_LINES + [""] * 40 + ["   "] * 40)
    rule = MaxDuplicateLineFraction(max_fraction=0.1, min_line_chars=0)
    assert rule.build()({"id": "d", "text": text}) is None


# -- tokenize: finished caches are never rebuilt ----------------------------------------------


def finish(cache_dir: str, finished: bool = True) -> str:
    os.makedirs(cache_dir, exist_ok=True)
    ledger = os.path.join(cache_dir, "shard_ledger.json")
    with open(ledger, "w") as handle:
        json.dump({"is_finished": finished, "total_num_rows": 1, "shard_rows": {}}, handle)
    return ledger


@pytest.fixture
def builders(monkeypatch):
    """Replace both cache builders by recorders: {"in_process": [pending], "ray": [pending]}."""
    calls: dict[str, list[list[str]]] = {"in_process": [], "ray": []}
    monkeypatch.setattr(
        tokenize_module, "_build_in_process", lambda config, pending: calls["in_process"].append(pending)
    )
    monkeypatch.setattr(
        tokenize_module, "_build_with_ray", lambda config, pending: calls["ray"].append(pending)
    )
    monkeypatch.setattr(tokenize_module, "ray_connected", lambda: False)
    return calls


@pytest.mark.parametrize("builder", ["auto", "in_process", "ray"])
def test_finished_caches_are_not_rebuilt(tmp_path, builders, builder):
    out = str(tmp_path / "out")
    ledgers = [finish(os.path.join(out, split)) for split in ("train", "validation")]
    before = [(os.stat(path).st_ino, os.stat(path).st_mtime_ns) for path in ledgers]

    build_caches(TokenizeConfig(str(tmp_path / "in"), "unused", out, builder=builder))

    assert builders == {"in_process": [], "ray": []}
    assert [(os.stat(path).st_ino, os.stat(path).st_mtime_ns) for path in ledgers] == before


def test_only_the_unfinished_cache_is_built(tmp_path, builders):
    out = str(tmp_path / "out")
    finish(os.path.join(out, "train"))
    finish(os.path.join(out, "validation"), finished=False)
    build_caches(TokenizeConfig(str(tmp_path / "in"), "unused", out, builder="in_process"))
    assert builders == {"in_process": [["validation"]], "ray": []}


def test_missing_caches_are_built_with_the_chosen_builder(tmp_path, builders):
    out = str(tmp_path / "out")
    build_caches(TokenizeConfig(str(tmp_path / "in"), "unused", out, builder="ray"))
    build_caches(TokenizeConfig(str(tmp_path / "in"), "unused", out, builder="in_process"))
    assert builders == {"in_process": [["train", "validation"]], "ray": [["train", "validation"]]}


def test_auto_builder_uses_ray_only_when_connected(tmp_path, builders, monkeypatch):
    out = str(tmp_path / "out")
    build_caches(TokenizeConfig(str(tmp_path / "in"), "unused", out))
    monkeypatch.setattr(tokenize_module, "ray_connected", lambda: True)
    build_caches(TokenizeConfig(str(tmp_path / "in"), "unused", out))
    assert builders == {"in_process": [["train", "validation"]], "ray": [["train", "validation"]]}


def test_cache_finished_reads_the_ledger(tmp_path):
    assert not cache_finished(str(tmp_path / "absent"))
    assert not cache_finished(os.path.dirname(finish(str(tmp_path / "unfinished"), finished=False)))
    assert cache_finished(os.path.dirname(finish(str(tmp_path / "finished"))))


def test_a_second_split_rewrites_no_document_shard(tmp_path):
    documents = [{"id": f"doc-{i}", "text": prose(i, 20)} for i in range(40)]
    source = write_corpus(tmp_path / "in", documents, shards=2)
    config = TokenizeConfig(source, "unused", str(tmp_path / "out"), validation_fraction=0.2, workers=1)
    first = split_documents(config)
    shards = [
        path
        for split in ("train", "validation")
        for path in list_shards(os.path.join(config.output_path, "documents", split))
    ]
    before = {path: (os.stat(path).st_ino, os.stat(path).st_mtime_ns) for path in shards}
    assert split_documents(config) == first
    assert {path: (os.stat(path).st_ino, os.stat(path).st_mtime_ns) for path in shards} == before
