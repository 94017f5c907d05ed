"""probes/scrape."""
