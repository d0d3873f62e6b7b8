"""packcli's version: one home, below every layer (the manifest, the cache key and the stores record it)."""

__version__ = "0.10.0"
