"""The tokenize step of a run: the inputs tokenized into a token store, found in the cache or made now.

The run (``packcli.run.pipeline``) and ``packcli stats`` call ``tokenized_inputs``; it sniffs the
inputs' record formats, keys the cache by the inputs' contents and the tokenization options, and has
the run's engine tokenize on a miss.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from packcli.config import PackConfig
from packcli.contract import Progress, no_progress
from packcli.engines import DigestChecker, Engine, load_engine
from packcli.errors import Message
from packcli.io.fingerprint import Memo, stamps
from packcli.io.readers import hashed_as_read, hub_reachable
from packcli.io.sources import InputSource, resolve_inputs
from packcli.jsontypes import JSONObject
from packcli.owned import HASH_MEMO
from packcli.results import TokenizerIdentity
from packcli.run.entries import all_known, cached_store, entry_key
from packcli.run.from_parts import PartRun, from_parts
from packcli.run.identify import fields_key, hashed, task_and_formats
from packcli.run.options import image_window, split_rule, tokenize_options
from packcli.run.whole import WholeRun, whole_store
from packcli.store import parts
from packcli.store.cachedir import EntryLock, touch
from packcli.store.images import changed_image, load_images
from packcli.store.key import default_cache_dir
from packcli.store.tokens import TokenStore
from packcli.tokenize.batches import ingest
from packcli.tokenize.encoders.encoder import Encoder
from packcli.tokenize.encoders.tokenizer import DEFAULT_TOKENIZER
from packcli.tokenize.templates.choice import builtin_name, read_chat_template
from packcli.version import __version__

# Bumped whenever the same inputs and options would give other tokens, labels or store meta, so the cache
# misses. 5: messages' own "train"/"weight" marks are read (and removed before rendering); 6: the tokens of
# pieces left out by --overflow split are in the store meta; 7: tool call arguments in the template's form,
# calls checked rendered, ShareGPT function_call turns as calls, reasoning left out in the store meta.
ENCODING_RULES = 7

T = TypeVar("T")


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
    tokenizer: the key hashes the tokenizer's files and the template when they are local.

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
    with contextlib.ExitStack() as own:
        if engine is None:
            engine = load_engine(config.engine, config.num_proc, config.ray_address)
            own.callback(engine.close)
        with _tokenized(config, progress, scratch, rule_out_long, fill_cache, engine, sources) as inputs:
            yield inputs


@contextlib.contextmanager
def _tokenized(
    config: PackConfig,
    progress: Progress,
    scratch: Path | None,
    rule_out_long: bool,
    fill_cache: bool,
    engine: Engine,
    given: list[InputSource] | None,
) -> Iterator[TokenizedInputs]:
    if config.chat_template is not None and builtin_name(config.chat_template) is None:
        read_chat_template(config.chat_template)  # an empty or unreadable template: before any input is read
    sources = given if given is not None else resolve_inputs(list(config.inputs), config.split)
    stamped_ns = time.time_ns()
    before = stamps(sources)  # before the format is sniffed and the contents hashed
    cache_root = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
    memo = Memo.load(cache_root / HASH_MEMO if config.cache else None)  # read once for the run's inputs
    task, formats = task_and_formats(config, sources, memo)
    spent: list[float] = []  # seconds of each pass reading the inputs through (hashes, record counts)
    # Who hashes the inputs where it reads them, and a found entry's token files: the engine (Ray's tasks);
    # None: this process, and the local files are hashed as they are read to be tokenized.
    hashing = engine.hashing
    later = [hashing is None and hashed_as_read(s) for s in sources]
    fingerprints, counts, tokenizer_key, encoder = hashed(config, sources, engine, memo, spent, later)
    if fill_cache:  # a dry run writes nothing
        memo.remember_formats(sources, fields_key(config), formats)
    # The records of each input, counted as it was hashed (or remembered): for progress, without a read.
    sources = [dataclasses.replace(s, records=n) if n is not None else s for s, n in zip(sources, counts, strict=True)]
    options = _key_options(config, tokenizer_key, encoder)
    key = entry_key(sources, formats, fingerprints, options)  # None until every input's hash is known
    rule_out_long = rule_out_long and config.engine == "local" and config.overflow in ("drop", "error")
    limit = config.max_len if rule_out_long else None
    check = hashing.check_digests if hashing is not None else None
    reuse: dict[str, int] | None = None
    with contextlib.ExitStack() as stack:
        store, state, warnings = _entry(config, cache_root, key, fill_cache, limit, check, stack)
        if store is None and any(s.kind == "hub" for s in sources) and not hub_reachable():
            warnings.extend(
                Message(f"{s.display}: the Hugging Face Hub cannot be reached; read from the local Hugging Face cache")
                for s in sources
                if s.kind == "hub"
            )
        if store is not None:
            if fill_cache:
                touch(store.path)  # its last use, for pruning by age
            _as_this_run(store, sources, config)
        elif (cuts := _part_cuts(config, fill_cache, engine, sources)) is not None:
            # Made from the inputs' cache parts: those found are reused, the rest tokenized and kept.
            inputs = [
                parts.InputParts(
                    s,
                    n,
                    _keying(s, formats, f, options, c, then),
                    cuts=c,
                    chained=then,
                    chain=memo.remembered_part_ends(s, parts.part_layout(s)) if then else None,
                )
                for n, (s, f, c, then) in enumerate(zip(sources, fingerprints, cuts, later, strict=True))
            ]
            run = PartRun(
                config, formats, cache_root, progress, rule_out_long, limit, before, fingerprints, engine, check,
                options, memo, stamped_ns,
            )  # fmt: skip
            store, state, key = from_parts(run, inputs, (key, state), encoder, warnings, stack)
            reuse = parts.reused_records(inputs) if state != "hit" else None
            _as_this_run(store, sources, config)  # parts made by runs that named the tokenizer otherwise
        else:
            whole = WholeRun(
                config, sources, formats, engine, progress, rule_out_long, before, fingerprints, options, cache_root,
                memo, warnings, stamped_ns,
            )  # fmt: skip
            store, state, key = whole_store(
                whole, (key, state), lambda k: _entry(config, cache_root, k, fill_cache, limit, check, stack),
                encoder, config.cache and fill_cache, scratch, stack,
            )  # fmt: skip
            if state == "hit":  # a copy of a cached input, found once read
                _as_this_run(store, sources, config)
        if fill_cache:  # what the run learned of its inputs, in one write (saved once they are read)
            memo.save()
        yield TokenizedInputs(
            store=store,
            cache=state,
            sources=sources,
            fingerprints=all_known(fingerprints),
            formats=formats,
            tokenizer=store.meta.tokenizer,
            pad_id=store.meta.pad_id,
            warnings=warnings,
            task=task,
            key=key if config.cache else None,
            hash_seconds=sum(spent),
            reuse=reuse,
        )


def _keying(
    source: InputSource,
    formats: dict[str, str | None],
    fingerprint: str | None,
    options: JSONObject,
    cuts: list[Any] | None,
    chained: bool,
) -> Any:
    """The cache keys of an input's parts, by number (``parts.InputParts.keying``): of its hash, or of the
    hash of what it holds through each part (``chained``)."""
    entry: list[Any] = [source.kind, source.compression, formats[source.display]]
    if not chained:
        entry.append(fingerprint)
    return functools.partial(parts.part_key, entry, options=options, batch_size=ingest.BATCH_SIZE, cuts=cuts)


def _entry(
    config: PackConfig,
    cache_root: Path,
    key: str | None,
    fill_cache: bool,
    limit: int | None,
    check: DigestChecker | None,
    stack: contextlib.ExitStack,
) -> tuple[TokenStore | None, str, list[Message]]:
    """The run's cache entry found (or None), the cache state, and warnings; the entry locked with ``stack``
    while it is in use. A key not known yet (an input hashed as it is read) finds nothing yet."""
    if not config.cache:
        return None, "off", []
    if key is None:
        return None, "miss", []
    entry = cache_root / key
    if fill_cache or entry.exists():
        lock = EntryLock(cache_root, key)
        if lock.acquire():  # held while the entry is in use: no prune removes it
            stack.callback(lock.release)
    store, state, warnings = cached_store(entry, limit, check)
    if store is not None and config.processor is not None:
        moved_image = changed_image(load_images(store.path))
        if moved_image is not None:
            store, state = None, "miss"
            warnings.append(
                Message(f"image {moved_image} changed since the cache entry was made; the entry is made again")
            )
    return store, state, warnings


def _part_cuts(
    config: PackConfig, fill_cache: bool, engine: Engine, sources: list[InputSource]
) -> list[list[Any] | None] | None:
    """How the engine cuts each input into cache parts for this run, or None: one whole store is made
    (no cache to fill, ``--limit``, ``--processor``, or an engine that makes no parts for this run)."""
    if not (config.cache and fill_cache) or config.limit is not None or config.processor:
        return None
    return engine.cache_part_cuts(tokenize_options(config), sources)


def _key_options(config: PackConfig, tokenizer_key: str, encoder: Encoder | None) -> JSONObject:
    """What keys a cache entry or part besides its inputs: the tokenization options and the tokenizer."""
    return {
        "fields": config.fields,
        # --limit N reads the first N records only (absent without it: earlier keys stay valid).
        **({"limit": config.limit} if config.limit is not None else {}),
        "tokenizer": tokenizer_key,  # the files of the tokenizer and template, hashed
        # A template file, or none given (the tokenizer's own, else the default): never the same key.
        "template": "file" if config.chat_template is not None else "none given",
        # The rest of the tokenization options: they decide tokens and labels; no other option does.
        "tokenization": {
            k: v
            for k, v in config.group("tokenization").items()
            if k not in ("tokenizer", "chat_template", "processor", "prefix_tree")
        },
        # --prefix-tree: the rounds of a record grow trees of at most --max-len tokens (absent without it).
        **({"prefix_tree": config.max_len} if config.prefix_tree else {}),
        # --processor: what decides the image tokens, and the cut that leaves out samples whose image it
        # would cut (absent without it: text keys stay valid).
        **(
            {"processor": processor_key(config, encoder), "image_window": image_window(config)}
            if config.processor is not None
            else {}
        ),
        # Split records are cut by the tokenizer's workers, so how they are cut is in the key too.
        "split": split_rule(config).__dict__ if config.overflow == "split" else None,
        "encoding_rules": ENCODING_RULES,
        "version": __version__,
    }


def processor_key(config: PackConfig, encoder: Encoder | None) -> str:
    """Return the identity of the run's processor (``VisionProcessor.identity``), loading it if need be."""
    if encoder is not None and encoder.vision is not None:
        return str(encoder.vision.identity())
    from packcli.vision import load_processor

    assert config.processor is not None
    return load_processor(config.processor).identity()


def _as_this_run(store: TokenStore, sources: list[InputSource], config: PackConfig) -> None:
    """A found entry, made by a run whose inputs, tokenizer or template may have had other paths: its
    metadata (in memory) names this run's, which the manifest, the rejects file and errors show."""
    meta = store.meta
    original = [s.path for s in meta.sources]
    renamed = [dataclasses.replace(m, path=s.display) for m, s in zip(meta.sources, sources, strict=True)]
    tokenizer = meta.tokenizer.copy()
    tokenizer["name"] = config.tokenizer_name or DEFAULT_TOKENIZER
    if config.chat_template is not None:  # the key holds the template's text, not its path
        builtin = builtin_name(config.chat_template)
        tokenizer["chat_template"] = builtin if builtin is not None else str(config.chat_template)
        tokenizer["chat_template_source"] = "packcli" if builtin is not None else "file"
    store.meta = dataclasses.replace(meta, sources=renamed, original_paths=original, tokenizer=tokenizer)
