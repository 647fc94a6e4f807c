"""What differs between a candidate's server and its baseline's beyond their speculative config.

A verdict is about speculation only where the two servers differ in nothing else. From each variant's
`environment.json`: the vLLM version (`GET /version`), the model runner (where the server's log said, see
`specwatch.experiment.environment`), the backend, and the server's argv compared flag by flag without what
speculation and placement set: `--speculative-config` / `--speculative_config` (and its dotted sub-flags),
`--per-request-spec-decode-metrics` (valid only with a speculative config), `--host` and `--port`. The model
is the argv's first positional argument (or `--model`), so a different model shows there. Unknown on either side
(an older run, a server that does not tell) is no difference: only what both sides recorded is compared.
"""

from __future__ import annotations

from collections.abc import Sequence

from specwatch.report.results import VariantResults

SPECULATION_FLAGS = ("--speculative-config", "--speculative_config", "--per-request-spec-decode-metrics",
                     "--per_request_spec_decode_metrics")
PLACEMENT_FLAGS = ("--host", "--port")
POSITIONAL = "model"  # the name a positional argument is compared under


def _options(argv: Sequence[str]) -> dict[str, list[str]]:
    """Flag -> its values in order (a bare flag: ""); positional arguments under `POSITIONAL`."""
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            flag, eq, value = arg.partition("=")
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value, i = argv[i + 1], i + 1
            out.setdefault(flag, []).append(value)
        else:
            out.setdefault(POSITIONAL, []).append(arg)
        i += 1
    return out


def _ignored(flag: str) -> bool:
    return flag in PLACEMENT_FLAGS or any(flag == f or flag.startswith(f + ".") for f in SPECULATION_FLAGS)


def argv_differences(candidate: Sequence[str], baseline: Sequence[str]) -> list[str]:
    """'--max-num-seqs 16 vs 8' per flag whose values differ (candidate's first), speculation and placement left
    out; a flag only one side has: '--enforce-eager (set) vs absent'."""
    a, b = _options(candidate), _options(baseline)

    def shown(values: list[str] | None) -> str:
        if values is None:
            return "absent"
        return " ".join(v or "(set)" for v in values)

    out = []
    for flag in sorted(set(a) | set(b)):
        if _ignored(flag) or a.get(flag) == b.get(flag):
            continue
        name = "" if flag == POSITIONAL else f"{flag} "
        out.append(f"{name}{shown(a.get(flag))} vs {shown(b.get(flag))}")
    return out


def differences(v: VariantResults, baseline: VariantResults) -> list[str]:
    """What the candidate's server and the baseline's differ in beyond speculation, candidate first: 'vLLM 0.32.0
    vs 0.31.1', 'model runner V2 vs V1', 'backend sim vs vllm_cpu', 'argv --max-num-seqs 16 vs 8'."""
    out = []
    for title, mine, theirs in (("vLLM", v.server_version, baseline.server_version),
                                ("model runner", v.model_runner, baseline.model_runner),
                                ("backend", v.backend, baseline.backend)):
        if mine is not None and theirs is not None and mine != theirs:
            out.append(f"{title} {mine} vs {theirs}")
    if v.argv is not None and baseline.argv is not None:
        out += [f"argv {d}" for d in argv_differences(v.argv, baseline.argv)]
    return out


def sentence(v: VariantResults, baseline: VariantResults) -> str | None:
    """'the sides differ beyond speculation (ngram vs baseline): vLLM 0.32.0 vs 0.31.1'; None where they do not."""
    found = differences(v, baseline)
    if not found:
        return None
    return f"the sides differ beyond speculation ({v.name} vs {baseline.name}): {'; '.join(found)}"
