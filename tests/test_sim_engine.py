"""The simulator's parts in-process: proposers, target, timing tables, and behaviour that emerges from them."""

from __future__ import annotations

import asyncio
import json
import random

from specwatch.simulator import timing
from specwatch.simulator.args import parse_sim_args
from specwatch.simulator.engine import EOS, Engine, EngineRequest
from specwatch.simulator.main import build
from specwatch.simulator.proposers import ModelledDrafter, NgramIndex, SuffixCache, SuffixIndex
from specwatch.simulator.target import generate
from specwatch.simulator.tokens import tokenize
from specwatch.workloads import SOURCE, Row, article_prompt, article_rows


def test_ngram_takes_the_longest_window_first_and_respects_the_minimum():
    index = NgramIndex(2, 4)
    index.extend(list("xabcdyabcz") + list("abc"))
    # the 3-gram "abc" matched (no 4-gram does) at its earliest occurrence, as vLLM's proposer does
    assert index.propose(3) == list("dya")
    short = NgramIndex(3, 3)
    short.extend(list("qab") + list("ab"))
    assert short.propose(2) == []  # only a 2-gram repeats: below prompt_lookup_min, no draft


def test_suffix_walks_the_most_frequent_continuation_and_uses_the_cache():
    index = SuffixIndex(max_depth=24, min_token_prob=0.1, spec_factor=1.0)
    index.extend(list("ab1ab1ab2ab"))
    assert index.propose(4)[:1] == ["1"]  # "ab" continued with 1 twice, with 2 once
    cache = SuffixCache(max_requests=1, max_depth=24)
    cache.add(list("hello world"))
    fresh = SuffixIndex(24, 0.1, 1.0, cache)
    fresh.extend(list("say hello"))
    assert fresh.propose(4) == list(" wor")  # only a past request's output knows the continuation
    assert SuffixIndex(24, 0.1, 1.0).propose(3) == []


def test_modelled_drafter_agrees_by_profile_and_stops_at_the_first_miss():
    upcoming = list("abcde")
    assert ModelledDrafter((1.0,), random.Random(0)).propose(upcoming, 4, []) == list("abcd")
    missed = ModelledDrafter((0.0,), random.Random(0)).propose(upcoming, 4, [])
    assert "a" not in missed and len(missed) == 4
    # copyable pieces are agreed on more often
    rng = random.Random(1)
    plain = sum(ModelledDrafter((0.3,), rng).propose(upcoming, 1, [False])[0] == "a" for _ in range(2000))
    boosted = sum(ModelledDrafter((0.3,), rng).propose(upcoming, 1, [True])[0] == "a" for _ in range(2000))
    assert boosted > plain * 1.5


def test_target_edits_the_code_and_writes_prose_for_chat():
    gen = generate(article_prompt("code", 13), 64)
    text = "".join(gen.tokens[:gen.natural_end])
    assert text == SOURCE.replace("return value * 2\n", "return value * 113\n")
    chat = generate(article_prompt("chat", 2), 64)
    assert chat.natural_end > 100 and "def " not in "".join(chat.tokens)
    assert generate(article_prompt("chat", 2), 64) == chat  # greedy is deterministic
    assert generate(article_prompt("chat", 2), 64, temperature=1.0, seed=1) != chat
    assert len(generate(article_prompt("code", 0), 4000).tokens) >= 4000  # ignore_eos never runs dry
    assert "".join(tokenize(SOURCE)) == SOURCE


def test_timing_reproduces_the_measured_h200_table_at_its_points():
    # values typed from ../shared/reference/h200-step-times.md
    assert timing.forward_ms("qwen3-8b", 1, 1, 512) == 4.84
    assert timing.forward_ms("qwen3-8b", 16, 5, 512) == 6.30
    assert timing.forward_ms("qwen3-8b", 64, 17, 2048) == 43.59
    assert timing.forward_ms("qwen3-0.6b", 8, 1, 2048) == 1.67
    between = timing.forward_ms("qwen3-8b", 12, 5, 1280)
    assert 5.63 < between < 8.84


