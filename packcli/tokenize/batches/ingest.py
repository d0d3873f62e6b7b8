"""Stage 1: every record of the inputs tokenized (by the workers) and accounted for, into a token store."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from packcli.contract import Progress
from packcli.io.readers import PartEnds, count_records, read_batches, read_parts
from packcli.io.sources import InputSource, RawBatch
from packcli.procs import pool
from packcli.results import ProcessorIdentity, TokenizerIdentity
from packcli.store import parts
from packcli.store.tokens import TokenStore
from packcli.tokenize.batches import worker
from packcli.tokenize.batches.building import POLICY_DROPS, TURN_FIXES, StoreBuilder
from packcli.tokenize.batches.estimate import ReadRate, parts_left
from packcli.tokenize.batches.worker import TokenizedBatch
from packcli.tokenize.encoders.encoder import Encoder
from packcli.tokenize.options import BATCH_SIZE, TokenizeOptions

__all__ = ["BATCH_SIZE", "POLICY_DROPS", "TURN_FIXES", "tokenize_to_parts", "tokenize_to_store"]

assert parts.PART_RECORDS % BATCH_SIZE == 0  # a batch lies in one cache part


class RemoteTokenizing(Protocol):
    """An engine's tokenizing that reads the inputs and writes the tokens where it runs (the Ray engine's)."""

    segment_root: str | None  # where the token segments are written; None: into the store's directory

    def results(self, directory: Path) -> Iterator[TokenizedBatch]:
        """Yield, in input order, batches whose tokens are a store segment (``segment``), not arrays."""
        ...


def processor_identity(encoder: Encoder) -> ProcessorIdentity:
    """Return what the manifest records of the run's processor."""
    vision = encoder.vision
    return {
        "dir": os.path.abspath(vision.name),  # verify and the collator may run from any directory
        "family": vision.family,
        "image_token": vision.image_token,
        "image_token_id": encoder.image_token_id,
        "sha256": vision.identity(),
    }


def long_text_bytes(options: TokenizeOptions, encoder: Encoder) -> int | None:
    """Return the UTF-8 bytes over which a text is encoded by windows (``Encoder.long_text_bytes``), or None.

    Under --overflow truncate or split, a text over the early too-long rule's bound (packcli.tokenize.long.bounds)
    certainly has more tokens than a row: it is encoded by windows, in bounded memory.
    """
    if options.overflow not in ("truncate", "split"):
        return None
    token_bytes = encoder.max_token_bytes
    return options.max_len * token_bytes if token_bytes else None


