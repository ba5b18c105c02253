"""A step's concrete config is built only when read; its digest is the same either way.

`resolve` digests the concrete config of most steps from the declared one, without building it
(`executor.walker.encode_mapped`), and builds the config itself only when something reads it:
the runner, `Executor.configs`, `.executor_info`, a diff of unversioned fields. A cached re-run
reads none. Every digest must equal the one of the built config -- the one earlier runs recorded
in their SUCCESS lines -- so each config here is resolved both ways and the digests compared.
Where rebuilding a dataclass could change it (a `__post_init__`, an `init=False` field, an
`__init__` or `__new__` of its own, a namedtuple or list subclass around a marker), the config
is built at once, as before.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections import namedtuple
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import pytest

import executor.graph
import executor.walker
from executor import Executor, ExecutorStep, InputName, mirrored, output_path_of, this_output_path, versioned
from executor.fingerprint import canonical_json, encode, sha256_hex
from executor.graph import StepDefinitionError, resolve
from tests.executor.steps_for_tests import WriteConfig, write_value


class Color(enum.Enum):
    RED = "r"


class Size(enum.IntEnum):
    SMALL = 1


@dataclass(frozen=True)
class Inner:
    path: str
    weight: float = 0.5
    names: tuple = ()


@dataclass
class Outer:
    output_path: str
    inner: Inner
    inputs: list
    by_name: dict
    extra: object = None


@dataclass(frozen=True)
class WithPostInit:
    output_path: str
    normalized: str = ""

    def __post_init__(self):
        if isinstance(self.output_path, str):  # (the declared one holds a placeholder)
            object.__setattr__(self, "normalized", self.output_path.upper())


@dataclass(frozen=True)
class AroundPlain:
    """A `__post_init__` reading a field of a plain dataclass that holds the marker."""

    inner: Inner
    after: Inner = Inner("plain")
    """A dataclass without markers after the one with: the marker is not forgotten."""
    seen: str = ""

    def __post_init__(self):
        if isinstance(self.inner.path, str):
            object.__setattr__(self, "seen", self.inner.path[-8:])


@dataclass(frozen=True)
class AroundList:
    """A `__post_init__` reading a list whose items are placeholders."""

    paths: list
    first: str = ""

    def __post_init__(self):
        if isinstance(self.paths[0], str):
            object.__setattr__(self, "first", self.paths[0][-8:])


def nested(levels: int, bottom: object) -> object:
    """`bottom` inside `levels` containers, lists and dicts in turn."""
    for level in range(levels):
        bottom = [bottom] if level % 2 else {"k": bottom}
    return bottom


@dataclass(frozen=True)
class WithDerivedField:
    output_path: str
    derived: str = field(default="unset", init=False)


@dataclass(frozen=True)
class WithOwnInit:
    output_path: str
    suffix: str

    def __init__(self, output_path: str, suffix: str = "-own"):
        concrete = isinstance(output_path, str)  # (the declared one holds a placeholder)
        object.__setattr__(self, "output_path", output_path + suffix if concrete else output_path)
        object.__setattr__(self, "suffix", suffix)


@dataclass(frozen=True)
class WithOwnNew:
    output_path: str

    def __new__(cls, *args, **kwargs):
        return super().__new__(cls)


@dataclass(frozen=True)
class Tag(str):
    """A dataclass that is also a string: encoded as the string."""

    note: str = "n"


class Suffixing(type):
    """A metaclass whose instances are changed after their `__init__`."""

    def __call__(cls, *args, **kwargs):
        made = super().__call__(*args, **kwargs)
        if isinstance(made.output_path, str):
            object.__setattr__(made, "output_path", made.output_path + "-meta")
        return made


@dataclass(frozen=True)
class WithMetaclass(metaclass=Suffixing):
    output_path: str


Pair = namedtuple("Pair", ["left", "right"])


class PathList(list):
    pass


def upstream(name: str = "up") -> ExecutorStep:
    return ExecutorStep(name=name, fn=write_value, config=WriteConfig(this_output_path(), versioned(1)))


def configs() -> dict[str, object]:
    up, other = upstream(), upstream("other")
    return {
        "nested dataclasses, lists and dicts": Outer(
            output_path=this_output_path(),
            inner=Inner(path=output_path_of(up, "part"), names=("ä", versioned("ü"))),
            inputs=[output_path_of(up), [output_path_of(other)], (this_output_path("sub"),)],
            by_name={"a": output_path_of(other), 1: "one", Color.RED: versioned(2), Size.SMALL: None},
            extra={"deep": [{"deeper": this_output_path()}]},
        ),
        "versioned values of every kind": Outer(
            output_path=this_output_path(),
            inner=versioned(Inner(path="/abs", weight=2.5)),
            inputs=versioned([1.5, "x", None, True]),
            by_name={"path": versioned(PurePosixPath("/a/b")), "bytes": b"\x00\xff", "set": {3, 1, 2}},
            extra=versioned({"color": Color.RED, "size": Size.SMALL}),
        ),
        "unversioned values of every kind": Outer(
            output_path=this_output_path(),
            inner=Inner(path=output_path_of(up), weight=float("nan"), names=(float("-inf"),)),
            inputs=[frozenset({"a", "b"}), Color.RED, PurePosixPath("rel/p"), len],
            by_name={},
            extra=mirrored(versioned("raw/data"), budget_gb=1),
        ),
        "a nonblocking input and a hard-coded path": Outer(
            output_path=this_output_path(),
            inner=Inner(path=other.nonblocking()),
            inputs=[InputName(None, "gs://bucket/data"), InputName(None, "relative/data")],
            by_name={},
        ),
        "a __post_init__": WithPostInit(output_path=this_output_path()),
        "a __post_init__ around a dataclass holding a marker": Outer(
            output_path=this_output_path(),
            inner=Inner("x"),
            inputs=[AroundPlain(Inner(output_path_of(up)))],
            by_name={},
        ),
        "a __post_init__ around a list of markers": Outer(
            output_path=this_output_path(),
            inner=Inner("x"),
            inputs=[AroundList([output_path_of(up)]), AroundList([{"in": output_path_of(other)}])],
            by_name={},
        ),
        "containers 90 deep, a set and a marker at the bottom": Outer(
            output_path=this_output_path(),
            inner=Inner("x"),
            inputs=[nested(90, frozenset({"a"})), nested(90, output_path_of(up))],
            by_name={("tuple", "key"): "recorded by its repr", None: "null"},
        ),
        "an init=False field": WithDerivedField(output_path=this_output_path()),
        "an init=False field, no marker inside": Outer(
            output_path=this_output_path(), inner=Inner("x"), inputs=[WithDerivedField("/fixed")], by_name={}
        ),
        "an __init__ of its own": WithOwnInit(output_path=this_output_path()),
        "a __new__ of its own": WithOwnNew(output_path=this_output_path()),
        "a metaclass of its own": WithMetaclass(output_path=this_output_path()),
        "a namedtuple around a marker": Outer(
            output_path=this_output_path(), inner=Inner("x"), inputs=[Pair(output_path_of(up), 2)], by_name={}
        ),
        "a list subclass around a marker": Outer(
            output_path=this_output_path(),
            inner=Inner("x"),
            inputs=PathList([output_path_of(up)]),
            by_name={},
        ),
        "a namedtuple without markers": Outer(
            output_path=this_output_path(), inner=Inner("x"), inputs=[Pair(len, 2), PathList([3])], by_name={}
        ),
        "a dataclass that is also a string": Outer(
            output_path=this_output_path(), inner=Inner("x"), inputs=[Tag("tagged")], by_name={}
        ),
        # (A marker in a set is refused at declaration: tests/executor/test_declaration_mistakes.py.)
    }


@pytest.fixture(autouse=True)
def walked_afresh(monkeypatch):
    """Each test works out afresh which classes are rebuilt as they are: the verdicts are kept
    per class for the process, so without this only the first test to meet a class would
    exercise the check (and a mutation test run, whose tests share a process, none)."""
    monkeypatch.setattr(executor.walker, "_DATACLASS_WALKS", {})


BUILT_AT_ONCE = {
    "a __post_init__",
    "a __post_init__ around a list of markers",
    "a __post_init__ around a dataclass holding a marker",
    "an init=False field",
    "an __init__ of its own",
    "a __new__ of its own",
    "a metaclass of its own",
    "a namedtuple around a marker",
    "a list subclass around a marker",
}
"""Configs whose rebuilt dataclass (or container) could differ from the declared one."""


def resolve_config(config: object, tmp_path, monkeypatch=None):
    step = ExecutorStep(name="step", fn=write_value, config=config)
    if monkeypatch is not None:  # every config built at once, as before `encode_mapped`
        monkeypatch.setattr(
            executor.graph, "encode_mapped", lambda config, on_marker: executor.walker.UNBUILT
        )
    graph = resolve([step], str(tmp_path))
    return graph.resolved(step)


@pytest.mark.parametrize("name", list(configs()))
def test_the_digest_is_the_built_configs_whether_or_not_it_was_built(name, tmp_path, monkeypatch):
    config = configs()[name]
    lazy = resolve_config(config, tmp_path)
    built_later = "_builder" in vars(lazy)
    assert built_later is (name not in BUILT_AT_ONCE)
    digest = lazy.config_digest
    # The built config's digest, as `ResolvedStep` computed it before, and as a later read has it:
    assert digest == sha256_hex(canonical_json(encode(lazy.config, strict=False)))
    assert "_builder" not in vars(lazy)
    with monkeypatch.context() as patch:
        eager = resolve_config(config, tmp_path, patch)
        assert "_builder" not in vars(eager) and "config_digest" not in vars(eager)
        assert eager.config_digest == digest
    assert repr(eager.config) == repr(lazy.config)
    assert type(eager.config) is type(lazy.config)


def test_a_post_init_sees_the_concrete_values_and_its_changes_are_digested(tmp_path):
    resolved = resolve_config(WithPostInit(output_path=this_output_path()), tmp_path)
    assert resolved.config.normalized == resolved.output_path.upper()
    assert encode(resolved.config, strict=False)["normalized"] == resolved.output_path.upper()


def test_an_own_init_is_called_with_the_concrete_values(tmp_path):
    resolved = resolve_config(WithOwnInit(output_path=this_output_path()), tmp_path)
    assert resolved.config.output_path == resolved.output_path + "-own"


def test_a_placeholder_in_an_init_false_field_is_still_refused_by_resolve(tmp_path):
    declared = WithDerivedField("/fixed")
    object.__setattr__(declared, "derived", this_output_path())
    with pytest.raises(StepDefinitionError, match="init=False"):
        resolve_config(Outer(this_output_path(), Inner("x"), [declared], {}), tmp_path)


def test_a_failing_post_init_still_fails_in_resolve(tmp_path):
    @dataclass(frozen=True)
    class Checked:
        output_path: str

        def __post_init__(self):
            if isinstance(self.output_path, str) and not self.output_path.startswith("/"):
                raise ValueError(f"output_path must be absolute, got {self.output_path!r}")

    with pytest.raises(ValueError, match="must be absolute"):
        resolve_config(Checked(output_path=output_path_of(upstream())), "relative")


def test_a_cached_rerun_builds_no_concrete_config_and_executor_configs_builds_on_read(tmp_path, monkeypatch):
    up = upstream()
    down = ExecutorStep(name="down", fn=write_value, config=WriteConfig(this_output_path(), inputs=[up]))
    Executor(str(tmp_path), console=False).run([down])
    built = []
    original = executor.graph._concrete_config
    monkeypatch.setattr(
        executor.graph,
        "_concrete_config",
        lambda step, builder: built.append(step.name) or original(step, builder),
    )
    run = Executor(str(tmp_path), console=False)
    plan = run.run([down])
    assert [row.action.value for row in plan.rows] == ["skip", "skip"]
    assert built == []
    assert list(run.configs) == [up, down] and len(run.configs) == 2 and down in run.configs
    assert run.configs[down].inputs == [run.output_paths[up]]
    assert run.configs[down] is run.configs[down] and built == ["down"]
    assert dict(run.configs)[up].output_path == run.output_paths[up] and built == ["down", "up"]
    other = ExecutorStep(name="down", fn=write_value, config=WriteConfig(this_output_path()))
    for missing in (other, id(down), "down"):
        with pytest.raises(KeyError):
            run.configs[missing]
    assert run.configs.get(other) is None


def test_a_step_that_runs_gets_its_config_built(tmp_path):
    up = upstream()
    down = ExecutorStep(name="down", fn=write_value, config=WriteConfig(this_output_path(), inputs=[up]))
    run = Executor(str(tmp_path), console=False)
    run.run([down])
    assert (tmp_path / run.output_paths[down].rsplit("/", 1)[1] / "value.json").read_text() == "[0, [1]]"
    assert all("_builder" not in vars(step) for step in run.graph.steps)


def test_threads_reading_a_lazy_config_at_once_all_get_the_one_that_is_kept(tmp_path):
    for _ in range(20):
        resolved = resolve_config(
            WriteConfig(this_output_path(), inputs=[output_path_of(upstream())]), tmp_path
        )
        seen, start = [], threading.Barrier(4)

        def read(resolved=resolved, seen=seen, start=start):
            start.wait()
            seen.append(resolved.config)

        threads = [threading.Thread(target=read) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(config == seen[0] for config in seen)
        assert all(resolved.config is resolved.config for _ in range(2))
        assert dataclasses.asdict(resolved.config)["inputs"] == list(resolved.blocking_deps)


def test_a_dict_whose_keys_collide_when_encoded_is_refused_naming_its_field(tmp_path, monkeypatch):
    """Keys 1 and "1" both encode as "1": the digest cannot tell them apart, so the config is
    refused in `resolve`, naming the field, whether or not the config is built there."""
    for by_name, field_path in [
        ({1: "a", "1": "b"}, "by_name"),
        ({"outer": [{"x": {True: 1, "true": 2}}]}, "by_name.outer[0].x"),
        ({"nested": Outer("/o", Inner("i"), [], {None: 1, "null": 2})}, "by_name.nested.by_name"),
        ({"pair": Pair({1.0: "a", "1.0": "b"}, 0)}, "by_name.pair[0]"),
    ]:
        config = Outer(output_path=this_output_path(), inner=Inner("x"), inputs=[], by_name=by_name)
        messages = []
        with monkeypatch.context() as patch:
            for patched in (None, patch):
                with pytest.raises(StepDefinitionError) as caught:
                    _ = resolve_config(config, tmp_path, patched).config_digest
                messages.append(str(caught.value))
        assert messages[0] == messages[1]
        assert messages[0].startswith(f"step 'step': config field '{field_path}': dict keys collide"), (
            messages
        )


def test_a_placeholder_in_an_init_false_field_of_the_config_itself_names_the_field(tmp_path):
    declared = WithDerivedField("/fixed")
    object.__setattr__(declared, "derived", this_output_path())
    with pytest.raises(StepDefinitionError) as caught:
        resolve_config(declared, tmp_path)
    assert "config field 'derived' has init=False" in str(caught.value), str(caught.value)


def test_a_dataclass_without_an_init_of_its_own_fails_as_it_did(tmp_path, monkeypatch):
    """`@dataclass(init=False)` with no `__init__`: rebuilding it cannot pass its fields."""

    @dataclass(init=False)
    class NoInit:
        output_path: str

    declared = NoInit()
    declared.output_path = this_output_path()
    for patch in (None, monkeypatch):
        with pytest.raises(TypeError):
            _ = resolve_config(declared, tmp_path, patch).config


def test_a_dataclass_that_is_also_a_string_cannot_hold_a_placeholder(tmp_path, monkeypatch):
    """Rebuilding it calls `str.__new__` with its fields: a TypeError in `resolve`, both ways."""
    declared = Tag("tagged")
    object.__setattr__(declared, "note", this_output_path())
    config = Outer(output_path="/o", inner=Inner("x"), inputs=[declared], by_name={})
    for patch in (None, monkeypatch):
        with pytest.raises(TypeError):
            resolve_config(config, tmp_path, patch)
