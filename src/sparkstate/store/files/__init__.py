"""Durable and local files: atomic writes over pyarrow.fs, JSON files, locks, local dirs."""