def tokenize_to_store(
    options: TokenizeOptions,
    sources: list[InputSource],
    formats: dict[str, str | None],
    encoder: Encoder,
    store_path: Path,
    progress: Progress,
    rule_out_long: bool = False,
    remote: RemoteTokenizing | None = None,
    before_finish: Callable[[dict[str, str]], Path | None] | None = None,
) -> TokenStore:
    """Tokenize every record of the sources into a token store at ``store_path``.

    The batches run in worker processes (``procs.pool``), their results taken in order.
    With ``rule_out_long``, records that certainly have more than --max-len tokens are dropped as
    too_long before tokenizing (see packcli.tokenize.long.bounds); the store then lacks them, which its meta records.

    ``remote`` is an engine that reads and tokenizes the inputs itself and writes the tokens where it
    makes them: ``remote.results(directory)`` yields, in input order, TokenizedBatch results whose
    tokens are a segment (``segment``, ``segment_files``) instead of arrays; it may write the
    segments into ``directory`` (the store being made) or under ``remote.segment_root``. This process
    then reads no input and no token, and keeps the same accounting.

    ``before_finish`` runs once every record is read, before the store is moved into place; what it
    raises leaves no store (the run checks there that no input changed while it was read). It is given
    the hashes of the files this process read through (``io.readers.read_source``), by path, and may
    return where the store goes instead of ``store_path`` (a path in the same directory: the run's cache
    entry, whose key is known once the inputs are read).
    """
    context = worker_context(options, encoder, rule_out_long)
    ruled_out_bytes = options.max_len * context.rule_out[1] if context.rule_out else None
    where, fix = options.store_where(store_path)
    builder = StoreBuilder(options, store_path, where, fix)
    clock: defaultdict[str, float] = defaultdict(float)  # seconds by stage (see TokenStore.seconds)
    began = time.perf_counter()
    # A file not counted before (hashed as it is read): a JSON lines file's records estimated as it is read.
    rate = ReadRate(sources if remote is None else [], options.limit)
    results: Iterator[TokenizedBatch] | None = None
    digests: dict[str, str] = {}  # the hashes of the files read through, taken as they were read
    try:
        if remote is None:
            batches = _timed(read_batches(sources, BATCH_SIZE, options.limit, digests), clock, "read")
            jobs = ((rate.seen(batch), formats[batch.source]) for batch in batches)
            results = pool.map_ordered(worker.tokenize_batch, jobs, options.num_proc, context=context)
        else:
            results = remote.results(builder.tmp)
        for result in results:
            stored = time.perf_counter()
            for key, value in result.seconds.items():
                clock[key] += value
            builder.take(result)
            clock["store"] += time.perf_counter() - stored
            progress("tokenize", result.n_records, rate.total())
        meta = builder.meta(sources, formats, store_identity(encoder), store_pad_id(encoder), encoder.choice.record())
        meta = builder.ruled_out(meta, ruled_out_bytes)
        if before_finish is not None and (final := before_finish(digests)) is not None:
            builder.place(final)  # known once the inputs are read (their hashes key it)
        finishing = time.perf_counter()
        if remote is None:
            store = builder.finish(meta)
        else:
            store = builder.finish(meta, segment_root=remote.segment_root, verify=False)
        clock["store"] += time.perf_counter() - finishing
        clock["wall"] = time.perf_counter() - began
        store.seconds = dict(clock)
        return store
    except BaseException:
        _stop(results)
        builder.abort()
        raise
    finally:
        encoder.long_text_bytes = None


