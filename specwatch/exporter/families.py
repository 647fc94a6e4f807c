"""The name of every family the exporter emits: the one spelling that the emitter (`metrics.py`) and every reader
(the rules, alerts and dashboards through `specwatch.monitoring`, `snapshot`, the canary's samples, Locust's
Acceptance tab, `specwatch up`) use. Counters are named as exposed, with `_total`; histograms by their family
name (`_bucket`, `_sum`, `_count` added where read). A leaf: it imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class ExporterFamilies:
    """The exporter's families, as exposed on its /metrics."""

    requests: str = "specwatch_requests_total"
    spec_metrics_missing: str = "specwatch_spec_metrics_missing_total"
    spec_steps: str = "specwatch_spec_steps_total"
    steps_without_per_step: str = "specwatch_spec_steps_without_per_step_total"  # summary mode's steps
    draft_tokens: str = "specwatch_draft_tokens_total"
    accepted: str = "specwatch_accepted_tokens_total"
    accepted_per_pos: str = "specwatch_accepted_tokens_per_pos_total"
    drafts_reaching: str = "specwatch_drafts_reaching_pos_total"          # vLLM's detailed mode only
    full_depth_steps: str = "specwatch_full_depth_steps_total"            # detailed mode only
    full_depth_per_pos: str = "specwatch_full_depth_accepted_per_pos_total"  # detailed mode only
    spec_steps_by_accepted: str = "specwatch_spec_steps_by_accepted_total"
    decode_steps: str = "specwatch_decode_steps_total"
    prompt_tokens: str = "specwatch_prompt_tokens_total"
    completion_tokens: str = "specwatch_completion_tokens_total"
    ttft: str = "specwatch_ttft_seconds"                           # histograms: the family name
    tpot: str = "specwatch_tpot_seconds"
    itl: str = "specwatch_itl_seconds"
    e2e: str = "specwatch_e2e_seconds"
    request_acceptance_rate: str = "specwatch_request_acceptance_rate"
    upstream_up: str = "specwatch_upstream_up"
    upstream_version: str = "specwatch_upstream_version_info"
    probe_errors: str = "specwatch_upstream_probe_errors_total"
    upstream_routable: str = "specwatch_upstream_routable"
    rerouted: str = "specwatch_rerouted_total"
    mirror_outputs: str = "specwatch_mirror_outputs_total"
    canary_verdict: str = "specwatch_canary_verdict"
    canary_score: str = "specwatch_canary_score"
    fast_relay_chunks: str = "specwatch_fast_relay_chunks_total"
    fast_relay_handovers: str = "specwatch_fast_relay_handovers_total"
    fast_relay_ends: str = "specwatch_fast_relay_ends_total"
    relay: str = "specwatch_relay"

    def latencies(self) -> tuple[str, ...]:
        return (self.ttft, self.tpot, self.itl, self.e2e)

    def names(self) -> tuple[str, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


FAMILIES = ExporterFamilies()


def declared(name: str) -> str:
    """The name prometheus_client is given for an exposed counter name (it adds `_total` itself)."""
    return name.removesuffix("_total")
