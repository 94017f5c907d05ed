"""The controlled rollout: GPU-only baseline, a small CPU tier, a file tier only if justified."""
