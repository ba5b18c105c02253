"""Canonical JSON encoding and hashing of config values.

A version hash is only useful if the same value always encodes to the same bytes, on
every machine and Python run. So the strict encoder accepts a closed set of types --
None, bool, int, finite float, str, bytes, enums, paths, lists, tuples, sets, dicts and
dataclasses (recursively) -- and raises `UnencodableValueError` naming the field for
anything else instead of falling back to `repr()` (which may contain memory addresses).

The lenient encoder is for *recording* configs (`.executor_info`), never for hashing:
it also accepts callables (as `module:qualname`) and other objects (by type name).

Encoding choices:
- dataclasses become `{"__type__": ClassName, field: value, ...}`: two model configs
  of different classes with the same fields are different versions;
- enums whose members are strings or integers (`StrEnum`, `IntEnum`, `class Mode(str, Enum)`)
  become their value, as `json.dumps` and Marin write them; other enums `"EnumClass.MEMBER"`
  (Marin's `str(member)`; the class's qualified name, so nested classes stay apart); paths
  their POSIX string; tuples are lists;
- sets are sorted by their elements' canonical JSON, so they are deterministic;
- NaN and infinities are refused: JSON cannot carry them and NaN != NaN;
- what Marin's configs also version: `timedelta`, numpy/JAX dtypes and scalar types, and
  small numpy/JAX arrays (see `_encode_library_value`).

Limits: a value nests at most `MAX_DEPTH` (100) containers deep, and a step's whole
version encodes to at most `MAX_VERSION_BYTES` (1 MiB) of canonical JSON. Both are far
beyond any real config, and keep a runaway value (a list of every file, a structure
built by recursion) from turning into a RecursionError or a 50 MB hash input; versions
are also stored, compared and diffed, so a large one costs on every plan.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import math
import sys
from pathlib import PurePath

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

MAX_DEPTH = 100
"""How many containers (dataclasses, lists, tuples, sets, dicts) a config value may nest."""

MAX_VERSION_BYTES = 1 << 20
"""Largest canonical JSON of one step's version, in bytes (1 MiB)."""


class UnencodableValueError(ValueError):
    """A config value has no deterministic canonical encoding."""

    def __init__(self, field_path: str, value: Any, why: str):
        self.field_path = field_path
        self.value = value
        super().__init__(f"field {short_path(field_path, 120) or '<root>'!r}: {why}")


class ValueTooDeepError(UnencodableValueError):
    """A value nests more than MAX_DEPTH containers deep (`field_path`: where the walk stopped)."""


def short_path(path: str, limit: int = 60) -> str:
    """A field path cut to `limit` characters, for messages about absurdly deep values."""
    return path if len(path) <= limit else path[: limit - 3] + "..."


