"""Frozen-dataclass instances made without their `__init__`, for the records a plan makes per step.

A frozen dataclass's generated `__init__` sets each field through `object.__setattr__`: about
0.1 us a field, so 0.7-1.1 us for the status event, plan row and two events a cached step gets
-- together about 6% of re-planning 1,000 cached steps (docs/benchmarks.md). `record` fills the
instance's `__dict__` in one call instead. The instance is the same as the constructor's: equal,
same hash and repr, still frozen. Callers pass every field, defaults included, and the class has
no `__post_init__`; tests/executor/test_cold_and_warm_trims.py checks both for each call site.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")

_new = object.__new__


def record(cls: type[T], fields: dict[str, Any]) -> T:
    """An instance of the frozen dataclass `cls` whose fields are exactly `fields`."""
    instance = _new(cls)
    instance.__dict__.update(fields)
    return instance
