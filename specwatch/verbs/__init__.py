"""Verb modules for features that are one module (`demo.py`, `workloads.py`, `snapshot.py`), not a package.

A package's verb lives in the package's own `cli.py`; the table of verbs is `specwatch/cli.py`.
"""
