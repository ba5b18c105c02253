"""Shared fixtures: short lease timings and prefixes on every store backend; one JAX
compilation cache for the session."""

import importlib.util
import os
import shutil
import tempfile
import uuid

import pytest

from executor import LeaseConfig

# Test servers (S3 via SeaweedFS, HTTP, a fake HF hub) started once per session on 127.0.0.1.
pytest_plugins = ["tests.operations.servers"]

FAST_LEASES = LeaseConfig(heartbeat_interval=0.1, timeout=1.0, poll_interval=0.05)


@pytest.fixture
def fast_leases() -> LeaseConfig:
    return FAST_LEASES


@pytest.fixture(params=["local", "memory"])
def any_prefix(request, tmp_path) -> str:
    """A fresh, empty prefix on local disk and on fsspec's memory:// filesystem."""
    if request.param == "local":
        return str(tmp_path / "prefix")
    return f"memory://test-{uuid.uuid4().hex}"


# -- one JAX compilation cache for the whole session -------------------------------------
# Dozens of tests train the same tiny Llamas, each in processes of its own (heavy steps,
# Ray workers, resumed attempts), and each process compiled the same programs again. JAX's
# persistent cache, shared through the environment that every process the tests start
# inherits, compiles each program once a session: tests/operations/test_train.py took 86 s
# without it, 74 s with an empty cache and 44 s with a warm one. What runs is unchanged
# (the same executables, loaded instead of rebuilt). A cache the caller set is used as it is.
# A size limit turns on JAX's file lock around every read and write of the cache: without
# it an entry is written in place, and a process reading it meanwhile (two processes of one
# gang compile the same program) would read half of it.
_JAX_CACHE_VARIABLES = (
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_COMPILATION_CACHE_MAX_SIZE",
)
_made_jax_cache: list[str] = []


def pytest_configure(config):
    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or importlib.util.find_spec("filelock") is None:
        return
    directory = tempfile.mkdtemp(prefix="marin-tests-jax-cache-")
    _made_jax_cache.append(directory)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = directory
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the tiny models compile in under 1 s
    os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(4 << 30)  # far above a session's (tens of MB)


def pytest_unconfigure(config):
    if not _made_jax_cache:
        return
    shutil.rmtree(_made_jax_cache.pop(), ignore_errors=True)
    for name in _JAX_CACHE_VARIABLES:
        os.environ.pop(name, None)
