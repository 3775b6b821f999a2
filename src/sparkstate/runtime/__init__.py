"""What runs a partition and a batch without Spark (imports no pyspark).

- :mod:`~sparkstate.runtime.partition`: open version ``b`` -> operator -> commit or abort, once.
- :mod:`~sparkstate.runtime.providers`: the worker-level provider cache and maintenance.
- :mod:`~sparkstate.runtime.tasks`: a stateful task and the catch-up commit, with their reports.
- :mod:`~sparkstate.runtime.records`: task reports, batch intents and commits, typed, as JSON.
- :mod:`~sparkstate.runtime.logs`: the engine's checkpoint logs.
- :mod:`~sparkstate.runtime.metadata`: what a restart must share with its checkpoint.
- :mod:`~sparkstate.runtime.watermark`: event-time watermarks with Spark's rules.
- :mod:`~sparkstate.runtime.triggers`: when a query needs a batch without new data.
- :mod:`~sparkstate.runtime.progress`: progress in the shape of Spark's, from the task reports.
"""
