"""specwatch: observability and experiments for speculative decoding on vLLM."""

__version__ = "0.1.0"
