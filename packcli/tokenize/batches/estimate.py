"""The progress bar's total where an input's records were not counted before it is read (a JSON lines file
hashed as it is read): its size times the records a byte of it held so far, exact once it is read."""

from __future__ import annotations

import os

from packcli.io.readers import count_records
from packcli.io.sources import InputSource, RawBatch
from packcli.store import parts


class ReadRate:
    """The records a whole-store read will hand over, for progress: the inputs' counts where known without
    a read (``count_records``), else estimated from what was read of them (``seen``) and their sizes.
    ``limit``: at most that many (``--limit``)."""

    def __init__(self, sources: list[InputSource], limit: int | None) -> None:
        self._sources = sources
        self._counted = [count_records(s, read=False) for s in sources]
        self._limit = limit
        self._index = {s.display: k for k, s in enumerate(sources)}
        self._read = [[0, 0] for _ in sources]  # bytes and records handed over, by input
        self._ended = [False for _ in sources]  # read to its end: its records are counted

    def seen(self, batch: RawBatch) -> RawBatch:
        """Count ``batch`` as handed over; return it."""
        k = self._index.get(batch.source)
        if k is not None:
            for earlier in range(k):
                self._ended[earlier] = True
            if batch.raw_lines:
                self._read[k][0] += sum(len(line) for line in batch.items)
            self._read[k][1] += len(batch.items)
        return batch

    def total(self) -> int | None:
        """The records in all (at most ``limit``), or None: not known, nor estimated yet."""
        total = 0
        passed = sum(b for (b, _), n in zip(self._read, self._counted, strict=True) if n is None)
        seen = sum(r for (_, r), n in zip(self._read, self._counted, strict=True) if n is None)
        for k, (source, count) in enumerate(zip(self._sources, self._counted, strict=True)):
            if count is None:
                count = self._estimated(k, source, passed, seen)
                if count is None:
                    return self._limit
            total += count
            if self._limit is not None and total >= self._limit:
                return self._limit
        return total

    def _estimated(self, k: int, source: InputSource, passed: int, seen: int) -> int | None:
        own, records = self._read[k]
        if self._ended[k]:
            return records
        if source.kind != "jsonl" or source.compression is not None or not passed:
            return None
        try:
            size = os.stat(source.path).st_size
        except OSError:
            return None
        return max(records, round(records * size / own)) if own else round(seen * size / passed)


def parts_left(todo: list[parts.InputParts], counted: list[int | None]) -> int | None:
    """The records left to tokenize, for progress, where a JSON lines file's records were not counted
    before its read: its size times the records a byte of it held so far (of the files read so far,
    before its read begins); None for a compressed file, whose size is not its content's, or before
    any byte is read. The parts found are left out as they are found."""
    passed = sum(item.read.passed[0] for item in todo if item.read is not None)
    seen = sum(item.read.passed[1] for item in todo if item.read is not None)
    total = 0
    for item, count in zip(todo, counted, strict=True):
        if count is None:
            if item.source.kind != "jsonl" or item.source.compression is not None or not passed:
                return None
            try:
                size = os.stat(item.source.path).st_size
            except OSError:
                return None
            own, records = item.read.passed if item.read is not None else (0, 0)
            if item.read is not None and item.read.whole is not None:  # read to its end: counted
                count = sum(item.read.records)
            else:  # by its own bytes so far, else by the files' read so far
                count = max(records, round(records * size / own)) if own else round(seen * size / passed)
        total += count - (item.records(item.found) if item.chained else item.next_record)
    return total
