"""Parquet shards: zstd-compressed, one row group per table written (the default output format)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from packcli.output.formats.base import ShardFormat, ShardWriter

if TYPE_CHECKING:
    import pyarrow as pa


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
    datasets_reader = "parquet"

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
