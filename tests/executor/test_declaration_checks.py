"""Declaration mistakes a red team found: each is refused before anything runs, in one line.

- `versioned()` of a marker and bad `ResourceConfig` values raise `StepDefinitionError`
  (which `executor_main` prints as one `file:line: message` line), not a plain ValueError
  (a traceback);
- a generator or async function as a step's `fn` (calling it would run nothing);
- an `ExecutorStep` (or another marker) passed as a step's config;
- sub-paths of inputs and outputs that leave the output directory (`..`, `.`, empty
  parts, a leading '/').

Valid declarations keep working exactly as before: the versions of the accepted
spellings are pinned at the end.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import executor
import executor.graph
import executor.resources
import executor.steps
from executor import (
    Executor,
    ExecutorStep,
    GpuConfig,
    InputName,
    OutputName,
    ResourceConfig,
    StepDefinitionError,
    TpuConfig,
    get_executor_step,
    mirrored,
    output_path_of,
    this_output_path,
    versioned,
)
from executor.graph import resolve

REPO = Path(__file__).resolve().parents[2]

CALLS: list[str] = []


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()
    yield
    CALLS.clear()


@dataclass(frozen=True)
class Cfg:
    output_path: Any = None
    input_path: Any = None
    value: Any = versioned(1)


def work(config: Cfg) -> None:
    CALLS.append(repr(config))
    os.makedirs(config.output_path, exist_ok=True)


def upstream(name: str = "a") -> ExecutorStep:
    return ExecutorStep(name, work, Cfg(output_path=this_output_path()))


def run_expecting(tmp_path: Path, steps: list, *fragments: str) -> str:
    """Run `steps`: a StepDefinitionError naming every fragment, nothing called or written."""
    prefix = tmp_path / "prefix"
    with pytest.raises(StepDefinitionError) as caught:
        Executor(str(prefix), console=False).run(steps)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "\n" not in message
    assert CALLS == []
    assert not prefix.exists() or list(prefix.rglob("*")) == []
    return message


# -- one error class, importable from every module that raises it ---------------------------


def test_step_definition_error_is_one_class_everywhere():
    assert executor.StepDefinitionError is executor.graph.StepDefinitionError
    assert executor.steps.StepDefinitionError is executor.graph.StepDefinitionError
    assert executor.resources.StepDefinitionError is executor.graph.StepDefinitionError
    assert issubclass(StepDefinitionError, ValueError)  # callers catching ValueError still do


# -- 1. versioned() of a marker, bad resources ------------------------------------------------


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        pytest.param(lambda: this_output_path(), "OutputName", id="this_output_path"),
        pytest.param(lambda: this_output_path("sub"), "OutputName", id="this_output_path-sub"),
        pytest.param(lambda: upstream(), "ExecutorStep", id="step"),
        pytest.param(lambda: upstream() / "x", "InputName", id="input"),
        pytest.param(lambda: output_path_of(upstream()), "InputName", id="output_path_of"),
        pytest.param(lambda: versioned(1), "already versioned", id="versioned-twice"),
    ],
)
def test_versioning_a_marker_is_a_step_definition_error(make, fragment):
    with pytest.raises(StepDefinitionError, match="versioned()") as caught:
        versioned(make())
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("make", "fragments"),
    [
        pytest.param(lambda: ResourceConfig.with_cpu(cpu=-1), ["cpu", "-1", "> 0"], id="cpu-negative"),
        pytest.param(lambda: ResourceConfig.with_cpu(cpu=0), ["cpu", "> 0"], id="cpu-zero"),
        pytest.param(lambda: ResourceConfig.with_cpu(ram="lots"), ["ram", "'lots'", '"16g"'], id="ram"),
        pytest.param(lambda: ResourceConfig.with_cpu(disk="0g"), ["disk", "'0g'"], id="disk"),
        pytest.param(
            lambda: ResourceConfig.with_gpu("H100", count=0), ["count", "0", ">= 1"], id="gpu-count"
        ),
        pytest.param(lambda: ResourceConfig.with_gpu(""), ["GpuConfig.variant"], id="gpu-variant"),
        pytest.param(lambda: ResourceConfig.with_tpu("x-8"), ["TpuConfig.variant", "'v4-8'"], id="tpu"),
        pytest.param(lambda: ResourceConfig.with_tpu([]), ["with_tpu", "at least one"], id="tpu-empty"),
        pytest.param(
            lambda: ResourceConfig.with_tpu("v4-8", slice_count=0), ["slice_count", ">= 1"], id="slices"
        ),
        pytest.param(lambda: ResourceConfig(preemptible="yes"), ["preemptible"], id="preemptible"),
        pytest.param(lambda: ResourceConfig(regions="us"), ["regions"], id="regions"),
        pytest.param(lambda: ResourceConfig(device="gpu"), ["device"], id="device"),
        pytest.param(lambda: GpuConfig("H100", 0), ["GpuConfig.count"], id="GpuConfig"),
        pytest.param(lambda: TpuConfig("v4-8", topology="2by2"), ["topology"], id="TpuConfig"),
    ],
)
def test_bad_resources_are_a_step_definition_error_naming_the_argument(make, fragments):
    with pytest.raises(StepDefinitionError) as caught:
        make()
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_other_declaration_helpers_refuse_with_step_definition_errors():
    with pytest.raises(StepDefinitionError, match="relative to the prefix"):
        mirrored("/abs/path")
    with pytest.raises(StepDefinitionError, match="budget_gb"):
        mirrored("raw/x", budget_gb=0)
    with pytest.raises(StepDefinitionError, match="does not refer to a step"):
        get_executor_step(InputName.hardcoded("raw/x"))


def test_a_bad_resources_value_still_names_the_step():
    with pytest.raises(StepDefinitionError, match=r"step 'train': .*ResourceConfig.cpu must be a number > 0"):
        ExecutorStep("train", work, Cfg(), resources={"__type__": "ResourceConfig", "cpu": -1})


# -- 2. generator and async step functions ------------------------------------------------------


def generator_fn(config):
    CALLS.append("generator")
    yield config


async def async_fn(config):
    CALLS.append("async")


async def async_generator_fn(config):
    CALLS.append("async generator")
    yield config


class Steps:
    def generate(self, config):
        yield config

    async def later(self, config):
        pass


class CallableGenerator:
    def __call__(self, config):
        yield config


@pytest.mark.parametrize(
    ("fn", "kind"),
    [
        pytest.param(generator_fn, "a generator function", id="generator"),
        pytest.param(async_fn, "an async function", id="async"),
        pytest.param(async_generator_fn, "an async generator function", id="async-generator"),
        pytest.param(functools.partial(generator_fn), "a generator function", id="partial"),
        pytest.param(Steps().generate, "a generator function", id="method"),
        pytest.param(Steps().later, "an async function", id="async-method"),
        pytest.param(CallableGenerator(), "a generator function", id="callable-object"),
    ],
)
def test_a_generator_or_async_step_function_is_refused(tmp_path, fn, kind):
    bad = ExecutorStep("g", fn, Cfg(output_path=this_output_path()))
    message = run_expecting(tmp_path, [bad], "step 'g'", kind, "plain function")
    assert "fn" in message
    # Also when the step is only reachable as an input of another.
    down = ExecutorStep("down", work, Cfg(output_path=this_output_path(), input_path=bad / "x"))
    run_expecting(tmp_path, [down], "step 'g'", kind)


@pytest.mark.parametrize(
    "fn",
    [work, functools.partial(work), print, Cfg, lambda config: None],
    ids=["function", "partial", "builtin", "class", "lambda"],
)
def test_plain_callables_are_accepted_as_step_functions(tmp_path, fn):
    step = ExecutorStep("ok", fn, Cfg(output_path=this_output_path()))
    assert resolve([step], str(tmp_path)).steps[0].name == "ok"


# -- 3. a step (or another marker) as the config ----------------------------------------------


@pytest.mark.parametrize(
    ("make_config", "kind"),
    [
        pytest.param(lambda a: a, "ExecutorStep 'a'", id="step"),
        pytest.param(lambda a: a / "x", "InputName", id="input"),
        pytest.param(lambda a: output_path_of(a), "InputName", id="output_path_of"),
        pytest.param(lambda a: this_output_path(), "OutputName", id="output"),
        pytest.param(lambda a: versioned("raw/x"), "VersionedValue", id="versioned"),
        pytest.param(lambda a: mirrored("raw/x"), "MirroredValue", id="mirrored"),
        pytest.param(lambda a: InputName.hardcoded("raw/x"), "InputName", id="hardcoded"),
    ],
)
def test_a_step_or_marker_as_the_config_is_refused(tmp_path, make_config, kind):
    a = upstream()
    bad = ExecutorStep(name="b", fn=work, config=make_config(a))
    message = run_expecting(tmp_path, [bad], "step 'b'", kind, "dataclass", "output_path_of(")
    assert "config" in message


@dataclass(frozen=True)
class Plain:
    n: int = 3


def test_a_versioned_config_dataclass_is_still_accepted(tmp_path):
    # Not a marker standing for a path: fn gets the dataclass, as before.
    resolved = resolve([ExecutorStep("v", work, versioned(Plain()))], str(tmp_path)).steps[0]
    assert resolved.config == Plain()
    assert resolved.version["config"] == {"": {"__type__": "Plain", "n": 3}}


# -- 4. sub-paths that leave the output directory ---------------------------------------------


@pytest.mark.parametrize(
    ("make", "bad"),
    [
        pytest.param(lambda a: a / "../../etc", "../../etc", id="div-dotdot"),
        pytest.param(lambda a: a.cd(".."), "..", id="cd-dotdot"),
        pytest.param(lambda a: output_path_of(a, "../x"), "../x", id="output_path_of-dotdot"),
        pytest.param(lambda a: output_path_of(a, "/etc/passwd"), "/etc/passwd", id="absolute"),
        pytest.param(lambda a: a / "/etc", "/etc", id="div-absolute"),
        pytest.param(lambda a: a / "x/./y", "x/./y", id="dot"),
        pytest.param(lambda a: a / "./x", "./x", id="leading-dot"),
        pytest.param(lambda a: a / "x//y", "x//y", id="empty-part"),
        pytest.param(lambda a: a / "gs://bucket/x", "gs://bucket/x", id="url"),
        pytest.param(lambda a: (a / "x") / "../../y", "x/../../y", id="joined-dotdot"),
        pytest.param(lambda a: a.nonblocking() / "../y", "../y", id="nonblocking"),
        pytest.param(lambda a: a / "x/..", "x/..", id="trailing-dotdot"),
    ],
)
def test_an_input_sub_path_leaving_the_output_is_refused(make, bad):
    a = upstream()
    with pytest.raises(StepDefinitionError) as caught:
        make(a)
    message = str(caught.value)
    assert repr(bad) in message and "'a'" in message
    assert "relative" in message  # what to do


@pytest.mark.parametrize("bad", ["../../x", "..", "/abs", "x/../../y", "./x", "x//y", "s3://b/x"])
def test_an_output_sub_path_leaving_the_output_is_refused(bad):
    with pytest.raises(StepDefinitionError) as caught:
        this_output_path(bad)
    message = str(caught.value)
    assert f"this_output_path({bad!r})" in message and "relative" in message


def test_a_sub_path_must_be_a_string():
    a = upstream()
    with pytest.raises(StepDefinitionError, match="must be a string, got int 3"):
        a / 3
    with pytest.raises(StepDefinitionError, match="must be a string, got int 3"):
        this_output_path(3)


@pytest.mark.parametrize(
    ("make_marker", "fragments"),
    [
        pytest.param(lambda a: InputName(a, "../x"), ["'../x'", "'a'"], id="input"),
        pytest.param(lambda a: InputName(a, "/etc/passwd"), ["'/etc/passwd'"], id="input-absolute"),
        pytest.param(lambda a: OutputName("../../x"), ["'../../x'"], id="output"),
        pytest.param(lambda a: OutputName("/x"), ["'/x'"], id="output-absolute"),
    ],
)
def test_a_marker_built_directly_with_a_bad_sub_path_is_refused_when_resolved(
    tmp_path, make_marker, fragments
):
    # InputName(...) and OutputName(...) themselves stay plain values (records of other trees
    # are decoded into them); the graph refuses them, naming the step and the field.
    a = upstream()
    bad = ExecutorStep("b", work, Cfg(output_path=this_output_path(), input_path=make_marker(a)))
    run_expecting(tmp_path, [bad], "step 'b'", "'input_path'", *fragments)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda a: a / "tokenizer/", "tokenizer/"),
        (lambda a: a / "data/*.jsonl.gz", "data/*.jsonl.gz"),
        (lambda a: output_path_of(a, "data/part-0.parquet"), "data/part-0.parquet"),
        (lambda a: output_path_of(a, ""), ""),
        (lambda a: output_path_of(a), None),
        (lambda a: a / "", ""),
        (lambda a: (a / "x/").cd("/y"), "x/y"),  # joining trims the slashes (pinned elsewhere)
        (lambda a: InputName(a, "x//"), "x//"),
        (lambda a: a / ".hidden/..x/x..", ".hidden/..x/x.."),
        (lambda a: InputName.hardcoded("/data/raw").cd("x"), "/data/raw/x"),
    ],
)
def test_valid_sub_paths_are_kept_as_written(make, expected):
    assert make(upstream()).name == expected


def test_valid_output_sub_paths_are_kept():
    assert this_output_path().name is None
    assert this_output_path("checkpoints/").name == "checkpoints/"
    assert this_output_path("data/*.jsonl.gz").name == "data/*.jsonl.gz"
    assert this_output_path("").name == ""


def test_versions_of_valid_sub_paths_are_unchanged(tmp_path):
    # The version of valid declarations must not move: pin one with every accepted spelling.
    a = upstream()

    @dataclass(frozen=True)
    class Paths:
        out: Any
        tok: Any
        glob: Any
        whole: Any
        joined: Any
        empty: Any

    b = ExecutorStep(
        "b",
        work,
        Paths(
            this_output_path("checkpoints/"),
            a / "tokenizer/",
            output_path_of(a, "data/*.jsonl.gz"),
            output_path_of(a),
            (a / "x/").cd("/y"),
            output_path_of(a, ""),
        ),
    )
    graph = resolve([b], str(tmp_path))
    resolved = graph.resolved(b)
    assert resolved.version["config"] == {
        "tok": "DEP[0]/tokenizer/",
        "glob": "DEP[0]/data/*.jsonl.gz",
        "whole": "DEP[0]",
        "joined": "DEP[0]/x/y",
        "empty": "DEP[0]",
    }
    a_path = graph.resolved(a).output_path
    assert resolved.config.tok == f"{a_path}/tokenizer/"
    assert resolved.config.out == f"{resolved.output_path}/checkpoints/"
    assert resolved.version_hash[:8] == graph.resolved(b).output_path.rsplit("-", 1)[1]


# -- end to end: a script run with executor_main ----------------------------------------------

STUDY = """
import os
from dataclasses import dataclass
from typing import Any

