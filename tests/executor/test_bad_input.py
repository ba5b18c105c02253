"""Bad input: one clear error naming the step or field, raised before anything runs.

Every declaration error must surface from `Executor.run` before a step function is
called and before any output directory is created under the prefix. A step function
that raises is the one error that happens *while* running: it must leave the step
FAILED (never SUCCESS) and point at the step's log.
"""

from __future__ import annotations

import itertools
import math
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from executor import (
    Executor,
    ExecutorRunError,
    ExecutorStep,
    InputName,
    StepDefinitionError,
    StoreError,
    versioned,
)
from executor.graph import resolve
from executor.steps import _is_valid_name, _name_problem
from executor.store import LocalStore
from executor.tree import LOG_FILE, Status, read_status

CALLS: list[str] = []
_CALLS_LOCK = threading.Lock()


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()
    yield
    CALLS.clear()


def record(config: Any) -> None:
    """A step function that only records that it was called."""
    with _CALLS_LOCK:
        CALLS.append(getattr(config, "label", "?"))


def explode(config: Any) -> None:
    record(config)
    raise RuntimeError("boom: the step function failed on purpose")


@dataclass(frozen=True)
class Cfg:
    label: str = "?"
    x: Any = versioned(1)
    y: Any = 0
    deps: dict = field(default_factory=dict)


def step(name: str, fn=record, **fields: Any) -> ExecutorStep:
    return ExecutorStep(name=name, fn=fn, config=Cfg(label=name, **fields))


def prefix_of(tmp_path: Path) -> Path:
    return tmp_path / "prefix"


def assert_nothing_ran(prefix: Path) -> None:
    """No step function was called and nothing was written under the prefix."""
    assert CALLS == []
    if prefix.exists():
        assert [p.relative_to(prefix).as_posix() for p in prefix.rglob("*")] == []


def run_expecting(
    tmp_path: Path, steps: list[ExecutorStep], error: type[BaseException], *fragments: str, **run_kwargs: Any
) -> str:
    """Run `steps`, expect `error` whose message contains every fragment; check nothing ran."""
    prefix = prefix_of(tmp_path)
    executor = Executor(str(prefix), console=False)
    with pytest.raises(error) as caught:
        executor.run(steps, **run_kwargs)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in error message:\n{message}"
    assert_nothing_ran(prefix)
    return message


# -- the graph ---------------------------------------------------------------------------


def test_dependency_cycle_is_named(tmp_path):
    a = step("a")
    b = step("b", deps={"a": a})
    a.config.deps["b"] = b  # the only way to build a cycle: mutate a config after creation
    message = run_expecting(tmp_path, [a], StepDefinitionError, "a -> b -> a")
    assert "cycle" in message
    run_expecting(tmp_path, [b], StepDefinitionError, "b -> a -> b")


def test_self_dependency_is_a_cycle(tmp_path):
    a = step("a")
    a.config.deps["me"] = a / "sub"
    run_expecting(tmp_path, [a], StepDefinitionError, "a -> a")


def test_longer_cycle_below_a_root_is_named(tmp_path):
    a = step("a")
    b = step("b", deps={"a": a})
    c = step("c", deps={"b": b.nonblocking()})
    a.config.deps["c"] = c
    root = step("root", deps={"c": c})
    run_expecting(tmp_path, [root], StepDefinitionError, "c -> b -> a -> c")


@pytest.mark.parametrize(
    ("first", "second", "why"),
    [
        pytest.param(
            {"name": "one", "x": versioned(1), "override": "shared"},
            {"name": "two", "x": versioned(2), "override": "shared"},
            "different versions",
            id="same-override-different-versions",
        ),
        pytest.param(  # the versioned field differs: not called "unversioned"
            {"name": "one", "x": versioned(1), "override": "shared"},
            {"name": "two", "x": versioned(2), "override": "shared"},
            "different versions; different config fields: label, x. ",
            id="same-override-different-versions-names-the-field",
        ),
        pytest.param(
            {"name": "same", "y": 1},
            {"name": "same", "y": 2},
            "different unversioned config fields: y",
            id="same-name-and-version-different-unversioned-field",
        ),
        pytest.param(
            {"name": "same"},
            {"name": "same", "fn": explode},
            "different functions",
            id="same-name-and-version-different-function",
        ),
    ],
)
def test_two_different_steps_with_one_output_path(tmp_path, first, second, why):
    steps = []
    for spec in (first, second):
        spec = dict(spec)
        name, override, fn = spec.pop("name"), spec.pop("override", None), spec.pop("fn", record)
        steps.append(ExecutorStep(name, fn, Cfg(label=name, **spec), override_output_path=override))
    prefix = prefix_of(tmp_path)
    path = (
        f"{prefix}/shared" if first.get("override") else resolve([steps[0]], str(prefix)).steps[0].output_path
    )
    run_expecting(
        tmp_path, steps, StepDefinitionError, f"'{first['name']}'", f"'{second['name']}'", path, why
    )


