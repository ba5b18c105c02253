"""The hashing rules: what enters a step's version and what does not.

One test per rule, in "same version / different version" style. A version is computed by
resolving a one-step (or small) experiment with `executor.graph.resolve`; no step runs.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from executor import (
    HASH_LENGTH,
    THIS_OUTPUT_PATH,
    Executor,
    ExecutorStep,
    InputName,
    VersionedValue,
    ensure_versioned,
    output_path_of,
    this_output_path,
    versioned,
)
from executor.graph import ResolvedStep, StepDefinitionError, resolve

REPO_ROOT = Path(__file__).resolve().parents[2]
PREFIX = "/prefix"


def noop(config: Any) -> None:
    pass


def other_noop(config: Any) -> None:
    pass


@dataclass(frozen=True)
class Cfg:
    """A catch-all config: `x` is versioned by default, `y` is a plain (unversioned) field."""

    x: Any = versioned(1)
    y: Any = 0
    z: Any = None


@dataclass(frozen=True)
class Inner:
    depth: Any = versioned(3)
    width: Any = versioned(4)
    note: Any = "unversioned"


@dataclass(frozen=True)
class Outer:
    inner: Any = dataclasses.field(default_factory=Inner)
    other: Any = dataclasses.field(default_factory=Inner)


def step_of(name: str = "s", fn=noop, **fields: Any) -> ExecutorStep:
    return ExecutorStep(name=name, fn=fn, config=Cfg(**fields))


def resolved(step: ExecutorStep, prefix: str = PREFIX) -> ResolvedStep:
    return resolve([step], prefix).resolved(step)


def version_of(name: str = "s", fn=noop, **fields: Any) -> str:
    """Version hash of a one-step experiment with config `Cfg(**fields)`."""
    return resolved(step_of(name, fn, **fields)).version_hash


def assert_same_version(changed: dict, baseline: dict | None = None) -> None:
    """`changed` and `baseline` are keyword arguments of `version_of` (baseline: defaults)."""
    assert version_of(**changed) == version_of(**(baseline or {}))


def assert_diff_version(changed: dict, baseline: dict | None = None) -> None:
    assert version_of(**changed) != version_of(**(baseline or {}))


# -- versioned and unversioned fields ----------------------------------------------------


def test_unversioned_field_change_keeps_version():
    assert_same_version({"y": 12345})
    assert_same_version({"y": "anything", "z": [1, 2, 3]})


def test_versioned_field_change_changes_version():
    assert_same_version({"x": versioned(1)})  # an equal value built again
    assert_diff_version({"x": versioned(2)})
    assert_diff_version({"y": versioned(0)})  # a plain field becomes versioned


def test_step_name_enters_version():
    assert_diff_version({"name": "t"})
    assert_diff_version({"name": "group/s"})


def test_step_function_does_not_enter_version():
    assert_same_version({"fn": other_noop})
    assert_same_version({"fn": lambda config: None})


def test_versioned_values_deep_inside_nested_configs_count_under_their_dotted_path():
    step = ExecutorStep("s", noop, Cfg(x=None, z=Outer()))
    version = resolved(step).version
    assert version["config"] == {
        "z.inner.depth": 3,
        "z.inner.width": 4,
        "z.other.depth": 3,
        "z.other.width": 4,
    }
    base = {"x": None, "z": Outer()}
    assert_diff_version({"x": None, "z": Outer(inner=Inner(depth=versioned(5)))}, base)
    assert_same_version({"x": None, "z": Outer(inner=Inner(note="changed"))}, base)
    # Containers are walked too: list items and dict values.
    assert_diff_version({"z": [Inner(depth=versioned(5))]}, {"z": [Inner()]})
    assert_diff_version({"z": {"k": Inner(depth=versioned(5))}}, {"z": {"k": Inner()}})
    assert_same_version({"z": {"k": Inner(note="other")}}, {"z": {"k": Inner()}})


def test_moving_a_versioned_value_to_another_field_path_changes_version():
    assert_diff_version({"x": None, "y": versioned(1)}, {"x": versioned(1)})
    assert_diff_version(
        {"x": None, "z": Outer(inner=Inner(depth=versioned(4), width=versioned(3)))},
        {"x": None, "z": Outer()},
    )
    assert_diff_version(
        {"x": None, "z": Outer(other=Inner(depth=versioned(9)))},
        {"x": None, "z": Outer(inner=Inner(depth=versioned(9)))},
    )
    assert_diff_version({"x": [0, versioned(1)]}, {"x": [versioned(1), 0]})


def test_versioned_values_whose_dict_keys_print_alike_are_refused():
    # 1 and "1" (or "a.b" and a nested a -> b) would share one field path, and one value would
    # silently drop out of the version; refuse instead.
    for colliding in (
        {1: versioned("a"), "1": versioned("b")},
        {"a.b": versioned(1), "a": {"b": versioned(2)}},
    ):
        with pytest.raises(StepDefinitionError, match="map to the field path"):
            version_of(x=colliding)


# -- encoding of values ------------------------------------------------------------------


def test_int_and_float_differ():
    assert_diff_version({"x": versioned(1.0)}, {"x": versioned(1)})
    assert_diff_version({"x": versioned(True)}, {"x": versioned(1)})
    assert_same_version({"x": versioned(0.1 + 0.2)}, {"x": versioned(0.30000000000000004)})


def test_list_and_tuple_encode_the_same():
    assert_same_version({"x": versioned((1, 2, 3))}, {"x": versioned([1, 2, 3])})
    assert_same_version({"x": versioned({"a": (1, (2, 3))})}, {"x": versioned({"a": [1, [2, 3]]})})
    assert_diff_version({"x": versioned([3, 2, 1])}, {"x": versioned([1, 2, 3])})  # order of a list counts


def test_dict_key_order_does_not_matter():
    assert_same_version({"x": versioned({"b": 2, "a": 1})}, {"x": versioned({"a": 1, "b": 2})})
    assert_same_version({"x": versioned({"o": {"d": 1, "c": 2}})}, {"x": versioned({"o": {"c": 2, "d": 1}})})
    assert_diff_version({"x": versioned({"a": 1, "b": 3})}, {"x": versioned({"a": 1, "b": 2})})


def test_set_order_does_not_matter():
    first, second = {1, 9}, {9, 1}  # 1 and 9 collide in a small set table: iteration follows insertion
    assert list(first) != list(second), "precondition: the two sets iterate in different orders"
    assert_same_version({"x": versioned(second)}, {"x": versioned(first)})
    assert_same_version({"x": versioned(frozenset(second))}, {"x": versioned(first)})
    assert_same_version({"x": versioned({"b", "a", "c"})}, {"x": versioned({"c", "a", "b"})})
    assert_diff_version({"x": versioned({1, 10})}, {"x": versioned(first)})


@dataclass(frozen=True)
class ModelA:
    hidden: int = 64
    layers: int = 2


@dataclass(frozen=True)
class ModelB:
    hidden: int = 64
    layers: int = 2


def test_versioned_dataclass_values_include_their_class():
    assert_same_version({"x": versioned(ModelA())}, {"x": versioned(ModelA(hidden=64, layers=2))})
    assert_diff_version({"x": versioned(ModelB())}, {"x": versioned(ModelA())})
    assert_diff_version({"x": versioned(ModelA(layers=3))}, {"x": versioned(ModelA())})
    # A versioned dataclass counts whole, under its own field path.
    assert resolved(step_of(x=versioned(ModelA()))).version["config"] == {
        "x": {"__type__": "ModelA", "hidden": 64, "layers": 2}
    }


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Shade(enum.Enum):
    RED = 1


class Mode(enum.StrEnum):
    FAST = "fast"


def test_enums_and_paths_are_encodable_and_deterministic():
    assert_same_version({"x": versioned(Color.RED)}, {"x": versioned(Color.RED)})
    assert_diff_version({"x": versioned(Color.BLUE)}, {"x": versioned(Color.RED)})
    assert_diff_version({"x": versioned(Shade.RED)}, {"x": versioned(Color.RED)})  # same member, other enum
    assert_diff_version({"x": versioned(1)}, {"x": versioned(Color.RED)})  # not its value
    assert resolved(step_of(x=versioned(Color.RED))).version["config"] == {"x": "Color.RED"}
    assert_same_version({"x": versioned({Color.RED: 1})}, {"x": versioned({Color.RED: 1})})

    assert_same_version({"x": versioned(Path("data/train"))}, {"x": versioned(Path("data/train"))})
    assert_same_version({"x": versioned(PurePosixPath("data/train"))}, {"x": versioned(Path("data/train"))})
    assert_diff_version({"x": versioned(Path("data/test"))}, {"x": versioned(Path("data/train"))})
    assert resolved(step_of(x=versioned(Path("data/train")))).version["config"] == {"x": "data/train"}


def test_str_and_int_enums_encode_as_their_values_as_in_marin():
    """Marin's version JSON writes a str/int-mixin member as its value (json.dumps does), so a
    field that moves from "fast" to Mode.FAST keeps its version; plain enums keep the member name."""
    assert_same_version({"x": versioned("fast")}, {"x": versioned(Mode.FAST)})
    assert resolved(step_of(x=versioned(Mode.FAST))).version["config"] == {"x": "fast"}
    assert_same_version({"x": versioned({"fast": 1})}, {"x": versioned({Mode.FAST: 1})})
    assert_diff_version({"x": versioned(Mode.FAST)}, {"x": versioned("slow")})


# -- inputs ------------------------------------------------------------------------------


def chain(a_x: Any = None, a_y: Any = 0) -> tuple[ExecutorStep, ExecutorStep, ExecutorStep]:
    a = ExecutorStep("a", noop, Cfg(x=versioned(1) if a_x is None else a_x, y=a_y))
    b = ExecutorStep("b", noop, Cfg(x=versioned("b"), z=a / "data"))
    c = ExecutorStep("c", noop, Cfg(x=versioned("c"), z=b))
    return a, b, c


def chain_hashes(**kwargs: Any) -> tuple[str, str, str]:
    a, b, c = chain(**kwargs)
    graph = resolve([c], PREFIX)
    return tuple(graph.resolved(step).version_hash for step in (a, b, c))


def test_upstream_versioned_change_changes_downstream_versions_transitively():
    base = chain_hashes()
    changed = chain_hashes(a_x=versioned(2))
    assert all(old != new for old, new in zip(base, changed, strict=True))


def test_upstream_unversioned_change_keeps_downstream_versions():
    assert chain_hashes(a_y=999) == chain_hashes()


def test_input_sub_path_enters_version():
    up = step_of("up")
    assert version_of(z=up / "a") != version_of(z=up / "b")
    assert version_of(z=up / "a") != version_of(z=up)
    assert version_of(z=up / "a" / "b") == version_of(z=up / "a/b")


def test_input_spellings_are_equivalent():
    up = step_of("up")
    spellings = [up.cd("x"), up / "x", output_path_of(up, "x"), InputName(up, "x")]
    steps = [step_of("down", z=spelling) for spelling in spellings]
    graph = resolve(steps, PREFIX)
    results = [graph.resolved(step) for step in steps]
    assert len({r.version_hash for r in results}) == 1
    assert len({r.config.z for r in results}) == 1
    assert results[0].config.z == graph.resolved(up).output_path + "/x"
    # The whole output: the step itself, output_path_of(step) and InputName(step, None).
    whole = [
        step_of("down", z=up),
        step_of("down", z=output_path_of(up)),
        step_of("down", z=InputName(up, None)),
    ]
    graph = resolve(whole, PREFIX)
    assert len({graph.resolved(step).version_hash for step in whole}) == 1
    assert {graph.resolved(step).config.z for step in whole} == {graph.resolved(up).output_path}


def test_input_counts_by_its_producer_version_not_its_location():
    plain = step_of("up")
    moved = step_of("up").with_output_path("/elsewhere/up")
    down_plain, down_moved = step_of("down", z=plain), step_of("down", z=moved)
    r_plain, r_moved = resolved(down_plain), resolved(down_moved)
    assert r_plain.version_hash == r_moved.version_hash
    assert r_plain.config.z == resolved(plain).output_path
    assert r_moved.config.z == "/elsewhere/up"


def test_nonblocking_input_has_the_same_version_as_a_blocking_one():
    up = step_of("up")
    blocking = step_of("down", z=up / "x")
    nonblocking = step_of("down", z=(up / "x").nonblocking())
    graph_b, graph_n = resolve([blocking], PREFIX), resolve([nonblocking], PREFIX)
    rb, rn = graph_b.resolved(blocking), graph_n.resolved(nonblocking)
    assert rb.version_hash == rn.version_hash
    assert rb.output_path == rn.output_path
    up_path = graph_n.resolved(up).output_path
    assert rn.nonblocking_deps == (up_path,)
    assert rn.blocking_deps == ()
    assert rb.blocking_deps == (up_path,)
    assert rb.nonblocking_deps == ()
    assert rn.config.z == up_path + "/x"
    assert version_of(z=up.nonblocking()) == version_of(z=up)
    # Used both ways, the step waits for it.
    both = ExecutorStep("both", noop, Cfg(y=up.nonblocking(), z=up / "x"))
    rboth = resolve([both], PREFIX).resolved(both)
    assert rboth.blocking_deps == (up_path,)
    assert rboth.nonblocking_deps == ()


def test_hardcoded_inputs_enter_version_by_their_written_path():
    relative = step_of(z=InputName.hardcoded("raw/x"))
    absolute = step_of(z=InputName.hardcoded("/data/raw/x"))
    url = step_of(z=InputName.hardcoded("gs://bucket/raw/x"))
    r_rel, r_abs, r_url = (resolved(step, "/p1") for step in (relative, absolute, url))
    assert r_rel.version["config"]["z"] == "raw/x"
    assert r_abs.version["config"]["z"] == "/data/raw/x"
    assert r_url.version["config"]["z"] == "gs://bucket/raw/x"
    assert len({r_rel.version_hash, r_abs.version_hash, r_url.version_hash}) == 3
    assert version_of(z=InputName.hardcoded("raw/y")) != r_rel.version_hash
    assert r_rel.dependencies == ()
    # Relative: under the prefix in the concrete config, but the version ignores the prefix.
    assert r_rel.config.z == "/p1/raw/x"
    r_rel2 = resolved(step_of(z=InputName.hardcoded("raw/x")), "memory://p2")
    assert r_rel2.config.z == "memory://p2/raw/x"
    assert r_rel2.version_hash == r_rel.version_hash
    # Absolute: as written.
    assert r_abs.config.z == "/data/raw/x"
    assert r_url.config.z == "gs://bucket/raw/x"
    assert resolved(step_of(z=InputName.hardcoded("raw") / "x"), "/p1").config.z == "/p1/raw/x"


# -- the prefix, collapsing, concrete configs --------------------------------------------


def experiment() -> list[ExecutorStep]:
    raw = ExecutorStep("raw", noop, Cfg(x=versioned("v1"), z=InputName.hardcoded("inputs/raw")))
    tok = ExecutorStep("tokenized/raw", noop, Cfg(x=versioned({"tokenizer": "gpt2"}), z=raw / "data"))
    train = ExecutorStep("train", noop, Cfg(x=versioned(ModelA()), y=tok.nonblocking(), z=tok))
    return [raw, tok, train]


def test_versions_do_not_depend_on_the_prefix(tmp_path):
    prefixes = [str(tmp_path), "memory://other"]
    graphs = [resolve(experiment(), prefix) for prefix in prefixes]
    first, second = (list(graph.steps) for graph in graphs)
    assert [s.name for s in first] == [s.name for s in second] == ["raw", "tokenized/raw", "train"]
    for a, b in zip(first, second, strict=True):
        assert a.version == b.version
        assert a.version_hash == b.version_hash
        assert a.output_path.startswith(prefixes[0] + "/")
        assert b.output_path.startswith(prefixes[1] + "/")
        assert a.output_path[len(prefixes[0]) :] == b.output_path[len(prefixes[1]) :]
        assert [d[len(prefixes[0]) :] for d in a.dependencies] == [
            d[len(prefixes[1]) :] for d in b.dependencies
        ]


def test_identical_steps_collapse_into_one():
    first = ExecutorStep("s", noop, Cfg(x=versioned([1, 2]), y={"workers": 4}))
    second = ExecutorStep("s", noop, Cfg(x=versioned([1, 2]), y={"workers": 4}))
    down1 = ExecutorStep("down", noop, Cfg(z=first / "f"))
    down2 = ExecutorStep("down", noop, Cfg(z=second / "f"))
    other = ExecutorStep("other", noop, Cfg(y=first, z=second))
    graph = resolve([down1, down2, other], PREFIX)
    assert graph.resolved(first) is graph.resolved(second)
    assert graph.resolved(down1) is graph.resolved(down2)
    assert [s.name for s in graph.steps] == ["s", "down", "other"]
    assert graph.resolved(down1).config.z == graph.resolved(first).output_path + "/f"
    r_other = graph.resolved(other)
    assert r_other.config.y == r_other.config.z == graph.resolved(first).output_path
    assert r_other.dependencies == (graph.resolved(first).output_path,)


@dataclass(frozen=True)
class FullCfg:
    out: Any = THIS_OUTPUT_PATH
    out_fn: Any = dataclasses.field(default_factory=this_output_path)
    out_sub: Any = dataclasses.field(default_factory=lambda: this_output_path("sub/file.txt"))
    outs: Any = dataclasses.field(
        default_factory=lambda: [this_output_path("a"), {"b": this_output_path("b")}]
    )
    lr: Any = versioned(0.1)
    model: Any = versioned(ModelA())
    nested: Any = dataclasses.field(default_factory=Inner)
    data: Any = None
    raw: Any = dataclasses.field(default_factory=lambda: InputName.hardcoded("raw/x"))
    plain: Any = 7


def test_concrete_config_has_every_placeholder_filled_in():
    up = step_of("up")
    step = ExecutorStep("s", noop, FullCfg(data=[up / "train", {"val": up.cd("val")}]))
    graph = resolve([step], PREFIX)
    r = graph.resolved(step)
    out, up_out = r.output_path, graph.resolved(up).output_path
    assert r.config == FullCfg(
        out=out,
        out_fn=out,
        out_sub=out + "/sub/file.txt",
        outs=[out + "/a", {"b": out + "/b"}],
        lr=0.1,
        model=ModelA(),
        nested=Inner(depth=3, width=4, note="unversioned"),
        data=[up_out + "/train", {"val": up_out + "/val"}],
        raw=PREFIX + "/raw/x",
        plain=7,
    )
    assert type(r.config) is FullCfg
    # The output path is not part of the version (it is derived from it).
    assert "out" not in r.version["config"]
    assert step.config.out is THIS_OUTPUT_PATH  # the declaration is left as it was


def test_versioned_refuses_to_wrap_versioned_values_and_inputs():
    with pytest.raises(ValueError, match="already versioned"):
        versioned(versioned(1))
    up = step_of("up")
    for marker in (InputName(up, "x"), up / "x", InputName.hardcoded("raw/x"), up, THIS_OUTPUT_PATH):
        with pytest.raises(ValueError):
            versioned(marker)


def test_ensure_versioned_wraps_only_plain_values():
    already = versioned(3)
    assert ensure_versioned(already) is already
    wrapped = ensure_versioned(3)
    assert isinstance(wrapped, VersionedValue)
    assert wrapped.value == 3
    assert_same_version({"x": ensure_versioned(1)})


# -- output paths ------------------------------------------------------------------------


def expected_hash(version: dict) -> str:
    return hashlib.sha256(json.dumps(version, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_output_path_is_prefix_name_and_short_hash():
    for name in ("s", "tokenized/stdlib", "a/b/c.d_e-f"):
        step = step_of(name, x=versioned({"k": [1, 2.5, "t"]}))
        r = resolved(step, "memory://bucket/root")
        assert r.version == {"name": name, "config": {"x": {"k": [1, 2.5, "t"]}}, "dependencies": []}
        assert r.version_hash == expected_hash(r.version)
        assert len(r.version_hash) == 64
        assert r.output_path == f"memory://bucket/root/{name}-{r.version_hash[:HASH_LENGTH]}"
    assert HASH_LENGTH == 8


def test_override_output_path_relative_is_under_the_prefix_absolute_is_kept(caplog):
    relative = step_of().with_output_path("custom/place")
    absolute = step_of().with_output_path("/abs/place/")
    url = step_of().with_output_path("gs://bucket/place")
    with caplog.at_level(logging.WARNING):
        assert resolved(relative, "/p").output_path == "/p/custom/place"
        assert resolved(absolute, "/p").output_path == "/abs/place"
        assert resolved(url, "gs://other/p").output_path == "gs://bucket/place"
    # On another storage than the prefix it is refused: every write goes through the prefix's.
    with pytest.raises(StepDefinitionError, match="is on gs://, not on the prefix's storage"):
        resolved(url, "/p")
    # The override does not change the version.
    assert resolved(relative).version_hash == version_of()


def test_override_output_path_warns_only_when_it_differs_from_the_default(caplog):
    default = resolved(step_of(), "/p").output_path
    with caplog.at_level(logging.WARNING):
        resolved(step_of().with_output_path(default), "/p")
        resolved(step_of().with_output_path(default.removeprefix("/p/")), "/p")
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]

    with caplog.at_level(logging.WARNING):
        resolved(step_of().with_output_path("custom/place"), "/p")
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "'s'" in warnings[0]
    assert "/p/custom/place" in warnings[0]
    assert default in warnings[0]


def test_executor_makes_relative_local_prefixes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for prefix in ("out", "./out/", "file://out"):
        executor = Executor(prefix, console=False)
        assert executor.prefix == str(tmp_path / "out")
    executor = Executor("out", console=False)
    step = step_of()
    executor.run([step], dry_run=True)
    assert executor.output_paths[step] == f"{tmp_path}/out/s-{version_of()[:HASH_LENGTH]}"
    assert executor.configs[step].x == 1


# -- stability across processes ----------------------------------------------------------

PROBE_MODULE = textwrap.dedent(
    """
    import enum
    from dataclasses import dataclass, field
    from pathlib import Path
    from typing import Any

    from executor import ExecutorStep, InputName, versioned
    from executor.graph import resolve


    class Kind(enum.Enum):
        BIG = "big"


    @dataclass(frozen=True)
    class Model:
        hidden: int = 128
        dropout: float = 0.1


    @dataclass(frozen=True)
    class ProbeCfg:
        model: Any = versioned(Model())
        tags: Any = versioned(frozenset({"alpha", "beta", "gamma", "delta", "epsilon"}))
        weights: Any = versioned({"web": 0.7, "code": 0.2, "math": 0.1})
        kind: Any = versioned(Kind.BIG)
        path: Any = versioned(Path("data/train"))
        data: Any = None
        workers: int = 8


    def fn(config):
        pass


    def probe_hashes(prefix):
        up = ExecutorStep("up", fn, ProbeCfg(data=InputName.hardcoded("raw/x")))
        down = ExecutorStep("down/step", fn, ProbeCfg(data=up / "tokens", tags=versioned({"x", "y", "z", "w"})))
        graph = resolve([down], prefix)
        return [graph.resolved(step).version_hash for step in (up, down)]
    """
)


def test_version_hash_is_stable_across_processes(tmp_path, monkeypatch):
    (tmp_path / "versioning_probe_cfg.py").write_text(PROBE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import versioning_probe_cfg

    in_process = versioning_probe_cfg.probe_hashes("/here")
    code = "import versioning_probe_cfg as m; print(' '.join(m.probe_hashes('memory://there')))"
    for seed in ("1", "2"):  # string hashing (hence set iteration order) differs between these
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)]),
            "PYTHONHASHSEED": seed,
        }
        result = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == in_process