def tokenize_to_parts(
    options: TokenizeOptions,
    inputs: list[parts.InputParts],
    formats: dict[str, str | None],
    encoder: Encoder,
    cache_root: Path,
    progress: Progress,
    rule_out_long: bool = False,
    unchanged: Callable[[InputSource], None] | None = None,
    hold: Callable[[str], None] | None = None,
    read_digests: dict[str, str] | None = None,
) -> dict[str, float]:
    """Tokenize what the cache lacks of each input into parts (``packcli.store.parts``), committed as
    they are finished: ``inputs[k].made`` receives them. Return the seconds by stage.

    An input whose parts were all found is not read; one whose first parts were found is read from
    the start but tokenized from the first part missing. A local file (``item.chained``) is read once,
    its parts found as it is read (``_chained``). ``unchanged(source)`` runs before each part of
    that source is committed (and raises if it changed since it was hashed); ``hold(key)`` before a
    part is begun (the run locks it, as it locks the entries it uses). ``read_digests`` receives the
    hashes of the files read through, taken as they were read, by path.
    """
    context = worker_context(options, encoder, rule_out_long)
    clock: defaultdict[str, float] = defaultdict(float)
    began = time.perf_counter()
    todo = [item for item in inputs if not item.complete]
    counted = [count_records(item.source, read=not item.chained) for item in todo]
    # The records to tokenize: those of the parts not found (a chained input's found parts may be any).
    done = sum(item.records(item.found) if item.chained else item.next_record for item in todo)
    total = None if None in counted else sum(counted) - done  # type: ignore[arg-type]
    route: deque[tuple[parts.InputParts, int]] = deque()  # the part of each batch sent, in order
    digests = read_digests if read_digests is not None else {}

    def jobs() -> Iterator[tuple[RawBatch, str | None]]:
        for item in todo:
            if item.chained:
                numbered = _chained(item, clock, digests)
            else:
                batches = _timed(read_batches([item.source], BATCH_SIZE, digests=digests), clock, "read")
                numbered = ((batch.first_index // parts.PART_RECORDS, batch) for batch in batches)
            skip = 0 if item.chained else item.next_index
            for number, batch in numbered:
                if number >= skip:
                    route.append((item, number))
                    yield batch, formats[batch.source]

    results: Iterator[TokenizedBatch] | None = None
    ruled_out_bytes = options.max_len * context.rule_out[1] if context.rule_out else None
    making = _PartMaking(options, formats, encoder, cache_root, clock, unchanged, hold, ruled_out_bytes)
    try:
        if todo and not todo[0].chained:  # the first part to make, begun before the first batch is tokenized
            making.begin(todo[0], todo[0].next_index, todo[0].next_record)
        results = pool.map_ordered(worker.tokenize_batch, jobs(), options.num_proc, context=context)
        for result in results:
            making.take(*route.popleft(), result)
            progress("tokenize", result.n_records, total if total is not None else parts_left(todo, counted))
        making.commit(last=True)
        # An input with no part made now, nor its last found (empty, or killed just after its last part):
        # its last part, empty, says it is whole.
        for item in todo:
            if not item.chained and (not item.made or not parts.part_info(item.made[-1])["last"]):
                making.begin(item, item.next_index, item.next_record)
                making.commit(last=True)
        clock["wall"] = time.perf_counter() - began
        return dict(clock)
    except BaseException:
        _stop(results)
        making.abort()
        raise
    finally:
        encoder.long_text_bytes = None


def _chained(
    item: parts.InputParts, clock: defaultdict[str, float], digests: dict[str, str]
) -> Iterator[tuple[int, RawBatch]]:
    """The batches of a local input's parts that the cache lacks, with their part's number; the input read
    once, from its start (a JSON lines file cut by its bytes, the other kinds by their records).

    Each part is held (at most ``parts.PART_BYTES`` and a record) until its end is read: its key is then
    known, and a part the cache has is taken from it (``item.find``), not tokenized.
    """
    ends = item.read = PartEnds(parts.PART_RECORDS, parts.PART_BYTES)
    item.found.clear()  # found again as the read comes to each (the memo's ends did not find them all)
    held: list[RawBatch] = []
    number = 0  # the part being read
    for batch in _timed(read_parts(item.source, BATCH_SIZE, ends, digests), clock, "read"):
        held.append(batch)
        if len(ends.ends) <= number:
            continue  # the part goes on
        found = item.find(item.key_of(number)) if item.find is not None else None
        if found is not None:
            item.found.append(found)
        else:
            yield from ((number, b) for b in held)
        held = []
        number += 1
    assert not held  # the input's last part ends with it
    item.ended = True


class _PartMaking:
    """The cache part being made (``tokenize_to_parts``): begun, fed the batches of its records, committed."""

    def __init__(
        self,
        options: TokenizeOptions,
        formats: dict[str, str | None],
        encoder: Encoder,
        cache_root: Path,
        clock: defaultdict[str, float],
        unchanged: Callable[[InputSource], None] | None,
        hold: Callable[[str], None] | None,
        ruled_out_bytes: int | None,
    ) -> None:
        self.options, self.formats, self.encoder, self.cache_root = options, formats, encoder, cache_root
        self.clock, self.unchanged, self.hold = clock, unchanged, hold
        self.where, self.fix = options.store_where(cache_root / "part")
        self.ruled_out_bytes = ruled_out_bytes  # a record of more bytes is ruled out as too long (None: none is)
        self.part: tuple[parts.InputParts, int, StoreBuilder, int] | None = (
            None  # its input, number, builder, first record
        )

    def begin(self, item: parts.InputParts, number: int, first: int) -> None:
        if self.hold is not None:
            self.hold(item.key_of(number))
        builder = StoreBuilder(self.options, self.cache_root / item.key_of(number), self.where, self.fix)
        self.part = (item, number, builder, first)

    def take(self, item: parts.InputParts, number: int, result: TokenizedBatch) -> None:
        """Add a batch of part ``number`` of ``item``: the part being made is committed first if it is another."""
        if self.part is not None and (self.part[0], self.part[1]) != (item, number):
            if self.part[0] is item and not self.part[2].counts["records"]:
                self.part[2].abort()  # begun ahead, and none of its batches came (a part number skipped)
                self.part = None
            else:
                self.commit(last=self.part[0] is not item)
        if self.part is None:
            self.begin(item, number, result.first_index)
        assert self.part is not None
        stored = time.perf_counter()
        for key, value in result.seconds.items():
            self.clock[key] += value
        self.part[2].take(result)
        self.clock["store"] += time.perf_counter() - stored

    def commit(self, last: bool) -> None:
        """Move the part being made, if any, into the cache (``last``: its input's last part)."""
        if self.part is None:
            return
        item, number, builder, first = self.part
        if self.unchanged is not None:
            self.unchanged(item.source)
        encoder = self.encoder
        identity, pad_id = store_identity(encoder), store_pad_id(encoder)
        meta = builder.meta([item.source], self.formats, identity, pad_id, encoder.choice.record())
        meta = builder.ruled_out(meta, self.ruled_out_bytes)
        part = parts.part_meta(number, first, int(builder.counts["records"]), last, read=item.read)
        meta = dataclasses.replace(meta, part=part)
        finishing = time.perf_counter()
        item.made.append(builder.finish(meta))
        self.clock["store"] += time.perf_counter() - finishing
        self.part = None

    def abort(self) -> None:
        if self.part is not None:
            self.part[2].abort()
            self.part = None


def worker_context(options: TokenizeOptions, encoder: Encoder, rule_out_long: bool = False) -> worker.WorkerContext:
    """What the workers tokenize this run's batches with; with ``rule_out_long``, the early too-long rule."""
    token_bytes = encoder.max_token_bytes if rule_out_long else None
    encoder.long_text_bytes = long_text_bytes(options, encoder)
    if encoder.text.name != "fastokens" or encoder.long_text_bytes is not None or options.split or encoder.vision:
        # Encoded with the tokenizers backend here (the reference, long texts, pieces, images): opened before the
        # workers fork, so that they share it. The fast encoder alone never opens it (a record it cannot vouch
        # for opens it in its worker).
        _ = encoder.backend
    else:
        encoder.drop_backend()  # opened for the probe, if at all
    return worker.WorkerContext(
        encoder,
        dict(options.fields),
        rule_out=(options.max_len, token_bytes) if token_bytes else None,
        split=options.split,
        fix_turns=options.fix_turns,
        image_window=options.image_window,
        expand_turns=options.expand_turns,
        prefix_tree=options.max_len if options.prefix_tree else None,
        content_keys=options.content_keys,
    )


def _stop(results: Iterator[Any] | None) -> None:
    """Stop the workers here, in this thread: left to the garbage collector, a suspended results
    generator would stop them from wherever the collection happens to run."""
    close = getattr(results, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):  # the error being raised is the one to report
            close()


def store_identity(encoder: Encoder) -> TokenizerIdentity:
    """The tokenizer's identity a store records (with its processor's, for a run with one)."""
    if encoder.vision is not None:
        return {**encoder.identity(), "processor": processor_identity(encoder)}
    return encoder.identity()


def store_pad_id(encoder: Encoder) -> int:
    """The pad id a store records: the tokenizer's, else its end-of-sequence id, else 0."""
    pad_id = encoder.tokenizer.pad_token_id
    return int(pad_id) if pad_id is not None else (encoder.eos_id or 0)


def _timed(items: Iterator[Any], clock: defaultdict[str, float], key: str) -> Iterator[Any]:
    """Yield from ``items``, adding the seconds spent getting each one to ``clock[key]``."""
    while True:
        t = time.perf_counter()
        try:
            item = next(items)
        except StopIteration:
            clock[key] += time.perf_counter() - t
            return
        clock[key] += time.perf_counter() - t
        yield item
