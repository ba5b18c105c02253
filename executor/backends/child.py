"""Runs one heavy step in a process of its own (the local backend).

    python -m executor.backends.child PAYLOAD RESULT

PAYLOAD is a file the driver wrote for this process (and that this process deletes once
read): the driver's `sys.path`, the step's `(fn, config)` pickled with cloudpickle (so
functions defined in an experiment script travel by value), the `HostedStep` and whether
stdout and stderr are already the step's log file (local disk; otherwise the output is
captured and uploaded into the log when the step ends). The step runs through
`executor.backends.host.run_hosted`: this process takes the lease over, heartbeats it from a
separate process, and records SUCCESS or FAILED itself, so it finishes the step even if the
driver is gone (it runs in a session of its own and does not die with the driver). Its result,
`{"outcome", "error"}`, goes to RESULT for the driver.

The payload is never a file from an output tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import sys


def main(payload_path: str, result_path: str) -> int:
    with open(payload_path, "rb") as handle:
        sys_path, blob, spec, log_is_stdout = pickle.load(handle)
    with contextlib.suppress(OSError):
        os.unlink(payload_path)
    from executor.backends import extend_sys_path

    extend_sys_path(sys_path)
    import logging

    from executor.backends.host import run_hosted

    # As executor_main sets up the driver: records at INFO and up, with their level and logger
    # (without this, Python prints bare WARNING messages and drops INFO ones).
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    fn, config = pickle.loads(blob)
    if log_is_stdout:
        result = run_hosted(spec, fn, config)
    else:
        from executor.logs import capture_step_log
        from executor.store import open_store

        with capture_step_log(open_store(spec.prefix), spec.output_path):
            result = run_hosted(spec, fn, config)
    temp = f"{result_path}.tmp"
    with open(temp, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    os.replace(temp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