# -- values that cannot be versioned -----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "field_path"),
    [
        pytest.param(versioned(object()), "x", id="object"),
        pytest.param(versioned(float("nan")), "x", id="nan"),
        pytest.param(versioned(math.inf), "x", id="inf"),
        pytest.param(versioned(lambda v: v), "x", id="lambda"),
        pytest.param(versioned({"a": [1, {"b": object()}]}), "x.a[1].b", id="nested-object"),
        pytest.param(versioned({"k": {1, float("nan")}}), "x.k", id="nan-in-set"),
        pytest.param(versioned({(1, 2): "tuple key"}), "x", id="tuple-dict-key"),
    ],
)
def test_unencodable_versioned_value(tmp_path, value, field_path):
    message = run_expecting(tmp_path, [step("s", x=value)], StepDefinitionError, "'s'", f"'{field_path}")
    assert "versioned" in message


def test_input_inside_a_versioned_dict_is_refused(tmp_path):
    up = step("up")
    run_expecting(
        tmp_path, [step("s", x=versioned({"inp": up / "data"}))], StepDefinitionError, "'s'", "x.inp"
    )


@pytest.mark.parametrize(
    ("make_value", "field_path", "kind"),
    [
        pytest.param(lambda up: versioned({"inp": up / "data"}), "x.inp", "InputName", id="step-input"),
        pytest.param(lambda up: versioned([up]), "x[0]", "ExecutorStep", id="step"),
        pytest.param(
            lambda up: versioned({"inp": InputName.hardcoded("raw/x")}),
            "x.inp",
            "InputName",
            id="hardcoded-input",
        ),
        pytest.param(lambda up: versioned([versioned(1)]), "x[0]", "VersionedValue", id="nested-versioned"),
    ],
)
def test_marker_inside_a_versioned_value_is_refused_naming_its_field(tmp_path, make_value, field_path, kind):
    up = step("up")
    message = run_expecting(
        tmp_path, [step("s", x=make_value(up))], StepDefinitionError, "'s'", f"'{field_path}'", kind
    )
    assert ".step." not in message


# -- malformed declarations --------------------------------------------------------------


def test_config_must_be_a_dataclass(tmp_path):
    bad = ExecutorStep("s", record, {"x": 1})
    message = run_expecting(tmp_path, [bad], StepDefinitionError, "'s'", "dict")
    assert "dataclass" in message
    # Also when the bad step is only reachable as an input.
    run_expecting(tmp_path, [step("down", deps={"up": bad})], StepDefinitionError, "'s'", "dataclass")


def test_config_class_instead_of_instance_is_refused(tmp_path):
    run_expecting(tmp_path, [ExecutorStep("s", record, Cfg)], StepDefinitionError, "'s'", "dataclass")


def test_fn_must_be_callable(tmp_path):
    bad = ExecutorStep("s", "not a function", Cfg())
    run_expecting(tmp_path, [bad], StepDefinitionError, "'s'", "callable", "str")
    run_expecting(tmp_path, [step("down", y=bad / "x")], StepDefinitionError, "'s'", "callable")


def test_non_step_in_the_step_list(tmp_path):
    run_expecting(tmp_path, [step("s"), "not a step"], StepDefinitionError, "ExecutorStep", "'not a step'")


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "empty"),
        (".", "'.'"),
        ("..", "'..'"),
        ("a/./b", "'.'"),
        ("../x", "'..'"),
        ("a/../b", "'..'"),
        ("a//b", "'//'"),
        ("/abs", "starts with '/'"),
        ("trailing/", "ends with '/'"),
        ("a b", "' '"),
        ("semi;colon", "';'"),
        ("experiments", "reserved"),
        ("experiments/x", "reserved"),
        ("a/" + "x" * 247, "247 bytes"),  # 247 + '-' + 8 hash digits = 257 > 255
        ("y" * 256 + "/b", "256 bytes"),
    ],
)
def test_invalid_step_name_is_refused_when_the_step_is_built(name, problem):
    with pytest.raises(StepDefinitionError) as caught:
        ExecutorStep(name, record, Cfg())
    message = str(caught.value)
    assert f"step name {name!r} is invalid" in message
    assert problem in message
    assert "e.g. 'tokenized/stdlib'" in message  # the fix


def test_a_step_name_must_be_a_string():
    with pytest.raises(StepDefinitionError, match="step name must be a string, got int 3"):
        ExecutorStep(3, record, Cfg())


