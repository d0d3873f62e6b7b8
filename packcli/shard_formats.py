"""Shard file formats: one writer and one reader per format, found by name or by file extension.

Everything that writes or reads shard files goes through this registry (``shards.write_shard``, the
read-side commands, the Ray engine), so a new output format (MDS, Megatron's) is one class here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import ClassVar, Protocol

import pyarrow as pa

READ_BATCH_ROWS = 1024


class ShardWriter(Protocol):
    """Writes the row groups of one shard, one table at a time."""

    def write(self, table: pa.Table) -> None: ...

    def close(self) -> None: ...


class ShardFormat:
    """A shard file format: its name, file extension, writer and readers."""

    name: ClassVar[str]
    extension: ClassVar[str]

    def writer(self, path: Path, schema: pa.Schema) -> ShardWriter:
        """Return a writer for a new shard at ``path``."""
        raise NotImplementedError

    def batches(self, path: Path, columns: Sequence[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Yield the shard's rows as record batches of at most ``batch_rows``, one decoded at a time."""
        raise NotImplementedError

    def schema(self, path: Path) -> pa.Schema:
        """Return the shard's schema without reading its rows."""
        raise NotImplementedError

    def read(self, path: Path) -> pa.Table:
        """Return the whole shard as a table."""
        return pa.Table.from_batches(list(self.batches(path, None, READ_BATCH_ROWS)), schema=self.schema(path))


class _ParquetWriter:
    def __init__(self, path: Path, schema: pa.Schema) -> None:
        import pyarrow.parquet as pq

        self._writer = pq.ParquetWriter(str(path), schema, compression="zstd", use_dictionary=False)

    def write(self, table: pa.Table) -> None:
        # One row group per table: the writer's callers hand it row groups of ROW_GROUP_ROWS rows.
        self._writer.write_table(table, row_group_size=max(table.num_rows, 1))

    def close(self) -> None:
        self._writer.close()


class ParquetFormat(ShardFormat):
    """Parquet, zstd-compressed, one row group per table written."""

    name = "parquet"
    extension = ".parquet"

    def writer(self, path: Path, schema: pa.Schema) -> ShardWriter:
        return _ParquetWriter(path, schema)

    def batches(self, path: Path, columns: Sequence[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        with pq.ParquetFile(str(path)) as parquet:
            yield from parquet.iter_batches(batch_size=batch_rows, columns=list(columns) if columns else None)

    def schema(self, path: Path) -> pa.Schema:
        import pyarrow.parquet as pq

        return pq.read_schema(str(path))

    def read(self, path: Path) -> pa.Table:
        import pyarrow.parquet as pq

        return pq.read_table(str(path))


class _ArrowStreamWriter:
    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self._sink = pa.OSFile(str(path), "wb")
        try:
            self._writer = pa.ipc.new_stream(self._sink, schema)
        except BaseException:
            self._sink.close()
            raise

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table)

    def close(self) -> None:
        try:
            self._writer.close()
        finally:
            self._sink.close()


class ArrowStreamFormat(ShardFormat):
    """The Arrow IPC stream format (what ``datasets`` reads with ``Dataset.from_file``)."""

    name = "arrow"
    extension = ".arrow"

    def writer(self, path: Path, schema: pa.Schema) -> ShardWriter:
        return _ArrowStreamWriter(path, schema)

    def batches(self, path: Path, columns: Sequence[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        with pa.memory_map(str(path)) as source:
            for batch in pa.ipc.open_stream(source):
                if columns:
                    batch = batch.select(list(columns))
                for start in range(0, batch.num_rows, batch_rows):
                    yield batch.slice(start, batch_rows)

    def schema(self, path: Path) -> pa.Schema:
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).schema

    def read(self, path: Path) -> pa.Table:
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).read_all()


FORMATS: dict[str, ShardFormat] = {f.name: f for f in (ParquetFormat(), ArrowStreamFormat())}
_BY_EXTENSION: dict[str, ShardFormat] = {f.extension: f for f in FORMATS.values()}


def shard_format(name: str) -> ShardFormat:
    """Return the format registered as ``name`` (``parquet``, ``arrow``)."""
    return FORMATS[name]


def format_of(path: Path) -> ShardFormat:
    """Return the format of a shard file, from its extension."""
    try:
        return _BY_EXTENSION[path.suffix]
    except KeyError:
        raise ValueError(f"{path.name}: not a shard file (known: {', '.join(_BY_EXTENSION)})") from None


def shard_batches(
    path: Path, columns: Sequence[str] | None = None, batch_rows: int = READ_BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """Yield the rows of one shard as record batches of at most ``batch_rows``.

    Raises OSError or pyarrow.ArrowException for a file that cannot be read.
    """
    yield from format_of(path).batches(path, columns, batch_rows)


def read_shard(path: Path) -> pa.Table:
    """Read one shard as a table."""
    return format_of(path).read(path)


def shard_schema(path: Path) -> pa.Schema:
    """Return one shard's schema."""
    return format_of(path).schema(path)