def _tpot_ms(spec: dict | None, rows: list[Row], concurrency: int, max_tokens: int = 128) -> float:
    """Modelled milliseconds per output token per sequence, all sequences running together."""
    argv = ["Qwen/Qwen3-8B", "--max-num-seqs", "256", "--max-model-len", "4096", "--sim-time-scale", "0.00001"]
    if spec:
        argv += ["--speculative-config", json.dumps(spec)]
    api, engine = build(parse_sim_args(argv))

    async def go() -> None:
        loop = asyncio.create_task(engine.run())
        reqs = []
        for i in range(concurrency):
            row = rows[i % len(rows)]
            gen = generate(row.prompt, max_tokens)
            reqs.append(EngineRequest(str(i), tokenize(row.prompt), gen.tokens, max_tokens))
        for r in reqs:
            engine.add(r)
        while not all(r.finished for r in reqs):
            await asyncio.sleep(0.001)
        loop.cancel()

    asyncio.run(go())
    return engine.modelled_ms / max_tokens


DRAFT = {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 4}
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def test_speculation_helps_at_concurrency_1_and_a_draft_model_hurts_under_load():
    code = article_rows("code")
    assert _tpot_ms(NGRAM, code, 1) < 0.6 * _tpot_ms(None, code, 1)
    assert _tpot_ms(DRAFT, code, 1) < _tpot_ms(None, code, 1)
    assert _tpot_ms(DRAFT, code, 64) > _tpot_ms(None, code, 64)


def test_async_methods_count_every_decode_step_as_a_k_slot_draft():
    api, engine = build(parse_sim_args(["m", "--speculative-config", json.dumps(
        {"method": "eagle3", "model": "x/eagle3", "num_speculative_tokens": 3}), "--sim-time-scale", "0.00001"]))

    async def go() -> EngineRequest:
        loop = asyncio.create_task(engine.run())
        gen = generate(article_prompt("chat", 0), 40)
        req = EngineRequest("a", tokenize("hello"), (*gen.tokens[:gen.natural_end], EOS), 40)
        engine.add(req)
        while not req.finished:
            await asyncio.sleep(0.001)
        loop.cancel()
        return req

    req = asyncio.run(go())
    stats = req.spec_stats
    assert stats is not None and stats.drafted == 3 * stats.steps
    # prefill gives one token, each step 1 + accepted; accepted tokens cut by max_tokens still count
    assert len(req.generated) <= 1 + stats.steps + stats.accepted
    before_last = 1 + sum(1 + a for a in stats.per_step_accepted[:-1])
    assert before_last < len(req.generated) <= 1 + stats.steps + stats.accepted


def _eagle3_rate(profile: str) -> float:
    api, engine = build(parse_sim_args(["m", "--speculative-config", json.dumps(
        {"method": "eagle3", "model": "x/eagle3", "num_speculative_tokens": 3}), "--sim-draft-acceptance", profile,
        "--sim-time-scale", "0.00001"]))

    async def go() -> EngineRequest:
        loop = asyncio.create_task(engine.run())
        reqs = []
        for i in range(4):
            gen = generate(article_prompt("chat", i), 100)
            reqs.append(EngineRequest(str(i), tokenize("hello"), gen.tokens, 100))
            engine.add(reqs[-1])
        while not all(r.finished for r in reqs):
            await asyncio.sleep(0.001)
        loop.cancel()
        return reqs[0]

    asyncio.run(go())
    labels = {"model_name": "m", "engine": "0"}
    read = engine.metrics.registry.get_sample_value
    accepted = read("vllm:spec_decode_num_accepted_tokens_total", labels)
    drafted = read("vllm:spec_decode_num_draft_tokens_total", labels)
    assert accepted is not None and drafted
    return accepted / drafted


