"""operations.tokenize: deterministic train/validation split, then Levanter token caches.

The split tests run without Levanter. The end-to-end tests build real Levanter caches
(slow: importing Levanter and JAX; the Ray-builder test also starts a local Ray) and read
them back through Levanter's own LM data config, as the training step will.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from operations.shards import shard_name, write_documents
from operations.tokenize import (
    TokenizeConfig,
    cache_finished,
    forced_validation_id,
    lm_data_config,
    split_counts,
    split_source,
    tokenize,
)
from operations.tokenizer import TrainTokenizerConfig, in_validation, split_key, train_tokenizer
from tests.operations.test_tokenizer import make_corpus


def split_ids(config, split, forced=None):
    return [row["id"] for row in split_source(config, split, forced)]


def test_split_depends_only_on_id_fraction_and_seed():
    ids = [f"doc-{index}" for index in range(20_000)]
    chosen = {i for i in ids if in_validation(i, 0.05)}
    assert chosen == {i for i in ids if in_validation(i, 0.05)}
    assert 0.04 < len(chosen) / len(ids) < 0.06
    # A larger fraction keeps every document a smaller one chose; another seed picks others.
    assert chosen <= {i for i in ids if in_validation(i, 0.2)}
    assert chosen != {i for i in ids if in_validation(i, 0.05, seed=1)}


def test_every_document_lands_in_exactly_one_split_and_the_counts_agree(tmp_path):
    documents = make_corpus(str(tmp_path / "docs"), documents=200, shards=4)
    config = TokenizeConfig(str(tmp_path / "docs"), "unused", str(tmp_path / "a"), validation_fraction=0.1)

    validation = split_ids(config, "validation")
    train = split_ids(config, "train")
    assert sorted(train + validation) == sorted(doc["id"] for doc in documents)
    assert set(validation) == {doc["id"] for doc in documents if in_validation(doc["id"], 0.1)}
    per_shard = split_counts(config)
    assert sum(shard["validation"]["documents"] for shard in per_shard) == len(validation)
    assert sum(shard["train"]["documents"] for shard in per_shard) == len(train)
    # Streaming again gives the same rows in the same order.
    assert split_ids(config, "train") == train


def test_a_source_resumes_at_a_row_of_its_own_split(tmp_path):
    make_corpus(str(tmp_path / "docs"), documents=60, shards=2)
    source = split_source(TokenizeConfig(str(tmp_path / "docs"), "unused", str(tmp_path / "out")), "train")
    name = source.shard_names[1]
    rows = list(source.open_shard(name))
    assert list(source.open_shard_at_row(name, 7)) == rows[7:]


def test_tiny_corpus_still_gets_one_validation_document(tmp_path):
    documents = make_corpus(str(tmp_path / "docs"), documents=5, shards=2)
    ids = [doc["id"] for doc in documents]
    assert not any(in_validation(i, 0.001) for i in ids)
    config = TokenizeConfig(
        str(tmp_path / "docs"), "unused", str(tmp_path / "out"), validation_fraction=0.001
    )

    forced = forced_validation_id(split_counts(config))

    assert forced == min(ids, key=split_key)
    assert split_ids(config, "validation", forced) == [forced]
    assert sorted(split_ids(config, "train", forced)) == sorted(set(ids) - {forced})


def test_tokenizer_held_out_documents_are_the_validation_documents(tmp_path):
    make_corpus(str(tmp_path / "docs"), documents=100, shards=2)
    config = TokenizeConfig(str(tmp_path / "docs"), "unused", str(tmp_path / "out"))
    train_tokenizer(
        TrainTokenizerConfig(
            input_path=str(tmp_path / "docs"), output_path=str(tmp_path / "tok"), vocab_size=300
        )
    )

    heldout = json.loads((tmp_path / "tok" / "stats.json").read_text())["heldout"]
    validation = split_ids(config, "validation")
    assert heldout["documents"] == len(validation) > 0
    assert heldout["documents"] == sum(s["validation"]["documents"] for s in split_counts(config))


def test_empty_texts_are_counted_and_skipped(tmp_path):
    docs = [
        {"id": str(i), "text": text, "source": "", "metadata": {}}
        for i, text in enumerate(["a b", "", "  \n", "c"])
    ]
    write_documents(str(tmp_path / "docs" / shard_name(0)), docs)
    config = TokenizeConfig(str(tmp_path / "docs"), "unused", str(tmp_path / "out"))
    per_shard = split_counts(config)
    assert per_shard[0]["skipped_empty"] == 2
    assert per_shard[0]["train"]["documents"] + per_shard[0]["validation"]["documents"] == 2
    assert sorted(split_ids(config, "train") + split_ids(config, "validation")) == ["0", "3"]


def test_document_without_the_text_field_names_the_file_and_field(tmp_path):
    shard = str(tmp_path / "docs" / shard_name(0))
    write_documents(shard, [{"id": "x", "body": "text", "source": "", "metadata": {}}])
    with pytest.raises(ValueError, match=r"shard-00000.jsonl.gz: document 'x' has no string field 'text'"):
        split_counts(TokenizeConfig(str(tmp_path / "docs"), "unused", str(tmp_path / "out")))


@pytest.mark.parametrize(
    "fields, message",
    [({"validation_fraction": 0.0}, "validation_fraction"), ({"builder": "spark"}, "builder")],
)
def test_bad_settings_are_rejected_with_the_field_named(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        tokenize(TokenizeConfig(str(tmp_path), "unused", str(tmp_path / "out"), **fields))


def test_levanters_ray_builder_is_refused_for_an_s3_output_before_anything_is_written(tmp_path, monkeypatch):
    """Its tasks run in Ray workers, where JAX's s3:// specs are not fixed (operations.buckets)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"TokenizeConfig.builder='ray' with output_path='s3://bkt/tok': .* use builder='in_process'",
    ):
        tokenize(TokenizeConfig(str(tmp_path), "unused", "s3://bkt/tok", builder="ray"))
    assert list(tmp_path.iterdir()) == []


