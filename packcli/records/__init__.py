"""Records to samples: the input formats, preference pairs, per-record checks and turn cleaning, and a JSON
line decoded (``json_line``)."""
