"""Options shared by several commands, declared once, and helpers to tell what the user gave."""

from __future__ import annotations

from typing import Annotated

import typer

JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
QuietFlag = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars and no summary table.")]


def given(ctx: typer.Context, name: str) -> bool:
    """Return whether the user gave option ``name`` (on the command line, not by default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def flag(name: str) -> str:
    """Return the flag of an option name: ``max_len`` -> ``--max-len``."""
    return "--" + name.replace("_", "-")
