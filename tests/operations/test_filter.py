"""Heuristic filters: which documents each rule drops, the counts, the samples, reruns and resumes."""

import dataclasses
import os
import pathlib
import pickle
import sysconfig

import pytest

from executor.fingerprint import canonical_json, encode
from operations.filter import (
    C4,
    AlphanumericRatio,
    FilterConfig,
    FineWeb,
    Gopher,
    GopherRepetition,
    MaxDuplicateLineFraction,
    MaxLength,
    MinLength,
    MinQualityScore,
    SymbolRatio,
    default_code_rules,
    default_web_rules,
    filter_documents,
    make_rule,
)
from operations.shards import iter_documents, list_shards, read_json, write_documents

GOOD_CODE = '''"""Helpers for reading configuration files."""

import json


def load(path):
    """Return the parsed JSON object stored at `path`."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
'''

GOOD_WEB = """The history of the river town is told in the records of its mill, which was built in 1820 by a family of weavers.
For most of the century the mill was the largest employer in the valley, and the town grew up around it.
When the railway arrived in 1870, the owners added a second building and a warehouse beside the station.
The workers lived in rows of stone cottages that still line the road to the old bridge today.
In the early years of the new century, demand for cloth fell and the mill began to lose money.
It closed in 1931, and the buildings stood empty until the council bought them after the war.
Today the main hall is a museum, and the warehouse has been turned into a library and a small theatre.
Visitors can see the looms that were used to weave the cloth, and they can read the letters of the families who worked there.
"""

# Planted junk: id -> text.
JUNK = {
    "empty": "",
    "one-char": "x",
    "huge": ("this line is repeated over and over to make a very large document " * 2 + "\n") * 2_000,
    "symbol-soup": "#$%^&*()!@ {}[]<>~|\\ " * 40,
    "binary": bytes(range(256)).decode("latin-1") * 4,
    "repetitive": "print('hello world')\n" * 200,
}

# Rules for the planted corpus, and which rule (and reason) drops each junk document.
RULES = (
    MinLength(min_chars=10),
    MaxLength(max_chars=50_000),
    SymbolRatio(max_ratio=0.1),
    AlphanumericRatio(min_ratio=0.4),
    MaxDuplicateLineFraction(max_fraction=0.5),
)
EXPECTED_DROPS = {
    "empty": ("min_length", "too_short"),
    "one-char": ("min_length", "too_short"),
    "huge": ("max_length", "too_long"),
    "binary": ("symbol_ratio", "high_symbol_ratio"),
    "symbol-soup": ("alphanumeric_ratio", "low_alphanumeric_ratio"),
    "repetitive": ("max_duplicate_line_fraction", "duplicate_lines"),
}


def doc(doc_id: str, text: str, **metadata) -> dict:
    return {"id": doc_id, "text": text, "source": "test", "metadata": metadata}


def planted_corpus(root: pathlib.Path) -> str:
    """Two shards: good documents and junk interleaved."""
    shard0 = [doc("code-0", GOOD_CODE), doc("empty", JUNK["empty"]), doc("web-0", GOOD_WEB)]
    shard0 += [doc("huge", JUNK["huge"]), doc("symbol-soup", JUNK["symbol-soup"])]
    shard1 = [doc("one-char", JUNK["one-char"]), doc("code-1", GOOD_CODE.replace("load", "read"))]
    shard1 += [doc("binary", JUNK["binary"]), doc("repetitive", JUNK["repetitive"])]
    write_documents(str(root / "shard-00000.jsonl.gz"), shard0)
    write_documents(str(root / "shard-00001.jsonl.gz"), shard1)
    return str(root)


def run(input_path: str, output_path: pathlib.Path, rules=RULES, **kwargs) -> dict:
    filter_documents(FilterConfig(input_path=input_path, output_path=str(output_path), rules=rules, **kwargs))
    return read_json(str(output_path / "stats.json"))


def kept_ids(output_path: pathlib.Path) -> list[str]:
    return [document["id"] for document in iter_documents(str(output_path))]


def shard_bytes(output_path: pathlib.Path) -> dict[str, bytes]:
    return {
        name: (output_path / name).read_bytes()
        for name in sorted(os.listdir(output_path))
        if name.startswith("shard-")
    }


