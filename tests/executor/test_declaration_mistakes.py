"""Mistakes a new user makes writing an experiment script, found by a red-team pass.

Each was accepted silently (a missing dependency, a path outside the prefix, a function that
gets a marker object instead of a path) or failed late, with a traceback, after other steps
had run. Each is now refused before anything runs, in one line naming the step, the field
and what to do:

- a placeholder (`output_path_of(...)`, a step, `this_output_path()`, `versioned(...)`) inside
  a set, or used as a dict key: the walk replaces only dataclass fields, list and tuple items
  and dict values, so the input was neither waited for nor in the version;
- `this_output_path` or `output_path_of` given without calling them;
- `output_path_of` of something that is not a step (a name, None, an input), and an
  `InputName` built directly around one;
- `InputName.hardcoded` of a relative path leaving the prefix (`../x`), or of a non-string;
- a `description` that is not a string (the manifest could not be written: a traceback) or
  is absurdly long, and `pip_dependency_groups` that is not a list of strings;
- a step function that cannot be called as `fn(config)` (no parameter, two required ones,
  a method taken from its class), found when the graph is resolved instead of when the step
  runs, after its upstream steps;
- `fn` and `config` swapped, and a non-string `override_output_path`, get a message that
  says so.

A `defaultdict` holding an input made resolving fail with a TypeError; it now works.
"""

from __future__ import annotations

import collections
import functools
import inspect
import pathlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import executor.graph
from executor import (
    ExecutorStep,
    InputName,
    StepDefinitionError,
    mirrored,
    output_path_of,
    this_output_path,
    versioned,
)
from executor.graph import resolve

# The harness of the older declaration tests: the same step function, config and checks.
from tests.executor import test_declaration_checks as checks  # noqa: E402
from tests.executor.test_declaration_checks import (  # noqa: E402
    CALLS,
    Cfg,
    _reset_calls,  # noqa: F401 (autouse: the calls are cleared around every test here too)
    error_line,
    run_expecting,
    upstream,
    work,
)


def consumer(input_path: Any = None, **fields: Any) -> ExecutorStep:
    return ExecutorStep("b", work, Cfg(output_path=this_output_path(), input_path=input_path, **fields))


# -- placeholders where the walk cannot replace them ------------------------------------------


@pytest.mark.parametrize(
    ("make", "what"),
    [
        pytest.param(lambda a: {output_path_of(a)}, "step 'a'", id="input-in-set"),
        pytest.param(lambda a: frozenset({a}), "step 'a'", id="step-in-frozenset"),
        pytest.param(lambda a: {a / "x"}, "step 'a'", id="sub-path-in-set"),
        pytest.param(lambda a: [frozenset({(1, a)})], "step 'a'", id="step-deep-in-set"),
        pytest.param(lambda a: {versioned(1)}, "versioned(", id="versioned-in-set"),
        pytest.param(lambda a: {this_output_path("x")}, "this_output_path(", id="output-in-set"),
        pytest.param(lambda a: {InputName.hardcoded("raw/x")}, "'raw/x'", id="hardcoded-in-set"),
        pytest.param(lambda a: {mirrored("raw/x")}, "mirrored(", id="mirrored-in-set"),
    ],
)
def test_a_placeholder_inside_a_set_is_refused(tmp_path, make, what):
    # It used to stay in the set as it was: no dependency, not in the version, and fn got the
    # marker object instead of a path.
    a = upstream()
    run_expecting(tmp_path, [a, consumer(make(a))], "step 'b'", "'input_path", "set", what, "list or a tuple")


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda a: {a: 1}, id="step-as-key"),
        pytest.param(lambda a: {output_path_of(a): 1}, id="input-as-key"),
        pytest.param(lambda a: {"ok": {(a, "x"): 1}}, id="step-inside-a-tuple-key"),
        pytest.param(lambda a: {this_output_path(): 1}, id="output-as-key"),
    ],
)
def test_a_placeholder_used_as_a_dict_key_is_refused(tmp_path, make):
    a = upstream()
    run_expecting(tmp_path, [a, consumer(make(a))], "step 'b'", "'input_path", "dict key", "value")


