"""Step declarations (`executor.steps`): names, input paths, reprs and messages.

Each test pins a behaviour that a mutation of `executor/steps.py` broke without any
other test noticing (see docs/testing.md): the exact refusal of each kind of bad step
name (the message is the user's only guide to the fix), sub-path joining, and the
values the helpers build.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from executor.steps import (
    THIS_OUTPUT_PATH,
    ExecutorStep,
    InputName,
    OutputName,
    StepDefinitionError,
    VersionedValue,
    check_step_name,
    ensure_versioned,
    get_executor_step,
    output_path_of,
    this_output_path,
    unwrap_versioned_value,
    versioned,
)


@dataclass(frozen=True)
class Cfg:
    value: object = None


def noop(config):
    return None


def step(name: str = "s") -> ExecutorStep:
    return ExecutorStep(name, noop, Cfg())


FIX = (
    ". A name is parts of letters, digits, '_', '-' and '.' joined by single '/' "
    "(e.g. 'tokenized/stdlib'); its output goes to <prefix>/<name>-<hash>"
)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "it is empty"),
        (
            "/abs",
            "it starts with '/' (names are relative to the prefix; use override_output_path to write elsewhere)",
        ),
        ("a/", "it ends with '/'"),
        ("a//b", "it contains '//'"),
        ("a/./b", "it has the part '.', which is not a directory name"),
        ("..", "it has the part '..', which is not a directory name"),
        ("a b", "it contains ' '"),
        ("ok/x;y z;", "it contains ' ;'"),  # each bad character once, sorted
        ("naïve", "it contains 'ï'"),
        ("a/b\n", "it contains '\\n'"),
        (
            "experiments",
            "'experiments' is reserved: <prefix>/experiments/ holds the experiment manifests; rename the step",
        ),
        (
            "experiments/x",
            "'experiments' is reserved: <prefix>/experiments/ holds the experiment manifests; rename the step",
        ),
        (  # macOS's default filesystem ignores case: it is the manifests' directory there
            "Experiments/x",
            "'Experiments' is reserved: <prefix>/experiments/ holds the experiment manifests (the same "
            "directory on a case-insensitive filesystem); rename the step",
        ),
        (
            "EXPERIMENTS",
            "'EXPERIMENTS' is reserved: <prefix>/experiments/ holds the experiment manifests (the same "
            "directory on a case-insensitive filesystem); rename the step",
        ),
    ],
    ids=lambda value: "case",
)
def test_each_bad_step_name_is_refused_with_its_own_message(name, problem):
    with pytest.raises(StepDefinitionError) as caught:
        check_step_name(name)
    assert str(caught.value) == f"step name {name!r} is invalid: {problem}{FIX}"
    with pytest.raises(StepDefinitionError):
        step(name)


@pytest.mark.parametrize(
    "name",
    [
        "a",
        "Z9",
        "a.b",
        "a-b_c",
        "tokenized/stdlib",
        "a/b/c",
        "...",
        ".hidden",
        "x/experiments",
        "experiments_v2",
        "experimentsx/y",
        "ALL-CAPS_0.9",
    ],
)
def test_clean_step_names_are_accepted(name):
    check_step_name(name)
    assert step(name).name == name


@pytest.mark.parametrize("name", ["a\x00", "a\tb", "a+b", "a:b", "a@b", "a%2Fb", "a\\b", "²", "ａ"])
def test_names_with_characters_outside_the_allowed_set_are_refused(name):
    with pytest.raises(StepDefinitionError, match="it contains"):
        check_step_name(name)


def test_a_str_subclass_name_is_checked_like_a_str():
    class Name(str):
        pass

    check_step_name(Name("a/b"))
    every_allowed = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-"
    check_step_name(Name(f"x/{every_allowed}"))  # a part using every allowed character is fine
    check_step_name(every_allowed)
    with pytest.raises(StepDefinitionError) as caught:
        check_step_name(Name("a//b"))
    assert "it contains '//'" in str(caught.value)


@pytest.mark.parametrize(("name", "shown"), [(3, "int 3"), (None, "NoneType None"), (b"a", "bytes b'a'")])
def test_a_name_that_is_not_a_string_is_refused_naming_its_type(name, shown):
    with pytest.raises(StepDefinitionError) as caught:
        check_step_name(name)
    assert str(caught.value) == f"step name must be a string, got {shown}"


def test_a_step_definition_error_is_a_value_error():
    assert issubclass(StepDefinitionError, ValueError)


# -- inputs --------------------------------------------------------------------------------


def test_sub_paths_of_a_step_all_spellings():
    s = step("data")
    for made in (s / "sub", s.cd("sub"), output_path_of(s, "sub")):
        assert made == InputName(s, "sub", block_on_step=True)
    assert output_path_of(s) == InputName(s, None)


def test_sub_paths_join_with_exactly_one_slash():
    s = step("data")
    assert (s / "a" / "b").name == "a/b"
    assert InputName(s, "a/").cd("/b").name == "a/b"
    assert InputName(s, "a//").cd("//b").name == "a/b"
    assert InputName(s, "BOX").cd("XY").name == "BOX/XY"  # only slashes are trimmed
    assert InputName(s, None).cd("b").name == "b"
    assert InputName(s, "").cd("b").name == "b"
    assert InputName(s, "a").cd("").name == "a"
    assert InputName(s, None).cd("").name is None
    assert InputName(s, "").cd(None).name is None


def test_a_step_nonblocking_is_its_whole_output_without_waiting():
    s = step("data")
    made = s.nonblocking()
    assert made == InputName(s, None, block_on_step=False)
    assert made.block_on_step is False


def test_nonblocking_keeps_the_sub_path_and_cd_keeps_the_flag():
    s = step("data")
    made = (s / "a").nonblocking()
    assert made == InputName(s, "a", block_on_step=False)
    assert made.cd("b") == InputName(s, "a/b", block_on_step=False)
    assert (made / "c").block_on_step is False


def test_a_hardcoded_input_has_no_step():
    made = InputName.hardcoded("raw/data")
    assert made == InputName(None, "raw/data", block_on_step=True)
    assert repr(made) == "InputName('<hardcoded>', 'raw/data')"


def test_input_and_step_reprs():
    s = step("data/x")
    assert repr(s) == "ExecutorStep(name='data/x')"
    assert repr(s / "sub") == "InputName('data/x', 'sub')"
    assert repr(s.nonblocking()) == "InputName('data/x', None, nonblocking)"


def test_with_output_path_copies_the_step_with_the_override():
    s = ExecutorStep("data", noop, Cfg(1), description="d")
    moved = s.with_output_path("/elsewhere")
    assert moved is not s
    assert moved.override_output_path == "/elsewhere"
    assert (moved.name, moved.fn, moved.config, moved.description) == ("data", noop, Cfg(1), "d")
    assert s.override_output_path is None


def test_get_executor_step_finds_the_step_behind_an_input():
    s = step("data")
    assert get_executor_step(s) is s
    assert get_executor_step(s / "x") is s
    for value in (InputName.hardcoded("/raw"), "data", None):
        with pytest.raises(ValueError) as caught:
            get_executor_step(value)
        assert str(caught.value) == f"{value!r} does not refer to a step"


def test_this_output_path():
    assert this_output_path() == OutputName(None) == THIS_OUTPUT_PATH
    assert this_output_path("sub").name == "sub"


# -- versioned values --------------------------------------------------------------------------


def test_versioned_wraps_and_unwraps():
    assert versioned(3) == VersionedValue(3)
    assert unwrap_versioned_value(versioned([1])) == [1]
    assert unwrap_versioned_value(5) == 5
    assert ensure_versioned(4) == VersionedValue(4)
    already = versioned("x")
    assert ensure_versioned(already) is already


def test_versioning_a_versioned_value_twice_is_refused():
    with pytest.raises(ValueError) as caught:
        versioned(versioned(1))
    assert str(caught.value) == (
        "versioned() was given a value that is already versioned: VersionedValue(value=1)"
    )


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda: step("data"), "ExecutorStep ExecutorStep(name='data')"),
        (lambda: step("data") / "x", "InputName InputName('data', 'x')"),
        (lambda: THIS_OUTPUT_PATH, "OutputName OutputName(name=None)"),
    ],
    ids=lambda value: "case",
)
def test_inputs_and_output_paths_cannot_be_versioned(make, kind):
    with pytest.raises(ValueError) as caught:
        versioned(make())
    assert str(caught.value) == (
        f"versioned() cannot wrap {kind}: inputs are always part of the version (as their "
        "producer's version), and the output path is derived from it"
    )
