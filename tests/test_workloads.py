"""The article's workloads and the user JSONL reader."""

import hashlib
import json
from pathlib import Path

import pytest

from specwatch.experiment.layout import RunFolder
from specwatch.report import results as report_results
from specwatch.workloads import ROWS_PER_TASK, SOURCE, WorkloadError, article_rows, load_jsonl, write_article_workloads


def test_code_rows_follow_the_article():
    rows = article_rows("code", "zh")
    assert len(rows) == ROWS_PER_TASK
    # row i edits scale_{i % 12} to 100 + i and carries the whole 12-function source
    assert rows[13].prompt.startswith("只把 scale_1 的乘数改成 113,")
    assert rows[13].prompt.endswith(SOURCE)
    assert SOURCE.count("def scale_") == 12 and "def scale_11(value):\n    return value * 12" in SOURCE


def test_chat_rows_rotate_four_topics():
    rows = article_rows("chat", "en")
    assert rows[5].prompt == ("Case 5: in two full paragraphs, describe why users may still wait although the "
                              "cache hit rate is high.")
    assert len({r.prompt.split(", ", 1)[1] for r in rows}) == 4
    assert article_rows("chat", "zh")[0].prompt == "案例 0:请用两段完整的文字解释推理服务为什么要同时关注吞吐与延迟。"


def test_written_files_and_digests(tmp_path):
    digests = write_article_workloads(tmp_path, "zh")
    for task in ("code", "chat"):
        raw = (tmp_path / f"{task}.jsonl").read_bytes()
        assert hashlib.sha256(raw).hexdigest() == digests[f"{task}.jsonl"]
        lines = raw.decode().splitlines()
        assert len(lines) == 64 and all(json.loads(line)["output_tokens"] == 128 for line in lines)
    assert (tmp_path / "sha256.txt").read_text().count("  ") == 2


def test_user_jsonl_accepts_prompt_and_messages(tmp_path):
    f = tmp_path / "mine.jsonl"
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "yo"}]
    f.write_text('{"prompt": "hi", "output_tokens": 7}\n\n' + json.dumps({"messages": messages, "task": "chat"}) + "\n")
    rows = load_jsonl(f, "code")
    assert [(r.task, r.prompt, r.output_tokens) for r in rows] == [("code", "hi", 7), ("chat", "yo", 128)]


@pytest.mark.parametrize("line,match", [
    ("not json", ":2: not JSON"),
    ('{"prompt": ""}', ":2: expected a non-empty `prompt`"),
    ('{"prompt": "x", "output_tokens": 0}', ":2: `output_tokens` must be a positive integer"),
    ("[1]", ":2: expected a JSON object"),
])
def test_bad_row_reported_with_line_number(tmp_path, line, match):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(WorkloadError, match=match):
        load_jsonl(f, "code")


def test_the_report_reads_each_prompt_as_the_load_sent_it(tmp_path: Path) -> None:
    """Issue 43: a `messages` row with two user turns is sent with its last user message (`load_jsonl`); the report
    read the first, so its outputs table named a prompt the server never answered."""
    run = RunFolder(tmp_path)
    run.inputs.mkdir(parents=True)
    turns = [{"role": "user", "content": "first question"}, {"role": "assistant", "content": "an answer"},
             {"role": "user", "content": "the follow-up that was sent"}]
    (run.inputs / "chat.jsonl").write_text(json.dumps({"messages": turns}) + "\n" + json.dumps({"prompt": "p2"}) + "\n")
    sent = [row.prompt for row in load_jsonl(run.inputs / "chat.jsonl", "chat")]
    assert sent == ["the follow-up that was sent", "p2"]
    assert report_results._prompts(run) == {"chat": sent}
