"""The one traversal over config trees.

Collecting a step's dependencies, computing its version, recording its config and
filling in concrete paths are all the same walk: visit every dataclass field, list
item and dict value, and hand each *marker* (an `InputName`, an `ExecutorStep` used
as an input, an `OutputName`, a `VersionedValue` or a `MirroredValue`) to a callback that returns its
replacement. Everything else is left as it is. Containers are rebuilt only where
something inside them changed, so walking a config with no markers is cheap.

The walk refuses configs nested more than `MAX_DEPTH` containers deep (see
`executor.fingerprint`) with a `ConfigTooDeepError` naming the field, before Python's
recursion limit could turn it into a RecursionError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from executor.fingerprint import MAX_DEPTH, short_path
from executor.steps import ExecutorStep, InputName, MirroredValue, OutputName, VersionedValue

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

MARKER_TYPES = (InputName, ExecutorStep, OutputName, VersionedValue, MirroredValue)

MarkerCallback = Callable[[object, str, int], object]
"""`(marker, field_path, depth) -> replacement`; `depth` counts the containers around the marker."""


class ConfigTooDeepError(ValueError):
    """A config nests containers more than MAX_DEPTH deep."""


def child_path(path: str, key: str | int) -> str:
    """Dotted field path of a child: `model.hidden`, `files[0]`, `mix.web`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def map_markers(obj: Any, on_marker: MarkerCallback, path: str = "", depth: int = 0) -> Any:
    """Return `obj` with every marker replaced by `on_marker(marker, field_path, depth)`.

    `depth` counts the containers around `obj` (see ConfigTooDeepError).
    """
    if isinstance(obj, MARKER_TYPES):
        return on_marker(obj, path, depth)
    kind = type(obj)
    if kind in _LEAVES:
        return obj
    if depth >= MAX_DEPTH and (
        isinstance(obj, (list, tuple, dict, set, frozenset)) or dataclasses.is_dataclass(obj)
    ):
        raise ConfigTooDeepError(
            f"config field {short_path(path.split('[', 1)[0])!r} is nested more than {MAX_DEPTH} levels "
            f"deep (at {short_path(path)}); flatten the config"
        )
    depth += 1
    fields = _FIELDS.get(kind)
    if fields is None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = _FIELDS[kind] = tuple((field.name, field.init) for field in dataclasses.fields(kind))
        _PLAIN[kind] = len(fields) == len(kind.__dataclass_fields__)
    # Below, exact str/int/float/bool/None children are skipped without a call (most are), and
    # a child of an exact marker type goes to `on_marker` without a call of this function.
    if fields is not None:
        changes = {}
        for name, init in fields:
            old = getattr(obj, name)
            child_kind = type(old)
            if child_kind in _LEAVES:
                continue
            child = f"{path}.{name}" if path else name
            if child_kind in _EXACT_MARKERS:
                new = on_marker(old, child, depth)
            else:
                new = map_markers(old, on_marker, child, depth)
            if new is not old:
                if not init:
                    raise ValueError(
                        f"config field {child_path(path, name)!r} has init=False but holds "
                        f"{type(old).__name__}; placeholders can only be used in init fields"
                    )
                changes[name] = new
        if not changes:
            return obj
        return _replace(obj, kind, fields, changes)
    if isinstance(obj, (list, tuple)):
        items = None
        for index, item in enumerate(obj):
            if type(item) in _LEAVES:
                continue
            new = map_markers(item, on_marker, f"{path}[{index}]", depth)
            if new is not item:
                if items is None:
                    items = list(obj)
                items[index] = new
        if items is None:
            return obj
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*items)
        return type(obj)(items)
    if isinstance(obj, dict):
        out = None
        for key, value in obj.items():
            if type(value) in _LEAVES:
                continue
            new = map_markers(value, on_marker, child_path(path, str(key)), depth)
            if new is not value:
                if out is None:
                    out = dict(obj)
                out[key] = new
        if out is None:
            return obj
        return type(obj)(out) if type(obj) is not dict else out
    if isinstance(obj, (set, frozenset)):  # markers cannot be replaced inside a set: only check the depth
        for item in obj:
            map_markers(item, _unchanged, f"{path}[*]", depth)
    return obj


_LEAVES = frozenset({str, int, float, bool, type(None)})
"""Exact types that are never markers or containers: returned as they are."""

_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {}
"""(name, init) of every field of each dataclass type walked so far."""

_PLAIN: dict[type, bool] = {}
"""Per dataclass type walked: whether it has no pseudo-fields (ClassVar, InitVar)."""

_EXACT_MARKERS = frozenset(MARKER_TYPES)


def _replace(obj: Any, kind: type, fields: tuple[tuple[str, bool], ...], changes: dict[str, Any]) -> Any:
    """`dataclasses.replace(obj, **changes)`; for a class without InitVar or ClassVar
    pseudo-fields, the same call of its constructor without `replace`'s per-field checks
    (`changes` holds only init fields: the walk refuses a marker in an init=False field)."""
    if not _PLAIN[kind]:
        return dataclasses.replace(obj, **changes)
    values = {name: changes[name] if name in changes else getattr(obj, name) for name, init in fields if init}
    return kind(**values)


def _unchanged(marker: Any, path: str, depth: int) -> Any:
    return marker
