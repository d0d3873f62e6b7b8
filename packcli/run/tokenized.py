"""Stage one of a run: the inputs tokenized into a token store, found in the cache or made now.

The run (``packcli.run.pipeline``) and ``packcli stats`` call ``tokenized_inputs``. Its steps, each in a
module of its own and each visited once: the inputs identified (``run.inputs``: their stamps, record
formats, hashes and the run's task, in one ``Inputs``); the cache entry keyed and looked up
(``run.entries``); without an entry, the store made from the inputs' cache parts (``run.from_parts``) or
whole (``run.whole``), where the encoder is built (``run.encoder``) and the engine tokenizes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from packcli.config import PackConfig
from packcli.contract import Progress, no_progress
from packcli.engines import Engine, load_engine
from packcli.errors import Message
from packcli.io.readers.hub import unreachable
from packcli.io.sources import InputSource
from packcli.results import TokenizerIdentity
from packcli.run.encoder import name_tokenizer
from packcli.run.entries import as_this_run, look_up, run_key
from packcli.run.from_parts import PartRun, from_parts
from packcli.run.inputs import identify_inputs
from packcli.run.whole import WholeRun, whole_store
from packcli.store.cachedir import touch
from packcli.store.tokens import TokenStore

# -- stage 1: tokenize into the token store ---------------------------------------------------------


@dataclass
class TokenizedInputs:
    """The inputs, tokenized: the token store and what the manifest says about how it was made."""

    store: TokenStore
    cache: str  # hit | miss | off | rebuilt (the entry found was damaged)
    sources: list[InputSource]
    fingerprints: list[str]
    formats: dict[str, str | None]
    tokenizer: TokenizerIdentity
    pad_id: int
    warnings: list[Message] = field(default_factory=list)
    task: str = "sft"  # sft, preference or kto (packcli.records.preference.resolve_task)
    key: str | None = None  # the cache entry's key (None with the cache off)
    hash_seconds: float = 0.0  # reading the inputs through before tokenizing: hashes, record counts
    # A store assembled from cache parts: the parts and records reused and made (parts.reused_records).
    reuse: dict[str, int] | None = None


@contextlib.contextmanager
def tokenized_inputs(
    config: PackConfig,
    progress: Progress | None = None,
    scratch: Path | None = None,
    rule_out_long: bool = False,
    fill_cache: bool = True,
    engine: Engine | None = None,
    sources: list[InputSource] | None = None,
) -> Iterator[TokenizedInputs]:
    """Yield the inputs of ``config`` tokenized into a token store: from the cache, or made now.

    With the cache on, the store is the cache entry (found, or made and kept); with it off, it is made
    under ``scratch`` (a temporary directory when None) and removed afterwards. A cache hit loads no
    tokenizer: the key hashes the tokenizer's files and the template when they are local, and is read
    from the tokenizer's record for a Hub name (the record of the commit its main revision resolves to).

    ``rule_out_long`` (pack with --overflow drop or error, local engine) drops records that certainly
    exceed --max-len before tokenizing them (see packcli.tokenize.long.bounds).

    ``fill_cache`` False (a dry run) uses an entry found but writes nothing into the cache: a store
    made now is scratch, and the inputs' hashes are not remembered.

    The key is of contents, never of paths: the inputs' content hashes in order, with the reader and
    record format each was read with, and the tokenization options. An input that changes while it is
    read (its stamp or its hash differ from those taken before) stops the run, and nothing is stored.
    While the store is in use, the entry's lock is held (``packcli.store.cachedir``), so no prune removes it.

    ``engine`` is the run's (made here from ``config`` when None, and closed at the end); ``sources``
    the run's inputs, resolved once (resolved here from ``config`` when None).
    """
    progress = progress or no_progress
    with contextlib.ExitStack() as stack:
        if engine is None:
            engine = load_engine(config.engine, config.num_proc, config.ray_address)
            stack.callback(engine.close)  # registered first: closed last
        tokenizing = name_tokenizer(config)  # a template file that cannot be read is refused before any input
        inputs = identify_inputs(config, engine, sources, fill_cache)
        stack.callback(inputs.cancel)  # a run that fails before its store is made reads its inputs no further
        keyed = run_key(config, inputs, tokenizing)
        rule_out_long = rule_out_long and config.engine == "local" and config.overflow in ("drop", "error")
        limit = config.max_len if rule_out_long else None
        check = engine.hashing.check_digests if engine.hashing is not None else None
        reuse: dict[str, int] | None = None

        def entry(key: str | None) -> tuple[TokenStore | None, str, list[Message]]:
            return look_up(config, inputs.cache_root, key, fill_cache, limit, check, stack)

        store, state, warnings = entry(keyed.key)
        parts = False  # whether the store was assembled from cache parts
        if store is not None:
            if fill_cache:
                touch(store.path)  # its last use, for pruning by age
        else:
            warnings.extend(unreachable(inputs.sources))
            run = PartRun(
                config, inputs, progress, rule_out_long, limit, engine, check, keyed.options, fill_cache, tokenizing
            )
            # Made from the inputs' cache parts: those found are reused, the rest tokenized and kept.
            if (made := from_parts(run, (keyed.key, state), keyed.encoder, warnings, stack)) is not None:
                store, state, keyed.key, reuse = made
                parts = True
            else:
                whole = WholeRun(config, inputs, engine, progress, rule_out_long, keyed.options, warnings, tokenizing)
                store, state, keyed.key = whole_store(
                    whole, (keyed.key, state), entry, keyed.encoder, config.cache and fill_cache, scratch, stack
                )
        # An entry found (also one found once the inputs were read, a copy of a cached input), or parts, made
        # by runs that named the inputs, the tokenizer or the template otherwise: named as this run names them.
        if state == "hit" or parts:
            as_this_run(store, inputs.sources, config, tokenizing)
        if fill_cache:  # what the run learned of its inputs, in one write (saved once they are read)
            inputs.memo.save()
        yield TokenizedInputs(
            store=store,
            cache=state,
            sources=inputs.sources,
            fingerprints=inputs.hashes,
            formats=inputs.formats,
            tokenizer=store.meta.tokenizer,
            pad_id=store.meta.pad_id,
            warnings=warnings,
            task=inputs.task,
            key=keyed.key if config.cache else None,
            hash_seconds=inputs.hash_seconds,
            reuse=reuse,
        )
