"""Marin's tutorials, ported: the real scripts run as a user runs them (a subprocess each),
against a fake Hugging Face Hub on 127.0.0.1 that `HF_ENDPOINT` points the real
huggingface_hub client at (tests/fake_hub.py), with a temporary prefix and Hub cache."""

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_hub import jsonl_bytes, parquet_bytes, serve_hub, stories, tokenizer_files

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "experiments" / "tutorials"


def run_script(
    script: str, tmp_path: Path, endpoint: str, *flags: str, **env: str
) -> subprocess.CompletedProcess:
    """Run a tutorial from a scratch directory (nothing may land in the checkout), with the Hub
    at `endpoint`, its cache under tmp_path/hf, outputs under tmp_path/prefix."""
    environment = {
        **os.environ,
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "WANDB_MODE": "offline",
        **env,
    }
    environment.pop("MARIN_PREFIX", None)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    result = subprocess.run(
        [sys.executable, str(TUTORIALS / script), "--prefix", str(tmp_path / "prefix"), *flags],
        cwd=work,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    return result


def only(pattern: str) -> Path:
    matches = glob.glob(pattern)
    assert len(matches) == 1, f"{pattern}: {matches}"
    return Path(matches[0])


# ---------------------------------------------------------------------------- download_dataset

PROVER_BENCH = {
    ("dataset", "deepseek-ai/DeepSeek-ProverBench"): {
        "3b9f067": {
            "README.md": b"# ProverBench (pinned)\n",
            "data/test.jsonl": jsonl_bytes(
                [{"id": i, "statement": f"theorem t{i} : {i} = {i}"} for i in range(5)]
            ),
        },
        "main": {"README.md": b"# ProverBench (newer)\n", "data/test.jsonl": b"{}\n"},
    }
}


def test_download_dataset_fetches_the_pinned_revision_from_the_hub(tmp_path):
    with serve_hub(PROVER_BENCH) as endpoint:
        run_script("download_dataset.py", tmp_path, endpoint)
        output = only(str(tmp_path / "prefix" / "raw" / "deepseek-prover-bench-*"))
        pinned = PROVER_BENCH[("dataset", "deepseek-ai/DeepSeek-ProverBench")]["3b9f067"]
        for path, data in pinned.items():
            assert (output / path).read_bytes() == data
        manifest = json.loads((output / "manifest.json").read_text())
        assert manifest["revision"] == "3b9f067"
        assert sorted(entry["path"] for entry in manifest["files"]) == sorted(pinned)
        info = json.loads((output / ".executor_info").read_text())
        assert info["config"]["source"] == "hf://datasets/deepseek-ai/DeepSeek-ProverBench"

        again = run_script("download_dataset.py", tmp_path, endpoint, "--dry_run", "true")
        assert "Plan: 1 steps (1 skip)" in again.stdout
    assert not list((tmp_path / "work").iterdir()), "the script wrote into its working directory"


def test_download_dataset_from_a_local_path(tmp_path):
    source = tmp_path / "corpus"
    (source / "sub").mkdir(parents=True)
    (source / "a.jsonl").write_text('{"text": "one"}\n')
    (source / "sub" / "b.txt").write_text("two")
    run_script("download_dataset.py", tmp_path, "http://127.0.0.1:9", DOWNLOAD_SOURCE=str(source))
    output = only(str(tmp_path / "prefix" / "raw" / "local-dataset-*"))
    assert (output / "a.jsonl").read_text() == '{"text": "one"}\n'
    assert (output / "sub" / "b.txt").read_text() == "two"


# ---------------------------------------------------------------------------- train_tiny_model_cpu

TRAIN_STEPS = 20


def tiny_hub() -> dict:
    texts = stories(1500, seed=1)
    return {
        ("dataset", "roneneldan/TinyStories"): {
            "main": {
                "README.md": b"Tiny stories, made up by tests/fake_hub.py\n",
                "data/train-00000-of-00001.parquet": parquet_bytes([{"text": text} for text in texts]),
            }
        },
        ("model", "marin-community/marin-tokenizer"): {"main": tokenizer_files(stories(300, seed=2))},
    }


def test_train_tiny_model_cpu_tokenizes_a_hub_dataset_with_a_hub_tokenizer_and_trains(tmp_path):
    with serve_hub(tiny_hub()) as endpoint:
        run_script("train_tiny_model_cpu.py", tmp_path, endpoint, TUTORIAL_TRAIN_STEPS=str(TRAIN_STEPS))
        prefix = tmp_path / "prefix"
        raw = only(f"{prefix}/raw/roneneldan/TinyStories-*")
        assert (raw / "data" / "train-00000-of-00001.parquet").is_file()
        documents = json.loads(
            (only(f"{prefix}/documents/roneneldan/TinyStories-*") / "stats.json").read_text()
        )
        assert documents["documents"] == 1501  # 1500 parquet rows + the README
        sampled = json.loads((only(f"{prefix}/sampled/roneneldan/TinyStories-*") / "stats.json").read_text())
        assert (sampled["documents"], sampled["documents_skipped"]) == (1000, 501)
        tokenized = only(f"{prefix}/tokenized/roneneldan/TinyStories-*")
        counts = json.loads((tokenized / "stats.json").read_text())
        assert counts["train"]["documents"] + counts["validation"]["documents"] == 1000

        trained = only(f"{prefix}/checkpoints/marin-nano-tinystories-*")
        assert (trained / "checkpoints" / f"step-{TRAIN_STEPS - 1}").is_dir(), "final checkpoint missing"
        losses = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
        assert [m for m in losses if "train/loss" in m], "no training loss logged"
        info = json.loads((trained / ".executor_info").read_text())
        # The version holds the Hub id, not a machine's cache path; the tokenizer came from the fake Hub.
        assert info["config"]["tokenizer"] == "marin-community/marin-tokenizer"
        assert info["config"]["model"]["hidden_dim"] == 64
        assert info["config"]["train"]["learning_rate"] == 6e-4
        assert glob.glob(
            f"{tmp_path}/hf/hub/models--marin-community--marin-tokenizer/snapshots/*/tokenizer.json"
        )

        again = run_script(
            "train_tiny_model_cpu.py",
            tmp_path,
            endpoint,
            "--dry_run",
            "true",
            TUTORIAL_TRAIN_STEPS=str(TRAIN_STEPS),
        )
        assert "Plan: 5 steps (5 skip)" in again.stdout
    assert not list((tmp_path / "work").iterdir()), "the script wrote into its working directory"