def test_each_planted_junk_document_is_dropped_by_its_rule(tmp_path):
    stats = run(planted_corpus(tmp_path / "in"), tmp_path / "out")
    assert kept_ids(tmp_path / "out") == ["code-0", "web-0", "code-1"]
    dropped = {sample["id"]: (sample["rule"], sample["reason"]) for sample in stats["dropped_samples"]}
    assert dropped == EXPECTED_DROPS


def test_stats_count_documents_and_each_rule(tmp_path):
    stats = run(planted_corpus(tmp_path / "in"), tmp_path / "out")
    assert stats["documents"] == {"input": 9, "kept": 3, "dropped": 6}
    assert stats["shards"] == 2
    assert stats["rule_order"] == [rule.rule_name for rule in RULES]
    # Each rule sees what the rules before it passed.
    assert stats["rules"] == {
        "min_length": {"checked": 9, "dropped": 2, "passed": 7, "reasons": {"too_short": 2}},
        "max_length": {"checked": 7, "dropped": 1, "passed": 6, "reasons": {"too_long": 1}},
        "symbol_ratio": {"checked": 6, "dropped": 1, "passed": 5, "reasons": {"high_symbol_ratio": 1}},
        "alphanumeric_ratio": {
            "checked": 5,
            "dropped": 1,
            "passed": 4,
            "reasons": {"low_alphanumeric_ratio": 1},
        },
        "max_duplicate_line_fraction": {
            "checked": 4,
            "dropped": 1,
            "passed": 3,
            "reasons": {"duplicate_lines": 1},
        },
    }
    kept_chars = len(GOOD_CODE) * 2 + len(GOOD_WEB)
    assert stats["chars"]["kept"] == kept_chars


def test_the_first_rule_in_config_order_drops_the_document(tmp_path):
    rules = (AlphanumericRatio(min_ratio=0.4), MinLength(min_chars=10))
    stats = run(planted_corpus(tmp_path / "in"), tmp_path / "out", rules=rules)
    dropped = {sample["id"]: (sample["rule"], sample["reason"]) for sample in stats["dropped_samples"]}
    assert dropped["empty"] == ("alphanumeric_ratio", "empty")
    assert dropped["one-char"] == ("min_length", "too_short")


def test_dropped_samples_are_bounded_per_rule_and_independent_of_sharding(tmp_path):
    documents = [doc(f"short-{index:03d}", "tiny") for index in range(40)]
    documents += [doc(f"long-{index:03d}", "word " * 30) for index in range(10)]
    documents.append(doc("kept", "word " * 5))  # a filter that keeps nothing fails
    write_documents(str(tmp_path / "one" / "shard-00000.jsonl.gz"), documents)
    for shard in range(4):
        write_documents(str(tmp_path / "four" / f"shard-{shard:05d}.jsonl.gz"), documents[shard::4])
    rules = (MinLength(min_chars=10), MaxLength(max_chars=100))
    one = run(str(tmp_path / "one"), tmp_path / "out-one", rules=rules, sample_dropped=5, excerpt_chars=12)
    four = run(
        str(tmp_path / "four"),
        tmp_path / "out-four",
        rules=rules,
        sample_dropped=5,
        excerpt_chars=12,
        workers=2,
    )
    assert one["dropped_samples"] == four["dropped_samples"]
    assert [sample["rule"] for sample in one["dropped_samples"]] == ["min_length"] * 5 + ["max_length"] * 5
    long_sample = one["dropped_samples"][-1]
    assert long_sample["excerpt"] == "word word wo" and long_sample["chars"] == 150
    assert one["documents"] == four["documents"] == {"input": 51, "kept": 1, "dropped": 50}


def test_rerun_gives_byte_identical_output(tmp_path):
    corpus = planted_corpus(tmp_path / "in")
    run(corpus, tmp_path / "a", workers=1)
    run(corpus, tmp_path / "b", workers=2)
    assert shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b")
    assert (tmp_path / "a" / "stats.json").read_bytes() == (tmp_path / "b" / "stats.json").read_bytes()


