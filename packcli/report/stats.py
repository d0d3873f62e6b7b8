"""Figures about packed rows (from an output directory) or about raw input before packing (a what-if).

Both read sample lengths only: a packed output shard by shard and a batch of rows at a time (here),
a raw input through the same reading, formatting and tokenization as ``packcli pack`` (``raw``, whose
``raw_stats`` and ``parse_max_lens`` this module re-exports). The histograms, distributions and
padding what-ifs both report are ``figures``. Nothing here prints; the functions return plain
dictionaries that the CLI renders or dumps as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np
import pyarrow as pa

from packcli.contract import CHOSEN, IGNORE_INDEX, MANIFEST, TREE_COLUMNS
from packcli.errors import OutputError, first_line
from packcli.output.columns import list_parts
from packcli.output.formats import shard_batches
from packcli.output.manifest import read_checked_manifest
from packcli.plan.balance import row_loads, written_step_balance
from packcli.report.figures import (
    RowBounds,
    batch_padding,
    check_batch_size,
    distribution,
    fill_histogram,
    length_histogram,
    row_bounds,
)
from packcli.report.raw import parse_max_lens, raw_stats
from packcli.results import (
    Counts,
    EvalSummary,
    ImageStats,
    Manifest,
    MixSummary,
    OutputStats,
    PairStats,
    PerRow,
    TreeStats,
)

__all__ = ["is_packed_output", "list_parts", "output_stats", "parse_max_lens", "raw_stats"]


# -- reading shards --------------------------------------------------------------------------------


def has_images(columns: list[str] | tuple[str, ...] | None) -> bool:
    """Return whether an output's columns are those of image-text rows."""
    return bool(columns) and all(c in (columns or ()) for c in ("image_refs", "image_tokens", "image_sample"))


# -- stats of a packed output ----------------------------------------------------------------------


def is_packed_output(path: Path) -> bool:
    """Return whether ``path`` is a packed output directory (it holds manifest.json)."""
    return path.is_dir() and (path / MANIFEST).is_file()


def output_stats(directory: Path, batch_size: int = 8) -> OutputStats:
    """Return the figures of a packed output directory, read shard by shard.

    ``tokens`` counts sample tokens as the manifest does: the samples' real tokens, without the padding
    segments of ``--pad-to-max`` nor the alignment padding inside samples (``--pad-to-multiple-of``,
    ``--context-parallel``: ``alignment_padding_tokens``); ``padding_tokens`` is ``rows * max_len -
    tokens``. The row-count bounds are on the samples' padded lengths (what the plan packed); the
    lengths and what-ifs on their real lengths, each distinct sample once, in input order.
    """
    check_batch_size(batch_size)
    manifest = read_checked_manifest(directory)
    max_len = manifest.max_len  # a positive integer: read_checked_manifest checks it
    read = _read_shards(directory, manifest)
    arrays = read.sample_arrays()
    per_row, samples_per_row, index, lengths = arrays.per_row, arrays.samples_per_row, arrays.index, arrays.lengths
    rows = len(per_row)
    tokens = int(arrays.real_lengths.sum())
    padded_lengths, distinct_lengths = lengths[arrays.first], arrays.real_lengths[arrays.first]
    if len(distinct_lengths) and not (int(distinct_lengths.min()) >= 1 and int(padded_lengths.max()) <= max_len):
        raise OutputError(
            f"{directory}: a sample length is outside 1..max_len {max_len}; run packcli verify {directory}"
        )
    capacity = rows * max_len
    padding_tokens = capacity - tokens
    counts = manifest.counts or Counts()
    unpacked, without, batched = _padding_without_packing(manifest, arrays, tokens, max_len, batch_size)
    spr_hist = np.bincount(samples_per_row) if rows else np.zeros(0, np.int64)
    bounds, pairs = _bounds_and_pairs(manifest, read, arrays, max_len, rows, batch_size)
    return OutputStats(
        mode="packed",
        directory=str(directory),
        max_len=max_len,
        shards=len(manifest.shards),
        rows=rows,
        sequences=len(lengths),
        samples=len(arrays.distinct),
        records=len(np.unique(index)),
        tokens=tokens,
        trainable_tokens=read.trainable,
        padding_tokens=padding_tokens,
        padding_segment_tokens=read.segment_padding,
        alignment_padding_tokens=int(lengths.sum()) - tokens,
        fill=round(tokens / capacity, 6) if capacity else 0.0,
        **bounds,
        samples_per_row=PerRow(
            min=int(samples_per_row.min()) if rows else 0,
            mean=round(float(samples_per_row.mean()), 3) if rows else 0.0,
            max=int(samples_per_row.max()) if rows else 0,
            histogram=[{"samples": k, "rows": int(n)} for k, n in enumerate(spr_hist) if n],
        ),
        sample_length=distribution(distinct_lengths),
        length_histogram=length_histogram(distinct_lengths, max_len).bins(),
        row_fill_histogram=fill_histogram(per_row, max_len).bins(),
        records_read=int(counts.records_read or 0),
        dropped=dict(counts.dropped or {}),
        truncated=int(counts.truncated or 0),
        duplicated=int(counts.duplicated or 0),
        batch_size=batch_size,
        rows_without_packing=unpacked,
        padding_tokens_without_packing=without,
        padding_tokens_batch_padded=batched,
        padding_saved=without - padding_tokens,
        padding_saved_vs_batch_padded=batched - padding_tokens,
        preference=pairs,
        **_output_sections(manifest, read, tokens, rows),
        step_balance=written_step_balance(
            manifest.world_size or 1, manifest.step_balance, _concat(read.row_load), _concat(read.row_squares)
        ),
    )


