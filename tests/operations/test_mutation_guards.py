"""Tests that each catch one deliberate bug in the data operations (see docs/testing.md).

- dedup ignoring `lowercase` (always or never lowercasing, in exact and MinHash modes);
- the duplicate-line filter ignoring `min_line_chars` (or off by one at the boundary);
- tokenize rebuilding caches that are already finished (the builder must not even be
  called; the split documents are not rewritten either).

Each was checked by putting the bug in by hand and watching the test fail. All run in
one process (`workers=1`) and without Levanter, so mutation testing can afford them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import string

import pytest

import operations.dedup as dedup_module
import operations.tokenize as tokenize_module
from operations.dedup import DedupConfig, deduplicate
from operations.filter import (
    C4,
    RULES,
    AlphanumericRatio,
    FilterConfig,
    FineWeb,
    Gopher,
    GopherRepetition,
    MaxDuplicateLineFraction,
    MaxLength,
    MaxLineLength,
    MinLength,
    RuleConfig,
    SymbolRatio,
    _sample_key,
    filter_documents,
    filter_shard,
    make_rule,
    regex_word_tokenizer,
)
from operations.shards import iter_documents, list_shards, shard_name, write_documents
from operations.tokenize import TokenizeConfig, build_caches, cache_finished


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


def test_only_pending_splits_are_built_validation_first(tmp_path):
    documents = [{"id": f"doc-{i}", "text": prose(i, 5)} for i in range(40)]
    source = write_corpus(tmp_path / "in", documents, shards=2)
    config = TokenizeConfig(source, "unused", str(tmp_path / "out"), validation_fraction=0.3)
    built: list[tuple[str, int]] = []

    def build(split, split_source, cache_dir):
        rows = sum(1 for _ in split_source)
        built.append((split, rows))
        os.makedirs(cache_dir, exist_ok=True)
        with open(os.path.join(cache_dir, "shard_ledger.json"), "w") as handle:
            json.dump({"is_finished": True, "total_num_rows": rows}, handle)

    tokenize_module._build_splits(config, ["validation", "train"], build)
    assert [split for split, _ in built] == ["validation", "train"]
    assert sum(rows for _, rows in built) == 40 and all(rows > 0 for _, rows in built)
    built.clear()
    tokenize_module._build_splits(config, ["train"], build)
    assert [split for split, _ in built] == ["train"]


# -- filter: rule boundaries, counters and samples -----------------------------------------------


def test_simple_rules_at_their_boundaries():
    assert MinLength(min_chars=5).check({"text": "  abcd  "}) == "too_short"
    assert MinLength(min_chars=5).check({"text": " abcde "}) is None
    assert MaxLength(max_chars=5).check({"text": "abcde"}) is None
    assert MaxLength(max_chars=5).check({"text": "abcdef"}) == "too_long"
    assert MaxLineLength(max_chars=3).check({"text": "abc\nab"}) is None
    assert MaxLineLength(max_chars=3).check({"text": "ab\nabcd"}) == "long_line"
    assert MaxLineLength(max_chars=3).check({"text": ""}) is None
    # One symbol (a snowman) among three characters: 1/3.
    assert SymbolRatio(max_ratio=0.4).check({"text": "a b ☃"}) is None
    assert SymbolRatio(max_ratio=0.3).check({"text": "a b ☃"}) == "high_symbol_ratio"
    assert SymbolRatio(max_ratio=0.3).check({"text": " \n "}) == "empty"
    assert AlphanumericRatio(min_ratio=0.5).check({"text": "ab !?"}) is None  # 2 of 4
    assert AlphanumericRatio(min_ratio=0.6).check({"text": "ab !?"}) == "low_alphanumeric_ratio"
    # Lines A A B C: one duplicate of four lines.
    assert MaxDuplicateLineFraction(max_fraction=0.3).check({"text": "A\nA\nB\nC"}) is None
    assert MaxDuplicateLineFraction(max_fraction=0.2).check({"text": "A\nA\nB\nC"}) == "duplicate_lines"


def test_rules_are_made_by_their_registered_names():
    assert make_rule("min_length", min_chars=3) == MinLength(min_chars=3)
    assert RULES["max_duplicate_line_fraction"] is MaxDuplicateLineFraction
    with pytest.raises(ValueError, match=r"unknown filter rule 'nope'; known rules: .*min_length"):
        make_rule("nope")


def test_a_rule_that_is_not_registered_is_refused_listing_the_known_ones(tmp_path):
    config = FilterConfig(str(tmp_path), str(tmp_path / "out"), (MinLength(min_chars=1), "min_length"))
    with pytest.raises(ValueError) as refused:
        filter_documents(config)
    assert str(refused.value).startswith(
        "FilterConfig.rules[1] is 'min_length', not a registered rule; use one of alphanumeric_ratio, c4,"
    )


NON_DEFAULTS = {
    "min_doc_words": 7,
    "max_doc_words": 700,
    "min_avg_word_length": 2,
    "max_avg_word_length": 12,
    "max_symbol_word_ratio": 0.33,
    "max_bullet_lines_ratio": 0.44,
    "max_ellipsis_lines_ratio": 0.55,
    "max_non_alpha_words_ratio": 0.66,
    "min_stop_words": 4,
    "stop_words": ("le", "la"),
    "dup_line_frac": 0.11,
    "dup_para_frac": 0.12,
    "dup_line_char_frac": 0.13,
    "dup_para_char_frac": 0.14,
    "top_n_grams": ((2, 0.3),),
    "dup_n_grams": ((5, 0.2),),
    "split_paragraph": False,
    "remove_citations": False,
    "filter_no_terminal_punct": False,
    "min_num_sentences": 9,
    "min_words_per_line": 8,
    "max_word_length": 77,
    "filter_lorem_ipsum": False,
    "filter_javascript": False,
    "filter_curly_bracket": False,
    "filter_policy": False,
    "line_punct_thr": 0.21,
    "line_punct_exclude_zero": True,
    "stop_chars": ("!",),
    "short_line_thr": 0.5,
    "short_line_length": 40,
    "char_duplicates_ratio": 0.02,
    "new_line_ratio": 0.4,
}
BLOCK_ATTRIBUTE = {"short_line_thr": "short_line_threshold"}


@pytest.mark.parametrize("rule_class", [Gopher, GopherRepetition, C4, FineWeb], ids=lambda c: c.__name__)
def test_datatrove_rules_pass_every_field_to_their_block(rule_class):
    fields = {f.name: NON_DEFAULTS[f.name] for f in dataclasses.fields(rule_class) if f.name in NON_DEFAULTS}
    block = rule_class(**fields).block()
    for name, value in fields.items():
        got = getattr(block, BLOCK_ATTRIBUTE.get(name, name))
        if isinstance(value, tuple):
            assert sorted(map(repr, got)) == sorted(map(repr, value)), name
        else:
            assert got == value, name
    assert block.language is regex_word_tokenizer()


def test_datatrove_rules_report_the_blocks_reason_and_keep_ids_and_metadata():
    seen = {}

    class Spy:
        def filter(self, doc):
            seen.update(id=doc.id, metadata=doc.metadata, text=doc.text)
            doc.text = "rewritten"
            return False, "spy_reason"

    rule = C4()
    rule_block = rule.block
    try:
        object.__setattr__(rule, "block", lambda: Spy())
        check = rule.build()
    finally:
        object.__setattr__(rule, "block", rule_block)
    document = {"id": 17, "text": "some text", "metadata": {"lang": "en"}}
    assert check(document) == "spy_reason"
    assert seen == {"id": "17", "metadata": {"lang": "en"}, "text": "some text"}
    assert document["text"] == "some text"  # dropped: not rewritten
    assert check({"id": 1, "text": "  \n "}) == "empty"


def test_filter_stats_count_every_document_character_and_rule(tmp_path):
    documents = [
        {"id": "short", "text": "abc"},
        {"id": "long", "text": "x" * 50},
        {"id": "ok-1", "text": "hello world"},
        {"id": "ok-2", "text": "hello again"},
    ]
    source = write_corpus(tmp_path / "in", documents, shards=2)
    out = str(tmp_path / "out")
    filter_documents(
        FilterConfig(
            source, out, (MinLength(min_chars=5), MaxLength(max_chars=20)), sample_dropped=0, workers=1
        )
    )
    result = stats(out)
    assert result["documents"] == {"input": 4, "kept": 2, "dropped": 2}
    assert result["chars"] == {"input": 3 + 50 + 11 + 11, "kept": 22}
    assert result["rules"] == {
        "min_length": {"checked": 4, "dropped": 1, "passed": 3, "reasons": {"too_short": 1}},
        "max_length": {"checked": 3, "dropped": 1, "passed": 2, "reasons": {"too_long": 1}},
    }
    assert result["rule_order"] == ["min_length", "max_length"]
    assert result["dropped_samples"] == []
    assert result["shards"] == 2


def test_dropped_samples_are_the_smallest_id_hashes_per_rule(tmp_path):
    documents = [{"id": f"doc-{i}", "text": "x"} for i in range(30)]
    # (One document kept: a filter that keeps nothing fails.)
    source = write_corpus(tmp_path / "in", [*documents, {"id": "kept", "text": "long enough"}], shards=3)
    out = str(tmp_path / "out")
    filter_documents(
        FilterConfig(source, out, (MinLength(min_chars=5),), sample_dropped=4, excerpt_chars=1, workers=1)
    )
    expected = sorted((d["id"] for d in documents), key=lambda i: (_sample_key(i), i))[:4]
    samples = stats(out)["dropped_samples"]
    assert [s["id"] for s in samples] == expected
    assert samples[0] == {
        "id": expected[0],
        "rule": "min_length",
        "reason": "too_short",
        "chars": 1,
        "excerpt": "x",
    }
    one = str(tmp_path / "one")
    filter_documents(FilterConfig(source, one, (MinLength(min_chars=5),), sample_dropped=1, workers=1))
    assert [s["id"] for s in stats(one)["dropped_samples"]] == expected[:1]


def test_negative_sample_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="FilterConfig.sample_dropped and excerpt_chars must be >= 0"):
        filter_documents(
            FilterConfig(str(tmp_path), str(tmp_path / "o"), (MinLength(min_chars=1),), sample_dropped=-1)
        )
    with pytest.raises(ValueError, match="FilterConfig.sample_dropped and excerpt_chars must be >= 0"):
        filter_documents(
            FilterConfig(str(tmp_path), str(tmp_path / "o"), (MinLength(min_chars=1),), excerpt_chars=-1)
        )


# -- dedup: stable hashes, exact stats, config checks ---------------------------------------------


def test_dedup_hashes_are_pinned_so_they_stay_stable_across_machines_and_versions():
    # The module promises hashes that never change (splitmix64 seeds, xxh3, fmix64): a
    # change would silently make old signatures incomparable with new ones.
    assert dedup_module._splitmix64(1, 3).tolist() == [
        10451216379200822465,
        13757245211066428519,
        17911839290282890590,
    ]
    hashers = dedup_module._hashers(7, 4, 3, 2)
    elements, lengths = dedup_module._element_hashes(["the quick brown fox jumps", "a b", ""], "word")
    shingles, per_document = dedup_module._shingles(elements, lengths, hashers)
    assert per_document.tolist() == [3, 1, 0]
    signatures = dedup_module._minhash(shingles, per_document, hashers)
    assert signatures.tolist() == [
        [627373554, 1963852143, 541027824, 690828579],
        [3658039648, 1850531247, 3475853225, 1707494939],
        [4294967295, 4294967295, 4294967295, 4294967295],  # no n-gram: all ones
    ]
    assert dedup_module._band_keys(signatures, 2, hashers).tolist() == [
        [7185002283466490969, 2387674593592750615],
        [12418262825299717843, 12903820808263721070],
        [17211848508895344295, 17211848508895344295],
    ]
    chars, counts = dedup_module._element_hashes(["abcd"], "char")
    assert (chars.tolist(), counts.tolist()) == (
        [7275543674780155111, 13527760077872400236, 8863970338344601496, 11708782123065626145],
        [4],
    )


def test_dedup_stats_count_clusters_pairs_and_name_the_shard_files(tmp_path):
    base = prose(3)
    documents = [
        {"id": "a", "text": base},
        {"id": "a-copy", "text": base.upper()},
        {"id": "b", "text": prose(4)},
        {"id": "b-near", "text": prose(4) + " tail"},
    ]
    source = write_corpus(tmp_path / "in", documents, shards=2)
    out = str(tmp_path / "out")
    deduplicate(DedupConfig(input_path=source, output_path=out, threshold=0.5, workers=1))
    result = stats(out)
    assert kept(out) == ["a", "b"]
    assert result["documents_in"] == 4 and result["documents_out"] == 2
    assert (result["exact_duplicates_removed"], result["near_duplicates_removed"]) == (1, 1)
    assert (result["clusters"], result["largest_cluster"], result["documents_in_clusters"]) == (2, 2, 4)
    assert (
        result["verified_pairs"] >= 1
        and result["candidate_pairs"] == result["verified_pairs"] + result["rejected_pairs"]
    )
    assert result["shards"] == 2 and result["documents_without_shingles"] == 0
    files = {(pair["removed"]["id"], pair["removed"]["shard_file"]) for pair in result["sample_pairs"]}
    assert files == {("a-copy", "shard-00001.jsonl.gz"), ("b-near", "shard-00001.jsonl.gz")}
    assert result["parameters"]["num_perm"] == 200 and result["parameters"]["lsh_threshold"] == round(
        0.05**0.1, 4
    )


def test_dedup_config_checks_name_the_field():
    DedupConfig(
        input_path="x", output_path="y", ngram_size=1, num_bands=1, rows_per_band=1, threshold=0.0
    ).validate()
    DedupConfig(input_path="x", output_path="y", threshold=1.0, sample_pairs=0).validate()
    cases = {
        "mode": ("mode", "nope", "DedupConfig.mode: got 'nope'; use 'exact', 'minhash' or 'both'"),
        "ngram_unit": ("ngram_unit", "line", "DedupConfig.ngram_unit: got 'line'; use 'word' or 'char'"),
        "ngram_size": ("ngram_size", 0, "DedupConfig.ngram_size: must be a positive integer, got 0"),
        "float": ("num_bands", 2.0, "DedupConfig.num_bands: must be a positive integer, got 2.0"),
        "threshold": ("threshold", 1.5, "DedupConfig.threshold: must be between 0 and 1, got 1.5"),
        "negative": ("threshold", -0.1, "DedupConfig.threshold: must be between 0 and 1, got -0.1"),
        "samples": ("sample_pairs", -1, "DedupConfig.sample_pairs: must be >= 0, got -1"),
    }
    for field, value, message in cases.values():
        with pytest.raises(ValueError) as refused:
            DedupConfig(input_path="x", output_path="y", **{field: value}).validate()
        assert str(refused.value) == message


def test_rule_classes_register_under_their_name_once():
    try:

        @dataclasses.dataclass(frozen=True)
        class Shouting(RuleConfig, name="test_shouting"):
            def check(self, document):
                text = document["text"]
                document["text"] = text.upper()
                return None

        assert Shouting.rule_name == "test_shouting"
        assert RULES["test_shouting"] is Shouting
        with pytest.raises(ValueError, match="rule name 'test_shouting' is registered twice"):

            class Again(RuleConfig, name="test_shouting"):
                pass

    finally:
        RULES.pop("test_shouting", None)


def test_rewrites_are_counted_only_when_the_text_changes(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class Copying(RuleConfig):
        rule_name = "test_copying"

        def check(self, document):
            document["text"] = "".join(list(document["text"]))  # a new, equal string
            return None

    @dataclasses.dataclass(frozen=True)
    class Upper(RuleConfig):
        rule_name = "test_upper"

        def check(self, document):
            document["text"] = document["text"].upper()
            return None

    source = write_corpus(tmp_path / "in", [{"id": "a", "text": "abc"}, {"id": "b", "text": "DEF"}])
    shard = list_shards(source)[0]
    copying = filter_shard(FilterConfig(source, "", (Copying(),)), shard, str(tmp_path / "c.jsonl.gz"))
    assert "rewritten" not in copying["rules"]["test_copying"]
    upper = filter_shard(FilterConfig(source, "", (Upper(),)), shard, str(tmp_path / "u.jsonl.gz"))
    assert upper["rules"]["test_upper"]["rewritten"] == 1
    assert [d["text"] for d in iter_documents(str(tmp_path / "u.jsonl.gz"))] == ["ABC", "DEF"]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            ["not", "an", "object"],
            '{shard}, line 1: a JSON list, not a document object ({{"id": ..., "text": ...}}); fix or remove the '
            "line, or make the shards with operations.documents (it skips and counts records without text)",
        ),
        (
            {"id": "x", "text": 5},
            "{shard}, line 1 (id 'x'): field 'text' must be a string, got int; fix the shard, or make the "
            "shards with operations.documents, which skips and counts such records",
        ),
        (
            {"text": "t"},
            "{shard}, line 1: missing field 'id'; every document needs one -- fix the shard, or make the "
            "shards with operations.documents, which skips and counts such records",
        ),
    ],
    ids=lambda value: "case",
)
def test_malformed_documents_are_refused_naming_shard_and_position(tmp_path, document, message):
    source = write_corpus(tmp_path / "in", [document])
    shard = list_shards(source)[0]
    with pytest.raises(ValueError) as refused:
        filter_shard(FilterConfig(source, "", (MinLength(min_chars=1),)), shard, str(tmp_path / "o.jsonl.gz"))
    assert str(refused.value) == message.format(shard=shard)


# -- tokenize: reading shards, the forced validation document, config checks ---------------------


def split_texts(config: TokenizeConfig) -> dict[str, list[str]]:
    return {
        split: [row[config.text_field] for row in tokenize_module.split_source(config, split)]
        for split in ("train", "validation")
    }


def test_plain_and_gzip_shards_are_split_alike(tmp_path):
    documents = [{"id": f"d{i}", "body": f"text {i}"} for i in range(30)]
    write_documents(str(tmp_path / "plain" / "shard-00000.jsonl"), documents)
    write_documents(str(tmp_path / "gz" / "shard-00000.jsonl.gz"), documents)
    plain = TokenizeConfig(
        str(tmp_path / "plain"), "unused", str(tmp_path / "o1"), validation_fraction=0.3, text_field="body"
    )
    gz = TokenizeConfig(
        str(tmp_path / "gz"), "unused", str(tmp_path / "o2"), validation_fraction=0.3, text_field="body"
    )
    assert split_texts(plain) == split_texts(gz)
    assert sorted(split_texts(plain)["train"] + split_texts(plain)["validation"]) == sorted(
        d["body"] for d in documents
    )


def test_zstd_shards_are_split_too(tmp_path):
    write_documents(str(tmp_path / "zst" / "shard-00000.jsonl.zst"), [{"id": "a", "text": "hello"}])
    config = TokenizeConfig(str(tmp_path / "zst"), "unused", str(tmp_path / "o"), validation_fraction=0.5)
    assert sum(len(v) for v in split_texts(config).values()) == 1


def test_a_tiny_corpus_gets_one_forced_validation_document_built_once(tmp_path):
    documents = [{"id": f"doc-{i}", "text": f"text {i}"} for i in range(3)]
    source = write_corpus(tmp_path / "in", documents)
    config = TokenizeConfig(source, "unused", str(tmp_path / "out"), validation_fraction=0.0001)
    built: list[tuple[str, int]] = []

    def build(split, split_source, cache_dir):
        rows = sum(1 for _ in split_source)
        built.append((split, rows))
        os.makedirs(cache_dir, exist_ok=True)
        with open(os.path.join(cache_dir, "shard_ledger.json"), "w") as handle:
            json.dump({"is_finished": True, "total_num_rows": rows}, handle)

    tokenize_module._build_splits(config, ["validation", "train"], build)
    assert built == [("validation", 0), ("validation", 1), ("train", 2)]
    built.clear()
    tokenize_module._build_splits(config, ["train"], build)  # validation already holds the forced one
    assert built == [("train", 2)]


def test_tokenize_config_checks_name_the_field(tmp_path):
    with pytest.raises(ValueError) as refused:
        tokenize_module._check(TokenizeConfig("in", "tok", "out", validation_fraction=0.0))
    assert str(refused.value) == (
        "TokenizeConfig.validation_fraction=0.0: must be in (0, 1) (training needs documents in both splits)"
    )
    with pytest.raises(
        ValueError, match=r"TokenizeConfig.builder='gpu': must be one of auto, ray, in_process"
    ):
        tokenize_module._check(TokenizeConfig("in", "tok", "out", builder="gpu"))
    with pytest.raises(ValueError, match=r"TokenizeConfig.num_shard_groups=0: must be >= 1 or None"):
        tokenize_module._check(TokenizeConfig("in", "tok", "out", num_shard_groups=0))
