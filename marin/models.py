"""Named model configs, the tokenizer names Marin's experiments use, and SimpleTrainConfig.

Marin's experiment scripts import these from `experiments.llama`, `experiments.marin_models`
and `experiments.simple_train_config`; here they all live in this module:

    from marin.models import SimpleTrainConfig, llama_nano, marin_tokenizer

    default_train("nano", tokenized, versioned(llama_nano), SimpleTrainConfig(...))

Each model name (`llama_nano`, `llama_30m`, `llama_150m`, `llama_600m`, `llama_1b`) is a
config *value*, as in Marin: a frozen `LlamaSpec` that a training step's config holds and
`versioned()` hashes (its canonical form is the plain `LlamaSpec` of operations.train, so
`versioned(llama_nano)` and `MODELS["llama_nano"]` give the same version). Calling one
returns Levanter's `LlamaConfig` of that shape, for code that talks to Levanter directly:

    spec = MODELS["llama_150m"]            # operations.train.TrainConfig(model=spec, ...)
    config = llama_150m(seq_len=2048)      # levanter.models.llama.LlamaConfig

The names are Marin's; the shapes are this project's (Marin's `llama_nano` is 32 wide with a
512-token context, ours 64 wide with 128: see docs/coming_from_marin.md). Parameter counts
assume a 32,000-token vocabulary and untied input/output embeddings
(`LlamaSpec.parameter_count(vocab_size)` gives them for any other vocabulary); the
"non-embedding" count does not depend on the vocabulary. Heads are 64 wide except in the
nano model.

Levanter is imported only when a model is called or SimpleTrainConfig is converted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from operations import train as _train
from operations.hub import is_hub_id

if TYPE_CHECKING:
    from levanter.models.llama import LlamaConfig

    from executor.resources import ResourceConfig

__all__ = [
    "MODELS",
    "LlamaSpec",
    "SimpleTrainConfig",
    "TrainSettings",
    "llama3_tokenizer",
    "llama3_tokenizer_vocab_size",
    "llama_1b",
    "llama_30m",
    "llama_150m",
    "llama_600m",
    "llama_nano",
    "marin_tokenizer",
    "model_spec",
]

TrainSettings = _train.SimpleTrainConfig
"""What a training step's config holds (operations.train.SimpleTrainConfig): `SimpleTrainConfig`
below converts to it. Scripts written for the older marin.models may still pass one directly."""

marin_tokenizer = "marin-community/marin-tokenizer"
"""The Hub name of Marin's tokenizer (the Llama 3 tokenizer with Marin's chat template)."""

llama3_tokenizer = "meta-llama/Meta-Llama-3.1-8B"
"""The Hub name of the Llama 3 tokenizer (a gated repository: needs HF_TOKEN)."""

llama3_tokenizer_vocab_size = 128_256


@dataclass(frozen=True)
class LlamaSpec(_train.LlamaSpec):
    """A named Llama shape: an `operations.train.LlamaSpec` that can also be called.

    Calling it returns Levanter's `LlamaConfig` (`overrides` set other LlamaConfig fields).
    Its class is named `LlamaSpec` too, so it versions exactly like the plain spec.
    """

    def __call__(self, **overrides: Any) -> LlamaConfig:
        return self.to_levanter(**overrides)


def _named(doc: str, **shape: Any) -> LlamaSpec:
    spec = LlamaSpec(**shape)
    object.__setattr__(spec, "__doc__", doc)  # help(llama_nano) says what it is
    return spec


llama_nano = _named(
    """Hidden 64, 2 layers, 2 heads, seq 128: 4,178,240 parameters at a 32k vocabulary (82,240
    without embeddings). The test and quickstart model: trains in seconds on a CPU.""",
    hidden_dim=64,
    intermediate_dim=128,
    num_layers=2,
    num_heads=2,
    num_kv_heads=2,
    seq_len=128,
)

llama_30m = _named(
    """Hidden 256, 16 layers, 4 heads, seq 1024: 30,023,936 parameters at a 32k vocabulary
    (13,639,936 without embeddings).""",
    hidden_dim=256,
    intermediate_dim=768,
    num_layers=16,
    num_heads=4,
    num_kv_heads=4,
)

llama_150m = _named(
    """Hidden 768, 12 layers, 12 heads, seq 1024: 151,800,576 parameters at a 32k vocabulary
    (102,648,576 without embeddings).""",
    hidden_dim=768,
    intermediate_dim=2688,
    num_layers=12,
    num_heads=12,
    num_kv_heads=12,
)

llama_600m = _named(
    """Hidden 1536, 20 layers, 24 heads (8 key/value heads), seq 1024: 601,683,456 parameters at a
    32k vocabulary (503,379,456 without embeddings).""",
    hidden_dim=1536,
    intermediate_dim=4096,
    num_layers=20,
    num_heads=24,
    num_kv_heads=8,
)

llama_1b = _named(
    """Hidden 2048, 20 layers, 32 heads (8 key/value heads), seq 1024: 1,032,931,328 parameters at a
    32k vocabulary (901,859,328 without embeddings).""",
    hidden_dim=2048,
    intermediate_dim=5632,
    num_layers=20,
    num_heads=32,
    num_kv_heads=8,
)

MODELS: dict[str, LlamaSpec] = {
    "llama_nano": llama_nano,
    "llama_30m": llama_30m,
    "llama_150m": llama_150m,
    "llama_600m": llama_600m,
    "llama_1b": llama_1b,
}


def model_spec(name: str) -> LlamaSpec:
    """The `LlamaSpec` called `name` (one of MODELS)."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; named models: {', '.join(MODELS)}") from None