@dataclass
class _SampleArrays:
    """A packed output's rows and sample copies as arrays, with each distinct sample's first copy."""

    per_row: np.ndarray  # each row's sample tokens
    samples_per_row: np.ndarray
    index: np.ndarray  # each sample copy's sample_index, in shard order
    lengths: np.ndarray  # its padded length (as in seq_lengths)
    real_lengths: np.ndarray  # its real length
    pieces: np.ndarray  # its piece_index
    distinct: np.ndarray  # the distinct (sample_index, piece_index) pairs, sorted: input order
    first: np.ndarray  # the copy of each distinct pair that comes first


@dataclass
class _ShardReading:
    """What a packed output's shards hold, summed or gathered batch by batch."""

    images_listed: bool
    trees_listed: bool
    row_tokens: list[np.ndarray] = field(default_factory=list)
    row_samples: list[np.ndarray] = field(default_factory=list)
    seq_index: list[np.ndarray] = field(default_factory=list)
    seq_length: list[np.ndarray] = field(default_factory=list)
    seq_real: list[np.ndarray] = field(default_factory=list)
    seq_piece: list[np.ndarray] = field(default_factory=list)
    seq_role: list[np.ndarray] = field(default_factory=list)
    row_pairs: list[np.ndarray] = field(default_factory=list)
    row_images: list[np.ndarray] = field(default_factory=list)  # an image-text output: each row's images
    row_load: list[np.ndarray] = field(default_factory=list)  # each row's samples' tokens as packed (padded)
    row_squares: list[np.ndarray] = field(default_factory=list)  # and the sum of their squares
    image_tokens: int = 0
    embedded: int = 0
    image_samples: int = 0
    trainable: int = 0
    segment_padding: int = 0
    expanded: int = 0  # prefix trees: the tokens of the plain expansion

    def add_batch(self, batch: pa.RecordBatch, columns: list[str]) -> None:
        """Add one batch of rows read with ``columns``."""
        row_len, labels = list_parts(batch.column("labels"))
        segs, lengths = list_parts(batch.column("seq_lengths"))
        _, index = list_parts(batch.column("sample_index"))
        self.trainable += int(np.count_nonzero(labels != IGNORE_INDEX))
        pad = index == -1
        seg_row = np.repeat(np.arange(len(segs)), segs)
        pad_per_row = np.bincount(seg_row[pad], weights=lengths[pad], minlength=len(segs)).astype(np.int64)
        self.segment_padding += int(pad_per_row.sum())
        if self.trees_listed:  # (a padding segment is one node: as long expanded as in the row)
            self.expanded += expanded_tokens(batch) - int(pad_per_row.sum())
        real = lengths
        if "seq_lengths_unpadded" in columns:
            _, real = list_parts(batch.column("seq_lengths_unpadded"))
            real = np.where(pad, lengths, real)  # padding segments are padding_segment_tokens, not this
        alignment = np.bincount(seg_row, weights=lengths - real, minlength=len(segs)).astype(np.int64)
        self.row_tokens.append(row_len - pad_per_row - alignment)
        self.row_samples.append(segs - np.bincount(seg_row[pad], minlength=len(segs)))
        # A row's cost (packcli.plan.balance): its samples as packed, padding segments left out.
        starts = np.zeros(len(segs) + 1, dtype=np.int64)
        np.cumsum(self.row_samples[-1], out=starts[1:])
        load, squares = row_loads(lengths[~pad], starts)
        self.row_load.append(load)
        self.row_squares.append(squares)
        self.seq_index.append(index[~pad].astype(np.int64))
        if "piece_index" in columns:
            _, piece = list_parts(batch.column("piece_index"))
            self.seq_piece.append(piece[~pad].astype(np.int64))
        self.seq_length.append(lengths[~pad].astype(np.int64))
        self.seq_real.append(real[~pad].astype(np.int64))
        if "sample_role" in columns:
            _, role = list_parts(batch.column("sample_role"))
            self.seq_role.append(role[~pad].astype(np.int64))
            self.row_pairs.append(np.bincount(seg_row[role == CHOSEN], minlength=len(segs)))
        if self.images_listed:
            self._add_images(batch, segs)

    def _add_images(self, batch: pa.RecordBatch, segs: np.ndarray) -> None:
        """Add the images of one batch of image-text rows."""
        counts_per_row, sample_of = list_parts(batch.column("image_sample"))
        self.row_images.append(counts_per_row)
        self.image_tokens += int(list_parts(batch.column("image_tokens"))[1].sum())
        self.embedded += batch.column("image_refs").flatten().null_count  # they came as bytes
        image_row = np.repeat(np.arange(len(segs)), counts_per_row)
        self.image_samples += len(np.unique(image_row * (int(segs.max(initial=0)) + 1) + sample_of))

    def sample_arrays(self) -> _SampleArrays:
        """Return the rows and sample copies read, as arrays, and which copies are each sample's first."""
        index = _concat(self.seq_index)
        pieces = _concat(self.seq_piece) if self.seq_piece else np.zeros(len(index), np.int64)
        # Rank padding (--rank-remainder pad) repeats whole rows; bounds and what-ifs count a sample (one
        # (sample_index, piece_index) pair) once. Sorted by the pair: input order.
        distinct, first = np.unique(np.stack([index, pieces], axis=1), axis=0, return_index=True)
        return _SampleArrays(
            per_row=_concat(self.row_tokens),
            samples_per_row=_concat(self.row_samples),
            index=index,
            lengths=_concat(self.seq_length),
            real_lengths=_concat(self.seq_real),
            pieces=pieces,
            distinct=distinct,
            first=first,
        )


