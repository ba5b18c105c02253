"""Dataclasses that cost little to define, and instances made without their `__init__`.

**`dataclass`** is `dataclasses.dataclass` (frozen, eq and kw_only are the options it
takes) with its methods taken from compiled code instead of compiled at import.
`dataclasses.dataclass` writes each class's `__init__`, `__repr__`, `__eq__`, `__hash__`,
`__setattr__` and `__delattr__` as source text and compiles it with `exec`: about 0.35 ms
a class, 9.5 ms for the 27 classes a fully cached re-run imports -- more than a tenth of
that whole process (docs/benchmarks.md). Here `dataclasses.dataclass` only collects the
fields (about 12 us), and the methods come from a factory in `executor._record_methods`,
which `python -m executor.generate_records` writes from the same generator and which Python keeps
compiled in its `.pyc`. Classes of the same shape (field names and options) share a
factory. A shape with no factory there is compiled at import, as `dataclasses` would do,
so a stale file costs time, never correctness; tests/executor/test_records.py keeps the
file current and checks each class against a twin made by `dataclasses.dataclass`.

The classes are dataclasses in every respect callers use: `dataclasses.fields`,
`replace`, `asdict`, `is_dataclass`, pickling and `__match_args__` work as usual, a class
that defines a method itself keeps it (as with `dataclasses`), and `__dataclass_params__`
says what the class is. `InitVar` fields, `order`, `unsafe_hash` and `slots` are not
supported (no class here uses them).

**`record`** makes an instance of a frozen dataclass without calling its `__init__`. A
frozen dataclass's `__init__` sets each field through `object.__setattr__`: about 0.1 us a
field, so 0.7-1.1 us for the status event, plan row and two events a cached step gets --
together about 6% of re-planning 1,000 cached steps. `record` fills the instance's
`__dict__` in one call instead. The instance is the same as the constructor's: equal, same
hash and repr, still frozen. Callers pass every field, defaults included, and the class has
no `__post_init__`; tests/executor/test_cold_and_warm_trims.py checks both for each call site.
"""

from __future__ import annotations

import dataclasses
import weakref
from _thread import get_ident

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")

_new = object.__new__


def record(cls: type[T], fields: dict[str, Any]) -> T:
    """An instance of the frozen dataclass `cls` whose fields are exactly `fields`."""
    instance = _new(cls)
    instance.__dict__.update(fields)
    return instance


# -- cheap dataclasses -----------------------------------------------------------------------

FieldShape = tuple[str, bool, bool, bool, "bool | None", bool, str]
"""(name, init, repr, compare, hash, kw_only, default kind: '' none, 'd' value, 'f' factory)."""

Shape = tuple[bool, bool, bool, tuple[FieldShape, ...]]
"""(frozen, eq, calls __post_init__, fields): all that the generated methods depend on."""

compiled_at_import: list[str] = []
"""`module.qualname` of each class whose shape had no factory in `executor._record_methods`
(its methods were compiled at import; `python -m executor.generate_records` adds the shape)."""

made: weakref.WeakKeyDictionary[type, Shape] = weakref.WeakKeyDictionary()
"""Every class made by `dataclass` and still alive, with its shape, in the order they were
defined (weak: a class made at run time, e.g. in a test, can still be freed)."""


def dataclass(cls: type | None = None, /, *, frozen: bool = False, eq: bool = True, kw_only: bool = False):
    """`dataclasses.dataclass(cls, frozen=frozen, eq=eq, kw_only=kw_only)`, without compiling
    code at import (see the module docstring)."""

    def wrap(cls: type) -> type:
        return _make(cls, frozen, eq, kw_only)

    return wrap if cls is None else wrap(cls)


class _HasFactory:
    """The default of an `__init__` parameter whose field has a default_factory."""

    def __repr__(self) -> str:
        return "<factory>"


HAS_FACTORY = _HasFactory()