@pytest.mark.parametrize(
    ("value", "name"),
    [
        pytest.param(this_output_path, "this_output_path()", id="this_output_path"),
        pytest.param(output_path_of, "output_path_of(step)", id="output_path_of"),
        pytest.param([output_path_of], "output_path_of(step)", id="in-a-list"),
    ],
)
def test_a_placeholder_function_given_without_calling_it_is_refused(tmp_path, value, name):
    # `Config(output_path=this_output_path)`: fn got the function, and failed when it ran.
    bad = ExecutorStep("b", work, Cfg(output_path=value))
    run_expecting(tmp_path, [upstream(), bad], "step 'b'", "'output_path", f"call it, {name}")


def test_a_defaultdict_holding_an_input_is_filled_in():
    # Rebuilding it as `type(obj)(items)` raised "first argument must be callable or None".
    a = upstream()
    b = consumer(collections.defaultdict(list, {"train": output_path_of(a, "x")}))
    graph = resolve([b], "/prefix")
    config = graph.resolved(b).config
    assert type(config.input_path) is collections.defaultdict
    assert config.input_path.default_factory is list
    assert config.input_path == {"train": graph.resolved(a).output_path + "/x"}
    assert graph.resolved(b).blocking_deps == (graph.resolved(a).output_path,)


class Pairs(list):
    """A list subclass whose constructor does not take the items."""

    def __init__(self, first, second):
        super().__init__([first, second])


def test_a_container_subclass_that_cannot_be_rebuilt_is_refused_naming_the_field(tmp_path):
    # Rebuilding it as `Pairs(items)` raised a TypeError out of the graph, with a traceback.
    a = upstream()
    run_expecting(
        tmp_path, [consumer(Pairs(output_path_of(a), "x"))], "step 'b'", "'input_path'", "Pairs", "plain list"
    )


# -- output_path_of and InputName of something that is not a step ------------------------------


@pytest.mark.parametrize(
    ("make", "fragments"),
    [
        pytest.param(lambda a: output_path_of("a"), ["str 'a'"], id="name"),
        pytest.param(lambda a: output_path_of(None), ["None"], id="none"),
        pytest.param(lambda a: output_path_of(a / "x", "y"), ["InputName", "step / 'sub'"], id="input"),
        pytest.param(lambda a: output_path_of(output_path_of(a)), ["InputName"], id="output_path_of"),
        pytest.param(lambda a: output_path_of(this_output_path()), ["OutputName"], id="this_output_path"),
    ],
)
def test_output_path_of_something_that_is_not_a_step_is_refused_where_it_is_written(make, fragments):
    a = upstream()
    with pytest.raises(StepDefinitionError) as caught:
        make(a)
    message = str(caught.value)
    assert "output_path_of() takes an ExecutorStep" in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("not_a_step", ["a", 3, Cfg()], ids=["str", "int", "dataclass"])
def test_an_input_name_built_around_something_that_is_not_a_step_is_refused_naming_the_field(
    tmp_path, not_a_step
):
    # It used to say only "expected an ExecutorStep, got str: 'a'", naming neither step nor field.
    bad = consumer(InputName(not_a_step, None))
    run_expecting(tmp_path, [bad], "step 'b'", "'input_path'", type(not_a_step).__name__, "output_path_of(")


# -- hard-coded paths ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "shown"),
    [
        pytest.param(lambda: InputName.hardcoded("../outside"), "'../outside'", id="dotdot"),
        pytest.param(lambda: InputName.hardcoded("raw/../../outside"), "'raw/../../outside'", id="inner"),
        pytest.param(lambda: InputName.hardcoded("raw").cd("../../x"), "'raw/../../x'", id="cd"),
        pytest.param(lambda: InputName.hardcoded("raw") / "..", "'raw/..'", id="div"),
        pytest.param(lambda: InputName.hardcoded("./raw"), "'./raw'", id="dot"),
        pytest.param(lambda: InputName.hardcoded("raw//x"), "'raw//x'", id="empty-part"),
        pytest.param(lambda: InputName.hardcoded(""), "''", id="empty"),
        pytest.param(lambda: InputName.hardcoded(pathlib.Path("raw/x")), "PosixPath", id="path-object"),
        pytest.param(lambda: InputName.hardcoded(3), "int", id="int"),
        pytest.param(lambda: InputName.hardcoded(None), "None", id="none"),
    ],
)
def test_a_hard_coded_path_leaving_the_prefix_or_not_a_string_is_refused(make, shown):
    # A relative hard-coded path is joined to the prefix: '../outside' read <prefix>/../outside.
    with pytest.raises(StepDefinitionError) as caught:
        make()
    message = str(caught.value)
    assert "InputName.hardcoded" in message and shown in message, message
    assert "relative to the prefix" in message


