"""The run's token store made from its inputs' cache parts (``packcli.store.parts``): the parts found,
those the cache lacks tokenized by the engine, the hashes taken as the inputs were read, and the store
assembled.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packcli.config import PackConfig
from packcli.contract import Progress
from packcli.engines import CacheParts, DigestChecker, Engine
from packcli.errors import InputError, Message
from packcli.io.fingerprint import Learned, stamps
from packcli.io.sources import InputSource
from packcli.jsontypes import JSONObject
from packcli.run.encoder import Tokenizing, run_encoder
from packcli.run.entries import locked_entry
from packcli.run.inputs import Inputs, changed
from packcli.run.options import tokenize_options
from packcli.store import parts
from packcli.store.cachedir import EntryLock, allow_open_files, touch
from packcli.store.tokens import TokenStore
from packcli.tokenize.options import BATCH_SIZE, CACHE_FIX

if TYPE_CHECKING:
    from packcli.tokenize.encoders.encoder import Encoder


@dataclass
class PartRun:
    """What making a store from cache parts needs of the run (``from_parts``)."""

    config: PackConfig
    inputs: Inputs  # the run's inputs, identified (their hashes None where taken as they are read)
    progress: Progress
    rule_out_long: bool
    limit: int | None  # the --max-len of the early too-long rule, or None
    engine: Engine
    check: DigestChecker | None  # the engine's check of a found part's token files
    options: JSONObject  # the key's options
    fill_cache: bool  # False: a dry run, which makes no parts
    tokenizing: Tokenizing  # what the run tokenizes with (``run.encoder.name_tokenizer``)


def from_parts(
    run: PartRun,
    looked_up: tuple[str | None, str],
    encoder: Encoder | None,
    warnings: list[Message],
    keep: contextlib.ExitStack,
) -> tuple[TokenStore, str, str, dict[str, int] | None] | None:
    """Make the run's cache entry from its inputs' cache parts, found or tokenized now; return it, the
    cache state, the entry's key and the parts and records reused and made (``parts.reused_records``;
    None on a hit). None: this run makes no parts (``_part_cuts``), and its store is made whole.

    Every part used is locked (shared) until the entry is made from it (then the entry's hard links
    hold its tokens), so no prune removes it in between. A part found damaged is reported and made
    again; an input that changed while it was read leaves none of the parts this run made of it.

    ``looked_up``: the entry's key and the cache state its lookup gave. A key None: an input is hashed as
    it is read, so the entry's key is known only then. An entry found under it (inputs copied, or
    touched, since they were cached) is used, locked with ``keep``.
    """
    cuts = _part_cuts(run)
    if cuts is None:
        return None
    inputs = _input_parts(run, cuts)
    key, state = looked_up
    before = len(warnings)
    with contextlib.ExitStack() as held:
        _found_parts(run, inputs, warnings, held)
        seconds: dict[str, float] = {}
        if not all(item.complete for item in inputs):
            seconds = _made_parts(run, inputs, encoder, held)
        cache_root = run.inputs.cache_root
        if key is None:
            key = run.inputs.entry_key(run.options)
            assert key is not None
            found, state, said = locked_entry(cache_root, key, run.limit, run.check, run.fill_cache, keep)
            warnings[before:before] = said  # the entry's before its parts', as when its key is known first
            if found is not None:
                return found, state, key, None
        assembling = time.perf_counter()
        store = parts.assemble(inputs, run.inputs.formats, cache_root / key, cache_root, CACHE_FIX)
        seconds["store"] = seconds.get("store", 0.0) + time.perf_counter() - assembling
        store.seconds = seconds
        return store, state, key, (parts.reused_records(inputs) if state != "hit" else None)


def _part_cuts(run: PartRun) -> list[list[Any] | None] | None:
    """How the engine cuts each input into cache parts for this run, or None: one whole store is made
    (no cache to fill, ``--limit``, ``--processor``, or an engine that makes no parts for this run)."""
    config = run.config
    if not (config.cache and run.fill_cache) or config.limit is not None or config.processor:
        return None
    return run.engine.cache_part_cuts(tokenize_options(config), run.inputs.sources)


def _input_parts(run: PartRun, cuts: list[list[Any] | None]) -> list[parts.InputParts]:
    """Each input as its cache parts: how it is cut, and the keys of its parts by number (of its hash, or of
    the hash of what it holds through each part: a chained input, hashed as it is read, whose parts' ends
    the memo may remember)."""
    made = []
    for n, (source, digest, cut, chained, known) in enumerate(
        zip(run.inputs.sources, run.inputs.fingerprints, cuts, run.inputs.later, run.inputs.remembered, strict=True)
    ):
        entry: list[Any] = [source.kind, source.compression, run.inputs.formats[source.display]]
        if not chained:
            entry.append(digest)
        keying = functools.partial(parts.part_key, entry, options=run.options, batch_size=BATCH_SIZE, cuts=cut)
        ends = known.part_ends.get(parts.part_layout(source)) if chained and known is not None else None
        made.append(parts.InputParts(source, n, keying, cuts=cut, chained=chained, chain=ends))
    return made


def _found_parts(
    run: PartRun, inputs: list[parts.InputParts], warnings: list[Message], held: contextlib.ExitStack
) -> None:
    """Each input's parts found in the cache, in order, locked with ``held``: by their keys (a chained
    input's by the ends the memo remembers for it, else as it is read: ``find``)."""
    allow_open_files()  # a lock (an open file) per part held: thousands, for a large input
    damaged: set[str] = set()  # a damaged part is reported once, and made again

    def find(item: parts.InputParts, key: str) -> TokenStore | None:
        if key in damaged:
            return None
        said = len(warnings)
        found = _find_part(run, item, key, warnings, held)
        if len(warnings) > said:
            damaged.add(key)
        return found

    for item in inputs:
        item.find = functools.partial(find, item)
        if item.chained:
            chain = item.chain or []
            item.found = [p for p in (find(item, item.key_of(n)) for n in range(len(chain))) if p is not None]
            item.ended = bool(chain) and len(item.found) == len(chain)
            continue
        while (found := find(item, item.key_of(len(item.found)))) is not None:
            item.found.append(found)
            if parts.part_info(found)["last"]:
                break


