"""The run: inputs to token store to plan to shards, and the accounting of what was kept and lost."""