@pytest.mark.parametrize(
    ("name", "fragment"),
    [("../x", "'..'"), ("raw/./x", "'.'"), (3, "int"), (pathlib.Path("raw/x"), "PosixPath")],
)
def test_a_hard_coded_input_built_directly_is_refused_when_resolved(tmp_path, name, fragment):
    # Before: '../x' was read from outside the prefix; a Path or an int ended in a traceback.
    run_expecting(tmp_path, [consumer(InputName(None, name))], "step 'b'", "'input_path'", fragment)


def test_valid_hard_coded_paths_are_kept_as_written(tmp_path):
    for path in ("raw/x", "raw/x/", "/data/../raw", "gs://bucket/a/../b", "raw/data-*.jsonl.gz", "..x/x.."):
        assert InputName.hardcoded(path).name == path
    assert InputName.hardcoded("raw").cd("x/").name == "raw/x/"
    assert InputName.hardcoded("/data").cd("../x").name == "/data/../x"  # absolute: as written
    graph = resolve([consumer(InputName.hardcoded("raw/x"))], str(tmp_path))
    assert graph.steps[0].config.input_path == f"{tmp_path}/raw/x"


# -- description and pip_dependency_groups ------------------------------------------------------


@pytest.mark.parametrize(
    ("description", "fragment"),
    [
        (["not", "a", "string"], "list"),
        ({"a": 1}, "dict"),
        ({"x"}, "set"),
        (object(), "object"),
        (42, "int"),
        (b"bytes", "bytes"),
    ],
)
def test_a_description_that_is_not_a_string_is_refused_when_the_step_is_built(description, fragment):
    # A set or an object made writing the experiment manifest fail with a traceback.
    with pytest.raises(StepDefinitionError) as caught:
        ExecutorStep("b", work, Cfg(), description=description)
    message = str(caught.value)
    assert "step 'b'" in message and "description must be a string or None" in message
    assert fragment in message


def test_an_overlong_description_is_refused_and_a_long_one_is_fine():
    ExecutorStep("b", work, Cfg(), description="x" * 65_536)
    with pytest.raises(StepDefinitionError) as caught:
        ExecutorStep("b", work, Cfg(), description="x" * 10_000_000)
    message = str(caught.value)
    assert "step 'b'" in message and "10,000,000" in message and "65,536" in message


@pytest.mark.parametrize(
    ("groups", "fragment"),
    [("tokenize", "str 'tokenize'"), ([object()], "object"), ({"tokenize": 1}, "dict"), ([1], "int")],
)
def test_pip_dependency_groups_must_be_a_list_of_strings(groups, fragment):
    # A string was taken as it was; an object in the list failed the step after its upstream ran.
    with pytest.raises(StepDefinitionError) as caught:
        ExecutorStep("b", work, Cfg(), pip_dependency_groups=groups)
    message = str(caught.value)
    assert "step 'b'" in message and "pip_dependency_groups" in message and fragment in message
    assert "['tokenize']" in message


def test_valid_descriptions_and_dependency_groups_are_accepted():
    step = ExecutorStep("b", work, Cfg(), description="Tokenize\nthe corpus", pip_dependency_groups=["a"])
    assert step.description == "Tokenize\nthe corpus" and step.pip_dependency_groups == ["a"]
    assert ExecutorStep("b", work, Cfg(), pip_dependency_groups=("a", "b")).pip_dependency_groups == (
        "a",
        "b",
    )
    assert ExecutorStep("b", work, Cfg(), pip_dependency_groups=[]).pip_dependency_groups == []


# -- step functions that cannot take the config -------------------------------------------------


def no_parameter() -> None:
    CALLS.append("no parameter")


def two_parameters(config, extra) -> None:
    CALLS.append("two parameters")


def keyword_only(config, *, flag) -> None:
    CALLS.append("keyword only")


class Worker:
    def run(self, config) -> None:
        CALLS.append("method")