def _describe(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def encode(value: Any, path: str = "", strict: bool = True, depth: int = 0) -> Any:
    """`value` as JSON-ready primitives (see the module docstring for the rules).

    `depth` counts the containers around `value`; beyond MAX_DEPTH the value is refused
    (strict or not: no encoding of it is useful, and recursing on would overflow the stack).
    """
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:  # fast path: most leaves
        return value
    if depth >= MAX_DEPTH and (
        isinstance(value, (list, tuple, set, frozenset, dict)) or dataclasses.is_dataclass(value)
    ):
        raise ValueTooDeepError(path, value, f"nested more than {MAX_DEPTH} levels deep")
    depth += 1
    names = _PLAIN_DATACLASS_FIELDS.get(kind)
    if names is not None:  # fast path: a dataclass type seen before
        out = {"__type__": kind.__qualname__}
        for name in names:
            item = getattr(value, name)
            item_kind = type(item)
            if item_kind is str or item_kind is int or item_kind is bool or item is None:
                out[name] = item  # a leaf, as the first line of `encode` would return it
            else:
                out[name] = encode(item, f"{path}.{name}" if path else name, strict, depth)
        return out
    if kind is float and math.isfinite(value):
        return value
    if isinstance(value, enum.Enum):  # before str and int: an IntEnum member is not a plain int
        return _enum_encoding(value)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        if strict:
            raise UnencodableValueError(
                path, value, f"{value} has no canonical encoding; use a finite number"
            )
        return str(value)
    if isinstance(value, PurePath):
        return value.as_posix()
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    if strict and isinstance(value, _marker_types()):
        # Markers are dataclasses too, so this check must come before the dataclass branch.
        raise UnencodableValueError(
            path,
            value,
            f"a {type(value).__name__} inside a versioned value; inputs and output paths cannot be "
            "versioned -- move it to its own config field (inputs count through their producer's version)",
        )
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if not isinstance(value, _marker_types()):
            _PLAIN_DATACLASS_FIELDS[kind] = tuple(field.name for field in dataclasses.fields(kind))
        out = {"__type__": kind.__qualname__}
        for field in dataclasses.fields(kind):
            out[field.name] = encode(getattr(value, field.name), _child(path, field.name), strict, depth)
        return out
    if isinstance(value, (list, tuple)):
        return [encode(item, f"{path}[{i}]", strict, depth) for i, item in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        items = [encode(item, f"{path}[*]", strict, depth) for item in value]
        return sorted(items, key=canonical_json)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            text = encode_key(key, value, out, path, strict)
            out[text] = encode(item, _child(path, text), strict, depth)
        return out
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return encode(value.item(), path, strict, depth)
    special = _encode_library_value(value, path, strict, depth)
    if special is not _NOT_SPECIAL:
        return special
    if strict:
        why = (
            f"value of type {_describe(value)} has no deterministic encoding; version a plain "
            "value (str, number, list, dict, dataclass, enum, path) instead"
        )
        raise UnencodableValueError(path, value, why)
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '?')}:{value.__qualname__}"
    text = repr(value)
    return f"<{_describe(value)}>" if " at 0x" in text else text


def encode_key(key: Any, mapping: dict, encoded: dict, path: str, strict: bool) -> str:
    """A key of the dict `mapping` (at `path`) as the string it has in the encoding; refused when
    it collides with a key of `encoded` (the keys encoded so far)."""
    if type(key) is str:
        text = key
    elif isinstance(key, enum.Enum):
        text = _enum_encoding(key)
        text = text if isinstance(text, str) else json.dumps(text)
    elif isinstance(key, (str, int, float, bool)) or key is None:
        text = key if isinstance(key, str) else json.dumps(key)
    else:
        if strict:
            raise UnencodableValueError(
                path,
                mapping,
                f"dict key {key!r} of type {_describe(key)} cannot be encoded; use str keys",
            )
        text = repr(key)
    if text in encoded:
        raise UnencodableValueError(path, mapping, f"dict keys collide after encoding as strings: {text!r}")
    return text


def _enum_encoding(member: enum.Enum) -> str | int:
    """A str- or int-valued enum member (StrEnum, IntEnum, a str/int mixin) as its value,
    as Marin's version JSON has it; any other member as `"Class.MEMBER"`."""
    if isinstance(member, str):
        return str.__str__(member)  # the value, even where the class overrides __str__
    if isinstance(member, int):
        return int.__int__(member)
    return f"{type(member).__qualname__}.{member.name}"


MAX_ARRAY_ELEMENTS = 4096
"""Largest array (numpy or JAX) a config may version; a bigger one is data, not a setting."""

_NOT_SPECIAL = object()
_ARRAY_MODULES = ("numpy", "jax", "jaxlib", "ml_dtypes")


