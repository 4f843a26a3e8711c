"""Rule-based reward functions, one module per data source family."""
