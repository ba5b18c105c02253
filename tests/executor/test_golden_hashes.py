"""Golden version hashes: any change to the canonical encoding changes an output path.

The hashing-rule tests (test_versioning.py) compare two versions computed by the same
code, so a change that moves *every* hash at once (a new separator, `ensure_ascii`,
floats printed differently, a renamed `__type__` tag) passes them all -- and silently
orphans every output ever written. These tests pin the hashes of fixed configs to
literal values computed once. If one fails, the encoding changed: that is a breaking
change to every existing output tree, to be made on purpose (and announced), never by
accident.

The configs cover what the encoder accepts: non-ASCII text, nested dataclasses, enums
(plain and str), pure paths, tuples and lists, sets, bytes, dicts with str and int keys,
floats (-0.0, 1e-300, 0.1), ints beyond 64 bits, None, bools, inputs (blocking,
nonblocking, hard-coded) and sub-paths.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import PurePosixPath
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from executor import ExecutorStep, InputName, StepDefinitionError, output_path_of, this_output_path, versioned
from executor.fingerprint import canonical_json, encode, sha256_hex
from executor.graph import resolve


class Color(enum.Enum):
    RED = 1
    GREEN = "green"


class Mode(enum.StrEnum):
    FAST = "fast"


class Level(enum.IntEnum):
    HIGH = 3


class Shape(str, enum.Enum):  # noqa: UP042 -- a str mixin on purpose, not a StrEnum
    """A str mixin whose `__str__` says something else: the value is what is encoded."""

    ROUND = "round"

    def __str__(self) -> str:
        return "Shape: round"


@dataclass(frozen=True)
class Leaf:
    label: str = "feuille"
    weight: float = 0.5


@dataclass(frozen=True)
class Branch:
    leaf: Leaf = field(default_factory=Leaf)
    leaves: tuple = (Leaf("a", 1.0), Leaf("b", -2.5))
    color: Color = Color.GREEN


@dataclass(frozen=True)
class GoldenConfig:
    output_path: Any = this_output_path()
    text: Any = None
    numbers: Any = None
    nested: Any = None
    misc: Any = None
    data: Any = None
    other: Any = None
    workers: int = 4


def noop(config: Any) -> None:
    pass


def golden_steps() -> dict[str, ExecutorStep]:
    raw = ExecutorStep(
        "raw/texts",
        noop,
        GoldenConfig(
            text=versioned('héllo wörld ☃ 日本語 \u00e9\u0301 "quoted" \\ back\nslash\ttab'),
            data=InputName.hardcoded("gs://bucket/raw/ünïcode"),
        ),
    )
    numbers = ExecutorStep(
        "numbers",
        noop,
        GoldenConfig(
            numbers=versioned(
                {
                    "neg_zero": -0.0,
                    "tiny": 1e-300,
                    "tenth": 0.1,
                    "third": 1 / 3,
                    "big": 2**100,
                    "neg_big": -(2**70) + 1,
                    "int": 7,
                    "float_seven": 7.0,
                    "true": True,
                    "false": False,
                    "none": None,
                }
            ),
            data=raw,
        ),
    )
    nested = ExecutorStep(
        "nested/deep",
        noop,
        GoldenConfig(
            nested=versioned(Branch()),
            misc=versioned(
                {
                    "path": PurePosixPath("/data/ü/x.txt"),
                    "tuple": (1, "two", (3.0, None)),
                    "list": [True, [], {}],
                    "set": frozenset({"b", "a", "ç"}),
                    "bytes": b"\x00\xff raw",
                    "enum": Color.RED,
                    "str_enum": Mode.FAST,
                    1: "int key",
                    "z": {"y": {"x": "deep"}},
                }
            ),
            data=output_path_of(numbers, "sub/dir"),
            other=raw.nonblocking(),
        ),
    )
    return {"raw": raw, "numbers": numbers, "nested": nested}


# Computed once at commit 2466a56 and written down literally. Do not update these to make
# a failing test pass unless the encoding change is deliberate (see the module docstring).
GOLDEN_HASHES = {
    "raw": "49062f7a9ac097a6fa158ecb1477bb92d93925eb731c559b80ff10073cd349a1",
    "numbers": "3f748a9b78fbf6ab577a4dd4efda8df981307e7799e5a1820c9bd8cf0b113c42",
    # Changed deliberately (issue 12): a StrEnum member now encodes as its value, as in Marin.
    "nested": "221b0b4cec979dd4e6b3e585ae6e5bf829e94a2f8f7918d888835b06636a1bc4",
}

GOLDEN_PATHS = {
    "raw": "/golden/prefix/raw/texts-49062f7a",
    "numbers": "/golden/prefix/numbers-3f748a9b",
    "nested": "/golden/prefix/nested/deep-221b0b4c",
}

GOLDEN_NUMBERS_JSON = (
    '{"config":{"data":"DEP[0]","numbers":{"big":1267650600228229401496703205376,"false":false,'
    '"float_seven":7.0,"int":7,"neg_big":-1180591620717411303423,"neg_zero":-0.0,"none":null,'
    '"tenth":0.1,"third":0.3333333333333333,"tiny":1e-300,"true":true}},'
    '"dependencies":["49062f7a9ac097a6fa158ecb1477bb92d93925eb731c559b80ff10073cd349a1"],"name":"numbers"}'
)


@pytest.fixture(scope="module")
def graph():
    steps = golden_steps()
    return steps, resolve([steps["nested"]], "/golden/prefix")


@pytest.mark.parametrize("key", sorted(GOLDEN_HASHES))
def test_version_hashes_of_fixed_configs_never_change(graph, key):
    steps, resolved = graph
    assert resolved.resolved(steps[key]).version_hash == GOLDEN_HASHES[key]


@pytest.mark.parametrize("key", sorted(GOLDEN_PATHS))
def test_output_paths_of_fixed_configs_never_change(graph, key):
    steps, resolved = graph
    assert resolved.resolved(steps[key]).output_path == GOLDEN_PATHS[key]


def test_the_canonical_json_of_a_version_is_exactly_this(graph):
    steps, resolved = graph
    version = resolved.resolved(steps["numbers"]).version
    text = canonical_json(version)
    assert text == GOLDEN_NUMBERS_JSON
    assert sha256_hex(text) == GOLDEN_HASHES["numbers"]


def test_the_golden_hashes_do_not_depend_on_the_prefix():
    steps = golden_steps()
    elsewhere = resolve([steps["nested"]], "memory://somewhere/else")
    assert {key: elsewhere.resolved(step).version_hash for key, step in steps.items()} == GOLDEN_HASHES


ENCODED_LEAVES = [
    (-0.0, "-0.0"),
    (1e-300, "1e-300"),
    (0.1, "0.1"),
    (2**100, "1267650600228229401496703205376"),
    (None, "null"),
    (True, "true"),
    (False, "false"),
    ("é☃", '"é☃"'),
    ("\x00\x1f\u2028", '"\\u0000\\u001f\u2028"'),
    (PurePosixPath("a/b"), '"a/b"'),
    (Color.RED, '"Color.RED"'),
    (Mode.FAST, '"fast"'),
    (Level.HIGH, "3"),
    (Shape.ROUND, '"round"'),
    ((1, [2]), "[1,[2]]"),
    (b"\x01", '{"__bytes__":"01"}'),
    ({"b": 1, "a": 2, 3: 4}, '{"3":4,"a":2,"b":1}'),
    (frozenset({3, 1, 2}), "[1,2,3]"),
    (Leaf(), '{"__type__":"Leaf","label":"feuille","weight":0.5}'),
    (
        timedelta(days=2, seconds=3, microseconds=4),
        '{"__type__":"timedelta","days":2,"microseconds":4,"seconds":3}',
    ),
    (timedelta(hours=-1), '{"__type__":"timedelta","days":-1,"microseconds":0,"seconds":82800}'),
    (np.float32, '{"__dtype__":"float32"}'),
    (jnp.float32, '{"__dtype__":"float32"}'),
    (jnp.bfloat16, '{"__dtype__":"bfloat16"}'),
    (np.dtype("int8"), '{"__dtype__":"int8"}'),
    (np.float32(0.25), "0.25"),
    (jnp.float32(2.5), "2.5"),
    (
        np.array([[1, 0], [0, 1]], dtype=np.int32),
        '{"__ndarray__":{"data":[1,0,0,1],"dtype":"int32","shape":[2,2]}}',
    ),
    (
        jnp.array([0.5, 1.5], dtype=jnp.bfloat16),
        '{"__ndarray__":{"data":[0.5,1.5],"dtype":"bfloat16","shape":[2]}}',
    ),
]


LEAF_IDS = [
    "negative-zero",
    "tiny-float",
    "tenth",
    "big-int",
    "none",
    "true",
    "false",
    "non-ascii",
    "control-chars",
    "path",
    "enum",
    "str-enum",
    "int-enum",
    "str-mixin-enum-with-own-str",
    "tuple",
    "bytes",
    "int-key-dict",
    "frozenset",
    "dataclass",
    "timedelta",
    "negative-timedelta",
    "numpy-scalar-type",
    "jax-scalar-type",
    "jax-bfloat16-type",
    "numpy-dtype",
    "numpy-scalar",
    "jax-scalar",
    "numpy-array",
    "jax-array",
]


@pytest.mark.parametrize(("value", "expected"), ENCODED_LEAVES, ids=LEAF_IDS)
def test_each_kind_of_value_encodes_to_exactly_this_json(value, expected):
    assert canonical_json(encode(value)) == expected


def marin_values_step() -> ExecutorStep:
    """Values Marin's configs version that are not plain Python (issue 12)."""
    return ExecutorStep(
        "marin/values",
        noop,
        GoldenConfig(
            misc=versioned(
                {
                    "every": timedelta(hours=1, microseconds=5),
                    "compute_dtype": jnp.bfloat16,
                    "param_dtype": np.dtype("float32"),
                    "index_type": np.int8,
                    "mask": np.array([[1, 0], [0, 1]], dtype=np.int32),
                    "scales": jnp.array([0.5, 1.5], dtype=jnp.float32),
                    "lr": np.float32(0.25),
                }
            )
        ),
    )


