"""The exit codes every verb returns: 0 success, 1 a runtime failure (message on stderr), 2 a usage error,
3 the job ran but a check failed (reconciliation mismatch, missing per-request fields).

A leaf: the verbs import it, and `specwatch.cli`, which loads the verbs, re-exports it.
"""

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CHECK = 0, 1, 2, 3
