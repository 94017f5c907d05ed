"""Probes: in-engine hooks, event taps, metric scrapers, active probes, the reference engine."""
