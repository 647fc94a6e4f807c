"""The exit codes the verbs share: 0 success, 1 a runtime failure (message on stderr), 2 a usage error,
3 the job ran but a check failed (reconciliation mismatch, missing per-request fields). `specwatch canary`
adds its verdicts' own on top (3 fail, 4 marginal, 5 insufficient data: `specwatch.canary.cli.EXIT_CODES`).

A leaf: the verbs import it, and `specwatch.cli`, which loads the verbs, re-exports it.
"""

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CHECK = 0, 1, 2, 3
