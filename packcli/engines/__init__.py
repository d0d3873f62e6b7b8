"""Engines other than the default in-process one. Each is imported only when chosen."""
