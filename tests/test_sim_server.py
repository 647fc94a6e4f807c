"""`specwatch sim` over real HTTP: the same wire format, counting rules and behaviour as vLLM 0.32.0."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
import requests

from specwatch.acceptance import total
from specwatch.chat_client import fetch_metrics, run_chat
from specwatch.reconcile import reconcile
from specwatch.simulator.unsimulated import CHAT_ONLY, WHAT_IT_NEEDS
from specwatch.snapshot import server_figures
from specwatch.vllm_cpu.capture import capture_server, exchanges
from specwatch.workloads import article_rows
from tests.capture_checks import check_capture, exchange_shapes, sse_events, vllm_families
from tests.conftest import NGRAM_SIM_ARGS, SimServer

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.32.0"
CATALOG = Path(__file__).parents[1] / "specwatch" / "simulator" / "vllm-0.32.0-families.json"


@pytest.fixture(scope="module")
def sim_captures(sim_ngram: SimServer, sim_baseline: SimServer, sim_factory: Callable[[list[str]], SimServer],
                 tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    detailed = sim_factory([a if a != "summary" else "detailed" for a in NGRAM_SIM_ARGS]
                           + ["--enable-per-request-metrics"])
    out = {}
    for name, server in (("ngram", sim_ngram), ("baseline", sim_baseline), ("ngram-detailed", detailed)):
        out[name] = tmp_path_factory.mktemp(f"sim-{name}")
        capture_server(server.url, out[name])
    return out


@pytest.mark.parametrize("variant,speculative", [("ngram", True), ("baseline", False), ("ngram-detailed", True)])
def test_sim_capture_passes_the_checks_the_real_capture_passes(sim_captures, variant, speculative):
    check_capture(sim_captures[variant], speculative)


@pytest.mark.parametrize("name", [e.name for e in exchanges()])
@pytest.mark.parametrize("variant", ["ngram", "baseline", "ngram-detailed"])
def test_json_and_sse_shapes_equal_the_real_servers(sim_captures, variant, name):
    """Key order, types, null versus absent, chunk kinds: replayed against the golden captures."""
    assert exchange_shapes(sim_captures[variant], name) == exchange_shapes(FIXTURES / variant, name)


def test_metric_families_match_the_catalog_read_from_the_wheel(sim_ngram):
    catalog = {e["name"]: e for e in json.loads(CATALOG.read_text())}
    exposed = vllm_families(fetch_metrics(sim_ngram.url))
    expected = {n for n, e in catalog.items() if e["condition"] in ("always", "speculative config set")}
    assert set(exposed) == expected
    for name, (kind, labels, buckets) in exposed.items():
        entry = catalog[name]
        assert kind == entry["type"], name
        assert labels == set(entry["labels"]), name
        if entry["type"] == "histogram" and entry.get("buckets") is not None:
            assert buckets == [float(b) for b in entry["buckets"]], name


def test_metric_exposition_equals_the_real_capture_family_for_family(sim_ngram):
    real = vllm_families((FIXTURES / "ngram" / "metrics_before.txt").read_text())
    assert vllm_families(fetch_metrics(sim_ngram.url)) == real


def test_openai_client_streams_with_include_usage(sim_ngram):
    client = openai.OpenAI(base_url=sim_ngram.url + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="spec-demo", messages=[{"role": "user", "content": article_rows("code")[2].prompt}],
        temperature=0, max_tokens=64, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 64
    assert usage_chunk.model_extra is not None
    spec = usage_chunk.model_extra["metrics"]["speculative_decoding"]
    assert spec["num_spec_tokens"] == 4 and len(spec["acceptance_histogram"]) == 5
    assert 64 <= 1 + spec["num_spec_steps"] + spec["num_accepted_draft_tokens"] + 4  # accepted may be cut
    assert text.startswith("def scale_0(value):")


def test_errors_have_vllms_shape_and_status(sim_ngram):
    url = sim_ngram.url + "/v1/chat/completions"
    wrong = requests.post(url, json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}, timeout=10)
    assert wrong.status_code == 404
    assert wrong.json()["error"] == {"message": "The model `nope` does not exist. Valid aliases: spec-demo.",
                                     "type": "NotFoundError", "param": "model", "code": 404}
    broken = requests.post(url, data=b"{not json", headers={"Content-Type": "application/json"}, timeout=10)
    assert broken.status_code == 400 and broken.json()["error"]["type"] == "BadRequestError"
    too_long = requests.post(url, json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6},
                             timeout=10)
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "max_tokens"
    assert requests.get(sim_ngram.url + "/health", timeout=5).status_code == 200  # still serving


def test_per_request_flag_without_speculation_refuses_to_start():
    done = subprocess.run([sys.executable, "-m", "specwatch.cli", "sim", "m", "--per-request-spec-decode-metrics",
                           "summary"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "speculative decoding" in done.stderr


def test_article_workloads_coverage_separates_code_from_chat(sim_ngram):
    """Drafted share is clearly higher on code; per-position acceptance never increases; sums reconcile."""
    before = fetch_metrics(sim_ngram.url)
    code = run_chat(sim_ngram.url, article_rows("code")[:8], max_tokens=256, concurrency=8)
    chat = run_chat(sim_ngram.url, article_rows("chat")[:8], max_tokens=256, concurrency=8)
    delta = server_figures(before, fetch_metrics(sim_ngram.url))
    code_acc, chat_acc = total(r.body for r in code), total(r.body for r in chat)
    assert code_acc.drafted_token_share is not None and chat_acc.drafted_token_share is not None
    assert code_acc.drafted_token_share > 1.5 * chat_acc.drafted_token_share
    assert [c for c in reconcile(total(r.body for r in code + chat), delta) if not c.equal] == []
    per_pos = [delta.per_position[p] / delta.steps for p in range(4)]
    assert per_pos == sorted(per_pos, reverse=True)


def test_sampling_is_seeded(sim_ngram):
    def text(seed: int, temperature: float) -> str:
        body = {"messages": [{"role": "user", "content": "Case 1: explain caching."}], "max_tokens": 40,
                "temperature": temperature, "seed": seed}
        r = requests.post(sim_ngram.url + "/v1/chat/completions", json=body, timeout=30)
        return str(r.json()["choices"][0]["message"]["content"])

    assert text(1, 1.0) == text(1, 1.0)
    assert text(1, 1.0) != text(2, 1.0)
    assert text(1, 0.0) == text(2, 0.0)  # greedy ignores the seed


def test_force_include_usage_adds_usage_to_every_chunk(sim_factory):
    server = sim_factory([*NGRAM_SIM_ARGS, "--enable-force-include-usage"])
    body = {"messages": [{"role": "user", "content": article_rows("code")[0].prompt}], "max_tokens": 24,
            "temperature": 0, "stream": True}
    events = sse_events(requests.post(server.url + "/v1/chat/completions", json=body, timeout=30).content)
    chunks = [e for e in events if e != "[DONE]"]
    assert all("usage" in c for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["metrics"]["speculative_decoding"]["num_spec_tokens"] == 4
    completions = [c["usage"]["completion_tokens"] for c in chunks]
    assert completions == sorted(completions) and completions[-1] == 24


def test_help_and_type_lines_are_byte_identical_to_the_real_exposition(sim_ngram):
    def meta(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith(("# HELP vllm:", "# TYPE vllm:"))]

    real = meta((FIXTURES / "ngram" / "metrics_before.txt").read_text())
    assert meta(fetch_metrics(sim_ngram.url)) == real and len(real) > 100


@pytest.mark.parametrize("body", [
    {"messages": "hello"}, {"messages": [{"content": "no role"}]}, {"messages": [{"role": "user", "content": "x"}],
                                                                   "n": 0},
    {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
    {"messages": [{"role": "user", "content": "x"}], "stop": 7}, [1, 2, 3],
])
def test_malformed_requests_get_a_400_and_the_server_keeps_serving(sim_ngram, body):
    r = requests.post(sim_ngram.url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["message"]
    assert requests.get(sim_ngram.url + "/health", timeout=5).status_code == 200


def test_the_role_chunk_comes_with_the_first_token_not_before_prefill(sim_factory):
    """As vLLM 0.32.0: the role chunk is emitted in the same iteration as the first output."""
    slow = sim_factory([*NGRAM_SIM_ARGS[:-1], "10"])  # time scale 10: a prefill step takes about 60 ms
    body = {"messages": [{"role": "user", "content": "Case 1: explain queues."}], "max_tokens": 4,
            "temperature": 0, "stream": True}
    start = time.perf_counter()
    with requests.post(slow.url + "/v1/chat/completions", json=body, stream=True, timeout=60) as r:
        arrivals = []
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                arrivals.append((time.perf_counter() - start, json.loads(line[6:])))
    role_at, role = arrivals[0]
    first_at, first = arrivals[1]
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["choices"][0]["delta"]["content"]
    assert role_at > 0.04 and first_at - role_at < 0.01


@pytest.mark.parametrize("name", ["error_top_logprobs_without_logprobs", "error_logprobs_above_the_maximum"])
def test_logprobs_errors_are_the_real_servers_word_for_word(sim_captures, name):
    real = json.loads((FIXTURES / "ngram" / f"{name}.response").read_bytes())
    assert json.loads((sim_captures["ngram"] / f"{name}.response").read_bytes()) == real


@pytest.mark.parametrize("extra,message", [  # what the real server answered (captured 2026-12-04)
    ({"logprobs": True, "top_logprobs": "x"}, "`top_logprobs` must be an integer. (parameter=top_logprobs, value=x)"),
    ({"logprobs": True, "top_logprobs": -2},
     "`top_logprobs` must be a positive value or -1. (parameter=top_logprobs, value=-2)"),
    ({"logprobs": True, "top_logprobs": float("inf")}, None),  # JSON's Infinity: refused, not a crash
    ({"logprobs": True, "top_logprobs": -1},
     "Requested sample logprobs of 49152, which is greater than max allowed: 20 (parameter=logprobs, value=49152)"),
])
def test_chat_logprobs_fields_are_refused_as_vllm_refuses_them(sim_ngram, extra, message):
    body = json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **extra})  # Infinity kept
    r = requests.post(sim_ngram.url + "/v1/chat/completions", data=body, timeout=10,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"] == (message or r.json()["error"]["message"])
    assert r.json()["error"]["param"] in ("logprobs", "top_logprobs")


def test_logprobs_streamed_and_not_name_the_same_positions(sim_ngram):
    """One position per completion token, the same values streamed and not, and the same on a second ask."""
    url = sim_ngram.url + "/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": article_rows("code")[0].prompt}], "max_tokens": 24,
            "temperature": 0, "logprobs": True, "top_logprobs": 3}
    whole = requests.post(url, json=body, timeout=30).json()
    assert requests.post(url, json=body, timeout=30).json()["choices"][0]["logprobs"] == whole["choices"][0]["logprobs"]
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == whole["usage"]["completion_tokens"] == 24
    assert "".join(e["token"] for e in content) == whole["choices"][0]["message"]["content"]
    stream = requests.post(url, json={**body, "stream": True, "stream_options": {"include_usage": True}}, timeout=30)
    streamed = [e for event in sse_events(stream.content)[:-1] for c in event["choices"]
                if c.get("logprobs") for e in c["logprobs"]["content"]]
    assert streamed == content


def test_a_step_whose_text_a_stop_string_holds_back_still_sends_a_chunk(sim_ngram):
    """As vLLM 0.32.0 (captured: stop "scale_1", no logprobs): `{"content": ""}` for a step with tokens but
    no text yet, so a stream has a chunk per step whatever the stop strings."""
    body = {"messages": [{"role": "user", "content": article_rows("code")[0].prompt}], "max_tokens": 40,
            "temperature": 0, "stop": ["scale_1"], "stream": True}
    events = sse_events(requests.post(sim_ngram.url + "/v1/chat/completions", json=body, timeout=30).content)
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1] == {"content": ""}  # the first step's "def" is held back: shorter than the stop string
    whole = requests.post(sim_ngram.url + "/v1/chat/completions", json={**body, "stream": False}, timeout=30).json()
    assert "".join(d.get("content", "") for d in deltas) == whole["choices"][0]["message"]["content"]


def test_several_choices_under_greedy_sampling_are_refused_as_vllm_refuses_them(sim_ngram):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "n": 2, "temperature": 0}
    r = requests.post(sim_ngram.url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 400  # the real server's answer, captured 2026-12-04:
    assert r.json() == {"error": {"message": "n must be 1 when using greedy sampling, got 2.",
                                  "type": "BadRequestError", "param": None, "code": 400}}
    assert requests.post(sim_ngram.url + "/v1/chat/completions", json={**body, "temperature": 0.5},
                         timeout=10).status_code == 200


UNSIMULATED_EXAMPLES = {  # a value vLLM 0.32.0 accepts for each field the simulator refuses
    "echo": True, "prompt_logprobs": 0, "logprob_token_ids": [5], "return_token_ids": True,
    "return_tokens_as_token_ids": True, "return_token_offsets": True, "include_stop_str_in_output": True,
    "min_tokens": 3, "stop_token_ids": [2], "allowed_token_ids": [5, 6], "bad_words": ["queue"],
    "use_beam_search": True, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "response_format": {"type": "json_object"}, "structured_outputs": {"choice": ["a", "b"]},
    "continue_final_message": True,
}


def test_every_refused_field_has_an_example_here():
    assert set(UNSIMULATED_EXAMPLES) == set(WHAT_IT_NEEDS)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("field", sorted(UNSIMULATED_EXAMPLES))
def test_a_field_the_simulator_cannot_answer_as_vllm_gets_a_501_naming_it(sim_ngram, path, field):
    base = ({"messages": [{"role": "user", "content": "x"}]} if "chat" in path else {"prompt": "x"}) | {
        "max_tokens": 2, "temperature": 0}
    r = requests.post(sim_ngram.url + path, json={**base, field: UNSIMULATED_EXAMPLES[field]}, timeout=10)
    if "chat" not in path and field in CHAT_ONLY:  # not a completion's field: vLLM ignores it, so does the simulator
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 501, r.text
    error = r.json()["error"]
    assert error["type"] == "NotImplementedError" and error["code"] == 501 and error["param"] == field
    assert f"`{field}`" in error["message"] and "vLLM 0.32.0 answers it" in error["message"]
    assert requests.post(sim_ngram.url + path, json=base, timeout=10).status_code == 200


@pytest.mark.parametrize("defaults", [
    {"echo": False, "min_tokens": 0, "stop_token_ids": [], "bad_words": [], "tools": [], "prompt_logprobs": None,
     "include_stop_str_in_output": False, "use_beam_search": False, "response_format": {"type": "text"}},
    {"top_p": 0.9, "top_k": 5, "presence_penalty": 0.5, "repetition_penalty": 1.1, "logit_bias": {"5": 1}},
])
def test_fields_at_their_defaults_and_sampling_knobs_are_accepted(sim_ngram, defaults):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "temperature": 0, **defaults}
    r = requests.post(sim_ngram.url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_a_malformed_request_gets_its_400_before_an_unsimulated_field_its_501(sim_ngram):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "n": 0, "echo": True}
    assert requests.post(sim_ngram.url + "/v1/chat/completions", json=body, timeout=10).status_code == 400
