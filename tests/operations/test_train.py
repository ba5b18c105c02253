"""operations.train and marin.models: real Levanter training of the nano Llama on CPU.

One tiny corpus, tokenizer and tokenized dataset are built per module. The end-to-end test
trains 20 steps and checks metrics, checkpoints (the final one included: Levanter alone
skips it), the HF export and a re-run after success. The resume test runs training in a
subprocess, SIGKILLs it once its first checkpoint is committed, and re-runs it.
"""

import json
import os
import pathlib
import pickle
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from marin.models import MODELS, llama_nano, model_spec
from operations.tokenize import TokenizeConfig, tokenize
from operations.tokenizer import TrainTokenizerConfig, train_tokenizer
from operations.train import (
    SimpleTrainConfig,
    TrainConfig,
    latest_checkpoint_step,
    read_metrics,
    run_id,
    train,
)
from tests.operations.test_tokenizer import make_corpus

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_importing_train_and_models_does_not_import_levanter_or_jax():
    code = (
        "import sys, operations.train, marin.models; "
        "print(sorted(m for m in ('levanter', 'jax', 'haliax') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert out.strip() == "[]"


def test_config_is_frozen_picklable_and_run_id_is_stable(tmp_path):
    config = TrainConfig(
        "tok", "tokenizer", model_spec("llama_nano"), SimpleTrainConfig(8, 20, 1e-3), "out/run"
    )
    assert pickle.loads(pickle.dumps(config)) == config
    with pytest.raises(AttributeError):
        config.tracker = "none"  # type: ignore[misc]
    assert run_id("/a/b/run") == run_id("/a/b/run/") != run_id("/a/c/run")
    assert run_id("/a/b/run").startswith("run-")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"train": SimpleTrainConfig(8, 0, 1e-3)}, "num_train_steps"),
        ({"train": SimpleTrainConfig(8, 10, 1e-3, lr_schedule="cosmic")}, "lr_schedule"),
        ({"tracker": "tensorboard"}, "tracker"),
        (
            {"tokenizer": "gpt2"},
            "TrainConfig.tokenizer='gpt2': must be a tokenizer directory, local or on s3://",
        ),
        (
            {"output_path": "memory://bucket/run"},
            "TrainConfig.output_path='memory://bucket/run': must be a local path",
        ),
        ({"attention_backend": "flash"}, "attention_backend"),
        ({"gradient_checkpointing": "sometimes"}, "gradient_checkpointing"),
        ({"train": SimpleTrainConfig(8, 10, 1e-3, beta2=1.0)}, r"beta2=1.0: must be in \[0, 1\)"),
        ({"train": SimpleTrainConfig(8, 10, 1e-3, max_grad_norm=-1.0)}, "max_grad_norm=-1.0: must be >= 0"),
        (
            {
                "train": SimpleTrainConfig(
                    8, 10, 1e-3, initialize_from_checkpoint_path="/a", initialize_from_hf="/b"
                )
            },
            "initialize_from_checkpoint_path and initialize_from_hf are both set",
        ),
        (
            {"train": SimpleTrainConfig(8, 10, 1e-3, initialize_from_hf="https://example.com/model")},
            "initialize_from_hf='https://example.com/model': must be a directory",
        ),
        ({"wandb_tags": ("x" * 65,)}, "wandb_tags=.*1 to 64 characters"),
        ({"wandb_tags": "llama"}, "wandb_tags='llama'"),
    ],
)
def test_bad_settings_are_rejected_with_the_field_named(tmp_path, fields, message):
    base = dict(
        tokenized_path=str(tmp_path),
        tokenizer=str(tmp_path),
        model=MODELS["llama_nano"],
        train=SimpleTrainConfig(8, 10, 1e-3),
        output_path=str(tmp_path / "out"),
    )
    with pytest.raises(ValueError, match=message):
        train(TrainConfig(**{**base, **fields}))


@pytest.mark.slow
def test_named_models_have_the_documented_parameter_counts():
    import equinox as eqx
    import haliax as hax
    import jax

    for name, spec in MODELS.items():
        config = getattr(sys.modules["marin.models"], name)()
        assert config.hidden_dim == spec.hidden_dim and config.num_layers == spec.num_layers
        shapes = eqx.filter_eval_shape(config.build, hax.Axis("vocab", 32000), key=jax.random.PRNGKey(0))
        levanter_count = sum(np.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(shapes))
        assert levanter_count == spec.parameter_count(32000), name
        assert f"{levanter_count:,}" in (getattr(sys.modules["marin.models"], name).__doc__ or ""), name
    assert llama_nano(seq_len=64).seq_len == 64


