"""Train: a Llama language model on a tokenized dataset, with Levanter's trainer.

The config holds plain values only (a `LlamaSpec`, a `SimpleTrainConfig`, paths), so the
executor can version it. `train` converts it to Levanter's `TrainLmConfig` and calls
`levanter.main.train_lm.main`: the trainer, the data loader, the checkpointer and the
Hugging Face export are Levanter's. The output directory:

    <output_path>/checkpoints/step-<N>/   Levanter checkpoints (N is Levanter's 0-indexed step:
                                          the final one is step-<num_train_steps - 1>)
    <output_path>/hf/step-<N>/            Hugging Face export (config, weights, tokenizer)
    <output_path>/hf_reference/           the HF config the export is built from
    <output_path>/metrics.jsonl           JSON lines {"step": N, metric: value, ...}, one per Levanter
                                          log call (a few per step; `read_metrics` merges them per
                                          step): train/loss, optim/learning_rate, eval/loss (on eval
                                          steps), throughput/tokens_per_second, grad/norm/total, ...;
                                          at each attempt's first step, devices/* (below)
    <output_path>/logs/<run id>.log.log   Levanter's log file
    <output_path>/wandb/                  W&B's offline run (sync later with `wandb sync`)
    <output_path>/attempts.json           one entry per completed attempt: resumed_from_step, seconds
    <output_path>/stats.json              written last: steps, attempts, final losses, tokens/s,
                                          and `devices` (JAX backend, device kind, count, memory)

Resume: Levanter loads the latest checkpoint under `checkpoints/` when it starts, so a
killed step re-run continues from there. metrics.jsonl is first cut back to the
checkpoint's step, so no step is logged twice (except the last: Levanter logs it again
when it forces its hooks at the end). Levanter 1.2.dev1644 never writes a
checkpoint at the last step (its trainer forces the hooks at the end, but the checkpointer
is wrapped in a callback that drops `force`); `_final_checkpointer_config()` forces that save
through Levanter's own `Checkpointer.on_step(force=True)` and waits for it to be committed.
Levanter raises when asked to train a finished run, so a re-run after success sees the
final checkpoint and returns (first exporting that checkpoint to hf/ and writing stats.json
if a kill came between the final checkpoint and those). Levanter also stops early, without
a final checkpoint, when the data runs out: `train` refuses such a config up front (see
`SimpleTrainConfig.epochs`). A run with no checkpoint of its own may start from another run's
state (`SimpleTrainConfig.initialize_from_checkpoint_path`: weights, optimizer state and step)
or weights (`initialize_from_hf`: a Hugging Face export).

Bad input: a `LlamaSpec` Levanter cannot build is refused when it is made (`check_model`);
`train` refuses a bad config with one line naming the field before anything is read or written
(`_check`: types and ranges of every setting), and before Levanter is called: a tokenized path
that is not a finished tokenize output (`check_tokenized`), too little data
(`_check_enough_data`), a tokenizer other than the data's (`check_vocabulary`), a batch that
does not divide over the devices (`_check_batch_fits_devices`). docs/gpu.md lists them, with
what each did before.

Buckets: the output (and the tokenized data and tokenizer) may be on `s3://` or `gs://`,
configured by the standard variables only (see `operations.buckets`, which also fixes JAX's
tensorstore specs for `s3://`). Checkpoints go straight to the bucket through tensorstore;
the HF export through Levanter's own temporary directory; metrics.jsonl is rewritten whole
every minute, at each checkpoint and at the end (object stores cannot append). What only
writes locally -- Levanter's log file, W&B's offline run, the HF reference config -- goes to a
directory under the system temp dir that is uploaded to the output when an attempt ends
(also with an error; a SIGKILLed attempt's are lost) and then removed; a tokenizer on a
bucket is read through a temporary local copy removed when the step ends.

Tracking: W&B in offline mode (`tracker="wandb"`, files under `<output_path>/wandb`), or
"json" (Levanter's JSON-lines logger) or "none"; metrics.jsonl is written in every case.
The run id is `<output dir name>-<hash of the output path>`, so a resumed run continues the
same W&B run; it is also the run's W&B display name unless `TrainConfig.wandb_name` gives
one (`wandb_group` and `wandb_tags` label the W&B run too; the JSON logger has no labels).
(Levanter calls wandb.init twice per run -- once in `levanter.initialize`, once in the
Trainer -- so each attempt leaves two offline-run folders with the same run id.)

Devices: before training starts, `train` logs at WARNING level which devices JAX uses
(backend, kind, count, memory) and records them in metrics.jsonl (`devices/backend`,
`devices/kind`, `devices/count`, `devices/process_count`, `devices/memory_bytes_per_device`,
at the attempt's first step) and in stats.json (the executor adds the same to
`.executor_info` as `devices`, for any step that used JAX). On a machine with an NVIDIA GPU
whose JAX has no CUDA it says so loudly: install the `gpu` extra (`pip install -e '.[gpu]'`,
JAX with CUDA 12 at the pinned version) or training runs on the CPU. With
`TrainConfig.require_accelerator` it fails instead, first thing (`check_accelerator`),
naming the output and that fix.

Clusters: `jax.distributed` must start before anything initialises a JAX backend, and this
module asks JAX for its devices (the log line above, the precision) before Levanter's main
would start it. So `initialize_distributed` starts it first, where JAX itself detects a
cluster (TPU VMs, SLURM, ...), and Levanter is told not to. It also fixes a Levanter
1.2.dev1644 misreading: Levanter takes an installed mpi4py for a cluster (JAX uses mpi4py
only when asked to), so on a single machine that has mpi4py -- the lent H100 of
docs/gpu.md -- its own start failed. In a multi-host step the executor started (its Ray
backend: docs/cluster.md, "Multi-host training") the environment names the coordinator, the
process count and this process's index (`gang_from_env`); then `jax.distributed` starts with
those (CPU collectives through gloo), every process trains its share of the global batch, and
only process 0 (`primary_process`) writes metrics.jsonl, attempts.json, stats.json, Levanter's
log, the W&B run and the HF reference config; each process writes its part of the checkpoints.

JAX and Levanter are imported inside the functions: importing this module stays light.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import math
import numbers
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import fsspec

from operations import run_records
from operations.buckets import configure as configure_buckets
from operations.buckets import is_bucket, local_input_copy, local_staging, using_input_copies
from operations.shards import is_local, join, read_json, write_json_atomic, write_stats

if TYPE_CHECKING:
    from levanter.main.train_lm import TrainLmConfig
    from levanter.models.llama import LlamaConfig

    from executor.resources import ResourceConfig

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
HF_DIR = "hf"
HF_REFERENCE_DIR = "hf_reference"
METRICS_FILE = "metrics.jsonl"
TRACKERS = ("wandb", "json", "none")
# Per-weight-matrix norms Levanter logs; metrics.jsonl keeps only their totals.
PER_PARAMETER = re.compile(r"^(grad|params|updates|opt_state)/(norm|rms)/")
# How often metrics.jsonl is rewritten when the output is on an object store (no appends there;
# it is also rewritten at each checkpoint and at the end).
REMOTE_METRICS_SECONDS = 60.0
LR_SCHEDULES = ("cosine", "linear", "constant", "inv_sqrt")
# Levanter's AttentionBackend values (None: its default for the device).
ATTENTION_BACKENDS = (None, "default", "nvte", "splash", "jax_flash", "vanilla")
# Haliax's ScanCheckpointPolicy.from_bool_or_str choices.
GRADIENT_CHECKPOINTING = (True, False, "offload", "recompute", "full", "save_all", "nested")
# SimpleTrainConfig fields passed to Levanter's AdamConfig under the same name when set.
ADAM_FIELDS = (
    "beta1",
    "beta2",
    "epsilon",
    "max_grad_norm",
    "decay",
    "rewarmup",
    "cycle_length",
    "skip_bad_steps",
)
# What of a Hugging Face config.json must agree with the model built here for
# SimpleTrainConfig.initialize_from_hf (the vocabulary may differ: Levanter resizes it).
HF_ARCHITECTURE_KEYS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
)


@dataclass(frozen=True)
class LlamaSpec:
    """The shape of a Llama model: plain values, converted to Levanter's `LlamaConfig` by `to_levanter`."""

    hidden_dim: int
    """Width of the residual stream."""

    intermediate_dim: int
    """Width of the SwiGLU MLP."""

    num_layers: int
    """Transformer blocks."""

    num_heads: int
    """Attention (query) heads; hidden_dim must divide by it."""

    num_kv_heads: int
    """Key/value heads (grouped-query attention); num_heads must divide by it."""

    seq_len: int = 1024
    """Context length the model is built for. Training may use another
    (`SimpleTrainConfig.seq_len`): the model has no table of positions (rotary embeddings), so
    it is built at the training length, which its HF export records as max_position_embeddings."""

    tie_word_embeddings: bool = False
    """Share the input embedding and the output head."""

    def __post_init__(self) -> None:
        # A shape Levanter cannot build fails here, where the experiment declares it, not in a
        # traceback from deep inside Haliax once the step runs (see `check_model`).
        check_model(self, type(self).__name__)

    def parameter_count(self, vocab_size: int) -> int:
        """Parameters of the model for `vocab_size` (embeddings, attention, MLP, RMSNorm weights)."""
        head_dim = self.hidden_dim // self.num_heads
        attention = 2 * self.hidden_dim * self.hidden_dim + 2 * self.hidden_dim * self.num_kv_heads * head_dim
        mlp = 3 * self.hidden_dim * self.intermediate_dim
        block = attention + mlp + 2 * self.hidden_dim
        embeddings = vocab_size * self.hidden_dim * (1 if self.tie_word_embeddings else 2)
        return embeddings + self.num_layers * block + self.hidden_dim

    def to_levanter(self, **overrides: Any) -> LlamaConfig:
        """Levanter's `LlamaConfig` of this shape; `overrides` set other LlamaConfig fields."""
        from levanter.models.llama import LlamaConfig

        fields = dataclasses.asdict(self)
        fields.update(overrides)
        return LlamaConfig(**fields)


