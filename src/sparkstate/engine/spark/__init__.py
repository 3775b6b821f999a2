"""What touches Spark's internals: sessions, confs, schemas, versions, listeners, the JVM."""
