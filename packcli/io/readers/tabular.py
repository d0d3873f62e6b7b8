"""Tabular inputs: Parquet, Arrow IPC files (and the Arrow files of a saved dataset) and CSV, as dicts."""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

from packcli.errors import InputError, first_line
from packcli.io.footer import parquet_footer
from packcli.io.readers.compressed import open_input, read_rest
from packcli.io.readers.hub import read_hub
from packcli.io.readers.inorder import InOrderFile
from packcli.io.readers.reading import Reading, first_records
from packcli.io.sources import InputSource, RawBatch
from packcli.io.uri import is_uri


def parquet_file(path: str) -> Any:
    """A pyarrow ParquetFile of a local path or a URI."""
    import pyarrow.parquet as pq

    if is_uri(path):
        from pyarrow import fs as pafs

        filesystem, where = pafs.FileSystem.from_uri(path)
        return pq.ParquetFile(where, filesystem=filesystem)
    return pq.ParquetFile(path)


def parquet_rows(path: str) -> int:
    """The records of a Parquet file (a local path or a URI), from its footer."""
    if is_uri(path):
        return int(parquet_file(path).metadata.num_rows)
    import pyarrow.parquet as pq

    with InOrderFile(path, hashing=False) as fh:
        footer = parquet_footer(fh)
        return int((footer if footer is not None else pq.ParquetFile(fh).metadata).num_rows)


def read_tabular(source: InputSource, how: Reading) -> Iterator[RawBatch]:
    """Yield a Parquet, Arrow, CSV, saved or Hub dataset's records as dicts, in batches of ``how.batch_size``.

    ``how.digests`` receives the hash of a local Parquet, Arrow or CSV file, taken as it is read
    (``InOrderFile``, ``open_input``). ``how.head``: a Parquet file's column chunks are read by pages, not
    whole (``HEAD_BUFFER``); ``how.hashed``: each batch with the hash of its records (``raw_batches``).
    """
    local = source.kind in ("parquet", "arrow", "csv") and not is_uri(source.path)
    with contextlib.ExitStack() as stack:
        finish = _Finish(source, how.digests if local else None, stack)
        batches = raw_batches(source, _arrow_batches(source, how.batch_size, finish, how.head), how.hashed)
        record_no = yield from first_records(batches, how.records, finish)
    if record_no == 0:
        raise InputError(f"{source.display}: the input holds no records; remove it from the inputs")


class _Finish:
    """Where a tabular input is read from, and its hash completed (the rest of the file read for it)."""

    def __init__(self, source: InputSource, digests: dict[str, str] | None, stack: contextlib.ExitStack) -> None:
        self.source, self.digests, self.stack = source, digests, stack
        self.file: InOrderFile | None = None
        self.text: Any = None  # a CSV file's stream, hashed by ``open_input``

    def seekable(self) -> InOrderFile:
        self.file = self.stack.enter_context(InOrderFile(self.source.path, hashing=self.digests is not None))
        return self.file

    def __call__(self) -> None:
        if self.digests is None:
            return
        if self.file is not None:
            self.digests[str(Path(self.source.path))] = self.file.finish()
        elif self.text is not None:
            read_rest(self.text)  # open_input puts its hash into digests at its end


def raw_batches(
    source: InputSource, record_batches: Iterable[Any], hashed: bool = False
) -> Generator[RawBatch, None, int]:
    """Yield Arrow record batches of a source as batches of dicts, numbered from 1; return how many records.
    ``hashed``: each with the hash of its records (``RawBatch.digest``: of the Arrow batch, serialized)."""
    record_no = 0
    for record_batch in record_batches:
        n = record_batch.num_rows
        if n == 0:
            continue
        rows = record_batch.to_pylist()
        batch = RawBatch(source.display, 0, rows, list(range(record_no + 1, record_no + n + 1)))
        if hashed:  # the schema too: the same bytes in columns of other names or types are other records
            # SHA-256: it hashes the decoded records (about twice the file's bytes), and is twice as fast as
            # BLAKE2b where the CPU has SHA instructions (x86 since 2017, ARMv8).
            digest = hashlib.sha256(record_batch.schema.serialize())
            data = record_batch.serialize()
            digest.update(data)
            batch.digest, batch.hashed_bytes = digest.digest(), data.size
        yield batch
        record_no += n
    return record_no


# Bytes read at a time from each column of a Parquet file by the sniff (a page may be more): it needs the
# first records only, and a row group (which a whole read takes in one coalesced read) may be the file.
HEAD_BUFFER = 1 << 16