@dataclass(frozen=True)
class SimpleTrainConfig:
    """Optimizer, schedule and cadence of a training run (like Marin's SimpleTrainConfig)."""

    train_batch_size: int
    """Sequences per optimizer step."""

    num_train_steps: int
    """Optimizer steps."""

    learning_rate: float
    """Peak learning rate (AdamW)."""

    weight_decay: float = 0.1
    """AdamW weight decay."""

    warmup: float = 0.01
    """Warm-up: a fraction of num_train_steps if < 1, else a number of steps."""

    lr_schedule: str = "cosine"
    """Decay after warm-up: cosine, linear, constant or inv_sqrt."""

    min_lr_ratio: float = 0.1
    """The schedule decays to learning_rate * min_lr_ratio."""

    seq_len: int | None = None
    """Tokens per training sequence; None: the model's seq_len."""

    steps_per_eval: int = 1000
    """Validation loss every this many steps (and at the end)."""

    max_eval_batches: int | None = None
    """Cap on validation batches per evaluation; None: the whole validation set."""

    steps_per_checkpoint: int = 1000
    """Permanent checkpoint every this many steps (and always at the last step)."""

    checkpoint_minutes: float | None = 10.0
    """Also a temporary checkpoint after this many minutes without one (Levanter's save_interval;
    replaced by the next checkpoint); None: step checkpoints only."""

    steps_per_export: int | None = None
    """Hugging Face export every this many steps; None: only at the end."""

    epochs: int = 0
    """0: one pass over the training data, and the run is refused up front if that holds fewer
    than train_batch_size * num_train_steps sequences; N > 0: cycle through it up to N times."""

    seed: int = 0
    """Seed of model initialisation and data order."""

    resources: ResourceConfig | dict[str, Any] | None = None
    """What the training step asks the cluster for (e.g. `ResourceConfig.with_tpu("v4-8")`);
    None: `marin.defaults`' default. Not versioned, and not used by `train` itself:
    `default_train` moves it onto the step."""

    # Levanter's optimizer and loss settings. None: Levanter's default, and then the field is
    # left out of the step's version (`marin.defaults.TRAIN_FIELDS_VERSIONED_WHEN_SET`), so
    # configs written before these fields existed keep their output paths.

    beta1: float | None = None
    """Adam's first-moment decay; None: Levanter's (0.9)."""

    beta2: float | None = None
    """Adam's second-moment decay; None: Levanter's (0.95)."""

    epsilon: float | None = None
    """Adam's epsilon; None: Levanter's (1e-8)."""

    max_grad_norm: float | None = None
    """Clip the gradient to this global norm, 0: no clipping; None: Levanter's (1.0)."""

    decay: float | None = None
    """Length of the decay phase of each cycle: a fraction of the cycle if <= 1, else steps. The
    steps between warm-up and decay hold the peak rate (a warmup-stable-decay schedule); None:
    Levanter's (decay over everything after warm-up)."""

    rewarmup: float | None = None
    """Warm-up at the start of every cycle after the first: a fraction of the cycle if <= 1,
    else steps; None: Levanter's (0: none)."""

    cycle_length: int | float | tuple[int, ...] | None = None
    """Restart the schedule (re-warm-up, decay) every this many steps (a fraction of
    num_train_steps if <= 1), or after each of these step counts (a tuple); None: one cycle."""

    skip_bad_steps: bool | int | None = None
    """Skip an update whose loss or gradient norm is far above the recent ones (Levanter's
    SkipStepConfig: True, or the length of the history it compares with); None: Levanter's
    (False: never skip)."""

    z_loss_weight: float | None = None
    """Weight of the z-loss (the squared log-sum-exp of the logits) added to the training loss;
    None: Levanter's (0: none)."""

    initialize_from_checkpoint_path: str | None = None
    """Start from this Levanter checkpoint: a checkpoint directory (`<run>/checkpoints/step-N`)
    or a `checkpoints/` directory (its latest). Its whole training state is loaded -- weights,
    optimizer state and step -- so training continues at step N + 1 up to num_train_steps,
    which counts from the start of that run, on this run's data from that step on. Only when
    this run has no checkpoint of its own (a killed run resumes from its own). None: a fresh
    initialisation."""

    initialize_from_hf: str | None = None
    """Start from the weights of this Hugging Face checkpoint: a directory, local or on s3:// /
    gs://, holding config.json and the weights (e.g. a training step's `hf/step-N`), whose
    config must describe this run's model; the optimizer and the step start fresh. Hub ids are
    not fetched (download the model and pass its directory). None: a fresh initialisation."""


