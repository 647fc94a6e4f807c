"""Grafana dashboards for specwatch, generated from Python as plain JSON dicts (no SDK dependency).

`panels` builds panels and targets, `board` assembles a dashboard (variables, layout, links),
`acceptance`, `latency` and `canary` hold one dashboard each, and `dashboards` writes or checks
`specwatch/data/grafana/dashboards/*.json` (`python -m specwatch.grafana.dashboards`).
Windows, thresholds and alert names come from `specwatch.monitoring`, as for the rules.
"""
