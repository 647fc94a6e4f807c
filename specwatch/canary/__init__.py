"""`specwatch canary`: candidate against baseline per task, from the event log and Prometheus, with a verdict."""
