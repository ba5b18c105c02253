"""The executor: content-hashed steps, cached outputs, leases, a local runner.

Public API (Marin's names, so Marin experiment scripts port by changing imports):

    from executor import ExecutorStep, Executor, executor_main, versioned, this_output_path
    from executor import ResourceConfig  # what a step asks the cluster for (executor.resources)

This package imports no JAX, Levanter or other heavy dependency: planning and dry
runs stay fast. `import executor` loads neither fsspec (local disk goes through `os`)
nor draccus: `executor_main` and `ExecutorMainConfig` (the command line, in
`executor.main`) load on first use, as do the `ResourceConfig` classes (`executor.resources`:
only steps that ask for resources need them). See `executor.graph` for what a version is and
how paths are chosen.
"""

from executor.collector import CollectorPause as _CollectorPause

# The import makes ~5,000 objects that live as long as the process: no collection over them
# meanwhile (~1 ms of every start), and afterwards only the rare full ones (they are promoted
# to the oldest generation: ~1% of a cached re-run of 1,000 steps); see executor.collector.
with _CollectorPause(promote=True):
    import executor.step_errors  # noqa: F401 - installs the one-line report of declaration errors
    from executor.executor import Executor
    from executor.graph import HASH_LENGTH, StepDefinitionError
    from executor.lease import LeaseConfig
    from executor.outcomes import ExecutorRunError
    from executor.steps import (
        THIS_OUTPUT_PATH,
        ExecutorStep,
        InputName,
        MirroredValue,
        OutputName,
        VersionedValue,
        ensure_versioned,
        get_executor_step,
        mirrored,
        output_path_of,
        this_output_path,
        unwrap_versioned_value,
        versioned,
    )
    from executor.store import StoreError

__all__ = [
    "HASH_LENGTH",
    "THIS_OUTPUT_PATH",
    "CpuConfig",
    "Executor",
    "ExecutorMainConfig",
    "ExecutorRunError",
    "ExecutorStep",
    "GpuConfig",
    "InputName",
    "LeaseConfig",
    "MirroredValue",
    "OutputName",
    "ResourceConfig",
    "StepDefinitionError",
    "StoreError",
    "TpuConfig",
    "VersionedValue",
    "ensure_versioned",
    "executor_main",
    "get_executor_step",
    "mirrored",
    "output_path_of",
    "this_output_path",
    "unwrap_versioned_value",
    "versioned",
]

_LAZY = {
    "ExecutorMainConfig": "executor.main",
    "executor_main": "executor.main",
    "CpuConfig": "executor.resources",
    "GpuConfig": "executor.resources",
    "ResourceConfig": "executor.resources",
    "TpuConfig": "executor.resources",
}
"""Names whose module loads on first use (module `__getattr__`, PEP 562)."""


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'executor' has no attribute {name!r}")
