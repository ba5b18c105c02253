"""Loggers that import `logging` only when something is logged.

`import logging` costs a fresh process about 4 ms (it brings `traceback`, `string`,
`weakref` and `threading`), a tenth of a fully cached re-run of a 1,000-step experiment,
which logs nothing. The executor's modules therefore hold a `LazyLogger`: it takes the same
calls as `logging.getLogger(name)` and passes each to that logger, importing `logging` at the
first.

`executor_main` shows INFO messages with a timestamped format when the script has not set
up logging itself (`configure_when_used`). With `logging` not yet imported, that set-up
waits until something is logged through a `LazyLogger`, or until a run is about to run a
step (`apply_pending_config`: step functions log through `logging` directly).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

_pending: dict[str, Any] | None = None
"""`logging.basicConfig` keywords waiting for `logging` to be needed (None: nothing waits)."""


class LazyLogger:
    """`logging.getLogger(name)`, looked up at each use (so tests and users may replace
    handlers and levels as with any logger)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(real_logger(self.name), attribute)

    def __repr__(self) -> str:
        return f"<LazyLogger {self.name}>"


def real_logger(name: str):
    import logging

    apply_pending_config()
    return logging.getLogger(name)


def configure_when_used(**basic_config: Any) -> None:
    """`logging.basicConfig(**basic_config)` unless the root logger has handlers: now when
    `logging` is already imported, else when it is first needed (see the module docstring)."""
    global _pending
    _pending = basic_config
    if "logging" in sys.modules:
        apply_pending_config()


def apply_pending_config() -> None:
    """Apply what `configure_when_used` left waiting, once."""
    global _pending
    if _pending is None:
        return
    basic_config, _pending = _pending, None
    import logging

    if not logging.getLogger().handlers:
        logging.basicConfig(**basic_config)
