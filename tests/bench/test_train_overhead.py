"""The pure parts of bench/train_overhead.py: FLOPs per token, peak lookup, estimators."""

from __future__ import annotations

import importlib.util
import os

import pytest

from marin.models import MODELS

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "bench", "train_overhead.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("train_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["llama_nano", "llama_150m", "llama_600m"])
def test_flops_per_token_matches_levanter(bench, name):
    # Levanter's own count also adds the softmax/mask terms and uses exact head dims: a few
    # per cent apart at most, and the 6N term dominates both.
    from levanter.utils.flop_utils import lm_flops_per_token

    spec = MODELS[name]
    vocab = 32_000
    ours = bench.flops_per_token(spec, vocab, spec.seq_len)
    theirs = lm_flops_per_token(
        hidden_dim=spec.hidden_dim,
        intermediate_dim=spec.intermediate_dim,
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        num_heads=spec.num_heads,
        seq_len=spec.seq_len,
        vocab_size=vocab,
        glu=True,
    )
    # Levanter's is the forward count; training is three times it.
    assert ours == pytest.approx(3 * theirs, rel=0.03)


def test_flops_per_token_formula(bench):
    spec = MODELS["llama_nano"]
    vocab = 371
    matmul = spec.parameter_count(vocab) - vocab * spec.hidden_dim
    expected = 6 * matmul + 12 * spec.num_layers * spec.hidden_dim * 128
    assert bench.flops_per_token(spec, vocab, 128) == expected


def test_peak_lookup(bench):
    assert bench.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert bench.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert bench.peak_tflops("NVIDIA H100 NVL") == 835.0
    assert bench.peak_tflops("NVIDIA H200") == 989.0
    assert bench.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert bench.peak_tflops("cpu") is None


def test_estimators(bench):
    assert bench.quantile([4.0, 1.0, 3.0, 2.0, 5.0], 0.5) == 3.0
    assert bench.quantile([1.0, 2.0], 0.1) == pytest.approx(1.1)
    low, high = bench.bootstrap_median([1.0] * 8)
    assert low == high == 1.0
    low, high = bench.bootstrap_median([0.9, 1.0, 1.1, 1.0, 0.95, 1.05])
    assert 0.9 <= low <= 1.0 <= high <= 1.1
    assert bench.verdict(0.99, 1.02, pairs=6) == "met"
    assert bench.verdict(0.90, 0.97, pairs=6) == "not met"
    assert bench.verdict(0.95, 1.02, pairs=6).startswith("undecided")
    assert bench.verdict(0.99, 1.02, pairs=2).startswith("undecided")


def test_remat_flag_maps_to_gradient_checkpointing(bench):
    assert bench.remat_policy(None) is True
    assert bench.remat_policy("true") is True and bench.remat_policy("False") is False
    assert bench.remat_policy("offload") == "offload"
