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
    mirrored(p, b)   {"__mirrored__": p, "budget_gb": b}   (p: a path, or {"__versioned__": path})
    anything else    {"__opaque__": "<type>", "repr": "..."}  (decoding refuses it)

Decoding treats the record as untrusted input (anyone who can write the tree wrote
it). It never unpickles and never evaluates text; it parses JSON and resolves names
under a `TrustedCode` policy:

- `__dataclass__`, `__enum__` and `__path__` must name, respectively, a dataclass, an
  `Enum` member and a `PurePath` type. The object is looked up without running code
  (no module `__getattr__`, no descriptors) and its kind is checked *before* anything
  is called; a name that resolves to a function, a builtin or any other class is
  refused. Only then are the dataclass constructor (with decoded fields), the enum
  lookup or the path constructor called.
- `__callable__` (a function stored in a config, which the step may call) and step
  functions must be plain Python functions whose defining module and source file lie
  in `TrustedCode.packages` or the checkout (never the tree, never installed packages).
  With the default policy every function is refused.
- A module not yet imported is imported only when its file lies where the policy says
  (trusted packages, the checkout, or installed packages and the standard library for
  types), checked from its import spec before its code runs. Importing a module runs
  its top-level code: that is the only code decoding can run besides the constructors
  above.

Every refusal is a `TemplateError` naming the field (dotted path) and the name.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePath
from types import FunctionType, ModuleType

from executor.fingerprint import canonical_json
from executor.steps import (
    ExecutorStep,
    InputName,
    MirroredValue,
    OutputName,
    StepDefinitionError,
    VersionedValue,
    mirrored,
)
from executor.store import is_within

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import Any


class TemplateError(ValueError):
    """A recorded config cannot be turned back into objects (names the field and why)."""


def qualified_name(kind: type | Callable) -> str:
    return f"{kind.__module__}:{kind.__qualname__}"


def _at(field: str) -> str:
    return f"field {field or '<root>'!r}"


def _under(path: str, directories: Iterable[str]) -> bool:
    return any(is_within(path, directory) for directory in directories)


def _real(paths: Iterable[str | None]) -> tuple[str, ...]:
    return tuple(os.path.realpath(path) for path in paths if path)


def describe(value: Any) -> str:
    """What kind of object `value` is, for a refusal message."""
    if inspect.isbuiltin(value):
        return "a builtin function"
    if inspect.isfunction(value):
        return f"a function ({qualified_name(value)})"
    if isinstance(value, type):
        if issubclass(value, enum.Enum):
            return f"the enum {qualified_name(value)}"
        if dataclasses.is_dataclass(value):
            return f"the dataclass {qualified_name(value)}"
        return f"the class {qualified_name(value)}"
    if inspect.ismodule(value):
        return f"the module {value.__name__}"
    return f"a {type(value).__module__}.{type(value).__qualname__} object"