def test_acceptance_follows_the_drafter_not_a_dialled_rate():
    assert _eagle3_rate("1,1,1") == 1.0
    high, low = _eagle3_rate("0.9,0.9,0.9"), _eagle3_rate("0.2,0.2,0.2")
    assert 0.5 < high < 1.0 and low < 0.5 * high


def _run_all(engine_args: list[str], prompts: list[str], max_tokens: int) -> tuple[list[EngineRequest], Engine]:
    api, engine = build(parse_sim_args([*engine_args, "--sim-time-scale", "0.00001"]))

    async def go() -> list[EngineRequest]:
        loop = asyncio.create_task(engine.run())
        reqs = []
        for i, prompt in enumerate(prompts):
            gen = generate(prompt, max_tokens)
            reqs.append(EngineRequest(str(i), tokenize(prompt), gen.tokens, max_tokens))
            engine.add(reqs[-1])
        while not all(r.finished for r in reqs):
            await asyncio.sleep(0.001)
        loop.cancel()
        return reqs

    return asyncio.run(go()), engine


def test_kv_pressure_preempts_and_recomputes_without_losing_tokens():
    prompts = [r.prompt for r in article_rows("code")[:8]]
    reqs, engine = _run_all(["m", "--sim-kv-blocks", "60", "--block-size", "16"], prompts, 200)
    preempted = engine.metrics.registry.get_sample_value("vllm:num_preemptions_total",
                                                         {"model_name": "m", "engine": "0"})
    assert preempted is not None and preempted > 0 and sum(r.preemptions for r in reqs) == preempted
    for req, prompt in zip(reqs, prompts, strict=True):  # preempted requests still produce the target's text
        assert req.generated == list(generate(prompt, 200).tokens[:200])


def test_a_draft_model_costs_kv_capacity():
    def blocks(extra: list[str]) -> float:
        _, engine = build(parse_sim_args(["Qwen/Qwen3-8B", "--gpu-memory-utilization", "0.85", *extra]))
        return float(engine.cfg.num_blocks)

    baseline = blocks([])
    draft = blocks(["--speculative-config", json.dumps(DRAFT)])
    ngram = blocks(["--speculative-config", json.dumps(NGRAM)])
    assert ngram == baseline and draft < 0.7 * baseline


def test_suffix_cache_learns_from_past_requests():
    suffix = {"method": "suffix", "num_speculative_tokens": 16, "suffix_decoding_max_cached_requests": 0}
    cached = {**suffix, "suffix_decoding_max_cached_requests": 100}
    prompt = [article_prompt("chat", 3)] * 2

    def second_request_accepted(spec: dict) -> int:
        api, engine = build(parse_sim_args(["m", "--speculative-config", json.dumps(spec),
                                            "--sim-time-scale", "0.00001"]))

        async def go() -> list[EngineRequest]:
            loop = asyncio.create_task(engine.run())
            done = []
            for i, p in enumerate(prompt):  # one after the other, so the second can use the first
                gen = generate(p, 120)
                req = EngineRequest(str(i), tokenize(p), (*gen.tokens[:gen.natural_end], EOS), 120)
                engine.add(req)
                while not req.finished:
                    await asyncio.sleep(0.001)
                done.append(req)
            loop.cancel()
            return done

        stats = asyncio.run(go())[1].spec_stats
        assert stats is not None
        return stats.accepted

    assert second_request_accepted(cached) > 2 * max(second_request_accepted(suffix), 1)


def test_synthetic_rejection_accepts_at_the_preset_rates():
    spec = {**NGRAM, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [1.0, 1.0, 0.0, 0.0]}
    reqs, engine = _run_all(["m", "--speculative-config", json.dumps(spec)], [article_prompt("code", 1)], 200)
    stats = reqs[0].spec_stats
    assert stats is not None and stats.steps > 10
    # every drafting step accepts exactly min(2, slots): the preset, not the text, decides
    assert all(a == min(2, d) for a, d in zip(stats.per_step_accepted, stats.per_step_drafted, strict=True))
