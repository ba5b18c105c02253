"""Every step on buckets: the quickstart with `--prefix s3://...` and `--prefix gs://...`.

The servers are real (SeaweedFS for S3, fake-gcs-server for GCS, both on 127.0.0.1, started
once per session by tests/operations/servers.py), and they are given to the code the way a
user would give them: by the standard variables alone (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION; STORAGE_EMULATOR_HOST), no TENSORSTORE_GCS_HTTP_URL.

- The quickstart (at the integration test's tiny settings) runs as a command from an empty
  working directory, with its own TMPDIR and HOME; afterwards the working directory and
  TMPDIR are empty and HOME holds only W&B's own per-user state, while the bucket holds the
  Levanter caches, checkpoints, HF export, metrics, Levanter's log, W&B's offline run and the
  evaluation. A second run (in this process) is fully cached.
- A training run on a bucket SIGKILLed after its first checkpoint resumes from that
  checkpoint on the bucket, with its metrics continuous across the kill.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import time

import pytest

from tests.operations.buckets import REPO, WANDB_HOME_STATE, Bucket, child_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The integration quickstart test's settings (tests/integration/test_quickstart.py).
QUICKSTART = {"QUICKSTART_MAX_FILES": "120", "QUICKSTART_STEPS": "8", "QUICKSTART_VOCAB": "512"}


def local_files(root: pathlib.Path) -> list[str]:
    """Every file and directory under `root`, relative, sorted."""
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def one(files: dict[str, int], pattern: str) -> str:
    """The one path in `files` matching the glob `pattern` (that it exists and is not empty)."""
    matches = [path for path in files if pathlib.PurePosixPath(path).match(pattern)]
    assert len(matches) == 1, f"{pattern}: {matches or 'no such object'}"
    assert files[matches[0]] > 0, f"{matches[0]} is empty"
    return matches[0]


def test_quickstart_runs_on_a_bucket_then_from_cache_writing_nothing_locally(
    bucket_env, tmp_path, monkeypatch
):
    bucket = bucket_env
    cwd, tmp, home = (tmp_path / name for name in ("cwd", "tmp", "home"))
    for directory in (cwd, tmp, home):
        directory.mkdir()
    result = subprocess.run(
        [sys.executable, str(REPO / "experiments" / "quickstart.py"), "--prefix", bucket.prefix],
        cwd=cwd,
        env=child_env(bucket, TMPDIR=str(tmp), HOME=str(home), **QUICKSTART),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-5000:]
    assert "8 ran, 0 cached, 0 failed" in result.stdout
    assert f"train      {bucket.prefix}/checkpoints/quickstart-nano-" in result.stdout  # the summary

    # Nothing under the working directory or TMPDIR; under HOME only W&B's per-user state.
    assert local_files(cwd) == []
    assert local_files(tmp) == []
    home_files = [path for path in local_files(home) if (home / path).is_file()]
    assert [path for path in home_files if not path.startswith(WANDB_HOME_STATE)] == []

    # The bucket holds every output, the Levanter parts included.
    files = bucket.files()
    tokenized = one(files, "tokenized/stdlib-120-*/stats.json").rsplit("/", 1)[0]
    for split in ("train", "validation"):
        one(files, f"{tokenized}/{split}/shard_ledger.json")
        one(files, f"{tokenized}/{split}/input_ids/data/zarr.json")
        one(files, f"{tokenized}/{split}/input_ids/data/c/0")
    run = one(files, "checkpoints/quickstart-nano-*/stats.json").rsplit("/", 1)[0]
    for step in (4, 7):  # steps_per_checkpoint = 4, and the forced final one
        one(files, f"{run}/checkpoints/step-{step}/metadata.json")
        one(files, f"{run}/checkpoints/step-{step}/model/lm_head/weight/.zarray")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        one(files, f"{run}/hf/step-7/{name}")
    one(files, f"{run}/hf_reference/config.json")
    one(files, f"{run}/metrics.jsonl")
    one(files, f"{run}/logs/*.log")
    assert [
        path for path in files if path.startswith(f"{run}/wandb/offline-run-") and path.endswith(".wandb")
    ]
    one(files, "evaluation/quickstart-nano-*/results.json")
    stats = json.loads(bucket.fs.cat(f"{bucket.prefix}/{run}/stats.json"))
    assert stats["final_checkpoint_step"] == 7 and stats["final_train_loss"] > 0

    # A second run, here in this process from the same working directory, runs nothing.
    from executor import Executor
    from executor.events import StepStarted
    from experiments.quickstart import quickstart_steps

    monkeypatch.chdir(cwd)
    again = Executor(bucket.prefix, console=False)
    again.run(list(quickstart_steps(max_files=120, steps=8, learning_rate=3e-3, vocab_size=512).values()))
    assert [e for e in again.events if isinstance(e, StepStarted)] == []
    assert local_files(cwd) == []


# Enough steps that the run is still going when it is killed after its first checkpoint (step
# 10): the 50 steps after it take ~7 s here, its compilation before it ~30 s.
FINAL_STEP = 59


def checkpoint_steps(bucket: Bucket, run: str) -> list[int]:
    """Steps of the run's checkpoints whose metadata is complete, listed afresh on the bucket."""
    steps = []
    for path in bucket.files(run):
        if path.startswith("checkpoints/") and path.endswith("/metadata.json"):
            steps.append(json.loads(bucket.fs.cat(f"{bucket.prefix}/{run}/{path}"))["step"])
    return sorted(steps)


