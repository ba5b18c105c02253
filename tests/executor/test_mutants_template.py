"""Config templates (`executor.template`), pinned where mutation testing found no test: upstream
steps nested in dicts and sets, the order of a set's items, dunder-looking dict keys, callables
without a qualified name, the field named in each refusal when decoding nested records, and the
trusted-code policy's import checks and messages.
"""

from __future__ import annotations

import functools
import os
import sys
import types
from dataclasses import dataclass

import pytest

from executor import ExecutorStep, InputName, this_output_path
from executor.template import TemplateError, TrustedCode, decode_template, encode_template


@dataclass(frozen=True)
class Config:
    output_path: object = None


def upstream_step(name: str = "up") -> ExecutorStep:
    return ExecutorStep(name=name, fn=lambda config: None, config=Config(output_path=this_output_path()))


def paths(step: ExecutorStep) -> str:
    return f"/out/{step.name}"


# -- encoding --------------------------------------------------------------------------------------


def test_steps_inside_dicts_are_named_by_their_output_path():
    step = upstream_step()
    assert encode_template({"a": step}, paths) == {
        "a": {"__input__": "/out/up", "name": None, "nonblocking": False}
    }
    assert encode_template({"__a__": step}, paths) == {
        "__dict__": [["__a__", {"__input__": "/out/up", "name": None, "nonblocking": False}]]
    }
    assert encode_template({1: InputName(step, "x")}, paths) == {
        "__dict__": [[1, {"__input__": "/out/up", "name": "x", "nonblocking": False}]]
    }
    assert encode_template({InputName(step, "k"): 2}, paths) == {
        "__dict__": [[{"__input__": "/out/up", "name": "k", "nonblocking": False}, 2]]
    }


def test_steps_inside_sets_are_named_by_their_output_path():
    step = upstream_step()
    assert encode_template(frozenset({InputName(step, "a")}), paths) == {
        "__set__": [{"__input__": "/out/up", "name": "a", "nonblocking": False}],
        "frozen": True,
    }


def test_set_items_are_ordered_by_their_canonical_json():
    # '"a"' < '"b"' < '1' as JSON text (mixed types have no order of their own)
    assert encode_template({"b", 1, "a"}, paths) == {"__set__": ["a", "b", 1], "frozen": False}
    assert encode_template({(2,), (1, 5)}, paths)["__set__"] == [{"__tuple__": [1, 5]}, {"__tuple__": [2]}]


@pytest.mark.parametrize("key", ["__a", "a__", "_a_", "a"])
def test_only_dunder_keys_make_a_dict_a_pair_list(key):
    assert encode_template({key: 1}, paths) == {key: 1}


def test_a_callable_without_a_qualified_name_is_opaque():
    partial = functools.partial(print, "x")
    encoded = encode_template(partial, paths)
    assert encoded["__opaque__"] == "functools.partial"
    assert encoded["repr"].startswith("functools.partial(")
    assert encode_template(print, paths) == {"__callable__": "builtins:print"}


# -- decoding: the field each refusal names ----------------------------------------------------------


def no_input(path: str):
    raise AssertionError(f"no input expected, got {path}")


def _refusal(record, path: str = "", policy=None) -> str:
    with pytest.raises(TemplateError) as caught:
        decode_template(record, no_input, path, policy)
    return str(caught.value)


def test_refusals_name_the_nested_field():
    dataclass_name = f"{__name__}:Config"
    nested = {"__dataclass__": dataclass_name, "fields": {"output_path": {"__input__": 3}}}
    assert _refusal(nested, "cfg") == (
        "field 'cfg.output_path': '__input__' is int, not what the template format has"
    )
    assert _refusal({"__dataclass__": dataclass_name, "fields": 3}, "cfg").startswith(
        "field 'cfg': 'fields' is int"
    )
    assert _refusal({"a": {"__output__": 3}}).startswith("field 'a': '__output__' is int")
    assert _refusal({"a": {"__versioned__": {"__output__": 3}}}).startswith("field 'a': '__output__' is int")
    assert _refusal({"a": {"__mirrored__": {"__output__": 3}}}).startswith("field 'a': '__output__' is int")
    budget = _refusal({"a": {"__mirrored__": "raw/x", "budget_gb": "big"}})
    assert budget == "field 'a': 'budget_gb' is str, not what the template format has"  # named once
    assert _refusal({"a": {"__set__": [{"__output__": 3}]}}).startswith("field 'a': '__output__' is int")
    assert _refusal({"a": {"__dict__": [["k", {"__output__": 3}]]}}).startswith(
        "field 'a.k': '__output__' is int"
    )
    assert _refusal({"a": {"__dict__": [[{"__tuple__": [1]}, {"__output__": 3}]]}}).startswith(
        "field 'a.(1,)': '__output__' is int"
    )
    assert _refusal({"__dict__": [[[1], 2]]}, "d").startswith(
        "field 'd': a recorded dict key is unhashable ("
    )


