"""The key of a tokenization cache entry: a hash of everything that decides the tokens, and where entries live."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

# 7: keyed by the inputs' contents (no path), the template's source; meta.made. 8: samples.npz holds each
# sample's record content key (content_key, for --dedup exact).
CACHE_FORMAT = 8


def default_cache_dir() -> Path:
    """Return $PACKCLI_CACHE, else $XDG_CACHE_HOME/packcli, else ~/.cache/packcli."""
    if os.environ.get("PACKCLI_CACHE"):
        return Path(os.environ["PACKCLI_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "packcli"


def cache_root(named: str | None) -> Path:
    """The cache directory: the one named (``--cache-dir``), else ``default_cache_dir()``."""
    return Path(named) if named else default_cache_dir()


def cache_key(parts: dict[str, Any]) -> str:
    """Return a stable hex key for everything that decides the tokens."""
    blob = json.dumps({"cache_format": CACHE_FORMAT, **parts}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:32]
