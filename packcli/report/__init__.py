"""The read side: statistics, verification and inspection of packed outputs (and stats of raw inputs)."""
