"""Config templates: the declared config as typed JSON, rebuilt into equal objects and equal versions."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import pytest

from executor import ExecutorStep, InputName, this_output_path, versioned
from executor.graph import resolve
from executor.template import TemplateError, decode_template, encode_template, import_qualified


class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


@dataclass(frozen=True)
class Inner:
    width: int = 3
    tags: tuple[str, ...] = ("a", "b")


@dataclass(frozen=True)
class Outer:
    input_path: object
    output_path: object
    side_input: object = None
    raw_path: object = None
    mode: Mode = Mode.FAST
    inner: Inner = field(default_factory=Inner)
    weights: dict = field(default_factory=dict)
    labels: frozenset = frozenset()
    blob: bytes = b""
    where: PurePosixPath = PurePosixPath("a/b")
    lr: object = 0.1


def noop(config) -> None:
    pass


def build() -> tuple[ExecutorStep, ExecutorStep, ExecutorStep]:
    upstream = ExecutorStep(name="up/one", fn=noop, config=Inner(width=versioned(7)))
    other = ExecutorStep(name="up/two", fn=noop, config=Inner())
    config = Outer(
        input_path=upstream / "data",
        output_path=this_output_path("out"),
        side_input=InputName(other, None).nonblocking(),
        raw_path=InputName.hardcoded("raw/fixed.txt"),
        mode=versioned(Mode.SLOW),
        inner=Inner(width=versioned(5), tags=("x",)),
        weights={1: 0.5, "b": [1, 2]},
        labels=frozenset({"z", "y"}),
        blob=b"\x00\x01",
        lr=versioned(0.25),
    )
    return upstream, other, ExecutorStep(name="main/step", fn=noop, config=config)


def test_round_trip_rebuilds_the_declaration_and_its_version():
    upstream, other, step = build()
    graph = resolve([step], "/prefix/a")
    record = json.loads(json.dumps(encode_template(step.config, lambda s: graph.resolved(s).output_path)))
    assert record["__dataclass__"] == f"{__name__}:Outer"
    rebuilt_up = {graph.resolved(upstream).output_path: upstream, graph.resolved(other).output_path: other}
    config = decode_template(record, lambda path: rebuilt_up[path])
    assert config == step.config
    again = resolve([ExecutorStep(name="main/step", fn=noop, config=config)], "/prefix/b")
    assert again.steps[-1].version_hash == graph.resolved(step).version_hash
    assert again.steps[-1].config.side_input == again.resolved(other).output_path
    assert again.resolved(other).output_path.startswith("/prefix/b/up/two-")
    assert again.steps[-1].config.raw_path == "/prefix/b/raw/fixed.txt"


def test_unknown_types_are_refused_with_the_field():
    record = {
        "__dataclass__": f"{__name__}:Outer",
        "fields": {"input_path": {"__opaque__": "socket.socket", "repr": "<s>"}},
    }
    with pytest.raises(TemplateError, match="'input_path'.*socket.socket"):
        decode_template(record, lambda path: None)
    with pytest.raises(TemplateError, match="no_such_module"):
        import_qualified("no_such_module.sub:thing", "fn")
    with pytest.raises(TemplateError, match="has no attribute 'Missing'"):
        import_qualified(f"{__name__}:Missing")
    with pytest.raises(TemplateError, match="no longer accepts"):
        decode_template({"__dataclass__": f"{__name__}:Inner", "fields": {"depth": 1}}, lambda path: None)


def test_dunder_keys_in_plain_dicts_do_not_collide_with_tags():
    value = {"__dataclass__": "not a tag", "x": 1}
    record = encode_template(value, lambda s: "")
    assert decode_template(json.loads(json.dumps(record)), lambda path: None) == value
