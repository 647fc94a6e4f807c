"""`vllm serve` argv: the article's common flags, and the per-request flag only with a speculative config."""

import json

from specwatch import cli
from specwatch.models.dtype import cpu_dtype
from specwatch.vllm_cpu.server import NGRAM_CONFIG, serve_argv, server_environment


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_baseline_has_common_flags_and_no_spec_flags():
    argv = serve_argv("/m", port=8123)
    assert argv[0] == "/m" and flag(argv, "--port") == "8123" and flag(argv, "--host") == "127.0.0.1"
    assert flag(argv, "--served-model-name") == "spec-demo" and flag(argv, "--seed") == "42"
    assert flag(argv, "--generation-config") == "vllm" and "--no-enable-prefix-caching" in argv
    assert "--speculative-config" not in argv and "--per-request-spec-decode-metrics" not in argv


def test_ngram_variant_is_the_articles():
    argv = serve_argv("/m", speculative_config=NGRAM_CONFIG, extra=["--max-num-seqs", "4"])
    assert json.loads(flag(argv, "--speculative-config")) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert flag(argv, "--per-request-spec-decode-metrics") == "detailed"
    assert argv[-2:] == ["--max-num-seqs", "4"]  # user flags come last, so they win


def test_environment_sets_kv_space_but_respects_the_caller():
    assert server_environment({})["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert server_environment({"VLLM_CPU_KVCACHE_SPACE": "4"})["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert server_environment({})["HF_HUB_OFFLINE"] == "1"
    # no separate worker process (a faster start); a user's own setting wins
    assert server_environment({})["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert server_environment({"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_serve_verb_prints_the_command(capsys, tmp_path):
    code = cli.main(["--home", str(tmp_path), "vllm-cpu", "serve", "--variant", "ngram", "--port", "8011",
                     "--print-argv", "--", "--max-num-seqs", "2"])
    assert code == cli.EXIT_OK
    line = capsys.readouterr().out.strip()
    assert str(tmp_path / "models" / "smollm2-135m-instruct") in line
    assert "vllm_entry.py serve" in line and line.endswith("--max-num-seqs 2")


def test_demo_rejects_bad_numbers(tmp_path, capsys):
    assert cli.main(["--home", str(tmp_path), "check-server", "--rows", "0"]) == cli.EXIT_USAGE
    assert "must be positive" in capsys.readouterr().err


def test_serve_without_environment_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["--home", str(tmp_path), "vllm-cpu", "serve"]) == cli.EXIT_ERROR
    assert "run `specwatch vllm-cpu setup`" in capsys.readouterr().err


def test_dtype_follows_native_bf16_support():
    assert cpu_dtype("flags : fpu avx2 avx512f avx512_bf16 amx_tile") == "bfloat16"
    assert cpu_dtype("flags : fpu sse4_2 avx2 fma") == "float32"
    assert flag(serve_argv("/m", dtype="bfloat16"), "--dtype") == "bfloat16"
    assert flag(serve_argv("/m"), "--dtype") in {"bfloat16", "float32"}
