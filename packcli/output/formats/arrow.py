"""Arrow IPC stream shards (what ``datasets`` reads with ``Dataset.from_file``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from packcli.output.formats.base import ShardFormat, ShardWriter

if TYPE_CHECKING:
    import pyarrow as pa


class _ArrowStreamWriter:
    def __init__(self, path: Path, schema: pa.Schema) -> None:
        import pyarrow as pa

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
    datasets_reader = "arrow"

    def writer(self, path: Path, schema: pa.Schema) -> ShardWriter:
        return _ArrowStreamWriter(path, schema)

    def batches(self, path: Path, columns: Sequence[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        with pa.memory_map(str(path)) as source:
            for batch in pa.ipc.open_stream(source):
                if columns:
                    batch = batch.select(list(columns))
                for start in range(0, batch.num_rows, batch_rows):
                    yield batch.slice(start, batch_rows)

    def schema(self, path: Path) -> pa.Schema:
        import pyarrow as pa

        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).schema

    def read(self, path: Path) -> pa.Table:
        import pyarrow as pa

        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).read_all()
