"""Bad input a researcher really meets, given to the data steps as a new user would.

The rule: bad input is ONE clear error line naming the step, the file (and line) and what to
do; never a step that returns normally (the executor would mark it successful) with partial,
empty or silently wrong output; no `.tmp-*` files left; no input overwritten. Each test makes
its own small input; none imports Levanter (the tokenize checks stop before it is needed).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
import zstandard

from operations.dedup import DedupConfig, deduplicate
from operations.documents import DocumentsConfig, make_documents
from operations.filter import (
    C4,
    AlphanumericRatio,
    FilterConfig,
    FineWeb,
    Gopher,
    GopherRepetition,
    MaxDuplicateLineFraction,
    MaxLength,
    MaxLineLength,
    MinLength,
    MinQualityScore,
    SymbolRatio,
    filter_documents,
)
from operations.shards import iter_documents, list_shards, read_documents, write_documents
from operations.tokenize import TokenizeConfig, split_counts, tokenize
from operations.tokenizer import TrainTokenizerConfig, train_tokenizer


def lines(count: int = 30, start: int = 0) -> bytes:
    return b"".join(
        (json.dumps({"id": f"d{i}", "text": f"document number {i} has a few words in it"}) + "\n").encode()
        for i in range(start, start + count)
    )


def shard_dir(root: Path, files: dict[str, bytes]) -> str:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return str(root)


KEEP_ALL = (MinLength(min_chars=3),)


def run_filter(input_path: str, output: Path, rules=KEEP_ALL) -> None:
    filter_documents(FilterConfig(input_path=input_path, output_path=str(output), rules=rules, workers=1))


def run_dedup(input_path: str, output: Path) -> None:
    deduplicate(DedupConfig(input_path=input_path, output_path=str(output), workers=1))


def run_tokenize_split(input_path: str, output: Path) -> None:
    # The reading half of tokenize (what streams the shards into Levanter's builder).
    split_counts(TokenizeConfig(input_path, "unused", str(output)))


STEPS = {"filter": run_filter, "dedup": run_dedup, "tokenize": run_tokenize_split}


def temp_files(output: Path) -> list[str]:
    return [name for _root, _dirs, names in os.walk(output) for name in names if name.startswith(".tmp-")]


def assert_failed_cleanly(output: Path) -> None:
    """No stats.json (what a finished step writes last) and no temporary files."""
    assert not (output / "stats.json").exists()
    assert temp_files(output) == []


def one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message, message
    return message


def truncated_zstd() -> bytes:
    # Varied text, so the first half of the frame holds whole blocks that decode.
    data = b"".join(
        (json.dumps({"id": f"d{i}", "text": os.urandom(64).hex()}) + "\n").encode() for i in range(2000)
    )
    compressed = zstandard.ZstdCompressor().compress(data)
    return compressed[: len(compressed) // 2]


# -- compressed shards ------------------------------------------------------------------------


@pytest.mark.parametrize("step", STEPS)
def test_a_truncated_gzip_shard_names_the_step_file_and_fix(tmp_path, step):
    data = gzip.compress(lines(3000))
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl.gz": data[: len(data) // 2]})
    with pytest.raises(ValueError) as refused:
        STEPS[step](source, tmp_path / "out")
    message = one_line(refused.value)
    assert message.startswith(step), message
    assert "shard-00000.jsonl.gz" in message and "truncated" in message and "again" in message, message
    assert_failed_cleanly(tmp_path / "out")


@pytest.mark.parametrize("step", STEPS)
def test_a_truncated_zstd_shard_is_an_error_not_a_partial_success(tmp_path, step):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl.zst": truncated_zstd()})
    with pytest.raises(ValueError, match=r"shard-00000\.jsonl\.zst.*truncated"):
        STEPS[step](source, tmp_path / "out")
    assert_failed_cleanly(tmp_path / "out")


def test_read_documents_reads_every_frame_of_a_multi_frame_zstd_shard(tmp_path):
    compressor = zstandard.ZstdCompressor()
    path = tmp_path / "shard-00000.jsonl.zst"
    path.write_bytes(compressor.compress(lines(5)) + compressor.compress(lines(5, start=5)))
    assert [d["id"] for d in read_documents(str(path))] == [f"d{i}" for i in range(10)]


@pytest.mark.parametrize("step", STEPS)
def test_plain_text_named_jsonl_gz_is_named_not_a_bare_gzip_error(tmp_path, step):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl.gz": lines()})
    with pytest.raises(ValueError) as refused:
        STEPS[step](source, tmp_path / "out")
    message = one_line(refused.value)
    assert "shard-00000.jsonl.gz" in message and "not a gzip file" in message and "rename" in message
    assert_failed_cleanly(tmp_path / "out")


# -- lines that are not documents -------------------------------------------------------------


@pytest.mark.parametrize("step", STEPS)
def test_non_utf8_bytes_name_the_file_and_line(tmp_path, step):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl": lines() + b'{"id": "x", "text": "caf\xe9"}\n'})
    with pytest.raises(ValueError) as refused:
        STEPS[step](source, tmp_path / "out")
    message = one_line(refused.value)
    assert "shard-00000.jsonl, line 31: not valid UTF-8" in message, message
    assert "encoding_errors" in message  # the fix: make the shards with operations.documents
    assert_failed_cleanly(tmp_path / "out")


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize(("line", "kind"), [(b"[1, 2]", "list"), (b"3", "int"), (b"null", "null")])
def test_a_json_line_that_is_not_an_object_names_the_file_and_line(tmp_path, step, line, kind):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl": lines() + line + b"\n"})
    with pytest.raises(
        ValueError
    ) as refused:  # tokenize: was AttributeError: 'list' object has no attribute 'get'
        STEPS[step](source, tmp_path / "out")
    message = one_line(refused.value)
    assert f"shard-00000.jsonl, line 31: a JSON {kind}, not a document object" in message, message
    assert_failed_cleanly(tmp_path / "out")


def test_blank_lines_and_a_missing_final_newline_are_fine(tmp_path):
    source = shard_dir(
        tmp_path / "in", {"shard-00000.jsonl": b"\n\n" + lines(3) + b"\n \n" + lines(1, 3).rstrip()}
    )
    run_filter(source, tmp_path / "out")
    assert [d["id"] for d in iter_documents(str(tmp_path / "out"))] == ["d0", "d1", "d2", "d3"]


# -- what is listed as a shard ----------------------------------------------------------------


@pytest.mark.parametrize("step", STEPS)
def test_a_directory_named_like_a_shard_is_refused_before_anything_runs(tmp_path, step):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl": lines()})
    (tmp_path / "in" / "shard-00001.jsonl.gz").mkdir()
    with pytest.raises(ValueError) as refused:
        STEPS[step](source, tmp_path / "out")
    message = one_line(refused.value)
    assert (
        message.startswith(f"{step}: input_path: ")
        and "shard-00001.jsonl.gz is a directory, not a shard" in message
    )
    assert not (tmp_path / "out" / "shard-00000.jsonl.gz").exists()


@pytest.mark.parametrize("step", STEPS)
def test_a_broken_symlink_named_like_a_shard_is_refused_before_anything_runs(tmp_path, step):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl": lines()})
    (tmp_path / "in" / "shard-00001.jsonl.gz").symlink_to(tmp_path / "gone.jsonl.gz")
    with pytest.raises(ValueError) as refused:
        STEPS[step](source, tmp_path / "out")
    message = one_line(refused.value)
    assert message.startswith(f"{step}: input_path: ") and "gone.jsonl.gz" in message
    assert "shard-00001.jsonl.gz is a broken symbolic link" in message
    assert not (tmp_path / "out" / "shard-00000.jsonl.gz").exists()


def test_a_directory_without_shards_says_what_it_holds_and_what_to_do(tmp_path):
    source = shard_dir(tmp_path / "raw", {"a.parquet": b"", "b.txt": b"x"})
    with pytest.raises(FileNotFoundError) as refused:
        run_filter(source, tmp_path / "out")
    message = one_line(refused.value)
    assert message.startswith("filter: input_path: no document shards") and "a.parquet, b.txt" in message
    assert "make_documents" in message


# -- empty results must not flow on -----------------------------------------------------------


@pytest.mark.parametrize("step", ["filter", "dedup"])
def test_input_with_no_documents_is_refused_not_an_empty_success(tmp_path, step):
    source = shard_dir(
        tmp_path / "in", {"shard-00000.jsonl.gz": gzip.compress(b""), "shard-00001.jsonl": b"\n\n"}
    )
    with pytest.raises(ValueError) as refused:
        STEPS[step](source, tmp_path / "out")
    message = one_line(refused.value)
    assert message.startswith(step) and "no documents" in message and "2 input shard(s)" in message, message
    assert_failed_cleanly(tmp_path / "out")


def test_empty_shards_among_full_ones_are_fine(tmp_path):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl.gz": b"", "shard-00001.jsonl": lines(4)})
    run_filter(source, tmp_path / "out")
    assert len(list(iter_documents(str(tmp_path / "out")))) == 4


def test_a_filter_that_keeps_nothing_fails_after_writing_its_stats(tmp_path):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl": lines(10)})
    rules = (MinLength(min_chars=3), MaxLength(max_chars=5))
    with pytest.raises(ValueError) as refused:
        run_filter(source, tmp_path / "out", rules=rules)
    message = one_line(refused.value)
    assert message.startswith("filter:") and "dropped all 10" in message and "max_length: 10" in message
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["documents"] == {"input": 10, "kept": 0, "dropped": 10} and "error" in stats
    assert temp_files(tmp_path / "out") == []
    # The verdict is the same on a re-run (the shards are resumed, not redone).
    with pytest.raises(ValueError, match="dropped all 10"):
        run_filter(source, tmp_path / "out", rules=rules)


# -- config values ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        (MinLength(min_chars=-5), "MinLength.min_chars=-5"),
        (MinLength(min_chars="20"), "MinLength.min_chars='20'"),
        (MaxLength(max_chars=-1), "MaxLength.max_chars=-1"),
        (MaxLineLength(max_chars=0), "MaxLineLength.max_chars=0"),
        (AlphanumericRatio(min_ratio=1.5), "AlphanumericRatio.min_ratio=1.5"),
        (SymbolRatio(max_ratio=-0.1), "SymbolRatio.max_ratio=-0.1"),
        (MaxDuplicateLineFraction(max_fraction=2.0), "MaxDuplicateLineFraction.max_fraction=2.0"),
        (MaxDuplicateLineFraction(max_fraction=0.5, min_line_chars=-3), "min_line_chars=-3"),
        (MinQualityScore(min_score=2), "MinQualityScore.min_score=2"),
        (Gopher(max_non_alpha_words_ratio=1.5), "Gopher.max_non_alpha_words_ratio=1.5"),
        (Gopher(min_doc_words=-1), "Gopher.min_doc_words=-1"),
        (Gopher(min_doc_words=500, max_doc_words=100), "Gopher.min_doc_words=500"),
        (GopherRepetition(dup_line_frac=5.0), "GopherRepetition.dup_line_frac=5.0"),
        (GopherRepetition(top_n_grams=((0, 0.2),)), "GopherRepetition.top_n_grams"),
        (C4(min_num_sentences=-5), "C4.min_num_sentences=-5"),
        (FineWeb(line_punct_thr=2.0), "FineWeb.line_punct_thr=2.0"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_out_of_range_rule_values_are_refused_before_anything_is_written(tmp_path, rule, words):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl": lines(3)})
    with pytest.raises(ValueError) as refused:
        run_filter(source, tmp_path / "out", rules=(rule,))
    message = one_line(refused.value)
    assert "FilterConfig.rules[0]" in message and words in message, message
    assert not (tmp_path / "out").exists()


def test_a_bool_is_not_a_dedup_ngram_size(tmp_path):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl": lines(3)})
    with pytest.raises(ValueError, match="DedupConfig.ngram_size"):
        deduplicate(DedupConfig(input_path=source, output_path=str(tmp_path / "out"), ngram_size=True))
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_path_that_does_not_exist_is_named_before_anything_is_written(tmp_path):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl": lines(3)})
    for tokenizer in (str(tmp_path / "no" / "such" / "tokenizer"), "./tokenizers/missing"):
        with pytest.raises(ValueError) as refused:
            tokenize(TokenizeConfig(source, tokenizer, str(tmp_path / "out")))
        message = one_line(refused.value)
        assert message.startswith("TokenizeConfig.tokenizer") and tokenizer in message, message
        assert "no such directory" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="TokenizeConfig.tokenizer.*no tokenizer files"):
        tokenize(TokenizeConfig(source, str(tmp_path / "empty"), str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_step_output_passes_the_tokenizer_check(tmp_path):
    from operations.tokenize import _check_tokenizer

    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl": lines(50)})
    train_tokenizer(
        TrainTokenizerConfig(input_path=source, output_path=str(tmp_path / "tok"), vocab_size=300)
    )
    _check_tokenizer(str(tmp_path / "tok"))
    _check_tokenizer("gpt2")  # a hub name is left to the hub


# -- data overwritten or reused silently ------------------------------------------------------


@pytest.mark.parametrize("step", ["filter", "dedup"])
def test_writing_into_the_input_directory_is_refused(tmp_path, step):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl.gz": gzip.compress(lines(10))})
    before = (tmp_path / "in" / "shard-00000.jsonl.gz").read_bytes()
    with pytest.raises(ValueError) as refused:
        STEPS[step](source, tmp_path / "in")
    message = one_line(refused.value)
    assert "output_path" in message and "input" in message, message
    assert (tmp_path / "in" / "shard-00000.jsonl.gz").read_bytes() == before
    assert sorted(os.listdir(tmp_path / "in")) == ["shard-00000.jsonl.gz"]


def test_a_filter_rerun_with_other_rules_into_the_same_output_is_refused(tmp_path):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl": lines(10)})
    run_filter(source, tmp_path / "out", rules=(MinLength(min_chars=3),))
    kept = (tmp_path / "out" / "shard-00000.jsonl.gz").read_bytes()
    with pytest.raises(ValueError) as refused:  # it reused the old shards: 10 kept, rules claimed min 1000
        run_filter(source, tmp_path / "out", rules=(MinLength(min_chars=1000),))
    message = one_line(refused.value)
    assert "other rules" in message and "fresh output_path" in message, message
    assert (tmp_path / "out" / "shard-00000.jsonl.gz").read_bytes() == kept
    # The same config resumes as before.
    run_filter(source, tmp_path / "out", rules=(MinLength(min_chars=3),))


def test_a_filter_rerun_over_other_input_into_the_same_output_is_refused(tmp_path):
    run_filter(shard_dir(tmp_path / "a", {"shard-00000.jsonl": lines(10)}), tmp_path / "out")
    with pytest.raises(ValueError, match="other input shards"):
        run_filter(shard_dir(tmp_path / "b", {"shard-00000.jsonl": lines(3)}), tmp_path / "out")


# -- documents: raw files ---------------------------------------------------------------------


def documents(raw: str, output: Path, **overrides) -> dict:
    make_documents(DocumentsConfig(input_path=raw, output_path=str(output), workers=1, **overrides))
    return json.loads((output / "stats.json").read_text())


def test_documents_reads_jsonl_zst_files(tmp_path):
    # Every .jsonl.zst file was counted "unreadable" (zstd's reader cannot be iterated by line).
    raw = shard_dir(tmp_path / "raw", {"a.jsonl.zst": zstandard.ZstdCompressor().compress(lines(5))})
    stats = documents(raw, tmp_path / "out")
    assert stats["documents"] == 5 and stats["errors"] == {}
    assert [d["id"] for d in iter_documents(str(tmp_path / "out"))] == [
        f"a.jsonl.zst:{i}" for i in range(1, 6)
    ]


def test_documents_counts_a_truncated_zstd_file_as_unreadable(tmp_path):
    raw = shard_dir(tmp_path / "raw", {"a.jsonl.zst": truncated_zstd(), "b.jsonl": lines(10)})
    stats = documents(raw, tmp_path / "out", max_error_fraction=1.0)
    assert stats["errors"] == {"unreadable": 1} and stats["error_examples"] == {"unreadable": ["a.jsonl.zst"]}


def test_documents_fails_when_too_many_files_are_unreadable(tmp_path):
    # Half of the files is cut short: the records read before the cut outnumber the one error,
    # so the per-input fraction (1 / 1,500) passed and the step succeeded with half a download.
    data = gzip.compress(lines(3000))
    raw = shard_dir(tmp_path / "raw", {"a.jsonl.gz": data[: len(data) // 2], "b.jsonl": lines(10)})
    with pytest.raises(ValueError) as refused:
        documents(raw, tmp_path / "out")
    message = one_line(refused.value)
    assert "1 of 2 files" in message and "a.jsonl.gz" in message and "unreadable" in message, message
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["unreadable_file_fraction"] == 0.5 and "error" in stats


def test_documents_names_a_broken_symlink_among_the_raw_files(tmp_path):
    raw = shard_dir(tmp_path / "raw", {"a.jsonl": lines(3)})
    (tmp_path / "raw" / "b.jsonl").symlink_to(tmp_path / "gone.jsonl")
    with pytest.raises(ValueError) as refused:
        documents(str(raw), tmp_path / "out")
    message = one_line(refused.value)
    assert message.startswith("DocumentsConfig.input_path") and "b.jsonl is a broken symbolic link" in message
    assert "exclude" in message
    assert not (tmp_path / "out").exists()


def test_list_shards_of_a_single_shard_file_and_a_directory(tmp_path):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl": lines(1), "notes.txt": b""})
    assert list_shards(source) == [str(tmp_path / "in" / "shard-00000.jsonl")]
    write_documents(str(tmp_path / "one.jsonl.gz"), [{"id": "a", "text": "b"}])
    assert list_shards(str(tmp_path / "one.jsonl.gz")) == [str(tmp_path / "one.jsonl.gz")]


def test_a_tokenizer_name_that_does_not_load_is_one_line_naming_the_field():
    from operations.tokenize import _check_tokenizer_loads

    class Unloadable:  # Levanter's data config, whose tokenizer transformers fails to load
        @property
        def the_tokenizer(self):
            raise OSError(
                "We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in "
                "the cached files.\nCheck your internet connection or see how to run the library in offline mode."
            )

    with pytest.raises(ValueError) as refused:
        _check_tokenizer_loads(Unloadable(), "my-tokenizer")
    message = one_line(refused.value)
    assert (
        message.startswith("TokenizeConfig.tokenizer='my-tokenizer': cannot load it") and "OSError" in message
    )
    assert "tokenizer step" in message


def test_after_a_failed_filter_a_fixed_shard_runs_into_the_same_output(tmp_path):
    source = shard_dir(
        tmp_path / "in", {"shard-00000.jsonl": lines(5), "shard-00001.jsonl": lines(5, 5) + b"[]\n"}
    )
    with pytest.raises(ValueError, match="shard-00001.jsonl, line 6"):
        run_filter(source, tmp_path / "out")
    (tmp_path / "in" / "shard-00001.jsonl").write_bytes(lines(5, 5))  # fixed: its size changed
    run_filter(source, tmp_path / "out")
    assert len(list(iter_documents(str(tmp_path / "out")))) == 10


def test_after_a_filter_that_dropped_everything_other_rules_need_a_fresh_output(tmp_path):
    source = shard_dir(tmp_path / "in", {"shard-00000.jsonl": lines(5)})
    with pytest.raises(ValueError, match="dropped all 5"):
        run_filter(source, tmp_path / "out", rules=(MinLength(min_chars=3), MaxLength(max_chars=5)))
    # Its (empty) shards are finished: kept as they are, they would pass for the new rules' output.
    with pytest.raises(ValueError, match="other rules"):
        run_filter(source, tmp_path / "out")
    run_filter(source, tmp_path / "fresh")
