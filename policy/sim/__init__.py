"""The tiered what-if simulator: policies, tier flows, replay and statistics."""