def _make(cls: type, frozen: bool, eq: bool, kw_only: bool) -> type:
    documented = cls.__dict__.get("__doc__") is not None
    if not documented:
        cls.__doc__ = "-"  # (dataclasses would make one from the signature with `inspect`)
    # Bases made here say frozen=True, which `dataclasses` refuses under a class it is told
    # is not frozen: while this class's fields are collected, they say what it is told.
    bases = [base for base in cls.__mro__[1:] if "__dataclass_params__" in base.__dict__]
    saved = [base.__dict__["__dataclass_params__"] for base in bases]
    try:
        for base in bases:
            base.__dataclass_params__ = _params(base.__dataclass_params__, frozen=False)
        cls = dataclasses.dataclass(cls, init=False, repr=False, eq=False, kw_only=kw_only)
    finally:
        for base, params in zip(bases, saved, strict=True):
            base.__dataclass_params__ = params
    if saved and any(params.frozen for params in saved) != frozen:  # (the rule of `dataclasses`)
        raise TypeError(
            f"cannot inherit {'' if frozen else 'non-'}frozen dataclass from a {'non-' if frozen else ''}frozen one"
        )
    fields = dataclasses.fields(cls)
    if any(str(getattr(f, "_field_type", "")) == "_FIELD_INITVAR" for f in cls.__dataclass_fields__.values()):
        raise TypeError(f"{cls.__qualname__}: InitVar fields are not supported by executor.records.dataclass")
    shape: Shape = (
        frozen,
        eq,
        hasattr(cls, "__post_init__"),
        tuple(
            (
                f.name,
                f.init,
                f.repr,
                f.compare,
                f.hash,
                f.kw_only is True,
                "f"
                if f.default_factory is not dataclasses.MISSING
                else ""
                if f.default is dataclasses.MISSING
                else "d",
            )
            for f in fields
        ),
    )
    factory = _factory(shape, f"{cls.__module__}.{cls.__qualname__}")
    methods = factory(
        cls,
        {f.name: f.default for f in fields if f.default is not dataclasses.MISSING},
        {f.name: f.default_factory for f in fields if f.default_factory is not dataclasses.MISSING},
        HAS_FACTORY,
        dataclasses.FrozenInstanceError,
    )
    own = cls.__dict__
    explicit = own.get("__hash__", dataclasses.MISSING)
    # (A class defining __eq__ gets __hash__ = None from Python: that one is not the class's own.)
    own_hash = not (explicit is dataclasses.MISSING or (explicit is None and "__eq__" in own))
    for name, method in methods.items():
        if name in ("__setattr__", "__delattr__") and name in own:
            raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
        if name == "__hash__":
            if own_hash:
                continue
        elif name in own:
            continue  # the class's own method, as `dataclasses` keeps it
        if method is not None:
            method.__qualname__ = f"{cls.__qualname__}.{name}"
            if name == "__init__":  # (as `dataclasses` annotates it: `inspect.signature` shows them)
                method.__annotations__ = {f.name: f.type for f in fields if f.init} | {"return": None}
            if name == "__repr__":
                method = _recursive_repr(method)
        setattr(cls, name, method)
    cls.__dataclass_params__ = _params(cls.__dataclass_params__, init=True, repr=True, eq=eq, frozen=frozen)
    made[cls] = shape
    if not documented:
        import inspect

        cls.__doc__ = cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
    return cls


def _params(params: Any, **changes: Any) -> Any:
    copied = object.__new__(type(params))
    for slot in type(params).__slots__:
        object.__setattr__(copied, slot, changes.get(slot, getattr(params, slot)))
    return copied


def _recursive_repr(method):
    """`method`, returning "..." when called again for the same instance inside itself (as
    the `__repr__` of `dataclasses` does, for a record that contains itself)."""
    running: set[tuple[int, int]] = set()

    def __repr__(self) -> str:
        key = id(self), get_ident()
        if key in running:
            return "..."
        running.add(key)
        try:
            return method(self)
        finally:
            running.discard(key)

    __repr__.__qualname__ = method.__qualname__
    __repr__.__wrapped__ = method
    return __repr__


def _factory(shape: Shape, where: str):
    try:
        from executor._record_methods import FACTORIES
    except ImportError:  # (a checkout without the generated file: every shape compiled here)
        FACTORIES = {}
    factory = FACTORIES.get(shape)
    if factory is None:
        compiled_at_import.append(where)
        namespace: dict[str, Any] = {}
        try:
            exec(factory_source(shape, "make"), namespace)  # noqa: S102 - our own generated text
        except SyntaxError as error:  # a field without a default after one with a default
            raise TypeError(f"{where}: {error.msg}") from None
        factory = namespace["make"]
    return factory


