"""The concrete config of a step is the declared one with its placeholders filled in, built as
`dataclasses.replace` builds it (executor.walker's faster path included)."""

from __future__ import annotations

import dataclasses
from dataclasses import InitVar, dataclass, field
from typing import ClassVar

import pytest

from executor import ExecutorStep, output_path_of, this_output_path, versioned
from executor.graph import StepDefinitionError, resolve

POST_INIT_CALLS: list[str] = []


@dataclass(frozen=True)
class Plain:
    output_path: str
    size: int = 3
    tags: tuple = ()
    derived: str = field(default="", init=False)

    def __post_init__(self):
        POST_INIT_CALLS.append(self.output_path)
        object.__setattr__(self, "derived", f"{self.output_path}#{self.size}")


@dataclass(frozen=True)
class WithPseudoFields:
    LIMIT: ClassVar[int] = 10
    input_path: str
    output_path: str
    scale: InitVar[int] = 2
    scaled: int = field(default=0, init=False)

    def __post_init__(self, scale):
        object.__setattr__(self, "scaled", scale * self.LIMIT)


def _noop(config) -> None:
    pass


def test_placeholders_are_filled_in_and_post_init_sees_the_concrete_values(tmp_path):
    POST_INIT_CALLS.clear()
    step = ExecutorStep(name="plain", fn=_noop, config=Plain(this_output_path(), versioned(5), ("a",)))
    resolved = resolve([step], str(tmp_path)).resolved(step)
    config = resolved.config
    assert type(config) is Plain
    assert (config.output_path, config.size, config.tags) == (resolved.output_path, 5, ("a",))
    assert config.derived == f"{resolved.output_path}#5"  # recomputed from the concrete values
    assert POST_INIT_CALLS[-1] == resolved.output_path
    assert step.config.output_path != config.output_path  # the declaration is left as it was


def test_a_config_with_classvar_and_initvar_fields_is_rebuilt_as_replace_does(tmp_path):
    upstream = ExecutorStep(name="up", fn=_noop, config=Plain(this_output_path()))
    declared = WithPseudoFields(output_path_of(upstream), this_output_path(), scale=4)
    step = ExecutorStep(name="pseudo", fn=_noop, config=declared)
    graph = resolve([step], str(tmp_path))
    config = graph.resolved(step).config
    assert config.input_path == graph.resolved(upstream).output_path
    assert config.output_path == graph.resolved(step).output_path
    # As dataclasses.replace: an InitVar not given again takes its default.
    expected = dataclasses.replace(declared, input_path=config.input_path, output_path=config.output_path)
    assert config == expected and config.scaled == 20


@dataclass(frozen=True)
class NeedsScale:
    output_path: str
    scale: InitVar[int]
    scaled: int = field(default=0, init=False)

    def __post_init__(self, scale):
        object.__setattr__(self, "scaled", scale * 2)


def test_an_initvar_without_a_default_is_refused_naming_the_step_and_the_initvar(tmp_path):
    """`dataclasses.replace` cannot rebuild it (the value given to `__init__` is not kept);
    the constructor without `replace` would fail with a bare TypeError instead."""
    step = ExecutorStep(name="scaled", fn=_noop, config=NeedsScale(this_output_path(), 3))
    with pytest.raises(StepDefinitionError, match=r"step 'scaled': InitVar 'scale' must be specified"):
        resolve([step], str(tmp_path))
