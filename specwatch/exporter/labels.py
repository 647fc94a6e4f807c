"""The exporter's label values: what a variant or task name may be, the request outcomes, which are errors."""

from __future__ import annotations

import re

# A variant (upstream route) or task name: a bounded, Prometheus-safe label value.
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
# `outcome` of specwatch_requests_total (and of each event-log line), every one pre-created at 0.
OUTCOMES = ("ok", "upstream_error", "bad_response", "client_abort", "rejected")
# The outcomes that count as errors (the `specwatch_error` recording rule, the canary's error ratio).
ERROR_OUTCOMES = ("upstream_error", "bad_response")