def test_rerun_after_a_crash_redoes_only_the_missing_shard(tmp_path):
    corpus = planted_corpus(tmp_path / "in")
    out = tmp_path / "out"
    stats = run(corpus, out)
    before = shard_bytes(out)
    finished = (out / "shard-00000.jsonl.gz").stat().st_mtime_ns
    # A crash before shard 1 finished leaves no output shard and no counters for it.
    (out / "shard-00001.jsonl.gz").unlink()
    (out / ".shard_stats" / "shard-00001.jsonl.gz.json").unlink()
    assert run(corpus, out) == stats
    assert (out / "shard-00000.jsonl.gz").stat().st_mtime_ns == finished
    assert shard_bytes(out) == before


@pytest.mark.parametrize(
    ("rule", "junk", "reason"),
    [
        (Gopher(), "Buy now! Cheap deals. Click here. Best prices.", "gopher_short_doc"),
        (Gopher(), " ".join(["Lorem", "Ipsum", "Dolor"] * 30), "gopher_enough_stop_words"),
        (GopherRepetition(), "Subscribe to our newsletter today.\n\n" * 20, "dup_para_frac"),
        (C4(), GOOD_WEB + "Lorem ipsum dolor sit amet, it is a fine day.\n", "lorem_ipsum"),
        (FineWeb(), "\n".join(f"item number {index}" for index in range(60)), "line_punct_ratio"),
    ],
    ids=["gopher-short", "gopher-no-stop-words", "gopher-repetition", "c4", "fineweb"],
)
def test_datatrove_rule_drops_web_junk_with_datatrove_reason(tmp_path, rule, junk, reason):
    write_documents(str(tmp_path / "in" / "shard-00000.jsonl.gz"), [doc("good", GOOD_WEB), doc("junk", junk)])
    stats = run(str(tmp_path / "in"), tmp_path / "out", rules=(rule,))
    assert kept_ids(tmp_path / "out") == ["good"]
    assert [(s["id"], s["reason"]) for s in stats["dropped_samples"]] == [("junk", reason)]
    assert stats["rules"][rule.rule_name]["reasons"] == {reason: 1}


def test_web_preset_keeps_good_prose_and_drops_code(tmp_path):
    documents = [doc("web", GOOD_WEB), doc("code", GOOD_CODE), doc("empty", "")]
    write_documents(str(tmp_path / "in" / "shard-00000.jsonl.gz"), documents)
    stats = run(str(tmp_path / "in"), tmp_path / "out", rules=default_web_rules())
    assert kept_ids(tmp_path / "out") == ["web"]
    assert stats["documents"]["dropped"] == 2


def test_c4_keeps_only_the_lines_that_pass_in_a_kept_document(tmp_path):
    text = GOOD_WEB + "Click here\nShare on social media\n"
    write_documents(str(tmp_path / "in" / "shard-00000.jsonl.gz"), [doc("page", text)])
    stats = run(str(tmp_path / "in"), tmp_path / "out", rules=(C4(),))
    [kept] = list(iter_documents(str(tmp_path / "out")))
    assert kept["text"] == GOOD_WEB.strip()
    assert stats["rules"]["c4"]["rewritten"] == 1
    run(str(tmp_path / "in"), tmp_path / "same", rules=(C4(rewrite_text=False),))
    assert [d["text"] for d in iter_documents(str(tmp_path / "same"))] == [text]


