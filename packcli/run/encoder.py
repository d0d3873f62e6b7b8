"""Stage one's encoder: the tokenizer and template the run names, identified before any input is read
(``name_tokenizer``: the template given read, and refused if it cannot be, the tokenizer's part of the
cache key where its files or its record give it), and loaded where tokenizing starts (``run_encoder``: a
store made whole or from cache parts), or sooner only where the cache's key needs the tokenizer's own
identity (a Hub name without a record).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packcli.config import PackConfig
from packcli.io.sources import InputSource
from packcli.io.uri import is_uri
from packcli.run.options import encode_options
from packcli.store.key import cache_root
from packcli.tokenize.encoders.tokenizer import recorded_key, tokenizer_fingerprint
from packcli.tokenize.templates.choice import GivenTemplate, given_template

if TYPE_CHECKING:
    from packcli.tokenize.encoders.encoder import Encoder


@dataclass(frozen=True)
class Tokenizing:
    """What the run tokenizes with, named before any input is read (``name_tokenizer``)."""

    template: GivenTemplate  # --chat-template, read
    # Where the tokenizer's record is read and kept: the cache directory, unless the run writes nothing
    # there (``--no-cache``, a dry run).
    records: Path | None
    # The tokenizer's part of the cache key: of its files and the template (local), or of its record (a
    # Hub name whose current commit has one); None: the tokenizer is loaded for it (``run.entries.run_key``).
    key: str | None


def name_tokenizer(config: PackConfig) -> Tokenizing:
    """The run's tokenizer and template, named: the template given read (an empty or unreadable file is
    refused here, before any input is read), and the tokenizer's part of the key where it is known without
    loading the tokenizer."""
    records = cache_root(config.cache_dir) if config.cache and not config.dry_run else None
    template = given_template(config.chat_template)
    key = tokenizer_fingerprint(config.tokenizer_name, template)
    if key is None and config.processor is None:  # a Hub name: its identity from its record, if any
        key = recorded_key(config.tokenizer_name, config.chat_template, records)
    return Tokenizing(template, records, key)


def run_encoder(config: PackConfig, tokenizing: Tokenizing, sources: list[InputSource] | None = None) -> Encoder:
    """The run's encoder: its tokenizer and template loaded, with its processor, if any.

    ``sources``: the inputs it will tokenize (all of them when None), whose size decides whether the fast
    encoder pays for its load (``encoder_choice.Work``). The tokenizer is opened from its record in the
    cache, which learns it, unless the run writes nothing there (``tokenizing.records``).
    """
    # Imported here: a run that finds its store in the cache loads no tokenizer, nor the modules that do.
    from packcli.tokenize.encoders.encoder import Encoder
    from packcli.tokenize.encoders.encoder_choice import Work

    size = input_bytes(sources) if sources is not None else None
    work = Work(size, config.num_proc) if size is not None else None
    return Encoder(
        config.tokenizer_name,
        config.chat_template,
        encode_options(config),
        config.processor,
        encoder=config.encoder,
        records=tokenizing.records,
        work=work,
    )


def input_bytes(sources: list[InputSource]) -> int | None:
    """The bytes of the inputs on local disk (as stored: compressed ones count their compressed size, times
    four); None when one is not a local file (a URI, a Hub dataset, a saved dataset's directory)."""
    total = 0
    for source in sources:
        if source.kind in ("hub", "saved_dataset") or is_uri(source.path):
            return None
        try:
            size = os.path.getsize(source.path)
        except OSError:
            return None
        total += size * (4 if source.compression else 1)
    return total
