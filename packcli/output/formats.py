"""Shard file formats: one writer and one reader per format, found by name or by file extension.

Everything that writes or reads shard files goes through this registry (``shards.write_shard``, the
read-side commands, the Ray engine), so a new output format is one class here. Besides Parquet and
Arrow: MosaicML streaming's MDS (``MDSFormat``) and the packed Parquet layout Megatron-Bridge's
packed SFT dataset reads (``MegatronFormat``). Every format reads back as the packcli columns, so
``stats``, ``inspect`` and ``verify`` work on all of them.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import pyarrow as pa

READ_BATCH_ROWS = 1024
# Why an index file must be there (verify: "index.json: is missing: <this>, but the file is not there").
MISSING_INDEX = "a trainer's reader of this output format opens it"
MAX_INDEX_PROBLEMS = 5  # per index file: the first few differences name the damage well enough


class ShardWriter(Protocol):
    """Writes the row groups of one shard, one table at a time."""

    def write(self, table: pa.Table) -> None: ...

    def close(self) -> None: ...


class ShardFormat:
    """A shard file format: its name, file extension, writer and readers."""

    name: ClassVar[str]
    extension: ClassVar[str]
    # Files the format keeps beside its shards (written once every shard is), e.g. MDS's index.json.
    index_files: ClassVar[tuple[str, ...]] = ()

    def write_index(self, directory: Path, entries: list[dict[str, Any]], max_len: int) -> list[str]:
        """Write the format's index files for the shards ``entries`` in ``directory``; return their names."""
        return []

    def index_problems(self, directory: Path, entries: list[dict[str, Any]], max_len: int) -> list[tuple[str, str]]:
        """Return what is wrong in the index files beside the shards ``entries``, as (file, message) pairs.

        Each index file is compared with the one ``write_index`` would write for these shards, read
        again: a trainer's reader takes its columns, counts and sizes from it, not from the shards.
        A missing index file is one problem; the shards are read only when every index file is there.
        """
        problems = [
            (name, f"is missing: {MISSING_INDEX} but the file is not there")
            for name in self.index_files
            if not (directory / name).is_file()
        ]
        if problems or not self.index_files:
            return problems
        return self._index_problems(directory, entries, max_len)

    def _index_problems(self, directory: Path, entries: list[dict[str, Any]], max_len: int) -> list[tuple[str, str]]:
        return []

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


# -- index files: compared with the ones the shards give ---------------------------------------------


def _read_index(directory: Path, name: str) -> tuple[Any, list[tuple[str, str]]]:
    """Return an index file's JSON, or the problem that it cannot be read."""
    try:
        return json.loads((directory / name).read_text(encoding="utf-8")), []
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: not JSON, or not UTF-8
        return None, [(name, f"cannot be read ({type(exc).__name__}: {exc})".splitlines()[0])]


