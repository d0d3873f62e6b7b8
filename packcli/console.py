"""Everything a person sees: progress bars and summary tables on stderr, via rich."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

stderr = Console(stderr=True, highlight=False)

STAGE_LABELS = {"tokenize": "Tokenizing records", "write": "Writing rows"}


def error(message: str) -> None:
    """Print one error line on stderr."""
    stderr.print(f"[bold red]Error:[/] {escape(message)}", soft_wrap=True, markup=True, highlight=False, emoji=False)


def warning(message: str) -> None:
    """Print one warning line on stderr."""
    stderr.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True, markup=True, highlight=False, emoji=False)


@contextmanager
def progress_bars(enabled: bool) -> Iterator[Any]:
    """Yield a progress callback (stage, advance, total); bars only on a terminal and when enabled."""
    if not enabled or not sys.stderr.isatty():
        yield lambda stage, advance, total: None
        return
    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=stderr,
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


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_pack_summary(summary: dict[str, Any]) -> None:
    """Render the pack summary as a table on stderr."""
    table = Table(title="packcli pack", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("records read", _fmt(summary["records_read"]))
    table.add_row("packed", _fmt(summary["packed"]))
    for reason, count in summary["dropped"].items():
        table.add_row(f"dropped: {reason}", _fmt(count))
    if summary.get("truncated"):
        table.add_row("truncated", _fmt(summary["truncated"]))
    if summary.get("duplicated"):
        table.add_row("duplicated (rank padding)", _fmt(summary["duplicated"]))
    table.add_row("tokens", _fmt(summary["tokens"]))
    table.add_row("trainable tokens", _fmt(summary["trainable_tokens"]))
    table.add_row("rows", _fmt(summary["rows"]))
    table.add_row("fill", f"{summary['fill']:.2%}")
    table.add_row(
        "rows over L2 bound",
        f"{summary['rows_over_l2']:,} ({summary['rows_over_l2_fraction']:.3%}; L2 = {summary['lower_bound_l2']:,})",
    )
    without = summary["padding_tokens_without_packing"]
    table.add_row(
        "padding saved",
        f"{without - summary['padding_tokens']:,} tokens ({summary['rows_without_packing']:,} rows unpacked)",
    )
    if summary["world_size"] > 1:
        table.add_row("rank token spread", f"{summary['rank_token_spread']:.3%}")
    table.add_row("cache", summary["cache"])
    if "seconds" in summary:
        table.add_row("time", f"{summary['seconds']['total']:.1f} s ({summary['tokens_per_second']:,} tokens/s)")
    if summary.get("output"):
        table.add_row("output", summary["output"])
    stderr.print(table)
