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

from packcli.config import PackConfig
from packcli.contract import Progress
from packcli.engines import CacheParts, DigestChecker, Engine
from packcli.errors import InputError, Message
from packcli.io.fingerprint import Learned, Memo, changed_input, fingerprint, stamps
from packcli.io.sources import InputSource
from packcli.jsontypes import JSONObject
from packcli.run.entries import all_known, cached_store, changed, entry_key, rehashed
from packcli.run.identify import fields_key, run_encoder
from packcli.run.options import tokenize_options
from packcli.store import parts
from packcli.store.cachedir import EntryLock, allow_open_files, touch
from packcli.store.tokens import TokenStore
from packcli.tokenize.encoders.encoder import Encoder
from packcli.tokenize.options import CACHE_FIX


@dataclass
class PartRun:
    """What making a store from cache parts needs of the run (``from_parts``)."""

    config: PackConfig
    formats: dict[str, str | None]
    cache_root: Path
    progress: Progress
    rule_out_long: bool
    limit: int | None  # the --max-len of the early too-long rule, or None
    before: dict[str, list[int]]  # the inputs' stamps before they were hashed
    fingerprints: list[str | None]  # None: hashed as it is read (filled in then)
    engine: Engine
    check: DigestChecker | None  # the engine's check of a found part's token files
    options: JSONObject  # the key's options
    memo: Memo  # the run's hash memo, which learns the hashes taken as the inputs are read
    stamped_ns: int  # when ``before`` was taken (``changed_input``)


def from_parts(
    run: PartRun,
    inputs: list[parts.InputParts],
    looked_up: tuple[str | None, str],
    encoder: Encoder | None,
    warnings: list[Message],
    keep: contextlib.ExitStack,
) -> tuple[TokenStore, str, str]:
    """Make the run's cache entry from its inputs' cache parts, found or tokenized now; return it, the
    cache state and the entry's key.

    Every part used is locked (shared) until the entry is made from it (then the entry's hard links
    hold its tokens), so no prune removes it in between. A part found damaged is reported and made
    again; an input that changed while it was read leaves none of the parts this run made of it.

    ``looked_up``: the entry's key and the cache state its lookup gave. A key None: an input is hashed as
    it is read, so the entry's key is known only then. An entry found under it (inputs copied, or
    touched, since they were cached) is used, locked with ``keep``.
    """
    key, state = looked_up
    before = len(warnings)
    with contextlib.ExitStack() as held:
        _found_parts(run, inputs, warnings, held)
        seconds: dict[str, float] = {}
        if not all(item.complete for item in inputs):
            seconds = _made_parts(run, inputs, encoder, held)
        if key is None:
            key = entry_key([i.source for i in inputs], run.formats, run.fingerprints, run.options)
            assert key is not None
            lock = EntryLock(run.cache_root, key)
            if lock.acquire():
                keep.callback(lock.release)
            found, state, said = cached_store(run.cache_root / key, run.limit, run.check)
            warnings[before:before] = said  # the entry's before its parts', as when its key is known first
            if found is not None:
                return found, state, key
        assembling = time.perf_counter()
        store = parts.assemble(inputs, run.formats, run.cache_root / key, run.cache_root, CACHE_FIX)
        seconds["store"] = seconds.get("store", 0.0) + time.perf_counter() - assembling
        store.seconds = seconds
        return store, state, key


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
    lock = EntryLock(run.cache_root, key)
    if lock.acquire():
        held.callback(lock.release)
    found, _, said = cached_store(run.cache_root / key, run.limit, run.check)
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
        encoder = run_encoder(config, [item.source for item in inputs if not item.complete])

    def unchanged(source: InputSource) -> None:
        now = stamps([source])
        if any(run.before.get(path) != stamp for path, stamp in now.items()):
            raise InputError(changed(source.display))

    def hold(key: str) -> None:
        lock = EntryLock(run.cache_root, key)
        if lock.acquire():
            held.callback(lock.release)

    job = CacheParts(
        options=tokenize_options(config), formats=run.formats, encoder=encoder, progress=run.progress,
        rule_out_long=run.rule_out_long, inputs=inputs, cache_root=run.cache_root, unchanged=unchanged, hold=hold,
    )  # fmt: skip
    made = run.engine.tokenize(job)
    read = made.read_digests  # the hashes taken as the inputs were read through
    later = [k for k, f in enumerate(run.fingerprints) if f is None]
    for k in later:
        source = inputs[k].source
        run.fingerprints[k] = read.get(str(Path(source.path))) or fingerprint(source)
    # The inputs read now: did one change while it was read? (The others gave only parts found by the
    # hash taken before.)
    now = [(i.source, f) for i, f in zip(inputs, run.fingerprints, strict=True) if i.made or i.read is not None]
    sources = [source for source, _ in now]
    hashes = {**rehashed(run.engine, sources, run.before, run.stamped_ns), **read}
    moved = changed_input(sources, run.before, all_known([f for _, f in now]), hashes, run.stamped_ns)
    if moved is not None:
        for item in inputs:
            if item.source.display == moved:
                for part in item.made:
                    shutil.rmtree(part.path, ignore_errors=True)
        raise InputError(changed(moved))
    learned = []  # known by their stamps from now on, as if hashed before
    for k in later:
        item, digest = inputs[k], run.fingerprints[k]
        stamp = run.before.get(str(Path(item.source.path)))
        if digest is not None and stamp is not None:
            ends = (parts.part_layout(item.source), item.read.ends) if item.read is not None else None
            taken = (digest, item.records(item.parts), stamp)
            learned.append(Learned(item.source, taken, run.formats[item.source.display], ends))
    run.memo.remember_reads(learned, fields_key(config))  # saved by the run
    return made.seconds
