"""Fixtures for tests that run steps on a bucket (see tests/operations/buckets.py)."""

from tests.operations.buckets import bucket, bucket_env  # noqa: F401 (fixtures)
