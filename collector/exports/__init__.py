"""Exports to existing monitoring stacks: Prometheus, OTLP, Grafana, alert rules."""