# Computed once (issue 12's encodings) and written down literally; see the module docstring.
GOLDEN_MARIN_VALUES_HASH = "ed64f209d927e16731ce39dceb7fce3672bc94bf4dd0f1af6e959c801d3ac464"


def test_the_version_hash_of_marin_style_values_never_changes():
    step = marin_values_step()
    assert resolve([step], "/golden/prefix").resolved(step).version_hash == GOLDEN_MARIN_VALUES_HASH


def test_an_array_too_large_to_version_is_refused_naming_the_field():
    step = ExecutorStep("big", noop, GoldenConfig(misc=versioned({"table": np.zeros(5000)})))
    with pytest.raises(StepDefinitionError, match=r"misc\.table.*5,000 elements is too large to version"):
        resolve([step], "/golden/prefix")


def test_a_large_array_in_an_unversioned_field_is_recorded_by_its_digest():
    """Only a versioned array is limited: an unversioned one is recorded (and compared for the
    reuse warning) by dtype, shape and SHA-256, and the step resolves."""
    step = ExecutorStep(
        "big-unversioned", noop, GoldenConfig(misc={"table": np.arange(5000, dtype=np.int32)})
    )
    record = resolve([step], "/golden/prefix").resolved(step).config_record
    assert record["misc"]["table"] == {
        "__ndarray__": {
            "dtype": "int32",
            "sha256": hashlib.sha256(np.arange(5000, dtype=np.int32).tobytes()).hexdigest(),
            "shape": [5000],
        }
    }