@pytest.mark.parametrize("name", ["a", "a.b/c-d_e", "tokenized/stdlib", "experiments_v2", "x/experiments"])
def test_valid_step_names_are_accepted(name):
    assert ExecutorStep(name, record, Cfg()).name == name


def test_the_fast_name_check_agrees_with_the_explained_one():
    # check_step_name accepts with string methods and explains refusals part by part: same verdicts.
    names = ["".join(chars) for k in range(7) for chars in itertools.product("a./-", repeat=k)]
    names += ["experiments", "experiments/x", "experimentsx", "x/experiments", "experiments.v2", "é"]
    names += ["x" * 246, "x" * 247, "a/" + "x" * 246, "a/" + "x" * 247, "y" * 255 + "/b", "y" * 256 + "/b"]
    for name in names:
        assert _is_valid_name(name) == (_name_problem(name) is None), name


def test_the_longest_names_accepted_run_on_local_disk(tmp_path):
    """The limits are the filesystem's: the longest accepted parts make directories that work."""
    longest = step("y" * 255 + "/" + "x" * 246)
    Executor(str(prefix_of(tmp_path)), console=False).run([longest])
    output = resolve([longest], str(prefix_of(tmp_path))).steps[0].output_path
    assert len(output.rsplit("/", 1)[-1]) == 255
    assert read_status(LocalStore(), output)[-1].status == Status.SUCCESS


def _dirname(tmp_path: Path, s: ExecutorStep) -> str:
    return resolve([s], str(prefix_of(tmp_path))).steps[0].output_path.rsplit("/", 1)[-1]


def test_a_step_named_into_another_steps_output_is_refused(tmp_path):
    outer = step("a")
    inner = step(f"{_dirname(tmp_path, outer)}/b")
    message = run_expecting(tmp_path, [outer, inner], StepDefinitionError, repr(inner.name), "'a'")
    assert "inside the output of step 'a'" in message and "Rename" in message


def test_an_override_into_another_steps_output_is_refused(tmp_path):
    outer = step("a")
    inner = ExecutorStep("b", record, Cfg(label="b"), override_output_path=f"{_dirname(tmp_path, outer)}/sub")
    run_expecting(tmp_path, [inner, outer], StepDefinitionError, "'b'", "inside the output of step 'a'")


def test_an_override_around_other_steps_outputs_is_refused(tmp_path):
    outer = ExecutorStep("outer", record, Cfg(label="outer"), override_output_path="data")
    inner = step("data/inner")
    run_expecting(
        tmp_path, [outer, inner], StepDefinitionError, "'data/inner'", "inside the output of step 'outer'"
    )


@pytest.mark.parametrize("override", ["experiments", "experiments/x", "PREFIX"])
def test_an_override_onto_the_experiment_manifests_is_refused(tmp_path, override):
    override = str(prefix_of(tmp_path)) if override == "PREFIX" else override
    bad = ExecutorStep("s", record, Cfg(), override_output_path=override)
    run_expecting(
        tmp_path, [bad], StepDefinitionError, "'s'", f"{prefix_of(tmp_path)}/experiments/", "manifests"
    )


@pytest.mark.parametrize("override", ["", "/", "../escape", "./x", "a/./b", "a//b", "a/.."])
def test_invalid_override_output_path(tmp_path, override):
    bad = ExecutorStep("s", record, Cfg(), override_output_path=override)
    # resolve() only: running such a step would write outside the test's directory.
    with pytest.raises(StepDefinitionError, match="'s'"):
        resolve([bad], str(prefix_of(tmp_path)))


# -- run options -------------------------------------------------------------------------


@pytest.mark.parametrize("run_only", ["(", ["alpha", "(["]])
def test_invalid_run_only_regex(tmp_path, run_only):
    pattern = run_only if isinstance(run_only, str) else run_only[-1]
    run_expecting(
        tmp_path, [step("alpha"), step("beta")], ValueError, repr(pattern), "run_only", run_only=run_only
    )


def test_run_only_matching_no_step_warns_and_runs_nothing(tmp_path, caplog):
    prefix = str(tmp_path / "out")
    with caplog.at_level("WARNING", logger="executor.plan"):
        plan = Executor(prefix, console=False).run([step("alpha"), step("beta")], run_only=["gamma"])
    assert list(plan.rows) == [] and not os.path.exists(os.path.join(prefix, "alpha"))
    assert any(
        "'gamma' matches no step; the steps are: alpha, beta" in r.getMessage() for r in caplog.records
    )


@pytest.mark.parametrize("max_concurrent", [0, -1])
def test_max_concurrent_must_be_positive(tmp_path, max_concurrent):
    run_expecting(
        tmp_path,
        [step("s")],
        ValueError,
        "max_concurrent",
        str(max_concurrent),
        max_concurrent=max_concurrent,
    )


