"""Composition and tooling on top of the executor and the operations: default step
builders, named model configs, the `marin` command and the output-tree browser."""
