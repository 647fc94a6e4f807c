"""`specwatch tune`: from a sweep (one method x draft length k x concurrency), the best k per batch size.

Modules: `sweep` (a sweep run folder in: per cell, per request TPOT, decode steps, the
position-wise acceptance), `fit` (expected tokens per step per k from the acceptance, step cost
per (batch size, k), the recommendation and its bootstrap intervals), `live` (the acceptance from
a Prometheus window of live traffic instead), `render` (the report and the plot), `tuner` (the
files `specwatch tune` writes), `dynamic` (the proof's measurement: the recommendation run as one more
variant of the sweep's folder, through `specwatch.experiment`), `proof` (the recommended dynamic config
against every fixed k), `cli` (the verb). The cost table's rules file is written by
`specwatch.promconfig.cost_rules`, beside the other rule writers.
"""
