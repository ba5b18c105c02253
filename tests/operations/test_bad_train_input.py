"""Bad training and evaluation configs, given as a researcher really gets them wrong.

The rule: bad input is ONE error line naming the config field and what to do, raised before
anything is compiled (most before anything is read or written); never only a deep JAX,
Haliax or Levanter traceback, never a step that returns normally (the executor would mark it
successful) with wrong output, never a checkpoint that was not committed taken as the one to
resume from. Each test says what the code did before it was written; docs/gpu.md, "Bad
training and evaluation input", says what is checked when.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marin.models import MODELS, model_spec
from operations.eval import EvalConfig, evaluate
from operations.tokenize import TokenizeConfig, tokenize
from operations.tokenizer import TrainTokenizerConfig, train_tokenizer
from operations.train import SimpleTrainConfig, TrainConfig, latest_checkpoint_step, read_metrics, train
from tests.operations import test_train
from tests.operations.test_train import checkpoint_steps, nano_config, signal_after_first_checkpoint

REPO = Path(__file__).resolve().parents[2]
NANO = MODELS["llama_nano"]
data = test_train.data  # the fixture: a tiny tokenized dataset (~26k training tokens) and its tokenizer


def dummy_config(tmp_path: Path, model=NANO, **train_fields) -> TrainConfig:
    """A config whose paths exist but hold nothing: the settings checks must fire first."""
    fields = dict(train_batch_size=8, num_train_steps=10, learning_rate=3e-3)
    fields.update(train_fields)
    return TrainConfig(
        tokenized_path=str(tmp_path),
        tokenizer=str(tmp_path),
        model=model,
        train=SimpleTrainConfig(**fields),
        output_path=str(tmp_path / "out"),
        tracker="none",
    )


def refused(config, error=ValueError, seconds=2.0):
    """Run `train` or `evaluate` on `config`; the one-line message of the error it must raise quickly."""
    run = evaluate if isinstance(config, EvalConfig) else train
    started = time.perf_counter()
    with pytest.raises(error) as caught:
        run(config)
    elapsed = time.perf_counter() - started
    message = str(caught.value)
    assert "\n" not in message, message
    assert elapsed < seconds, f"took {elapsed:.1f} s to fail: {message}"
    return message


def assert_nothing_written(output_path: str) -> None:
    assert not os.path.exists(output_path), sorted(os.listdir(output_path))


# ---------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "fields, shown, says",
    [
        # Before: trained uphill (loss 6.4 -> 8.1 in 5 steps) and succeeded.
        ({"learning_rate": -3e-3}, "learning_rate=-0.003", "must be a finite number >= 0"),
        # Before: "RuntimeError: Loss is NaN" from Levanter's trainer after ~17 s of compiling and a step.
        ({"learning_rate": math.nan}, "learning_rate=nan", "must be a finite number >= 0"),
        ({"learning_rate": math.inf}, "learning_rate=inf", "must be a finite number >= 0"),
        # Before: "TypeError: can't multiply sequence by non-int of type 'float'" in levanter/optim/config.py.
        ({"learning_rate": "3e-3"}, "learning_rate='3e-3'", "(a str: write the number itself)"),
        # Before: "TypeError: '<' not supported between instances of 'str' and 'int'", no field named.
        ({"train_batch_size": "8"}, "train_batch_size='8'", "must be an integer >= 1"),
        # Before: trained 4 steps (0..3) and succeeded.
        ({"num_train_steps": 3.5}, "num_train_steps=3.5", "must be an integer >= 1"),
        ({"num_train_steps": -5}, "num_train_steps=-5", "must be"),  # already so; pinned
        # Before: 0 was read as None (the model's 128) and the run succeeded; -64 was refused as
        # "-402 sequences of -64".
        ({"seq_len": 0}, "seq_len=0", "must be an integer >= 1, or None: the model's seq_len"),
        ({"seq_len": -64}, "seq_len=-64", "must be an integer >= 1"),
        # Before: "IndexError: list index out of range" in levanter/eval.py after ~9 s.
        ({"max_eval_batches": 0}, "max_eval_batches=0", "or None: the whole validation set"),
        # Before: Levanter's "Invalid fraction -1. Must be between 0 and 1", no field named.
        ({"warmup": -1}, "warmup=-1", "a fraction of the steps in [0, 1], or a whole number of steps"),
        ({"warmup": 1.5}, "warmup=1.5", "a fraction of the steps in [0, 1], or a whole number of steps"),
        ({"decay": 1.5}, "decay=1.5", "a fraction of the steps in [0, 1], or a whole number of steps"),
        # Before: trained and succeeded (the rate rose to twice its peak; weight growth).
        ({"min_lr_ratio": 2.0}, "min_lr_ratio=2.0", "must be in [0, 1]"),
        ({"weight_decay": -0.1}, "weight_decay=-0.1", "must be >= 0"),
        # Before: "RuntimeError: coroutine raised StopIteration" in levanter/data/dataset.py.
        ({"epochs": -1}, "epochs=-1", "must be an integer >= 0"),
        # Before: 0 meant "never" (read as None); -1 trained the whole run, wrote no checkpoint and
        # then failed: "training ended at checkpoint step None, expected 2".
        ({"checkpoint_minutes": 0}, "checkpoint_minutes=0", "must be > 0, or None"),
        ({"checkpoint_minutes": -1}, "checkpoint_minutes=-1", "must be > 0, or None"),
        # Before: 0 was read as None (export at the end only).
        ({"steps_per_export": 0}, "steps_per_export=0", "or None: only at the end"),
        ({"beta1": "0.9"}, "beta1='0.9'", "must be in [0, 1)"),
    ],
)
def test_bad_settings_fail_when_the_step_starts_naming_the_field(tmp_path, fields, shown, says):
    config = dummy_config(tmp_path, **fields)
    message = refused(config)
    assert message.startswith(f"SimpleTrainConfig.{shown}: "), message
    assert says in message
    assert_nothing_written(config.output_path)


def test_a_model_name_where_a_shape_belongs_is_refused_naming_the_field(tmp_path):
    # Before: "AttributeError: 'str' object has no attribute 'to_levanter'" after ~5 s.
    config = dummy_config(tmp_path, model="llama_150m")
    message = refused(config)
    assert message.startswith("TrainConfig.model: a LlamaSpec (e.g. marin.models.llama_nano"), message
    assert "got str 'llama_150m'" in message
    # An unknown name is refused where it is looked up (already so; pinned).
    with pytest.raises(ValueError, match=r"^unknown model 'llama_7b'; named models: llama_nano, llama_30m"):
        model_spec("llama_7b")


@pytest.mark.parametrize(
    "change, message",
    [
        # Before: "Cannot concatenate arrays along axis head_size of size 21 with total size 20"
        # from 38 frames deep in Haliax, when the step ran.
        (
            {"num_heads": 3, "num_kv_heads": 3},
            "LlamaSpec.num_heads=3: hidden_dim=64 must divide by it (each head is hidden_dim / num_heads wide); "
            "e.g. num_heads=2",
        ),
        # Before: Levanter's "AssertionError: num_heads=2 not divisible by num_kv_heads=3."
        ({"num_kv_heads": 3}, "LlamaSpec.num_kv_heads=3: num_heads=2 must divide by it"),
        # Before: "IndexError: Cannot do a non-empty jnp.take() from an empty axis." from JAX.
        ({"num_layers": 0}, "LlamaSpec.num_layers=0: must be an integer >= 1"),
        ({"hidden_dim": 64.0}, "LlamaSpec.hidden_dim=64.0: must be an integer >= 1"),
    ],
)
def test_a_model_shape_levanter_cannot_build_is_refused_where_it_is_declared(change, message):
    with pytest.raises(ValueError) as caught:
        dataclasses.replace(NANO, **change)
    assert str(caught.value).startswith(message), str(caught.value)


# ---------------------------------------------------------------------------- data and tokenizer


def failed_tokenize(data, target: Path) -> str:
    """What a tokenize step killed while building its train cache leaves: an unfinished ledger, no stats.json."""
    shutil.copytree(data[0], target)
    ledger_path = target / "train" / "shard_ledger.json"
    ledger = json.loads(ledger_path.read_text())
    ledger["is_finished"] = False
    ledger_path.write_text(json.dumps(ledger))
    (target / "stats.json").unlink()
    return str(target)


@pytest.mark.parametrize(
    "where, says",
    [
        ("missing", "no such directory"),
        ("empty", "the directory is empty"),
        (
            "failed",
            "the train cache is not finished (the tokenize step failed or is still running: re-run it)",
        ),
        ("documents", "it holds documents (shard-00000.jsonl.gz, shard-00001.jsonl.gz), not token caches"),
    ],
)
def test_a_tokenized_path_that_is_not_a_finished_cache_is_named(data, tmp_path, where, says):
    # Before: Levanter's "ValueError: No training set!" after ~4 s, with hf_reference/, logs/ and
    # metrics.jsonl written into the output.
    path = {
        "missing": str(tmp_path / "nothing"),
        "empty": str(tmp_path / "empty"),
        "documents": str(Path(data[0]).parent / "docs"),
    }.get(where)
    if where == "empty":
        os.makedirs(path)
    if where == "failed":
        path = failed_tokenize(data, tmp_path / "tokenized")
    config = dataclasses.replace(nano_config(data, tmp_path / "run"), tokenized_path=path, tracker="none")
    message = refused(config, seconds=10)
    assert message.startswith(f"TrainConfig.tokenized_path={path!r}: {says}"), message
    assert message.endswith(
        "give the output of a tokenize step (operations.tokenize.tokenize, marin.defaults.default_tokenize)"
    )
    assert_nothing_written(config.output_path)


@pytest.fixture(scope="module")
def small_tokenizer(data):
    """A 300-token tokenizer trained on the same documents (the data's has 371)."""
    root = Path(data[0]).parent
    path = str(root / "tokenizer-300")
    if not os.path.exists(path):
        train_tokenizer(TrainTokenizerConfig(input_path=str(root / "docs"), output_path=path, vocab_size=300))
    return path


@pytest.fixture(scope="module")
def small_tokenized(data, small_tokenizer):
    """The same documents tokenized with the 300-token tokenizer."""
    root = Path(data[0]).parent
    path = str(root / "tokenized-300")
    if not os.path.exists(os.path.join(path, "stats.json")):
        tokenize(
            TokenizeConfig(str(root / "docs"), small_tokenizer, path, validation_fraction=0.1, workers=1)
        )
    return path


def test_a_tokenizer_smaller_than_the_datas_is_refused_before_training(data, small_tokenizer, tmp_path):
    # Before: token ids past the model's vocabulary; "RuntimeError: Loss is NaN" after ~16 s.
    config = dataclasses.replace(
        nano_config(data, tmp_path / "run"), tokenizer=small_tokenizer, tracker="none"
    )
    message = refused(config, seconds=10)
    assert message == (
        f"TrainConfig.tokenizer={small_tokenizer!r} has 300 tokens, but TrainConfig.tokenized_path={data[0]!r} "
        f"was tokenized with a 371-token tokenizer ({data[1]}), so the model would see ids past its end; "
        "give the tokenizer the tokenize step used"
    )
    assert_nothing_written(config.output_path)


def test_a_tokenizer_larger_than_the_datas_is_refused_before_training(data, small_tokenized, tmp_path):
    # Before: trained on ids that mean other tokens, exported the wrong tokenizer, and succeeded.
    config = dataclasses.replace(
        nano_config(data, tmp_path / "run"), tokenized_path=small_tokenized, tracker="none"
    )
    message = refused(config, seconds=10)
    assert message.startswith(
        f"TrainConfig.tokenizer={data[1]!r} has 371 tokens, but TrainConfig.tokenized_path="
    )
    assert "a 300-token tokenizer" in message and "ids that mean other tokens" in message
    assert_nothing_written(config.output_path)


def test_a_tokenizer_directory_without_a_tokenizer_is_one_line(data, tmp_path):
    # Before: transformers' "Unrecognized model in ... Should have a `model_type` key", listing
    # every model type it knows (about 6,000 characters), after hf_reference/ was written.
    empty = tmp_path / "tokenizer"
    empty.mkdir()
    config = dataclasses.replace(nano_config(data, tmp_path / "run"), tokenizer=str(empty), tracker="none")
    message = refused(config)
    assert message == (
        f"TrainConfig.tokenizer={str(empty)!r}: the directory has no tokenizer files (tokenizer.json, "
        "tokenizer_config.json, ...); give the output of a tokenizer step (operations.tokenizer)"
    )
    assert_nothing_written(config.output_path)
    with pytest.raises(ValueError, match=r"^EvalConfig.tokenizer=.*: the directory has no tokenizer files"):
        evaluate(eval_config(data, tmp_path, tokenizer=str(empty)))


def test_a_batch_that_does_not_divide_over_the_devices_is_refused_before_anything_is_written(data, tmp_path):
    # Two CPU devices in a fresh process. Before: Levanter's "train_batch_size (3) must be divisible
    # by per_device_parallelism * data_axis_size (1, 2)" after ~4 s, with hf_reference/ and
    # metrics.jsonl written.
    config = dataclasses.replace(nano_config(data, tmp_path / "run", train_batch_size=3), tracker="none")
    config_file = tmp_path / "config.pkl"
    config_file.write_bytes(pickle.dumps(config))
    code = (
        "import pickle, sys\nfrom operations.train import train\n"
        "try:\n    train(pickle.load(open(sys.argv[1], 'rb')))\n"
        "except ValueError as error:\n    print('REFUSED', error)\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"},
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    }
    out = subprocess.run(
        [sys.executable, "-c", code, str(config_file)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    refusals = [line for line in out.splitlines() if line.startswith("REFUSED ")]
    assert refusals == [
        "REFUSED SimpleTrainConfig.train_batch_size=3: must divide by the 2 devices JAX trains on "
        "(2 x cpu); use 2 or 4"
    ], out
    assert_nothing_written(config.output_path)


# ---------------------------------------------------------------------------- interrupted and resumed


@pytest.fixture(scope="module")
def interrupted_run(data, tmp_path_factory):
    """A run SIGTERMed after its first checkpoint, with the next checkpoint half-written (arrays,
    no metadata.json: what a kill during a save leaves), then re-run to the end. Returns
    (config, the step of the checkpoint it was killed after, the half-written step)."""
    output = tmp_path_factory.mktemp("interrupted") / "run"
    config = dataclasses.replace(
        nano_config(data, output, num_train_steps=100, steps_per_eval=50, epochs=5), tracker="none"
    )
    assert (
        signal_after_first_checkpoint(config, output.parent / "config.pkl", signal.SIGTERM) == -signal.SIGTERM
    )
    killed_at = latest_checkpoint_step(config.output_path)
    assert killed_at is not None and killed_at < 99
    assert not (output / "stats.json").exists()  # not finished, and not presented as finished
    half = killed_at + 10
    half_written = output / "checkpoints" / f"step-{half}"
    if not half_written.exists():
        shutil.copytree(output / "checkpoints" / f"step-{killed_at}", half_written)
    (half_written / "metadata.json").unlink(missing_ok=True)
    assert latest_checkpoint_step(config.output_path) == killed_at

    train(config)
    return config, killed_at, half


def test_a_sigterm_run_resumes_from_its_last_committed_checkpoint_not_from_scratch(interrupted_run):
    # Already so (SIGTERM's default action, like the SIGKILL of test_train.py); pinned, with a
    # half-written checkpoint that must not be taken for the latest.
    config, killed_at, half = interrupted_run
    stats = json.loads(Path(config.output_path, "stats.json").read_text())
    assert [attempt["resumed_from_step"] for attempt in stats["attempts"]] == [killed_at]
    assert stats["final_checkpoint_step"] == 99
    assert {killed_at, half, 99} <= set(checkpoint_steps(config.output_path))
    steps = [m["step"] for m in read_metrics(config.output_path) if "train/loss" in m]
    assert steps == list(range(100))  # merged per step: every step once, none re-run from 0
    lines = Path(config.output_path, "metrics.jsonl").read_text().splitlines()
    logged = [json.loads(line)["step"] for line in lines if '"train/loss"' in line]
    assert logged.count(0) == 1 and logged.count(killed_at + 1) == 1


# ---------------------------------------------------------------------------- evaluation


def eval_config(data, output: Path, **fields) -> EvalConfig:
    values = dict(
        checkpoint_path=str(output / "no-checkpoint-here"),
        tokenizer=data[1],
        datasets={"a": data[0]},
        model=NANO,
        output_path=str(output / "eval"),
        batch_size=4,
        seq_len=64,
        max_eval_batches=1,
    )
    values.update(fields)
    return EvalConfig(**values)


@pytest.mark.parametrize(
    "fields, says",
    [
        # Before: "TypeError: '<' not supported between instances of 'str' and 'int'".
        ({"batch_size": "4"}, "EvalConfig.batch_size='4', max_eval_batches=1: must be integers >= 1"),
        (
            {"max_eval_batches": 0},
            "EvalConfig.batch_size=4, max_eval_batches=0: must be",
        ),  # already so; pinned
        # Before: 0 was read as None (the model's 128); -5 gave "IndexError: list index out of range"
        # in levanter/eval.py.
        ({"seq_len": 0}, "EvalConfig.seq_len=0: must be an integer >= 1, or None (the model's)"),
        ({"seq_len": -5}, "EvalConfig.seq_len=-5: must be an integer >= 1"),
        # Before: huggingface_hub's "HFValidationError: Repo id must be in the form 'repo_name'...".
        (
            {"tokenizer": "/no/such/tokenizer"},
            "EvalConfig.tokenizer='/no/such/tokenizer': must be a tokenizer directory",
        ),
        ({"model": "llama_nano"}, "EvalConfig.model: a LlamaSpec"),
    ],
)
def test_bad_eval_settings_are_refused_naming_the_field(data, tmp_path, fields, says):
    config = eval_config(data, tmp_path, **fields)
    assert refused(config).startswith(says)
    assert_nothing_written(config.output_path)


@pytest.mark.parametrize("where", ["missing", "empty", "run directory"])
def test_eval_of_a_path_without_a_checkpoint_is_one_line(data, interrupted_run, tmp_path, where):
    # Already so (after Levanter's import, before anything is compiled); pinned.
    path = {
        "missing": str(tmp_path / "nothing" / "checkpoints"),
        "empty": str(tmp_path),
        "run directory": interrupted_run[0].output_path,  # <run>, not <run>/checkpoints
    }[where]
    config = eval_config(data, tmp_path, checkpoint_path=path)
    message = refused(config, FileNotFoundError, seconds=30)
    assert message == (
        f"EvalConfig.checkpoint_path={path!r}: no Levanter checkpoint (metadata.json) there or below; point it "
        "at <run>/checkpoints/step-N or <run>/checkpoints"
    )
    assert_nothing_written(config.output_path)


@pytest.mark.parametrize(
    "change, says",
    [
        # Before, each: "ValueError: Shape of underlying array (2, 2, 1, 32, 64) does not match shape of
        # axes (...)" from Haliax, naming no field.
        (
            {"hidden_dim": 128, "intermediate_dim": 256},
            "hidden_dim: 64 in the checkpoint, 128 in EvalConfig.model; "
            "intermediate_dim: 128 in the checkpoint, 256 in EvalConfig.model",
        ),
        ({"num_layers": 3}, "num_layers: 2 in the checkpoint, 3 in EvalConfig.model"),
        ({"num_kv_heads": 1}, "num_kv_heads: 2 in the checkpoint, 1 in EvalConfig.model"),
        # Before: loaded the embeddings as the output head, dropped the trained head, and wrote
        # results.json with the loss of another model (5.78 instead of 5.09 nats, in a trial).
        (
            {"tie_word_embeddings": True},
            "tie_word_embeddings: False in the checkpoint, True in EvalConfig.model",
        ),
    ],
)
def test_eval_with_another_model_than_the_checkpoints_is_refused(
    data, interrupted_run, tmp_path, change, says
):
    checkpoint = f"{interrupted_run[0].output_path}/checkpoints"
    config = eval_config(
        data, tmp_path, checkpoint_path=checkpoint, model=dataclasses.replace(NANO, **change)
    )
    message = refused(config, seconds=30)
    assert message == (
        f"EvalConfig.model does not describe the checkpoint {checkpoint}/step-99 ({says}): give the "
        "TrainConfig.model of the run"
    )
    assert_nothing_written(config.output_path)


def test_eval_with_another_tokenizer_than_the_checkpoints_or_the_datas_is_refused(
    data, interrupted_run, small_tokenizer, small_tokenized, tmp_path
):
    checkpoint = f"{interrupted_run[0].output_path}/checkpoints"
    # The domain was tokenized with another tokenizer than the one given. Before: a Haliax shape error.
    config = eval_config(data, tmp_path, checkpoint_path=checkpoint, tokenizer=small_tokenizer)
    message = refused(config, seconds=30)
    assert message.startswith(
        f"EvalConfig.tokenizer={small_tokenizer!r} has 300 tokens, but EvalConfig.datasets['a']="
    )
    assert "a 371-token tokenizer" in message
    # Tokenizer and domain agree, but the checkpoint was trained with another vocabulary.
    config = eval_config(
        data,
        tmp_path,
        checkpoint_path=checkpoint,
        tokenizer=small_tokenizer,
        datasets={"a": small_tokenized},
    )
    message = refused(config, seconds=30)
    assert message == (
        f"EvalConfig.tokenizer={small_tokenizer!r} has 300 tokens, but the checkpoint {checkpoint}/step-99 has a "
        "vocabulary of 371: give the tokenizer the run trained with"
    )
    assert_nothing_written(config.output_path)


def test_eval_of_the_interrupted_and_resumed_run_works(data, interrupted_run, tmp_path):
    # The checks above refuse nothing that is right: the resumed run's final checkpoint evaluates.
    config = eval_config(data, tmp_path, checkpoint_path=f"{interrupted_run[0].output_path}/checkpoints")
    evaluate(config)
    results = json.loads(Path(config.output_path, "results.json").read_text())
    assert results["step"] == 99 and math.isfinite(results["domains"]["a"]["loss"])
    assert re.fullmatch(r".*/checkpoints/step-99", results["checkpoint"])