# -- unusable prefixes -------------------------------------------------------------------


def test_prefix_under_a_regular_file(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("I am a file")
    prefix = blocker / "out"
    executor = Executor(str(prefix), console=False)
    with pytest.raises(StoreError) as caught:
        executor.run([step("s")])
    assert str(prefix) in str(caught.value)
    assert CALLS == []
    assert blocker.read_text() == "I am a file"


def test_read_only_prefix(tmp_path):
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(stat.S_IRUSR | stat.S_IXUSR)  # 0o500
    try:
        if os.access(readonly, os.W_OK):  # root ignores the mode bits: use a place nobody can write
            prefix = "/proc/executor-read-only-test/out"
        else:
            prefix = str(readonly / "out")
        executor = Executor(prefix, console=False)
        with pytest.raises(StoreError) as caught:
            executor.run([step("s")])
        assert prefix in str(caught.value)
        assert CALLS == []
        assert list(readonly.iterdir()) == []
    finally:
        readonly.chmod(stat.S_IRWXU)


# -- a step function that raises ---------------------------------------------------------


def test_failing_step_is_marked_failed_and_reported_with_its_log(tmp_path):
    prefix = prefix_of(tmp_path)
    bad = step("bad", fn=explode)
    down = step("down", deps={"in": bad})
    good = step("good")
    executor = Executor(str(prefix), console=False)
    with pytest.raises(ExecutorRunError) as caught:
        executor.run([down, good])

    bad_path, down_path = executor.output_paths[bad], executor.output_paths[down]
    log = f"{bad_path}/{LOG_FILE}"
    message = str(caught.value)
    assert "bad" in message
    assert log in message
    assert "RuntimeError: boom" in message
    assert [f.name for f in caught.value.failures if f.output_path == bad_path] == ["bad"]

    store = LocalStore()
    events = read_status(store, bad_path)
    assert events, "the failed step has no status file"
    assert events[-1].status == Status.FAILED
    assert Status.SUCCESS not in [event.status for event in events]
    assert "boom" in (events[-1].message or "")

    text = Path(log).read_text()
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: boom: the step function failed on purpose" in text
    assert "explode" in text

    # The dependent step never ran and is not successful; the independent one ran.
    assert sorted(CALLS) == ["bad", "good"]
    assert Status.SUCCESS not in [event.status for event in read_status(store, down_path)]
    assert read_status(store, executor.output_paths[good])[-1].status == Status.SUCCESS


# -- values the hash cannot encode, paths on another storage (ninth session's red team) ----------
@pytest.mark.parametrize(
    ("value", "reason"),
    [(10**5000, "Exceeds the limit (4300 digits)"), ("text \ud800", "surrogates not allowed")],
    ids=["int-of-5001-digits", "lone-surrogate"],
)
def test_a_versioned_value_that_cannot_be_encoded_is_refused_naming_the_step_and_field(
    tmp_path, value, reason
):
    bad = step("enc/bad", x=versioned(1), deps={"inner": versioned(value)})
    message = run_expecting(
        tmp_path,
        [step("enc/fine"), bad],
        StepDefinitionError,
        "step 'enc/bad': versioned field 'deps.inner' cannot be encoded for hashing",
        reason,
        "Version a value that can be written as JSON text",
    )
    assert "enc/fine" not in message


@pytest.mark.parametrize("override", ["foo://bar", "s3://bucket/out", "memory://x"])
def test_an_override_output_path_on_another_storage_is_refused(tmp_path, override):
    run_expecting(
        tmp_path,
        [step("moved").with_output_path(override)],
        StepDefinitionError,
        f"step 'moved': override_output_path {override!r} is on {override.split('://')[0]}://",
        "not on the prefix's storage",
    )


def test_an_override_output_path_on_the_prefix_storage_is_accepted(tmp_path):
    prefix = prefix_of(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    here, relative = (
        step("here").with_output_path(f"file://{elsewhere}"),
        step("rel").with_output_path("rel/out"),
    )
    Executor(str(prefix), console=False).run([here, relative])
    assert sorted(CALLS) == ["here", "rel"]
    assert read_status(LocalStore(), f"file://{elsewhere}")[-1].status == Status.SUCCESS
    assert read_status(LocalStore(), f"{prefix}/rel/out")[-1].status == Status.SUCCESS


def test_an_executor_with_manifests_on_another_storage_is_refused(tmp_path):
    with pytest.raises(
        ValueError, match=r"executor_info_base_path 'foo://y' is on foo://, not on the prefix"
    ):
        Executor(str(prefix_of(tmp_path)), "foo://y", console=False)
    assert not (Path.cwd() / "foo:").exists()
    Executor(str(prefix_of(tmp_path)), str(tmp_path / "manifests"), console=False)  # same storage: fine
