"""The data half of a study, on the embedded corpus (the running Python's standard library).

    python experiments/tutorials/stdlib_data.py                      # ~1,790 files
    python experiments/tutorials/stdlib_data.py --dry_run true       # the plan only
    STDLIB_MAX_FILES=200 python experiments/tutorials/stdlib_data.py # a quick subset

download -> documents -> filter (code rules) -> dedup (exact + MinHash) -> tokenizer ->
tokenize (a Levanter cache with train/validation splits). Each stage writes stats.json
in its output directory; re-running skips every finished stage.
"""

import os

from executor import executor_main
from marin.defaults import (
    default_dedup,
    default_documents,
    default_filter,
    default_tokenize,
    default_train_tokenizer,
    stdlib_download,
)
from operations.filter import default_code_rules


def build_steps(max_files: int | None = None, vocab_size: int = 4096):
    raw = stdlib_download(max_files=max_files)
    name = "stdlib" if max_files is None else f"stdlib-{max_files}"
    documents = default_documents(name, raw)
    filtered = default_filter(name, documents, default_code_rules())
    deduped = default_dedup(name, filtered)
    tokenizer = default_train_tokenizer(f"{name}-bpe{vocab_size}", deduped, vocab_size=vocab_size)
    tokenized = default_tokenize(name, deduped, tokenizer)
    return [raw, documents, filtered, deduped, tokenizer, tokenized]


if __name__ == "__main__":
    limit = os.environ.get("STDLIB_MAX_FILES")
    executor_main(
        steps=build_steps(int(limit) if limit else None),
        description="Data pipeline on the Python standard library.",
    )
