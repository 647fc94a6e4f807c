"""The source article's two workloads (code edit, open chat) and task-labelled JSONL files.

The article's prompts are Chinese (`lang="zh"`, verbatim). SmolLM2, the model that runs on
CPU here, is English-only, so `lang="en"` gives the same prompts translated (the form the
reference CPU measurements used). Both keep the article's structure: the code task copies
a 12-function source with one change, the chat task asks for prose on 4 rotating topics.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

TASKS = ("code", "chat")
ROWS_PER_TASK = 64
OUTPUT_TOKENS = 128

SOURCE = "\n\n".join(f"def scale_{i}(value):\n    return value * {i + 1}" for i in range(12))

CODE_PROMPT = {
    "zh": "只把 scale_{fn} 的乘数改成 {mult},其余函数保持不变。输出完整的 Python 文件,不要解释,也不要代码围栏。\n",
    "en": "Change only the multiplier of scale_{fn} to {mult}; keep every other function unchanged. "
          "Output the whole Python file, no explanation, no code fences.\n",
}
CHAT_PROMPT = {"zh": "案例 {i}:请用两段完整的文字{topic}。", "en": "Case {i}: in two full paragraphs, {topic}."}
TOPICS = {
    "zh": (
        "解释推理服务为什么要同时关注吞吐与延迟",
        "说明缓存命中率很高、用户却仍在等待的可能原因",
        "讨论团队怎样选择一个便于维护的部署方案",
        "解释为什么平均指标会掩盖少量严重的失败",
    ),
    "en": (
        "explain why an inference service must watch both throughput and latency",
        "describe why users may still wait although the cache hit rate is high",
        "discuss how a team should pick a deployment that is easy to maintain",
        "explain why averages hide a small number of severe failures",
    ),
}


class WorkloadError(ValueError):
    """A workload file or row is not what specwatch expects; the message names file and line."""


@dataclass(frozen=True)
class Row:
    task: str
    prompt: str
    output_tokens: int = OUTPUT_TOKENS

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.prompt}]


def article_prompt(task: str, i: int, lang: str = "en") -> str:
    if lang not in CODE_PROMPT:
        raise WorkloadError(f"unknown workload language {lang!r}; expected one of {sorted(CODE_PROMPT)}")
    if task == "code":
        return CODE_PROMPT[lang].format(fn=i % 12, mult=100 + i) + SOURCE
    if task == "chat":
        return CHAT_PROMPT[lang].format(i=i, topic=TOPICS[lang][i % len(TOPICS[lang])])
    raise WorkloadError(f"unknown article task {task!r}; expected one of {TASKS}")


def article_rows(task: str, lang: str = "en", count: int = ROWS_PER_TASK) -> list[Row]:
    return [Row(task, article_prompt(task, i, lang)) for i in range(count)]


def write_article_workloads(out: Path, lang: str = "en") -> dict[str, str]:
    """Write `code.jsonl`, `chat.jsonl` and `sha256.txt` into `out`; return file -> sha256."""
    out.mkdir(parents=True, exist_ok=True)
    digests: dict[str, str] = {}
    for task in TASKS:
        body = "".join(
            json.dumps({"prompt": r.prompt, "output_tokens": r.output_tokens}, ensure_ascii=False) + "\n"
            for r in article_rows(task, lang)).encode()
        (out / f"{task}.jsonl").write_bytes(body)
        digests[f"{task}.jsonl"] = hashlib.sha256(body).hexdigest()
    (out / "sha256.txt").write_text("".join(f"{d}  {n}\n" for n, d in digests.items()))
    return digests


def load_jsonl(path: Path, default_task: str) -> list[Row]:
    """Rows of a user JSONL file: `prompt` (or a user `messages` list), optional `task`, `output_tokens`."""
    rows: list[Row] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        prompt = obj.get("prompt")
        if prompt is None and isinstance(obj.get("messages"), list):
            users = [m.get("content") for m in obj["messages"] if isinstance(m, dict) and m.get("role") == "user"]
            prompt = users[-1] if users else None
        if not isinstance(prompt, str) or not prompt:
            raise WorkloadError(f"{where}: expected a non-empty `prompt` string or a `messages` list "
                                "with a user message")
        tokens = obj.get("output_tokens", OUTPUT_TOKENS)
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise WorkloadError(f"{where}: `output_tokens` must be a positive integer, got {tokens!r}")
        task = obj.get("task", default_task)
        if not isinstance(task, str) or not task:
            raise WorkloadError(f"{where}: `task` must be a non-empty string, got {task!r}")
        rows.append(Row(task, prompt, tokens))
    if not rows:
        raise WorkloadError(f"{path}: no rows")
    return rows
