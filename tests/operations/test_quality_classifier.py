"""fastText quality classifier: training separates code from junk, scoring writes and filters by score."""

import pathlib
import random
import sysconfig

import pytest

from operations.quality_classifier import (
    ScoreQualityConfig,
    TrainQualityClassifierConfig,
    normalize_text,
    score_quality,
    train_quality_classifier,
)
from operations.shards import iter_documents, read_json, write_documents

_ENGLISH_WORDS = (
    "the of and to in is was for on that with as by at from his her they this which are were be had have not "
    "but one all an their there been has more when who will would can said about out up what some into time "
    "people year very good new first last long great little own other old right big high different small large "
    "next early young important few public bad same able market house garden river morning window letter music"
)
ENGLISH = _ENGLISH_WORDS.split()


def gibberish(rng: random.Random, words: int) -> str:
    return " ".join(
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(words)
    )


def english_ish(rng: random.Random, words: int) -> str:
    sentences, left = [], words
    while left > 0:
        length = min(left, rng.randint(6, 16))
        sentence = " ".join(rng.choice(ENGLISH) for _ in range(length))
        sentences.append(sentence.capitalize() + rng.choice(".!?"))
        left -= length
    return " ".join(sentences)


def negatives(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    make = [gibberish, english_ish]
    return [
        {
            "id": f"junk-{seed}-{index}",
            "text": make[index % 2](rng, rng.randint(80, 600)),
            "source": "junk",
            "metadata": {},
        }
        for index in range(count)
    ]


def stdlib_documents(count: int) -> list[dict]:
    """`count` stdlib .py files of at least 500 characters, spread evenly over the sorted tree."""
    root = pathlib.Path(sysconfig.get_path("stdlib"))
    files = sorted(
        path for path in root.rglob("*.py") if "site-packages" not in path.parts and "test" not in path.parts
    )
    documents = []
    for path in files[:: max(1, len(files) // (count * 2))]:
        text = path.read_text(encoding="utf-8", errors="replace")
        if 500 <= len(text) <= 60_000:
            documents.append(
                {"id": str(path.relative_to(root)), "text": text, "source": "stdlib", "metadata": {}}
            )
    assert len(documents) >= count, len(documents)
    return documents[:count]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    """Training sets (positives: code; negatives: gibberish and word salad) and a held-out set of both."""
    root = tmp_path_factory.mktemp("corpora")
    code = stdlib_documents(160)
    write_documents(str(root / "positive" / "shard-00000.jsonl.gz"), code[0::2])
    write_documents(str(root / "negative" / "shard-00000.jsonl.gz"), negatives(seed=1, count=80))
    held_out = [
        document for pair in zip(code[1::2], negatives(seed=2, count=80), strict=True) for document in pair
    ]
    write_documents(str(root / "held_out" / "shard-00000.jsonl.gz"), held_out[:80])
    write_documents(str(root / "held_out" / "shard-00001.jsonl.gz"), held_out[80:])
    return {name: str(root / name) for name in ("positive", "negative", "held_out")}


def train_config(corpora: dict[str, str], output: pathlib.Path, **overrides) -> TrainQualityClassifierConfig:
    fields = {
        "positive_path": corpora["positive"],
        "negative_path": corpora["negative"],
        "output_path": str(output),
    }
    fields.update(epochs=10, lr=0.5, word_ngrams=2, dim=16, bucket=20_000, seed=3)
    fields.update(overrides)
    return TrainQualityClassifierConfig(**fields)


@pytest.fixture(scope="module")
def model_dir(corpora, tmp_path_factory) -> pathlib.Path:
    output = tmp_path_factory.mktemp("model")
    train_quality_classifier(train_config(corpora, output))
    return output


def test_training_writes_the_model_and_its_stats(model_dir):
    stats = read_json(str(model_dir / "stats.json"))
    assert (model_dir / "model.bin").stat().st_size == stats["model_bytes"]
    documents = stats["documents"]
    assert documents["positive"]["train"] + documents["positive"]["validation"] == 80
    assert documents["negative"]["train"] + documents["negative"]["validation"] == 80
    assert documents["positive"]["validation"] > 0 and documents["negative"]["validation"] > 0
    assert (
        stats["validation"]["examples"]
        == documents["positive"]["validation"] + documents["negative"]["validation"]
    )
    assert stats["train"]["accuracy"] == 1.0
    assert stats["validation"]["accuracy"] >= 0.9
    assert sorted(stats["labels"]) == ["__label__negative", "__label__positive"]


def test_trained_classifier_separates_a_held_out_set(corpora, model_dir, tmp_path):
    score_quality(
        ScoreQualityConfig(
            input_path=corpora["held_out"],
            model_path=str(model_dir),
            output_path=str(tmp_path / "all"),
            threshold=0.0,
        )
    )
    scored = list(iter_documents(str(tmp_path / "all")))
    assert len(scored) == 160
    correct = sum((doc["metadata"]["quality_score"] >= 0.5) == (doc["source"] == "stdlib") for doc in scored)
    print(f"held-out accuracy {correct / len(scored):.3f} ({correct}/{len(scored)})")
    assert correct / len(scored) > 0.9


def test_scoring_keeps_exactly_the_documents_at_or_above_the_threshold(corpora, model_dir, tmp_path):
    model_file = str(model_dir / "model.bin")
    score_quality(
        ScoreQualityConfig(
            input_path=corpora["held_out"],
            model_path=model_file,
            output_path=str(tmp_path / "all"),
            threshold=0.0,
        )
    )
    scores = {doc["id"]: doc["metadata"]["quality_score"] for doc in iter_documents(str(tmp_path / "all"))}
    assert all(0.0 <= score <= 1.0 for score in scores.values())
    threshold = sorted(scores.values())[100]  # a threshold that falls on a real score
    score_quality(
        ScoreQualityConfig(
            input_path=corpora["held_out"],
            model_path=model_file,
            output_path=str(tmp_path / "kept"),
            threshold=threshold,
        )
    )
    kept = {doc["id"]: doc["metadata"]["quality_score"] for doc in iter_documents(str(tmp_path / "kept"))}
    assert kept == {doc_id: score for doc_id, score in scores.items() if score >= threshold}
    stats = read_json(str(tmp_path / "kept" / "stats.json"))
    assert stats["documents"] == {"input": 160, "kept": len(kept), "dropped": 160 - len(kept)}
    assert sum(stats["score_histogram"].values()) == 160
    assert stats["threshold"] == threshold and stats["shards"] == 2


def test_scoring_twice_gives_byte_identical_output(corpora, model_dir, tmp_path):
    for name, workers in (("a", 1), ("b", 2)):
        score_quality(
            ScoreQualityConfig(
                input_path=corpora["held_out"],
                model_path=str(model_dir),
                output_path=str(tmp_path / name),
                workers=workers,
            )
        )
    for name in ("shard-00000.jsonl.gz", "shard-00001.jsonl.gz", "stats.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_training_twice_with_the_same_seed_gives_the_same_model_bytes(corpora, model_dir, tmp_path):
    train_quality_classifier(train_config(corpora, tmp_path / "again"))
    assert (tmp_path / "again" / "model.bin").read_bytes() == (model_dir / "model.bin").read_bytes()
    assert (tmp_path / "again" / "stats.json").read_bytes() == (model_dir / "stats.json").read_bytes()


def test_a_training_after_a_bigger_one_in_the_same_process_gives_the_same_model(corpora, tmp_path):
    # fasttext-numpy2 leaves most of its input matrix uninitialised with thread=1. Once a
    # bigger model's matrix is freed, glibc reuses that memory for the next matrix; without
    # zero-filled allocations the next training read stale weights (NaN, or another model).
    write_documents(str(tmp_path / "pos" / "shard-00000.jsonl.gz"), stdlib_documents(40))
    write_documents(str(tmp_path / "neg" / "shard-00000.jsonl.gz"), negatives(seed=3, count=40))
    paths = {"positive_path": str(tmp_path / "pos"), "negative_path": str(tmp_path / "neg")}
    train_quality_classifier(train_config(corpora, tmp_path / "small-1", **paths))
    train_quality_classifier(train_config(corpora, tmp_path / "big", dim=64, bucket=100_000, **paths))
    train_quality_classifier(train_config(corpora, tmp_path / "small-2", **paths))
    assert (tmp_path / "small-1" / "model.bin").read_bytes() == (
        tmp_path / "small-2" / "model.bin"
    ).read_bytes()


def test_an_unknown_label_names_the_labels_the_model_has(corpora, model_dir, tmp_path):
    config = ScoreQualityConfig(
        input_path=corpora["held_out"],
        model_path=str(model_dir),
        output_path=str(tmp_path / "out"),
        label="hq",
    )
    with pytest.raises(
        ValueError,
        match="label 'hq' is not in the model .*its labels: (positive, negative|negative, positive)",
    ):
        score_quality(config)


def test_a_missing_model_says_how_to_get_one(corpora, tmp_path):
    config = ScoreQualityConfig(
        input_path=corpora["held_out"],
        model_path=str(tmp_path / "nothing"),
        output_path=str(tmp_path / "out"),
    )
    with pytest.raises(FileNotFoundError, match="no fastText model at .*train_quality_classifier"):
        score_quality(config)


def test_an_empty_class_is_refused_with_its_path(corpora, tmp_path):
    write_documents(str(tmp_path / "blank" / "shard-00000.jsonl.gz"), [{"id": "a", "text": "  \n "}])
    config = train_config(corpora, tmp_path / "out", negative_path=str(tmp_path / "blank"))
    with pytest.raises(ValueError, match="no negative training documents under .*blank"):
        train_quality_classifier(config)


def test_text_is_lowercased_and_put_on_one_line():
    assert normalize_text("  Def  Foo():\n\treturn 1\r\n") == "def foo(): return 1"
