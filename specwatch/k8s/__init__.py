"""What `deploy/k8s/` needs generated from the repository: the rules as PrometheusRule objects, dashboard copies."""
