"""Tabular inputs: Parquet, Arrow IPC files (and the Arrow files of a saved dataset) and CSV, as dicts."""

from __future__ import annotations

import json
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

from packcli.errors import InputError, first_line
from packcli.io.readers.compressed import open_input
from packcli.io.readers.hub import read_hub
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


def read_tabular(source: InputSource, batch_size: int) -> Iterator[RawBatch]:
    """Yield a Parquet, Arrow, CSV, saved or Hub dataset's records as dicts, in batches of ``batch_size``."""
    record_no = yield from raw_batches(source, _arrow_batches(source, batch_size))
    if record_no == 0:
        raise InputError(f"{source.display}: the input holds no records; remove it from the inputs")


def raw_batches(source: InputSource, record_batches: Iterable[Any]) -> Generator[RawBatch, None, int]:
    """Yield Arrow record batches of a source as batches of dicts, numbered from 1; return how many records."""
    record_no = 0
    for record_batch in record_batches:
        n = record_batch.num_rows
        if n == 0:
            continue
        rows = record_batch.to_pylist()
        yield RawBatch(source.display, 0, rows, list(range(record_no + 1, record_no + n + 1)))
        record_no += n
    return record_no


def _arrow_batches(source: InputSource, batch_size: int) -> Iterator[Any]:
    import pyarrow as pa

    try:
        if source.kind == "parquet":
            yield from parquet_file(source.path).iter_batches(batch_size=batch_size)
        elif source.kind == "csv":
            yield from _read_csv(source, batch_size)
        elif source.kind == "arrow":
            yield from _read_arrow_file(source.path, batch_size)
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


def _read_csv(source: InputSource, batch_size: int) -> Iterator[Any]:
    import csv

    import pyarrow as pa
    import pyarrow.csv as pacsv

    # Every column as text: a CSV cell's type is what the record format says, not a guess.
    with open_input(source) as fh:
        # utf-8-sig: a byte order mark is not part of the first column's name.
        header = fh.readline().decode("utf-8-sig", errors="replace").strip()
    if not header:
        raise InputError(f"{source.display}: the file is empty; remove it from the inputs")
    names = next(iter(csv.reader([header])))
    convert = pacsv.ConvertOptions(column_types={n: pa.string() for n in names})
    # Quoted cells may hold newlines (RFC 4180): blocks must not be cut at those. Measured no slower on
    # text without them.
    parse = pacsv.ParseOptions(newlines_in_values=True)
    with open_input(source) as fh:
        read = pacsv.ReadOptions(block_size=CSV_BLOCK)
        reader = pacsv.open_csv(fh, read_options=read, parse_options=parse, convert_options=convert)
        for batch in reader:
            yield from _slices(batch, batch_size)


def _slices(batch: Any, batch_size: int) -> Iterator[Any]:
    for start in range(0, batch.num_rows, batch_size):
        yield batch.slice(start, batch_size)


def _read_arrow_file(path: str, batch_size: int) -> Iterator[Any]:
    import pyarrow as pa

    with pa.memory_map(path) as mm:
        try:
            reader = pa.ipc.open_file(mm)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            mm.seek(0)
            batches = iter(pa.ipc.open_stream(mm))
        for batch in batches:
            yield from _slices(batch, batch_size)
