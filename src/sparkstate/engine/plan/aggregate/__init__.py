"""Planning a streaming aggregation: its aggregates read off Spark's analysis."""
