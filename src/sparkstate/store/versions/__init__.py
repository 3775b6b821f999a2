"""Versions on durable storage: file names and layout, lineage, changelogs, versioned providers."""
