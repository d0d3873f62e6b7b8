"""Megatron-Bridge's packed SFT Parquet (``*.idx.parquet``) and its packing metadata file.

Megatron-Bridge's packed SFT dataset (GPTSFTPackedParquetDataset, files named *.idx.parquet) reads
three columns of each row: input_ids, seq_start_id (where each sample starts) and loss_mask. Its
collate function turns a stored sample of n tokens into n - 1 inputs (tokens 0..n-2) and n - 1
labels (tokens 1..n-1), and takes loss_mask[t] as "the label at t, token t + 1, is trained": the
mask is packcli's labels shifted left by one within the sample, and a sample's last entry is 0.
The other columns written here (seq_lengths, sample_index, piece_index, seq_lengths_unpadded) are packcli's;
Megatron reads only the three it names.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from packcli.jsontypes import JSONObject
from packcli.output.formats.base import (
    MALFORMED,
    MAX_INDEX_PROBLEMS,
    READ_BATCH_ROWS,
    ShardFormat,
    ShardWriter,
    compare_index,
    damaged,
    read_index,
)

if TYPE_CHECKING:
    import pyarrow as pa

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
    import pyarrow as pa

    offsets = col.offsets.to_numpy()
    return pa.array((offsets - offsets[0]).astype(np.int32), type=pa.int32())


def _megatron_table(table: pa.Table) -> pa.Table:
    """packcli rows -> Megatron's packed layout (plus packcli's per-sample columns)."""
    import pyarrow as pa

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
    import pyarrow as pa

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
    import pyarrow as pa

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
                except MALFORMED as exc:
                    raise damaged("Megatron packed", path, exc) from exc
                yield out.select(list(columns)) if columns else out

    def read(self, path: Path) -> pa.Table:
        import pyarrow as pa

        return pa.Table.from_batches(list(self.batches(path, None, READ_BATCH_ROWS)), schema=self.schema(path))

    def write_index(self, directory: Path, files: Sequence[str], max_len: int) -> list[str]:
        """Write Megatron's packing metadata: one JSON list holding one object for this dataset."""
        metadata = self._metadata(directory, files, max_len)
        tmp = directory / (MEGATRON_METADATA + ".tmp")
        tmp.write_text(json.dumps([metadata]) + "\n")
        tmp.replace(directory / MEGATRON_METADATA)
        return [MEGATRON_METADATA]

    def _index_problems(self, directory: Path, files: Sequence[str], max_len: int) -> list[tuple[str, str]]:
        found, problems = read_index(directory, MEGATRON_METADATA)
        if problems:
            return problems
        if not isinstance(found, list) or len(found) != 1:
            return [(MEGATRON_METADATA, "is not a JSON list holding one object (the dataset's packing metadata)")]
        expected = self._metadata(directory, files, max_len)
        problems = compare_index(MEGATRON_METADATA, "the metadata", found[0], expected, "the output gives")
        return problems[:MAX_INDEX_PROBLEMS]

    def _metadata(self, directory: Path, files: Sequence[str], max_len: int) -> JSONObject:
        """Megatron's packing metadata of the shard files ``files`` packed to ``max_len``.

        Lengths are the ones Megatron runs on: n - 1 for a stored sample of n tokens.
        """
        import pyarrow.parquet as pq

        samples_per_row: list[np.ndarray] = []
        row_run: list[np.ndarray] = []
        longest = 0
        for file in files:
            col = pq.read_table(str(directory / file), columns=["seq_lengths"]).column("seq_lengths")
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
