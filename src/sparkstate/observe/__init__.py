"""Reading and watching a checkpoint's state and progress: the state reader, inspect, report."""
