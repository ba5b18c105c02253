"""`executor.records.dataclass` behaves as `dataclasses.dataclass` does, without compiling
code at import (its methods come from the generated `executor/_record_methods.py`)."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pickle
from dataclasses import field
from typing import Generic, TypeVar

import pytest

from executor import records

T = TypeVar("T")


def both(body, **options):
    """The class `body()` returns, made by `dataclasses.dataclass` and by `records.dataclass`."""
    return dataclasses.dataclass(**options)(body()), records.dataclass(**options)(body())


def params_of(cls) -> list[tuple]:
    return [(p.name, p.kind, repr(p.default)) for p in inspect.signature(cls.__init__).parameters.values()]


def error_of(action) -> tuple[type, str] | None:
    try:
        action()
    except Exception as error:  # noqa: BLE001 - compared between the two implementations
        return type(error), str(error)
    return None


def point():
    class Point:
        """A point."""

        x: int
        y: str = "y"
        tags: list = field(default_factory=list)
        when: float = field(default=0.0, kw_only=True)
        hidden: int = field(default=7, repr=False, compare=False)
        late: tuple = field(default_factory=lambda: (1,), init=False)
        unhashed: str = field(default="u", hash=False)

    return Point


@pytest.mark.parametrize("frozen", [True, False])
@pytest.mark.parametrize("eq", [True, False])
def test_a_class_gets_the_methods_dataclasses_gives_it(frozen, eq):
    real, ours = both(point, frozen=frozen, eq=eq)
    assert params_of(ours) == params_of(real)
    assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(real)]
    assert ours.__match_args__ == real.__match_args__
    for name in ("init", "repr", "eq", "frozen", "order", "unsafe_hash"):
        assert getattr(ours.__dataclass_params__, name) == getattr(real.__dataclass_params__, name), name
    a_real, a_ours = real(1, "b", ("t",), when=2.0), ours(1, "b", ("t",), when=2.0)
    assert repr(a_ours) == repr(a_real)
    assert "hidden" not in repr(a_ours) and "late=(1,)" in repr(a_ours)
    assert dataclasses.asdict(a_ours) == dataclasses.asdict(a_real)
    assert repr(ours(3)) == repr(real(3))  # defaults and factories
    assert ours(3).tags is not ours(3).tags  # a fresh list each time
    # Equality: by compared fields (hidden is not), and only with the same class.
    assert (a_ours == ours(1, "b", ("t",), when=2.0, hidden=9)) == (
        a_real == real(1, "b", ("t",), when=2.0, hidden=9)
    )
    assert (a_ours == ours(1, "c", ("t",), when=2.0)) is False
    assert (a_ours == a_real) is False
    assert a_ours.__eq__(object()) is NotImplemented
    if eq and frozen:
        assert error_of(lambda: hash(ours(1, tags=[]))) == error_of(lambda: hash(real(1, tags=[])))
        assert hash(a_ours) == hash(a_real)
        assert hash(ours(1, "b", ("t",), unhashed="other")) == hash(real(1, "b", ("t",)))  # hash=False
    elif eq:
        assert ours.__hash__ is None and real.__hash__ is None
    else:
        assert ours.__hash__ is object.__hash__ and real.__hash__ is object.__hash__
    # Missing and unknown arguments: the same TypeError, naming the class.
    assert error_of(lambda: ours()) == error_of(lambda: real())
    assert error_of(lambda: ours(1, nope=2)) == error_of(lambda: real(1, nope=2))
    assert error_of(lambda: ours(1, late=[])) == error_of(lambda: real(1, late=[]))
    for action in (
        lambda a: setattr(a, "x", 5),
        lambda a: setattr(a, "other", 5),
        lambda a: delattr(a, "x"),
    ):
        fresh_ours, fresh_real = ours(1), real(1)
        assert error_of(lambda: action(fresh_ours)) == error_of(lambda: action(fresh_real))  # noqa: B023
    if frozen:
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'x'"):
            a_ours.x = 5
    changed = dataclasses.replace(a_ours, y="z")
    assert (changed.x, changed.y, type(changed)) == (1, "z", ours)
    assert copy.copy(a_ours) == a_ours if eq else True


def test_subclasses_inherit_fields_and_the_frozen_rule():
    def base():
        class Event:
            """An event."""

            name: str
            time: float = field(default_factory=lambda: 1.5, kw_only=True)

        return Event

    real_base, ours_base = both(base, frozen=True)

    def child(parent):
        class Planned(parent):
            """A planned event."""

            action: str

        return Planned

    real = dataclasses.dataclass(frozen=True)(child(real_base))
    ours = records.dataclass(frozen=True)(child(ours_base))
    assert params_of(ours) == params_of(real)
    assert repr(ours("n", "run")) == repr(real("n", "run")).replace(real.__qualname__, ours.__qualname__)
    assert ours("n", "run") == ours("n", "run", time=1.5)
    assert ours("n", "run") != ours_base("n")  # another class
    assert ours_base.__dataclass_params__.frozen is True  # restored after the child was made
    # `dataclasses`' rule both ways: frozen and not frozen do not mix along a hierarchy.
    assert error_of(lambda: records.dataclass(child(ours_base))) == error_of(
        lambda: dataclasses.dataclass(child(real_base))
    )
    real_mutable, ours_mutable = both(base)
    assert error_of(lambda: records.dataclass(frozen=True)(child(ours_mutable)))[0] is TypeError
    assert error_of(lambda: dataclasses.dataclass(frozen=True)(child(real_mutable)))[0] is TypeError
    assert records.dataclass(child(ours_mutable))("n", "a").action == "a"


def test_a_class_keeps_the_methods_it_defines():
    def body():
        class Named:
            """Named."""

            name: str
            size: int = 0

            def __repr__(self):
                return f"Named<{self.name}>"

            def __eq__(self, other):
                return isinstance(other, type(self)) and self.name == other.name

        return Named

    real, ours = both(body, frozen=True)
    assert repr(ours("a")) == "Named<a>"
    assert ours("a", 1) == ours("a", 2)
    # An __eq__ of its own leaves __hash__ None: dataclasses then adds one from the fields.
    assert hash(ours("a", 1)) == hash(real("a", 1))

    def explicit_hash():
        class Hashed:
            """Hashed."""

            name: str

            def __hash__(self):
                return 42

        return Hashed

    assert hash(records.dataclass(frozen=True)(explicit_hash())("x")) == 42

    def own_setattr():
        class Guarded:
            """Guarded."""

            name: str

            def __setattr__(self, name, value):
                raise AttributeError(name)

        return Guarded

    assert error_of(lambda: records.dataclass(frozen=True)(own_setattr())) == error_of(
        lambda: dataclasses.dataclass(frozen=True)(own_setattr())
    )


def test_post_init_runs_after_every_field_is_set():
    seen = []

    def body():
        class Checked:
            """Checked."""

            name: str
            items: list = field(default_factory=list)
            count: int = field(default=3, init=False)

            def __post_init__(self):
                seen.append((self.name, self.items, self.count))

        return Checked

    ours = records.dataclass(frozen=True)(body())
    ours("a")
    assert seen == [("a", [], 3)]


def test_kw_only_generic_undocumented_and_recursive_classes():
    def generic():
        class Box(Generic[T]):
            value: T
            label: str = "box"

        return Box

    real, ours = both(generic, frozen=True, kw_only=True)
    assert params_of(ours) == params_of(real)
    assert ours[int] is not None  # still subscriptable
    assert ours.__doc__ == real.__doc__  # made from the signature, as dataclasses does
    assert ours.__doc__.startswith("Box(") and "label: 'str' = 'box'" in ours.__doc__
    assert error_of(lambda: ours(1)) == error_of(lambda: real(1))

    def node():
        class Node:
            """A node."""

            children: list = field(default_factory=list)

        return Node

    real, ours = both(node)
    loop_real, loop_ours = real(), ours()
    loop_real.children.append(loop_real)
    loop_ours.children.append(loop_ours)
    assert repr(loop_ours) == repr(loop_real)
    assert repr(loop_ours).endswith("Node(children=[...])")

    def bad_order():
        class Bad:
            """Bad."""

            a: int = 1
            b: int

        return Bad

    assert error_of(lambda: records.dataclass(bad_order()))[0] is TypeError
    assert error_of(lambda: dataclasses.dataclass(bad_order()))[0] is TypeError


# -- the executor's own classes ---------------------------------------------------------------


def _executor_classes() -> list[type]:
    for module in records.GENERATED_MODULES:
        importlib.import_module(module)
    return [cls for cls in records.made if cls.__module__.split(".")[0] == "executor"]


def test_every_module_using_the_cheap_dataclass_is_listed_for_the_generator():
    import pathlib

    root = pathlib.Path(records.__file__).parent
    using = set()
    for path in root.rglob("*.py"):
        text = path.read_text()
        if "\n@dataclass" in text and "from executor.records import" in text:
            module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
            using.add(module.removesuffix(".__init__"))
    assert using == set(records.GENERATED_MODULES)


def test_the_generated_methods_file_is_current():
    with open(records.generated_module_path()) as handle:
        on_disk = handle.read()
    assert on_disk == records.generated_module_text(), (
        "executor/_record_methods.py is stale: run `python -m executor.generate_records`"
    )


def test_no_executor_class_compiles_its_methods_at_import():
    classes = _executor_classes()
    assert len(classes) >= 27
    assert [name for name in records.compiled_at_import if name.startswith("executor.")] == []


def _twin(cls: type) -> type:
    """`cls`'s fields in a class made by `dataclasses.dataclass` with the same options."""
    specs = []
    for f in dataclasses.fields(cls):
        options = {"init": f.init, "repr": f.repr, "compare": f.compare, "hash": f.hash, "kw_only": f.kw_only}
        if f.default is not dataclasses.MISSING:
            options["default"] = f.default
        if f.default_factory is not dataclasses.MISSING:
            options["default_factory"] = f.default_factory
        specs.append((f.name, f.type, dataclasses.field(**options)))
    params = cls.__dataclass_params__
    twin = dataclasses.make_dataclass(cls.__name__, specs, frozen=params.frozen, eq=params.eq)
    twin.__qualname__ = cls.__qualname__
    return twin


