"""Text from an output tree, made safe to print on a terminal (the `marin` command, and the
executor's plan and progress lines, which show what a lease in the tree says).

A tree is untrusted input (see `marin.outputs`), and a terminal acts on what it is sent:
an escape sequence in a step name, a status message or a log line can clear the screen,
retitle the window, or write the clipboard (OSC 52), and a newline in a directory name
can fake a row of `marin ls`. So the `marin` command prints through `SafeStream`, which
shows every control character as an escape (`\\x1b`) instead of sending it, and table
cells, which are one line each, go through `one_line`, which escapes line breaks too.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import TextIO

_CONTROL = "[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]"
"""C0 controls but tab and newline, DEL, C1 controls (0x9b is a one-byte CSI on some
terminals), and lone surrogates: a file name that is not UTF-8 reaches Python as
surrogate escapes, which would go out as the raw bytes (a C1 control among them) or fail
to encode at all."""

_CONTROL_OR_BREAK = "[\x00-\x1f\x7f-\x9f\ud800-\udfff]"

# (Compiled at first use, through `re`'s cache: compiling these two at import cost every
# start ~0.6 ms, and a cached re-run prints nothing from a tree.)

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # the byte `code - 0xDC00` of a name that is not UTF-8
        return f"\\x{code - 0xDC00:02x}"
    if code >= 0xD800:
        return f"\\u{code:04x}"
    return _NAMED.get(char) or f"\\x{code:02x}"


def printable(text: str) -> str:
    """`text` with line breaks kept (a carriage return starts a new line, as a progress bar
    in a log meant it to) and every other control character shown as an escape."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return re.sub(_CONTROL, _escape, text)


def one_line(text: str) -> str:
    """`text` with every control character, line breaks included, shown as an escape."""
    return re.sub(_CONTROL_OR_BREAK, _escape, text)


class SafeStream:
    """A text stream that writes `printable(text)` to the stream it wraps."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(printable(text))
        return len(text)

    def __getattr__(self, name: str):  # flush, fileno, isatty, encoding, ...
        return getattr(self.stream, name)
