"""The tokenize step of a run: the inputs tokenized into a token store, found in the cache or made now.

The run (``packcli.run.pipeline``) and ``packcli stats`` call ``tokenized_inputs``; it sniffs the
inputs' record formats, keys the cache by the inputs' contents and the tokenization options, and has
the run's engine tokenize on a miss.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from packcli.config import PackConfig
from packcli.contract import Progress, no_progress
from packcli.engines import CacheParts, DigestChecker, Engine, HashJob, WholeStore, load_engine
from packcli.errors import InputError, Message
from packcli.io.fingerprint import (
    Learned,
    changed_input,
    files_to_hash,
    fingerprint,
    remember_formats,
    remember_reads,
    remembered_part_ends,
    stamps,
)
from packcli.io.readers import hub_reachable
from packcli.io.sources import InputSource, resolve_inputs
from packcli.io.uri import is_uri
from packcli.jsontypes import JSONObject
from packcli.owned import HASH_MEMO
from packcli.procs.stop import raise_if_stopped
from packcli.results import TokenizerIdentity
from packcli.run.identify import fields_key, hashed, run_encoder, task_and_formats
from packcli.run.options import image_window, split_rule, tokenize_options
from packcli.store import parts
from packcli.store.cachedir import EntryLock, allow_open_files, touch
from packcli.store.images import changed_image, load_images
from packcli.store.integrity import DamagedStore
from packcli.store.key import cache_key, default_cache_dir
from packcli.store.tokens import TokenStore, find_store
from packcli.tokenize import ingest
from packcli.tokenize.encoder import Encoder
from packcli.tokenize.options import CACHE_FIX
from packcli.tokenize.templates import builtin_name, read_chat_template
from packcli.tokenize.tokenizer import DEFAULT_TOKENIZER
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
    exceed --max-len before tokenizing them (see packcli.tokenize.bounds).

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
    before = stamps(sources)  # before the format is sniffed and the contents hashed
    cache_root = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
    memo = cache_root / HASH_MEMO if config.cache else None
    task, formats = task_and_formats(config, sources, memo)
    spent: list[float] = []  # seconds of each pass reading the inputs through (hashes, record counts)
    # The JSON lines files made into cache parts are hashed as they are read for them, not before.
    later = [_hashed_as_read(config, fill_cache, s) for s in sources]
    fingerprints, counts, tokenizer_key, encoder = hashed(config, sources, engine, memo, fill_cache, spent, later)
    if fill_cache:
        remember_formats(sources, memo, fields_key(config), formats)
    # The records of each input, counted as it was hashed (or remembered): for progress, without a read.
    sources = [dataclasses.replace(s, records=n) if n is not None else s for s, n in zip(sources, counts, strict=True)]
    options = _key_options(config, tokenizer_key, encoder)
    key = _entry_key(sources, formats, fingerprints, options)  # None until every input's hash is known
    rule_out_long = rule_out_long and config.engine == "local" and config.overflow in ("drop", "error")
    limit = config.max_len if rule_out_long else None
    # Who hashes a found entry's token files: the engine, where it reads them; None: the store, here.
    check = engine.hashing.check_digests if engine.hashing is not None else None
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
                    chain=remembered_part_ends(s, memo, parts.part_layout()) if then else None,
                )
                for n, (s, f, c, then) in enumerate(zip(sources, fingerprints, cuts, later, strict=True))
            ]
            run = _PartRun(
                config, formats, cache_root, progress, rule_out_long, limit, before, fingerprints, engine, check,
                options, memo,
            )  # fmt: skip
            store, state, key = _from_parts(run, inputs, (key, state), encoder, warnings, stack)
            reuse = parts.reused_records(inputs) if state != "hit" else None
            _as_this_run(store, sources, config)  # parts made by runs that named the tokenizer otherwise
        else:
            assert key is not None  # every hash is taken first: no input is hashed as it is read
            store = _whole_store(
                config, sources, formats, encoder, engine, progress, rule_out_long, (before, _known(fingerprints)),
                cache_root / key if config.cache and fill_cache else None, scratch, stack,
            )  # fmt: skip
        yield TokenizedInputs(
            store=store,
            cache=state,
            sources=sources,
            fingerprints=_known(fingerprints),
            formats=formats,
            tokenizer=store.meta["tokenizer"],
            pad_id=store.meta["pad_id"],
            warnings=warnings,
            task=task,
            key=key if config.cache else None,
            hash_seconds=sum(spent),
            reuse=reuse,
        )


def _hashed_as_read(config: PackConfig, fill_cache: bool, source: InputSource) -> bool:
    """Whether the run hashes ``source`` as it reads it into cache parts, not before: a local JSON lines file
    (stdin's spool too) that the local engine makes into parts (``_part_cuts``)."""
    return (
        config.cache
        and fill_cache
        and config.engine == "local"
        and config.limit is None
        and not config.processor
        and source.kind == "jsonl"
        and not is_uri(source.path)
    )


def _entry_key(
    sources: list[InputSource], formats: dict[str, str | None], fingerprints: list[str | None], options: JSONObject
) -> str | None:
    """The key of the run's cache entry, or None while the hash of an input is not known.

    Each input by its content, in order (sample_index follows it), with the reader its file type chose and
    the record format found: never its path, so that any spelling of a path, a copy, stdin or a preset
    run from elsewhere finds the same entry.
    """
    if any(f is None for f in fingerprints):
        return None
    entries = [[s.kind, s.compression, formats[s.display], f] for s, f in zip(sources, fingerprints, strict=True)]
    return cache_key({"inputs": entries, **options})


def _keying(
    source: InputSource,
    formats: dict[str, str | None],
    fingerprint: str | None,
    options: JSONObject,
    cuts: list[Any] | None,
    chained: bool,
) -> Any:
    """The cache keys of an input's parts, by number (``parts.InputParts.keying``): of its hash, or of the
    hash of its bytes before each part (``chained``)."""
    entry: list[Any] = [source.kind, source.compression, formats[source.display]]
    if not chained:
        entry.append(fingerprint)
    return functools.partial(parts.part_key, entry, options=options, batch_size=ingest.BATCH_SIZE, cuts=cuts)


def _known(fingerprints: list[str | None]) -> list[str]:
    """The inputs' hashes, every one known."""
    known = [f for f in fingerprints if f is not None]
    assert len(known) == len(fingerprints)
    return known


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
    store, state, warnings = _cached_store(entry, limit, check)
    if store is not None and config.processor is not None:
        moved_image = changed_image(load_images(store.path))
        if moved_image is not None:
            store, state = None, "miss"
            warnings.append(
                Message(f"image {moved_image} changed since the cache entry was made; the entry is made again")
            )
    return store, state, warnings


def _whole_store(
    config: PackConfig,
    sources: list[InputSource],
    formats: dict[str, str | None],
    encoder: Encoder | None,
    engine: Engine,
    progress: Progress,
    rule_out_long: bool,
    taken: tuple[dict[str, list[int]], list[str]],
    entry: Path | None,
    scratch: Path | None,
    stack: contextlib.ExitStack,
) -> TokenStore:
    """Tokenize every input into one store: the cache ``entry``, or scratch space under ``scratch``
    (removed with ``stack``). ``taken``: the inputs' stamps and hashes from before they were read."""
    before, fingerprints = taken
    if encoder is None:
        encoder = run_encoder(config)
    if entry is not None:
        store_path = entry
    else:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=".packcli-tokens-", dir=scratch))
        store_path = Path(tmp) / "tokens"
    raise_if_stopped()

    def unchanged(read: dict[str, str]) -> None:
        # The hashes taken as the inputs were read (the JSON lines files read through), else hashed again:
        # by the Ray engine's tasks, or here.
        known = {**_rehashed(engine, sources), **read}
        moved = changed_input(sources, before, fingerprints, known)
        if moved is not None:
            raise InputError(_changed(moved))

    job = WholeStore(
        options=tokenize_options(config), formats=formats, encoder=encoder, progress=progress,
        rule_out_long=rule_out_long, sources=sources, path=store_path, before_finish=unchanged,
    )  # fmt: skip
    store = engine.tokenize(job)
    if entry is None:
        stack.callback(store.discard_elsewhere)  # a scratch store's tokens kept outside its directory
    return store


