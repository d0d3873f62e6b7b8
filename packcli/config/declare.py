"""How an option of ``PackConfig`` is declared once: a field whose metadata says how its clients show it.

The field gives the option's name, type and default (its choices are its ``Literal`` type); ``option()``
adds what the command line shows of it: the help, the flag where it is not the name with dashes, the
metavar, the words of a default that is no value. ``HELP_PANELS`` places each option in
``packcli pack --help``, and ``OPTION_GROUPS`` in its concern (what it decides of the run). The command
line builds its parameters from these (``packcli.cli.options``); the library's ``packcli.pack`` takes its
defaults from the fields, and a test holds its signature to them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import Field, dataclass, field
from typing import Any, TypeVar

from packcli.errors import Text

T = TypeVar("T")

# The key of the declaration in a field's metadata.
DECLARED = "packcli.option"


@dataclass(frozen=True)
class Declared:
    """What the clients show of one option: its help, and how the command line spells and shows it."""

    # The help of the option, naming other options as Opt parts (each client names them its own way).
    help: Text
    # The flag, as the messages name it, where it is not ``--`` and the name with dashes: ``--field`` (given
    # once per value), ``--no-cache`` (it turns the option off), ``--add-eos/--no-add-eos``.
    flag: str | None = None
    # A second spelling on the command line that turns a switch off, which the messages do not name.
    off_flag: str | None = None
    short: str | None = None  # the short flag (``-o``), which a message may name the option by too
    metavar: str | None = None  # the placeholder of the value in --help; a choice option's is its choices
    # What None stands for, shown as the default in --help; the clients' default is then None, even where
    # the field's is a value (num_proc: the available cores).
    none_means: str | None = None
    repeatable: bool = False  # the flag is given once per value (a list on the command line)


def option(
    default: T,
    help: Text,
    *,
    flag: str | None = None,
    off_flag: str | None = None,
    short: str | None = None,
    metavar: str | None = None,
    none_means: str | None = None,
    repeatable: bool = False,
) -> T:
    """Declare an option of ``PackConfig``: a field with its default and, in its metadata, what clients show."""
    declared = Declared(help, flag, off_flag, short, metavar, none_means, repeatable)
    return field(default=default, metadata={DECLARED: declared})


def table_option(factory: Callable[[], T], help: Text, *, flag: str, metavar: str) -> T:
    """Declare a repeatable option whose default is a table made anew for each config (``--field``)."""
    return field(default_factory=factory, metadata={DECLARED: Declared(help, flag, metavar=metavar, repeatable=True)})


def declared(option_field: Field[Any]) -> Declared:
    """Return the declaration of a field of ``PackConfig``; a field declared without ``option()`` has none."""
    found = option_field.metadata.get(DECLARED)
    if not isinstance(found, Declared):
        raise TypeError(f"PackConfig.{option_field.name} is declared without option(): it has no help and no flag")
    return found


# The panels of ``packcli pack --help``, each with its options in the order the help lists them (the
# fields' own order is the manifest's, and the order their values are checked in). Every option of
# PackConfig but its inputs is in one panel (tests/test_options.py).
INPUT = "Input"
TOKENS = "Tokenizer & template"
PACKING = "Packing"
OUTPUT = "Output"
RUN = "Run"
HELP_PANELS: dict[str, tuple[str, ...]] = {
    INPUT: ("split", "limit", "format", "task", "fields", "on_error", "fix_turns", "expand_turns", "prefix_tree"),
    TOKENS: ("tokenizer", "chat_template", "processor", "train_on", "template_kwargs", "add_eos"),
    PACKING: (
        "max_len",
        "overflow",
        "truncate_side",
        "split_system",
        "min_piece",
        "max_drop_fraction",
        "algorithm",
        "seed",
        "mix",
        "mix_by",
        "mix_max_epochs",
        "dedup",
        "eval_fraction",
        "eval_records",
        "world_size",
        "rank_remainder",
        "balance",
        "balance_model",
        "pad_to_max",
        "pad_to_multiple_of",
        "context_parallel",
        "tensor_parallel",
    ),
    OUTPUT: (
        "output",
        "embed_images",
        "rejects",
        "fix_turns_log",
        "rows_per_shard",
        "output_format",
        "loss_weighting",
        "overwrite",
        "dry_run",
    ),
    RUN: ("num_proc", "cache_dir", "cache", "cache_max_size", "engine", "ray_address", "encoder"),
}
# The panel of each option, by name.
PANEL_OF = {name: panel for panel, names in HELP_PANELS.items() for name in names}


# Every option of PackConfig belongs to exactly one concern. Only "tokenization" decides a sample's
# tokens and labels, so only it (with the inputs' contents) keys the tokenization cache.
OPTION_GROUPS: dict[str, tuple[str, ...]] = {
    "input": ("inputs", "split", "limit", "format", "task", "fields"),
    "tokenization": (
        "tokenizer",
        "chat_template",
        "template_kwargs",
        "train_on",
        "add_eos",
        "on_error",
        "fix_turns",
        "expand_turns",
        "prefix_tree",
        "processor",
    ),
    "packing": (
        "mix",
        "mix_by",
        "mix_max_epochs",
        "dedup",
        "eval_fraction",
        "eval_records",
        "max_len",
        "overflow",
        "truncate_side",
        "split_system",
        "min_piece",
        "max_drop_fraction",
        "algorithm",
        "seed",
        "world_size",
        "rank_remainder",
        "balance",
        "balance_model",
        "pad_to_max",
        "pad_to_multiple_of",
        "context_parallel",
        "tensor_parallel",
    ),
    "output": (
        "output",
        "output_format",
        "rows_per_shard",
        "overwrite",
        "rejects",
        "fix_turns_log",
        "dry_run",
        "loss_weighting",
        "embed_images",
    ),
    "run": ("num_proc", "cache", "cache_dir", "cache_max_size", "engine", "ray_address", "encoder"),
}
