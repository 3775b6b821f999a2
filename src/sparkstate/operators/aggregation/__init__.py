"""Streaming aggregation: its operators (windows, session windows) and the aggregate functions'
buffers and merges."""
