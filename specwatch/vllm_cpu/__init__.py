"""The real vLLM 0.32.0 CPU build: its environment, its launcher and its captures."""