def stdlib_files(count: int) -> list[pathlib.Path]:
    """`count` .py files spread evenly over the sorted standard library."""
    root = pathlib.Path(sysconfig.get_path("stdlib"))
    files = sorted(path for path in root.rglob("*.py") if "site-packages" not in path.parts)
    return files[:: len(files) // count][:count]


def test_code_preset_keeps_ordinary_stdlib_files(tmp_path):
    root = pathlib.Path(sysconfig.get_path("stdlib"))
    files = stdlib_files(50)
    documents = [
        doc(str(path.relative_to(root)), path.read_text(encoding="utf-8", errors="replace")) for path in files
    ]
    write_documents(str(tmp_path / "in" / "shard-00000.jsonl.gz"), documents)
    stats = run(str(tmp_path / "in"), tmp_path / "out", rules=default_code_rules())
    kept = stats["documents"]["kept"] / stats["documents"]["input"]
    print(
        f"code preset kept {stats['documents']['kept']}/{stats['documents']['input']} stdlib files ({kept:.0%})"
    )
    assert kept >= 0.9, stats["dropped_samples"]


def test_code_preset_drops_planted_junk(tmp_path):
    junk = [doc(doc_id, text) for doc_id, text in JUNK.items() if doc_id != "huge"]
    junk.append(doc("minified", "var a=1;" * 1_000))
    junk.append(doc("huge", ("x = 1\n" + "y = 2 " * 100 + "\n") * 2_000))
    write_documents(str(tmp_path / "in" / "shard-00000.jsonl.gz"), [doc("code", GOOD_CODE), *junk])
    stats = run(str(tmp_path / "in"), tmp_path / "out", rules=default_code_rules())
    assert kept_ids(tmp_path / "out") == ["code"]
    assert {s["id"]: s["reason"] for s in stats["dropped_samples"]} == {
        "empty": "too_short",
        "one-char": "too_short",
        "huge": "too_long",
        "minified": "long_line",
        "binary": "high_symbol_ratio",
        "symbol-soup": "low_alphanumeric_ratio",
        "repetitive": "duplicate_lines",
    }


def test_min_quality_score_keeps_scores_at_or_above_the_threshold(tmp_path):
    documents = [doc("low", "text", quality_score=0.2), doc("edge", "text", quality_score=0.5)]
    documents.append(doc("high", "text", quality_score=0.9))
    write_documents(str(tmp_path / "in" / "shard-00000.jsonl.gz"), documents)
    stats = run(str(tmp_path / "in"), tmp_path / "out", rules=(MinQualityScore(min_score=0.5),))
    assert kept_ids(tmp_path / "out") == ["edge", "high"]
    assert stats["rules"]["min_quality_score"]["reasons"] == {"low_quality_score": 1}


def test_missing_quality_score_names_the_file_and_the_fix(tmp_path):
    write_documents(str(tmp_path / "in" / "shard-00000.jsonl.gz"), [doc("unscored", "text")])
    with pytest.raises(ValueError, match=r"shard-00000.jsonl.gz, line 1.*'quality_score'.*score_quality"):
        run(str(tmp_path / "in"), tmp_path / "out", rules=(MinQualityScore(min_score=0.5),))


def test_non_string_text_names_the_file_and_the_field(tmp_path):
    write_documents(str(tmp_path / "in" / "shard-00000.jsonl.gz"), [{"id": "a", "text": None}])
    with pytest.raises(ValueError, match=r"shard-00000.jsonl.gz, line 1 \(id 'a'\): field 'text'"):
        run(str(tmp_path / "in"), tmp_path / "out")
    assert not (tmp_path / "out" / "shard-00000.jsonl.gz").exists()


def test_rules_are_registered_by_name():
    assert make_rule("min_length", min_chars=5) == MinLength(min_chars=5)
    with pytest.raises(ValueError, match="unknown filter rule 'nope'; known rules: .*min_length"):
        make_rule("nope")


def test_a_rule_used_twice_is_refused(tmp_path):
    with pytest.raises(ValueError, match="min_length more than once"):
        run(str(tmp_path), tmp_path / "out", rules=(MinLength(min_chars=1), MinLength(min_chars=2)))


def test_configs_pickle_and_encode_for_versioning():
    config = FilterConfig(
        input_path="in", output_path="out", rules=default_web_rules() + default_code_rules()[3:]
    )
    assert pickle.loads(pickle.dumps(config)) == config
    encoded = canonical_json(encode(config))
    assert '"__type__":"GopherRepetition"' in encoded.replace(" ", "")
    changed = dataclasses.replace(config, rules=(Gopher(min_doc_words=10),))
    assert canonical_json(encode(changed)) != encoded


def test_outputs_are_listed_as_shards_only(tmp_path):
    run(planted_corpus(tmp_path / "in"), tmp_path / "out")
    assert [name.rsplit("/", 1)[-1] for name in list_shards(str(tmp_path / "out"))] == [
        "shard-00000.jsonl.gz",
        "shard-00001.jsonl.gz",
    ]
