"""The training side: collators, the DPO collator, and the checks that a shard fits a model."""