# ---------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A tiny tokenized dataset (~26k training tokens) and its tokenizer."""
    root = tmp_path_factory.mktemp("train-data")
    make_corpus(str(root / "docs"), documents=600, shards=2)
    tokenizer = str(root / "tokenizer")
    train_tokenizer(
        TrainTokenizerConfig(input_path=str(root / "docs"), output_path=tokenizer, vocab_size=400)
    )
    tokenized = str(root / "tokenized")
    tokenize(TokenizeConfig(str(root / "docs"), tokenizer, tokenized, validation_fraction=0.1, workers=1))
    return tokenized, tokenizer


def nano_config(data, output_path, **train_fields):
    tokenized, tokenizer = data
    fields = dict(
        train_batch_size=8,
        num_train_steps=20,
        learning_rate=3e-3,
        steps_per_eval=10,
        steps_per_checkpoint=10,
        max_eval_batches=2,
    )
    fields.update(train_fields)
    return TrainConfig(
        tokenized_path=tokenized,
        tokenizer=tokenizer,
        model=MODELS["llama_nano"],
        train=SimpleTrainConfig(**fields),
        output_path=str(output_path),
    )


def test_attention_and_remat_settings_reach_levanters_model_config(data, tmp_path):
    from dataclasses import replace

    from levanter.layers.attention import AttentionBackend

    from operations.train import levanter_config

    default = levanter_config(nano_config(data, tmp_path / "a")).model
    assert (default.attn_backend, default.flash_attention_block_size, default.gradient_checkpointing) == (
        None,
        None,
        True,
    )
    config = replace(
        nano_config(data, tmp_path / "b"),
        attention_backend="vanilla",
        flash_attention_block_size=64,
        gradient_checkpointing="offload",
    )
    model = levanter_config(config).model
    assert model.attn_backend == AttentionBackend.VANILLA
    assert (model.flash_attention_block_size, model.gradient_checkpointing) == (64, "offload")


class FakeCluster:
    """Stands in for one of JAX's cluster environments (jax._src.clusters)."""

    opt_in_only_method = False

    @classmethod
    def is_env_present(cls):
        return True


def test_jax_distributed_starts_where_jax_detects_a_cluster_not_where_mpi4py_is_installed(
    data, tmp_path, monkeypatch
):
    from jax._src import clusters
    from levanter.distributed import DistributedConfig

    from operations.train import initialize_distributed, levanter_config

    started = []
    monkeypatch.setattr(DistributedConfig, "initialize", lambda self: started.append(self))
    # mpi4py's environment is opt-in only: JAX never picks it by itself (Levanter 1.2 did).
    opt_in = type("Mpi4pyLike", (FakeCluster,), {"opt_in_only_method": True})
    monkeypatch.setattr(clusters.ClusterEnv, "_cluster_types", [opt_in])
    assert initialize_distributed() is False and started == []
    monkeypatch.setattr(clusters.ClusterEnv, "_cluster_types", [opt_in, FakeCluster])
    assert initialize_distributed() is True and len(started) == 1
    # Levanter's main must not start it again, after JAX has been used.
    trainer = levanter_config(nano_config(data, tmp_path / "run")).trainer
    assert trainer.distributed.initialize_jax_distributed is False


def checkpoint_steps(output_path):
    """Steps of the checkpoints whose metadata is complete (one being written is not yet one)."""
    steps = []
    for path in pathlib.Path(output_path).glob("checkpoints/*/metadata.json"):
        try:
            steps.append(json.loads(path.read_text())["step"])
        except (ValueError, KeyError, FileNotFoundError):
            continue
    return sorted(steps)


