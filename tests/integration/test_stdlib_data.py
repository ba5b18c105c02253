"""The data half of a study, end to end through the executor, on a slice of the stdlib corpus."""

import json
import os

import pytest

from executor import Executor
from executor.events import StepSkipped, StepStarted
from executor.tree import Status, read_last_status
from experiments.tutorials.stdlib_data import build_steps
from operations.shards import iter_documents

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_stdlib_data_pipeline_runs_end_to_end_and_then_from_cache(tmp_path):
    steps = build_steps(max_files=150, vocab_size=1024)
    executor = Executor(str(tmp_path), console=False)
    executor.run(steps)
    raw, documents, filtered, deduped, tokenizer, tokenized = (executor.output_paths[s] for s in steps)
    for path in (raw, documents, filtered, deduped, tokenizer, tokenized):
        assert read_last_status(executor.store, path).status == Status.SUCCESS
        assert os.path.exists(os.path.join(path, "stats.json")), path
    assert os.path.basename(raw).startswith("python") and "-stdlib-" in os.path.basename(raw)

    def stats(path):
        with open(os.path.join(path, "stats.json")) as handle:
            return json.load(handle)

    assert stats(raw)["files"] == 150
    docs = list(iter_documents(documents))
    kept = list(iter_documents(filtered))
    unique = list(iter_documents(deduped))
    assert len(unique) <= len(kept) <= len(docs) <= 150
    assert stats(filtered)["documents"]["kept"] == len(kept)
    assert stats(filtered)["documents"]["input"] == len(docs)
    assert stats(deduped)["documents_out"] == len(unique)
    token_stats = stats(tokenized)
    assert token_stats["train"]["documents"] + token_stats["validation"]["documents"] == len(unique)
    assert token_stats["train"]["tokens"] > 0 and token_stats["validation"]["tokens"] > 0

    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(tokenizer)
    assert loaded.decode(loaded("def f(x):\n    return x")["input_ids"]) == "def f(x):\n    return x"

    again = Executor(str(tmp_path), console=False)
    again.run(build_steps(max_files=150, vocab_size=1024))
    assert not [e for e in again.events if isinstance(e, StepStarted)]
    assert len([e for e in again.events if isinstance(e, StepSkipped)]) == 6


def test_changing_the_vocabulary_reruns_only_tokenizer_and_tokenize(tmp_path):
    Executor(str(tmp_path), console=False).run(build_steps(max_files=60, vocab_size=512))
    executor = Executor(str(tmp_path), console=False)
    plan = executor.run(build_steps(max_files=60, vocab_size=640), dry_run=True)
    actions = {row.name.split("/")[0]: row.action.value for row in plan.rows}
    assert actions == {
        "raw": "skip",
        "documents": "skip",
        "filtered": "skip",
        "dedup": "skip",
        "tokenizers": "run",
        "tokenized": "blocked",
    }
    tokenizer_row = next(row for row in plan.rows if row.name.startswith("tokenizers/"))
    assert tokenizer_row.name.endswith("bpe640")
