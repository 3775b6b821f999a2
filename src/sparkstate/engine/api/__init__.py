"""What the user calls: the wrapped stream, its ``groupBy``, ``writeStream`` and trigger."""
