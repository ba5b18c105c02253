"""Hugging Face Hub names where the operations want local directories.

Marin's experiments name tokenizers by their Hub id (`"marin-community/marin-tokenizer"`,
`"meta-llama/Meta-Llama-3.1-8B"`); training, evaluation and tokenizing here load a
tokenizer *directory*. This module bridges the two, at run time:

- `is_hub_id(value)`: whether a string names a Hub repository (`gpt2`, `org/name`) rather
  than a path or URL. Decided the way Marin's `default_tokenize` does: no URL scheme, at
  most one "/", and nothing by that name on local disk.
- `resolve_tokenizer(name_or_path)`: a local directory holding the tokenizer's files. A Hub
  id is fetched with `huggingface_hub.snapshot_download` (only the tokenizer's files, never
  weights), which honours `HF_ENDPOINT` (another Hub, or a test's fake one), `HF_HOME` /
  `HF_HUB_CACHE` (where the cache lives: never the working directory) and
  `HF_HUB_OFFLINE` (use the cache only). A path or bucket URL is returned unchanged.
- `train_with_hub_tokenizer`, `evaluate_with_hub_tokenizer`, `tokenize_with_hub_tokenizer`:
  step functions that resolve the config's tokenizer and call the operation. The config
  keeps the Hub id -- that is what the step's version records, so the hash does not depend
  on where a machine's cache is -- and the resolution happens when the step runs, on the
  machine that runs it (a dry run or building the script fetches nothing).

`marin.defaults` picks these wrappers only when the tokenizer is a Hub id; a step whose
tokenizer is a tokenizer step or a directory calls the operation directly.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
from typing import Any

from operations import run_records

logger = logging.getLogger(__name__)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
    "chat_template.jinja",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.model",  # sentencepiece
    "*.tiktoken",
    "config.json",  # AutoTokenizer reads the model type from it when tokenizer_config has no class
    "generation_config.json",
)
"""What `resolve_tokenizer` fetches from a repository (patterns of `allow_patterns`): the
tokenizer, never the weights."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


def is_hub_id(value: Any) -> bool:
    """True for a string naming a Hub repository (`gpt2`, `org/name`): no URL scheme, at most
    one "/", letters, digits, `_ . -`, and no file or directory of that name here."""
    if not isinstance(value, str) or "://" in value or not _HUB_ID.match(value):
        return False
    return not os.path.exists(value)


def hub_endpoint() -> str:
    """The Hub that Hub ids resolve against: `HF_ENDPOINT` (read now, not only when
    huggingface_hub was imported), else huggingface.co."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or constants.ENDPOINT


def hub_cache() -> str:
    """Where fetched files go: `HF_HUB_CACHE`, else `$HF_HOME/hub`, else huggingface_hub's default
    (~/.cache/huggingface/hub) -- never the working directory."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return str(constants.HF_HUB_CACHE)


@functools.cache
def _snapshot(repo_id: str, revision: str | None, endpoint: str, cache_dir: str) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return snapshot_download(
            repo_id,
            repo_type="model",
            revision=revision,
            allow_patterns=list(TOKENIZER_FILES),
            endpoint=endpoint,
            cache_dir=cache_dir,
        )
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as error:
        raise ValueError(
            f"tokenizer {repo_id!r}: cannot fetch it from the Hub at {endpoint} (and it is not in "
            f"the cache): {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}. "
            "Check the name, HF_ENDPOINT, HF_TOKEN for a gated repository, or give a tokenizer directory"
        ) from error


def resolve_tokenizer(name_or_path: str, revision: str | None = None) -> str:
    """A local tokenizer directory for `name_or_path`: a Hub id is downloaded into the Hub cache
    (once per process; later runs find it there), a path or URL is returned as given."""
    if not is_hub_id(name_or_path):
        return name_or_path
    local = _snapshot(name_or_path, revision, hub_endpoint(), hub_cache())
    logger.info("tokenizer %s: %s", name_or_path, local)
    return local


def _with_local_tokenizer(config: Any) -> Any:
    """`config` with its `tokenizer` field resolved to a local directory."""
    return dataclasses.replace(config, tokenizer=resolve_tokenizer(config.tokenizer))


def train_with_hub_tokenizer(config: Any) -> None:
    """`operations.train.train`, with a Hub tokenizer id resolved to a local directory first."""
    from operations.train import train

    train(_with_local_tokenizer(config))


def evaluate_with_hub_tokenizer(config: Any) -> None:
    """`operations.eval.evaluate`, with a Hub tokenizer id resolved to a local directory first."""
    from operations.eval import evaluate

    evaluate(_with_local_tokenizer(config))


# What the wrapped functions record about their run (see operations/run_records.py).
train_with_hub_tokenizer.__run_records__ = run_records.TRAIN  # type: ignore[attr-defined]
evaluate_with_hub_tokenizer.__run_records__ = run_records.EVAL  # type: ignore[attr-defined]


def tokenize_with_hub_tokenizer(config: Any) -> None:
    """`operations.tokenize.tokenize`, with a Hub tokenizer id resolved to a local directory first."""
    from operations.tokenize import tokenize

    tokenize(_with_local_tokenizer(config))
