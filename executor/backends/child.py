"""Runs one step function in a process of its own (the local backend's heavy steps).

    python -m executor.backends.child PAYLOAD RESULT

PAYLOAD is a file the driver wrote: the driver's `sys.path` and the step's `(fn, config)`,
pickled with cloudpickle (so functions defined in an experiment script travel by value).
The process inherits its stdout and stderr from the driver, which copies both into the
step's log. On success it exits 0; when the function raises, it prints the traceback and
writes `{"error": "<Type>: <message>"}` to RESULT for the driver's one-line failure message,
then exits 1. On Linux it dies with the driver (parent-death signal): the driver holds the
step's lease, and a step must not run on once nobody can take its lease over cleanly.

The payload is written by this driver for this process and read once; it is never a file
from an output tree.
"""

from __future__ import annotations

import json
import pickle
import sys
import traceback


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # no libc by that name: the process then outlives a killed driver
        pass


def main(payload_path: str, result_path: str) -> int:
    _die_with_parent()
    with open(payload_path, "rb") as handle:
        sys_path, blob = pickle.load(handle)
    for entry in reversed(sys_path):  # the driver's import path, so its modules resolve here too
        if entry not in sys.path:
            sys.path.insert(0, entry)
    fn, config = pickle.loads(blob)
    try:
        fn(config)
    except BaseException as error:  # a step's SystemExit or KeyboardInterrupt is a failure too
        traceback.print_exc()
        with open(result_path, "w", encoding="utf-8") as handle:
            json.dump({"error": f"{type(error).__name__}: {error}"}, handle)
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
