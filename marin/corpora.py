"""Embedded corpora: real data every machine already has, for the quickstart, tests and benchmarks.

The running Python's standard library is ~1,790 `.py` files (~31 MB) of real code and
prose (docstrings, comments) -- enough to exercise every data operation and to train a
tiny model, with no download from outside.
"""

import platform
import sysconfig

STDLIB_INCLUDE = ("**/*.py",)
"""Every Python source file, tests included (they are real code too)."""

STDLIB_EXCLUDE = ("site-packages/**",)
"""Installed third-party packages live inside the stdlib directory; they are not the stdlib."""


def python_stdlib_dir() -> str:
    """The standard library directory of the running interpreter."""
    return sysconfig.get_path("stdlib")


def stdlib_corpus_name() -> str:
    """A name that identifies the corpus's content: the Python version, not the install path.

    Used as the step name so that two machines with the same Python version share versions
    even though the stdlib lives at different paths.
    """
    return f"python{platform.python_version()}-stdlib"
