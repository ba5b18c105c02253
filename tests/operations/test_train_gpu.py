"""Training on a GPU: the nano Llama trains on the GPU JAX finds, and says so.

Marked `gpu`: skipped, with the reason, where JAX sees no GPU (CI and these CPU machines).
On a machine with an NVIDIA GPU, install the `gpu` extra first (`pip install -e '.[gpu]'`)
and run `pytest -m gpu`.
"""

import json

import pytest

from operations.train import describe_devices, train
from tests.operations.test_train import data, nano_config  # noqa: F401 (data is a fixture)


@pytest.fixture(scope="module")
def gpu():
    """Skips (before the module's data is built) where JAX sees no GPU."""
    import jax

    if jax.default_backend() != "gpu":
        pytest.skip("JAX sees no GPU here (install the gpu extra on a machine with an NVIDIA GPU)")


@pytest.mark.gpu
@pytest.mark.slow
def test_nano_llama_trains_on_the_gpu_and_records_it(gpu, data, tmp_path):  # noqa: F811
    config = nano_config(data, tmp_path / "run")
    train(config)
    stats = json.loads((tmp_path / "run" / "stats.json").read_text())
    assert stats["devices"]["backend"] == "gpu"
    assert stats["devices"]["count"] >= 1
    assert stats["devices"]["memory_bytes_per_device"] > 2**30
    assert stats["devices"] == describe_devices()
