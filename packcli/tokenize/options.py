"""Stage one's options: what tokenizing takes of a run's options, built once by the run (``run.options``)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packcli.errors import Opt, Part, Text
from packcli.jsontypes import TemplateKwargs

# Records read, and handed to a worker, at a time (the cache parts of an input are cut at batch ends).
BATCH_SIZE = 256

# What to do when the cache cannot be written.
CACHE_FIX: tuple[Part, ...] = (
    "choose a writable ",
    Opt("cache_dir"),
    " with free space, or pass ",
    Opt("cache", False),
)


@dataclass(frozen=True)
class SplitRule:
    """How records longer than ``max_len`` are cut (the options of ``--overflow split``)."""

    max_len: int
    system: str = "all"  # all | first
    min_piece: int = 0


@dataclass(frozen=True)
class EncodeOptions:
    """What decides the tokens and labels of a sample (all of it goes into the cache key).

    ``template_kwargs`` are the chat template's keyword arguments (``enable_thinking``,
    ``reasoning_effort``...) as sorted (name, JSON value) pairs, so that the options stay hashable.
    """

    train_on: str = "auto"
    add_eos: bool = True
    template_kwargs: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def kwargs_items(kwargs: TemplateKwargs) -> tuple[tuple[str, str], ...]:
        """Return template keyword arguments in the form ``template_kwargs`` holds them."""
        return tuple(sorted((str(k), json.dumps(v, sort_keys=True)) for k, v in kwargs.items()))

    def kwargs(self) -> TemplateKwargs:
        """Return the template keyword arguments as a dict of JSON values."""
        return {k: json.loads(v) for k, v in self.template_kwargs}


@dataclass(frozen=True)
class TokenizeOptions:
    """How records become samples and tokens, where the token store goes, and how many workers do it.

    ``split``: how records longer than a row are cut (``--overflow split``), or None. ``image_window``:
    (the most tokens a sample keeps, the side it is cut from) where samples with images may be cut, or
    None. ``output``, ``cache`` and ``dry_run`` say where a token store being made lives, for the
    messages that name it (``store_where``) and the Ray engine's segments. ``content_keys``: whether the
    samples carry their records' content keys (``--dedup exact`` reads them, now or from the cache later).
    """

    encode: EncodeOptions = field(default_factory=EncodeOptions)
    fields: dict[str, str] = field(default_factory=dict)
    max_len: int = 4096
    overflow: str = "drop"
    on_error: str = "fail"
    split: SplitRule | None = None
    image_window: tuple[int, str] | None = None
    fix_turns: bool = False
    expand_turns: str = "off"
    prefix_tree: bool = False
    num_proc: int = 1
    limit: int | None = None
    tokenizer: str | None = None
    chat_template: str | None = None
    encoder: str = "auto"
    output: str = ""
    cache: bool = True
    dry_run: bool = False
    content_keys: bool = True

    def store_where(self, store_path: Path) -> tuple[Path, Text]:
        """Which path to name, and what to do, when the token store at ``store_path`` cannot be written.

        The store is the cache entry, or scratch space inside the output's staging directory (a
        temporary directory for a dry run): the message names the path the user chose.
        """
        if self.cache:
            return store_path.parent, CACHE_FIX
        if self.dry_run:
            return Path(tempfile.gettempdir()), "free disk space there or set TMPDIR"
        return Path(self.output), ("free disk space or choose another ", Opt("output", short=True))