def _value(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _compare(name: str, what: str, found: Any, expected: dict[str, Any], source: str) -> list[tuple[str, str]]:
    """Compare an index object with the one ``source`` gives: one problem per key that differs.

    Objects are compared key by key and lists of the same length item by item, so that a message
    names what differs (``column_names[0]``, ``raw_data.bytes``) rather than the whole value.
    """
    if not isinstance(found, dict):
        return [(name, f"{what} is not a JSON object")]
    problems = []
    for path, got, want in _differences("", found, expected):
        if got is _ABSENT:
            problems.append((name, f"{what} lacks {path} ({source} {_value(want)})"))
        else:
            problems.append((name, f"{what} has {path} {_value(got)} where {source} {_value(want)}"))
    return problems


_ABSENT = object()


def _differences(path: str, found: Any, expected: Any) -> Iterator[tuple[str, Any, Any]]:
    """Yield (path, found, expected) for each place where ``found`` is not ``expected`` (bools apart from ints)."""
    if isinstance(expected, dict) and isinstance(found, dict):
        for key, want in expected.items():
            where = f"{path}.{key}" if path else key
            if key not in found:
                yield where, _ABSENT, want
            else:
                yield from _differences(where, found[key], want)
    elif isinstance(expected, list) and isinstance(found, list) and len(found) == len(expected):
        for k, (got, want) in enumerate(zip(found, expected, strict=True)):
            yield from _differences(f"{path}[{k}]", got, want)
    elif found != expected or type(found) is not type(expected):
        yield path, found, expected


# -- Megatron-Bridge packed Parquet -------------------------------------------------------------------
#
# Megatron-Bridge's packed SFT dataset (GPTSFTPackedParquetDataset, files named *.idx.parquet) reads
# three columns of each row: input_ids, seq_start_id (where each sample starts) and loss_mask. Its
# collate function turns a stored sample of n tokens into n - 1 inputs (tokens 0..n-2) and n - 1
# labels (tokens 1..n-1), and takes loss_mask[t] as "the label at t, token t + 1, is trained": the
# mask is packcli's labels shifted left by one within the sample, and a sample's last entry is 0.
# The other columns written here (seq_lengths, sample_index, piece_index, seq_lengths_unpadded) are packcli's;
# Megatron reads only the three it names.

MEGATRON_METADATA = "packing_metadata.json"


def _segment_starts(seq_lengths: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """Return the flat start of every segment within its row and the flat start in the token stream."""
    lengths = seq_lengths.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = seq_lengths.offsets.to_numpy().astype(np.int64)
    offsets = offsets - offsets[0]
    flat_start = np.cumsum(lengths) - lengths
    row_of = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    row_first = flat_start[offsets[:-1]] if len(lengths) else np.zeros(0, np.int64)
    in_row = flat_start - row_first[row_of] if len(lengths) else flat_start
    return in_row, flat_start


def _offsets(col: pa.ListArray) -> pa.Array:
    """A list column's offsets, starting at 0 (a sliced column's start elsewhere)."""
    offsets = col.offsets.to_numpy()
    return pa.array((offsets - offsets[0]).astype(np.int32), type=pa.int32())


def _megatron_table(table: pa.Table) -> pa.Table:
    """packcli rows -> Megatron's packed layout (plus packcli's per-sample columns)."""
    from packcli.contract import IGNORE_INDEX

    ids = table.column("input_ids").combine_chunks()
    labels = table.column("labels").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    seq_lengths = table.column("seq_lengths").combine_chunks()
    in_row, flat_start = _segment_starts(seq_lengths)
    lengths = seq_lengths.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    mask = np.zeros(len(labels), dtype=np.int8)
    mask[:-1] = labels[1:] != IGNORE_INDEX
    mask[flat_start + lengths - 1] = 0  # a sample's last token predicts nothing
    token_offsets = _offsets(ids)
    seg_offsets = _offsets(seq_lengths)
    columns = {
        "input_ids": ids,
        "loss_mask": pa.ListArray.from_arrays(token_offsets, pa.array(mask, type=pa.int8())),
        "seq_start_id": pa.ListArray.from_arrays(seg_offsets, pa.array(in_row.astype(np.int32), type=pa.int32())),
        "seq_lengths": seq_lengths,
        "sample_index": table.column("sample_index").combine_chunks(),
        "piece_index": table.column("piece_index").combine_chunks(),
    }
    if "seq_lengths_unpadded" in table.column_names:
        columns["seq_lengths_unpadded"] = table.column("seq_lengths_unpadded").combine_chunks()
    return pa.table(columns)


class _MegatronWriter:
    def __init__(self, path: Path, schema: pa.Schema) -> None:
        import pyarrow.parquet as pq

        self._schema = _megatron_schema(schema)
        self._writer = pq.ParquetWriter(str(path), self._schema, compression="zstd", use_dictionary=False)

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(_megatron_table(table).cast(self._schema), row_group_size=max(table.num_rows, 1))

    def close(self) -> None:
        self._writer.close()


def _megatron_schema(schema: pa.Schema) -> pa.Schema:
    fields = [
        pa.field("input_ids", pa.list_(pa.int32())),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("seq_start_id", pa.list_(pa.int32())),
        pa.field("seq_lengths", pa.list_(pa.int32())),
        pa.field("sample_index", pa.list_(pa.int64())),
        pa.field("piece_index", pa.list_(pa.int32())),
    ]
    if "seq_lengths_unpadded" in schema.names:
        fields.append(pa.field("seq_lengths_unpadded", pa.list_(pa.int32())))
    return pa.schema(fields)


def _packcli_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Megatron's packed layout -> packcli rows (labels unshifted from loss_mask, positions per sample)."""
    from packcli.contract import IGNORE_INDEX, SHARD_SCHEMA, shard_schema

    ids_col = batch.column("input_ids")
    ids = ids_col.flatten().to_numpy(zero_copy_only=False)
    mask = batch.column("loss_mask").flatten().to_numpy(zero_copy_only=False)
    seq_lengths = batch.column("seq_lengths")
    in_row, flat_start = _segment_starts(seq_lengths)
    lengths = seq_lengths.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    _check_megatron_columns(batch, in_row, flat_start, lengths, mask, len(ids))
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int32)
    trained = np.zeros(len(ids), dtype=bool)
    trained[1:] = mask[:-1] != 0
    trained[flat_start] = False
    labels[trained] = ids[trained]
    positions = (np.arange(len(ids), dtype=np.int64) - np.repeat(flat_start, lengths)).astype(np.int32)
    offsets = _offsets(ids_col)
    arrays = [
        ids_col,
        pa.ListArray.from_arrays(offsets, pa.array(labels, type=pa.int32())),
        pa.ListArray.from_arrays(offsets, pa.array(positions, type=pa.int32())),
        seq_lengths,
        batch.column("sample_index"),
        batch.column("piece_index"),
    ]
    optional = []
    if "seq_lengths_unpadded" in batch.schema.names:
        arrays.append(batch.column("seq_lengths_unpadded"))
        optional.append("seq_lengths_unpadded")
    return pa.RecordBatch.from_arrays(arrays, schema=shard_schema(optional) if optional else SHARD_SCHEMA)


def _check_megatron_columns(
    batch: pa.RecordBatch, in_row: np.ndarray, flat_start: np.ndarray, lengths: np.ndarray, mask: np.ndarray, n: int
) -> None:
    """Raise ValueError when the columns Megatron reads disagree with the sample boundaries packcli reads.

    Megatron cuts samples at seq_start_id and trains where loss_mask is 1; packcli reads seq_lengths.
    """
    starts = batch.column("seq_start_id")
    same_rows = np.array_equal(
        np.diff(starts.offsets.to_numpy()), np.diff(batch.column("seq_lengths").offsets.to_numpy())
    )
    if not same_rows or not np.array_equal(starts.flatten().to_numpy(zero_copy_only=False), in_row):
        raise ValueError("seq_start_id does not match seq_lengths: Megatron would cut the samples elsewhere")
    if len(mask) != n or not np.isin(mask, (0, 1)).all():
        raise ValueError("loss_mask is not one 0 or 1 per token")
    if int(lengths.sum()) == n and (lengths > 0).all() and mask[flat_start + lengths - 1].any():
        raise ValueError("loss_mask is 1 on a sample's last token, which has no next token in its sample")


class MegatronFormat(ShardFormat):
    """Megatron-Bridge's packed SFT Parquet (``*.idx.parquet``) and its packing metadata file.

    Read back here as packcli rows: labels from loss_mask (shifted back by one), positions counting
    from 0 in every sample.
    """

    name = "megatron"
    extension = ".idx.parquet"
    index_files = (MEGATRON_METADATA,)

    def writer(self, path: Path, schema: pa.Schema) -> ShardWriter:
        return _MegatronWriter(path, schema)

    def schema(self, path: Path) -> pa.Schema:
        import pyarrow.parquet as pq

        from packcli.contract import shard_schema

        names = pq.read_schema(str(path)).names
        return shard_schema([n for n in ("seq_lengths_unpadded",) if n in names])

    def batches(self, path: Path, columns: Sequence[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        with pq.ParquetFile(str(path)) as parquet:
            for batch in parquet.iter_batches(batch_size=batch_rows):
                try:
                    out = _packcli_batch(batch)
                except _MALFORMED as exc:
                    raise _damaged("Megatron packed", path, exc) from exc
                yield out.select(list(columns)) if columns else out

    def read(self, path: Path) -> pa.Table:
        return pa.Table.from_batches(list(self.batches(path, None, READ_BATCH_ROWS)), schema=self.schema(path))

    def write_index(self, directory: Path, entries: list[dict[str, Any]], max_len: int) -> list[str]:
        """Write Megatron's packing metadata: one JSON list holding one object for this dataset."""
        metadata = self._metadata(directory, entries, max_len)
        tmp = directory / (MEGATRON_METADATA + ".tmp")
        tmp.write_text(json.dumps([metadata]) + "\n")
        tmp.replace(directory / MEGATRON_METADATA)
        return [MEGATRON_METADATA]

    def _index_problems(self, directory: Path, entries: list[dict[str, Any]], max_len: int) -> list[tuple[str, str]]:
        found, problems = _read_index(directory, MEGATRON_METADATA)
        if problems:
            return problems
        if not isinstance(found, list) or len(found) != 1:
            return [(MEGATRON_METADATA, "is not a JSON list holding one object (the dataset's packing metadata)")]
        expected = self._metadata(directory, entries, max_len)
        return _compare(MEGATRON_METADATA, "the metadata", found[0], expected, "the output gives")[:MAX_INDEX_PROBLEMS]

    def _metadata(self, directory: Path, entries: list[dict[str, Any]], max_len: int) -> dict[str, Any]:
        """Megatron's packing metadata of the shards ``entries`` packed to ``max_len``.

        Lengths are the ones Megatron runs on: n - 1 for a stored sample of n tokens.
        """
        import pyarrow.parquet as pq

        samples_per_row: list[np.ndarray] = []
        row_run: list[np.ndarray] = []
        longest = 0
        for entry in entries:
            col = pq.read_table(str(directory / entry["file"]), columns=["seq_lengths"]).column("seq_lengths")
            col = col.combine_chunks()
            counts = np.diff(col.offsets.to_numpy()).astype(np.int64)
            run = col.flatten().to_numpy(zero_copy_only=False).astype(np.int64) - 1
            if len(run):
                longest = max(longest, int(run.max()))
            owner = np.repeat(np.arange(len(counts)), counts)
            samples_per_row.append(counts)
            row_run.append(np.bincount(owner, weights=run, minlength=len(counts)).astype(np.int64))
        counts = np.concatenate(samples_per_row) if samples_per_row else np.zeros(0, np.int64)
        packed = np.concatenate(row_run) if row_run else np.zeros(0, np.int64)
        rows = max(len(counts), 1)
        return {
            "dataset_max_seqlen": longest,
            "max_samples_per_bin": int(counts.max()) if len(counts) else 0,
            "packing_factor": round(float(counts.sum()) / rows, 2),
            "packing_efficiency": round(float(packed.sum()) / rows / max_len * 100, 2),
            "pack_size": max_len,
            "min_packed_seqlen": int(packed.min()) if len(packed) else 0,
        }


# -- MosaicML streaming (MDS) -----------------------------------------------------------------------
#
# An MDS dataset is a directory of shard files and an index.json that lists them. A shard file is:
# uint32 sample count n; uint32 offsets[n + 1] (byte offsets of each sample from the file start, the
# last one its end); the shard's config as sorted JSON; then the samples. A sample is one uint32 size
# per variable-size column, then each column's bytes, columns in sorted name order. An
# "ndarray:<dtype>" column of a 1-D array is one byte (ndim << 2 | shape dtype code, the code 0, 1, 2
# for a uint8, uint16, uint32 shape), the shape as that dtype, then the values. All little-endian.

MDS_INDEX = "index.json"
_MDS_DTYPES = {pa.int8(): "int8", pa.int32(): "int32", pa.int64(): "int64", pa.float32(): "float32"}
_MDS_SHAPE_DTYPES = (np.uint8, np.uint16, np.uint32, np.uint64)
_UINT32_MAX = (1 << 32) - 1


def _mds_config(schema: pa.Schema) -> dict[str, Any]:
    names = sorted(schema.names)
    encodings = []
    for name in names:
        kind = schema.field(name).type
        if not pa.types.is_list(kind) or kind.value_type not in _MDS_DTYPES:
            raise ValueError(f"column {name} of type {kind} has no MDS encoding here")
        encodings.append(f"ndarray:{_MDS_DTYPES[kind.value_type]}")
    return {
        "column_encodings": encodings,
        "column_names": names,
        "column_sizes": [None] * len(names),
        "compression": None,
        "format": "mds",
        "hashes": [],
        "size_limit": None,
        "version": 2,
    }


def _mds_array(values: np.ndarray) -> bytes:
    n = len(values)
    code = 0 if n < 1 << 8 else 1 if n < 1 << 16 else 2
    head = bytes([(1 << 2) | code]) + np.array([n], dtype=_MDS_SHAPE_DTYPES[code]).tobytes()
    return head + values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes()


class _MDSWriter:
    """Writes one MDS shard: samples go to a side file as they come, the header goes first at close."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self._path = path
        self._config = _mds_config(schema)
        self._body_path = path.with_name(path.name + ".body")
        self._body = open(self._body_path, "wb")  # noqa: SIM115  (closed in close())
        self._sizes: list[int] = []
        self._body_bytes = 0

    def write(self, table: pa.Table) -> None:
        names = self._config["column_names"]
        columns = []
        for name in names:
            col = table.column(name).combine_chunks()
            offsets = col.offsets.to_numpy()
            columns.append((offsets - offsets[0], col.flatten().to_numpy(zero_copy_only=False)))
        for r in range(table.num_rows):
            parts = [_mds_array(values[offsets[r] : offsets[r + 1]]) for offsets, values in columns]
            sample = np.array([len(part) for part in parts], dtype="<u4").tobytes() + b"".join(parts)
            self._body.write(sample)
            self._sizes.append(len(sample))
            self._body_bytes += len(sample)

    def close(self) -> None:
        self._body.close()
        try:
            config = json.dumps(self._config, sort_keys=True).encode()
            header = 4 + 4 * (len(self._sizes) + 1) + len(config)
            offsets = header + np.concatenate([[0], np.cumsum(self._sizes, dtype=np.int64)])
            if offsets[-1] > _UINT32_MAX:
                raise OSError(
                    f"{self._path.name} would be {offsets[-1]:,} bytes; an MDS shard holds at most 4 GiB "
                    "(its offsets are 32-bit): lower --rows-per-shard"
                )
            with open(self._path, "wb") as out, open(self._body_path, "rb") as body:
                out.write(np.array([len(self._sizes)], dtype="<u4").tobytes())
                out.write(offsets.astype("<u4").tobytes())
                out.write(config)
                while chunk := body.read(1 << 22):
                    out.write(chunk)
        finally:
            self._body_path.unlink(missing_ok=True)


def _damaged(kind: str, path: Path, exc: Exception) -> pa.ArrowInvalid:
    """The error a malformed shard raises: an ArrowException, as the read side expects of any format."""
    return pa.ArrowInvalid(f"{path.name}: not a valid {kind} shard ({type(exc).__name__}: {exc})")


_MALFORMED = (ValueError, IndexError, KeyError, TypeError, AttributeError)


def _read_mds(path: Path) -> tuple[dict[str, Any], np.ndarray, Any]:
    """Return an MDS shard's config, sample offsets and bytes (memory-mapped: read as they are used)."""
    try:
        with open(path, "rb") as fh:
            data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError as exc:  # an empty file cannot be mapped
        raise _damaged("MDS", path, exc) from exc
    try:
        n = int(np.frombuffer(data, "<u4", 1)[0])
        offsets = np.frombuffer(data, "<u4", n + 1, 4).astype(np.int64)
        config = json.loads(data[4 + 4 * (n + 1) : offsets[0]])
        if not isinstance(config, dict) or offsets[-1] != len(data) or (np.diff(offsets) < 0).any():
            raise ValueError("its header does not match its size")
        _mds_schema(config)
    except _MALFORMED as exc:
        raise _damaged("MDS", path, exc) from exc
    return config, offsets, data


class MDSFormat(ShardFormat):
    """MosaicML streaming's MDS: shard files plus the index.json that ``StreamingDataset`` opens.

    Every packcli column is an ``ndarray:<dtype>`` column of the same name (int32 token columns,
    int64 sample_index, float32 loss_weights), uncompressed.
    """

    name = "mds"
    extension = ".mds"
    index_files = (MDS_INDEX,)

    def writer(self, path: Path, schema: pa.Schema) -> ShardWriter:
        return _MDSWriter(path, schema)

    def schema(self, path: Path) -> pa.Schema:
        config, _, _ = _read_mds(path)
        return _mds_schema(config)

    def batches(self, path: Path, columns: Sequence[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        config, offsets, data = _read_mds(path)
        try:
            yield from self._batches(config, offsets, data, columns, batch_rows)
        except _MALFORMED as exc:
            raise _damaged("MDS", path, exc) from exc

    def _batches(
        self, config: dict[str, Any], offsets: np.ndarray, data: Any, columns: Sequence[str] | None, batch_rows: int
    ) -> Iterator[pa.RecordBatch]:
        schema = _mds_schema(config)
        wanted = list(columns) if columns else schema.names
        names = config["column_names"]
        dtypes = [np.dtype(e.split(":")[1]).newbyteorder("<") for e in config["column_encodings"]]
        n = len(offsets) - 1
        for start in range(0, n, batch_rows):
            values: dict[str, list[np.ndarray]] = {name: [] for name in names}
            for r in range(start, min(n, start + batch_rows)):
                at = int(offsets[r])
                sizes = np.frombuffer(data, "<u4", len(names), at)
                at += 4 * len(names)
                for name, dtype, size in zip(names, dtypes, sizes.tolist(), strict=True):
                    values[name].append(_mds_values(data, at, size, dtype))
                    at += size
            arrays = []
            for name in wanted:
                parts = values[name]
                lengths = np.array([len(v) for v in parts], dtype=np.int64)
                offs = np.zeros(len(parts) + 1, dtype=np.int32)
                np.cumsum(lengths, out=offs[1:])
                flat = np.concatenate(parts) if parts else np.zeros(0, np.int32)
                kind = schema.field(name).type
                arrays.append(pa.ListArray.from_arrays(pa.array(offs), pa.array(flat, type=kind.value_type)))
            yield pa.RecordBatch.from_arrays(arrays, schema=pa.schema([schema.field(c) for c in wanted]))

    def write_index(self, directory: Path, entries: list[dict[str, Any]], max_len: int) -> list[str]:
        tmp = directory / (MDS_INDEX + ".tmp")
        tmp.write_text(json.dumps({"shards": self._shards(directory, entries), "version": 2}, sort_keys=True))
        tmp.replace(directory / MDS_INDEX)
        return [MDS_INDEX]

    def _shards(self, directory: Path, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """index.json's entry for each shard of ``entries``: its config (columns, encodings), size and samples."""
        shards = []
        for entry in entries:
            config, offsets, _ = _read_mds(directory / entry["file"])
            shards.append(
                {
                    **config,
                    "raw_data": {"basename": entry["file"], "bytes": int(offsets[-1]), "hashes": {}},
                    "samples": len(offsets) - 1,
                    "zip_data": None,
                }
            )
        return shards

    def _index_problems(self, directory: Path, entries: list[dict[str, Any]], max_len: int) -> list[tuple[str, str]]:
        found, problems = _read_index(directory, MDS_INDEX)
        if problems:
            return problems
        if not isinstance(found, dict) or not isinstance(found.get("shards"), list):
            return [(MDS_INDEX, "has no shard list (a JSON object with a list under 'shards')")]
        listed = found["shards"]
        if found.get("version") != 2:
            problems.append((MDS_INDEX, f"has version {_value(found.get('version'))}, not 2"))
        if len(listed) != len(entries):
            problems.append((MDS_INDEX, f"lists {len(listed)} shards, manifest.json lists {len(entries)}"))
            return problems
        for k, (got, expected) in enumerate(zip(listed, self._shards(directory, entries), strict=True)):
            problems += _compare(MDS_INDEX, f"shard {k} ({entries[k]['file']})", got, expected, "the shard holds")
        return problems[:MAX_INDEX_PROBLEMS]


def _mds_schema(config: dict[str, Any]) -> pa.Schema:
    """The packcli schema of an MDS shard's columns: SHARD_SCHEMA's order, then the optional columns."""
    from packcli.contract import OPTIONAL_COLUMNS, SHARD_SCHEMA

    known = [*SHARD_SCHEMA, *OPTIONAL_COLUMNS]
    names = set(config["column_names"])
    fields = [f for f in known if f.name in names]
    by_name = dict(zip(config["column_names"], config["column_encodings"], strict=True))
    extra = [
        pa.field(name, pa.list_(pa.from_numpy_dtype(np.dtype(by_name[name].split(":")[1]))))
        for name in config["column_names"]
        if name not in {f.name for f in known}
    ]
    return pa.schema([*fields, *extra])


def _mds_values(data: Any, at: int, size: int, dtype: np.dtype) -> np.ndarray:
    """Decode one ndarray column value of ``size`` bytes at ``at``."""
    head = data[at]
    ndim, code = head >> 2, head & 3
    if ndim != 1:
        raise ValueError(f"an MDS column value has {ndim} dimensions; packcli columns have 1")
    shape_dtype = np.dtype(_MDS_SHAPE_DTYPES[code]).newbyteorder("<")
    count = int(np.frombuffer(data, shape_dtype, 1, at + 1)[0])
    start = at + 1 + shape_dtype.itemsize
    if start + count * dtype.itemsize != at + size:
        raise ValueError("an MDS column value's size does not match its shape")
    return np.frombuffer(data, dtype, count, start)


FORMATS: dict[str, ShardFormat] = {
    f.name: f for f in (ParquetFormat(), ArrowStreamFormat(), MDSFormat(), MegatronFormat())
}
# Longest first: a Megatron shard ends in .idx.parquet, which also ends in .parquet.
_BY_EXTENSION: dict[str, ShardFormat] = {
    f.extension: f for f in sorted(FORMATS.values(), key=lambda f: -len(f.extension))
}


def shard_format(name: str) -> ShardFormat:
    """Return the format registered as ``name`` (``parquet``, ``arrow``, ``mds``, ``megatron``)."""
    return FORMATS[name]


def format_of(path: Path) -> ShardFormat:
    """Return the format of a shard file, from its extension."""
    for extension, fmt in _BY_EXTENSION.items():
        if path.name.endswith(extension):
            return fmt
    raise ValueError(f"{path.name}: not a shard file (known: {', '.join(_BY_EXTENSION)})")


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
