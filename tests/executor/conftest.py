"""Fixtures shared by the executor tests: a store of each kind (see stores.py)."""

from tests.executor.stores import store_and_root  # noqa: F401 (pytest finds fixtures by name)
