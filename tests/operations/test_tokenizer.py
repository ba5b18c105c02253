"""operations.tokenizer: train a byte-level BPE tokenizer, or adopt an existing one."""

import json
import os
import random

import pytest

from operations.shards import shard_name, write_documents
from operations.tokenizer import ENDOFTEXT, TrainTokenizerConfig, in_validation, train_tokenizer

WORDS = [
    "def",
    "return",
    "class",
    "import",
    "self",
    "value",
    "data",
    "list",
    "dict",
    "for",
    "in",
    "if",
    "else",
    "while",
    "yield",
    "lambda",
    "x",
    "y",
    "z",
]
EXTRA = ["naïve café", "日本語", "emoji 🙂", "tabs\tand\nnewlines", "  indented = (1, 2.5)"]


def make_corpus(directory, documents=60, shards=3, seed=0) -> list[dict]:
    """Small code-like documents in `shards` shards; returns them in shard order."""
    rng = random.Random(seed)
    docs = [
        {
            "id": f"doc-{index}",
            "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60)))
            + "\n"
            + rng.choice(EXTRA),
            "source": "test",
            "metadata": {},
        }
        for index in range(documents)
    ]
    ordered = []
    for shard in range(shards):
        part = docs[shard::shards]
        write_documents(os.path.join(directory, shard_name(shard)), part)
        ordered.extend(part)
    return ordered


@pytest.fixture
def corpus(tmp_path):
    directory = tmp_path / "docs"
    documents = make_corpus(str(directory))
    return str(directory), documents


def train(input_path, output_path, **overrides):
    config = TrainTokenizerConfig(
        input_path=input_path, output_path=str(output_path), vocab_size=400, **overrides
    )
    train_tokenizer(config)
    with open(os.path.join(output_path, "stats.json")) as handle:
        return json.load(handle)


def test_trained_tokenizer_loads_with_auto_tokenizer_round_trips_and_has_eos(corpus, tmp_path):
    from transformers import AutoTokenizer

    directory, documents = corpus
    train(directory, tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))

    assert tokenizer.eos_token == ENDOFTEXT and tokenizer.eos_token_id is not None
    assert tokenizer.bos_token == ENDOFTEXT
    for text in [documents[0]["text"], "unseen text: ∑ ü 🙂 \x00 and a . b , c"]:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.eos_token_id not in ids  # GPT-2 style: no special tokens added
        assert tokenizer.decode(ids) == text
    assert len(tokenizer) <= 400
    assert sorted(os.listdir(tmp_path / "tok")) == [
        "special_tokens_map.json",
        "stats.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_training_twice_gives_byte_identical_files(corpus, tmp_path):
    directory, _ = corpus
    train(directory, tmp_path / "a")
    train(directory, tmp_path / "b")
    for name in os.listdir(tmp_path / "a"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_stats_count_training_and_held_out_documents(corpus, tmp_path):
    directory, documents = corpus
    stats = train(directory, tmp_path / "tok", heldout_fraction=0.2)

    heldout = [doc for doc in documents if in_validation(doc["id"], 0.2)]
    trained = [doc for doc in documents if not in_validation(doc["id"], 0.2)]
    assert 0 < len(heldout) < len(documents)
    assert stats["training"]["documents"] == len(trained)
    assert stats["training"]["bytes"] == sum(len(doc["text"].encode()) for doc in trained)
    assert stats["heldout"]["documents"] == len(heldout)
    assert stats["heldout"]["chars_per_token"] == pytest.approx(
        stats["heldout"]["chars"] / stats["heldout"]["tokens"], abs=1e-3
    )
    assert stats["vocab_size"] <= 400 and stats["eos_token_id"] is not None


def test_max_documents_limits_what_is_read(corpus, tmp_path):
    directory, _ = corpus
    stats = train(directory, tmp_path / "tok", max_documents=10, heldout_fraction=0.0)
    assert stats["training"]["documents"] == 10


def test_existing_tokenizer_directory_is_copied_and_loads(corpus, tmp_path):
    from transformers import AutoTokenizer

    directory, _ = corpus
    train(directory, tmp_path / "trained")
    (tmp_path / "trained" / "model.safetensors").write_bytes(b"weights are not copied")

    train_tokenizer(
        TrainTokenizerConfig(pretrained=str(tmp_path / "trained"), output_path=str(tmp_path / "copy"))
    )

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / "copy" / name).read_bytes() == (tmp_path / "trained" / name).read_bytes()
    assert not (tmp_path / "copy" / "model.safetensors").exists()
    stats = json.loads((tmp_path / "copy" / "stats.json").read_text())
    assert stats["kind"] == "copied" and stats["source"] == str(tmp_path / "trained")
    assert AutoTokenizer.from_pretrained(str(tmp_path / "copy")).eos_token == ENDOFTEXT


def test_directory_that_is_not_a_tokenizer_is_rejected_and_nothing_is_written(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot load it"):
        train_tokenizer(
            TrainTokenizerConfig(pretrained=str(tmp_path / "bad"), output_path=str(tmp_path / "out"))
        )
    assert not (tmp_path / "out").exists()


def test_missing_tokenizer_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such tokenizer directory"):
        train_tokenizer(
            TrainTokenizerConfig(pretrained=str(tmp_path / "nope"), output_path=str(tmp_path / "out"))
        )


def test_document_without_the_text_field_names_the_file_and_field(tmp_path):
    write_documents(
        str(tmp_path / "docs" / shard_name(0)), [{"id": "a", "content": "x", "source": "", "metadata": {}}]
    )
    with pytest.raises(ValueError, match=r"document 'a' has no string field 'text'"):
        train(str(tmp_path / "docs"), tmp_path / "tok")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"vocab_size": 200}, "must exceed 257"),
        ({"min_frequency": 0}, "min_frequency"),
        ({"heldout_fraction": 1.0}, "heldout_fraction"),
        ({"input_path": None}, "set input_path"),
    ],
)
def test_bad_settings_are_rejected_with_the_field_named(tmp_path, fields, message):
    config = {"input_path": str(tmp_path), "output_path": str(tmp_path / "out"), **fields}
    with pytest.raises(ValueError, match=message):
        train_tokenizer(TrainTokenizerConfig(**config))
