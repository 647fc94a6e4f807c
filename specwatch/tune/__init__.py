"""Draft-length tuning: the best k per batch size, from measured acceptance and step cost."""
