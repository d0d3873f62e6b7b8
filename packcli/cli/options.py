"""The commands' options: PackConfig's built from their declarations, and helpers to tell what the user gave.

Each option of PackConfig is declared once, as a field (``packcli.config.declare``); :func:`with_options`
gives ``pack`` all of them and ``stats`` those that decide tokens, as typer parameters built from the
declarations (:func:`option_parameter`), with the one function that merges a preset under the flags
(:func:`merge_preset`). Every option has a help panel; :func:`place` orders a command's by panel.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from packcli.config import (
    BUILTIN_TEMPLATES,
    CHOICES,
    DECLARATIONS,
    HELP_PANELS,
    OPTION_TYPES,
    flag as flag,  # declared beside the options it names; imported from here too
    flag_term,
    option_default,
)
from packcli.config.declare import INPUT as INPUT, OUTPUT as OUTPUT, PACKING as PACKING, PANEL_OF, RUN as RUN, TOKENS
from packcli.errors import Opt, PackcliError, parts_of, render

Command = TypeVar("Command", bound=Callable[..., Any])


def choices(name: str) -> str:
    """The metavar of a choice option: ``[drop | truncate | error]``, from ``config.CHOICES``.

    The spaces are where a narrow help column may wrap the list: between values, never inside one.
    """
    return "[" + " | ".join(CHOICES[name]) + "]"


def complete(name: str) -> Callable[[str], list[str]]:
    """Return the shell completion of a choice option: its values that start with what was typed."""

    def values(incomplete: str) -> list[str]:
        return [value for value in CHOICES[name] if value.startswith(incomplete)]

    return values


JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.", rich_help_panel=OUTPUT)]
QuietFlag = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress bars and no summary table.", rich_help_panel=OUTPUT)
]

# -- the options of pack and stats: PackConfig's, built from their declarations -------------------------

ConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config",
        metavar="FILE",
        help="Preset file (TOML, YAML or JSON) with the options' names; may name the inputs. Flags override it.",
        rich_help_panel=INPUT,
    ),
]


def option_parameter(name: str) -> inspect.Parameter:
    """Return the parameter of option ``name`` of PackConfig on the command line, built from its declaration.

    Its flag, help, metavar and panel are the declaration's (``packcli.config.declare``, and
    :func:`declared_option`); its type and default the field's, in the command line's form: a choice is
    a string of its choices, a repeatable option a list of its values (None: none given), an option whose
    declaration says what None means defaults to None, and a flag that turns the option off
    (``--no-cache``) defaults to not doing so.
    """
    declared = DECLARATIONS[name]
    kind: Any = str if name in CHOICES else OPTION_TYPES[name]
    default = option_default(name)
    if declared.repeatable:
        kind, default = list[str] | None, None
    elif declared.none_means is not None:
        kind, default = kind | None, None
    elif kind is bool and flag(name).startswith("--no-"):
        default = not default  # --no-cache: given, the option is off
    parameter_name = flag(name).split("/")[0].removeprefix("--").replace("-", "_")
    return inspect.Parameter(
        parameter_name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[kind, declared_option(name)],
    )


def declared_option(name: str) -> Any:
    """Return the typer option of option ``name`` of PackConfig: its flags, help, metavar and panel, as declared."""
    declared = DECLARATIONS[name]
    spelled = flag(name) + (f"/{declared.off_flag}" if declared.off_flag else "")
    return typer.Option(
        *(spelled, declared.short) if declared.short else (spelled,),
        help=render(parts_of(declared.help), flag_term),
        metavar=choices(name) if name in CHOICES else declared.metavar,
        autocompletion=complete(name) if name in CHOICES else None,
        show_default=declared.none_means if declared.none_means is not None else True,
        rich_help_panel=PANEL_OF[name],
    )


# The cache commands' --cache-dir (pack and stats have it among the options with_options gives them).
CacheDirOption = Annotated[str | None, declared_option("cache_dir")]


def with_options(*names: str) -> Callable[[Command], Command]:
    """Give a command the parameters of options ``names`` of PackConfig, in help order, for its ``**options``.

    The command's own parameters keep their places; the options' take the place of ``**options``, before
    its keyword-only parameters. Typer reads the signature set here.
    """
    unknown = set(names) - set(PANEL_OF)
    if unknown:
        raise ValueError(f"not options of PackConfig: {', '.join(sorted(unknown))}")
    ordered = [name for panel in HELP_PANELS.values() for name in panel if name in names]

    def give(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        cut = next((i for i, p in enumerate(own) if p.kind is inspect.Parameter.KEYWORD_ONLY), len(own))
        options = [option_parameter(name) for name in ordered]
        command.__signature__ = signature.replace(parameters=[*own[:cut], *options, *own[cut:]])  # type: ignore[attr-defined]
        return command

    return give


# The flags above that decide tokens, by parameter name (what tests/test_pack.py checks on stats).
TOKEN_PARAMETERS = (
    "config",
    "split",
    "limit",
    "format",
    "task",
    "field",
    "on_error",
    "fix_turns",
    "expand_turns",
    "prefix_tree",
    "tokenizer",
    "chat_template",
    "processor",
    "train_on",
    "template_kwarg",
    "add_eos",
)


def merge_preset(
    ctx: typer.Context,
    config: str | None,
    flags: dict[str, Any],
    field: list[str] | None,
    template_kwarg: list[str] | None,
    num_proc: int | None,
    no_cache: bool,
) -> dict[str, Any]:
    """Return the options of a run: the preset's (``--config``), with the flags the user gave over them.

    ``flags`` are option values by PackConfig name; a flag left at its default does not override the
    preset. ``--field`` and ``--template-kwarg`` add to the preset's. The preset's ``inputs`` and
    ``chat_template`` and ``processor``, and its ``tokenizer`` when that names a directory beside the preset,
    come back relative to the current directory.
    """
    from packcli.api import available_cores
    from packcli.records.formats import DEFAULT_FIELDS

    options: dict[str, Any] = {}
    if config:
        from packcli.config.presets import load_config_file

        options = load_config_file(config)
    for name, value in flags.items():
        if given(ctx, name) or name not in options:
            options[name] = value
    if field:
        from packcli.config.presets import parse_field_flags

        options["fields"] = {**DEFAULT_FIELDS, **options.get("fields", {}), **parse_field_flags(field)}
    if template_kwarg:
        from packcli.config.presets import parse_template_kwargs

        options["template_kwargs"] = {**options.get("template_kwargs", {}), **parse_template_kwargs(template_kwarg)}
    options["num_proc"] = num_proc if num_proc is not None else options.get("num_proc", available_cores())
    options["cache"] = not no_cache and options.get("cache", True)
    if options.get("chat_template") and config and not given(ctx, "chat_template"):
        # A template file named in a preset is relative to the preset file; a name of packcli's own
        # templates (chatml) is kept, unless a file of that name is beside the preset.
        beside_template = Path(config).parent / options["chat_template"]
        if beside_template.exists() or options["chat_template"] not in BUILTIN_TEMPLATES:
            options["chat_template"] = str(beside_template.resolve())
    tokenizer = options.get("tokenizer")
    if tokenizer and config and not given(ctx, "tokenizer") and not Path(tokenizer).is_absolute():
        # A tokenizer directory beside the preset is the preset's, as its inputs and template are; a name
        # that is no directory there (a Hub id, a directory of the current one) is kept as written.
        beside = Path(config).parent / tokenizer
        if beside.is_dir():
            options["tokenizer"] = str(beside.resolve())
    processor = options.get("processor")
    if processor and config and not given(ctx, "processor") and not Path(processor).is_absolute():
        # A processor is a directory: one named in a preset is beside the preset, as its template is.
        options["processor"] = str((Path(config).parent / processor).resolve())
    return options


PANEL_ORDER = (INPUT, TOKENS, PACKING, OUTPUT, RUN)


def place(command: Callable[..., Any], table: dict[str, tuple[str, str | None]]) -> Callable[..., Any]:
    """Give the options of ``command`` their help panel and metavar from ``table`` (where they have none).

    The parameters are also ordered by panel (arguments first, then Input, Tokenizer & template,
    Packing, Output, Run), as ``--help`` shows the panels in the order of their first option. The
    command keeps its declarations; only its signature, as typer reads it, is set.
    """
    signature = inspect.signature(command, eval_str=True)
    rank: dict[str, int] = {}
    panel: str | None
    for name, param in signature.parameters.items():
        infos = [m for m in getattr(param.annotation, "__metadata__", ()) if isinstance(m, typer.models.OptionInfo)]
        for info in infos:
            if name in table:
                panel, metavar = table[name]
                info.rich_help_panel = info.rich_help_panel or panel
                info.metavar = info.metavar or metavar
                if name in CHOICES:
                    info.autocompletion = info.autocompletion or complete(name)
            panel = info.rich_help_panel
            rank[name] = 1 + (PANEL_ORDER.index(panel) if panel in PANEL_ORDER else len(PANEL_ORDER))
    # Keyword-only, as typer passes them: an option built from its declaration may come before one of the
    # command's own in the help's order.
    params = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in sorted(signature.parameters.values(), key=lambda p: rank.get(p.name, 0))
    ]
    command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return command


def cli_term(opt: Opt) -> str:
    """Return how the command line names an option: ``--max-len``, ``--overflow split or drop``, ``--no-cache``."""
    return flag_term(opt)


def cli_message(error: PackcliError) -> str:
    """Return an error's one line as the command line shows it: options named by their flags."""
    return error.render(cli_term)


def given(ctx: typer.Context, name: str) -> bool:
    """Return whether the user gave option ``name`` (on the command line, not by default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")
