"""Rows and shards: row layout, the shard formats, the manifest, output path rules and atomic staging."""
