"""The ``stats``, ``inspect`` and ``verify`` commands: flags in, library call, rich tables or JSON out.

Results go to stdout (a table for people, ``--json`` for machines); progress, warnings and problems
go to stderr.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

import packcli.cli.render as console
from packcli.cli.options import (
    OUTPUT,
    PACKING,
    TOKEN_PARAMETERS,
    ConfigOption,
    JsonFlag,
    cli_term,
    flag,
    given,
    merge_preset,
    with_options,
)
from packcli.config import OPTION_GROUPS

if TYPE_CHECKING:
    from packcli.report.reencode import Reencoded
    from packcli.results import OutputStats, RawStats

RAW_ONLY = ("max_len", *TOKEN_PARAMETERS, "num_proc", "cache_dir", "no_cache")
# The options of a raw-input stats run, by PackConfig name: what decides tokens, and the cache.
STATS_OPTIONS = (*OPTION_GROUPS["input"], *OPTION_GROUPS["tokenization"], "num_proc", "cache", "cache_dir")
STATS_PANELS: dict[str, tuple[str, str | None]] = {
    "max_len": (PACKING, "N[,N...]"),
    "batch_size": (PACKING, "N"),
    "plot": (OUTPUT, "FILE"),
}


# -- stats -----------------------------------------------------------------------------------------


# The options of pack that decide tokens, and the cache's, are flags of stats too (raw input).
@with_options(*(name for name in STATS_OPTIONS if name != "inputs"))
def stats(
    ctx: typer.Context,
    paths: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="PATHS",
            help="A packed output directory (it has manifest.json), or raw inputs, as for pack.",
            show_default=False,
        ),
    ] = None,
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
    config: ConfigOption = None,
    **options: Any,
) -> None:
    """Show rows, tokens, fill, padding and histograms of a packed output, or what packing raw input would give.

    Raw input takes the options of pack that decide tokens (and a --config preset, whose max_len is
    the default --max-len).

    Examples: packcli stats out/ ; packcli stats data.jsonl --max-len 2048,4096,8192
    """
    params = {"config": config, **options}  # the flags a --config preset may also set (raw input), by name
    from packcli.report.stats import output_stats, parse_max_lens

    run_options, max_len = _raw_input_options(ctx, paths, max_len, params)
    paths = _input_paths(paths, run_options)
    packed = _is_packed(ctx, paths, max_len)
    lens = parse_max_lens(max_len) if max_len is not None and not packed else []
    _check_stats_values(options["num_proc"], batch_size, plot)
    result: OutputStats | RawStats
    if packed:
        result = output_stats(Path(paths[0]), batch_size)
    else:
        result = _raw_stats(paths, run_options, lens, batch_size, json_out)
    _show_stats(result, packed, plot, json_out)


# The options of stats named as in PackConfig that a --config preset may also set (raw input).
_PRESET_FLAGS = (
    "split",
    "limit",
    "format",
    "task",
    "tokenizer",
    "chat_template",
    "processor",
    "train_on",
    "add_eos",
    "on_error",
    "fix_turns",
    "expand_turns",
    "prefix_tree",
    "cache_dir",
)


def _raw_input_options(
    ctx: typer.Context, paths: list[str] | None, max_len: str | None, params: dict[str, Any]
) -> tuple[dict[str, Any], str | None]:
    """Return the options of a raw-input run (the flags over a --config preset) and --max-len (else the preset's).

    For a packed output, no options and --max-len as given.
    """
    from packcli.report.stats import is_packed_output

    options: dict[str, Any] = {}
    if paths is None or not any(is_packed_output(Path(p)) for p in paths):
        flags = {name: params[name] for name in _PRESET_FLAGS}
        options = merge_preset(
            ctx,
            params["config"],
            flags,
            params["field"],
            params["template_kwarg"],
            params["num_proc"],
            params["no_cache"],
        )
        if max_len is None and isinstance(options.get("max_len"), int):
            max_len = str(options["max_len"])  # the preset's
    return options, max_len


def _input_paths(paths: list[str] | None, options: dict[str, Any]) -> list[str]:
    """Return the paths to read (given, else the preset's inputs); refuse none, or one that does not exist."""
    from packcli.errors import InputError, UsageError
    from packcli.io.sources import missing_input

    paths = list(paths) if paths else list(options.get("inputs", ()))
    if not paths:
        raise UsageError("no input given; pass a packed output directory or raw inputs, or name inputs in a --config")
    for p in paths:
        if missing_input(p):
            raise InputError(f"{p}: no such file or directory; check the path")
    return paths


def _is_packed(ctx: typer.Context, paths: list[str], max_len: str | None) -> bool:
    """Return whether the paths are one packed output (else raw inputs); refuse options of the other kind."""
    from packcli.errors import UsageError
    from packcli.report.stats import is_packed_output

    packed = [p for p in paths if is_packed_output(Path(p))]
    if packed and len(paths) > 1:
        raise UsageError(f"{packed[0]} is a packed output; pass it alone (raw inputs are compared separately)")
    if packed:
        raw_flags = [flag(n) if n != "add_eos" else "--add-eos/--no-add-eos" for n in RAW_ONLY if given(ctx, n)]
        if raw_flags:
            raise UsageError(
                f"{raw_flags[0]} applies to raw input only; {paths[0]} is a packed output (it has manifest.json)"
            )
    elif max_len is None:
        raise UsageError(
            f"{paths[0]} has no manifest.json, so it is read as raw input, which needs --max-len "
            "(e.g. --max-len 2048,4096,8192)"
        )
    return bool(packed)


def _check_stats_values(num_proc: int | None, batch_size: int, plot: str | None) -> None:
    """Refuse a --num-proc or --batch-size out of range, and a --plot file that cannot be written."""
    from packcli.config import option_problem
    from packcli.errors import UsageError

    for name, value in (("num_proc", num_proc), ("batch_size", batch_size)):
        problem = value is not None and option_problem(name, value)  # the rule pack and the library apply
        if problem:
            raise UsageError(problem, option=name)
    if plot is not None:
        from packcli.report.plot import check_plot_path

        check_plot_path(plot)


def _raw_stats(paths: list[str], options: dict[str, Any], lens: list[int], batch_size: int, json_out: bool) -> RawStats:
    """Return the figures of raw inputs at each max length (progress bars unless --json); warn on stderr."""
    from packcli.config import PackConfig
    from packcli.errors import Message
    from packcli.report.stats import raw_stats

    with console.progress_bars(enabled=not json_out) as progress:
        run_options = {k: v for k, v in options.items() if k in STATS_OPTIONS} | {"inputs": tuple(paths)}
        pack_config = PackConfig(max_len=max(lens), dry_run=True, **run_options)
        result = raw_stats(pack_config, lens, batch_size=batch_size, progress=progress)
    if result.warnings:  # named by the command line's flags, on stderr and in the JSON
        shown = [w.render(cli_term) if isinstance(w, Message) else w for w in result.warnings]
        result = dataclasses.replace(result, warnings=list(shown))
        for message in shown:
            console.warning(message)
    return result


def _show_stats(result: OutputStats | RawStats, packed: bool, plot: str | None, json_out: bool) -> None:
    """Draw the --plot file, then print the figures: JSON, or the packed or raw table."""
    from packcli.results import OutputStats

    if plot is not None:
        from packcli.report.plot import plot_histograms, write_plot

        title = f"packcli stats: {result['directory'] if packed else ', '.join(result['inputs'])}"
        write_plot(plot, title, _plot_summary(result), plot_histograms(result))
        console.stderr.print(f"wrote {plot}", soft_wrap=True)
    if json_out:
        console.emit_json(result.to_dict())
    elif isinstance(result, OutputStats):
        console.print_packed_stats(result)
    else:
        console.print_raw_stats(result)


def _plot_summary(result: OutputStats | RawStats) -> list[tuple[str, str]]:
    if result["mode"] == "packed":
        return [
            ("rows", f"{result['rows']:,}"),
            ("sequences", f"{result['sequences']:,}"),
            ("tokens", f"{result['tokens']:,}"),
            ("trainable tokens", f"{result['trainable_tokens']:,}"),
            ("fill", f"{result['fill']:.2%}"),
            ("max_len", f"{result['max_len']:,}"),
            ("records read", f"{result['records_read']:,}"),
            *_dropped_rows(result["dropped"]),
        ]
    out = [
        ("records read", f"{result['records_read']:,}"),
        ("samples", f"{result['samples']:,}"),
        ("tokens", f"{result['tokens']:,}"),
        *_dropped_rows(result["dropped"]),
    ]
    for line in result["max_lens"]:
        out.append(
            (
                f"max_len {line['max_len']:,}",
                f"{line['rows']:,} rows packed vs {line['rows_without_packing']:,} unpacked, fill {line['fill']:.2%}, "
                f"too long (dropped) {line['samples_too_long']:,}",
            )
        )
    return out


def _dropped_rows(dropped: dict[str, int]) -> list[tuple[str, str]]:
    """One summary row per reason records were left out, or one row saying none were."""
    if not dropped:
        return [("dropped", "0")]
    return [(f"dropped: {reason}", f"{count:,}") for reason, count in sorted(dropped.items())]


# -- inspect ---------------------------------------------------------------------------------------


def inspect(
    out_dir: Annotated[Path, typer.Argument(help="A packed output directory.")],
    row: Annotated[
        int | None, typer.Option("--row", metavar="N", help="Row to show, numbered from 0 across shards [default: 0].")
    ] = None,
    sample_index: Annotated[
        int | None,
        typer.Option(
            "--sample-index",
            metavar="N",
            help="Show this input record (0-based) alone: each of its samples (pieces, rounds, repeats) "
            "with its row and offset.",
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            metavar="NAME_OR_DIR", help="Decode with this tokenizer instead of the one named in the manifest."
        ),
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens", metavar="N", help="Decode only the first N tokens of each sample.", show_default="all"
        ),
    ] = None,
    pager: Annotated[
        bool | None,
        typer.Option("--pager/--no-pager", help="Page the row through $PAGER.", show_default="on a terminal"),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Decode one packed row: sample boundaries, trained tokens (green) and masked tokens (dim); or one input
    record's samples alone.

    Examples: packcli inspect out/ --row 3 ; packcli inspect out/ --sample-index 120 --json
    """
    from packcli.report.inspect import InspectedRow, inspect_row
    from packcli.report.sample import InspectedSample, inspect_sample

    result: InspectedRow | InspectedSample
    if sample_index is not None and row is None:
        result = inspect_sample(out_dir, sample_index, tokenizer=tokenizer, max_tokens=max_tokens)
    else:  # --row, or none (row 0); with both, inspect_row refuses them
        result = inspect_row(out_dir, row=row, sample_index=sample_index, tokenizer=tokenizer, max_tokens=max_tokens)
    show = console.print_sample if isinstance(result, InspectedSample) else console.print_row
    if not result.tokenizer_matches:
        console.stderr.print(
            f"warning: tokenizer '{result.tokenizer}' is not the one the output was packed with "
            "(its identity differs from manifest.json); the text may be wrong",
            soft_wrap=True,
        )
    if json_out:
        console.emit_json(result.to_dict(), ensure_ascii=False)
        return
    if pager if pager is not None else console.stdout.is_terminal:
        import os

        os.environ.setdefault("LESS", "-R")  # less shows the colours of trained and masked tokens
        with console.stdout.pager(styles=True):
            show(result)
    else:
        show(result)


# -- verify ----------------------------------------------------------------------------------------


def reencoded_line(reencoded: Reencoded) -> str:
    """What ``--reencode`` compared, or why it could not (its options named by their flags)."""
    from packcli.errors import Message

    if reencoded.skipped:
        why = reencoded.skipped
        return f"not re-encoded: {why.render(cli_term) if isinstance(why, Message) else why}"
    rows, samples = reencoded.rows, reencoded.samples
    return (
        f"re-encoded {rows:,} row{'s' if rows != 1 else ''} ({samples:,} sample{'s' if samples != 1 else ''}) "
        "with tokenizers: the same"
    )


def verify(
    out_dir: Annotated[Path, typer.Argument(help="A packed output directory.")],
    reencode: Annotated[
        int,
        typer.Option(
            "--reencode",
            metavar="N",
            min=0,
            help="Also encode N rows again from the inputs with tokenizers (whichever encoder made them) "
            "and compare ids and labels.",
        ),
    ] = 0,
    json_out: JsonFlag = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Check every shard against manifest.json (present, sha256, counts) and the row contract.

    Exit code 0 when the output is whole, 1 with one line per problem on stderr.
    """
    from packcli.report.verify import verify_output

    with console.progress_bars(enabled=not (quiet or json_out)) as progress:
        report = verify_output(out_dir, progress, reencode)
    for problem in report.problems:
        typer.echo(problem.render(cli_term), err=True)
    if json_out:
        console.emit_json(report.to_dict(cli_term))
    elif report.ok:
        # Records and samples differ for preference pairs and split records: both are then named.
        of_records = f" of {report.records:,} records" if report.records != report.samples else ""
        # Tokens as the manifest counts them; the padding the rows also hold, apart.
        padding = report.tokens - report.sample_tokens
        padded = f" and {padding:,} padding tokens" if padding else ""
        images = "" if report.images is None else f", {report.images:,} image{'s' if report.images != 1 else ''}"
        typer.echo(
            f"OK {out_dir}: {report.shards} shard{'s' if report.shards != 1 else ''}, {report.rows:,} rows, "
            f"{report.sample_tokens:,} tokens{padded}, {report.samples:,} samples{of_records}{images}; "
            "checksums, counts and the row contract hold" + (" with their images" if images else "")
        )
        if report.reencoded is not None:
            typer.echo(reencoded_line(report.reencoded))
    if not report.ok:
        n = len(report.problems)
        typer.echo(f"{n} problem{'s' if n != 1 else ''} in {out_dir}", err=True)
        raise typer.Exit(1)