@pytest.mark.parametrize("recorded", ["../outside", "raw/../../x", "raw//x"])
def test_a_recorded_hardcoded_path_out_of_the_prefix_is_refused_naming_the_field(recorded):
    """A hand-edited tree's `__hardcoded__` path leading out of the prefix: `InputName.hardcoded`
    refuses it (StepDefinitionError), which reproduce showed as a traceback; before that check
    it was silently read outside the prefix."""
    message = _refusal({"a": {"__hardcoded__": recorded}}, "cfg")
    assert message.startswith("field 'cfg.a': "), message
    assert decode_template({"a": {"__hardcoded__": "raw/x"}}, no_input)["a"].name == "raw/x"


def test_a_record_nested_too_deeply_names_where_decoding_started():
    record: object = 1
    for _ in range(5000):
        record = {"__versioned__": record}
    assert _refusal(record, "root") == "field 'root': the recorded config is nested too deeply: refused"


# -- the trusted-code policy ---------------------------------------------------------------------------


def test_a_submodule_of_an_imported_package_is_imported_after_its_check(monkeypatch):
    import json

    monkeypatch.delitem(sys.modules, "json.tool", raising=False)
    policy = TrustedCode(installed=[os.path.dirname(os.path.dirname(json.__file__))])
    module = policy.module("json.tool")
    assert module is sys.modules["json.tool"] and module.__name__ == "json.tool"


def test_a_name_below_a_plain_module_cannot_be_imported():
    with pytest.raises(TemplateError) as caught:
        TrustedCode().module("os.path.nothing")
    assert str(caught.value).startswith("cannot import module 'os.path.nothing': ModuleNotFoundError: ")


def test_a_module_that_fails_to_import_says_why(tmp_path, monkeypatch):
    package = tmp_path / "mut_tpl_broken_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mut_tpl_broken_pkg", raising=False)
    with pytest.raises(TemplateError) as caught:
        TrustedCode(checkout=str(tmp_path)).module("mut_tpl_broken_pkg")
    assert (
        str(caught.value) == "cannot import module 'mut_tpl_broken_pkg': ZeroDivisionError: division by zero"
    )


def test_a_package_outside_the_trusted_code_is_refused_naming_its_init_file(tmp_path, monkeypatch):
    package = tmp_path / "mut_tpl_outside_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mut_tpl_outside_pkg", raising=False)
    with pytest.raises(TemplateError) as caught:
        TrustedCode().module("mut_tpl_outside_pkg")
    assert str(caught.value) == (
        f"module 'mut_tpl_outside_pkg' would be imported from {package / '__init__.py'}, which is neither "
        "trusted code (none is configured) nor installed code: refused"
    )
    assert "mut_tpl_outside_pkg" not in sys.modules


def outer():
    def inner():
        return None

    return inner


def test_a_function_defined_inside_a_function_is_named_so():
    with pytest.raises(TemplateError) as caught:
        TrustedCode().resolve(f"{__name__}:outer.<locals>.inner", "f")
    assert (
        str(caught.value)
        == f"field 'f': {__name__}:outer.<locals>.inner is not importable (defined inside a function)"
    )


@pytest.mark.parametrize("method", ["dataclass_type", "enum_type", "path_type"])
def test_type_lookups_name_the_field_when_the_name_does_not_resolve(method):
    with pytest.raises(TemplateError) as caught:
        getattr(TrustedCode(), method)("json:no_such_thing", "a.b")
    assert str(caught.value).startswith("field 'a.b': json:no_such_thing is not importable")


def test_a_function_whose_module_is_not_loaded_is_refused(monkeypatch):
    ghost = types.ModuleType("mut_tpl_ghost_holder")

    def fn(config):
        return config

    fn.__module__ = "mut_tpl_module_not_loaded"
    ghost.fn = fn
    monkeypatch.setitem(sys.modules, "mut_tpl_ghost_holder", ghost)
    here = os.path.dirname(os.path.abspath(__file__))
    with pytest.raises(TemplateError) as caught:
        TrustedCode(packages=[here]).function("mut_tpl_ghost_holder:fn", "step.fn")
    assert str(caught.value) == (
        f"field 'step.fn': mut_tpl_ghost_holder:fn is defined in a module without a file, outside "
        f"the trusted code ({os.path.realpath(here)}): refused"
    )
