"""The collector: the event schema, the recorder engines call, and the DuckDB trace store."""
