"""Packed rows to shard files, atomically (the manifest beside them: packcli.output.manifest).

A row is built from its samples' token data, read by offset from the token store,
so only one shard's worth of tokens is in memory at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from packcli.contract import IGNORE_INDEX, SHARD_SCHEMA, TREE_COLUMNS, file_sha256, shard_schema
from packcli.output.columns import from_buffers
from packcli.output.formats import FORMATS, shard_format
from packcli.output.layout import RowLayout
from packcli.plan import packing
from packcli.results import ImageRecord, ShardEntry
from packcli.store.nodes import TreeNodes

EXTENSIONS = {name: f.extension for name, f in FORMATS.items()}


def build_rows(
    ids: np.ndarray,
    labels: np.ndarray,
    sample_lengths: np.ndarray,
    samples_per_row: np.ndarray,
    sample_index: np.ndarray,
    layout: RowLayout,
    piece_index: np.ndarray | None = None,
    sample_role: np.ndarray | None = None,
    source: np.ndarray | None = None,
    images: list[list[ImageRecord]] | None = None,
    skips: np.ndarray | None = None,
    tree: TreeNodes | None = None,
) -> pa.Table:
    """Return a table of packed rows from the samples' tokens, concatenated in row order.

    ``sample_lengths`` are the samples' lengths in ``ids``/``labels``; ``samples_per_row`` how many
    samples each row holds. With ``layout.pad_to_max``, each row is padded with one extra segment
    (sample_index -1, piece_index 0, labels -100, positions from 0) to ``layout.max_len``, with
    ``layout.pad_id``. ``piece_index`` numbers the pieces of a record split by ``--overflow split``
    (None: every sample is piece 0).

    With ``layout.pad_multiple`` above 1, every sample is first padded inside its own segment to a
    multiple of it (``packing.pad_lengths``): pad tokens, labels -100, positions going on counting; its
    ``seq_lengths`` entry is then the padded length and ``seq_lengths_unpadded`` holds the real one.
    With ``layout.loss_weighting`` sample or sqrt, ``loss_weights`` holds 1/n or 1/sqrt(n) on each of a
    sample's n trained tokens and 0 elsewhere. ``sample_role`` (preference data) is written as the
    ``sample_role`` column, 0 on a padding segment. ``images`` (a run with a processor) holds each
    sample's images, written as the image columns (packcli.output.images); ``skips`` the tokens cut from
    each sample's start. ``tree`` (--prefix-tree) holds the samples' nodes: written as the tree columns
    (a padding segment one root node), with ``position_ids`` each token's depth in its tree.
    """
    pad_to, pad_id, pad_multiple = layout.pad_to, layout.pad_id, layout.pad_multiple
    lengths = sample_lengths.astype(np.int64)
    unpadded = None
    if pad_multiple > 1:
        padded = packing.pad_lengths(lengths, pad_multiple, layout.pad_offset)
        ids, labels = _pad_samples(ids, labels, lengths, padded, pad_id)
        unpadded = lengths.astype(np.int32)
        lengths = padded
    weights = None if layout.loss_weighting == "token" else loss_weights(labels, lengths, layout.loss_weighting)
    if tree is not None:
        assert pad_multiple == 1 and (skips is None or not skips.any()), "a tree is never padded inside or cut"
        positions = tree.positions()
    else:
        positions = _positions_within(lengths)
    rows = _RowArrays(
        ids=ids,
        labels=labels,
        positions=positions,
        seq_lengths=lengths.astype(np.int32),
        index=sample_index.astype(np.int64),
        pieces=np.zeros(len(sample_index), np.int32) if piece_index is None else piece_index.astype(np.int32),
        row_tokens=_row_tokens(lengths, samples_per_row),
        samples_per_row=samples_per_row,
        unpadded=unpadded,
        weights=weights,
        sample_role=sample_role,
        source=source,
    )
    image_arrays: list[pa.Array] | None = None
    if images is not None:
        from packcli.output.images import image_columns

        cut = np.zeros(len(lengths), np.int64) if skips is None else skips
        image_arrays = image_columns(
            images, lengths, cut, samples_per_row, layout.image_bytes, layout.embed_images, layout.image_spans
        )
    tree_columns: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # node lengths, parents, per row
    if tree is not None:
        tree_columns = _row_nodes(tree, samples_per_row, None if pad_to is None else pad_to - rows.row_tokens)
    if pad_to is not None:
        rows = _padded_rows(rows, pad_to, pad_id)
    return _rows_table(rows, tree_columns, image_arrays, layout)


@dataclass
class _RowArrays:
    """A batch of rows as flat arrays: per token, per sample (segment), and per row."""

    ids: np.ndarray
    labels: np.ndarray
    positions: np.ndarray
    seq_lengths: np.ndarray
    index: np.ndarray
    pieces: np.ndarray
    row_tokens: np.ndarray
    samples_per_row: np.ndarray
    unpadded: np.ndarray | None  # the samples' real lengths, with --pad-to-multiple-of
    weights: np.ndarray | None  # loss weights, unless token weighting
    sample_role: np.ndarray | None
    source: np.ndarray | None


def _positions_within(lengths: np.ndarray) -> np.ndarray:
    """Return each token's position in its sample (0 at every sample's start), as int32."""
    dst_starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=dst_starts[1:])
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(dst_starts, lengths)
    return within.astype(np.int32)


def _row_tokens(lengths: np.ndarray, samples_per_row: np.ndarray) -> np.ndarray:
    """Return each row's tokens: the sum of its samples' lengths (0 for a row without samples)."""
    row_sample_offsets = np.zeros(len(samples_per_row) + 1, dtype=np.int64)
    np.cumsum(samples_per_row, out=row_sample_offsets[1:])
    row_tokens = np.zeros(len(samples_per_row), dtype=np.int64)
    if len(lengths):
        row_tokens = np.add.reduceat(lengths, row_sample_offsets[:-1])
        row_tokens[samples_per_row == 0] = 0
    return row_tokens


def _padded_rows(rows: _RowArrays, pad_to: int, pad_id: int) -> _RowArrays:
    """Return the rows each padded to ``pad_to`` tokens by one padding segment (``_pad_rows``), every column."""
    ids, labels, positions, seq_lengths, index, pieces, row_tokens, samples_per_row = _pad_rows(
        rows.ids,
        rows.labels,
        rows.positions,
        rows.seq_lengths,
        rows.index,
        rows.pieces,
        rows.row_tokens,
        rows.samples_per_row,
        pad_to,
        pad_id,
    )
    tokens_before, samples_before = rows.row_tokens, rows.samples_per_row
    weights, unpadded = _pad_optional(tokens_before, samples_before, pad_to, rows.weights, rows.unpadded)
    sample_role, source = rows.sample_role, rows.source
    if sample_role is not None:
        sample_role = _pad_optional(tokens_before, samples_before, pad_to, None, sample_role)[1]
    if source is not None:  # -1 on a padding segment
        shifted = _pad_optional(tokens_before, samples_before, pad_to, None, source.astype(np.int32) + 1)[1]
        assert shifted is not None
        source = shifted - 1
    return _RowArrays(
        ids,
        labels,
        positions,
        seq_lengths,
        index,
        pieces,
        row_tokens,
        samples_per_row,
        unpadded,
        weights,
        sample_role,
        source,
    )


def _rows_table(
    rows: _RowArrays,
    tree_columns: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    image_arrays: list[pa.Array] | None,
    layout: RowLayout,
) -> pa.Table:
    """Return the rows as an Arrow table: the list columns, the optional ones present, the image columns."""
    token_offsets = np.zeros(len(rows.row_tokens) + 1, dtype=np.int64)
    np.cumsum(rows.row_tokens, out=token_offsets[1:])
    seq_offsets = np.zeros(len(rows.samples_per_row) + 1, dtype=np.int64)
    np.cumsum(rows.samples_per_row, out=seq_offsets[1:])
    tok_off = _arrow(token_offsets, np.int32)
    seq_off = _arrow(seq_offsets, np.int32)
    columns = [
        pa.ListArray.from_arrays(tok_off, _arrow(rows.ids, np.int32)),
        pa.ListArray.from_arrays(tok_off, _arrow(rows.labels, np.int32)),
        pa.ListArray.from_arrays(tok_off, _arrow(rows.positions, np.int32)),
        pa.ListArray.from_arrays(seq_off, _arrow(rows.seq_lengths, np.int32)),
        pa.ListArray.from_arrays(seq_off, _arrow(rows.index, np.int64)),
        pa.ListArray.from_arrays(seq_off, _arrow(rows.pieces, np.int32)),
    ]
    optional = []
    if rows.unpadded is not None:
        columns.append(pa.ListArray.from_arrays(seq_off, _arrow(rows.unpadded, np.int32)))
        optional.append("seq_lengths_unpadded")
    if rows.weights is not None:
        columns.append(pa.ListArray.from_arrays(tok_off, _arrow(rows.weights, np.float32)))
        optional.append("loss_weights")
    if rows.sample_role is not None:
        columns.append(pa.ListArray.from_arrays(seq_off, _arrow(rows.sample_role, np.int8)))
        optional.append("sample_role")
    if rows.source is not None:
        columns.append(pa.ListArray.from_arrays(seq_off, _arrow(rows.source, np.int16)))
        optional.append("source")
    if tree_columns is not None:
        node_lengths, node_parents, nodes_per_row = tree_columns
        node_off = np.zeros(len(nodes_per_row) + 1, dtype=np.int64)
        np.cumsum(nodes_per_row, out=node_off[1:])
        columns.append(pa.ListArray.from_arrays(_arrow(node_off, np.int32), _arrow(node_lengths, np.int32)))
        columns.append(pa.ListArray.from_arrays(_arrow(node_off, np.int32), _arrow(node_parents, np.int32)))
        optional.extend(TREE_COLUMNS)
    if image_arrays is not None:
        return pa.Table.from_arrays(columns + image_arrays, schema=layout.schema())
    return pa.Table.from_arrays(columns, schema=shard_schema(optional) if optional else SHARD_SCHEMA)


def _row_nodes(
    tree: TreeNodes, samples_per_row: np.ndarray, pad: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the rows' node lengths and parents (row node indices), and each row's number of nodes.

    ``pad`` (with --pad-to-max): each row's padding, after its samples, one root node where above 0.
    """
    parents = tree.row_parents(samples_per_row)
    lengths = tree.lengths.astype(np.int32)
    sample_offsets = np.zeros(len(samples_per_row) + 1, dtype=np.int64)
    np.cumsum(samples_per_row, out=sample_offsets[1:])
    node_before = np.zeros(len(tree.counts) + 1, dtype=np.int64)
    np.cumsum(tree.counts, out=node_before[1:])
    nodes_per_row = node_before[sample_offsets[1:]] - node_before[sample_offsets[:-1]]
    if pad is None or not (pad > 0).any():
        return lengths, parents, nodes_per_row
    has_pad = (pad > 0).astype(np.int64)
    dst = np.arange(len(lengths), dtype=np.int64) + np.repeat(np.cumsum(has_pad) - has_pad, nodes_per_row)
    n = len(lengths) + int(has_pad.sum())
    out_lengths = np.zeros(n, dtype=np.int32)
    out_parents = np.full(n, -1, dtype=np.int32)
    out_lengths[dst] = lengths
    out_parents[dst] = parents
    nodes_per_row = nodes_per_row + has_pad
    pad_node = (np.cumsum(nodes_per_row) - 1)[pad > 0]
    out_lengths[pad_node] = pad[pad > 0]
    return out_lengths, out_parents, nodes_per_row