@pytest.mark.slow
def test_trains_logs_metrics_checkpoints_the_final_step_and_exports(data, tmp_path, caplog):
    config = nano_config(data, tmp_path / "run")
    started = time.perf_counter()
    with caplog.at_level("WARNING", logger="operations.train"):
        train(config)
    seconds = time.perf_counter() - started
    import jax

    # Training says which devices it uses, before the first step, and records them.
    announced = [r.getMessage() for r in caplog.records if r.getMessage().startswith("train: JAX backend")]
    expected = (
        f"train: JAX backend {jax.default_backend()}, {len(jax.devices())} x {jax.devices()[0].device_kind}"
    )
    assert len(announced) == 1 and announced[0].startswith(expected), announced

    metrics = read_metrics(config.output_path)
    losses = {m["step"]: m["train/loss"] for m in metrics if "train/loss" in m}
    assert sorted(losses) == list(range(20))  # Levanter numbers steps from 0
    assert all("optim/learning_rate" in m and "throughput/tokens_per_second" in m for m in metrics)
    assert np.mean([losses[s] for s in range(15, 20)]) < np.mean([losses[s] for s in range(5)]) - 1.0
    evals = {m["step"]: m["eval/loss"] for m in metrics if "eval/loss" in m}
    assert {0, 10, 19} <= set(evals) and evals[19] < evals[0]

    # The last step's checkpoint is there: Levanter 1.2.dev1644 alone writes only step-10.
    assert checkpoint_steps(config.output_path) == [10, 19]
    assert latest_checkpoint_step(config.output_path) == 19

    from safetensors.numpy import load_file
    from transformers import AutoConfig, AutoTokenizer

    export = tmp_path / "run" / "hf" / "step-19"
    hf_config = AutoConfig.from_pretrained(export)
    vocab = len(AutoTokenizer.from_pretrained(export))
    assert (hf_config.model_type, hf_config.hidden_size, hf_config.num_hidden_layers) == ("llama", 64, 2)
    weights = load_file(export / "model.safetensors")
    assert sum(w.size for w in weights.values()) == MODELS["llama_nano"].parameter_count(vocab)

    stats = json.loads((tmp_path / "run" / "stats.json").read_text())
    assert stats["final_checkpoint_step"] == 19 and stats["attempts"][0]["resumed_from_step"] is None
    assert stats["final_eval_loss"] == evals[19]
    assert stats["devices"]["backend"] == jax.default_backend()
    assert stats["devices"]["count"] == len(jax.devices()) >= 1
    # W&B ran offline under the output, with the run id derived from the output path.
    assert list((tmp_path / "run" / "wandb").glob(f"offline-run-*-{run_id(config.output_path)}"))
    print(f"\ntrain: 20 steps in {seconds:.1f} s, median {stats['median_tokens_per_second']:.0f} tokens/s")

    # A re-run after success returns without training (Levanter would raise) and changes nothing.
    before = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    train(config)
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == before

    # Killed after the final checkpoint but before the export: the re-run exports from the checkpoint.
    shutil.rmtree(tmp_path / "run" / "hf")
    train(config)
    assert load_file(export / "model.safetensors").keys() == weights.keys()
    for name, weight in load_file(export / "model.safetensors").items():
        np.testing.assert_array_equal(weight, weights[name], err_msg=name)
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == before


