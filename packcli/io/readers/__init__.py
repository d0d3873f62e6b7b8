"""Reading the inputs: each source as batches of raw records, in a fixed order, numbered from 0.

JSON lines are handed on as raw bytes so that decoding and validation run in the worker processes;
other formats give dicts. Every record gets its global ``sample_index``: sources in their sorted
order, records in file order, every record counted.

One module per kind of input: ``jsonl`` (JSON lines and JSON arrays), ``tabular`` (Parquet, Arrow,
CSV, saved datasets), ``hub`` (Hub datasets); ``compressed`` opens a file and decompresses it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Generator, Iterator

from packcli.errors import InputError
from packcli.io.readers.compressed import open_input, read_rest
from packcli.io.readers.hub import hub_reachable
from packcli.io.readers.jsonl import PartEnds, read_json, read_json_lines
from packcli.io.readers.tabular import parquet_file, read_tabular
from packcli.io.sources import InputSource, RawBatch
from packcli.procs.stop import raise_if_stopped

__all__ = [
    "PartEnds",
    "count_records",
    "hash_through",
    "hub_reachable",
    "number_batches",
    "parquet_file",
    "read_batches",
    "read_parts",
    "read_source",
]


def count_records(source: InputSource, read: bool = True) -> int | None:
    """Return the number of records of a source when it is cheap to know (for progress), else None.

    ``read`` False: only what is known without reading the file (a JSON lines file is counted by a read).
    """
    if source.records is not None:
        return source.records
    if not read and source.kind in ("jsonl", "json"):
        return None
    try:
        if source.kind == "jsonl" and source.compression is None:
            st = os.stat(source.path)
            return _count_lines(os.path.abspath(source.path), st.st_size, st.st_mtime_ns)
        if source.kind == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(source.path).metadata.num_rows
    except Exception:  # a file that cannot be read is reported by the reader, with its reason
        return None
    return None


# By (path, size, mtime_ns): a count made ahead of time (while the tokenizer loads) is not made again
# when the tokenizing starts.
@functools.lru_cache(maxsize=256)
def _count_lines(path: str, size: int, mtime_ns: int) -> int:
    """The records (non-blank lines) of a JSON lines file, as it is at that size and time."""
    n = 0
    with open(path, "rb") as fh:
        for i, line in enumerate(fh):
            n += bool(line.strip())
            if not i & 0xFFFF:
                raise_if_stopped()
    return n
    return None


def read_batches(
    sources: list[InputSource], batch_size: int = 1000, limit: int | None = None, digests: dict[str, str] | None = None
) -> Iterator[RawBatch]:
    """Yield the records of all sources in order, in batches, numbering them from 0.

    With ``limit``, only the first ``limit`` records (over all sources, in that order) are read.
    ``digests`` receives the hash of each local JSON lines file (``read_source``); with ``limit`` too, the
    rest of a file cut by the limit, and the files after it, are read through for their hash alone (no
    record of them is handed over): the run's key is of whole files, and it needs no other read of them.
    """
    index = 0
    for source in sources:
        if limit is not None and index >= limit:
            if digests is None:
                return
            hash_through(source, digests)
            continue
        left = None if limit is None or digests is None else limit - index
        index = yield from number_batches(read_source(source, batch_size, digests, left), index, limit)


def hash_through(source: InputSource, digests: dict[str, str]) -> None:
    """Put the hash of a local JSON lines file into ``digests`` (by its path), read for it alone: a file
    the run's ``--limit`` leaves unread, whose hash its key still holds."""
    if source.kind != "jsonl":
        return
    try:
        with open_input(source, digests) as fh:
            read_rest(fh)
    except OSError as exc:
        raise InputError(f"{source.display}: cannot read ({exc.strerror or exc}); check the file") from exc


def read_parts(source: InputSource, batch_size: int, ends: PartEnds, digests: dict[str, str]) -> Iterator[RawBatch]:
    """Yield a JSON lines file's records in batches numbered from 0, cutting it into parts and hashing where
    each ends into ``ends`` as it reads (``io.readers.jsonl.PartEnds``)."""
    batches = read_json_lines(source, batch_size, digests, ends)
    try:
        yield from number_batches(batches, 0, None)
    except OSError as exc:
        raise InputError(f"{source.display}: cannot read ({exc.strerror or exc}); check the file") from exc


def number_batches(batches: Iterator[RawBatch], index: int, limit: int | None) -> Generator[RawBatch, None, int]:
    """Yield ``batches`` numbered on from ``index`` (their ``first_index``), cut at ``limit`` records.

    Returns the index after the last record yielded.
    """
    for batch in batches:
        if limit is not None and index + len(batch.items) > limit:
            keep = limit - index
            batch.items, batch.positions = batch.items[:keep], batch.positions[:keep]
            batch.errors = [e for e in batch.errors if e[0] in set(batch.positions)]
        batch.first_index = index
        index += len(batch.items)
        if batch.items:
            yield batch
        if limit is not None and index >= limit:
            break
    return index


def read_source(
    source: InputSource, batch_size: int, digests: dict[str, str] | None = None, records: int | None = None
) -> Iterator[RawBatch]:
    """Yield one source's records in batches, by the reader of its kind, numbered from 0 within it.

    ``digests`` receives the content hash of a local JSON lines file read to its end (by its path), taken
    from the bytes read: the run checks with it that the file did not change while it was read, without
    reading it again. The other readers leave it as it is. ``records``: a JSON lines file's first records
    only are handed over (the rest is read for the hash, with ``digests``; the other readers ignore it).
    """
    try:
        if source.kind == "jsonl":
            yield from read_json_lines(source, batch_size, digests, records=records)
        elif source.kind == "json":
            yield from read_json(source, batch_size)
        else:
            yield from read_tabular(source, batch_size)
    except OSError as exc:
        raise InputError(f"{source.display}: cannot read ({exc.strerror or exc}); check the file") from exc