def _read_shards(directory: Path, manifest: Manifest) -> _ShardReading:
    """Read the lengths (and roles, images, trees) of every row of an output's shards, a batch at a time."""
    listed = manifest.columns or []
    read = _ShardReading(images_listed=has_images(listed), trees_listed=all(c in listed for c in TREE_COLUMNS))
    for entry in manifest.shards:
        path = directory / entry.file
        try:
            columns = ["labels", "seq_lengths", "sample_index"]
            columns += [c for c in ("piece_index", "sample_role", "seq_lengths_unpadded") if c in listed]
            if read.trees_listed:
                columns += ["position_ids", *TREE_COLUMNS]
            if read.images_listed:
                columns += ["image_refs", "image_tokens", "image_sample"]
            for batch in shard_batches(path, columns):
                read.add_batch(batch, columns)
        except (OSError, pa.ArrowException, KeyError) as exc:
            raise OutputError(
                f"{entry.file}: cannot be read ({first_line(exc)}); run packcli verify {directory}"
            ) from exc
    return read


def _padding_without_packing(
    manifest: Manifest, arrays: _SampleArrays, tokens: int, max_len: int, batch_size: int
) -> tuple[int, int, int]:
    """Return the what-ifs: (rows unpacked, their padding to max_len, the padding of batches padded to the longest)."""
    # Unpacked, every sample a trainer sees is a row: a --mix repeat is one (it is trained again), a row
    # repeated by rank padding is not. With both in one output, copies of either are counted once.
    counts = manifest.counts or Counts()
    distinct_lengths = arrays.real_lengths[arrays.first]
    every_copy = manifest.mix is not None and not int(counts.duplicated or 0)
    unpacked = len(arrays.index) if every_copy else len(arrays.distinct)
    without = (
        unpacked * max_len - tokens if every_copy else len(arrays.distinct) * max_len - int(distinct_lengths.sum())
    )
    if every_copy:  # every copy, in input order (a record's copies together)
        order = np.lexsort((arrays.pieces, arrays.index))
        batched = batch_padding(arrays.real_lengths[order], batch_size)
    else:
        batched = batch_padding(distinct_lengths, batch_size)  # np.unique sorts: input order
    return unpacked, without, batched


def _bounds_and_pairs(
    manifest: Manifest, read: _ShardReading, arrays: _SampleArrays, max_len: int, rows: int, batch_size: int
) -> tuple[RowBounds, PairStats | None]:
    """Return the row-count bounds on what the plan packed, and the preference figures (None without roles)."""
    padded_lengths = arrays.lengths[arrays.first]
    if read.seq_role:
        # Preference data: a record's samples are one item of the plan, so the bounds are on records.
        roles = _concat(read.seq_role)[arrays.first]
        _, item_of = np.unique(arrays.distinct[:, 0], return_inverse=True)
        item_lengths = np.bincount(item_of, weights=padded_lengths).astype(np.int64)
        distinct_lengths = arrays.real_lengths[arrays.first]
        pairs = _pair_stats(roles, item_of, distinct_lengths, _concat(read.row_pairs), batch_size)
        return row_bounds(item_lengths, max_len, rows), pairs
    if manifest.mix is not None:  # --mix: the plan packed every copy of a repeated record
        return row_bounds(arrays.lengths, max_len, rows), None
    return row_bounds(padded_lengths, max_len, rows), None