def signal_after_first_checkpoint(config, config_file: pathlib.Path, signum: int) -> int:
    """Train `config` in a child process, send it `signum` once its first checkpoint is
    written, and return its exit code (-signum when the signal ended it)."""
    config_file.write_bytes(pickle.dumps(config))
    code = (
        "import pickle, sys; from operations.train import train; train(pickle.load(open(sys.argv[1], 'rb')))"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(config_file)],
        cwd=REPO,
        # Not WANDB_SERVICE: W&B exports it so that children share this process's W&B service, which
        # would then hold the killed child's run "in use" and refuse the re-run here.
        env={**{k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}, "JAX_PLATFORMS": "cpu"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 150
        while not checkpoint_steps(config.output_path):
            assert process.poll() is None, "training exited before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 150 s"
            time.sleep(0.05)
        process.send_signal(signum)
        process.wait(timeout=60)
    finally:
        process.kill()
        process.wait()
    return process.returncode


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_last_checkpoint(data, tmp_path):
    # Enough steps that the run is still going when it is killed after its first checkpoint.
    config = nano_config(data, tmp_path / "run", num_train_steps=100, steps_per_eval=50, epochs=5)
    assert signal_after_first_checkpoint(config, tmp_path / "config.pkl", signal.SIGKILL) == -signal.SIGKILL
    killed_at = latest_checkpoint_step(config.output_path)
    assert killed_at is not None and killed_at < 99

    train(config)

    stats = json.loads((tmp_path / "run" / "stats.json").read_text())
    assert stats["attempts"] == [{"resumed_from_step": killed_at, "seconds": stats["attempts"][0]["seconds"]}]
    assert checkpoint_steps(config.output_path)[-1] == 99
    # The re-run did not start again from step 0: no step was logged twice (metrics
    # past the checkpoint are cut when resuming), and every step after the checkpoint was logged.
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [line["step"] for line in lines if "train/loss" in line]
    # (Levanter logs the last step again when it forces its hooks at the end.)
    before_last = [step for step in steps if step != 99]
    assert len(before_last) == len(set(before_last)) and set(range(killed_at + 1, 100)) <= set(steps)
    assert {0, 1, 2} <= set(steps)
    # Levanter names its log file "<run id>.log.log".
    (log_file,) = (tmp_path / "run" / "logs").glob(f"{run_id(config.output_path)}.log*")
    log = log_file.read_text()
    assert f"Resuming training from step {killed_at + 1}" in log
    train(config)  # finished: returns


@pytest.mark.slow
def test_metrics_file_on_an_object_store_is_rewritten_whole(tmp_path):
    import uuid

    from operations.train import _metrics_tracker_config

    output = f"memory://train-{uuid.uuid4().hex}"
    tracker = _metrics_tracker_config()(path=f"{output}/metrics.jsonl").init(None)
    tracker.log({"train/loss": 2.5, "grad/norm/lm_head": 1.0, "grad/norm/total": 3.0}, step=0)
    tracker.log({"throughput/tokens_per_second": 100.0}, step=0)
    tracker.log({"train": {"loss": 2.0}}, step=1)
    tracker.finish()
    assert read_metrics(output) == [
        {"step": 0, "train/loss": 2.5, "grad/norm/total": 3.0, "throughput/tokens_per_second": 100.0},
        {"step": 1, "train/loss": 2.0},
    ]


def test_metrics_on_an_object_store_are_flushed_at_checkpoints_and_never_put_back_by_an_idle_tracker():
    import uuid

    import fsspec

    from operations import train as train_module

    output = f"memory://train-{uuid.uuid4().hex}"
    path = f"{output}/metrics.jsonl"
    fsspec.filesystem("memory").pipe(path, b'{"step": 0, "train/loss": 3.0}\n')
    config = train_module._metrics_tracker_config()(path=path)
    idle = config.init(None)  # Levanter makes its trackers twice and logs to the second
    active = config.init(None)
    active.log({"train/loss": 2.0}, step=1)
    train_module._flush_remote_metrics()  # what a checkpoint does
    assert [m["step"] for m in read_metrics(output)] == [0, 1]
    active.log({"train/loss": 1.0}, step=2)
    active.finish()
    idle.finish()  # read the file before step 1: must not write it back
    assert [m["step"] for m in read_metrics(output)] == [0, 1, 2]
    assert train_module._remote_metrics.get(path) is None


def test_wandb_is_offline_unless_the_user_configured_it(monkeypatch, tmp_path):
    from operations.train import wandb_mode

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    assert wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY")
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert wandb_mode() == "online"


def test_require_accelerator_fails_fast_on_a_cpu_naming_the_output_and_what_to_install(
    data, tmp_path, monkeypatch
):
    import jax

    if jax.default_backend() != "cpu":
        pytest.skip("JAX sees an accelerator here")
    from dataclasses import replace

    import operations.train as train_module

    config = replace(nano_config(data, tmp_path / "run"), require_accelerator=True)
    started = time.perf_counter()
    with pytest.raises(RuntimeError) as caught:
        train(config)
    assert time.perf_counter() - started < 10  # nothing read, compiled or trained
    message = str(caught.value)
    assert message.startswith(f"{config.output_path}: TrainConfig.require_accelerator is set, but JAX ")
    assert "sees only a CPU" in message and "pip install -e '.[gpu]'" in message
    assert "NVIDIA GPU is present" not in message
    assert not (tmp_path / "run").exists()
    # where a GPU is present but this JAX cannot use it, the message says so
    monkeypatch.setattr(train_module, "nvidia_gpu_present", lambda: True)
    with pytest.raises(
        RuntimeError, match="an NVIDIA GPU is present on this machine, but this JAX has no CUDA"
    ):
        train(config)


@pytest.mark.slow
def test_each_attempt_logs_the_devices_it_trains_on_in_the_metrics_at_its_first_step(data, tmp_path):
    import jax

    config = nano_config(data, tmp_path / "run", num_train_steps=12, steps_per_eval=100)
    train(config)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    devices = [row for row in rows if "devices/backend" in row]
    assert devices == [
        {
            "step": 0,
            "devices/backend": jax.default_backend(),
            "devices/kind": jax.devices()[0].device_kind,
            "devices/count": len(jax.devices()),
            "devices/process_count": 1,
            "devices/memory_bytes_per_device": devices[0]["devices/memory_bytes_per_device"],
        }
    ]
    # killed after checkpoint 10: the resumed attempt logs its devices at step 11
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-11")
    (tmp_path / "run" / "stats.json").unlink()
    train(config)
    steps = [m["step"] for m in read_metrics(config.output_path) if "devices/backend" in m]
    assert steps == [0, 11]