def factory_source(shape: Shape, name: str) -> str:
    """Source of `def <name>(cls, defaults, factories, HAS_FACTORY, FrozenInstanceError)`,
    returning the methods `dataclasses.dataclass` would give a class of this shape."""
    frozen, eq, post_init, fields = shape
    lines = [f"def {name}(cls, defaults, factories, HAS_FACTORY, FrozenInstanceError):"]
    body: list[str] = []
    if frozen:
        body.append("_set = object.__setattr__")
    for fname, _, _, _, _, _, default in fields:
        if default == "d":
            body.append(f"_d_{fname} = defaults[{fname!r}]")
        elif default == "f":
            body.append(f"_f_{fname} = factories[{fname!r}]")

    def assign(fname: str, value: str) -> str:
        return f"_set(self, {fname!r}, {value})" if frozen else f"self.{fname} = {value}"

    params, kw_params, inits = ["self"], [], []
    for fname, init, _, _, _, kw_only, default in fields:
        if init:
            param = fname + {"d": f"=_d_{fname}", "f": "=HAS_FACTORY", "": ""}[default]
            (kw_params if kw_only else params).append(param)
            value = f"_f_{fname}() if {fname} is HAS_FACTORY else {fname}" if default == "f" else fname
            inits.append(assign(fname, value))
        elif default == "d":
            inits.append(assign(fname, f"_d_{fname}"))
        elif default == "f":
            inits.append(assign(fname, f"_f_{fname}()"))
    if kw_params:
        params += ["*", *kw_params]
    if post_init:
        inits.append("self.__post_init__()")
    body.append(f"def __init__({', '.join(params)}):")
    body += [f"    {line}" for line in inits or ["pass"]]
    shown = ", ".join(f"{fname}={{self.{fname}!r}}" for fname, _, rep, *_ in fields if rep)
    body += ["def __repr__(self):", f'    return f"{{self.__class__.__qualname__}}({shown})"']
    methods = ["__init__", "__repr__"]
    if eq:
        compared = "".join(f"self.{f[0]}," for f in fields if f[3])
        others = "".join(f"other.{f[0]}," for f in fields if f[3])
        body += [
            "def __eq__(self, other):",
            "    if other.__class__ is self.__class__:",
            f"        return ({compared}) == ({others})",
            "    return NotImplemented",
        ]
        methods.append("__eq__")
        if frozen:
            hashed = "".join(f"self.{f[0]}," for f in fields if (f[3] if f[4] is None else f[4]))
            body += ["def __hash__(self):", f"    return hash(({hashed}))"]
            methods.append("__hash__")
        else:
            body.append("__hash__ = None")
            methods.append("__hash__")
    if frozen:
        names = tuple(f[0] for f in fields)
        for method, verb in (("__setattr__", "assign to"), ("__delattr__", "delete")):
            args = "self, name, value" if method == "__setattr__" else "self, name"
            body += [
                f"def {method}({args}):",
                f"    if type(self) is cls or name in {names!r}:",
                f'        raise FrozenInstanceError(f"cannot {verb} field {{name!r}}")',
                f"    super(cls, self).{method}({args.removeprefix('self, ')})",
            ]
            methods.append(method)
    body.append("return {" + ", ".join(f"{m!r}: {m}" for m in methods) + "}")
    return "\n".join(lines + [f"    {line}" for line in body]) + "\n"


GENERATED_MODULES = (
    "executor.backends",
    "executor.backends.host",
    "executor.diffing",
    "executor.events",
    "executor.graph",
    "executor.lease",
    "executor.main",
    "executor.mirror",
    "executor.outcomes",
    "executor.plan",
    "executor.resources",
    "executor.retry",
    "executor.run_records",
    "executor.steps",
    "executor.store",
    "executor.tree",
)
"""The modules whose classes `python -m executor.generate_records` makes factories for: every
module that uses this `dataclass` (a class elsewhere gets its methods compiled at import)."""


def generated_module_text() -> str:
    """The text of `executor/_record_methods.py` for every shape the modules above define."""
    import importlib

    for module in GENERATED_MODULES:
        importlib.import_module(module)
    first: dict[Shape, str] = {}
    for cls, shape in made.items():  # (only these modules: the text must not depend on what else ran)
        if cls.__module__ in GENERATED_MODULES:
            first.setdefault(shape, f"{cls.__module__}.{cls.__qualname__}")
    shapes = sorted(first, key=repr)
    parts = [
        '"""Generated by `python -m executor.generate_records`: do not edit (see executor.records)."""\n',
        "# ruff: noqa\n",
    ]
    for index, shape in enumerate(shapes):
        parts.append(f"\n\n# {first[shape]}\n{factory_source(shape, f'_make_{index}')}")
    parts.append("\n\nFACTORIES = {\n")
    parts += [f"    {shape!r}: _make_{index},\n" for index, shape in enumerate(shapes)]
    parts.append("}\n")
    return "".join(parts)


def generated_module_path() -> str:
    import os

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_record_methods.py")
