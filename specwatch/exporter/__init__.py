"""The tap: an OpenAI-compatible pass-through that accounts speculative decoding by variant and task."""
