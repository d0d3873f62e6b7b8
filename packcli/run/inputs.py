"""Stage one, step one: the run's inputs resolved once, into one ``Inputs`` that the run passes on.

Each input's identity before anything is tokenized: its path and stamp, its record format (sniffed from
its first records, or remembered with its hash), its content hash and record count (taken now, remembered
by its stamp, or left to be taken as it is read), and the run's hash memo, which learns them. The run's
task follows from the formats. ``run.tokenized`` keys the cache by them (``Inputs.entry_key``); the steps
after it (the cache's lookup, a store made whole or from cache parts) read them here instead of asking for
them again, and ask it whether an input changed while it was read (``Inputs.changed_while_read``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packcli.config import PackConfig
from packcli.engines import Engine, FileHashing, HashJob
from packcli.errors import Opt, UsageError
from packcli.io.fingerprint import (
    Memo,
    Remembered,
    changed_input,
    files_to_hash,
    fingerprint,
    settled_unchanged,
    stamps,
)
from packcli.io.readers import hashed_as_read, record_formats
from packcli.io.sources import InputSource, resolve_inputs
from packcli.jsontypes import JSONObject
from packcli.owned import HASH_MEMO
from packcli.procs.stop import raise_if_stopped
from packcli.records import preference
from packcli.store.key import cache_key, cache_root

# An input's content hash and record count, either None where not known without reading it again.
Hashed = tuple[str | None, int | None]


@dataclass
class Inputs:
    """The run's inputs, identified once (``identify_inputs``) and passed on through stage one."""

    sources: list[InputSource]  # in order, each with its record count where known
    formats: dict[str, str | None]  # each input's record format, by its display name
    task: str  # sft, preference or kto (packcli.records.preference.resolve_task)
    fingerprints: list[str | None]  # content hashes; None: taken as the input is read (filled in then)
    later: list[bool]  # the inputs hashed as they are read (JSON lines files made into cache parts)
    before: dict[str, list[int]]  # the local files' stamps, taken before anything was read
    stamped_ns: int  # when ``before`` was taken (``io.fingerprint.changed_input``)
    memo: Memo  # the run's hash memo, read once; it learns what the run learns, and the run saves it
    remembered: list[Remembered | None]  # what the memo knew of each input as it was before the run, asked once
    fields_key: str  # the fields the formats were sniffed with, as the memo keeps them (--field, as JSON)
    cache_root: Path  # the cache's directory (used only with the cache on)
    spent: list[float] = field(default_factory=list)  # seconds of each pass reading the inputs through
    # The hashes being taken in a thread beside the tokenizer's loading (the cache off): ``settle`` waits;
    # ``cancel`` stops them (the run failed first), and waits for the thread.
    pending: Future[list[Hashed]] | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)

    def settle(self) -> None:
        """Wait for the hashes taken beside the tokenizer's loading, if any; before any worker is forked."""
        if self.pending is not None:
            self.hashes_taken(self.pending.result())
            self.pending = None
        raise_if_stopped()

    def cancel(self) -> None:
        """Stop the hashes being taken beside the tokenizer's loading, if any, and wait for their thread, which
        ends at its next read of 4 MiB: a run that fails before it needs them ends without reading its inputs
        through (a process waits for its threads before it exits)."""
        if self.pending is None:
            return
        self.cancelled.set()
        with contextlib.suppress(Exception, KeyboardInterrupt):
            self.pending.result()  # the thread's end: HashingCancelled, or what it met before
        self.pending = None

    def hashes_taken(self, found: list[Hashed]) -> None:
        """Take in the inputs' hashes and record counts (``Hashed``, in order)."""
        self.fingerprints = [f for f, _ in found]
        # The records of each input, counted as it was hashed (or remembered): for progress, without a read.
        self.sources = [
            dataclasses.replace(s, records=n) if n is not None else s
            for s, (_, n) in zip(self.sources, found, strict=True)
        ]

    @property
    def hash_seconds(self) -> float:
        """Seconds spent reading the inputs through before tokenizing them (hashes, record counts)."""
        return sum(self.spent)

    @property
    def hashes(self) -> list[str]:
        """The inputs' hashes, every one known (once those taken as the inputs are read are in)."""
        found = [f for f in self.fingerprints if f is not None]
        assert len(found) == len(self.fingerprints)
        return found

    def entry_key(self, options: JSONObject) -> str | None:
        """The key of the run's cache entry (``options``: what keys it besides its inputs), or None while
        the hash of an input is not known.

        Each input by its content, in order (sample_index follows it), with the reader its file type chose
        and the record format found: never its path, so that any spelling of a path, a copy, stdin or a
        preset run from elsewhere finds the same entry.
        """
        if any(f is None for f in self.fingerprints):
            return None
        entries = [
            [s.kind, s.compression, self.formats[s.display], f]
            for s, f in zip(self.sources, self.fingerprints, strict=True)
        ]
        return cache_key({"inputs": entries, **options})

    def changed_while_read(self, engine: Engine, read: dict[str, str], among: list[int] | None = None) -> str | None:
        """Take in the hashes taken as the inputs were read (``read``, by path; an input hashed as it is read
        and missing there is hashed now), and return the display name of the first input among ``among``
        (index numbers; None: all) that changed while it was read (its stamp, or its hash, differ from
        those taken before the run), or None.

        The hashes compared are those taken as the inputs were read, else taken again by the engine where it
        reads them (Ray's tasks: ``rehashed``), else here (``io.fingerprint.changed_input``).
        """
        for k, source in enumerate(self.sources):
            if self.fingerprints[k] is None:
                self.fingerprints[k] = read.get(str(Path(source.path))) or fingerprint(source)
        among = list(range(len(self.sources))) if among is None else among
        sources = [self.sources[k] for k in among]
        known = {**rehashed(engine, sources, self.before, self.stamped_ns), **read}
        hashes = self.hashes
        return changed_input(sources, self.before, [hashes[k] for k in among], known, self.stamped_ns)