@pytest.mark.parametrize(
    ("fn", "fragments"),
    [
        pytest.param(no_parameter, ["no_parameter", "too many positional arguments"], id="no-parameter"),
        pytest.param(two_parameters, ["two_parameters", "'extra'"], id="two-parameters"),
        pytest.param(keyword_only, ["keyword_only", "'flag'"], id="keyword-only"),
        pytest.param(Worker.run, ["Worker.run", "Worker().run"], id="method-of-the-class"),
        pytest.param(lambda: None, ["<lambda>"], id="lambda"),
    ],
)
def test_a_step_function_that_cannot_take_the_config_is_refused_before_anything_runs(tmp_path, fn, fragments):
    # It used to fail when the step ran (TypeError), after its upstream steps had run.
    bad = ExecutorStep("b", fn, Cfg(output_path=this_output_path(), input_path=output_path_of(upstream())))
    run_expecting(tmp_path, [bad], "step 'b'", "fn(config)", *fragments)


def accepts_anything(*args, **kwargs) -> None:
    pass


def with_default(config, extra=1) -> None:
    pass


@pytest.mark.parametrize(
    "fn",
    [accepts_anything, with_default, Worker().run, print, dict, Cfg],
    ids=["varargs", "default", "bound-method", "builtin", "builtin-class", "class"],
)
def test_step_functions_that_take_one_argument_are_accepted(tmp_path, fn):
    assert resolve([ExecutorStep("ok", fn, Cfg())], str(tmp_path)).steps[0].name == "ok"


def _positional_only(config, /) -> None:
    pass


def _two_positional_only(a, b, /) -> None:
    pass


def _kw_default(config, *, flag=1) -> None:
    pass


def _star_args_after(config, *rest) -> None:
    pass


class _Methods:
    def one(self, config) -> None:
        pass

    def none(self) -> None:
        pass

    def two(self, config, extra) -> None:
        pass

    @classmethod
    def of_class(cls, config) -> None:
        pass

    @staticmethod
    def static(config) -> None:
        pass


ARITY_CASES = [
    no_parameter,
    two_parameters,
    keyword_only,
    accepts_anything,
    with_default,
    _positional_only,
    _two_positional_only,
    _kw_default,
    _star_args_after,
    lambda: None,
    lambda config: None,
    lambda *a: None,
    _Methods().one,
    _Methods().none,
    _Methods().two,
    _Methods.one,
    _Methods.of_class,
    _Methods.static,
    functools.partial(two_parameters, 1),
    functools.partial(two_parameters, 1, 2),
    functools.partial(two_parameters, extra=2),
    functools.partial(two_parameters, config=2),
    functools.partial(_Methods().two, 1),
    functools.partial(no_parameter),
    functools.partial(accepts_anything, 1, 2, 3),
]


@pytest.mark.parametrize("fn", ARITY_CASES, ids=[str(i) for i in range(len(ARITY_CASES))])
def test_the_quick_argument_check_agrees_with_inspect(fn):
    # `_surely_takes_one_argument` reads code objects instead of calling inspect.signature: it
    # must never accept what a call fn(config) would refuse, nor refuse what it accepts.
    try:
        inspect.signature(fn, follow_wrapped=False).bind(None)
        callable_with_one = True
    except TypeError:
        callable_with_one = False
    assert (executor.graph._fn_problem(fn) is None) is callable_with_one
    if executor.graph._surely_takes_one_argument(fn):
        assert callable_with_one


def test_the_usual_step_functions_take_the_quick_check():
    # (No inspect.signature per step for a function, a method, a partial or a lambda made per step.)
    for fn in (work, _Methods().one, functools.partial(two_parameters, 1), lambda config: None, with_default):
        assert executor.graph._surely_takes_one_argument(fn), fn


def test_fn_and_config_swapped_says_so(tmp_path):
    bad = ExecutorStep("b", Cfg(output_path=this_output_path()), work)
    run_expecting(
        tmp_path, [bad], "step 'b'", "fn must be callable, got Cfg", "swapped", "(name, fn, config)"
    )


def test_an_override_output_path_that_is_not_a_string_says_so(tmp_path):
    bad = ExecutorStep("b", work, Cfg(), override_output_path=pathlib.Path("x"))
    run_expecting(tmp_path, [bad], "step 'b'", "override_output_path must be a string", "PosixPath")


# -- end to end: a script run with executor_main ----------------------------------------------

