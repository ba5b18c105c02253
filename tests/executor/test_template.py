"""Config templates: the declared config as typed JSON, rebuilt into equal objects and equal versions."""

from __future__ import annotations

import enum
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import pytest

from executor import ExecutorStep, InputName, this_output_path, versioned
from executor.graph import resolve
from executor.template import TemplateError, TrustedCode, decode_template, encode_template


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
        TrustedCode().resolve("no_such_module.sub:thing", "fn")
    with pytest.raises(TemplateError, match="has no attribute 'Missing'"):
        TrustedCode().resolve(f"{__name__}:Missing")
    with pytest.raises(TemplateError, match="no longer accepts"):
        decode_template({"__dataclass__": f"{__name__}:Inner", "fields": {"depth": 1}}, lambda path: None)


def test_dunder_keys_in_plain_dicts_do_not_collide_with_tags():
    value = {"__dataclass__": "not a tag", "x": 1}
    record = encode_template(value, lambda s: "")
    assert decode_template(json.loads(json.dumps(record)), lambda path: None) == value


# -- decoding untrusted records ------------------------------------------------------------
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class WithFunction:
    transform: object = None


def test_functions_in_configs_are_refused_by_default_and_allowed_from_the_checkout():
    record = {
        "__dataclass__": f"{__name__}:WithFunction",
        "fields": {"transform": {"__callable__": f"{__name__}:noop"}},
    }
    with pytest.raises(
        TemplateError,
        match=r"field 'transform': .*:noop is defined in .*test_template.py, outside trusted code",
    ):
        decode_template(record, lambda path: None)
    policy = TrustedCode(checkout=REPO)
    assert decode_template(record, lambda path: None, policy=policy) == WithFunction(noop)
    assert policy.approved == [("transform", f"{__name__}:noop", os.path.realpath(__file__))]


def test_installed_code_gives_types_but_never_functions():
    policy = TrustedCode(checkout=REPO, installed=[os.path.dirname(os.__file__)])
    assert decode_template(
        {"__path__": "pathlib:PurePosixPath", "value": "a"}, lambda p: None, policy=policy
    ) == (PurePosixPath("a"))
    with pytest.raises(TemplateError, match=r"json:dumps is defined in .*json.*, outside"):
        policy.function("json:dumps", "fn_name")


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (
            {"__path__": "os:system", "value": "true"},
            "os:system is a builtin function, not a pathlib path type",
        ),
        (
            {"__dataclass__": "builtins:eval", "fields": {}},
            "builtins:eval is a builtin function, not a dataclass",
        ),
        ({"__dataclass__": f"{__name__}:noop", "fields": {}}, "is a function .*, not a dataclass"),
        ({"__enum__": f"{__name__}:Inner", "name": "x"}, "the dataclass .*Inner, not an Enum"),
        ({"__callable__": "os:system"}, "os:system is a builtin function"),
        ({"__callable__": "os.path:join"}, "is defined in .*posixpath.py, outside"),
        ({"__dataclass__": "os:system:x", "fields": {}}, "is not a `module:qualname` name"),
        ({"__enum__": f"{__name__}:Mode", "name": "MISSING"}, "has no member 'MISSING'"),
    ],
)
def test_names_of_the_wrong_kind_are_refused_before_anything_is_called(record, why):
    with pytest.raises(TemplateError, match=why):
        decode_template(record, lambda path: None, policy=TrustedCode(checkout=REPO))


def test_modules_are_imported_only_from_allowed_places(tmp_path, monkeypatch):
    (tmp_path / "planted_module.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TemplateError, match="module 'planted_module' would be imported from"):
        TrustedCode(checkout=REPO).resolve("planted_module:Thing", "x")
    assert not (tmp_path / "ran").exists()
    with pytest.raises(TemplateError, match="would be imported from"):  # excluded wins over the checkout
        TrustedCode(checkout=str(tmp_path), excluded=[str(tmp_path)]).resolve("planted_module:Thing")
    assert not (tmp_path / "ran").exists()


def test_a_bytes_field_of_the_wrong_type_is_named_once():
    with pytest.raises(TemplateError) as refused:
        decode_template({"__bytes__": 7}, lambda path: None)
    assert "is not hex" not in str(refused.value) and "'__bytes__'" in str(refused.value)
    with pytest.raises(TemplateError, match="'__bytes__' is not hex"):
        decode_template({"__bytes__": "zz"}, lambda path: None)


@pytest.mark.parametrize("module", ["venv.__main__", "unittest.__main__", "json.tool.__main__"])
def test_a_programs_main_module_is_never_imported(module):
    """Importing `venv.__main__` runs venv's command line (on marin's own arguments)."""
    with pytest.raises(TemplateError, match="a program's __main__ module: refused"):
        TrustedCode(checkout=REPO, installed=[os.path.dirname(os.__file__)]).resolve(f"{module}:X", "x")
    assert module not in sys.modules


def test_installed_modules_come_only_from_packages_already_loaded():
    """Installed code runs when imported: a name from a tree reaches it only inside a top-level
    package that the code being reproduced has imported already."""
    policy = TrustedCode(checkout=REPO, installed=[os.path.dirname(os.__file__)])
    assert "antigravity" not in sys.modules
    with pytest.raises(TemplateError, match="installed code that nothing loaded so far imports"):
        policy.resolve("antigravity:X", "x")
    assert "antigravity" not in sys.modules
    assert policy.resolve("json.decoder:JSONDecoder", "x") is json.decoder.JSONDecoder  # json is loaded
