"""The typer app, and the one table that turns errors into exit codes.

``main()`` is the entry point: known errors become one ``Error: ...`` line on stderr and an exit code
(1 bad data or output, 2 bad usage, 130 interrupted); only unexpected errors show a traceback. The
commands live in ``pack.py`` and ``report.py`` and know nothing of this module; they are registered
at the end.
"""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from packcli.cli.options import cli_message
from packcli.errors import INTERRUPTED, Interrupted, PackcliError, UsageError
from packcli.version import __version__


def _untyped(ctx: Any) -> None:
    return None


def _without_type_labels(params: list[Any]) -> list[Any]:
    """Drop typer's type label (``<bool>``, ``<list[str]>``) from flags and arguments in ``--help``.

    A flag takes no value (``<bool>`` invites ``--dry-run true``, which is an extra argument), and an
    argument is named by its metavar (``INPUTS...``) already.
    """
    for param in params:
        if getattr(param, "is_flag", False) or param.param_type_name == "argument":
            param.display_type_rich = _untyped
    return params


class Command(typer.core.TyperCommand):
    """A command whose help shows no type label on flags and arguments."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _without_type_labels(super().get_params(ctx))


class Group(typer.core.TyperGroup):
    """The root group: its help shows no type label on flags either."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _without_type_labels(super().get_params(ctx))


app = typer.Typer(
    name="packcli",
    cls=Group,
    help="Pack raw fine-tuning data into trainer-ready Parquet shards.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


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


def known_error(exc: BaseException) -> tuple[str, int] | None:
    """The one place a known error becomes its line (options named as flags) and its exit code; None for
    an unexpected one (its traceback is shown).

    Each error class carries its code (``PackcliError.exit_code``: 1 data or output, 2 usage, 130
    interrupted); a KeyboardInterrupt is an interrupted run, and a flag the parser refuses bad usage.
    """
    if isinstance(exc, KeyboardInterrupt):
        exc = Interrupted(INTERRUPTED)
    if isinstance(exc, PackcliError):
        return cli_message(exc), exc.exit_code
    usage = _usage_error(exc) if isinstance(exc, Exception) else None
    return None if usage is None else (usage, UsageError.exit_code)


def handle_errors(command: Callable[..., None]) -> Callable[..., None]:
    """Turn known errors into one ``Error: ...`` line on stderr and their exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        import packcli.cli.render as console

        try:
            with console.stdout_for_json(bool(kwargs.get("json_out"))):
                command(*args, **kwargs)
        except (PackcliError, KeyboardInterrupt) as exc:
            known = known_error(exc)
            if known is None:  # never: both are known errors
                raise
            console.error(known[0])
            raise typer.Exit(known[1]) from None

    return wrapper


STALLED = (
    "the run stopped making progress: its worker processes are gone and none answered for "
    "{seconds:.0f} s; run again, with a lower --num-proc if memory is short"
)


def _on_signal(signum: int, frame: Any) -> None:
    # The first SIGINT/SIGTERM asks the run to stop at its next safe point (within a batch); the watchdog
    # ends it if none comes within its grace. A second one ends it at once: the workers are killed, the
    # temporary files removed (procs.cleanup), never in the middle of the swap that makes the output.
    from packcli.procs.cleanup import end_now
    from packcli.procs.stop import begin_stopping, request_stop, stop_at_once, stop_requested

    if stop_requested():
        end_now(Interrupted.exit_code, f"Error: {INTERRUPTED}")
        return
    request_stop()
    if stop_at_once():  # blocked where no safe point comes (a FIFO no program writes): stop there
        begin_stopping()
        raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; map known errors to one line on stderr and an exit code."""
    import packcli.cli.render as console
    from packcli.procs import watchdog

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    watchdog.start(f"Error: {INTERRUPTED}", "Error: " + STALLED.format(seconds=watchdog.STALL))
    try:
        code = app(args=argv, prog_name="packcli", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (Exception, KeyboardInterrupt) as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            # Making the error rendered the help already (rich prints it as it renders); print it only
            # where rendering gave the text back instead.
            text = exc.format_message() if hasattr(exc, "format_message") else ""
            if text.strip():
                print(text, file=sys.stderr)
            sys.exit(UsageError.exit_code)
        known = known_error(exc)
        if known is None:
            raise
        message, code = known
        console.error(message)
        sys.exit(code)
    finally:
        for sig in previous:
            # The command is over, its output complete or left as it was: the process only exits. A signal
            # now must not turn that exit code into death by the signal, which Python's shutdown (it puts
            # the default handlers back) would allow: the run would look failed with a complete output.
            signal.signal(sig, signal.SIG_IGN)


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


def _register() -> None:
    import packcli.cli.cache as cache
    import packcli.cli.pack as pack
    import packcli.cli.report as report
    from packcli.cli.options import place

    app.command("pack", cls=Command)(handle_errors(place(pack.pack, {})))
    app.command("stats", cls=Command)(handle_errors(place(report.stats, report.STATS_PANELS)))
    for name, command in (("inspect", report.inspect), ("verify", report.verify)):
        app.command(name, cls=Command)(handle_errors(command))
    cache_app = typer.Typer(
        name="cache", help="See and prune the tokenization cache.", no_args_is_help=True, rich_markup_mode="markdown"
    )
    cache_app.command("ls", cls=Command)(handle_errors(cache.ls))
    cache_app.command("prune", cls=Command)(handle_errors(cache.prune))
    app.add_typer(cache_app)


_register()
