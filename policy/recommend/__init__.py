"""From the admission model to settings engines understand: value and priorities, the
threshold sweep, the Recommendation value, the report, and the rollback rule."""
