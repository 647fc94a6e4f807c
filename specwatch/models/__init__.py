"""Model folders built from PyPI packages only (no hub): the SmolLM2 target and its drafts."""
