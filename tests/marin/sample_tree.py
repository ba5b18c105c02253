"""A small experiment whose output tree the CLI and browser tests read.

A real executor run of real operations: a corpus with planted junk and duplicates ->
documents -> filtered -> dedup, a metrics step shaped like a training run's output
(metrics.jsonl, results.json), and one step whose output differs on every run (for
`marin reproduce` to report). Step functions live at module level so the tree records
them as importable `tests.marin.sample_tree:<fn>`.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import time
from dataclasses import dataclass

from executor import Executor, ExecutorStep, LeaseConfig, this_output_path, versioned
from marin.defaults import default_dedup, default_documents, default_filter
from operations.filter import AlphanumericRatio, MinLength

STEP_NAMES = (
    "raw/notes",
    "documents/notes",
    "filtered/notes",
    "dedup/notes",
    "checkpoints/curve",
    "analysis/stamp",
)
"""The names of the steps `build_steps` declares."""

FAST_LEASES = LeaseConfig(heartbeat_interval=0.1, timeout=1.0, poll_interval=0.05)


@dataclass(frozen=True)
class CorpusConfig:
    output_path: str
    """Where the text files go."""

    documents: int = 40
    """How many files; every 10th is a copy of another, every 13th is junk."""

    seed: int = 0
    """Changes every document's text."""


def write_corpus(config: CorpusConfig) -> None:
    os.makedirs(config.output_path, exist_ok=True)
    for index in range(config.documents):
        if index % 13 == 12:
            text = "$$$ ### !!! " * 20
        else:
            source = index - 1 if index % 10 == 9 else index
            words = [f"word{(source * 7 + k * (config.seed + 3)) % 97}" for k in range(80)]
            text = f"Document {source} about topic {source % 5}.\n" + " ".join(words) + "\n"
        with open(os.path.join(config.output_path, f"doc-{index:03d}.txt"), "w") as handle:
            handle.write(text)


@dataclass(frozen=True)
class CurveConfig:
    input_path: str
    """The deduplicated documents (counted, to make the curve depend on the data)."""

    output_path: str
    learning_rate: float = 0.01
    """Scales how fast the fake loss falls."""

    steps: int = 30


def write_curve(config: CurveConfig) -> None:
    """A training-shaped output: metrics.jsonl the way operations.train writes it, results.json."""
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "metrics.jsonl"), "w") as handle:
        for step in range(config.steps):
            loss = 5.0 * math.exp(-config.learning_rate * 10 * step) + 1.0
            handle.write(
                json.dumps({"step": step, "train/loss": round(loss, 6), "optim/learning_rate": 0.01}) + "\n"
            )
            if step % 10 == 9:
                handle.write(json.dumps({"step": step, "eval/loss": round(loss + 0.2, 6)}) + "\n")
    with open(os.path.join(config.output_path, "results.json"), "w") as handle:
        json.dump({"loss": round(loss, 6), "bits_per_byte": 1.23}, handle)


@dataclass(frozen=True)
class StampConfig:
    input_path: str
    output_path: str


def write_stamp(config: StampConfig) -> None:
    """Differs on every run: reproduce must report it."""
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "stamp.txt"), "w") as handle:
        handle.write(f"{time.time_ns()}\n")
    with open(os.path.join(config.output_path, "constant.txt.gz"), "wb") as raw:
        raw.write(gzip.compress(b"same every time\n", mtime=0))


def build_steps(learning_rate: float = 0.01, seed: int = 0) -> list[ExecutorStep]:
    raw = ExecutorStep(
        name="raw/notes",
        fn=write_corpus,
        config=CorpusConfig(output_path=this_output_path(), seed=versioned(seed)),
    )
    documents = default_documents("notes", raw, target_shard_bytes=2000)
    filtered = default_filter("notes", documents, [MinLength(min_chars=50), AlphanumericRatio(min_ratio=0.5)])
    dedup = default_dedup("notes", filtered, mode="exact")
    curve = ExecutorStep(
        name="checkpoints/curve",
        fn=write_curve,
        config=CurveConfig(
            input_path=dedup, output_path=this_output_path(), learning_rate=versioned(learning_rate)
        ),
    )
    stamp = ExecutorStep(
        name="analysis/stamp",
        fn=write_stamp,
        config=StampConfig(input_path=dedup, output_path=this_output_path()),
    )
    return [raw, documents, filtered, dedup, curve, stamp]


def run(prefix: str, learning_rate: float = 0.01, seed: int = 0) -> Executor:
    executor = Executor(prefix, lease_config=FAST_LEASES, console=False)
    executor.run(build_steps(learning_rate, seed))
    return executor


@dataclass(frozen=True)
class NoteConfig:
    output_path: str
    text: str = "hello"
    """Written to note.txt (versioned by the steps below)."""


def write_note(config: NoteConfig) -> None:
    """Writes through fsspec, so the step works on any storage (the S3 tests use it)."""
    import fsspec

    with fsspec.open(f"{config.output_path}/note.txt", "w") as handle:
        handle.write(config.text + "\n")


def fail_always(config: NoteConfig) -> None:
    raise RuntimeError(f"planted failure for {config.text}")


def note_steps(text: str = "hello") -> list[ExecutorStep]:
    first = ExecutorStep(
        name="notes/first", fn=write_note, config=NoteConfig(this_output_path(), versioned(text))
    )
    second = ExecutorStep(
        name="notes/second", fn=write_note, config=NoteConfig(this_output_path(), versioned(text + "!"))
    )
    return [first, second]


def marin(capsys, *args: str) -> tuple[int, str, str]:
    """Run the `marin` command in this process: (exit code, stdout, stderr)."""
    from marin.cli import main

    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err