@dataclass(frozen=True)
class TrainConfig:
    tokenized_path: str
    """Output of operations.tokenize (Levanter caches under train/ and validation/)."""

    tokenizer: str
    """Tokenizer directory (output of operations.tokenizer), local or on s3:// / gs://: the one the
    data was tokenized with. Levanter reads one on a bucket through a temporary local copy."""

    model: LlamaSpec
    """Model shape (see marin.models for named ones)."""

    train: SimpleTrainConfig
    """Optimizer, schedule, batch size, steps, eval and checkpoint cadence, seed."""

    output_path: str
    """Directory for checkpoints, the HF export, metrics.jsonl, logs and stats.json."""

    tracker: str = "wandb"
    """"wandb" (W&B, offline unless configured: see wandb_mode(); files under <output_path>/wandb), "json" (Levanter's JSON-lines log) or "none".
    metrics.jsonl is written with any of them."""

    wandb_project: str = "marin"
    """W&B project name of the run."""

    wandb_name: str | None = None
    """W&B display name of the run; None: its run id (`run_id(output_path)`). The run id itself
    -- what a resumed run continues -- is always derived from the output path. Like the two
    fields below: W&B only, and not versioned (they label the run, not the model)."""

    wandb_group: str | None = None
    """W&B group of the run (to gather a sweep's runs); None: none."""

    wandb_tags: tuple[str, ...] = ()
    """W&B tags of the run, each 1 to 64 characters."""

    mixed_precision: str | None = None
    """jmp policy, e.g. "p=f32,c=bfloat16"; None: that on an accelerator, "f32" on CPU."""

    require_accelerator: bool = False
    """Fail instead of training on CPU when no GPU/TPU is found."""

    attention_backend: str | None = None
    """Levanter's attention implementation: "jax_flash" (blockwise, in plain JAX), "vanilla"
    (the whole score matrix; XLA fuses it), "nvte" (Transformer Engine's fused kernel, when
    installed) or "splash" (TPU); None: Levanter's default for the device (on a GPU that is
    "nvte", which falls back to "jax_flash" with a warning when Transformer Engine is missing).
    Speed and memory only, like the three fields below; not versioned."""

    flash_attention_block_size: int | None = None
    """Block size of the flash attention kernels; None: Levanter's (1024 for "jax_flash")."""

    gradient_checkpointing: bool | str = True
    """Activation rematerialisation across the layer stack (Haliax's `ScanCheckpointPolicy`):
    True keeps each layer's input and recomputes the rest in the backward pass; False keeps
    everything (no recomputation, most memory); or "offload", "recompute", "save_all", "nested"."""


