"""Text from an output tree, made safe to print on a terminal: see `executor.terminal`, where it
lives so that the executor's own plan and progress lines use it too."""

from executor.terminal import SafeStream, one_line, printable

__all__ = ["SafeStream", "one_line", "printable"]
