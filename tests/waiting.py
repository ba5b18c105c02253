"""Waiting for a condition in tests, with a deadline instead of a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], timeout: float = 60.0, interval: float = 0.05) -> None:
    """Return once `condition()` is true; AssertionError after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s")
