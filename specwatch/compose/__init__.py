"""The compose stack's machinery: its images built with or without a registry, a private Docker engine."""
