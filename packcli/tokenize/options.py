"""Stage one's options: what tokenizing takes of a run's options, built once by the run (``run.options``)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packcli.errors import Opt, Part, Text
from packcli.tokenize.encoders.encoder import EncodeOptions
from packcli.tokenize.long.split import SplitRule

# What to do when the cache cannot be written.
CACHE_FIX: tuple[Part, ...] = (
    "choose a writable ",
    Opt("cache_dir"),
    " with free space, or pass ",
    Opt("cache", False),
)


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