from executor import ExecutorStep, ResourceConfig, executor_main, output_path_of, this_output_path, versioned

MODE = os.environ["STUDY_MODE"]


@dataclass(frozen=True)
class Config:
    output_path: Any = None
    input_path: Any = None
    value: Any = None


def work(config):
    os.makedirs(config.output_path, exist_ok=True)


def generate(config):
    yield config


a = ExecutorStep("a", work, Config(this_output_path(), value=versioned(1)))
steps = [a]
if MODE == "versioned_output":
    steps.append(ExecutorStep("b", work, Config(versioned(this_output_path()))))  # the bad line
if MODE == "versioned_step":
    steps.append(ExecutorStep("b", work, Config(this_output_path(), value=versioned(a))))  # the bad line
if MODE == "cpu":
    steps.append(ExecutorStep("b", work, Config(this_output_path()), resources=ResourceConfig.with_cpu(cpu=-1)))  # the bad line
if MODE == "ram":
    steps.append(ExecutorStep("b", work, Config(this_output_path()), resources=ResourceConfig.with_cpu(ram="lots")))  # the bad line
if MODE == "gpu":
    steps.append(ExecutorStep("b", work, Config(this_output_path()), resources=ResourceConfig.with_gpu("H100", count=0)))  # the bad line
if MODE == "input_dotdot":
    steps.append(ExecutorStep("b", work, Config(this_output_path(), a / "../../etc")))  # the bad line
