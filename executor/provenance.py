"""What an experiment run records about where it came from.

`<experiments dir>/<script>-<hash>.json` says which steps an experiment declared and
under what circumstances it last ran: git commit and dirty state of the script's
repository, the caller's path and command line, user, host, start time, Python and
installed package versions. `marin reproduce` and `marin gc` read it.

Collecting package versions and asking git take tens of milliseconds, so
`collect_provenance` runs in a background thread while the executor plans.
"""

from __future__ import annotations

import getpass
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from executor.fingerprint import canonical_json, sha256_hex
from executor.graph import HASH_LENGTH, StepGraph, join_path
from executor.store import Store
from executor.tree import utc_now_iso


def caller_script() -> str | None:
    """Path of the script being run (`__main__`), if any."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.abspath(path) if path else None


def _git(args: list[str], cwd: str) -> str | None:
    try:
        result = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def git_state(path: str | None) -> dict[str, Any]:
    """Commit, branch and dirtiness of the git repository containing `path`."""
    directory = os.path.dirname(path) if path and os.path.isfile(path) else (path or os.getcwd())
    commit = _git(["rev-parse", "HEAD"], directory)
    if commit is None:
        return {"commit": None, "dirty": None, "branch": None, "root": None}
    status = _git(["status", "--porcelain", "--untracked-files=no"], directory)
    return {
        "commit": commit,
        "dirty": bool(status),
        "branch": _git(["rev-parse", "--abbrev-ref", "HEAD"], directory),
        "root": _git(["rev-parse", "--show-toplevel"], directory),
    }


def package_versions() -> dict[str, str]:
    versions = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            versions[name.lower()] = dist.version
    return dict(sorted(versions.items()))


def collect_provenance(script: str | None) -> dict[str, Any]:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = None
    return {
        "caller_path": script,
        "command_line": sys.argv,
        "cwd": os.getcwd(),
        "user": user,
        "host": socket.gethostname(),
        "git": git_state(script),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": package_versions(),
    }


def collect_provenance_async(script: str | None) -> Future:
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="provenance")
    future = pool.submit(collect_provenance, script)
    pool.shutdown(wait=False)
    return future


def experiment_hash(graph: StepGraph) -> str:
    """Identifies the experiment by the set of its step versions (prefix-independent)."""
    return sha256_hex(canonical_json(sorted(step.version_hash for step in graph.steps)))[:HASH_LENGTH]


def experiment_info_path(base: str, script: str | None, graph: StepGraph) -> str:
    stem = os.path.splitext(os.path.basename(script))[0] if script else "interactive"
    return join_path(base, f"{stem}-{experiment_hash(graph)}.json")


def write_experiment_info(
    store: Store,
    path: str,
    graph: StepGraph,
    provenance: dict[str, Any],
    description: str | None,
    started: float,
    outcomes: dict[str, str] | None = None,
) -> None:
    record = {
        "description": description,
        "prefix": graph.prefix,
        "created_date": utc_now_iso(started),
        "finished_date": utc_now_iso() if outcomes is not None else None,
        **provenance,
        "steps": [
            {
                "name": step.name,
                "output_path": step.output_path,
                "version_hash": step.version_hash,
                "fn_name": step.fn_name,
                "dependencies": list(step.dependencies),
                "outcome": (outcomes or {}).get(step.output_path),
            }
            for step in graph.steps
        ],
    }
    store.write_atomic(path, json.dumps(record, indent=2) + "\n")
