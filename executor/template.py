"""A step's declared config as typed JSON, so `marin reproduce` can rebuild the step.

`.executor_info` records the config twice: `config` (concrete paths filled in, class
names only: what a person reads) and `config_template` (this module): the config *as
declared*, with every type named by `module:qualname` and every placeholder kept as a
placeholder, so the step can be declared again under another prefix and hash the same.

Encoding (plain JSON, tagged objects for what JSON lacks):

    dataclass        {"__dataclass__": "pkg.mod:Cls", "fields": {name: value, ...}}
    enum member      {"__enum__": "pkg.mod:Color", "name": "RED"}
    tuple / set      {"__tuple__": [...]}, {"__set__": [...]} (sets sorted canonically)
    bytes            {"__bytes__": "<hex>"}
    path             {"__path__": "pathlib:PurePosixPath", "value": "a/b"}
    non-str dict key {"__dict__": [[key, value], ...]}
    function         {"__callable__": "pkg.mod:fn"}
    input            {"__input__": "<upstream output path>", "name": sub, "nonblocking": bool}
    hard-coded input {"__hardcoded__": path, "name": sub}
    this step's path {"__output__": sub}
    versioned(v)     {"__versioned__": v}
    anything else    {"__opaque__": "<type>", "repr": "..."}  (decoding refuses it)

Decoding imports modules by name and calls constructors; it never unpickles and never
evaluates text, so reading a tree written by someone else runs only code you already
have installed.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from executor.fingerprint import canonical_json
from executor.steps import ExecutorStep, InputName, OutputName, VersionedValue


class TemplateError(ValueError):
    """A recorded config cannot be turned back into objects (names the field and why)."""


def qualified_name(kind: type | Callable) -> str:
    return f"{kind.__module__}:{kind.__qualname__}"


def import_qualified(name: str, field: str = "", modules: dict[str, Any] | None = None) -> Any:
    """The object named `module:qualname`; TemplateError naming `field` if it cannot be imported.

    `modules` maps module names to already-loaded modules: `__main__` (a step defined in
    the experiment script itself) maps to that script loaded from its recorded path.
    """
    module_name, _, qualname = name.partition(":")
    where = f" (field {field!r})" if field else ""
    try:
        if modules and module_name in modules:
            target: Any = modules[module_name]
        elif module_name == "__main__":
            raise ImportError("defined in the experiment script (__main__), whose path was not recorded")
        else:
            target = importlib.import_module(module_name)
    except Exception as error:
        raise TemplateError(
            f"cannot import module {module_name!r} for {name}{where}: {type(error).__name__}: {error}"
        ) from error
    for part in qualname.split("."):
        if part == "<locals>" or not hasattr(target, part):
            raise TemplateError(
                f"{name}{where} is not importable: {module_name!r} has no attribute {qualname!r}"
                + (" (defined inside a function)" if "<locals>" in qualname else "")
            )
        target = getattr(target, part)
    return target


def encode_template(value: Any, output_path_of: Callable[[ExecutorStep], str], path: str = "") -> Any:
    """`value` (a declared config) as typed JSON; `output_path_of` names upstream steps."""

    def child(key: str) -> str:
        return f"{path}.{key}" if path else key

    if value is None or isinstance(value, (bool, int, float, str)) and not isinstance(value, enum.Enum):
        return value
    if isinstance(value, ExecutorStep):
        return {"__input__": output_path_of(value), "name": None, "nonblocking": False}
    if isinstance(value, InputName):
        if value.step is None:
            return {"__hardcoded__": value.name, "name": None}
        return {
            "__input__": output_path_of(value.step),
            "name": value.name,
            "nonblocking": not value.block_on_step,
        }
    if isinstance(value, OutputName):
        return {"__output__": value.name}
    if isinstance(value, VersionedValue):
        return {"__versioned__": encode_template(value.value, output_path_of, path)}
    if isinstance(value, enum.Enum):
        return {"__enum__": qualified_name(type(value)), "name": value.name}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: encode_template(getattr(value, f.name), output_path_of, child(f.name))
            for f in dataclasses.fields(value)
            if f.init
        }
        return {"__dataclass__": qualified_name(type(value)), "fields": fields}
    if isinstance(value, tuple):
        return {
            "__tuple__": [encode_template(v, output_path_of, f"{path}[{i}]") for i, v in enumerate(value)]
        }
    if isinstance(value, list):
        return [encode_template(v, output_path_of, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        items = [encode_template(v, output_path_of, f"{path}[*]") for v in value]
        return {"__set__": sorted(items, key=canonical_json), "frozen": isinstance(value, frozenset)}
    if isinstance(value, dict):
        if all(type(key) is str for key in value):
            if any(key.startswith("__") and key.endswith("__") for key in value):
                return {
                    "__dict__": [[k, encode_template(v, output_path_of, child(k))] for k, v in value.items()]
                }
            return {k: encode_template(v, output_path_of, child(k)) for k, v in value.items()}
        return {
            "__dict__": [
                [encode_template(k, output_path_of, path), encode_template(v, output_path_of, child(str(k)))]
                for k, v in value.items()
            ]
        }
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    if isinstance(value, PurePath):
        return {"__path__": qualified_name(type(value)), "value": value.as_posix()}
    if callable(value) and hasattr(value, "__qualname__") and hasattr(value, "__module__"):
        return {"__callable__": qualified_name(value)}
    return {"__opaque__": f"{type(value).__module__}.{type(value).__qualname__}", "repr": repr(value)[:200]}


def decode_template(
    record: Any,
    input_step: Callable[[str], ExecutorStep],
    path: str = "",
    modules: dict[str, Any] | None = None,
) -> Any:
    """Objects from `encode_template`'s JSON; `input_step(output_path)` gives the upstream step.

    `modules`: see `import_qualified`.
    """

    def child(key: str) -> str:
        return f"{path}.{key}" if path else key

    if isinstance(record, list):
        return [decode_template(item, input_step, f"{path}[{i}]", modules) for i, item in enumerate(record)]
    if not isinstance(record, dict):
        return record
    if "__dataclass__" in record:
        kind = import_qualified(record["__dataclass__"], path, modules)
        fields = {k: decode_template(v, input_step, child(k), modules) for k, v in record["fields"].items()}
        try:
            return kind(**fields)
        except TypeError as error:
            raise TemplateError(
                f"field {path or '<root>'!r}: {record['__dataclass__']} no longer accepts the recorded "
                f"fields ({error}); the code changed since the run"
            ) from error
    if "__input__" in record:
        step = input_step(record["__input__"])
        marker = InputName(step, record.get("name"))
        return marker.nonblocking() if record.get("nonblocking") else marker
    if "__hardcoded__" in record:
        return InputName.hardcoded(record["__hardcoded__"])
    if "__output__" in record:
        return OutputName(record["__output__"])
    if "__versioned__" in record:
        return VersionedValue(decode_template(record["__versioned__"], input_step, path, modules))
    if "__enum__" in record:
        return import_qualified(record["__enum__"], path, modules)[record["name"]]
    if "__tuple__" in record:
        return tuple(decode_template(item, input_step, path, modules) for item in record["__tuple__"])
    if "__set__" in record:
        items = [decode_template(item, input_step, path, modules) for item in record["__set__"]]
        return frozenset(items) if record.get("frozen") else set(items)
    if "__dict__" in record:
        return {
            decode_template(k, input_step, path, modules): decode_template(
                v, input_step, child(str(k)), modules
            )
            for k, v in record["__dict__"]
        }
    if "__bytes__" in record:
        return bytes.fromhex(record["__bytes__"])
    if "__path__" in record:
        return import_qualified(record["__path__"], path, modules)(record["value"])
    if "__callable__" in record:
        return import_qualified(record["__callable__"], path, modules)
    if "__opaque__" in record:
        raise TemplateError(
            f"field {path or '<root>'!r} held a {record['__opaque__']} ({record.get('repr')}), which was "
            "not recorded in a form that can be rebuilt"
        )
    return {k: decode_template(v, input_step, child(k), modules) for k, v in record.items()}
