"""Durable files: a directory over any pyarrow file system (atomic writes, listings, syncs),
JSON files checked as they are read, and file locks: the floor the rest of the house stands on."""