class TrustedCode:
    """Which code a recorded name may reach: the policy `decode_template` resolves names under.

    - `packages`: directories of packages whose functions may be called (this project's);
    - `checkout`: a directory whose Python files may be imported and whose functions may be
      called (the git checkout the command runs from), except what lies under `installed`;
    - `installed`: directories of installed code (standard library, site-packages) whose
      modules may be imported for their dataclass, enum and path types, never for functions;
    - `excluded`: directories nothing is imported from or called in, even inside the others
      (the output trees being read and written);
    - `aliases`: module names mapped to modules already loaded (`__main__`: the experiment
      script, loaded by the caller after checking where it is).

    The default (`TrustedCode()`) allows types of modules already imported and no function.
    Functions it approved are listed in `approved` as (field, name, source file).
    """

    def __init__(
        self,
        packages: Iterable[str] = (),
        checkout: str | None = None,
        installed: Iterable[str] = (),
        excluded: Iterable[str] = (),
        aliases: Mapping[str, ModuleType] | None = None,
    ):
        self.packages = _real(packages)
        self.checkout = os.path.realpath(checkout) if checkout else None
        self.installed = _real(installed)
        self.excluded = _real(excluded)
        self.aliases = dict(aliases or {})
        self.approved: list[tuple[str, str, str]] = []

    # -- where code lives ------------------------------------------------------
    def may_run(self, path: str | None) -> bool:
        """Whether functions defined in the file `path` may be called."""
        if not path:
            return False
        real = os.path.realpath(path)
        if _under(real, self.excluded):
            return False
        if _under(real, self.packages):
            return True
        return (
            self.checkout is not None and _under(real, (self.checkout,)) and not _under(real, self.installed)
        )

    def may_import(self, path: str) -> bool:
        """Whether the module file (or package directory) `path` may be imported."""
        real = os.path.realpath(path)
        return self.may_run(real) or (not _under(real, self.excluded) and _under(real, self.installed))

    def describe_allowed(self) -> str:
        """Where functions may be defined, for a refusal message."""
        places = [*self.packages, *([self.checkout] if self.checkout else [])]
        return f"the trusted code ({', '.join(places)})" if places else "trusted code (none is configured)"

    # -- names -------------------------------------------------------------------
    def module(self, name: str) -> ModuleType:
        """The module `name`: an alias, one already imported, or imported after checking its location."""
        if name in self.aliases:
            return self.aliases[name]
        if name == "__main__":
            raise TemplateError("it was defined in an experiment script (__main__) that was not loaded")
        parts = name.split(".")
        if not all(part.isidentifier() for part in parts):
            raise TemplateError(f"{name!r} is not a module name")
        if "__main__" in parts:  # importing a package's __main__ runs its program
            raise TemplateError(f"{name!r} is a program's __main__ module: refused")
        for end in range(1, len(parts) + 1):
            prefix = ".".join(parts[:end])
            if prefix in sys.modules:
                if sys.modules[prefix] is None:
                    raise TemplateError(f"module {prefix!r} is blocked from importing")
                continue
            try:
                spec = importlib.util.find_spec(prefix)
            except Exception as error:
                raise TemplateError(
                    f"cannot import module {prefix!r}: {type(error).__name__}: {error}"
                ) from error
            if spec is None:
                raise TemplateError(f"cannot import module {prefix!r}: no module of that name is installed")
            for location in _spec_locations(spec):
                if not self.may_import(location):
                    raise TemplateError(
                        f"module {prefix!r} would be imported from {location}, which is neither "
                        f"{self.describe_allowed()} nor installed code: refused"
                    )
                if not self.may_run(os.path.realpath(location)) and parts[0] not in sys.modules:
                    # Installed code runs when imported (`antigravity` opens a web browser): a
                    # tree may name it only inside a package the code being reproduced loaded.
                    raise TemplateError(
                        f"module {prefix!r} is installed code that nothing loaded so far imports "
                        f"(neither {self.describe_allowed()} nor a package they imported): refused"
                    )
            try:
                importlib.import_module(prefix)
            except Exception as error:
                raise TemplateError(
                    f"cannot import module {prefix!r}: {type(error).__name__}: {error}"
                ) from error
        return sys.modules[name]

    def resolve(self, name: Any, field: str = "") -> Any:
        """The object `module:qualname` names, looked up without calling anything."""
        if not isinstance(name, str) or name.count(":") != 1:
            raise TemplateError(f"{_at(field)}: {name!r} is not a `module:qualname` name")
        module_name, qualname = name.split(":")
        try:
            target: Any = self.module(module_name)
        except TemplateError as error:
            raise TemplateError(f"{_at(field)}: {name} is not importable: {error}") from error
        for part in qualname.split("."):
            if part == "<locals>" or not part.isidentifier():
                raise TemplateError(
                    f"{_at(field)}: {name} is not importable"
                    + (" (defined inside a function)" if part == "<locals>" else f": bad name {part!r}")
                )
            try:
                target = inspect.getattr_static(target, part)
            except AttributeError:
                raise TemplateError(
                    f"{_at(field)}: {name} is not importable: {module_name!r} has no attribute {qualname!r}"
                ) from None
            if isinstance(target, (staticmethod, classmethod)):
                target = target.__func__
        return target

    def dataclass_type(self, name: Any, field: str = "") -> type:
        kind = self.resolve(name, field)
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
            raise TemplateError(f"{_at(field)}: {name} is {describe(kind)}, not a dataclass: refused")
        return kind

    def enum_type(self, name: Any, field: str = "") -> type[enum.Enum]:
        kind = self.resolve(name, field)
        if not (isinstance(kind, type) and issubclass(kind, enum.Enum)):
            raise TemplateError(f"{_at(field)}: {name} is {describe(kind)}, not an Enum: refused")
        return kind

    def path_type(self, name: Any, field: str = "") -> type[PurePath]:
        kind = self.resolve(name, field)
        if not (isinstance(kind, type) and issubclass(kind, PurePath)):
            raise TemplateError(f"{_at(field)}: {name} is {describe(kind)}, not a pathlib path type: refused")
        return kind

    def function(self, name: Any, field: str = "") -> FunctionType:
        """A function that may be called: plain Python, defined in a trusted package or the checkout."""
        fn = self.resolve(name, field)
        if not inspect.isfunction(fn):
            raise TemplateError(
                f"{_at(field)}: {name} is {describe(fn)}; only plain Python functions defined in "
                f"{self.describe_allowed()} are called: refused"
            )
        module_file = getattr(sys.modules.get(fn.__module__), "__file__", None)
        source = fn.__code__.co_filename
        for location in (module_file, source):
            if not self.may_run(location):
                raise TemplateError(
                    f"{_at(field)}: {name} is defined in {location or 'a module without a file'}, "
                    f"outside {self.describe_allowed()}: refused"
                )
        self.approved.append((field, name, os.path.realpath(source)))
        return fn


