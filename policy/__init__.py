"""Cache policy: trace readers, the tiered what-if simulator, the cost model, recommendations."""
