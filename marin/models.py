"""Named model configs: Llama shapes from a test-sized nano model to ~1B parameters.

Each name has a plain `LlamaSpec` (frozen, hashable, versionable: what a training step's
config holds) in `MODELS`, and a function of the same name that returns Levanter's
`LlamaConfig` (levanter.models.llama) for code that talks to Levanter directly:

    spec = MODELS["llama_150m"]            # operations.train.TrainConfig(model=spec, ...)
    config = llama_150m(seq_len=2048)      # levanter.models.llama.LlamaConfig

Parameter counts assume a 32,000-token vocabulary and untied input/output embeddings
(`LlamaSpec.parameter_count(vocab_size)` gives them for any other vocabulary); the
"non-embedding" count does not depend on the vocabulary. The names are the 32k counts
rounded. Heads are 64 wide except in the nano model.

Levanter is imported only when one of the functions is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from operations.train import LlamaSpec, SimpleTrainConfig

if TYPE_CHECKING:
    from levanter.models.llama import LlamaConfig

__all__ = [
    "MODELS",
    "LlamaSpec",
    "SimpleTrainConfig",
    "llama_1b",
    "llama_30m",
    "llama_150m",
    "llama_600m",
    "llama_nano",
    "model_spec",
]

MODELS: dict[str, LlamaSpec] = {
    # 4,178,240 parameters (82,240 non-embedding); 129,728 with the tests' 371-token vocabulary.
    "llama_nano": LlamaSpec(
        hidden_dim=64, intermediate_dim=128, num_layers=2, num_heads=2, num_kv_heads=2, seq_len=128
    ),
    # 30,023,936 parameters (13,639,936 non-embedding).
    "llama_30m": LlamaSpec(hidden_dim=256, intermediate_dim=768, num_layers=16, num_heads=4, num_kv_heads=4),
    # 151,800,576 parameters (102,648,576 non-embedding).
    "llama_150m": LlamaSpec(
        hidden_dim=768, intermediate_dim=2688, num_layers=12, num_heads=12, num_kv_heads=12
    ),
    # 601,683,456 parameters (503,379,456 non-embedding).
    "llama_600m": LlamaSpec(
        hidden_dim=1536, intermediate_dim=4096, num_layers=20, num_heads=24, num_kv_heads=8
    ),
    # 1,032,931,328 parameters (901,859,328 non-embedding).
    "llama_1b": LlamaSpec(
        hidden_dim=2048, intermediate_dim=5632, num_layers=20, num_heads=32, num_kv_heads=8
    ),
}


def model_spec(name: str) -> LlamaSpec:
    """The `LlamaSpec` called `name` (one of MODELS)."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; named models: {', '.join(MODELS)}") from None


def llama_nano(**overrides: Any) -> LlamaConfig:
    """Hidden 64, 2 layers, 2 heads, seq 128: 4,178,240 parameters at a 32k vocabulary (82,240
    without embeddings). The test and quickstart model: trains in seconds on a CPU."""
    return MODELS["llama_nano"].to_levanter(**overrides)


def llama_30m(**overrides: Any) -> LlamaConfig:
    """Hidden 256, 16 layers, 4 heads, seq 1024: 30,023,936 parameters at a 32k vocabulary
    (13,639,936 without embeddings)."""
    return MODELS["llama_30m"].to_levanter(**overrides)


def llama_150m(**overrides: Any) -> LlamaConfig:
    """Hidden 768, 12 layers, 12 heads, seq 1024: 151,800,576 parameters at a 32k vocabulary
    (102,648,576 without embeddings)."""
    return MODELS["llama_150m"].to_levanter(**overrides)


def llama_600m(**overrides: Any) -> LlamaConfig:
    """Hidden 1536, 20 layers, 24 heads (8 key/value heads), seq 1024: 601,683,456 parameters at a
    32k vocabulary (503,379,456 without embeddings)."""
    return MODELS["llama_600m"].to_levanter(**overrides)


def llama_1b(**overrides: Any) -> LlamaConfig:
    """Hidden 2048, 20 layers, 32 heads (8 key/value heads), seq 1024: 1,032,931,328 parameters at a
    32k vocabulary (901,859,328 without embeddings)."""
    return MODELS["llama_1b"].to_levanter(**overrides)