STUDY = """
import collections
import functools
import inspect
import os
from dataclasses import dataclass
from typing import Any

from executor import ExecutorStep, InputName, executor_main, output_path_of, this_output_path, versioned

MODE = os.environ["STUDY_MODE"]


@dataclass(frozen=True)
class Config:
    output_path: Any = None
    input_path: Any = None


def work(config):
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "input"), "w") as handle:
        handle.write(repr(config.input_path))


def no_config():
    pass


a = ExecutorStep("a", work, Config(this_output_path()))
steps = [a]
if MODE == "set":
    steps.append(ExecutorStep("b", work, Config(this_output_path(), {output_path_of(a)})))
if MODE == "dict_key":
    steps.append(ExecutorStep("b", work, Config(this_output_path(), {a: "train"})))
if MODE == "uncalled":
    steps.append(ExecutorStep("b", work, Config(this_output_path)))
if MODE == "no_config":
    steps.append(ExecutorStep("b", no_config, Config(this_output_path(), output_path_of(a))))
if MODE == "description":
    steps.append(ExecutorStep("b", work, Config(this_output_path()), description={"a"}))  # the bad line
if MODE == "output_path_of_name":
    steps.append(ExecutorStep("b", work, Config(this_output_path(), output_path_of("a"))))  # the bad line
if MODE == "hardcoded_dotdot":
    steps.append(ExecutorStep("b", work, Config(this_output_path(), InputName.hardcoded("../x"))))  # the bad line
if MODE == "defaultdict":
    steps.append(ExecutorStep("b", work, Config(this_output_path(), collections.defaultdict(list, {"k": a}))))

executor_main(steps)
"""


def run_study(tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    return checks.run_study(tmp_path, mode, STUDY)


@pytest.mark.parametrize(
    ("mode", "fragments"),
    [
        ("set", ["step 'b'", "'input_path'", "set", "list or a tuple"]),
        ("dict_key", ["step 'b'", "'input_path'", "dict key"]),
        ("uncalled", ["step 'b'", "'output_path'", "this_output_path()"]),
        ("no_config", ["step 'b'", "no_config", "fn(config)"]),
    ],
)
def test_a_mistake_in_a_step_is_one_error_line_and_nothing_runs(tmp_path, mode, fragments):
    error_line(run_study(tmp_path, mode), *fragments)
    out = tmp_path / "out"
    assert not out.exists() or list(out.rglob("*")) == []  # not even step 'a' ran


@pytest.mark.parametrize(
    ("mode", "fragments"),
    [
        ("description", ["step 'b'", "description must be a string or None, got set"]),
        ("output_path_of_name", ["output_path_of() takes an ExecutorStep", "str 'a'"]),
        ("hardcoded_dotdot", ["InputName.hardcoded('../x')", "relative to the prefix"]),
    ],
)
def test_a_mistake_at_the_top_of_a_script_is_one_line_with_its_place(tmp_path, mode, fragments):
    line = error_line(run_study(tmp_path, mode), *fragments)
    lines = STUDY.splitlines()
    bad_line = next(
        i
        for i, text in enumerate(lines, 1)
        if text.endswith("# the bad line") and f'"{mode}"' in lines[i - 2]
    )
    assert line.startswith(f"error: study.py:{bad_line}: "), line
    assert not (tmp_path / "out").exists()


def test_a_defaultdict_of_inputs_runs_from_a_script(tmp_path):
    result = run_study(tmp_path, "defaultdict")
    assert result.returncode == 0, result.stderr
    (written,) = (tmp_path / "out").glob("b-*/input")
    (a_dir,) = (tmp_path / "out").glob("a-*")
    assert written.read_text() == f"defaultdict(<class 'list'>, {{'k': '{a_dir}'}})"


@pytest.mark.parametrize("description", [{"x"}, object(), "d" * 70_000, 3])
def test_an_experiment_description_that_cannot_be_recorded_is_one_line_before_anything_runs(
    tmp_path, monkeypatch, capsys, description
):
    """`executor_main(steps, description=...)` is recorded in every manifest: a set or an
    object failed the run with a traceback at its first manifest write, after the plan."""

    from executor import executor_main

    monkeypatch.setattr(sys, "argv", ["study.py", "--prefix", str(tmp_path / "out")])
    step = ExecutorStep(name="a", fn=_write_nothing, config=_Plain(this_output_path()))
    with pytest.raises(SystemExit) as exited:
        executor_main([step], description=description)
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the experiment's description must be a string or None"), err
    assert not (tmp_path / "out").exists()


@dataclass(frozen=True)
class _Plain:
    output_path: str


def _write_nothing(config: _Plain) -> None:
    pass
