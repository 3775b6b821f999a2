"""Running a query: the per-batch driver, a batch's stateful stages, the tasks, the sinks."""
