"""Load generation: Locust users that send the article's task-labelled workloads at fixed concurrency."""