def _spec_locations(spec: Any) -> list[str]:
    """The files and directories importing `spec` reads code from (none: built into Python)."""
    locations = list(spec.submodule_search_locations or [])
    if spec.origin and spec.has_location:
        locations.insert(0, spec.origin)
    return locations


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
    if isinstance(value, MirroredValue):
        return {
            "__mirrored__": encode_template(value.value, output_path_of, path),
            "budget_gb": value.budget_gb,
        }
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
    policy: TrustedCode | None = None,
) -> Any:
    """Objects from `encode_template`'s JSON; `input_step(output_path)` gives the upstream step.

    Names are resolved under `policy` (default: types of modules already imported, no
    function); see the module docstring for what is refused.
    """
    policy = policy if policy is not None else TrustedCode()
    try:
        return _decode(record, input_step, path, policy)
    except RecursionError:
        raise TemplateError(f"{_at(path)}: the recorded config is nested too deeply: refused") from None


def _expect(value: Any, kinds: type | tuple[type, ...], path: str, what: str) -> Any:
    if not isinstance(value, kinds):
        raise TemplateError(
            f"{_at(path)}: {what} is {type(value).__name__}, not what the template format has"
        )
    return value


def _decode(record: Any, input_step: Callable[[str], ExecutorStep], path: str, policy: TrustedCode) -> Any:
    def child(key: str) -> str:
        return f"{path}.{key}" if path else key

    def again(value: Any, at: str) -> Any:
        return _decode(value, input_step, at, policy)

    if isinstance(record, list):
        return [again(item, f"{path}[{i}]") for i, item in enumerate(record)]
    if not isinstance(record, dict):
        return record
    if "__dataclass__" in record:
        kind = policy.dataclass_type(record["__dataclass__"], path)
        recorded = _expect(record.get("fields"), dict, path, "'fields'")
        fields = {k: again(v, child(k)) for k, v in recorded.items()}
        try:
            return kind(**fields)
        except TypeError as error:
            raise TemplateError(
                f"{_at(path)}: {record['__dataclass__']} no longer accepts the recorded "
                f"fields ({error}); the code changed since the run"
            ) from error
    if "__input__" in record:
        step = input_step(_expect(record["__input__"], str, path, "'__input__'"))
        marker = InputName(step, _expect(record.get("name"), (str, type(None)), path, "'name'"))
        return marker.nonblocking() if record.get("nonblocking") else marker
    if "__hardcoded__" in record:
        try:  # hardcoded() refuses a path leading out of the prefix: the tree is untrusted
            return InputName.hardcoded(_expect(record["__hardcoded__"], str, path, "'__hardcoded__'"))
        except StepDefinitionError as error:
            raise TemplateError(f"{_at(path)}: {error}") from None
    if "__output__" in record:
        return OutputName(_expect(record["__output__"], (str, type(None)), path, "'__output__'"))
    if "__versioned__" in record:
        return VersionedValue(again(record["__versioned__"], path))
    if "__mirrored__" in record:
        inner = again(record["__mirrored__"], path)
        budget = _expect(record.get("budget_gb"), (int, float), path, "'budget_gb'")  # names the field
        try:  # mirrored() checks the path is relative to the prefix: the tree is untrusted
            return mirrored(inner, budget)
        except ValueError as error:
            raise TemplateError(f"{_at(path)}: {error}") from None
    if "__enum__" in record:
        kind = policy.enum_type(record["__enum__"], path)
        member = kind.__members__.get(_expect(record.get("name"), str, path, "'name'"))
        if member is None:
            raise TemplateError(f"{_at(path)}: {record['__enum__']} has no member {record.get('name')!r}")
        return member
    if "__tuple__" in record:
        items = _expect(record["__tuple__"], list, path, "'__tuple__'")
        return tuple(again(item, path) for item in items)
    if "__set__" in record:
        items = [again(item, path) for item in _expect(record["__set__"], list, path, "'__set__'")]
        try:
            return frozenset(items) if record.get("frozen") else set(items)
        except TypeError as error:
            raise TemplateError(f"{_at(path)}: a recorded set holds unhashable items ({error})") from error
    if "__dict__" in record:
        pairs = _expect(record["__dict__"], list, path, "'__dict__'")
        out: dict[Any, Any] = {}
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise TemplateError(f"{_at(path)}: '__dict__' holds {pair!r}, not a [key, value] pair")
            key = again(pair[0], path)
            try:
                out[key] = again(pair[1], child(str(key)))
            except TypeError as error:
                raise TemplateError(f"{_at(path)}: a recorded dict key is unhashable ({error})") from error
        return out
    if "__bytes__" in record:
        text = _expect(record["__bytes__"], str, path, "'__bytes__'")  # outside the try: its own message
        try:
            return bytes.fromhex(text)
        except ValueError as error:
            raise TemplateError(f"{_at(path)}: '__bytes__' is not hex ({error})") from error
    if "__path__" in record:
        kind = policy.path_type(record["__path__"], path)
        return kind(_expect(record.get("value"), str, path, "'value'"))
    if "__callable__" in record:
        return policy.function(record["__callable__"], path)
    if "__opaque__" in record:
        raise TemplateError(
            f"{_at(path)} held a {record['__opaque__']} ({record.get('repr')}), which was "
            "not recorded in a form that can be rebuilt"
        )
    return {k: again(v, child(k)) for k, v in record.items()}
