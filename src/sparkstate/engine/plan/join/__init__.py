"""Planning a stream-stream join: Spark's analysis of the join, read back."""