class _Sections(TypedDict, total=False):
    """The figures only some outputs have (OutputStats' fields of those names)."""

    images: ImageStats
    prefix_trees: TreeStats
    mix: MixSummary
    eval: EvalSummary
    reasoning: dict[str, int]


def _output_sections(manifest: Manifest, read: _ShardReading, tokens: int, rows: int) -> _Sections:
    """Return the figures only some outputs have: images, prefix trees, the mix, the eval split, reasoning."""
    out: _Sections = {}
    if read.images_listed:
        per_row_images = _concat(read.row_images)
        n_images = int(per_row_images.sum())
        embedded = read.embedded
        # Without --embed-images only the images that came as bytes are in the rows; the others by path.
        if (manifest.options or {}).get("embed_images"):
            embedded = n_images
        out["images"] = ImageStats(
            images=n_images,
            samples=read.image_samples,
            image_tokens=read.image_tokens,
            image_token_share=round(read.image_tokens / tokens, 6) if tokens else 0.0,
            per_row={
                "max": int(per_row_images.max()) if rows else 0,
                "mean": round(float(per_row_images.mean()), 3) if rows else 0.0,
            },
            embedded=embedded,
            referenced=n_images - embedded,
        )
    if read.trees_listed:
        out["prefix_trees"] = TreeStats(
            tokens=tokens,
            expanded_tokens=read.expanded,
            tokens_saved=read.expanded - tokens,
            tokens_ratio=round(tokens / read.expanded, 6) if read.expanded else 0.0,
        )
    if manifest.mix is not None:  # --mix: the manifest's per-source accounting
        out["mix"] = manifest.mix
    if manifest.eval is not None:  # the eval split beside these rows (OUT/eval/, its own manifest)
        out["eval"] = manifest.eval
    if manifest.reasoning:  # trained turns whose reasoning the template left out of the tokens
        out["reasoning"] = dict(manifest.reasoning)
    return out


def _pair_stats(
    roles: np.ndarray, item_of: np.ndarray, lengths: np.ndarray, pairs_per_row: np.ndarray, batch_size: int
) -> PairStats:
    """Return the samples by role, the pairs, pairs per row, and the padding of padded pair batches.

    ``padding_tokens_padded_pairs`` is what a trainer that pads pairs gives: batches of ``batch_size``
    consecutive records, each of their samples padded to the batch's longest sample.
    """
    from packcli.contract import SAMPLE_ROLES

    counts = np.bincount(roles, minlength=len(SAMPLE_ROLES))
    records = int(item_of.max()) + 1 if len(item_of) else 0
    per_record = np.bincount(item_of, minlength=records)
    batch_of = np.repeat(np.arange(records) // batch_size, per_record)
    longest = np.zeros(int(batch_of.max()) + 1 if len(batch_of) else 0, dtype=np.int64)
    np.maximum.at(longest, batch_of, lengths)
    padded = int(longest[batch_of].sum() - lengths.sum())
    return PairStats(
        roles={SAMPLE_ROLES[k]: int(n) for k, n in enumerate(counts) if n},
        pairs=int(counts[CHOSEN]),
        pairs_per_row=PerRow(
            min=int(pairs_per_row.min()) if len(pairs_per_row) else 0,
            mean=round(float(pairs_per_row.mean()), 3) if len(pairs_per_row) else 0.0,
            max=int(pairs_per_row.max()) if len(pairs_per_row) else 0,
        ),
        padding_tokens_padded_pairs=padded,
        rows_padded_pairs=len(lengths),
    )


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def expanded_tokens(batch: pa.RecordBatch) -> int:
    """Return the tokens of the batch's tree samples once expanded again, one sample per root-to-leaf path.

    A path holds its expanded sample token for token, so its length is its leaf's last position plus
    one. A plain sample (or a padding segment) is one root node, its own length.
    """
    count, node_lengths = list_parts(batch.column(TREE_COLUMNS[0]))
    _, parents = list_parts(batch.column(TREE_COLUMNS[1]))
    _, positions = list_parts(batch.column("position_ids"))
    offsets = np.repeat(np.cumsum(count) - count, count)
    has_child = np.zeros(len(parents), dtype=bool)
    has_child[(parents + offsets)[parents >= 0]] = True
    ends = np.cumsum(node_lengths.astype(np.int64))
    return int((positions[ends[~has_child] - 1].astype(np.int64) + 1).sum())
