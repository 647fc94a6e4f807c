"""Prometheus for specwatch: recording rules as data, their promtool tests, targets, the local server."""
