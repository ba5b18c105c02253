"""Turning a request target into a path under the prefix, or refusing it.

The browser serves only what lies under its prefix. Every URL path that names a file is
checked here, once, before anything is read:

- the target is decoded exactly once; what is left is taken literally, so a
  double-encoded `%252e%252e` can never become `..` later;
- a segment that is empty (`//`), `.` or `..`, or that holds a backslash, NUL or any
  other control character, or a `%` (double encoding), is refused;
- on local disk the resolved path (`os.path.realpath`, which follows every symlink) must
  stay inside the resolved prefix, so a symlink in an output that points elsewhere is
  refused too. Reads then use that resolved path.

Paths recorded *in* the tree (a step's dependencies, a document's source path) go through
the same check before the browser follows them.
"""

from __future__ import annotations

import os
import re
import re._parser as _regex_parser  # the stdlib's own parser (3.11+): no code runs
import stat
from dataclasses import dataclass
from urllib.parse import unquote

from executor.store import Store

_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\\%]")
_SURROGATES = re.compile("[\ud800-\udfff]")
"""What a str holds for bytes that are not UTF-8: a file name read with `os.fsdecode`
(`b"bad\\xff"` -> `"bad\\udcff"`), or a lone surrogate JSON spelled (`"\\ud800"`)."""


