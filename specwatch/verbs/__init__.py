"""Verb modules for features that are one module (`workloads.py`, `snapshot.py`, `diff.py`, `check_server.py`), not
a package.

A package's verb lives in the package's own `cli.py`; the table of verbs is `specwatch/cli.py`.
"""