def rehashed(
    engine: Engine, sources: list[InputSource], before: dict[str, list[int]], stamped_ns: int
) -> dict[str, str]:
    """The inputs' hashes taken again, once read, by the engine where it reads them (none: the run hashes
    them itself, in ``changed_input``): of the inputs whose stamps changed or had not settled when taken
    (``before``, at ``stamped_ns``); ``changed_input`` trusts the others' stamps."""
    if engine.hashing is None:
        return {}
    unsure = [s for s in sources if not settled_unchanged(s, before, stamped_ns)]
    if not unsure:
        return {}
    return engine.hashing.hash_files(HashJob(files_to_hash(unsure), again=True))


def changed(display: str) -> str:
    """What is said of an input that changed while it was read."""
    return (
        f"{display}: the input changed while it was read (its size, time stamps or contents differ "
        "from before the run); nothing was cached or written; run again once it is no longer being written"
    )


def identify_inputs(config: PackConfig, engine: Engine, given: list[InputSource] | None, fill_cache: bool) -> Inputs:
    """Resolve the run's inputs (``given``: already resolved by the caller) and identify each one: stamp,
    record format, the run's task, content hash and record count.

    With the cache on, the hashes are taken now (the key needs them), except those of the
    inputs hashed as they are read; with it off, in a thread beside the tokenizer's loading, until
    ``Inputs.settle``. ``fill_cache`` False (a dry run): the memo is asked, never taught.
    """
    root = cache_root(config.cache_dir)
    sources = given if given is not None else resolve_inputs(list(config.inputs), config.split)
    stamped_ns = time.time_ns()
    before = stamps(sources)  # before the format is sniffed and the contents hashed
    memo = Memo.load(root / HASH_MEMO if config.cache else None)  # read once for the run's inputs
    remembered = [memo.remembered(s) for s in sources]  # asked once: formats, hashes, parts' ends
    key = json.dumps(config.fields, sort_keys=True)  # the fields the formats are sniffed with, as the memo keys them
    remembered_formats = [r.formats.get(key) if r is not None else None for r in remembered]
    # Who hashes the inputs where it reads them: the engine (Ray's tasks); None: this process, and the
    # local files are hashed as they are read to be tokenized.
    hashing = engine.hashing
    later = [hashing is None and hashed_as_read(s) for s in sources]
    sniffed = record_formats(sources, config.format, config.fields, remembered_formats, config.on_error == "fail")
    task, formats = preference.resolve_task(
        config.task, sniffed, config.overflow, config.output_format, config.truncate_side
    )
    if config.processor is not None and task != "sft":
        found = next(fmt for fmt in formats.values() if fmt in ("preference", "kto"))
        raise UsageError(
            f"the inputs are {found} records, and {task} data with images is not supported yet; leave out ",
            Opt("processor"),
            " or pack SFT records",
        )
    inputs = Inputs(
        sources, formats, task, [None] * len(sources), later, before, stamped_ns, memo, remembered, key, root
    )
    _hash(inputs, hashing, config.cache)
    if fill_cache:  # a dry run writes nothing
        memo.remember_formats(sources, key, formats)
    return inputs


def _hash(inputs: Inputs, hashing: FileHashing | None, cache: bool) -> None:
    """Take the inputs' content hashes and record counts: by the engine, where it hashes them elsewhere
    (the Ray engine: in tasks, not on the driver; nor does it count records there); now, with the cache
    on; else in a thread, joined by ``Inputs.settle`` once the tokenizer is loaded (reading the inputs
    and loading the tokenizer each keep one core busy).

    One read of each input hashes it and counts its records (for the progress bar); a file remembered by
    its stamp in the memo (which learns the hashes taken here; the run saves it) is not read.
    """
    memo, sources = inputs.memo, inputs.sources

    def hashed() -> list[Hashed]:
        began = time.perf_counter()
        try:
            return [
                ((known.hashed if known is not None else None) or (None, None))
                if then
                else memo.fingerprint_and_count(s, cancelled=inputs.cancelled)
                for s, then, known in zip(sources, inputs.later, inputs.remembered, strict=True)
            ]
        finally:
            inputs.spent.append(time.perf_counter() - began)

    if hashing is not None:
        known = hashing.hash_files(HashJob(memo.files_to_hash(sources)))
        inputs.hashes_taken([(memo.fingerprint_and_count(s, known, count=False)[0], None) for s in sources])
    elif cache:
        inputs.hashes_taken(hashed())  # the key needs them first
    else:  # no memo: the cache is off
        ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="packcli-inputs")
        inputs.pending = ahead.submit(hashed)
        ahead.shutdown(wait=False)