@pytest.mark.parametrize("cls", _executor_classes(), ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_each_executor_class_matches_its_dataclasses_twin(cls):
    twin = _twin(cls)
    assert params_of(cls) == params_of(twin)
    assert dataclasses.is_dataclass(cls)
    own = {name for name in ("__repr__", "__eq__", "__hash__") if name in vars(cls)}
    if hasattr(cls, "__post_init__"):
        return  # (it checks its values: ExecutorStep, LeaseConfig, the ResourceConfigs)
    args = [
        f"<{f.name}>"
        for f in dataclasses.fields(cls)
        if f.init
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and not f.kw_only
    ]
    kwargs = {f.name: f"<{f.name}>" for f in dataclasses.fields(cls) if f.init and f.kw_only}
    ours, theirs = cls(*args, **kwargs), twin(*args, **kwargs)
    if "__repr__" not in own:
        assert repr(ours) == repr(theirs)
    if cls.__dataclass_params__.eq and cls.__dataclass_params__.frozen:
        assert error_of(lambda: hash(ours)) == error_of(lambda: hash(theirs))
        assert error_of(lambda: hash(ours)) is not None or hash(ours) == hash(theirs)
        assert ours == cls(*args, **kwargs)
    if cls.__dataclass_params__.frozen:
        name = dataclasses.fields(cls)[0].name if dataclasses.fields(cls) else "anything"
        assert error_of(lambda: setattr(ours, name, 1)) == error_of(lambda: setattr(theirs, name, 1))


def test_records_pickle_and_copy_like_dataclasses():
    from executor.tree import Status, StatusEvent

    event = StatusEvent(date="2026-11-24T00:00:00Z", status=Status.SUCCESS, message="m", extra={"k": 1})
    assert pickle.loads(pickle.dumps(event)) == event
    assert copy.deepcopy(event) == event
    assert hash(event.__class__.__init__) is not None