if MODE == "input_absolute":
    steps.append(ExecutorStep("b", work, Config(this_output_path(), output_path_of(a, "/etc/passwd"))))  # the bad line
if MODE == "output_dotdot":
    steps.append(ExecutorStep("b", work, Config(this_output_path("../../x"))))  # the bad line
if MODE == "generator":
    steps.append(ExecutorStep("b", generate, Config(this_output_path())))
if MODE == "config_step":
    steps.append(ExecutorStep(name="b", fn=work, config=a))

executor_main(steps)
"""


def run_study(tmp_path: Path, mode: str, study: str | None = None) -> subprocess.CompletedProcess:
    """Run the study script (`study`, default this module's STUDY) with STUDY_MODE=`mode`."""
    script = tmp_path / "study.py"
    script.write_text(STUDY if study is None else study)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MARIN_")}
    environ.update({"PYTHONPATH": str(REPO), "STUDY_MODE": mode})
    return subprocess.run(
        [sys.executable, str(script), "--prefix", str(tmp_path / "out")],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def error_line(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """The one `error: ` line on stderr; exit 1 (a bad declaration), no traceback, the fragments."""
    report = f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 1, report
    assert "Traceback" not in result.stderr, report
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, report
    assert result.stderr.strip() == errors[0], report
    for fragment in fragments:
        assert fragment in errors[0], f"{fragment!r} missing\n{report}"
    return errors[0]


@pytest.mark.parametrize(
    ("mode", "fragments"),
    [
        ("versioned_output", ["versioned() cannot wrap OutputName"]),
        ("versioned_step", ["versioned() cannot wrap ExecutorStep"]),
        ("cpu", ["ResourceConfig.cpu must be a number > 0, got -1"]),
        ("ram", ["ResourceConfig.ram 'lots' is not a size"]),
        ("gpu", ["GpuConfig.count must be an integer >= 1, got 0"]),
        ("input_dotdot", ["'../../etc'", "'a'"]),
        ("input_absolute", ["'/etc/passwd'", "'a'"]),
        ("output_dotdot", ["this_output_path('../../x')"]),
    ],
)
def test_a_bad_declaration_at_the_top_of_a_script_is_one_line_with_its_place(tmp_path, mode, fragments):
    line = error_line(run_study(tmp_path, mode), *fragments)
    bad_line = next(
        i
        for i, text in enumerate(STUDY.splitlines(), 1)
        if text.endswith("# the bad line") and f'MODE == "{mode}"' in STUDY.splitlines()[i - 2]
    )
    assert line.startswith(f"error: study.py:{bad_line}: "), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("mode", "fragments"),
    [
        ("generator", ["step 'b'", "generator function", "plain function"]),
        ("config_step", ["step 'b'", "ExecutorStep 'a'", "output_path_of("]),
    ],
)
def test_a_bad_step_is_one_error_line_from_executor_main(tmp_path, mode, fragments):
    error_line(run_study(tmp_path, mode), *fragments)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").rglob("*")) == []
