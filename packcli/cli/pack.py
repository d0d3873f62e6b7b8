"""``packcli pack``: flags (and a preset) in, one frozen config, the library call, the summary out."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any

import typer

from packcli.cli.options import (
    ConfigOption,
    JsonFlag,
    QuietFlag,
    cli_term,
    given,
    merge_preset,
    with_options,
)
from packcli.config import PackConfig

if TYPE_CHECKING:
    from packcli.results import RunSummary

# The options whose parameter here has their own name, passed on as given; the others of PackConfig come
# from --field, --template-kwarg, --num-proc and --no-cache (merge_preset).
_AS_GIVEN = tuple(
    f.name
    for f in dataclasses.fields(PackConfig)
    if f.name not in ("inputs", "fields", "template_kwargs", "num_proc", "cache")
)

# Options that only some --overflow modes read: given with another mode, they would do nothing.
_OVERFLOW_ONLY = {"truncate_side": ("truncate", "split"), "split_system": ("split",), "min_piece": ("split",)}


InputsArgument = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="INPUTS",
        help="Files (.jsonl .json .csv, also .gz .zst .bz2 .xz; .parquet .arrow), directories, globs, "
        "saved datasets, Hub names, or - for JSON lines on stdin.",
        show_default=False,
    ),
]


# Every option of PackConfig but its inputs is a flag of pack, built from its declaration.
@with_options(*(f.name for f in dataclasses.fields(PackConfig) if f.name != "inputs"))
def pack(
    ctx: typer.Context,
    inputs: InputsArgument = None,
    config: ConfigOption = None,
    *,
    json_out: JsonFlag = False,
    quiet: QuietFlag = False,
    **options: Any,
) -> None:
    """Tokenize records, pack them into rows of at most --max-len tokens, and write shards.

    Example: packcli pack data.jsonl --max-len 4096 -o out/
    """
    cfg = _pack_config(ctx, {"inputs": inputs, "config": config, **options})
    # The library (and numpy, pyarrow) loads for a run, not for ``--help`` or another command.
    import packcli.cli.render as console
    from packcli import api

    with console.progress_bars(enabled=not quiet) as progress:
        summary = api.run(cfg, progress).summary
    _show_summary(summary, json_out, quiet)


def _pack_config(ctx: typer.Context, params: dict[str, Any]) -> PackConfig:
    """Return the run's config: the flags (``params``, by parameter name) over a --config preset, checked."""
    from packcli.errors import UsageError

    flags = {name: params[name] for name in _AS_GIVEN}
    flags["mix"] = tuple(params["mix"] or ())
    options = merge_preset(
        ctx, params["config"], flags, params["field"], params["template_kwarg"], params["num_proc"], params["no_cache"]
    )
    inputs = params["inputs"]
    preset_inputs = options.pop("inputs", None)
    if options.get("mix"):  # --mix names the inputs
        preset_inputs = () if given(ctx, "mix") or inputs else preset_inputs
    if not inputs and not preset_inputs and not options.get("mix"):
        raise UsageError(
            "no input given; pass files, directories, globs or Hub names, or name inputs in a --config preset"
        )
    cfg = PackConfig(inputs=tuple(inputs) if inputs else (preset_inputs or ()), **options)
    _check_overflow_options(ctx, cfg)
    return cfg


def _check_overflow_options(ctx: typer.Context, cfg: PackConfig) -> None:
    """Refuse an option given that this run's --overflow mode does not read."""
    from packcli.errors import Opt, UsageError

    for name, modes in _OVERFLOW_ONLY.items():
        if given(ctx, name) and cfg.overflow not in modes:
            raise UsageError(
                "applies to ",
                Opt("overflow", *modes),
                f" only (this run uses {cfg.overflow})",
                option=name,
                hint=("pass ", Opt("overflow", modes[0]), ", or leave ", Opt(name), " out"),
            )


def _show_summary(summary: RunSummary, json_out: bool, quiet: bool) -> None:
    """Print the run's warnings (stderr), then its summary: JSON with --json, the table unless --quiet."""
    import packcli.cli.render as console

    for warning in summary.warnings:
        console.warning(warning.render(cli_term))
    for skipped in summary.skipped_dirs or []:
        console.warning(f"{skipped}: skipped; a packcli output, staging directory or cache is never read as input")
    if json_out:
        console.emit_json(summary.to_dict(cli_term))
    if not quiet:
        console.print_pack_summary(summary)