def test_importing_the_operations_does_not_import_levanter_jax_or_ray():
    code = (
        "import sys, operations.tokenize, operations.tokenizer; "
        "print(sorted(m for m in ('levanter', 'jax', 'ray', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
    """A tiny corpus, a tokenizer trained on it, and its tokenized output (default builder)."""
    root = tmp_path_factory.mktemp("tokenize")
    documents = make_corpus(str(root / "docs"), documents=120, shards=3)
    tokenizer = str(root / "tokenizer")
    train_tokenizer(
        TrainTokenizerConfig(input_path=str(root / "docs"), output_path=tokenizer, vocab_size=400)
    )
    config = TokenizeConfig(str(root / "docs"), tokenizer, str(root / "tokenized"), validation_fraction=0.1)
    tokenize(config)
    return root, config, documents


@pytest.mark.slow
def test_caches_hold_every_document_levanter_loads_them_and_they_decode_back(tokenized):
    import haliax as hax
    import jax
    from levanter.schedule import BatchSchedule

    _, config, documents = tokenized
    out = config.output_path
    assert cache_finished(os.path.join(out, "train")) and cache_finished(os.path.join(out, "validation"))

    data = lm_data_config(out, config.tokenizer)
    tokenizer = data.the_tokenizer
    bos, eos = tokenizer.bos_token, tokenizer.eos_token
    stats = json.loads(pathlib.Path(out, "stats.json").read_text())
    by_id = {doc["id"]: doc["text"] for doc in documents}
    expected_ids = {}
    for split in ("train", "validation"):
        ids = split_ids(config, split)
        # Levanter's BatchTokenizer tokenizes "<bos> text <eos>" for each document.
        encoded = tokenizer([f"{bos} {by_id[i]} {eos}" for i in ids])["input_ids"]
        assert stats[split]["documents"] == len(ids)
        assert stats[split]["tokens"] == sum(len(e) for e in encoded)
        expected_ids[split] = [token for e in encoded for token in e]

        cache = data.build_or_load_cache(split, monitors=False)
        assert len(cache) == len(ids)
        assert tokenizer.decode(cache[0]["input_ids"]) == f"{bos} {by_id[ids[0]]} {eos}"
    assert stats["documents"] == len(documents) and stats["levanter_preprocessor"]["append_eos"]

    # What the training step does: Levanter's own datasets over the caches.
    Pos = hax.Axis("position", 32)
    train = data.train_set(Pos, BatchSchedule(4), key=jax.random.PRNGKey(0)).as_sync_dataset()
    validation = data.validation_set(Pos).as_sync_dataset()
    assert list(train[1].tokens.array) == expected_ids["train"][32:64]
    assert tokenizer.decode(validation[0].tokens.array) == tokenizer.decode(expected_ids["validation"][:32])


@pytest.mark.slow
def test_rerun_after_success_changes_nothing(tokenized):
    _, config, _ = tokenized
    stats = pathlib.Path(config.output_path, "stats.json")
    before = stats.read_bytes()
    tokenize(config)
    assert stats.read_bytes() == before


@pytest.mark.slow
def test_a_tiny_corpus_builds_a_validation_cache_of_the_forced_document(tokenized, tmp_path):
    _, config, _ = tokenized
    documents = make_corpus(str(tmp_path / "docs"), documents=5, shards=2)
    ids = [doc["id"] for doc in documents]
    assert not any(in_validation(i, 0.001) for i in ids)
    tiny = TokenizeConfig(
        str(tmp_path / "docs"), config.tokenizer, str(tmp_path / "out"), validation_fraction=0.001
    )

    tokenize(tiny)

    stats = json.loads(pathlib.Path(tiny.output_path, "stats.json").read_text())
    assert (stats["train"]["documents"], stats["validation"]["documents"]) == (4, 1)
    data = lm_data_config(tiny.output_path, tiny.tokenizer)
    validation = data.build_or_load_cache("validation", monitors=False)
    text = next(doc["text"] for doc in documents if doc["id"] == min(ids, key=split_key))
    assert data.the_tokenizer.decode(validation[0]["input_ids"]).startswith(
        f"{data.the_tokenizer.bos_token} {text}"
    )


@pytest.mark.slow
def test_a_deleted_cache_is_rebuilt_identically(tokenized):
    _, config, _ = tokenized
    validation = pathlib.Path(config.output_path, "validation")
    before = {
        path.relative_to(validation): path.read_bytes() for path in validation.rglob("*") if path.is_file()
    }
    shutil.rmtree(validation)
    tokenize(config)
    after = {
        path.relative_to(validation): path.read_bytes() for path in validation.rglob("*") if path.is_file()
    }
    assert after == before


@pytest.mark.slow
def test_ray_builder_writes_byte_identical_caches(tokenized):
    root, config, _ = tokenized
    with_ray = TokenizeConfig(
        config.input_path,
        config.tokenizer,
        str(root / "with-ray"),
        validation_fraction=0.1,
        builder="ray",
        workers=1,  # no fork: JAX is imported in this process by now
    )
    tokenize(with_ray)

    def tree(root):
        return {
            os.path.relpath(os.path.join(directory, name), root): pathlib.Path(directory, name).read_bytes()
            for directory, _, files in os.walk(root)
            for name in files
        }

    in_process, ray_built = tree(config.output_path), tree(with_ray.output_path)
    assert sorted(in_process) == sorted(ray_built)
    for name, content in in_process.items():
        assert ray_built[name] == content, name


def _tokenizer_variant(source, target, change):
    """A copy of the tokenizer directory `source` with its tokenizer.json changed by `change`."""
    from tokenizers import Tokenizer

    shutil.copytree(source, target)
    backend = Tokenizer.from_file(os.path.join(target, "tokenizer.json"))
    change(backend)
    backend.save(os.path.join(target, "tokenizer.json"))
    return str(target)


TRICKY_TEXTS = [
    "def f(x):\n    return x  # plain code",
    "  leading and trailing spaces  ",
    "héllo wörld ✓ 😀 中文字符 \u200b zero width",
    "a literal <|endoftext|> inside the text<|endoftext|>",
    "tabs\tand\r\nwindows line ends\n\n\n",
    "x",
    " ".join(f"word{i}" for i in range(4_000)),  # > Levanter's 10,000-character workaround length
]


@pytest.mark.slow
def test_fast_processor_gives_levanters_ids_and_metadata(tokenized, tmp_path):
    import numpy as np
    from levanter.data.text import preprocessor_for_format
    from tokenizers import normalizers, processors

    from operations.tokenize import fast_batch_tokenizer

    _, config, _ = tokenized
    variants = {
        "trained": (config.tokenizer, True),
        # A Sequence normalizer makes Levanter split long strings: its own __call__ runs.
        "normalizer": (
            _tokenizer_variant(
                config.tokenizer,
                tmp_path / "normalizer",
                lambda t: setattr(t, "normalizer", normalizers.Sequence([normalizers.NFKC()])),
            ),
            False,
        ),
        # The post-processor adds bos itself, so Levanter adds only eos.
        "template": (
            _tokenizer_variant(
                config.tokenizer,
                tmp_path / "template",
                lambda t: setattr(
                    t,
                    "post_processor",
                    processors.TemplateProcessing(
                        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
                    ),
                ),
            ),
            True,
        ),
        # Truncation stored in tokenizer.json: transformers turns it off per call, and so do we.
        "truncation": (
            _tokenizer_variant(
                config.tokenizer, tmp_path / "truncation", lambda t: t.enable_truncation(max_length=8)
            ),
            True,
        ),
    }
    batch = [{"text": text} for text in TRICKY_TEXTS]
    for name, (tokenizer_path, fast_path) in variants.items():
        data = lm_data_config(config.output_path, tokenizer_path)
        levanter = preprocessor_for_format(
            data.format, data.the_tokenizer, enforce_bos=True, enforce_eos=data.enforce_eos
        )
        fast = fast_batch_tokenizer(data)
        assert fast.metadata == levanter.metadata, name
        assert fast.output_exemplar.keys() == levanter.output_exemplar.keys(), name
        assert (fast._backend is not None) == fast_path, name
        expected = [np.asarray(row["input_ids"]) for row in levanter(batch)]
        for _ in range(2):  # the second call takes the fast path after a fallback (truncation)
            # np.asarray: what Levanter's writer makes of each row (lists from the fallback).
            got = [np.asarray(row["input_ids"]) for row in fast(batch)]
            assert [row.dtype for row in got] == [row.dtype for row in expected], name
            assert [row.tolist() for row in got] == [row.tolist() for row in expected], name
        if name == "template":
            assert not fast._need_to_add_bos and fast._need_to_add_eos
            assert got[0][0] == data.the_tokenizer.bos_token_id


@pytest.mark.slow
def test_in_process_caches_equal_levanters_own_processor_byte_for_byte(tokenized, tmp_path):
    from levanter.data.text import preprocessor_for_format
    from levanter.store.cache import CacheOptions, _tokenize_one_shard_group

    _, config, _ = tokenized
    data = lm_data_config(config.output_path, config.tokenizer)
    levanter = preprocessor_for_format(
        data.format, data.the_tokenizer, enforce_bos=True, enforce_eos=data.enforce_eos
    )
    for split in ("train", "validation"):
        source = split_source(config, split)
        reference = tmp_path / split
        # Levanter's own processor and its default batch size, through the same loop.
        _tokenize_one_shard_group(
            str(reference),
            source,
            list(source.shard_names),
            levanter,
            CacheOptions(num_shard_groups=1),
            lambda *_: None,
            False,
        )
        ours = pathlib.Path(config.output_path, split)
        files = {path.relative_to(ours): path.read_bytes() for path in ours.rglob("*") if path.is_file()}
        theirs = {
            path.relative_to(reference): path.read_bytes() for path in reference.rglob("*") if path.is_file()
        }
        assert files.keys() == theirs.keys() and files, split
        for name, content in files.items():
            assert theirs[name] == content, (split, name)


def test_a_second_count_rewrites_no_counts_file(tmp_path):
    make_corpus(str(tmp_path / "docs"), documents=40, shards=2)
    config = TokenizeConfig(str(tmp_path / "docs"), "unused", str(tmp_path / "out"), validation_fraction=0.2)
    first = split_counts(config)
    counts = sorted(pathlib.Path(config.output_path, ".split_counts").iterdir())
    before = {path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in counts}
    assert len(counts) == 2
    assert split_counts(config) == first
    assert {path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in counts} == before
