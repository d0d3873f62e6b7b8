"""Reading the inputs: each source as batches of raw records, in a fixed order, numbered from 0.

JSON lines are handed on as raw bytes so that decoding and validation run in the worker processes;
other formats give dicts. Every record gets its global ``sample_index``: sources in their sorted
order, records in file order, every record counted.

One module per kind of input: ``jsonl`` (JSON lines and JSON arrays), ``tabular`` (Parquet, Arrow,
CSV, saved datasets), ``hub`` (Hub datasets); ``compressed`` opens a file and decompresses it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
from collections.abc import Generator, Iterator
from pathlib import Path

from packcli.errors import InputError, Opt, Part, RecordError, record_fix, where
from packcli.io.readers.compressed import open_input, read_rest
from packcli.io.readers.hub import hub_reachable
from packcli.io.readers.jsonl import PartEnds, read_json, read_json_lines
from packcli.io.readers.reading import Reading
from packcli.io.readers.tabular import parquet_file, parquet_rows, read_tabular
from packcli.io.sources import InputSource, RawBatch
from packcli.io.uri import is_uri
from packcli.procs.stop import raise_if_stopped

__all__ = [
    "PartEnds",
    "count_records",
    "hash_through",
    "hashed_as_read",
    "hub_reachable",
    "number_batches",
    "parquet_file",
    "read_batches",
    "read_head",
    "read_parts",
    "read_source",
    "record_formats",
    "sniff_format",
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
            return parquet_rows(source.path)
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


def hashed_as_read(source: InputSource) -> bool:
    """Whether reading ``source`` to its end gives its hash (``read_source``'s ``digests``): a local file (not a
    saved dataset, nor a Hub dataset)."""
    return source.kind in ("jsonl", "json", "parquet", "csv", "arrow") and not is_uri(source.path)


def hash_through(source: InputSource, digests: dict[str, str]) -> None:
    """Put the hash of a local file into ``digests`` (by its path), read for it alone: a file the run's
    ``--limit`` leaves unread, whose hash its key still holds."""
    if not hashed_as_read(source):
        return
    try:
        with open_input(source, digests) as fh:
            read_rest(fh)
    except OSError as exc:
        raise InputError(f"{source.display}: cannot read ({exc.strerror or exc}); check the file") from exc


def read_parts(source: InputSource, batch_size: int, ends: PartEnds, digests: dict[str, str]) -> Iterator[RawBatch]:
    """Yield a local file's records in batches numbered from 0, cutting it into parts and hashing where each
    ends into ``ends`` as it reads (``io.readers.jsonl.PartEnds``): a JSON lines file by its bytes, the other
    kinds by the records read (``_marked``)."""
    if source.kind == "jsonl":
        batches = read_json_lines(source, batch_size, digests, ends)
    else:
        batches = _marked(read_source(source, batch_size, digests, hashed=True), ends, digests, str(Path(source.path)))
    try:
        yield from number_batches(batches, 0, None)
    except OSError as exc:
        raise InputError(f"{source.display}: cannot read ({exc.strerror or exc}); check the file") from exc


def _marked(batches: Iterator[RawBatch], ends: PartEnds, digests: dict[str, str], path: str) -> Iterator[RawBatch]:
    """The batches of an input read as records, cut into parts by what they hold: a part ends with the batch
    that takes it to ``ends.every`` records or ``ends.size`` bytes of records, or with the input.

    ``ends.ends[k]`` is the hash of the records of parts ``0..k``: of each batch's ``digest`` (its Arrow
    form's), else of its records, their numbers and errors, pickled. The same records, read again from a
    file written again, find the same parts. A batch is handed over once the next is read, so that the
    batch that ends a part arrives after its end is known."""
    chain = hashlib.blake2b(digest_size=16)
    records = start = size = 0  # records read, where the part being read starts, its bytes (hashed)
    held: RawBatch | None = None
    for batch in batches:
        if held is not None:
            yield held
        if batch.digest is not None:
            data, hashed = batch.digest, batch.hashed_bytes
        else:
            data = pickle.dumps((batch.items, batch.positions, batch.errors), protocol=5)
            hashed = len(data)
        chain.update(len(data).to_bytes(8, "little"))
        chain.update(data)
        records, size = records + len(batch.items), size + hashed
        if records - start >= ends.every or size >= ends.size:
            ends.ends.append(chain.hexdigest())
            ends.records.append(records - start)
            start, size = records, 0
        held = batch
        ends.passed = (0, records)
    ends.whole = chain.hexdigest()
    if records > start:
        ends.ends.append(ends.whole)
        ends.records.append(records - start)
    ends.file = digests.get(path)
    if held is not None:
        yield held


def number_batches(batches: Iterator[RawBatch], index: int, limit: int | None) -> Generator[RawBatch, None, int]:
    """Yield ``batches`` numbered on from ``index`` (their ``first_index``), cut at ``limit`` records.

    Returns the index after the last record yielded.
    """
    for batch in batches:
        if limit is not None and index + len(batch.items) > limit:
            batch.cut(limit - index)
        batch.first_index = index
        index += len(batch.items)
        if batch.items:
            yield batch
        if limit is not None and index >= limit:
            break
    return index


def read_head(source: InputSource, records: int) -> Iterator[RawBatch]:
    """The first ``records`` records of a source (for the sniff), read as little of it as its reader can: a
    Parquet file's first pages of each column, not its first row group."""
    return number_batches(read_source(source, records, records=records, head=True), 0, records)


