"""Benchmarks, shelved by purpose (benchmarks/README.md lists every script and its command).

Each script runs as a module from the repository root, e.g. ``python -m benchmarks.perf.cpu_step``.
This package imports nothing, so a runner in another framework's environment (``perf/peer``) can
import its own sibling modules without this repository's dependencies.
"""
