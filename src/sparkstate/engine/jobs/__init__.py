"""One-off Spark jobs over a whole checkpoint: rescale, export, migrate, take over."""
