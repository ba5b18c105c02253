"""`executor_main`: the command line of every experiment script (draccus, as in Marin).

    python experiments/my_study.py --prefix /data/marin --dry_run true
    python experiments/my_study.py --run_only 'tokenized/.*' --max_concurrent 4

The prefix defaults to `$MARIN_PREFIX`, then to `./marin-output`.
"""

# No `from __future__ import annotations`: draccus reads the config annotation at run time.

import dataclasses
import json
import logging
import os
import sys
from typing import Optional

import draccus

from executor.executor import Executor
from executor.graph import StepDefinitionError
from executor.runner import ExecutorRunError
from executor.steps import ExecutorStep
from executor.store import StoreError

DEFAULT_PREFIX = "./marin-output"


@dataclasses.dataclass(frozen=True)
class ExecutorMainConfig:
    """Flags shared by every experiment script."""

    prefix: Optional[str] = None  # noqa: UP045 (draccus needs typing.Optional on some versions)
    """Where outputs go: a local directory or an fsspec URL (s3://, gs://). Default: $MARIN_PREFIX,
    else ./marin-output."""

    executor_info_base_path: Optional[str] = None  # noqa: UP045
    """Where experiment manifests go. Default: <prefix>/experiments."""

    dry_run: bool = False
    """Print the plan (what would run, and why) without running or writing anything."""

    force_run_failed: bool = True
    """Re-run steps that failed before (otherwise they are an error)."""

    run_only: Optional[list[str]] = None  # noqa: UP045
    """Regexes (matched from the start of step names): run only these steps and the blocking
    dependencies they need that have not succeeded. One regex, or a list: '["a/.*", "b"]'."""

    max_concurrent: Optional[int] = None  # noqa: UP045
    """At most this many steps run at once in the driver (default 32)."""


def resolve_prefix(prefix: Optional[str]) -> str:  # noqa: UP045
    return prefix or os.environ.get("MARIN_PREFIX") or DEFAULT_PREFIX


def _single_regex_as_list(argv: list[str]) -> list[str]:
    """Let `--run_only 'tokenized/.*'` mean `--run_only '["tokenized/.*"]'` (draccus wants a list)."""
    out = list(argv)
    for index, arg in enumerate(out):
        if arg == "--run_only" and index + 1 < len(out) and not out[index + 1].lstrip().startswith("["):
            out[index + 1] = json.dumps([out[index + 1]])
        elif arg.startswith("--run_only=") and not arg.split("=", 1)[1].lstrip().startswith("["):
            out[index] = "--run_only=" + json.dumps([arg.split("=", 1)[1]])
    return out


def executor_main(steps: list[ExecutorStep], description: Optional[str] = None):  # noqa: UP045
    """Run `steps` with the flags given on the command line (see ExecutorMainConfig). Returns the Executor."""
    sys.argv = _single_regex_as_list(sys.argv)
    return _executor_main(steps=steps, description=description)


@draccus.wrap()
def _executor_main(config: ExecutorMainConfig, steps: list[ExecutorStep], description: Optional[str] = None):  # noqa: UP045
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prefix = resolve_prefix(config.prefix)
    if config.prefix is None and "MARIN_PREFIX" not in os.environ:
        print(f"No --prefix and no $MARIN_PREFIX: writing under {os.path.abspath(prefix)}", flush=True)
    executor = Executor(prefix, config.executor_info_base_path, description=description)
    try:
        executor.run(
            steps,
            dry_run=config.dry_run,
            run_only=config.run_only,
            force_run_failed=config.force_run_failed,
            max_concurrent=config.max_concurrent,
        )
    except (ExecutorRunError, StepDefinitionError, StoreError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    if not config.dry_run and executor.executor_info_path:
        print(f"Experiment manifest: {executor.executor_info_path}", flush=True)
    return executor
