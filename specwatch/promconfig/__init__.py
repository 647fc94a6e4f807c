"""Prometheus for specwatch: recording rules and alerts as data, their promtool tests, targets, the local server."""
