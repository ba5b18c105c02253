"""`StepDefinitionError`, and an uncaught one at the top of a script as one line,
`error: file:line: message`.

Installed as `sys.excepthook` by `import executor` (not only once `executor_main` is
used): a script that writes `import executor` and calls `executor.executor_main` at its
end declares its steps before then. Every other exception goes to the previous hook.
"""

from __future__ import annotations

import os
import sys


class StepDefinitionError(ValueError):
    """A step (or the set of steps) is declared in a way the executor cannot run.

    Defined here, the lowest module of the declarations: `executor.steps` and
    `executor.resources` import it (`ResourceConfig` raises it too), and they,
    `executor.graph` and `executor` re-export it. `executor_main` reports it as one line
    (with the script's file and line when it is raised at the top of a script). A
    ValueError, so callers catching ValueError keep working.
    """


def _one_line_step_errors(kind, error, tb, previous=sys.excepthook):
    """sys.excepthook: an uncaught StepDefinitionError is `error: file:line: message`."""
    if not issubclass(kind, StepDefinitionError):
        previous(kind, error, tb)
        return
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    where = ""
    while tb is not None:  # the last frame outside the executor: the declaration in the script
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith(("<", package)):
            where = f"{os.path.relpath(filename) if filename.startswith(os.getcwd()) else filename}:{tb.tb_lineno}: "
        tb = tb.tb_next
    print(f"error: {where}{error}", file=sys.stderr, flush=True)


sys.excepthook = _one_line_step_errors
