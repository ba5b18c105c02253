"""A fixture for tests that must hold on every kind of store: local disk, `memory://` and a
real S3 server (SeaweedFS, started by tests/operations/servers.py's fixtures)."""

from __future__ import annotations

import uuid

import pytest

from executor.store import open_store


@pytest.fixture(params=["local", "memory", "s3"])
def store_and_root(request, tmp_path):
    """(store, an empty root path on it); the root is deleted afterwards."""
    if request.param == "local":
        root = str(tmp_path / "prefix")
    elif request.param == "memory":
        root = f"memory://store-test-{uuid.uuid4().hex}"
    else:
        request.getfixturevalue("s3_env")
        root = request.getfixturevalue("s3_prefix")
    store = open_store(root)
    yield store, root
    store.delete_tree(root)