def _rehashed(engine: Engine, sources: list[InputSource]) -> dict[str, str]:
    """The inputs' hashes taken again, once read, by the engine where it reads them (none: the run hashes
    them itself, in ``changed_input``)."""
    if engine.hashing is None:
        return {}
    return engine.hashing.hash_files(HashJob(files_to_hash(sources), again=True))


def _part_cuts(
    config: PackConfig, fill_cache: bool, engine: Engine, sources: list[InputSource]
) -> list[list[Any] | None] | None:
    """How the engine cuts each input into cache parts for this run, or None: one whole store is made
    (no cache to fill, ``--limit``, ``--processor``, or an engine that makes no parts for this run)."""
    if not (config.cache and fill_cache) or config.limit is not None or config.processor:
        return None
    return engine.cache_part_cuts(tokenize_options(config), sources)


@dataclass
class _PartRun:
    """What making a store from cache parts needs of the run (``_from_parts``)."""

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
    memo: Path | None  # the hash memo, which learns the hashes taken as the inputs are read


def _from_parts(
    run: _PartRun,
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
            key = _entry_key([i.source for i in inputs], run.formats, run.fingerprints, run.options)
            assert key is not None
            lock = EntryLock(run.cache_root, key)
            if lock.acquire():
                keep.callback(lock.release)
            found, state, said = _cached_store(run.cache_root / key, run.limit, run.check)
            warnings[before:before] = said  # the entry's before its parts', as when its key is known first
            if found is not None:
                return found, state, key
        assembling = time.perf_counter()
        store = parts.assemble(inputs, run.formats, run.cache_root / key, run.cache_root, CACHE_FIX)
        seconds["store"] = seconds.get("store", 0.0) + time.perf_counter() - assembling
        store.seconds = seconds
        return store, state, key


def _found_parts(
    run: _PartRun, inputs: list[parts.InputParts], warnings: list[Message], held: contextlib.ExitStack
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
            if found.meta["part"]["last"]:
                break


def _find_part(
    run: _PartRun, item: parts.InputParts, key: str, warnings: list[Message], held: contextlib.ExitStack
) -> TokenStore | None:
    """The cache part ``key`` of ``item``, checked and locked with ``held``, or None (a damaged one reported)."""
    lock = EntryLock(run.cache_root, key)
    if lock.acquire():
        held.callback(lock.release)
    found, _, said = _cached_store(run.cache_root / key, run.limit, run.check)
    warnings.extend(w.replace("cache entry", f"cache part of {item.source.display}") for w in said)
    if found is None or "part" not in found.meta:
        return None
    touch(found.path)
    return found


def _made_parts(
    run: _PartRun, inputs: list[parts.InputParts], encoder: Encoder | None, held: contextlib.ExitStack
) -> dict[str, float]:
    """Tokenize the parts the cache lacks (and read the chained inputs whose parts found are not known to
    be theirs); fill in the hashes taken as the inputs were read. Return the seconds by stage."""
    config = run.config
    if encoder is None:
        encoder = run_encoder(config)

    def unchanged(source: InputSource) -> None:
        now = stamps([source])
        if any(run.before.get(path) != stamp for path, stamp in now.items()):
            raise InputError(_changed(source.display))

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
    known = {**_rehashed(run.engine, sources), **read}
    moved = changed_input(sources, run.before, _known([f for _, f in now]), known)
    if moved is not None:
        for item in inputs:
            if item.source.display == moved:
                for part in item.made:
                    shutil.rmtree(part.path, ignore_errors=True)
        raise InputError(_changed(moved))
    learned = []  # known by their stamps from now on, as if hashed before
    for k in later:
        item, digest = inputs[k], run.fingerprints[k]
        stamp = run.before.get(str(Path(item.source.path)))
        if digest is not None and stamp is not None:
            ends = (parts.part_layout(), item.read.ends) if item.read is not None else None
            taken = (digest, item.records(item.parts), stamp)
            learned.append(Learned(item.source, taken, run.formats[item.source.display], ends))
    remember_reads(learned, run.memo, fields_key(config))
    return made.seconds


def _changed(display: str) -> str:
    return (
        f"{display}: the input changed while it was read (its size, time stamps or contents differ "
        "from before the run); nothing was cached or written; run again once it is no longer being written"
    )


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
    original = [s["path"] for s in store.meta["sources"]]
    store.meta["sources"] = [{**m, "path": s.display} for m, s in zip(store.meta["sources"], sources, strict=True)]
    store.meta["original_paths"] = original
    tokenizer = dict(store.meta["tokenizer"])
    tokenizer["name"] = config.tokenizer_name or DEFAULT_TOKENIZER
    if config.chat_template is not None:  # the key holds the template's text, not its path
        builtin = builtin_name(config.chat_template)
        tokenizer["chat_template"] = builtin if builtin is not None else str(config.chat_template)
        tokenizer["chat_template_source"] = "packcli" if builtin is not None else "file"
    store.meta["tokenizer"] = tokenizer


def _cached_store(
    path: Path, rule_out_max_len: int | None, check_digests: DigestChecker | None = None
) -> tuple[TokenStore | None, str, list[Message]]:
    """Return the checked cache entry at ``path`` (or None), the cache state, and warnings.

    A damaged entry is never used: it is reported in one warning and made again (state "rebuilt").
    An entry that left out long records untokenized serves only runs that would drop them too: a run
    that truncates, or allows longer samples, makes the entry again (a miss).
    """
    try:
        store = find_store(path, check_digests)
    except DamagedStore as exc:
        return None, "rebuilt", [Message("the cache entry is damaged (", *exc.parts, "); it is rebuilt")]
    # The byte limit is max_len * L, and L is the same (the tokenizer is in the key): comparing max
    # lengths compares limits.
    ruled_out = store.meta.get("ruled_out_max_len") if store is not None else None
    if ruled_out is not None and (rule_out_max_len is None or rule_out_max_len > ruled_out):
        return None, "miss", []
    return store, ("miss" if store is None else "hit"), []
