"""Shared fixtures: short lease timings and prefixes on every store backend."""

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
