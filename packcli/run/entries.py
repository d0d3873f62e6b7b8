"""Stage one, the cache's steps: the run's entry key (of the inputs' hashes, in order, the tokenizer's files
and the tokenization options: ``Inputs.entry_key``), its lookup (a checked store, locked while in use, or
why none is used), and a found entry named as this run names its inputs."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packcli.config import PackConfig
from packcli.engines import DigestChecker
from packcli.errors import Message
from packcli.io.sources import InputSource
from packcli.jsontypes import JSONObject
from packcli.run.encoder import Tokenizing, run_encoder
from packcli.run.inputs import Inputs
from packcli.run.options import image_window, split_rule
from packcli.store.cachedir import EntryLock
from packcli.store.images import changed_image, load_images
from packcli.store.integrity import DamagedStore
from packcli.store.key import cache_root
from packcli.store.tokens import TokenStore, find_store
from packcli.tokenize.encoders.tokenizer import DEFAULT_TOKENIZER
from packcli.version import __version__

if TYPE_CHECKING:
    from packcli.tokenize.encoders.encoder import Encoder

# Bumped whenever the same inputs and options would give other tokens, labels or store meta, so the cache
# misses. 5: messages' own "train"/"weight" marks are read (and removed before rendering); 6: the tokens of
# pieces left out by --overflow split are in the store meta; 7: tool call arguments in the template's form,
# calls checked rendered, ShareGPT function_call turns as calls, reasoning left out in the store meta.
ENCODING_RULES = 7


@dataclass
class RunKey:
    """What keys the run's cache entry and parts (``run_key``)."""

    key: str | None  # the entry's key; None while an input's hash is taken as it is read
    options: JSONObject  # what keys an entry or part besides its inputs (``key_options``)
    encoder: Encoder | None  # loaded when the key needed the tokenizer's identity (a Hub name), else None


def run_key(config: PackConfig, inputs: Inputs, tokenizing: Tokenizing) -> RunKey:
    """The run's entry key and the key's options. The tokenizer is keyed by its files and the template
    (hashed, when they are local), else by the identity of the tokenizer (a Hub name): read from the record
    of the commit the Hub names where the cache has one (both ``tokenizing.key``), else of the tokenizer
    loaded (the encoder is loaded here, once, and handed on to the tokenizing)."""
    encoder = None
    tokenizer_key = tokenizing.key
    if tokenizer_key is None:
        encoder = run_encoder(config, tokenizing, inputs.sources)
        identity = encoder.identity()  # hashes the tokenizer's JSON where it has no record: once
        tokenizer_key = identity["sha256"] + identity["chat_template_sha256"]
    options = key_options(config, tokenizer_key, encoder)
    return RunKey(inputs.entry_key(options), options, encoder)


def key_options(config: PackConfig, tokenizer_key: str, encoder: Encoder | None) -> JSONObject:
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


def look_up(
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
    store, state, warnings = locked_entry(cache_root, key, limit, check, fill_cache, stack)
    if store is not None and config.processor is not None:
        moved_image = changed_image(load_images(store.path))
        if moved_image is not None:
            store, state = None, "miss"
            warnings.append(
                Message(f"image {moved_image} changed since the cache entry was made; the entry is made again")
            )
    return store, state, warnings


def locked_entry(
    cache_root: Path,
    key: str,
    limit: int | None,
    check: DigestChecker | None,
    fill_cache: bool,
    held: contextlib.ExitStack,
) -> tuple[TokenStore | None, str, list[Message]]:
    """The cache entry or part ``key`` found, checked (or None), the cache state and warnings; locked with
    ``held`` while it is in use, so that no prune removes it (where the run may make it, or it is there: a
    dry run that finds nothing takes no lock).

    A damaged entry is never used: it is reported in one warning and made again (state "rebuilt").
    An entry that left out long records untokenized serves only runs that would drop them too (``limit``:
    the --max-len of this run's early rule, or None): a run that truncates, or allows longer samples, makes
    the entry again (a miss). ``fill_cache``: the check may keep its files' stamps there
    (``packcli.store.integrity``; False in a dry run, which writes nothing).
    """
    entry = cache_root / key
    if fill_cache or entry.exists():
        lock = EntryLock(cache_root, key)
        if lock.acquire():
            held.callback(lock.release)
    try:
        store = find_store(entry, check, fill_cache)
    except DamagedStore as exc:
        return None, "rebuilt", [Message("the cache entry is damaged (", *exc.parts, "); it is rebuilt")]
    # The byte limit is max_len * L, and L is the same (the tokenizer is in the key): comparing max
    # lengths compares limits.
    ruled_out = store.meta.ruled_out_max_len if store is not None else None
    if ruled_out is not None and (limit is None or limit > ruled_out):
        return None, "miss", []
    return store, ("miss" if store is None else "hit"), []


def as_this_run(store: TokenStore, sources: list[InputSource], config: PackConfig, tokenizing: Tokenizing) -> None:
    """A found entry, made by a run whose inputs, tokenizer or template may have had other paths: its
    metadata (in memory) names this run's, which the manifest, the rejects file and errors show."""
    meta = store.meta
    original = [s.path for s in meta.sources]
    renamed = [dataclasses.replace(m, path=s.display) for m, s in zip(meta.sources, sources, strict=True)]
    tokenizer = meta.tokenizer.copy()
    tokenizer["name"] = config.tokenizer_name or DEFAULT_TOKENIZER
    if (shown := tokenizing.template.shown) is not None:  # the key holds the template's text, not its path
        tokenizer["chat_template"], tokenizer["chat_template_source"] = shown
    store.meta = dataclasses.replace(meta, sources=renamed, original_paths=original, tokenizer=tokenizer)


def cache_entry(config: PackConfig, store: TokenStore) -> Path | None:
    """The cache entry the run's token store is, or None (``--no-cache``, a store made aside)."""
    if not config.cache:
        return None
    root = cache_root(config.cache_dir)
    try:
        return store.path if store.path.parent.resolve() == root.resolve() else None
    except OSError:
        return None
