"""The commit a benchmark measured, recorded before it starts (others may commit meanwhile)."""

from __future__ import annotations

import os
import subprocess


def commit(paths: tuple[str, ...] = ("operations", "bench")) -> str:
    """`git rev-parse --short HEAD`, with `+dirty` when `paths` have uncommitted changes."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", *paths], cwd=here, capture_output=True, text=True
    )
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
