"""Benchmarks: runnable scripts that print a table and write JSON with ``--json PATH``.

A plain package so tests can ``import bench.workload`` from the repository root.
"""