def _encode_library_value(value: Any, path: str, strict: bool, depth: int) -> Any:
    """Values Marin's configs version that are not plain Python (`_NOT_SPECIAL` otherwise):

    - `datetime.timedelta` -> `{"__type__": "timedelta", "days", "seconds", "microseconds"}`
      (Marin's fields, and our type tag so it never equals a dict with those keys);
    - numpy/JAX dtypes and scalar types (`np.float32`, `jnp.bfloat16`, `np.dtype("int8")`)
      -> `{"__dtype__": name}` (the dtype's name: the same on every platform);
    - numpy and JAX arrays of at most MAX_ARRAY_ELEMENTS -> `{"__ndarray__": {"dtype",
      "shape", "data"}}`, data flattened in C order (0-d arrays are their scalar); a larger
      array is refused when versioned and recorded by its SHA-256 when not.

    numpy is imported only for a value from one of those libraries (so it is loaded already).
    """
    kind = type(value)
    datetime = sys.modules.get("datetime")
    if datetime is not None and isinstance(value, datetime.timedelta):
        return {
            "__type__": "timedelta",
            "days": value.days,
            "seconds": value.seconds,
            "microseconds": value.microseconds,
        }
    module = (value.__module__ if isinstance(value, type) else kind.__module__) or ""
    if not module.startswith(_ARRAY_MODULES) and not (isinstance(value, type) and hasattr(value, "dtype")):
        return _NOT_SPECIAL
    import numpy as np

    if isinstance(value, np.dtype):
        return {"__dtype__": value.name}
    if isinstance(value, type) or (not hasattr(value, "shape") and hasattr(value, "dtype")):
        # (np.dtype reads a `.dtype` attribute itself: jnp.bfloat16.) A class numpy cannot read
        # as a dtype -- one whose `dtype` attribute is a string, say -- is no dtype: encoded (or
        # refused) as any other class, with its field named, not as numpy's ValueError.
        try:
            return {"__dtype__": np.dtype(value).name}
        except (TypeError, ValueError):
            return _NOT_SPECIAL
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        return _NOT_SPECIAL
    array = np.asarray(value)
    if array.ndim == 0:
        return encode(array.item(), path, strict, depth)
    if array.size > MAX_ARRAY_ELEMENTS:
        if not strict:  # recorded, not versioned (an unversioned field): its digest stands for the data
            digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
            return {"__ndarray__": {"dtype": array.dtype.name, "sha256": digest, "shape": list(array.shape)}}
        raise UnencodableValueError(
            path,
            value,
            f"an array of {array.size:,} elements is too large to version (at most "
            f"{MAX_ARRAY_ELEMENTS:,}); version its source (a path, a seed) instead",
        )
    flat = array.ravel()
    if flat.dtype.kind == "V":  # ml_dtypes (bfloat16, float8...): exact as float64
        flat = flat.astype(np.float64)
    return {
        "__ndarray__": {
            "data": encode(flat.tolist(), path, strict, depth),
            "dtype": array.dtype.name,
            "shape": list(array.shape),
        }
    }


_PLAIN_DATACLASS_FIELDS: dict[type, tuple[str, ...]] = {}
"""Field names of dataclass types already encoded (never markers), for the fast path."""


@functools.cache
def _marker_types() -> tuple[type, ...]:
    from executor.steps import ExecutorStep, InputName, MirroredValue, OutputName, VersionedValue

    return (InputName, ExecutorStep, OutputName, VersionedValue, MirroredValue)


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# One encoder object: json.dumps with non-default options builds a new encoder per call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

# And one C encoder made from it: `JSONEncoder.encode` builds one per call (half the cost of
# encoding a version). Without a circular-reference check (`markers` None), so it keeps no
# state between calls and threads can share it; encoded values are trees (a cycle would be
# a RecursionError rather than a ValueError).
_C_ENCODE = (
    json.encoder.c_make_encoder(
        None, _CANONICAL.default, json.encoder.encode_basestring, None, ":", ",", True, False, False
    )
    if json.encoder.c_make_encoder is not None
    else None
)


# The same trick for the bookkeeping files' format, `json.dumps(value, sort_keys=True)`
# (ASCII, ", " and ": "): json.dumps builds a new encoder for every call with sort_keys.
_SORTED_ENCODE = (
    json.encoder.c_make_encoder(
        None,
        json.JSONEncoder().default,
        json.encoder.encode_basestring_ascii,
        None,
        ": ",
        ", ",
        True,
        False,
        True,
    )
    if json.encoder.c_make_encoder is not None
    else None
)


def dumps_sorted(value: Any) -> str:
    """`json.dumps(value, sort_keys=True)`, same text, without a new encoder per call.

    For JSON-ready records (dicts, lists, str, numbers, bools, None) that nest no cycle.
    """
    if _SORTED_ENCODE is None:
        return json.dumps(value, sort_keys=True)
    return "".join(_SORTED_ENCODE(value, 0))


def canonical_json(value: Any) -> str:
    """Compact, key-sorted JSON of already-encoded primitives."""
    if _C_ENCODE is None:
        return _CANONICAL.encode(value)
    return "".join(_C_ENCODE(value, 0))


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