def _find_part(
    run: PartRun, item: parts.InputParts, key: str, warnings: list[Message], held: contextlib.ExitStack
) -> TokenStore | None:
    """The cache part ``key`` of ``item``, checked and locked with ``held``, or None (a damaged one reported)."""
    found, _, said = locked_entry(run.inputs.cache_root, key, run.limit, run.check, run.fill_cache, held)
    warnings.extend(w.replace("cache entry", f"cache part of {item.source.display}") for w in said)
    if found is None or found.meta.part is None:
        return None
    touch(found.path)
    return found


def _made_parts(
    run: PartRun, inputs: list[parts.InputParts], encoder: Encoder | None, held: contextlib.ExitStack
) -> dict[str, float]:
    """Tokenize the parts the cache lacks (and read the chained inputs whose parts found are not known to
    be theirs); fill in the hashes taken as the inputs were read. Return the seconds by stage."""
    config = run.config
    if encoder is None:
        encoder = run_encoder(config, run.tokenizing, [item.source for item in inputs if not item.complete])

    def unchanged(source: InputSource) -> None:
        now = stamps([source])
        if any(run.inputs.before.get(path) != stamp for path, stamp in now.items()):
            raise InputError(changed(source.display))

    def hold(key: str) -> None:
        lock = EntryLock(run.inputs.cache_root, key)
        if lock.acquire():
            held.callback(lock.release)

    job = CacheParts(
        options=tokenize_options(config), formats=run.inputs.formats, encoder=encoder, progress=run.progress,
        rule_out_long=run.rule_out_long, inputs=inputs, cache_root=run.inputs.cache_root, unchanged=unchanged,
        hold=hold,
    )  # fmt: skip
    later = [k for k, f in enumerate(run.inputs.fingerprints) if f is None]
    made = run.engine.tokenize(job)
    # The inputs read now: did one change while it was read? (The others gave only parts found by the
    # hash taken before.)
    now = [k for k, item in enumerate(inputs) if item.made or item.read is not None]
    moved = run.inputs.changed_while_read(run.engine, made.read_digests, now)
    if moved is not None:
        for item in inputs:
            if item.source.display == moved:
                for part in item.made:
                    shutil.rmtree(part.path, ignore_errors=True)
        raise InputError(changed(moved))
    learned = []  # known by their stamps from now on, as if hashed before
    for k in later:
        item, digest = inputs[k], run.inputs.fingerprints[k]
        stamp = run.inputs.before.get(str(Path(item.source.path)))
        if digest is not None and stamp is not None:
            ends = (parts.part_layout(item.source), item.read.ends) if item.read is not None else None
            taken = (digest, item.records(item.parts), stamp)
            learned.append(Learned(item.source, taken, run.inputs.formats[item.source.display], ends))
    run.inputs.memo.remember_reads(learned, run.inputs.fields_key)  # saved by the run
    return made.seconds
