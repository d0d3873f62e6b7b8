"""packcli: turn raw fine-tuning data into packed, trainer-ready shards.

The library: :func:`pack`, :func:`stats`, :func:`verify` and :func:`inspect_row` (see docs/api.md);
``packcli`` on the command line is one client of it. Names load on first use, so that importing
packcli (and ``packcli --help``) stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy loading below returns, for type checkers
    from packcli.api import PackResult, inspect_row, pack, stats, verify
    from packcli.errors import (
        IncompatibleError,
        InputError,
        OutputError,
        PackcliError,
        TokenizerError,
        UsageError,
    )

from packcli.version import __version__

__all__ = [
    "IncompatibleError",
    "InputError",
    "OutputError",
    "PackResult",
    "PackcliError",
    "TokenizerError",
    "UsageError",
    "__version__",
    "inspect_row",
    "pack",
    "stats",
    "verify",
]

_API = {"pack", "stats", "verify", "inspect_row", "PackResult"}
_ERRORS = {"PackcliError", "UsageError", "InputError", "OutputError", "TokenizerError", "IncompatibleError"}


def __getattr__(name: str) -> Any:
    if name in _API:
        from packcli import api

        return getattr(api, name)
    if name in _ERRORS:
        from packcli import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'packcli' has no attribute {name!r}")