def as_llama_spec(model: Any) -> _train.LlamaSpec:
    """A `LlamaSpec` for `model`: a spec as it is, or Levanter's `LlamaConfig` by its shape.

    A LlamaConfig whose other fields differ from what its shape gives (activation, rotary
    embeddings, norms, ...) is refused: training here builds models from the shape alone.
    """
    if isinstance(model, _train.LlamaSpec):
        return model
    fields = {field.name for field in dataclasses.fields(_train.LlamaSpec)}
    if type(model).__name__ != "LlamaConfig" or not all(hasattr(model, name) for name in fields):
        raise ValueError(
            f"model_config: a LlamaSpec (e.g. marin.models.llama_nano) or Levanter's LlamaConfig, "
            f"got {type(model).__module__}.{type(model).__qualname__}"
        )
    spec = LlamaSpec(**{name: getattr(model, name) for name in fields})
    rebuilt = spec.to_levanter()
    ignored = (
        "tokenizer",
        "reference_checkpoint",
        "attn_backend",
        "flash_attention_block_size",
        "gradient_checkpointing",
    )
    differing = sorted(
        field.name
        for field in dataclasses.fields(model)
        if field.name not in fields
        and field.name not in ignored
        and getattr(model, field.name) != getattr(rebuilt, field.name, None)
    )
    if differing:
        raise ValueError(
            f"model_config: this LlamaConfig sets {', '.join(differing)}, which training here does not "
            "take from a config (it builds the model from hidden_dim, intermediate_dim, num_layers, "
            "num_heads, num_kv_heads, seq_len and tie_word_embeddings); leave them at Levanter's defaults"
        )
    return spec