class Refused(Exception):
    """A request the browser will not answer with content."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Target:
    """A checked path under the prefix."""

    relpath: str
    """Relative to the prefix, `/`-separated, no `.`/`..`/empty segments ('' = the prefix)."""

    path: str
    """The store path (`<prefix>/<relpath>`)."""

    local: str | None
    """The resolved local path to read (symlinks followed), or None on other stores."""


def decode_path(raw_path: str) -> list[str]:
    """The segments of a request path (without its query), decoded once and checked."""
    if not raw_path.startswith("/"):
        raise Refused(404, "not found")
    try:
        decoded = unquote(raw_path, encoding="utf-8", errors="strict")
    except UnicodeDecodeError as error:
        raise Refused(404, "not found: the path is not UTF-8") from error
    segments = decoded[1:].split("/")
    if segments and segments[-1] == "" and len(segments) > 1:
        segments = segments[:-1]  # one trailing slash is harmless
    for segment in segments:
        check_segment(segment, allow_empty=segments == [""])
    return segments


def utf8(text: str) -> bool:
    """Whether `text` is Unicode text a page or URL can hold (a name that is not UTF-8 is not:
    a request's path is decoded strictly, so no URL names it)."""
    return _SURROGATES.search(text) is None


def displayable(text: str) -> str:
    """`text`, with what no UTF-8 page can hold (see `_SURROGATES`) spelled as escapes: the
    bytes of a file name that is not UTF-8 as `\\xff`, any other lone surrogate as `\\ud800`."""
    if utf8(text):
        return text
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no byte decodes to: from JSON, not from a name
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_segment(segment: str, allow_empty: bool = False) -> None:
    if segment == "" and not allow_empty:
        raise Refused(403, "refused: empty path segment")
    if segment in (".", ".."):
        raise Refused(403, "refused: '.' and '..' are not allowed in paths")
    bad = _FORBIDDEN.search(segment)
    if bad is None:
        return
    if bad.group() == "%":
        raise Refused(403, "refused: encoded characters left after decoding")
    if bad.group() == "\\":
        raise Refused(403, "refused: backslash in path")
    raise Refused(403, "refused: control character in path")


def check_relpath(relpath: str) -> str:
    """A `/`-separated relative path from the tree or a URL, checked segment by segment."""
    relpath = relpath.strip("/")
    if not relpath:
        return ""
    for segment in relpath.split("/"):
        check_segment(segment)
    return relpath


class PrefixGuard:
    """Resolves relative paths against one prefix, never outside it.

    Made per request: it remembers the directories it has already resolved (one `lstat`
    per path component, a full `realpath` only where a component is a symlink), so a page
    over a thousand steps does not resolve the prefix's own components a thousand times,
    and no answer outlives the request.
    """

    def __init__(self, prefix: str, store: Store):
        self.prefix = prefix
        self.store = store
        local = store.local_path(prefix)
        self.local_root = os.path.realpath(local) if local is not None else None
        self._resolved: dict[str, str] = {}

    def inside(self, real: str) -> bool:
        if self.local_root is None:
            # Object stores have no resolved local paths to compare: nothing is "inside".
            return False
        root = self.local_root
        return real == root or real.startswith(root.rstrip(os.sep) + os.sep)

    def resolve(self, relpath: str) -> Target:
        relpath = check_relpath(relpath)
        path = f"{self.prefix}/{relpath}" if relpath else self.prefix
        if self.local_root is None:
            return Target(relpath, path, None)
        return Target(relpath, path, self._real(relpath))

    def _real(self, relpath: str) -> str:
        """The resolved local path of `relpath`; Refused if any symlink on the way leads out."""
        current = self.local_root or ""
        if not relpath:
            return current
        parts = relpath.split("/")
        for index, part in enumerate(parts):
            key = "/".join(parts[: index + 1])
            cached = self._resolved.get(key)
            if cached is not None:
                current = cached
                continue
            candidate = os.path.join(current, part)
            try:
                mode = os.lstat(candidate).st_mode
            except (FileNotFoundError, NotADirectoryError):
                # Nothing there: reading it fails with "not found"; nothing to follow.
                return os.path.join(candidate, *parts[index + 1 :])
            except (OSError, UnicodeEncodeError):
                # A name too long for the filesystem, a directory we may not search, a lone
                # surrogate a recorded path spelled in JSON (no file name decodes to it).
                raise Refused(404, "not found: the path cannot be looked up") from None
            if stat.S_ISLNK(mode):
                candidate = os.path.realpath(candidate)
                if not self.inside(candidate):
                    raise Refused(403, "refused: the path leads outside the prefix")
                try:
                    os.stat(candidate)
                except (FileNotFoundError, NotADirectoryError):
                    pass  # a dangling link: reading it fails with "not found"
                except OSError:
                    # realpath stops at a loop of links (one to itself, or a -> b -> a, or
                    # a link into one) and returns it unresolved: nothing is there to read.
                    raise Refused(404, "not found: a loop of symbolic links") from None
            self._resolved[key] = candidate
            current = candidate
        return current

    def resolve_recorded(self, path: str) -> Target | None:
        """A full path recorded in the tree, if it lies under the prefix (else None)."""
        if not isinstance(path, str) or not path.startswith(self.prefix + "/"):
            return None
        try:
            return self.resolve(path[len(self.prefix) + 1 :])
        except Refused:
            return None


MAX_PATTERN_CHARS = 200
"""The longest name pattern a request may give (`?q=` of the leaderboard and predictions)."""

MAX_PATTERN_REPEATS = 2
"""How many repetitions (`*`, `+`, `{2,}`) a request's pattern may hold, none inside another."""


def check_name_pattern(pattern: str) -> None:
    """Refuse (400) a request's name pattern whose matching could tie up the server.

    Python's regex engine backtracks, and holds the GIL while it does: `(a+)+$` against a
    30-character step name takes 2**30 steps, and the whole server waits. A request's
    pattern may hold at most MAX_PATTERN_REPEATS repetitions, none containing another
    repetition or an alternation, and no back-reference; the `marin` command takes any."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise Refused(400, f"q: a pattern of at most {MAX_PATTERN_CHARS} characters, please")
    try:
        parsed = _regex_parser.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return  # invalid: the reader says so with its own message
    repeats = _repeats(list(parsed), inside=False)
    if repeats is None or repeats > MAX_PATTERN_REPEATS:
        raise Refused(
            400,
            f"q: this pattern could take the browser a long time to match (more than "
            f"{MAX_PATTERN_REPEATS} repetitions, one inside another, a repeated alternation, or a "
            "back-reference); simplify it, or use the marin command",
        )


def _repeats(items: list, inside: bool) -> int | None:
    """Repetitions in a parsed pattern; None if one is nested in another, an alternation is
    repeated, or a back-reference appears."""
    count = 0
    for op, arg in items:
        name = str(op)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            _low, high, body = arg
            repeated = high > 1
            if repeated and inside:
                return None
            inner = _repeats(list(body), inside or repeated)
            if inner is None:
                return None
            count += inner + repeated
        elif name == "BRANCH":
            if inside:
                return None
            for branch in arg[1]:
                inner = _repeats(list(branch), inside)
                if inner is None:
                    return None
                count += inner
        elif name in ("GROUPREF", "GROUPREF_EXISTS"):
            return None
        elif name in ("SUBPATTERN", "ATOMIC_GROUP", "ASSERT", "ASSERT_NOT"):
            body = arg[-1] if name != "ATOMIC_GROUP" else arg
            inner = _repeats(list(body), inside)
            if inner is None:
                return None
            count += inner
    return count