@pytest.fixture
def bucket_data(bucket_env, tmp_path) -> tuple[str, str]:
    """A tiny tokenized dataset and its tokenizer, both on the bucket."""
    from operations.tokenize import TokenizeConfig, tokenize
    from operations.tokenizer import TrainTokenizerConfig, train_tokenizer
    from tests.operations.test_tokenizer import make_corpus

    make_corpus(str(tmp_path / "docs"), documents=600, shards=2)
    tokenizer = f"{bucket_env.prefix}/tokenizer"
    train_tokenizer(
        TrainTokenizerConfig(input_path=str(tmp_path / "docs"), output_path=tokenizer, vocab_size=400)
    )
    tokenized = f"{bucket_env.prefix}/tokenized"
    tokenize(TokenizeConfig(str(tmp_path / "docs"), tokenizer, tokenized, validation_fraction=0.1))
    return tokenized, tokenizer


# On S3 only: the quickstart on gs:// already reads checkpoints back from the bucket (eval, the
# HF export), and a second storage would add ~90 s (two JAX compilations) for little more
# (passes on gs:// too: `-k resumes` after removing this mark).
@pytest.mark.parametrize("bucket", ["s3"], indirect=True)
def test_a_killed_training_run_on_a_bucket_resumes_from_its_bucket_checkpoint(
    bucket_env, bucket_data, tmp_path
):
    from marin.models import MODELS
    from operations.train import SimpleTrainConfig, TrainConfig, read_metrics, train

    bucket = bucket_env
    tokenized, tokenizer = bucket_data
    config = TrainConfig(
        tokenized_path=tokenized,
        tokenizer=tokenizer,
        model=MODELS["llama_nano"],
        train=SimpleTrainConfig(
            train_batch_size=8,
            num_train_steps=FINAL_STEP + 1,
            learning_rate=3e-3,
            steps_per_eval=30,
            steps_per_checkpoint=10,
            max_eval_batches=2,
            epochs=5,
        ),
        output_path=f"{bucket.prefix}/run",
    )
    config_file = tmp_path / "config.pkl"
    config_file.write_bytes(pickle.dumps(config))
    (tmp_path / "killed-tmp").mkdir()
    code = (
        "import pickle, sys; from operations.train import train; train(pickle.load(open(sys.argv[1], 'rb')))"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(config_file)],
        cwd=tmp_path,
        # Its own TMPDIR: a SIGKILLed process leaves its temporary copies and staging behind.
        env=child_env(bucket, TMPDIR=str(tmp_path / "killed-tmp")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while not checkpoint_steps(bucket, "run"):
            assert process.poll() is None, "training exited before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint on the bucket within 180 s"
            time.sleep(0.2)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL
    killed_at = checkpoint_steps(bucket, "run")[-1]
    assert killed_at < FINAL_STEP

    train(config)

    stats = json.loads(bucket.fs.cat(f"{bucket.prefix}/run/stats.json"))
    assert stats["attempts"] == [{"resumed_from_step": killed_at, "seconds": stats["attempts"][0]["seconds"]}]
    assert checkpoint_steps(bucket, "run")[-1] == FINAL_STEP
    # Metrics on a bucket are rewritten at each checkpoint: the killed attempt's survive up to
    # the checkpoint it was resumed from, and no step is logged twice (but the last, which
    # Levanter logs again when it forces its hooks at the end).
    lines = [
        json.loads(line)
        for line in bucket.fs.cat(f"{config.output_path}/metrics.jsonl").decode().splitlines()
    ]
    steps = [line["step"] for line in lines if "train/loss" in line]
    before_last = [step for step in steps if step != FINAL_STEP]
    assert len(before_last) == len(set(before_last))
    assert set(range(0, FINAL_STEP + 1)) - {killed_at} <= set(steps)
    assert [m["step"] for m in read_metrics(config.output_path)] == list(range(0, FINAL_STEP + 1))
    # Levanter's log file, uploaded when an attempt ends (the killed attempt's died with it).
    (log,) = [path for path in bucket.files("run/logs") if path.endswith(".log")]
    log_text = bucket.fs.cat(f"{config.output_path}/logs/{log}").decode()
    assert f"Resuming training from step {killed_at + 1}" in log_text
    assert not [path for path in os.listdir(tmp_path) if path not in ("config.pkl", "docs", "killed-tmp")]
