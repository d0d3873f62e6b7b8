"""Worker processes: the local pool, and the rule that a worker never outlives packcli."""
