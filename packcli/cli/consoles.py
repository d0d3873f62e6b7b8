"""The two consoles and the lines written on them: stderr for people (``Error:`` and ``Warning:`` lines,
progress bars), stdout for what a command prints (under ``--json``, kept for its JSON alone).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    stderr: Console
    stdout: Console

STAGE_LABELS = {"tokenize": "Tokenizing records", "write": "Writing rows"}


@functools.cache
def _console(name: str) -> Console:
    """The console ``stderr`` or ``stdout``, made (and rich imported) when a line is first printed on it:
    a run that prints nothing for people, such as ``pack -q --json`` without warnings, never imports rich."""
    from rich.console import Console

    if name == "stderr":
        return Console(stderr=True, highlight=False)
    return Console(highlight=False, emoji=False)


def __getattr__(name: str) -> Any:
    if name in ("stderr", "stdout"):
        return _console(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The stdout that --json writes to, while everything else written to stdout goes to stderr.
_JSON_STDOUT: ContextVar[Any] = ContextVar("json_stdout", default=None)


@contextmanager
def stdout_for_json(enabled: bool) -> Iterator[None]:
    """While a ``--json`` command runs, keep stdout for its JSON: other writes to it go to stderr.

    Libraries print there too (Ray's driver prints a task's retry notice on stdout), and one such line
    would make the output unreadable by ``json.load``. ``emit_json`` writes to the stdout kept here.
    """
    if not enabled:
        yield
        return
    kept = _JSON_STDOUT.set(sys.stdout)
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_STDOUT.reset(kept)


def emit_json(data: Any, ensure_ascii: bool = True) -> None:
    """Write ``data`` as indented JSON (one document) to stdout, the one kept by ``stdout_for_json``."""
    import json

    stream = _JSON_STDOUT.get() or sys.stdout
    stream.write(json.dumps(data, indent=2, ensure_ascii=ensure_ascii) + "\n")
    stream.flush()


def error(message: str) -> None:
    """Print one error line on stderr."""
    _line("Error:", "bold red", message)


def warning(message: str) -> None:
    """Print one warning line on stderr."""
    _line("Warning:", "bold yellow", message)


# What rich leaves out of a line it prints (bell, backspace, vertical tab, form feed, carriage return).
_LEFT_OUT = dict.fromkeys((7, 8, 11, 12, 13))


def _line(label: str, style: str, message: str) -> None:
    """One labelled line on stderr: in colour through rich on a terminal (or where colour is forced), else as
    plain text, which is what rich would print there, without importing it (a tenth of a cache hit)."""
    plain = not sys.stderr.isatty() and not os.environ.get("FORCE_COLOR") and not os.environ.get("TTY_COMPATIBLE")
    if plain and "\t" not in message:  # rich puts a tab to the next stop by the width of what is before it
        sys.stderr.write(f"{label} {message}".translate(_LEFT_OUT) + "\n")
        sys.stderr.flush()
        return
    from rich.markup import escape

    _console("stderr").print(
        f"[{style}]{label}[/] {escape(message)}", soft_wrap=True, markup=True, highlight=False, emoji=False
    )


@contextmanager
def progress_bars(enabled: bool) -> Iterator[Any]:
    """Yield a progress callback (stage, advance, total); bars only on a terminal and when enabled."""
    if not enabled or not sys.stderr.isatty():
        yield lambda stage, advance, total: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=_console("stderr"),
        transient=False,
    )
    tasks: dict[str, TaskID] = {}

    def update(stage: str, advance: int, total: int | None) -> None:
        if stage not in tasks:
            tasks[stage] = bars.add_task(STAGE_LABELS.get(stage, stage), total=total, rate="")
        task = tasks[stage]
        bars.update(task, advance=advance, total=total)
        speed = bars.tasks[task].speed
        if speed:
            bars.update(task, rate=f"{speed:,.0f}/s")

    with bars:
        yield update