@dataclass(frozen=True, kw_only=True)
class SimpleTrainConfig:
    """A training run's hyperparameters with Marin's field names (`experiments.simple_train_config`).

    `default_train` converts it to the `TrainSettings` a training step's config holds; the
    fields that change the trained model are versioned there. Fields left None take this
    project's defaults (weight decay 0.1, 1% warm-up, cosine to 10% of the peak). Marin
    fields that training here cannot honour yet are accepted only at their defaults:
    setting one is an error naming it, never silently ignored.
    """

    resources: ResourceConfig | dict[str, Any] | None = None
    """What the training step asks for (e.g. `ResourceConfig.with_cpu()`, `CpuOnlyConfig()`);
    None: any accelerator the driver has. Never versioned."""

    train_batch_size: int
    """Sequences per optimizer step."""

    num_train_steps: int
    """Optimizer steps."""

    learning_rate: float
    """Peak learning rate (AdamW)."""

    data_seed: int | None = None
    """Seed of the data order; None: `seed`. (Here one seed drives initialisation and data order.)"""

    weight_decay: float | None = None
    """AdamW weight decay; None: 0.1."""

    warmup: float | None = None
    """Warm-up: a fraction of num_train_steps if < 1, else steps; None: 0.01."""

    lr_schedule: str | None = None
    """cosine, linear, constant or inv_sqrt; None: cosine."""

    min_lr_ratio: float | None = None
    """The schedule decays to learning_rate * min_lr_ratio; None: 0.1."""

    train_seq_len: int | None = None
    """Tokens per training sequence; None: the model's seq_len."""

    steps_per_eval: int | None = None
    """Validation loss every this many steps (and at the end); None: 1000."""

    max_eval_batches: int | None = None
    """Validation batches per evaluation; None: the whole validation set."""

    steps_per_export: int | None = None
    """Keep a permanent checkpoint every this many steps (Marin's meaning; the final step is
    always kept); None: `steps_per_checkpoint`, else 1000."""

    steps_per_hf_export: int | None = None
    """Hugging Face export every this many steps; None: as `steps_per_export` if set, else only
    at the end; -1: only at the end (the final export is always written here)."""

    per_device_parallelism: int = -1
    """Accepted for Marin scripts; Levanter picks the microbatching here."""

    per_device_eval_parallelism: int | None = None
    """Accepted for Marin scripts; not used."""

    # Adam, the schedule and the loss: None (skip_bad_steps: False) is Levanter's default, and
    # such a field stays out of the step's version.
    beta1: float | None = None
    """Adam's first-moment decay; None: Levanter's (0.9)."""

    beta2: float | None = None
    """Adam's second-moment decay; None: Levanter's (0.95)."""

    epsilon: float | None = None
    """Adam's epsilon; None: Levanter's (1e-8)."""

    max_grad_norm: float | None = None
    """Clip the gradient to this global norm, 0: no clipping; None: Levanter's (1.0)."""

    decay: float | None = None
    """Decay phase of each cycle (a fraction of it if <= 1, else steps), the peak rate held
    between warm-up and decay; None: decay over everything after warm-up."""

    rewarmup: float | None = None
    """Warm-up of every cycle after the first (a fraction of it if <= 1, else steps); None: 0."""

    cycle_length: int | list[int] | None = None
    """Restart the schedule every this many steps, or after each of these step counts; None: one cycle."""

    z_loss_weight: float | None = None
    """Weight of the z-loss added to the training loss; None: 0."""

    skip_bad_steps: bool | int = False
    """Skip updates whose loss or gradient norm is far above the recent ones (True, or the
    length of the history compared with)."""

    # Starting from another run.
    initialize_from_checkpoint_path: str | Any | None = None
    """A Levanter checkpoint (`<run>/checkpoints/step-N`, a path or `output_path_of(step, ...)`)
    to continue from: its weights, optimizer state and step (num_train_steps counts from the
    start of that run). See operations.train.SimpleTrainConfig."""

    reset_data_loader_on_init: bool = True
    """Only True is supported: Levanter's `initialize_from_checkpoint_path` (False would be its
    trainer's `initialize_from`)."""

    initialize_from_hf: str | Any | None = None
    """A Hugging Face checkpoint directory (local, s3:// or gs://, or `output_path_of(step,
    "hf/step-N")`) to take the weights from; its config must describe the model. Hub ids are
    refused: they are not fetched here."""

    allow_partial_checkpoint: bool = False
    """Accepted for Marin scripts; not used."""

    watch: Any = None
    """Accepted for Marin scripts; not used."""

    # Marin fields that training here does not implement: only their defaults are accepted
    # (UNSUPPORTED says why).
    ema_beta: float | None = None
    steps_per_task_eval: int | None = None
    int8: bool = False
    optimizer_config: Any = None

    # This project's own settings (not in Marin's SimpleTrainConfig).
    seed: int = 0
    """Seed of model initialisation and data order."""

    steps_per_checkpoint: int | None = None
    """Permanent checkpoint every this many steps (the same as `steps_per_export`; give one)."""

    checkpoint_minutes: float | None = 10.0
    """Also a temporary checkpoint after this many minutes without one; None: step checkpoints only."""

    epochs: int = 0
    """0: one pass over the training data (the run is refused up front if it needs more);
    N > 0: cycle through it up to N times."""

    seq_len: int | None = None
    """The same as `train_seq_len` (this project's older name; give one)."""

    UNSUPPORTED = ("ema_beta", "steps_per_task_eval", "int8", "optimizer_config")
    """Marin fields whose non-default values `to_train_settings` refuses: `ema_beta` (Levanter
    would export and evaluate the average, but the re-export and operations.eval read a
    checkpoint's raw weights), `steps_per_task_eval` (no harness tasks during training: see
    `default_train`), `int8` (the checkpoints would not load into the plain model that the
    export and evaluation build) and `optimizer_config` (a Levanter object, not the plain
    values a step's config holds and versions)."""

    def to_train_settings(self) -> _train.SimpleTrainConfig:
        """The operations.train.SimpleTrainConfig this stands for (ValueError for what cannot be honoured)."""
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        unsupported = [name for name in self.UNSUPPORTED if getattr(self, name) != defaults[name]]
        if unsupported:
            raise ValueError(
                f"SimpleTrainConfig: {', '.join(f'{name}={getattr(self, name)!r}' for name in unsupported)}: "
                "not supported by training here yet (see docs/coming_from_marin.md); leave "
                f"{'it' if len(unsupported) == 1 else 'them'} unset"
            )
        if self.initialize_from_checkpoint_path is not None and not self.reset_data_loader_on_init:
            raise ValueError(
                "SimpleTrainConfig: reset_data_loader_on_init=False is not supported (Levanter's "
                "trainer.initialize_from); leave it True"
            )
        if is_hub_id(self.initialize_from_hf):
            raise ValueError(
                f"SimpleTrainConfig: initialize_from_hf={self.initialize_from_hf!r} is a Hub id, and Hub "
                "models are not fetched here; download it and pass its directory (local, s3:// or gs://)"
            )
        seed = _one_of("data_seed", self.data_seed, "seed", self.seed if self.seed != 0 else None)
        seq_len = _one_of("train_seq_len", self.train_seq_len, "seq_len", self.seq_len)
        keep_every = _one_of(
            "steps_per_export", self.steps_per_export, "steps_per_checkpoint", self.steps_per_checkpoint
        )
        hf_every = self.steps_per_hf_export
        if hf_every is None:
            hf_every = self.steps_per_export
        elif hf_every == -1:
            hf_every = None
        base = _train.SimpleTrainConfig(train_batch_size=0, num_train_steps=0, learning_rate=0.0)
        return _train.SimpleTrainConfig(
            train_batch_size=self.train_batch_size,
            num_train_steps=self.num_train_steps,
            learning_rate=self.learning_rate,
            weight_decay=_or(self.weight_decay, base.weight_decay),
            warmup=_or(self.warmup, base.warmup),
            lr_schedule=_or(self.lr_schedule, base.lr_schedule),
            min_lr_ratio=_or(self.min_lr_ratio, base.min_lr_ratio),
            seq_len=seq_len,
            steps_per_eval=_or(self.steps_per_eval, base.steps_per_eval),
            max_eval_batches=self.max_eval_batches,
            steps_per_checkpoint=_or(keep_every, base.steps_per_checkpoint),
            checkpoint_minutes=self.checkpoint_minutes,
            steps_per_export=hf_every,
            epochs=self.epochs,
            seed=_or(seed, base.seed),
            resources=self.resources,
            beta1=self.beta1,
            beta2=self.beta2,
            epsilon=self.epsilon,
            max_grad_norm=self.max_grad_norm,
            decay=self.decay,
            rewarmup=self.rewarmup,
            cycle_length=_tuple_if_list(self.cycle_length),  # the settings are frozen
            skip_bad_steps=self.skip_bad_steps or None,  # False (Marin's default): Levanter's, unversioned
            z_loss_weight=self.z_loss_weight,
            initialize_from_checkpoint_path=self.initialize_from_checkpoint_path,
            initialize_from_hf=self.initialize_from_hf,
        )


def _tuple_if_list(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _one_of(name: str, value: Any, other_name: str, other: Any) -> Any:
    """`value` or `other` (two names of one setting): refuse two different values."""
    if value is not None and other is not None and value != other:
        raise ValueError(
            f"SimpleTrainConfig: {name}={value!r} and {other_name}={other!r} name the same setting; give one"
        )
    return other if value is None else value
