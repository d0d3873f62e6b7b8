"""The rules between a pack run's options, which ``PackConfig`` checks once each option is valid on its own.

Each ``check_*`` function refuses a combination of options with a ``UsageError`` naming the option at
fault: ``--expand-turns`` and ``--prefix-tree`` with what they cannot go with, the template's keyword
arguments, ``--processor`` and what images are not packed with, ``--mix`` and its shares, and the padding
of samples and rows. They read the options through ``Checked``, the part of ``PackConfig`` they need
(``PackConfig`` is declared in ``packcli.config.pack_config``, which calls them).
"""

from __future__ import annotations

import json
from typing import Protocol

from packcli.config.values import (
    EXPAND_TURNS_CONFLICTS,
    MIX_SUM_TOLERANCE,
    NOT_WITH_IMAGES,
    PREFIX_TREE_CONFLICTS,
    describe_value,
    parse_mix,
)
from packcli.errors import Opt, UsageError, parts_of
from packcli.records.formats import RESERVED_TEMPLATE_KWARGS


class Checked(Protocol):
    """The options of a ``PackConfig`` the rules read as attributes (the conflict tables name others, read by name)."""

    @property
    def inputs(self) -> tuple[str, ...]: ...
    @property
    def max_len(self) -> int: ...
    @property
    def task(self) -> str: ...
    @property
    def tokenizer(self) -> str | None: ...
    @property
    def template_kwargs(self) -> dict[str, object]: ...
    @property
    def expand_turns(self) -> str: ...
    @property
    def prefix_tree(self) -> bool: ...
    @property
    def mix(self) -> tuple[str, ...]: ...
    @property
    def engine(self) -> str: ...
    @property
    def processor(self) -> str | None: ...
    @property
    def embed_images(self) -> bool: ...
    @property
    def pad_to_max(self) -> bool: ...
    @property
    def output_format(self) -> str: ...
    @property
    def loss_weighting(self) -> str: ...
    @property
    def pad_multiple(self) -> int: ...
    @property
    def sample_limit(self) -> int: ...


def check_expand_turns(config: Checked) -> None:
    """--expand-turns: a round is one whole sample, trained on its own answers, of chat data, local engine.

    --prefix-tree: the rounds of an expanded record as one tree sample, in rows only a tree-aware
    consumer reads; what would have to cut, pad or weigh a tree by its paths is refused.
    """
    for name, value, why in EXPAND_TURNS_CONFLICTS if config.expand_turns != "off" else ():
        if getattr(config, name) == value or (value == "any" and getattr(config, name) is not None):
            shown = "" if value == "any" else f" {value}"
            raise UsageError("cannot be used with ", Opt(name), f"{shown} ({why})", option="expand_turns")
    if config.prefix_tree and config.expand_turns == "off":
        raise UsageError(
            "needs ", Opt("expand_turns"), " (the tree's branches are a record's rounds)",
            option="prefix_tree", hint=("pass ", Opt("expand_turns"), " reasoning or all"),
        )  # fmt: skip
    for name, value, why in PREFIX_TREE_CONFLICTS if config.prefix_tree else ():
        if getattr(config, name) == value or (value == "more" and getattr(config, name) > 1):
            shown = f" {value}" if value != "more" else " above 1"
            raise UsageError("cannot be used with ", Opt(name), f"{shown} ({why})", option="prefix_tree")


def check_template_kwargs(config: Checked) -> None:
    for name, value in config.template_kwargs.items():
        if name in RESERVED_TEMPLATE_KWARGS:
            raise UsageError(f"template keyword argument '{name}' ", *parts_of(RESERVED_TEMPLATE_KWARGS[name]))
        try:  # the manifest and the cache key are strict JSON: no NaN or Infinity in them
            json.dumps(value, allow_nan=False)
        except ValueError as exc:
            raise UsageError(
                f"template keyword argument '{name}' holds a number JSON cannot write ({value}); "
                "give a finite number, or quote the value to pass it as a string"
            ) from exc
        except TypeError as exc:  # from the library: a value no JSON holds (a set, an object)
            raise UsageError(
                f"template keyword argument '{name}' holds {describe_value(value)}, which JSON cannot write; "
                "give strings, numbers, booleans, null, lists and tables"
            ) from exc