def _pad_samples(
    ids: np.ndarray, labels: np.ndarray, lengths: np.ndarray, padded: np.ndarray, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return the samples' tokens and labels with each sample followed by its padding (labels -100)."""
    total = int(padded.sum())
    out_ids = np.full(total, pad_id, dtype=np.int32)
    out_labels = np.full(total, IGNORE_INDEX, dtype=np.int32)
    dst = np.arange(len(ids), dtype=np.int64) + np.repeat(
        np.cumsum(padded) - padded - (np.cumsum(lengths) - lengths), lengths
    )
    out_ids[dst] = ids
    out_labels[dst] = labels
    return out_ids, out_labels


def loss_weights(labels: np.ndarray, lengths: np.ndarray, loss_weighting: str) -> np.ndarray:
    """Return each token's loss weight: 1/n (sample) or 1/sqrt(n) (sqrt) on a sample's n trained tokens, else 0.

    ``lengths`` are the samples' lengths in ``labels`` (they sum to its length). The weight is computed
    in float64 and rounded once to float32; ``verify`` recomputes it with this function.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    trained = labels != IGNORE_INDEX
    ends = np.cumsum(lengths)
    before = np.zeros(len(trained) + 1, dtype=np.int64)
    np.cumsum(trained, out=before[1:])
    counts = before[ends] - before[ends - lengths]
    scale = np.sqrt(counts) if loss_weighting == "sqrt" else counts
    per_sample = np.divide(1.0, scale, out=np.zeros(len(lengths)), where=counts > 0).astype(np.float32)
    weights = np.repeat(per_sample, lengths)
    weights[~trained] = 0.0
    return weights


def _pad_optional(
    row_tokens: np.ndarray,
    samples_per_row: np.ndarray,
    pad_to: int,
    weights: np.ndarray | None,
    unpadded: np.ndarray | None,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Place the optional columns as ``_pad_rows`` places the others: weight 0 on the row's padding,
    real length 0 for its padding segment (it holds no real token)."""
    pad = (pad_to - row_tokens).astype(np.int64)
    if weights is not None:
        dst = np.arange(len(weights), dtype=np.int64) + np.repeat(np.cumsum(pad) - pad, row_tokens)
        out = np.zeros(len(row_tokens) * pad_to, dtype=np.float32)
        out[dst] = weights
        weights = out
    if unpadded is not None:
        has_pad = (pad > 0).astype(np.int64)
        seg_dst = np.arange(len(unpadded), dtype=np.int64) + np.repeat(np.cumsum(has_pad) - has_pad, samples_per_row)
        out_unpadded = np.zeros(int((samples_per_row + has_pad).sum()), dtype=np.int32)
        out_unpadded[seg_dst] = unpadded
        unpadded = out_unpadded
    return weights, unpadded


_ARROW_TYPES = {
    np.dtype(np.int8): pa.int8(),
    np.dtype(np.int16): pa.int16(),
    np.dtype(np.int32): pa.int32(),
    np.dtype(np.int64): pa.int64(),
    np.dtype(np.float32): pa.float32(),
}


def _arrow(values: np.ndarray, dtype: type) -> pa.Array:
    """Wrap a numpy integer array as an Arrow array without a copy.

    ``pa.array`` would do the same but first imports pandas to look for pandas types (0.2 s a process).
    """
    values = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(_ARROW_TYPES[values.dtype], len(values), [None, pa.py_buffer(values)])


def _pad_rows(
    ids: np.ndarray,
    labels: np.ndarray,
    positions: np.ndarray,
    seq_lengths: np.ndarray,
    index: np.ndarray,
    pieces: np.ndarray,
    row_tokens: np.ndarray,
    samples_per_row: np.ndarray,
    pad_to: int,
    pad_id: int,
) -> tuple[np.ndarray, ...]:
    pad = (pad_to - row_tokens).astype(np.int64)
    n_rows = len(row_tokens)
    # Tokens: each row's tokens followed by its padding.
    dst = np.arange(len(ids), dtype=np.int64) + np.repeat(np.cumsum(pad) - pad, row_tokens)
    size = n_rows * pad_to
    out_ids = np.full(size, pad_id, dtype=np.int32)
    out_labels = np.full(size, IGNORE_INDEX, dtype=np.int32)
    out_pos = np.zeros(size, dtype=np.int32)
    out_ids[dst] = ids
    out_labels[dst] = labels
    out_pos[dst] = positions
    pad_start = np.arange(n_rows, dtype=np.int64) * pad_to + row_tokens
    pad_within = np.arange(int(pad.sum()), dtype=np.int64) - np.repeat(np.cumsum(pad) - pad, pad)
    out_pos[np.repeat(pad_start, pad) + pad_within] = pad_within.astype(np.int32)
    # Segments: each row's samples followed by one padding segment where there is padding.
    has_pad = (pad > 0).astype(np.int64)
    new_counts = samples_per_row + has_pad
    seg_dst = np.arange(len(seq_lengths), dtype=np.int64) + np.repeat(np.cumsum(has_pad) - has_pad, samples_per_row)
    n_seg = int(new_counts.sum())
    out_seq = np.zeros(n_seg, dtype=np.int32)
    out_index = np.full(n_seg, -1, dtype=np.int64)
    out_seq[seg_dst] = seq_lengths
    out_index[seg_dst] = index
    out_pieces = np.zeros(n_seg, dtype=np.int32)
    out_pieces[seg_dst] = pieces
    pad_seg = (np.cumsum(new_counts) - 1)[pad > 0]
    out_seq[pad_seg] = pad[pad > 0]
    return out_ids, out_labels, out_pos, out_seq, out_index, out_pieces, np.full(n_rows, pad_to, np.int64), new_counts


def shard_name(i: int, n: int, output_format: str) -> str:
    return f"shard-{i:05d}-of-{n:05d}{EXTENSIONS[output_format]}"


ROW_GROUP_ROWS = 256


def write_shard(
    tables: Iterable[pa.Table], path: Path, output_format: str, schema: pa.Schema = SHARD_SCHEMA
) -> ShardEntry:
    """Write one shard from consecutive row groups and return its manifest entry.

    Row groups are written as they come, each by a thread of its own while the next one is built (the
    writer lets go of the GIL while it encodes and compresses), so memory holds two row groups at most
    whatever the shard size; the file is the same as written in line.
    """
    rows = tokens = 0
    max_id = -1  # the largest input id (padding included): a model's embedding must be larger than it
    images: dict[str, int] | None = None  # image-text rows: their image counts (the manifest's, summed)
    writer = shard_format(output_format).writer(path, schema)
    try:
        # Its exit waits for the write under way, also when building the next table failed.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="packcli-shard") as behind:
            written: Future[None] | None = None
            for table in tables:
                rows += table.num_rows
                ids = _token_ids(table.column("input_ids"))
                tokens += len(ids)
                if len(ids):
                    max_id = max(max_id, int(ids.max()))
                if "image_refs" in table.column_names:
                    from packcli.output.images import written_image_counts

                    counted = written_image_counts(table)
                    images = {key: (images or {}).get(key, 0) + value for key, value in counted.items()}
                if written is not None:
                    written.result()  # one table written, one waiting at most
                written = behind.submit(writer.write, table)
            if written is not None:
                written.result()
    finally:
        writer.close()
    return ShardEntry(
        file=path.name, rows=rows, tokens=tokens, max_token_id=max_id, sha256=file_sha256(path), images=images
    )


def _token_ids(column: pa.ChunkedArray) -> np.ndarray:
    """The ids of the ``input_ids`` column, all rows' in one numpy array, read from its buffers."""
    chunks = [np.zeros(0, np.int32)]
    for chunk in column.chunks:
        if len(chunk):
            read = from_buffers(chunk)
            assert read is not None, "the rows built here are lists of int32 without a null"
            chunks.append(read[1])
    return np.concatenate(chunks) if len(chunks) > 2 else chunks[-1]


def read_shard(path: Path) -> pa.Table:
    """Read one shard, in whatever registered format it is, as a table."""
    from packcli.output.formats import read_shard as read

    return read(path)
