"""The one traversal over config trees.

Collecting a step's dependencies, computing its version, recording its config and
filling in concrete paths are all the same walk: visit every dataclass field, list
item and dict value, and hand each *marker* (an `InputName`, an `ExecutorStep` used
as an input, an `OutputName`, a `VersionedValue` or a `MirroredValue`) to a callback that returns its
replacement. Everything else is left as it is. Containers are rebuilt only where
something inside them changed, so walking a config with no markers is cheap.
`encode_mapped` is the same walk fused with `executor.fingerprint.encode`: the encoding of the
mapped config without building it, for the config digest of a step nobody runs.

The walk refuses configs nested more than `MAX_DEPTH` containers deep (see
`executor.fingerprint`) with a `ConfigTooDeepError` naming the field, before Python's
recursion limit could turn it into a RecursionError. It also refuses, with a
`MisplacedMarkerError` naming the field, a marker where it cannot be replaced -- inside a set
(or frozenset), or in a dict key -- and the functions `this_output_path` and `output_path_of`
given without calling them: each would reach the step function as it is, and an input there
would be neither waited for nor part of the version.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Callable
from pathlib import PurePath

from executor.fingerprint import MAX_DEPTH, encode, encode_key, short_path
from executor.steps import (
    ExecutorStep,
    InputName,
    MirroredValue,
    OutputName,
    VersionedValue,
    output_path_of,
    this_output_path,
)

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

MARKER_TYPES = (InputName, ExecutorStep, OutputName, VersionedValue, MirroredValue)

MarkerCallback = Callable[[object, str, int], object]
"""`(marker, field_path, depth) -> replacement`; `depth` counts the containers around the marker."""


class ConfigTooDeepError(ValueError):
    """A config nests containers more than MAX_DEPTH deep."""


class MisplacedMarkerError(ValueError):
    """A marker where the walk cannot replace it (a set, a dict key), or a placeholder function
    given without calling it."""


def describe_marker(marker: Any) -> str:
    """How a marker was written, for messages: `output_path_of(step 'a', 'x')`, `versioned(1)`..."""
    if isinstance(marker, ExecutorStep):
        return f"the step {marker.name!r}"
    if isinstance(marker, InputName):
        if marker.step is None:
            return f"InputName.hardcoded({marker.name!r})"
        step = marker.step
        owner = f"step {step.name!r}" if isinstance(step, ExecutorStep) else repr(step)
        return f"output_path_of({owner}" + (f", {marker.name!r})" if marker.name else ")")
    if isinstance(marker, OutputName):
        return f"this_output_path({marker.name!r})" if marker.name else "this_output_path()"
    if isinstance(marker, MirroredValue):
        return f"mirrored({marker.relative_path!r})"
    text = repr(marker.value)
    return f"versioned({text if len(text) <= 40 else text[:37] + '...'})"


def _refuse_in_set(marker: Any, path: str, depth: int) -> Any:
    field = path.split("[*]", 1)[0]  # (the set's own field: its items are at `field[*]`)
    raise MisplacedMarkerError(
        f"config field {short_path(field) or '<root>'!r} holds {describe_marker(marker)} inside a set: only dataclass "
        "fields, list and tuple items and dict values are filled in, so it would reach the step as it "
        "is (an input neither waited for nor in the version); use a list or a tuple"
    )


def _refuse_in_key(path: str) -> MarkerCallback:
    def refuse(marker: Any, inner: str, depth: int) -> Any:
        raise MisplacedMarkerError(
            f"config field {short_path(path) or '<root>'!r} has {describe_marker(marker)} in a dict key: "
            "only dict values are filled in, so the key would stay as it is (an input neither waited "
            "for nor in the version); make it a value, e.g. {'train': output_path_of(step)}"
        )

    return refuse


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
        kind_is_exact = kind is list or kind is tuple
        return type(obj)(items) if kind_is_exact else _rebuild(obj, items, path)
    if isinstance(obj, dict):
        out = None
        for key, value in obj.items():
            if type(key) not in _LEAVES:  # (an enum, a tuple...: no marker may hide in it)
                map_markers(key, _refuse_in_key(path), path, depth)
            if type(value) in _LEAVES:
                continue
            new = map_markers(value, on_marker, child_path(path, str(key)), depth)
            if new is not value:
                if out is None:
                    out = dict(obj)
                out[key] = new
        if out is None:
            return obj
        return out if type(obj) is dict else _rebuild(obj, out, path)
    if isinstance(obj, (set, frozenset)):  # markers cannot be replaced inside a set: refused
        for item in obj:
            map_markers(item, _refuse_in_set, f"{path}[*]", depth)
        return obj
    if obj is this_output_path or obj is output_path_of:
        call = "this_output_path()" if obj is this_output_path else "output_path_of(step)"
        raise MisplacedMarkerError(
            f"config field {short_path(path) or '<root>'!r} holds the function {obj.__name__} itself, not "
            f"what it returns: call it, {call}"
        )
    return obj


_LEAVES = frozenset({str, int, float, bool, type(None)})
"""Exact types that are never markers or containers: returned as they are."""

_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {}
"""(name, init) of every field of each dataclass type walked so far."""

_PLAIN: dict[type, bool] = {}
"""Per dataclass type walked: whether it has no pseudo-fields (ClassVar, InitVar)."""

_EXACT_MARKERS = frozenset(MARKER_TYPES)


def _rebuild(obj: Any, items: Any, path: str) -> Any:
    """A subclass of list, tuple or dict, rebuilt around `items` (a list, or a dict) as its own
    class: a namedtuple from its fields, a defaultdict with its default factory, any other by
    calling the class with the items. A class that cannot be made so is refused, naming the field."""
    kind = type(obj)
    try:
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
            return kind(*items)
        if isinstance(obj, collections.defaultdict):
            return kind(obj.default_factory, items)
        return kind(items)
    except TypeError as error:
        base = "dict" if isinstance(obj, dict) else "list"
        raise MisplacedMarkerError(
            f"config field {short_path(path) or '<root>'!r} is a {kind.__name__} holding placeholders, "
            f"which cannot be made again with their paths filled in ({kind.__name__}(items): {error}); "
            f"use a plain {base}"
        ) from None


def _replace(obj: Any, kind: type, fields: tuple[tuple[str, bool], ...], changes: dict[str, Any]) -> Any:
    """`dataclasses.replace(obj, **changes)`; for a class without InitVar or ClassVar
    pseudo-fields, the same call of its constructor without `replace`'s per-field checks
    (`changes` holds only init fields: the walk refuses a marker in an init=False field)."""
    if not _PLAIN[kind]:
        return dataclasses.replace(obj, **changes)
    values = {name: changes[name] if name in changes else getattr(obj, name) for name, init in fields if init}
    return kind(**values)


UNBUILT = object()
"""What `encode_mapped` returns when only the mapped config itself can say its encoding."""


def encode_mapped(obj: Any, on_marker: MarkerCallback) -> Any:
    """`encode(map_markers(obj, on_marker), strict=False)` without building the mapped config,
    or UNBUILT when that needs the mapped config itself.

    A cached re-run needs each step's config digest (the encoding's hash) but never the config
    its function would get; building it was a sixth of resolving a 1,000-step chain. The two
    are the same only where rebuilding a dataclass around a replaced marker is a plain copy:
    exactly `dataclasses`' own `__init__` (no `__post_init__`, no `init=False` field, no
    `__new__` or metaclass of the class's own). A marker inside anything else -- a subclass of
    list, tuple or dict (a namedtuple), a dataclass that is also an enum, number, string or
    path -- gives UNBUILT. `obj` was walked by `map_markers` already (its depth is checked).
    """
    return _encode_mapped(obj, on_marker, "", 0, [False])


# `state[0]`: whether a marker was replaced since the innermost dataclass around began.
def _encode_mapped(obj: Any, on_marker: MarkerCallback, path: str, depth: int, state: list) -> Any:
    kind = type(obj)
    walk = _DATACLASS_WALKS.get(kind)
    if walk is None:
        if kind in _LEAVES:
            return encode(obj, path, False, depth)
        if isinstance(obj, MARKER_TYPES):
            state[0] = True
            return encode(on_marker(obj, path, depth), path, False, depth)
        if kind is list or kind is tuple:
            out = []
            for index, item in enumerate(obj):
                item = _encode_mapped(item, on_marker, f"{path}[{index}]", depth + 1, state)
                if item is UNBUILT:
                    return UNBUILT
                out.append(item)
            return out
        if kind is dict:
            out = {}
            for key, value in obj.items():
                text = encode_key(key, obj, out, path, False)
                value = _encode_mapped(value, on_marker, f"{path}.{text}" if path else text, depth + 1, state)
                if value is UNBUILT:
                    return UNBUILT
                out[text] = value
            return out
        walk = _dataclass_walk(obj)
        if walk is None:
            if isinstance(obj, (list, tuple, dict)) or (
                dataclasses.is_dataclass(obj) and not isinstance(obj, type)
            ):
                # A subclass of a container, or a dataclass that is something else too: the
                # walk rebuilds it with its own constructor. The same object when it holds no marker.
                return UNBUILT if _holds_marker(obj) else encode(obj, path, False, depth)
            return encode(obj, path, False, depth)  # (sets, paths, enums, numbers...: as they are)
    names, qualname, rebuilt_as_is = walk
    depth += 1
    replaced_before, state[0] = state[0], False
    out = {"__type__": qualname}
    # (Inlined, as in `map_markers` and `encode`: exact leaves, and markers whose value is one.)
    for name in names:
        value = getattr(obj, name)
        value_kind = type(value)
        if value_kind is str or value_kind is int or value_kind is bool or value is None:
            out[name] = value
            continue
        child = f"{path}.{name}" if path else name
        if value_kind in _EXACT_MARKERS:
            state[0] = True
            value = on_marker(value, child, depth)
            value_kind = type(value)
            if not (value_kind is str or value_kind is int or value_kind is bool or value is None):
                value = encode(value, child, False, depth)
        else:
            value = _encode_mapped(value, on_marker, child, depth, state)
            if value is UNBUILT:
                return UNBUILT
        out[name] = value
    if state[0]:
        if not rebuilt_as_is:
            return UNBUILT
    else:
        state[0] = replaced_before
    return out


_DATACLASS_WALKS: dict[type, tuple[tuple[str, ...], str, bool]] = {}
"""Per dataclass type `map_markers` walked (and that is only a dataclass): its field names,
its `__qualname__` and whether rebuilding it around a replaced marker is a plain copy."""

_NOT_PLAIN_OBJECTS = (enum.Enum, int, float, str, bytes, PurePath)
"""A dataclass that is also one of these is encoded as one of these (see `encode`)."""


def _dataclass_walk(obj: Any) -> tuple[tuple[str, ...], str, bool] | None:
    kind = type(obj)
    fields = _FIELDS.get(kind)
    if fields is None or isinstance(obj, _NOT_PLAIN_OBJECTS):  # (markers never reach here)
        return None
    init = getattr(kind.__init__, "__code__", None)
    rebuilt_as_is = bool(
        _PLAIN[kind]
        and all(init_field for _, init_field in fields)
        and not hasattr(kind, "__post_init__")
        and init is not None
        and init.co_filename == "<string>"  # (written by `dataclasses`, not by the class)
        and kind.__new__ is object.__new__
        and type(kind).__call__ is type.__call__
    )
    walk = _DATACLASS_WALKS[kind] = (tuple(name for name, _ in fields), kind.__qualname__, rebuilt_as_is)
    return walk


def _holds_marker(obj: Any) -> bool:
    found = []

    def note(marker: Any, path: str, depth: int) -> Any:
        found.append(marker)
        return marker

    map_markers(obj, note)
    return bool(found)