def wandb_mode() -> str:
    """Offline unless the user has configured W&B: `$WANDB_MODE` wins; an API key in
    `$WANDB_API_KEY` or in ~/.netrc (what `wandb login` writes) means online."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        import netrc

        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        pass
    return "offline"


def run_id(output_path: str) -> str:
    """The W&B/Levanter run id of a training output: `<name>-<hash of the path>`, stable across resumes."""
    digest = hashlib.sha256(output_path.rstrip("/").encode()).hexdigest()[:10]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", output_path.rstrip("/").rsplit("/", 1)[-1])[:40].strip("-.")
    return f"{name}-{digest}" if name else digest


def train(config: TrainConfig) -> None:
    """Train (or resume, or return if already finished) and write stats.json."""
    _check(config)
    if config.require_accelerator:
        check_accelerator(config.output_path)
    configure_buckets()
    with using_input_copies():  # a tokenizer on a bucket is read through a temporary copy
        _train(config)


train.__run_records__ = run_records.TRAIN  # type: ignore[attr-defined]


def _train(config: TrainConfig) -> None:
    started = time.perf_counter()
    final_step = config.train.num_train_steps - 1  # Levanter names steps from 0
    resume_step = latest_checkpoint_step(config.output_path)
    if resume_step is not None and resume_step >= final_step:
        # Finished. A run killed after its final checkpoint may lack the export or the stats.
        if not _hf_export_exists(config.output_path, resume_step):
            with _local_files_directory(config, preload=()) as local:
                export_hf_from_checkpoint(config, resume_step, local)
        if read_json(join(config.output_path, "stats.json")) is None and primary_process():
            _write_train_stats(config, attempts=_attempts(config, resume_step, 0.0))
        logger.info("train: %s already finished (checkpoint at step %d)", config.output_path, resume_step)
        return

    check_tokenized(config.tokenized_path, "TrainConfig.tokenized_path")
    _check_enough_data(config)
    check_vocabulary(
        config.tokenized_path,
        config.tokenizer,
        loaded_vocab_size(config.tokenizer, "TrainConfig.tokenizer"),
        "TrainConfig.tokenizer",
        "TrainConfig.tokenized_path",
    )
    if resume_step is None:  # a run with a checkpoint of its own resumes from it
        _check_initial_state(config)
    primary = primary_process()  # starts jax.distributed in a process of a gang
    devices = announce_devices()
    _check_batch_fits_devices(config.train, devices)
    if primary:
        _truncate_metrics(join(config.output_path, METRICS_FILE), resume_step)
    from levanter.main.train_lm import main

    if primary:
        _log_devices(config, devices, 0 if resume_step is None else resume_step + 1)

    # JAX's checkpoint serializer logs an INFO line per array written; that drowns the
    # executor's progress lines. The full story stays in the step's log at WARNING and up.
    logging.getLogger("jax.experimental.array_serialization").setLevel(logging.WARNING)
    with _local_files_directory(config, preload=("logs",)) as local:
        levanter_lm_config = levanter_config(config, local)
        try:
            with _wandb_environment(config, local):
                main(levanter_lm_config)
        finally:
            _remote_metrics.clear()
    last_step = latest_checkpoint_step(config.output_path)
    if last_step is None or last_step < final_step:
        raise RuntimeError(
            f"{config.output_path}: training ended at checkpoint step {last_step}, expected {final_step}"
        )
    if primary:
        _write_train_stats(config, attempts=_attempts(config, resume_step, time.perf_counter() - started))


@contextlib.contextmanager
def _local_files_directory(config: TrainConfig, preload: tuple[str, ...]) -> Iterator[str]:
    """Where what Levanter and W&B write only locally goes (the log file, W&B's offline run, the
    HF reference config): for process 0 (or the only process), on a bucket, a temporary
    directory uploaded to the output when training ends (`local_staging`; the output itself
    when local); for the other processes of a multi-process run, a temporary directory removed
    afterwards -- their output is in their step log (`logs/process-<i>.log`), not in the tree."""
    import tempfile

    if primary_process():
        with local_staging(_absolute(config.output_path), "train", preload=preload) as local:
            yield local
    else:
        with tempfile.TemporaryDirectory(prefix="marin-train-process-") as scratch:
            yield scratch


def initialize_distributed() -> bool:
    """Start `jax.distributed` (through Levanter's `DistributedConfig`) in a process of a gang
    the executor started (`gang_from_env`: coordinator, process count and index in the
    environment), or where JAX detects a cluster; once per process, before
    the first JAX call of this module. Returns whether it is started."""
    import jax
    from jax._src import clusters

    if jax.distributed.is_initialized():
        return True
    gang = gang_from_env()
    if gang is not None:
        from levanter.distributed import DistributedConfig

        # Collectives between CPU processes go through gloo (JAX 0.7.2's default already; an
        # unset implementation would make every cross-process computation fail). Must be set
        # before JAX's backends start, as must jax.distributed.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        DistributedConfig(
            coordinator_address=gang[0],
            num_processes=gang[1],
            process_id=gang[2],
        ).initialize()
        return True
    # JAX's own auto-detection (clusters.ClusterEnv.auto_detect_unset_distributed_params) skips
    # the opt-in-only environments (mpi4py); Levanter's check does not.
    if not any(
        env.is_env_present() for env in clusters.ClusterEnv._cluster_types if not env.opt_in_only_method
    ):
        return False
    from levanter.distributed import DistributedConfig

    DistributedConfig().initialize()
    return True


GANG_ENV = ("MARIN_COORDINATOR_ADDRESS", "MARIN_NUM_PROCESSES", "MARIN_PROCESS_ID")
"""Where the executor's Ray backend tells each process of a multi-host step its place in it
(`executor.backends.DistributedProcess` writes them; operations never import the executor, so
the names are repeated here and tests/executor/test_backends.py keeps both sides equal)."""


def gang_from_env(environ: Any = None) -> tuple[str, int, int] | None:
    """(coordinator `host:port`, process count, this process's index) when this process is one
    of a multi-host step's (`GANG_ENV` set), else None. ValueError naming the variables when
    they are set but incomplete or malformed."""
    environ = os.environ if environ is None else environ
    values = [environ.get(name, "").strip() for name in GANG_ENV]
    if not any(values):
        return None
    address, count, index = values
    if not (address and count.isdigit() and index.isdigit() and int(index) < int(count)):
        shown = ", ".join(f"${name}={value!r}" for name, value in zip(GANG_ENV, values, strict=True))
        raise ValueError(
            f"{shown}: a process of a multi-host step needs all three: the coordinator's host:port, "
            "the process count and its index (0 <= index < count)"
        )
    return address, int(count), int(index)


def primary_process() -> bool:
    """Whether this process writes the run's own files (metrics.jsonl, attempts.json, stats.json,
    Levanter's log, W&B's run, the HF reference config): process 0 of a multi-process run, or
    the only process. The others train, and write only their share of each checkpoint."""
    import jax

    initialize_distributed()
    return jax.process_index() == 0


def describe_devices() -> dict[str, Any]:
    """The devices JAX trains on: backend, device kind, count, and memory per device where known."""
    import jax

    initialize_distributed()
    devices = jax.devices()
    memory = None
    try:
        stats = devices[0].memory_stats() or {}
        memory = stats.get("bytes_limit")
    except Exception:  # the CPU backend has no memory stats
        memory = None
    return {
        "backend": jax.default_backend(),
        "kind": devices[0].device_kind,
        "count": len(devices),
        "process_count": jax.process_count(),
        "memory_bytes_per_device": memory,
    }


def check_accelerator(output_path: str) -> None:
    """RuntimeError, before anything is read or trained, when JAX sees only a CPU: naming the
    output, what JAX it is and what to install (`TrainConfig.require_accelerator`)."""
    import jax

    devices = describe_devices()
    if devices["backend"] != "cpu":
        return
    present = (
        "; an NVIDIA GPU is present on this machine, but this JAX has no CUDA support"
        if nvidia_gpu_present()
        else ""
    )
    raise RuntimeError(
        f"{output_path}: TrainConfig.require_accelerator is set, but JAX {jax.__version__} sees only "
        f"a CPU ({devices['count']} x {devices['kind']}){present}. Install the gpu extra: "
        "pip install -e '.[gpu]' (jax[cuda12] at the pinned version; on a TPU VM, jax[tpu] at that "
        "version), or set require_accelerator=False to train on the CPU"
    )


def _log_devices(config: TrainConfig, devices: dict[str, Any], step: int) -> None:
    """The devices this attempt trains on, as one metrics.jsonl line at its first step
    (`devices/backend`, `devices/kind`, `devices/count`, `devices/process_count`,
    `devices/memory_bytes_per_device`); a resumed attempt adds its own."""
    path = join(config.output_path, METRICS_FILE)
    line = json.dumps({"step": step, **{f"devices/{k}": v for k, v in devices.items()}}, sort_keys=True)
    if is_local(path):
        local = path.removeprefix("file://")
        os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
        with open(local, "a") as handle:
            handle.write(line + "\n")
        return
    lines = _read_lines(path)
    with fsspec.open(path, "w") as handle:
        handle.writelines([*lines, line + "\n"])


def nvidia_gpu_present() -> bool:
    """An NVIDIA GPU is visible to this machine (device nodes or nvidia-smi), whatever JAX sees."""
    return os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None


def announce_devices() -> dict[str, Any]:
    """Say loudly which devices training uses, and when a GPU is present but JAX cannot use it."""
    devices = describe_devices()
    memory = devices["memory_bytes_per_device"]
    logger.warning(
        "train: JAX backend %s, %d x %s%s",
        devices["backend"],
        devices["count"],
        devices["kind"],
        f", {memory / 2**30:.1f} GiB each" if memory else "",
    )
    if devices["backend"] == "cpu" and nvidia_gpu_present():
        logger.warning(
            "train: an NVIDIA GPU is present but this JAX has no CUDA support, so training runs on "
            "the CPU. Install the gpu extra: pip install -e '.[gpu]' (jax[cuda12] at the pinned version)"
        )
    return devices


def _check(config: TrainConfig) -> None:
    """Refuse bad settings before anything is read, written or compiled: one line naming the field."""
    train = config.train
    if not isinstance(train, SimpleTrainConfig):
        raise ValueError(
            f"TrainConfig.train: an operations.train.SimpleTrainConfig, got {type(train).__module__}."
            f"{type(train).__qualname__} (marin.models.SimpleTrainConfig converts with .to_train_settings(); "
            "default_train does that)"
        )
    check_model(config.model, "TrainConfig.model")
    _check_schedule(train)
    if train.lr_schedule not in LR_SCHEDULES:
        raise ValueError(
            f"SimpleTrainConfig.lr_schedule={train.lr_schedule!r}: one of {', '.join(LR_SCHEDULES)}"
        )
    _check_optimizer(train)
    _check_initialization(train)
    if config.tracker not in TRACKERS:
        raise ValueError(f"TrainConfig.tracker={config.tracker!r}: one of {', '.join(TRACKERS)}")
    if isinstance(config.wandb_tags, str) or not all(
        isinstance(tag, str) and 1 <= len(tag) <= 64 for tag in config.wandb_tags
    ):
        raise ValueError(
            f"TrainConfig.wandb_tags={config.wandb_tags!r}: a tuple of strings of 1 to 64 characters (W&B's limit)"
        )
    local_tokenizer = is_local(config.tokenizer) and os.path.isdir(config.tokenizer.removeprefix("file://"))
    if not (local_tokenizer or is_bucket(config.tokenizer)):
        raise ValueError(
            f"TrainConfig.tokenizer={config.tokenizer!r}: must be a tokenizer directory, local or on "
            "s3:// / gs:// (the output of operations.tokenizer)"
        )
    if config.attention_backend not in ATTENTION_BACKENDS:
        raise ValueError(
            f"TrainConfig.attention_backend={config.attention_backend!r}: one of "
            f"{', '.join(str(b) for b in ATTENTION_BACKENDS)}"
        )
    if config.gradient_checkpointing not in GRADIENT_CHECKPOINTING:
        raise ValueError(
            f"TrainConfig.gradient_checkpointing={config.gradient_checkpointing!r}: one of "
            f"{', '.join(repr(p) for p in GRADIENT_CHECKPOINTING)}"
        )
    if not (is_local(config.output_path) or is_bucket(config.output_path)):
        # Checkpoints go through tensorstore, which knows local disk, S3 and GCS only.
        raise ValueError(
            f"TrainConfig.output_path={config.output_path!r}: must be a local path, s3:// or gs:// "
            "(Levanter's checkpoints are written with tensorstore)"
        )
    check_tokenizer_files(config.tokenizer, "TrainConfig.tokenizer")


def check_tokenizer_files(tokenizer: str, field_name: str) -> None:
    """A local tokenizer directory holds a tokenizer file (transformers' error for one that does
    not lists every model type it knows: thousands of characters). Buckets are checked when read."""
    from operations.tokenize import TOKENIZER_FILES

    if not is_local(tokenizer):
        return
    path = tokenizer.removeprefix("file://")
    if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
        raise ValueError(
            f"{field_name}={tokenizer!r}: the directory has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, "
            "...); give the output of a tokenizer step (operations.tokenizer)"
        )


def _check_optimizer(train: SimpleTrainConfig) -> None:
    for name in ("beta1", "beta2"):
        value = getattr(train, name)
        if value is not None and not (_is_number(value) and 0 <= value < 1):
            raise ValueError(_number_error(f"SimpleTrainConfig.{name}", value, "must be in [0, 1)"))
    for name in ("epsilon", "max_grad_norm", "z_loss_weight"):
        value = getattr(train, name)
        if value is not None and not (_is_number(value) and math.isfinite(value) and value >= 0):
            raise ValueError(_number_error(f"SimpleTrainConfig.{name}", value, "must be >= 0"))
    for name in ("decay", "rewarmup"):
        _check_fraction_or_steps(train, name)


def _check_schedule(train: SimpleTrainConfig) -> None:
    """Counts, the learning rate and its schedule: what Levanter would otherwise take as given
    (a negative rate trains uphill and succeeds), reject deep inside (a string rate, a negative
    warm-up, an empty evaluation) or quietly read as its default (a seq_len of 0)."""
    for name in ("train_batch_size", "num_train_steps", "steps_per_eval", "steps_per_checkpoint"):
        _check_integer(train, name, 1)
    _check_integer(train, "seq_len", 1, none="None: the model's seq_len")
    _check_integer(train, "max_eval_batches", 1, none="None: the whole validation set")
    _check_integer(train, "steps_per_export", 1, none="None: only at the end")
    _check_integer(train, "epochs", 0)
    _check_integer(train, "seed", None)
    rate = train.learning_rate
    if not (_is_number(rate) and math.isfinite(rate) and rate >= 0):
        raise ValueError(
            _number_error(
                "SimpleTrainConfig.learning_rate",
                rate,
                "must be a finite number >= 0 (the peak AdamW rate, e.g. 3e-3)",
            )
        )
    if not (_is_number(train.weight_decay) and math.isfinite(train.weight_decay) and train.weight_decay >= 0):
        raise ValueError(_number_error("SimpleTrainConfig.weight_decay", train.weight_decay, "must be >= 0"))
    if not (_is_number(train.min_lr_ratio) and 0 <= train.min_lr_ratio <= 1):
        raise ValueError(
            _number_error(
                "SimpleTrainConfig.min_lr_ratio",
                train.min_lr_ratio,
                "must be in [0, 1] (the schedule decays to learning_rate * min_lr_ratio)",
            )
        )
    _check_fraction_or_steps(train, "warmup")
    minutes = train.checkpoint_minutes
    if minutes is not None and not (_is_number(minutes) and math.isfinite(minutes) and minutes > 0):
        raise ValueError(
            _number_error(
                "SimpleTrainConfig.checkpoint_minutes",
                minutes,
                "must be > 0, or None (step checkpoints only)",
            )
        )


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _number_error(field_name: str, value: Any, requirement: str) -> str:
    kind = f" (a {type(value).__name__}: write the number itself)" if isinstance(value, str | bytes) else ""
    return f"{field_name}={value!r}: {requirement}{kind}"


def _check_integer(train: SimpleTrainConfig, name: str, minimum: int | None, none: str | None = None) -> None:
    """`train.<name>` is an integer >= minimum (any integer when None), or None where `none` says what None means."""
    value = getattr(train, name)
    if value is None and none is not None:
        return
    if _is_integer(value) and (minimum is None or value >= minimum):
        return
    requirement = "must be an integer" + (f" >= {minimum}" if minimum is not None else "")
    raise ValueError(
        _number_error(f"SimpleTrainConfig.{name}", value, requirement + (f", or {none}" if none else ""))
    )


def _check_fraction_or_steps(train: SimpleTrainConfig, name: str) -> None:
    """Levanter's reading of warmup, decay and rewarmup: a fraction in [0, 1], else whole steps."""
    value = getattr(train, name)
    if value is None and name != "warmup":
        return
    if _is_number(value) and math.isfinite(value) and value >= 0 and (value <= 1 or value % 1 == 0):
        return
    raise ValueError(
        _number_error(
            f"SimpleTrainConfig.{name}",
            value,
            "must be a fraction of the steps in [0, 1], or a whole number of steps (e.g. 0.01 or 100)",
        )
    )


def check_model(model: Any, where: str) -> None:
    """ValueError naming `where` (e.g. "TrainConfig.model") unless `model` is a Llama shape
    Levanter can build: positive integer sizes, heads that divide the width, key/value heads
    that divide the heads. Called when a `LlamaSpec` is made and again when a step starts."""
    if not isinstance(model, LlamaSpec):
        raise ValueError(
            f"{where}: a LlamaSpec (e.g. marin.models.llama_nano, or marin.models.model_spec(name)), got "
            f"{type(model).__name__} {model!r}"[:300]
        )
    for name in ("hidden_dim", "intermediate_dim", "num_layers", "num_heads", "num_kv_heads", "seq_len"):
        value = getattr(model, name)
        if not (_is_integer(value) and value >= 1):
            raise ValueError(_number_error(f"{where}.{name}", value, "must be an integer >= 1"))
    if model.hidden_dim % model.num_heads:
        fits = [n for n in range(1, model.hidden_dim + 1) if model.hidden_dim % n == 0]
        nearest = min(fits, key=lambda n: (abs(n - model.num_heads), n))
        raise ValueError(
            f"{where}.num_heads={model.num_heads}: hidden_dim={model.hidden_dim} must divide by it (each "
            f"head is hidden_dim / num_heads wide); e.g. num_heads={nearest}"
        )
    if model.num_heads % model.num_kv_heads:
        raise ValueError(
            f"{where}.num_kv_heads={model.num_kv_heads}: num_heads={model.num_heads} must divide by it "
            f"(each key/value head serves num_heads / num_kv_heads query heads); e.g. num_kv_heads={model.num_heads}"
        )
    if not isinstance(model.tie_word_embeddings, bool):
        raise ValueError(f"{where}.tie_word_embeddings={model.tie_word_embeddings!r}: must be True or False")


def _check_initialization(train: SimpleTrainConfig) -> None:
    checkpoint, hf = train.initialize_from_checkpoint_path, train.initialize_from_hf
    if checkpoint is not None and hf is not None:
        raise ValueError(
            "SimpleTrainConfig: initialize_from_checkpoint_path and initialize_from_hf are both set; give one"
        )
    for name, path in (("initialize_from_checkpoint_path", checkpoint), ("initialize_from_hf", hf)):
        if path is not None and not (is_local(path) or is_bucket(path)):
            raise ValueError(
                f"SimpleTrainConfig.{name}={path!r}: must be a directory, local or on s3:// / gs://"
            )


def _check_initial_state(config: TrainConfig) -> None:
    """Before a run that starts from another one's weights: they are there, and they fit."""
    train = config.train
    if train.initialize_from_checkpoint_path is not None:
        path = _absolute(train.initialize_from_checkpoint_path)
        step = _checkpoint_step_at(path)
        if step is None:
            raise FileNotFoundError(
                f"SimpleTrainConfig.initialize_from_checkpoint_path={path!r}: no Levanter checkpoint there "
                "(a directory with metadata.json, e.g. <run>/checkpoints/step-N, or a checkpoints/ directory)"
            )
        if step >= train.num_train_steps - 1:
            raise ValueError(
                f"SimpleTrainConfig.initialize_from_checkpoint_path={path!r} is at step {step}, but "
                f"num_train_steps={train.num_train_steps} (counted from the start of that run) leaves "
                "nothing to train; raise num_train_steps"
            )
    if train.initialize_from_hf is not None:
        path = _absolute(train.initialize_from_hf)
        source = read_json(join(path, "config.json"))
        if source is None:
            raise FileNotFoundError(
                f"SimpleTrainConfig.initialize_from_hf={path!r}: no config.json there (a Hugging Face "
                "checkpoint directory, e.g. a training step's hf/step-N; Hub ids are not fetched here: "
                "download the model and pass its directory)"
            )
        seq_len = train.seq_len or config.model.seq_len
        built = config.model.to_levanter(seq_len=seq_len).to_hf_config(source.get("vocab_size", 0)).to_dict()
        differing = [
            f"{key}: {source.get(key)!r} there, {built.get(key)!r} here"
            for key in HF_ARCHITECTURE_KEYS
            if key in built and source.get(key) != built.get(key)
        ]
        if differing:
            raise ValueError(
                f"SimpleTrainConfig.initialize_from_hf={path!r}: its config does not describe this run's "
                f"model ({'; '.join(differing)}); train the model shape it has"
            )


def _checkpoint_step_at(path: str) -> int | None:
    """Step of the Levanter checkpoint at `path`, or of the newest one directly under it."""
    metadata = read_json(join(path, "metadata.json"))
    return _newest_checkpoint_step(path) if metadata is None else int(metadata["step"])


def _check_enough_data(config: TrainConfig) -> None:
    """Levanter stops quietly when the data runs out (and then skips the final checkpoint): refuse up front."""
    stats = read_json(join(config.tokenized_path, "stats.json"))
    if not stats or "train" not in stats:
        return  # not written by operations.tokenize: let Levanter find out
    train = config.train
    seq_len = train.seq_len or config.model.seq_len
    available = stats["train"]["tokens"] // seq_len * max(1, train.epochs)
    needed = train.train_batch_size * train.num_train_steps
    if available < needed:
        raise ValueError(
            f"{config.tokenized_path}: {stats['train']['tokens']} training tokens make {available} sequences of "
            f"{seq_len} (epochs={train.epochs}), but {train.num_train_steps} steps of {train.train_batch_size} "
            f"need {needed}; add data, lower num_train_steps or train_batch_size, or set SimpleTrainConfig.epochs"
        )


def check_tokenized(path: str, field_name: str) -> None:
    """`path` holds the finished train and validation caches of operations.tokenize; else one
    line naming `field_name` and what the path holds instead (nothing, document shards, a
    tokenize step that did not finish). Levanter alone says only "No training set!"."""
    from operations.tokenize import SPLITS, cache_finished

    missing = [split for split in SPLITS if not cache_finished(join(path, split))]
    if not missing:
        return
    fix = "give the output of a tokenize step (operations.tokenize.tokenize, marin.defaults.default_tokenize)"
    fs, root = fsspec.core.url_to_fs(path)
    try:
        names = sorted(name.rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(root, detail=False))
    except (FileNotFoundError, NotADirectoryError):
        names = None
    if names is None:
        what = "no such directory" if not fs.exists(root) else "a file, not a directory"
    elif not [name for name in names if not name.startswith(".")]:
        what = "the directory is empty"
    elif any(name.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")) for name in names):
        shown = [name for name in names if not name.startswith(".")]
        what = (
            f"it holds documents ({', '.join(shown[:3])}{', ...' if len(shown) > 3 else ''}), not token caches: "
            "tokenize them first"
        )
    elif not any(name in SPLITS for name in names):
        what = (
            f"no Levanter cache in it (it holds {', '.join(n for n in names if not n.startswith('.'))[:200]})"
        )
    else:
        what = (
            f"the {' and '.join(missing)} cache{'s are' if len(missing) > 1 else ' is'} not finished (the tokenize "
            "step failed or is still running: re-run it)"
        )
    raise ValueError(f"{field_name}={path!r}: {what}; {fix}")


def check_vocabulary(
    tokenized_path: str, tokenizer: str, vocab_size: int, tokenizer_field: str, path_field: str
) -> None:
    """`vocab_size` (the tokens of `tokenizer`) must be the number the caches at `tokenized_path`
    were tokenized with (Levanter records it in each cache's ledger): another tokenizer gives ids
    past the model's vocabulary (NaN losses) or ids that mean other tokens (a run that succeeds
    on garbage). Caches that do not record it are not checked."""
    from operations.tokenize import LEDGER_FILE, SPLITS

    for split in SPLITS:
        ledger = read_json(join(tokenized_path, split, LEDGER_FILE)) or {}
        recorded = ((ledger.get("metadata") or {}).get("preprocessor_metadata") or {}).get("vocab_size")
        if recorded is not None and int(recorded) != vocab_size:
            name = ledger["metadata"]["preprocessor_metadata"].get("tokenizer")
            effect = "ids past its end" if int(recorded) > vocab_size else "ids that mean other tokens"
            raise ValueError(
                f"{tokenizer_field}={tokenizer!r} has {vocab_size} tokens, but {path_field}={tokenized_path!r} "
                f"was tokenized with a {recorded}-token tokenizer ({name}), so the model would see {effect}; "
                "give the tokenizer the tokenize step used"
            )


def loaded_vocab_size(tokenizer: str, field_name: str) -> int:
    """The number of tokens of `tokenizer`; one line naming `field_name` when it does not load."""
    try:
        return _vocab_size(tokenizer)
    except (OSError, ValueError) as error:
        lines = str(error).strip().splitlines()
        first = lines[0] if lines else ""
        raise ValueError(
            f"{field_name}={tokenizer!r}: cannot load a tokenizer from it ({type(error).__name__}: "
            f"{first if len(first) <= 200 else first[:200] + '...'}); give the output of a tokenizer step "
            "(operations.tokenizer)"
        ) from error


def _check_batch_fits_devices(train: SimpleTrainConfig, devices: dict[str, Any]) -> None:
    """Levanter splits each batch evenly over the devices (all processes' together)."""
    count = devices["count"]
    if train.train_batch_size % count:
        lower = train.train_batch_size // count * count
        higher = lower + count
        raise ValueError(
            f"SimpleTrainConfig.train_batch_size={train.train_batch_size}: must divide by the {count} devices "
            f"JAX trains on ({count} x {devices['kind']}); use {f'{lower} or ' if lower else ''}{higher}"
        )


def latest_checkpoint_step(output_path: str) -> int | None:
    """Step (Levanter's, 0-indexed) of the newest complete checkpoint under output_path, or None."""
    return _newest_checkpoint_step(join(output_path, CHECKPOINTS_DIR))


def _newest_checkpoint_step(base: str) -> int | None:
    """Step of the newest complete checkpoint directly under `base`, or None."""
    fs, root = fsspec.core.url_to_fs(base)
    steps = []
    for metadata in fs.glob(f"{root.rstrip('/')}/*/metadata.json"):
        with fs.open(metadata) as handle:
            steps.append(int(json.load(handle)["step"]))
    return max(steps, default=None)


def _hf_export_exists(output_path: str, step: int) -> bool:
    fs, root = fsspec.core.url_to_fs(join(output_path, HF_DIR, f"step-{step}"))
    return fs.exists(f"{root}/config.json") and bool(fs.glob(f"{root}/*.safetensors"))


def export_hf_from_checkpoint(config: TrainConfig, step: int, local_files: str | None = None) -> str:
    """Write <output_path>/hf/step-<step> from the Levanter checkpoint of that step; returns its path.

    `local_files`: as for `levanter_config`."""
    import equinox as eqx
    import haliax as hax
    import jax
    from levanter.checkpoint import load_checkpoint

    lm = levanter_config(config, local_files)
    tokenizer = lm.data.the_tokenizer
    vocab = hax.Axis("vocab", len(tokenizer))
    shapes = eqx.filter_eval_shape(lm.model.build, vocab, key=jax.random.PRNGKey(0))
    checkpoint = join(_absolute(config.output_path), CHECKPOINTS_DIR, f"step-{step}")
    destination = join(_absolute(config.output_path), HF_DIR, f"step-{step}")
    mesh = lm.trainer.device_mesh
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping(lm.trainer.parameter_axis_mapping):
        model = load_checkpoint(
            shapes,
            checkpoint,
            subpath="model",
            discover_latest=False,
            axis_mapping=lm.trainer.parameter_axis_mapping,
            mesh=mesh,
        )
        converter = lm.model.hf_checkpoint_converter().replaced(tokenizer=tokenizer)
        converter.save_pretrained(model, destination)
    logger.info("train: exported %s from checkpoint step %d", destination, step)
    return destination


def levanter_config(config: TrainConfig, local_files: str | None = None) -> TrainLmConfig:
    """Levanter's TrainLmConfig for `config` (writes the HF reference config it needs).

    Levanter's log file and the HF reference config can only be written locally: they go
    under the output directory when it is local, else under `local_files` (a directory the
    caller uploads: see `train`), by default a directory of this run under the system temp dir.
    """
    import datetime
    import pathlib

    import jax
    import jmp
    from levanter.distributed import DistributedConfig, RayConfig
    from levanter.main.train_lm import TrainLmConfig
    from levanter.optim import AdamConfig
    from levanter.tracker import NoopConfig
    from levanter.tracker.json_logger import JsonLoggerConfig
    from levanter.tracker.wandb import WandbConfig
    from levanter.trainer import TrainerConfig

    from operations.tokenize import lm_data_config

    configure_buckets()
    initialize_distributed()  # before the first JAX call (jax.default_backend below)
    train = config.train
    output = _absolute(config.output_path)
    tokenizer = _local_tokenizer(config.tokenizer)
    run = run_id(output)
    local = _local_files(output, local_files)
    data = lm_data_config(config.tokenized_path, config.tokenizer)
    reference = _write_hf_reference(config, os.path.join(local, HF_REFERENCE_DIR), len(data.the_tokenizer))
    model = config.model.to_levanter(
        seq_len=train.seq_len or config.model.seq_len,
        tokenizer=tokenizer,
        reference_checkpoint=reference,
        **_speed_overrides(config),
    )

    if config.tracker == "wandb":
        # W&B's directory can only be set through the environment (see `train`).
        tracker: Any = WandbConfig(
            project=config.wandb_project,
            name=config.wandb_name or run,
            group=config.wandb_group,
            tags=list(config.wandb_tags),
            mode=wandb_mode(),
            save_code=False,
        )
    elif config.tracker == "json":
        tracker = JsonLoggerConfig()
    else:
        tracker = NoopConfig()
    precision = config.mixed_precision
    if precision is None:
        precision = "f32" if jax.default_backend() == "cpu" else "p=f32,c=bfloat16"

    checkpointer = _final_checkpointer_config()(
        base_path=join(output, CHECKPOINTS_DIR),
        save_interval=datetime.timedelta(minutes=train.checkpoint_minutes or 1e9),
        keep=[dict(every=train.steps_per_checkpoint)],
        append_run_id_to_base_path=False,
        final_step=train.num_train_steps - 1,
    )
    trainer = TrainerConfig(
        seed=train.seed,
        mp=jmp.get_policy(precision),
        id=run,
        log_dir=pathlib.Path(local, "logs"),  # Levanter opens its log file with the local filesystem
        tracker=(tracker, _metrics_tracker_config()(path=join(output, METRICS_FILE))),
        train_batch_size=train.train_batch_size,
        num_train_steps=train.num_train_steps,
        steps_per_eval=train.steps_per_eval,
        max_eval_batches=train.max_eval_batches,
        checkpointer=checkpointer,
        ray=RayConfig(auto_start_cluster=False),  # the caches are built; nothing here needs Ray
        # Started (or found unnecessary) by initialize_distributed, before JAX was first used.
        distributed=DistributedConfig(initialize_jax_distributed=False),
        require_accelerator=config.require_accelerator,
        log_jaxprs=False,
        log_xla_hlo=False,
    )
    optimizer = AdamConfig(
        learning_rate=train.learning_rate,
        weight_decay=train.weight_decay,
        warmup=train.warmup,
        lr_schedule=train.lr_schedule,
        min_lr_ratio=train.min_lr_ratio,
        **_set_fields(train, ADAM_FIELDS),
    )
    if isinstance(train.cycle_length, tuple):
        # Levanter tells a list of cycle lengths from one length by `isinstance(..., list)`.
        optimizer = dataclasses.replace(optimizer, cycle_length=list(train.cycle_length))
    return TrainLmConfig(
        data=data,
        trainer=trainer,
        model=model,
        optimizer=optimizer,
        hf_save_path=join(output, HF_DIR),
        hf_save_steps=train.steps_per_export or train.num_train_steps,
        epoch=train.epochs,
        **_set_fields(train, ("z_loss_weight",)),
        initialize_from_checkpoint_path=_initial_path(train.initialize_from_checkpoint_path),
        initialize_from_hf=_initial_path(train.initialize_from_hf) or False,
    )


def _set_fields(train: SimpleTrainConfig, names: tuple[str, ...]) -> dict[str, Any]:
    """`names` of `train` that are set (not None): the others keep Levanter's defaults."""
    return {name: getattr(train, name) for name in names if getattr(train, name) is not None}


def _initial_path(path: str | None) -> str | None:
    return None if path is None else _absolute(path)


def _speed_overrides(config: TrainConfig) -> dict[str, Any]:
    """LlamaConfig fields for the attention and rematerialisation settings that differ from Levanter's defaults."""
    overrides: dict[str, Any] = {}
    if config.attention_backend is not None:
        from levanter.layers.attention import AttentionBackend

        overrides["attn_backend"] = AttentionBackend(config.attention_backend)
    if config.flash_attention_block_size is not None:
        overrides["flash_attention_block_size"] = config.flash_attention_block_size
    if config.gradient_checkpointing is not True:
        overrides["gradient_checkpointing"] = config.gradient_checkpointing
    return overrides


@contextlib.contextmanager
def _wandb_environment(config: TrainConfig, local_files: str | None = None) -> Iterator[None]:
    """W&B files under <local files>/wandb (not ./wandb wherever we run), quiet; restored afterwards.

    W&B writes only to local disk: <local files> is the output directory when it is local, else
    `local_files` (uploaded to the output directory by the caller: see `train`)."""
    local = _local_files(_absolute(config.output_path), local_files)
    values = {"WANDB_SILENT": "true"}
    if config.tracker == "wandb":
        os.makedirs(local, exist_ok=True)
        values["WANDB_DIR"] = local
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    if config.tracker == "wandb":
        import wandb

        # W&B reads WANDB_DIR once per process into a global singleton; without a teardown a
        # second training step in the same driver would write into the first run's directory.
        wandb.teardown()
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _absolute(path: str) -> str:
    return os.path.abspath(path.removeprefix("file://")) if is_local(path) else path


def _local_files(output: str, local_files: str | None) -> str:
    """Where files that can only be written locally go: the output directory itself when it is
    local and this is process 0 (or the only one: see `primary_process`), else `local_files`,
    else this run's (and process's) directory under the system temp dir (never the working
    directory)."""
    import tempfile

    import jax

    primary = primary_process()
    if is_local(output) and primary:
        return output
    name = run_id(output) if primary else f"{run_id(output)}-process-{jax.process_index()}"
    return local_files or os.path.join(tempfile.gettempdir(), "marin-train-files", name)


def _write_hf_reference(config: TrainConfig, reference: str, vocab_size: int) -> str:
    """A local HF config directory: Levanter's export needs a `reference_checkpoint` to load
    (HF loads configs from local directories or the hub only)."""
    hf_config = config.model.to_levanter(seq_len=config.train.seq_len or config.model.seq_len).to_hf_config(
        vocab_size
    )
    hf_config.save_pretrained(reference)
    return reference


def _read_lines(path: str) -> list[str]:
    try:
        with fsspec.open(path, "r") as handle:
            return [line for line in handle if line.strip()]
    except FileNotFoundError:
        return []


def _truncate_metrics(path: str, last_step: int | None) -> None:
    """Drop lines past the checkpoint we resume from (the killed attempt logged them; they are re-run)."""
    lines = _read_lines(path)
    keep = [line for line in lines if last_step is not None and json.loads(line)["step"] <= last_step]
    if len(keep) != len(lines):
        with fsspec.open(path, "w") as handle:
            handle.writelines(keep)


def read_metrics(output_path: str) -> list[dict[str, Any]]:
    """<output_path>/metrics.jsonl merged into one dict per step, in step order."""
    by_step: dict[int, dict[str, Any]] = {}
    with fsspec.open(join(output_path, METRICS_FILE), "r") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                by_step.setdefault(record["step"], {}).update(record)
    return [by_step[step] for step in sorted(by_step)]


def _attempts(config: TrainConfig, resumed_from: int | None, seconds: float) -> list[dict[str, Any]]:
    previous = read_json(join(config.output_path, "attempts.json")) or []
    if seconds:
        previous.append({"resumed_from_step": resumed_from, "seconds": round(seconds, 1)})
        write_json_atomic(join(config.output_path, "attempts.json"), previous)
    return previous


def _write_train_stats(config: TrainConfig, attempts: list[dict[str, Any]]) -> None:
    metrics = read_metrics(config.output_path)
    losses = [m for m in metrics if "train/loss" in m]
    evals = [m for m in metrics if "eval/loss" in m]
    speeds = [m["throughput/tokens_per_second"] for m in metrics if "throughput/tokens_per_second" in m]
    # The first steps include compilation; the median is what a step costs.
    speeds.sort()
    write_stats(
        config.output_path,
        {
            "run_id": run_id(_absolute(config.output_path)),
            "num_train_steps": config.train.num_train_steps,
            "final_checkpoint_step": latest_checkpoint_step(config.output_path),
            "final_train_loss": losses[-1]["train/loss"] if losses else None,
            "final_eval_loss": evals[-1]["eval/loss"] if evals else None,
            "median_tokens_per_second": speeds[len(speeds) // 2] if speeds else None,
            "parameter_count": config.model.parameter_count(_vocab_size(config.tokenizer)),
            "attempts": attempts,
            "devices": describe_devices(),
        },
    )


def _local_tokenizer(tokenizer: str) -> str:
    """The tokenizer directory on local disk (a temporary copy of one on a bucket)."""
    return local_input_copy(tokenizer) if is_bucket(tokenizer) else _absolute(tokenizer)


def _vocab_size(tokenizer: str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(_local_tokenizer(tokenizer)))


# ---------------------------------------------------------------------------- Levanter glue
# Built inside functions so that Levanter is imported only when training.


@functools.cache
def _final_checkpointer_config():
    """A CheckpointerConfig whose checkpointer also saves (and commits) the last step."""
    from levanter.checkpoint import Checkpointer, CheckpointerConfig

    class FinalStepCheckpointer(Checkpointer):
        def __init__(self, *args: Any, final_step: int, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.final_step = final_step

        def on_step(self, info: Any, force: bool = False) -> None:
            final = info.step >= self.final_step
            saved_before = self._last_save_step
            super().on_step(info, force=force or final)
            if self._last_save_step != saved_before:
                # A checkpoint is on its way: metrics.jsonl on a bucket (rewritten only now and
                # then) is brought up to it, so a run killed later resumes with its metrics.
                _flush_remote_metrics()
            if final:
                # Saves are asynchronous: the run is not done until the last one is committed.
                self.wait_until_finished()

    @dataclass
    class FinalCheckpointerConfig(CheckpointerConfig):
        final_step: int = -1

        def create(self, run_id: str) -> Checkpointer:
            return FinalStepCheckpointer(
                base_path=self.expanded_path(run_id),
                save_interval=self.save_interval,
                step_policies=[_interval(k) for k in self.keep],
                delete_old_temp_checkpoints=self.delete_old_temp_checkpoints,
                final_step=self.final_step,
            )

    return FinalCheckpointerConfig


def _interval(keep: dict[str, Any]):
    from levanter.checkpoint import CheckpointInterval

    return CheckpointInterval(**keep)


# The metrics file on an object store of the training running in this process, by path (the
# tracker made last for a path is the one Levanter logs to: it makes them twice). Emptied when
# a training ends, so a later one in the same process never flushes an earlier one's.
_remote_metrics: dict[str, Any] = {}


def _flush_remote_metrics() -> None:
    for tracker in list(_remote_metrics.values()):
        tracker._rewrite()


@functools.cache
def _metrics_tracker_config():
    """A Levanter tracker config that writes one JSON line per step to a file."""
    from levanter.tracker import Tracker
    from levanter.tracker.json_logger import _to_jsonable
    from levanter.tracker.tracker import TrackerConfig

    class MetricsFileTracker(Tracker):
        name = "metrics_file"

        def __init__(self, path: str):
            self.path = path
            self.step: int | None = None
            self.handle: Any = None
            # Every process of a multi-process run logs the same (global) metrics: one writes.
            self.writes = primary_process()
            # Object stores cannot append: keep the file's lines and rewrite it now and then.
            self.lines: list[str] | None = None if is_local(path) or not self.writes else _read_lines(path)
            self.written = time.monotonic()
            self.unwritten = False  # lines logged since the file was last rewritten
            if self.lines is not None:
                _remote_metrics[path] = self

        def log_hyperparameters(self, hparams: dict[str, Any]) -> None:
            pass

        def log(self, metrics: Any, *, step: int | None, commit: bool | None = None) -> None:
            if not self.writes:
                return
            self.step = step if step is not None else self.step
            row: dict[str, Any] = {}
            for key, value in _flatten(metrics).items():
                if PER_PARAMETER.match(key) and not key.endswith("/total"):
                    continue  # one number per weight matrix: W&B has them, the file stays readable
                value = _to_jsonable(value)
                if isinstance(value, int | float | str | bool) or value is None:
                    row[key] = value
            if self.step is None or not row:
                return
            line = json.dumps({"step": self.step, **row}, sort_keys=True) + "\n"
            if self.lines is not None:
                self.lines.append(line)
                self.unwritten = True
                if time.monotonic() - self.written >= REMOTE_METRICS_SECONDS:
                    self._rewrite()
                return
            if self.handle is None:
                self.handle = open(self.path.removeprefix("file://"), "a")  # noqa: SIM115 (open for the run)
            # One line per call, flushed at once: a killed run keeps everything it logged.
            self.handle.write(line)
            self.handle.flush()

        def _rewrite(self) -> None:
            # Only with something new: a tracker Levanter made but never logged to must not
            # put back the lines it read when it was made.
            if not self.unwritten:
                return
            with fsspec.open(self.path, "w") as handle:
                handle.writelines(self.lines or [])
            self.written = time.monotonic()
            self.unwritten = False

        def log_summary(self, metrics: dict[str, Any]) -> None:
            pass

        def log_artifact(
            self, artifact_path: Any, *, name: str | None = None, type: str | None = None
        ) -> None:
            pass

        def finish(self) -> None:
            if self.lines is not None:
                self._rewrite()
                if _remote_metrics.get(self.path) is self:
                    del _remote_metrics[self.path]
            if self.handle is not None:
                self.handle.close()
                self.handle = None

    @TrackerConfig.register_subclass("marin_metrics_file")
    @dataclass
    class MetricsFileConfig(TrackerConfig):
        path: str = field(default=METRICS_FILE)

        def init(self, run_id: str | None) -> Tracker:
            return MetricsFileTracker(self.path)

    return MetricsFileConfig


def _flatten(metrics: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(_flatten(value, name))
        else:
            out[name] = value
    return out