def check_processor(config: Checked) -> None:
    """--processor: no other tokenizer than its directory's (``tokenizer_name``); the combinations images
    are not packed with."""
    if config.processor is None:
        if config.embed_images:
            raise UsageError("applies to images, which are packed with ", Opt("processor"), option="embed_images")
        return
    import os

    if config.tokenizer is not None and os.path.realpath(config.tokenizer) != os.path.realpath(config.processor):
        raise UsageError(
            f"names tokenizer '{config.tokenizer}', but the processor's tokenizer (in {config.processor}) "
            "gives the image tokens",
            option="tokenizer",
            hint=("leave out ", Opt("tokenizer"), " with ", Opt("processor")),
        )
    for name, value, what in NOT_WITH_IMAGES:
        if getattr(config, name) == value:
            raise UsageError(
                what,
                " with images is not supported yet; leave out ",
                Opt(name, value),
                " or ",
                Opt("processor"),
                option="processor",
            )
    for name in ("mix", "eval_fraction", "eval_records"):
        if getattr(config, name):
            raise UsageError(
                "images are not packed with ", Opt(name), " yet; leave out one of the two", option="processor"
            )


def check_mix(config: Checked) -> None:
    """--mix: each PATH=SHARE or PATH=Nx well formed, the shares summing right; the inputs are its paths."""
    if not config.mix:
        return
    specs = [parse_mix(value) for value in config.mix]
    paths = tuple(path for path, _, _ in specs)
    if not config.inputs:
        object.__setattr__(config, "inputs", paths)
    elif config.inputs != paths:
        raise UsageError(
            "names the inputs: pass them with ", Opt("mix"), " PATH=SHARE only, not also as inputs", option="mix"
        )
    if len(set(paths)) != len(paths):
        raise UsageError("names an input twice; give each PATH once", option="mix")
    shares = sum(value for _, kind, value in specs if kind == "share")
    epochs = any(kind == "epochs" for _, kind, _ in specs)
    if epochs and any(kind == "share" for _, kind, _ in specs) and shares >= 1 - MIX_SUM_TOLERANCE:
        raise UsageError(
            f"shares sum to {shares:g} beside Nx sources; with Nx sources the shares must sum to less "
            "than 1 (the Nx sources fill the rest)",
            option="mix",
        )
    if not epochs and abs(shares - 1) > MIX_SUM_TOLERANCE:
        raise UsageError(f"shares sum to {shares:g}; they must sum to 1 (or give a source as Nx)", option="mix")
    if config.task in ("preference", "kto"):
        raise UsageError("applies to SFT records; preference and KTO records are not mixed yet", option="mix")
    if config.engine != "local":
        raise UsageError("runs with ", Opt("engine", "local"), " only; leave out ", Opt("engine", "ray"), option="mix")


def check_padding(config: Checked) -> None:
    if config.pad_multiple > 1 and config.sample_limit < 1:
        raise UsageError(
            f"{config.max_len} is too short for samples padded to a multiple of {config.pad_multiple}",
            option="max_len",
            hint=("raise ", Opt("max_len")),
        )
    if config.pad_to_max and config.max_len % config.pad_multiple:
        raise UsageError(
            f"with samples padded to a multiple of {config.pad_multiple}: the row's padding would not be a "
            "multiple of it",
            option="pad_to_max",
            hint=("make ", Opt("max_len"), f" ({config.max_len}) a multiple of {config.pad_multiple}"),
        )
    if config.output_format == "megatron" and config.pad_to_max:
        raise UsageError(
            "does not apply to ",
            Opt("output_format", "megatron"),
            ": its collate function pads rows itself (pad_to_max_length)",
            option="pad_to_max",
            hint=("drop ", Opt("pad_to_max")),
        )
    if config.output_format == "megatron" and config.loss_weighting != "token":
        raise UsageError(
            Opt("loss_weighting", config.loss_weighting),
            " does not apply to ",
            Opt("output_format", "megatron"),
            ": its dataset reads only loss_mask",
            hint="write parquet, arrow or mds for loss weights",
        )
