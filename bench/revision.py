"""The commit a benchmark measured, recorded before it starts (others may commit meanwhile)."""

from __future__ import annotations

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The checkout these benchmarks belong to (the parent of bench/)."""


def commit(paths: tuple[str, ...] = ("operations", "bench"), root: str | None = None) -> str:
    """`git rev-parse --short HEAD` of the checkout at `root` (default: this one), with `+dirty`
    when `paths` (relative to `root`) have uncommitted changes, new files included;
    "unknown" outside git.

    Git runs in the checkout's top directory: run from bench/, as it once was, `paths` named
    bench/operations and bench/bench, and no table could ever say `+dirty`.
    """
    root = root or REPO
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *paths],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")
