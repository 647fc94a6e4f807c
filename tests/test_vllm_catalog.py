"""The vLLM 0.32.0 family catalog: checked by hand against the reference, and diffed against real expositions.

The expected values in part (a) are copied by hand from the reference document
(/work/shared/reference/vllm-0.32-wire-format.md §1.3-1.7), not from the catalog or the wheel,
so they are an independent source. Part (b) compares the catalog with what the real server
exposed before any request (tests/fixtures/vllm-0.32.0/*/metrics_before.txt). No network.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT / "specwatch" / "simulator" / "vllm-0.32.0-families.json"
FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.32.0"
CAPTURES = sorted(p.parent.name for p in FIXTURES.glob("*/metrics_before.txt"))
CAPTURE_MAX_MODEL_LEN = 4096  # the captures run `vllm serve --max-model-len 4096`
REQUEST_TOKENS_RULE = "1-2-5 up to max_model_len"

# ---- (a) the reference document, by hand

ML = ["engine", "model_name"]
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0]
RULE = "rule"  # buckets are the 1-2-5 series capped at max_model_len

SPEC_DECODE = {
    "vllm:spec_decode_num_drafts": ("counter", ML, None),
    "vllm:spec_decode_num_draft_tokens": ("counter", ML, None),
    "vllm:spec_decode_num_accepted_tokens": ("counter", ML, None),
    "vllm:spec_decode_num_accepted_tokens_per_pos": ("counter", ML + ["position"], None),
}
ALWAYS: dict[str, tuple[str, list[str], list[float] | str | None]] = {
    "vllm:num_requests_running": ("gauge", ML, None),
    "vllm:num_requests_waiting": ("gauge", ML, None),
    "vllm:kv_cache_usage_perc": ("gauge", ML, None),
    "vllm:prompt_tokens": ("counter", ML, None),
    "vllm:generation_tokens": ("counter", ML, None),
    "vllm:request_success": ("counter", ML + ["finished_reason"], None),
    "vllm:num_preemptions": ("counter", ML, None),
    "vllm:time_to_first_token_seconds": ("histogram", ML, TTFT),
    "vllm:inter_token_latency_seconds": ("histogram", ML, ITL),
    "vllm:request_time_per_output_token_seconds": ("histogram", ML, ITL),
    "vllm:e2e_request_latency_seconds": ("histogram", ML, REQUEST_LATENCY),
    "vllm:request_queue_time_seconds": ("histogram", ML, REQUEST_LATENCY),
    "vllm:request_prefill_time_seconds": ("histogram", ML, REQUEST_LATENCY),
    "vllm:request_decode_time_seconds": ("histogram", ML, REQUEST_LATENCY),
    "vllm:request_inference_time_seconds": ("histogram", ML, REQUEST_LATENCY),
    "vllm:request_prompt_tokens": ("histogram", ML, RULE),
    "vllm:request_generation_tokens": ("histogram", ML, RULE),
}
CACHE_CONFIG_FIELDS = [
    "block_size", "user_specified_block_size", "kv_cache_layout", "prefix_match_unit", "gpu_memory_utilization",
    "cache_dtype", "is_attention_free", "num_gpu_blocks_override", "sliding_window", "enable_prefix_caching",
    "prefix_caching_hash_algo", "prefix_cache_retention_interval", "kv_cache_dtype_skip_layers",
    "mamba_page_size_padded", "skip_page_size_padded", "mamba_block_size", "mamba_cache_dtype",
    "mamba_ssm_cache_dtype", "mamba_cache_mode", "enable_mamba_shared_prefix_checkpoint", "replayssm_buffer_len",
    "use_replayssm", "use_kda_recoverssm", "num_gpu_blocks", "num_cpu_blocks", "effective_attention_block_size",
    "kv_cache_size_tokens", "kv_cache_max_concurrency", "hash_block_size", "cache_hit_alignment_tokens",
    "kv_sharing_fast_prefill", "swa_bounded_replay", "kv_cache_memory_bytes", "kv_offloading_size",
    "kv_offloading_backend", "_block_size_resolved",
]


def one_two_five(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to max_value: what the request_tokens rule means."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(float(m * scale))
        scale *= 10


@pytest.fixture(scope="module")
def catalog() -> dict[str, dict[str, Any]]:
    entries = json.loads(CATALOG.read_text())
    names = [e["name"] for e in entries]
    assert names == sorted(names) and len(set(names)) == len(names), "sorted by name, one entry per family"
    return {e["name"]: e for e in entries}


def test_entries_are_well_formed(catalog: dict[str, dict[str, Any]]) -> None:
    for name, e in catalog.items():
        assert name.startswith("vllm:")
        assert e["type"] in ("counter", "gauge", "histogram")
        assert e["labels"] == sorted(e["labels"]) and "le" not in e["labels"]
        assert re.fullmatch(r"vllm/[\w/]+\.py:\d+", e["source"]), e["source"]
        assert isinstance(e["condition"], str) and e["condition"]
        if e["type"] != "histogram":
            assert e["buckets"] is None and "buckets_rule" not in e
        else:
            assert (e["buckets"] is None) == ("buckets_rule" in e), name
        if e["type"] == "counter":
            assert not name.endswith("_total"), "prometheus_client registers counters without _total"


def test_one_two_five_matches_the_reference_example() -> None:
    assert one_two_five(8192) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]


@pytest.mark.parametrize("name", sorted(SPEC_DECODE | ALWAYS))
def test_reference_families(catalog: dict[str, dict[str, Any]], name: str) -> None:
    kind, labels, buckets = (SPEC_DECODE | ALWAYS)[name]
    entry = catalog[name]
    assert entry["type"] == kind
    assert entry["labels"] == sorted(labels)
    if buckets == RULE:
        assert entry["buckets"] is None and entry["buckets_rule"] == REQUEST_TOKENS_RULE
    else:
        assert entry["buckets"] == buckets
    assert entry["condition"] == ("speculative config set" if name in SPEC_DECODE else "always")


def test_cache_config_info_labels_are_the_cache_config_fields(catalog: dict[str, dict[str, Any]]) -> None:
    entry = catalog["vllm:cache_config_info"]
    assert (entry["type"], entry["condition"], entry["buckets"]) == ("gauge", "always", None)
    assert entry["labels"] == sorted(CACHE_CONFIG_FIELDS + ["engine"])


def test_request_tokens_families_share_the_rule(catalog: dict[str, dict[str, Any]]) -> None:
    ruled = sorted(n for n, e in catalog.items() if e.get("buckets_rule"))
    assert ruled == ["vllm:request_generation_tokens", "vllm:request_max_num_generation_tokens",
                     "vllm:request_params_max_tokens", "vllm:request_prefill_kv_computed_tokens",
                     "vllm:request_prompt_tokens"]
    assert {catalog[n]["buckets_rule"] for n in ruled} == {REQUEST_TOKENS_RULE}


# ---- (b) the real server's exposition


@dataclass(frozen=True)
class Exposed:
    type: str
    labels: list[str]
    buckets: list[float]
    samples: int


def exposed_families(text: str) -> dict[str, Exposed]:
    """The `vllm:` families of an exposition, without the `_created` gauges of counters and histograms.

    The parser already names a counter family without `_total`; `<family>_created` comes as a gauge
    family of its own.
    """
    families = [f for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")]
    with_created = {f.name for f in families if f.type in ("counter", "histogram")}
    out: dict[str, Exposed] = {}
    for f in families:
        if f.type == "gauge" and f.name.endswith("_created") and f.name.removesuffix("_created") in with_created:
            continue
        samples = [s for s in f.samples if not s.name.endswith("_created")]
        labels = sorted({k for s in samples for k in s.labels if k != "le"})
        bounds = sorted({float(s.labels["le"]) for s in samples
                         if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"})
        out[f.name] = Exposed(f.type, labels, bounds, len(samples))
    return out


def capture(folder: str) -> dict[str, Exposed]:
    return exposed_families((FIXTURES / folder / "metrics_before.txt").read_text())


def test_captures_are_present() -> None:
    assert "baseline" in CAPTURES and "ngram" in CAPTURES, f"captures found: {CAPTURES}"


@pytest.mark.parametrize("folder", CAPTURES)
def test_catalog_describes_every_captured_family(catalog: dict[str, dict[str, Any]], folder: str) -> None:
    log = FIXTURES / folder / "server.log"
    if log.exists():
        match = re.search(r"'max_model_len': (\d+)", log.read_text(errors="replace"))
        assert match is None or int(match.group(1)) == CAPTURE_MAX_MODEL_LEN
    for name, seen in capture(folder).items():
        assert name in catalog, f"{folder}: {name} is exposed but not in the catalog"
        entry = catalog[name]
        assert seen.type == entry["type"], name
        assert seen.samples > 0, f"{folder}: {name} has no series before any request"
        assert seen.labels == entry["labels"], name
        if entry["type"] == "histogram":
            expected = entry["buckets"]
            if expected is None:
                assert entry["buckets_rule"] == REQUEST_TOKENS_RULE, name
                expected = one_two_five(CAPTURE_MAX_MODEL_LEN)
            assert seen.buckets == expected, name


def spec_decode_names(catalog: dict[str, dict[str, Any]]) -> set[str]:
    return {n for n, e in catalog.items() if e["condition"] == "speculative config set"}


def test_baseline_exposes_exactly_the_always_families(catalog: dict[str, dict[str, Any]]) -> None:
    always = {n for n, e in catalog.items() if e["condition"] == "always"}
    assert set(capture("baseline")) == always


@pytest.mark.parametrize("folder", CAPTURES)
def test_spec_decode_families_only_in_ngram_captures(catalog: dict[str, dict[str, Any]], folder: str) -> None:
    spec = spec_decode_names(catalog)
    assert spec == set(SPEC_DECODE)
    always = {n for n, e in catalog.items() if e["condition"] == "always"}
    expected = always | spec if folder.startswith("ngram") else always
    assert set(capture(folder)) == expected