def read_source(
    source: InputSource,
    batch_size: int,
    digests: dict[str, str] | None = None,
    records: int | None = None,
    head: bool = False,
    hashed: bool = False,
) -> Iterator[RawBatch]:
    """Yield one source's records in batches, by the reader of its kind, numbered from 0 within it; the
    arguments as ``io.readers.reading.Reading`` holds them.

    ``digests`` receives the content hash of a local file read to its end: the run checks with it that the
    file did not change while it was read, without reading it again (a saved dataset, a Hub dataset and a
    URI are not hashed so).
    """
    try:
        if source.kind == "jsonl":
            yield from read_json_lines(source, batch_size, digests, records=records)
        elif source.kind == "json":
            yield from read_json(source, Reading(batch_size, digests, records, head))
        else:
            yield from read_tabular(source, Reading(batch_size, digests, records, head, hashed))
    except OSError as exc:
        raise InputError(f"{source.display}: cannot read ({exc.strerror or exc}); check the file") from exc


def sniff_format(
    source: InputSource, fields: dict[str, str], seen: list[str] | None = None
) -> tuple[str | None, tuple[Part, ...] | None]:
    """Return the record format of a source, from the fields of its first readable records.

    When it cannot be told and a record could not be parsed before the first that could (a first line
    that is no JSON: a header, a note), also return why (where, what and the fix): in input order that,
    not the fields of the records after it, is the problem to report. ``seen`` receives the fields of
    the records read (or what a record is, when it is no object), for the error that names them.
    """
    # A line decoded as the workers decode it; imported here, not on a run whose memo knows the formats.
    from packcli.records.formats import detect_format
    from packcli.records.json_line import parse_line

    first_error: tuple[Part, ...] | None = None
    parsed = False
    seen = [] if seen is None else seen
    for batch in read_head(source, 50):
        errors = {pos: (reason, detail) for pos, reason, detail in batch.errors}
        for item, pos in zip(batch.items, batch.positions, strict=True):
            try:
                if pos in errors:
                    raise RecordError(*errors[pos])
                record = parse_line(item) if batch.raw_lines else item
            except RecordError as err:
                unit = "line" if batch.raw_lines else "record"
                if not parsed:
                    first_error = first_error or (
                        f"{where(source.display, unit, pos)}: ",
                        *err.parts,
                        "; ",
                        *record_fix(err.reason),
                    )
                continue
            parsed = True
            for name in record if isinstance(record, dict) else [f"a {type(record).__name__}, not an object"]:
                if str(name) not in seen:
                    seen.append(str(name))
            fmt = detect_format(record, fields)
            if fmt is not None:
                return fmt, None
        break
    return None, first_error


def record_formats(
    sources: list[InputSource],
    fmt: str,
    fields: dict[str, str],
    remembered: list[str | None],
    fail: bool,
) -> dict[str, str | None]:
    """Each input's record format, by its display name: ``fmt`` (--format) unless it is "auto", else the one
    ``remembered`` for the input as it is now (the memo's, of the run that last sniffed it), else sniffed
    from its first records (``sniff_format``); None where it cannot be told.

    ``fail`` (--on-error fail): an input whose format cannot be told stops the run, naming its fields.
    """
    from packcli.records.formats import accepted_fields

    formats: dict[str, str | None] = {}
    for source, known in zip(sources, remembered, strict=True):
        seen: list[str] = []
        found: str | None
        if fmt != "auto":
            found, unparsed = fmt, None
        elif known is not None:
            found, unparsed = known, None
        else:
            found, unparsed = sniff_format(source, fields, seen)
        if found is None and unparsed is not None and fail:
            raise InputError(*unparsed)
        if found is None and fail:
            shown = ", ".join(seen[:12]) + (f" and {len(seen) - 12} more" if len(seen) > 12 else "")
            raise InputError(
                f"{source.display}: cannot tell the record format from the fields of its first records "
                f"({shown or 'none'}); a record needs {accepted_fields(fields)}",
                hint=("pass ", Opt("format"), ", or ", Opt("fields"), " to name the fields"),
            )
        formats[source.display] = found
    return formats