def _arrow_batches(source: InputSource, batch_size: int, where: _Finish, head: bool = False) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if source.kind == "parquet":
            if is_uri(source.path):
                parquet = parquet_file(source.path)
            else:
                # The footer read alone (not pyarrow's last 64 KiB); none: pyarrow reads it, and says what is wrong.
                fh = where.seekable()
                footer = parquet_footer(fh)
                fh.seek(0)
                if head:
                    parquet = pq.ParquetFile(fh, metadata=footer, pre_buffer=False, buffer_size=HEAD_BUFFER)
                else:
                    parquet = pq.ParquetFile(fh, metadata=footer)
            yield from parquet.iter_batches(batch_size=batch_size)
        elif source.kind == "csv" and head:
            yield from _head_csv(source, batch_size)
        elif source.kind == "csv":
            yield from _read_csv(source, batch_size, where)
        elif source.kind == "arrow":
            yield from _read_arrow_file(source.path, batch_size, where)
        elif source.kind == "saved_dataset":
            state = json.loads((Path(source.path) / "state.json").read_text())
            for entry in state.get("_data_files", []):
                yield from _read_arrow_file(str(Path(source.path) / entry["filename"]), batch_size)
        elif source.kind == "hub":
            yield from read_hub(source, batch_size)
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        message = first_line(exc, limit=None)
        raise InputError(f"{source.display}: cannot be read as {source.kind} ({message}); check the file") from exc


# Bytes of CSV text parsed at a time.
CSV_BLOCK = 1 << 22


def _read_csv(source: InputSource, batch_size: int, where: _Finish) -> Iterator[Any]:
    import csv

    import pyarrow as pa
    import pyarrow.csv as pacsv

    fh = where.text = where.stack.enter_context(open_input(source, where.digests))
    # The header from the first bytes, not read: pyarrow reads the file from its start, in the one read.
    first = fh.peek(CSV_BLOCK)
    if b"\n" not in first:
        with open_input(source) as again:  # a header longer than the buffer: read on its own
            first = again.readline()
    # utf-8-sig: a byte order mark is not part of the first column's name.
    header = first.split(b"\n", 1)[0].decode("utf-8-sig", errors="replace").strip()
    if not header:
        raise InputError(f"{source.display}: the file is empty; remove it from the inputs")
    names = next(iter(csv.reader([header])))
    # Every column as text: a CSV cell's type is what the record format says, not a guess.
    convert = pacsv.ConvertOptions(column_types={n: pa.string() for n in names})
    # Quoted cells may hold newlines (RFC 4180): blocks must not be cut at those. Measured no slower on
    # text without them.
    parse = pacsv.ParseOptions(newlines_in_values=True)
    read = pacsv.ReadOptions(block_size=CSV_BLOCK)
    reader = pacsv.open_csv(fh, read_options=read, parse_options=parse, convert_options=convert)
    for batch in reader:
        yield from _slices(batch, batch_size)


def _head_csv(source: InputSource, records: int) -> Iterator[Any]:
    """A CSV file's first ``records`` records (for the sniff), parsed by the csv module: pyarrow's reader
    reads blocks ahead, which may be the whole file. Every cell as text, as ``_read_csv`` reads them."""
    import csv

    import pyarrow as pa

    with open_input(source) as fh:
        # utf-8-sig: a byte order mark is not part of the first column's name.
        text = io.TextIOWrapper(fh, encoding="utf-8-sig", errors="replace", newline="")
        reader = csv.reader(text)
        names = next(reader, None)
        if not names:
            raise InputError(f"{source.display}: the file is empty; remove it from the inputs")
        rows = [dict(zip(names, row, strict=False)) for row in itertools.islice(filter(None, reader), records)]
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=pa.schema([(n, pa.string()) for n in names]))


def _slices(batch: Any, batch_size: int) -> Iterator[Any]:
    for start in range(0, batch.num_rows, batch_size):
        yield batch.slice(start, batch_size)


def _read_arrow_file(path: str, batch_size: int, where: _Finish | None = None) -> Iterator[Any]:
    import pyarrow as pa

    with contextlib.ExitStack() as stack:
        if where is not None and where.digests is not None:
            mm: Any = where.seekable()  # read once, hashed in file order
        else:
            mm = stack.enter_context(pa.memory_map(path))
        try:
            reader = pa.ipc.open_file(mm)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            mm.seek(0)
            batches = iter(pa.ipc.open_stream(mm))
        for batch in batches:
            yield from _slices(batch, batch_size)
