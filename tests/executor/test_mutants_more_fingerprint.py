"""executor/fingerprint.py: corners the mutation sample found unpinned.

- `short_path` cuts a long field path to exactly `limit` characters, the last three "...";
- the strict refusal of a value with no deterministic encoding, word for word;
- a class (not an instance) from outside the array libraries: refused when versioned, named
  `module:qualname` when only recorded (the dtype check must not trip on it);
- a class or object whose `dtype` attribute numpy cannot read (a string) is no dtype: refused
  with its field named when versioned, `module:qualname` when recorded (it was numpy's bare
  ValueError); numpy and JAX dtypes and scalar types are still named by their dtype;
- a 0-d JAX array is its scalar, encoded with the caller's strictness (a NaN is refused when
  versioned and recorded as text when not);
- `canonical_json` without json's C encoder (Python builds without `_json`) gives the same
  compact, key-sorted text.
"""

from __future__ import annotations

import pytest

from executor import fingerprint
from executor.fingerprint import UnencodableValueError, canonical_json, encode, short_path


def test_a_long_path_is_cut_to_the_limit_ending_in_dots():
    path = "abcdefghij" * 10
    assert short_path(path, 20) == "abcdefghijabcdefg..."
    assert len(short_path(path)) == 60
    assert short_path(path) == path[:57] + "..."
    assert short_path(path[:60]) == path[:60]


class Opaque:
    pass


def test_a_value_with_no_encoding_is_refused_word_for_word():
    with pytest.raises(UnencodableValueError) as error:
        encode({"field": Opaque()})
    assert str(error.value) == (
        f"field 'field': value of type {__name__}.Opaque has no deterministic encoding; "
        "version a plain value (str, number, list, dict, dataclass, enum, path) instead"
    )


def test_a_class_outside_the_array_libraries_is_not_a_dtype():
    with pytest.raises(UnencodableValueError, match="value of type builtins.type has no deterministic"):
        encode(int)
    assert encode(Opaque, strict=False) == f"{__name__}:Opaque"
    assert encode([int], strict=False) == ["builtins:int"]


class NamesItsDtype:
    """A user's class whose `dtype` attribute is a string: numpy cannot read it as a dtype."""

    dtype = "int8"


def test_a_class_or_object_whose_dtype_numpy_cannot_read_is_no_dtype():
    # Was numpy's "Could not convert ... to a NumPy dtype" ValueError, with no field named;
    # nor may the string attribute make it equal to np.int8's encoding (a hash collision).
    with pytest.raises(UnencodableValueError) as error:
        encode({"kind": NamesItsDtype})
    assert str(error.value).startswith("field 'kind': value of type builtins.type has no deterministic")
    assert encode({"kind": NamesItsDtype}, strict=False) == {"kind": f"{__name__}:NamesItsDtype"}
    with pytest.raises(UnencodableValueError, match=f"field 'kind': value of type {__name__}.NamesItsDtype"):
        encode({"kind": NamesItsDtype()})
    np = pytest.importorskip("numpy")
    assert encode(np.int8) == {"__dtype__": "int8"} != encode(NamesItsDtype, strict=False)


def test_numpy_and_jax_dtypes_and_scalar_types_are_named_by_dtype():
    np = pytest.importorskip("numpy")
    jnp = pytest.importorskip("jax.numpy")
    assert [
        encode(v) for v in (np.float32, np.dtype("int8"), jnp.bfloat16, jnp.float32, jnp.array(1).dtype)
    ] == [{"__dtype__": name} for name in ("float32", "int8", "bfloat16", "float32", "int32")]


def test_a_zero_dimensional_jax_array_is_its_scalar_with_the_same_strictness():
    jnp = pytest.importorskip("jax.numpy")
    assert encode(jnp.array(1.5)) == 1.5
    with pytest.raises(UnencodableValueError, match=r"field 'x': nan has no canonical encoding"):
        encode({"x": jnp.array(float("nan"))})
    assert encode({"x": jnp.array(float("nan"))}, strict=False) == {"x": "nan"}


def test_canonical_json_without_the_c_encoder_is_the_same_text(monkeypatch):
    value = {"b": [1, 2.5, None, True], "a": {"é": "x"}}
    expected = '{"a":{"é":"x"},"b":[1,2.5,null,true]}'
    assert canonical_json(value) == expected
    monkeypatch.setattr(fingerprint, "_C_ENCODE", None)
    assert canonical_json(value) == expected
