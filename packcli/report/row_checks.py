"""The row contract's checks of ``verify``: one batch of a shard's rows at a time, with numpy.

Each check has a key in ``CHECKS`` and the message for the rows that fail it; ``check_batch`` records
the failing rows (shard row numbers) and the shard's totals in a ``ShardTotals``, against what the
manifest says the rows must be (``Expected``). Which files are checked, and the checks across shards,
are ``report.verify``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packcli.contract import IGNORE_INDEX, SHARD_SCHEMA, TREE_COLUMNS
from packcli.errors import Opt, Text
from packcli.output.rows import loss_weights
from packcli.plan.packing import pad_lengths
from packcli.report.images import IMAGE_COLUMNS, ImageChecker
from packcli.report.stats import list_parts
from packcli.report.trees import TREE_CHECKS, check_tree_rows

# Each row check: a key, and the message for the rows that fail it (text, or text and Opt parts).
CHECKS: dict[str, Text] = {
    "nulls": "hold null values",
    "token_columns": "have input_ids, labels and position_ids of different lengths",
    "segment_columns": "have seq_lengths, sample_index and piece_index of different lengths",
    "empty": "are empty",
    "too_long": "are longer than max_len {max_len}",
    "not_padded": ("are not padded to max_len {max_len} (the output was packed with ", Opt("pad_to_max"), ")"),
    "seq_lengths_positive": "have a seq_lengths value below 1",
    "seq_lengths_sum": "have seq_lengths that do not sum to the row length",
    "vocab": "have input_ids outside the tokenizer's vocabulary [0, {vocab_size})",
    "positions": "have position_ids that do not run 0..n-1 restarting at every sample",
    "first_label": "have a sample whose first label is not -100",
    "labels": "have labels that differ from input_ids where they are not -100",
    "sample_index": "have a sample_index below -1",
    "padding_unexpected": (
        "have a padding segment (sample_index -1) but the output was packed without ",
        Opt("pad_to_max"),
    ),
    "padding_labels": "have a padding segment with labels other than -100",
    "padding_not_last": "have a padding segment that is not the row's last segment",
    "sample_index_order": "have (sample_index, piece_index) pairs that do not ascend within the row",
    "piece_index": "have a piece_index below 0 (or other than 0 on a padding segment)",
    "unpadded": "have seq_lengths_unpadded values that are not the real length of their segment",
    "alignment": (
        "have samples not padded to the multiple the output was packed with (",
        Opt("pad_to_multiple_of"),
        ")",
    ),
    "alignment_labels": "have labels other than -100 in a sample's alignment padding",
    "sample_role": "have sample_role values that are not the task's (preference: 1 chosen, 2 rejected; kto: 3 "
    "desirable, 4 undesirable; 0 on a padding segment), or not one per sample",
    "pairs": "have a chosen sample not followed by its rejected sample (the same sample_index, piece 0 then 1), "
    "or a rejected sample without its chosen one before it",
    "source": "have source values that are not the manifest's mix source of their sample_index (-1 on a padding "
    "segment), or not one per sample",
    "loss_weights": "have loss_weights that are negative, not finite, of the wrong length or set where labels are -100",
    "loss_weights_values": (
        "have loss_weights that are not the {weighting} weighting the manifest records (",
        Opt("loss_weighting"),
        " {weighting}: {rule} on each of a sample's n trained tokens)",
    ),
    "image_rows": "have images that do not fit their tokens (the collator would refuse them)",
    "image_stray": "have image tokens but no images",
    "image_rule": "have images whose token count or grid is not what the processor gives for their size",
    "image_file": "have images whose file or bytes cannot be read now",
    "image_size": "have images whose file has another size now than when packed (image_sizes)",
    **TREE_CHECKS,
}
WEIGHTING_RULES = {"sample": "1/n", "sqrt": "1/sqrt(n)"}
# loss_weights are float32: a recomputed weight may differ from the stored one in its last bits only.
WEIGHT_RTOL = 1e-6


@dataclass
class Expected:
    """What the manifest says a shard's rows must be."""

    max_len: int
    pad_to_max: bool
    vocab_size: int | None
    columns: tuple[str, ...] = tuple(SHARD_SCHEMA.names)
    pad_multiple: int = 1
    pad_offset: int = 0
    task: str = "sft"
    loss_weighting: str | None = None  # the manifest's --loss-weighting (None: not recorded)
    # --mix: each input's first sample_index and its mix source (None: no --mix)
    mix_inputs: tuple[np.ndarray, np.ndarray] | None = None
    images: ImageChecker | None = None  # the output has image columns: check its rows' images
    trees: bool = False  # the manifest says the rows hold prefix trees (contract.PREFIX_TREES)


@dataclass
class ShardTotals:
    """One shard's counts and failing rows, summed over its batches."""

    rows: int = 0
    tokens: int = 0  # every token in the rows, padding segments included (what the manifest's shard entry counts)
    sample_tokens: int = 0  # real sample tokens: padding segments and alignment padding left out
    alignment: int = 0  # alignment padding tokens
    trainable: int = 0
    max_id: int | None = None  # the largest input id, padding included (the manifest's max_token_id)
    failures: dict[str, list[int]] = field(default_factory=dict)  # check -> [count, first row]
    first_problem: dict[str, str] = field(default_factory=dict)  # check -> what is wrong in its first row
    images: int = 0
    image_tokens: int = 0
    image_samples: int = 0  # samples with at least one image
    embedded_images: int = 0  # images that came as bytes (no path)
    index: list[np.ndarray] = field(default_factory=list)
    pieces: list[np.ndarray] = field(default_factory=list)

    def fail(self, check: str, bad_rows: np.ndarray, first_row: int) -> None:
        rows = np.unique(bad_rows)
        if len(rows) == 0:
            return
        seen = self.failures.setdefault(check, [0, int(rows[0]) + first_row])
        seen[0] += len(rows)


def check_batch(batch: pa.RecordBatch, first_row: int, expect: Expected, totals: ShardTotals) -> None:
    """Run the row checks on one batch of rows; record failing rows (shard row numbers) in ``totals``.

    Token-sized work is a handful of comparisons over the flat columns; failing tokens and segments
    are mapped back to their rows only when there are any.
    """
    cols = {name: batch.column(name) for name in expect.columns}
    null_rows = _null_rows(cols, batch.num_rows)
    if null_rows.any():
        totals.fail("nulls", np.flatnonzero(null_rows), first_row)
        return
    flat = _FlatRows.of(cols, batch.num_rows)
    totals.tokens += int(flat.row_len.sum())
    if len(flat.ids):
        totals.max_id = max(int(flat.ids.max()), totals.max_id if totals.max_id is not None else -1)
    if not _check_shapes(flat, expect, totals, first_row):
        return  # the columns do not line up; the checks below would only repeat this
    labelled = flat.labels != IGNORE_INDEX
    totals.trainable += int(np.count_nonzero(labelled))
    seg_row, row_sums, pad = _check_segments(flat, labelled, expect, totals, first_row)
    row_len, segs, seq_lengths, index, piece = flat.row_len, flat.segs, flat.seq_lengths, flat.index, flat.piece
    totals.sample_tokens += int(row_len.sum()) - int(seq_lengths[pad].sum())
    if "seq_lengths_unpadded" in batch.schema.names:
        alignment = _check_unpadded(
            batch, segs, seq_lengths, pad, row_sums == row_len, labelled, expect, totals, first_row
        )
        totals.sample_tokens -= alignment
        totals.alignment += alignment
    if "loss_weights" in batch.schema.names:
        _check_loss_weights(batch, flat, labelled, row_sums, expect, totals, first_row)
    if "source" in batch.schema.names:
        _check_source(batch, segs, index, pad, seg_row, expect, totals, first_row)
    if "sample_role" in batch.schema.names:
        _check_roles(batch, segs, index, piece, pad, seg_row, expect, totals, first_row)
    totals.index.append(index[~pad])
    totals.pieces.append(piece[~pad])
    tiled = (row_sums == row_len) & (np.bincount(seg_row[seq_lengths < 1], minlength=flat.n) == 0)
    trees = any(name in batch.schema.names for name in TREE_COLUMNS)
    if trees and tiled.all():  # (rows whose samples do not tile them fail seq_lengths_sum already)
        check_tree_rows(batch, row_len, segs, seq_lengths, flat.positions, labelled, totals, first_row)
    _check_positions(flat, labelled, pad, seg_row, tiled, trees, totals, first_row)


def _rows_of(ends: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Return the row of each set element of a flat ``mask``, given the rows' cumulative ends in it."""
    return np.searchsorted(ends, np.flatnonzero(mask), side="right")


@dataclass
class _FlatRows:
    """A batch's list columns as flat numpy arrays, with each column's per-row lengths."""

    n: int
    rows: np.ndarray
    row_len: np.ndarray
    ids: np.ndarray
    lab_len: np.ndarray
    labels: np.ndarray
    pos_len: np.ndarray
    positions: np.ndarray
    segs: np.ndarray
    seq_lengths: np.ndarray
    idx_len: np.ndarray
    index: np.ndarray
    piece_len: np.ndarray
    piece: np.ndarray
    row_end: np.ndarray
    seg_end: np.ndarray

    @classmethod
    def of(cls, cols: dict[str, pa.Array], n: int) -> _FlatRows:
        """Return the flat arrays of a batch's columns (``piece_index`` all 0 where the column is absent)."""
        row_len, ids = list_parts(cols["input_ids"])
        lab_len, labels = list_parts(cols["labels"])
        pos_len, positions = list_parts(cols["position_ids"])
        segs, seq_lengths = list_parts(cols["seq_lengths"])
        idx_len, index = list_parts(cols["sample_index"])
        if "piece_index" in cols:
            piece_len, piece = list_parts(cols["piece_index"])
        else:
            piece_len, piece = idx_len, np.zeros(len(index), np.int32)
        return cls(
            n=n,
            rows=np.arange(n),
            row_len=row_len,
            ids=ids,
            lab_len=lab_len,
            labels=labels,
            pos_len=pos_len,
            positions=positions,
            segs=segs,
            seq_lengths=seq_lengths.astype(np.int64),
            idx_len=idx_len,
            index=index.astype(np.int64),
            piece_len=piece_len,
            piece=piece.astype(np.int64),
            row_end=np.cumsum(row_len),
            seg_end=np.cumsum(segs),
        )

    def token_rows(self, mask: np.ndarray) -> np.ndarray:
        """Return the row of each token set in ``mask``."""
        return _rows_of(self.row_end, mask)

    def segment_rows(self, mask: np.ndarray) -> np.ndarray:
        """Return the row of each segment set in ``mask``."""
        return _rows_of(self.seg_end, mask)


def _null_rows(cols: dict[str, pa.Array], n: int) -> np.ndarray:
    """Return which of the ``n`` rows hold a null, as a row or as a value in one of their lists."""
    null_rows = np.zeros(n, dtype=bool)
    for col in cols.values():
        null_rows |= col.is_null().to_numpy(zero_copy_only=False)
        if col.flatten().null_count:
            seg_lengths, _ = list_parts(col)
            nulls = col.flatten().is_null().to_numpy(zero_copy_only=False)
            null_rows[np.repeat(np.arange(n), seg_lengths)[nulls]] = True
    return null_rows


def _check_shapes(flat: _FlatRows, expect: Expected, totals: ShardTotals, first_row: int) -> bool:
    """Check the rows' lengths, the columns' agreement and the vocabulary; return whether the columns line up."""
    rows, row_len = flat.rows, flat.row_len
    token_ok = (flat.lab_len == row_len) & (flat.pos_len == row_len)
    segment_ok = (flat.idx_len == flat.segs) & (flat.piece_len == flat.segs)
    totals.fail("token_columns", rows[~token_ok], first_row)
    totals.fail("segment_columns", rows[~segment_ok], first_row)
    totals.fail("empty", rows[row_len == 0], first_row)
    totals.fail("too_long", rows[row_len > expect.max_len], first_row)
    if expect.pad_to_max:
        totals.fail("not_padded", rows[row_len != expect.max_len], first_row)
    if expect.vocab_size:
        totals.fail("vocab", flat.token_rows((flat.ids < 0) | (flat.ids >= expect.vocab_size)), first_row)
    return bool(token_ok.all() and segment_ok.all())


def _check_segments(
    flat: _FlatRows, labelled: np.ndarray, expect: Expected, totals: ShardTotals, first_row: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check labels, the segments' values, their order and padding; return (segment rows, row sums, padding)."""
    rows, index, piece, seq_lengths = flat.rows, flat.index, flat.piece, flat.seq_lengths
    totals.fail("labels", flat.token_rows(labelled & (flat.labels != flat.ids)), first_row)
    totals.fail("sample_index", flat.segment_rows(index < -1), first_row)
    totals.fail("piece_index", flat.segment_rows((piece < 0) | ((index == -1) & (piece != 0))), first_row)
    totals.fail("seq_lengths_positive", flat.segment_rows(seq_lengths < 1), first_row)
    seg_row = np.repeat(rows, flat.segs)
    row_sums = np.bincount(seg_row, weights=seq_lengths, minlength=flat.n).astype(np.int64)
    totals.fail("seq_lengths_sum", rows[row_sums != flat.row_len], first_row)
    pad = index == -1
    # The contract: a row's samples are in ascending (sample_index, piece_index) order (padding aside).
    same_row = seg_row[1:] == seg_row[:-1]
    real_pair = ~pad[1:] & ~pad[:-1]
    unordered = np.zeros(len(index), dtype=bool)
    # (--mix: a repeated record's copies that no swap could part are equal neighbours)
    equal_bad = piece[1:] < piece[:-1] if expect.mix_inputs is not None else piece[1:] <= piece[:-1]
    before = (index[1:] < index[:-1]) | ((index[1:] == index[:-1]) & equal_bad)
    unordered[1:] = same_row & real_pair & before
    totals.fail("sample_index_order", seg_row[unordered], first_row)
    if pad.any():
        if not expect.pad_to_max:
            totals.fail("padding_unexpected", seg_row[pad], first_row)
        is_last = np.zeros(len(index), dtype=bool)
        is_last[flat.seg_end[flat.segs > 0] - 1] = True
        totals.fail("padding_not_last", seg_row[pad & ~is_last], first_row)
    return seg_row, row_sums, pad


def _check_loss_weights(
    batch: pa.RecordBatch,
    flat: _FlatRows,
    labelled: np.ndarray,
    row_sums: np.ndarray,
    expect: Expected,
    totals: ShardTotals,
    first_row: int,
) -> None:
    """Check loss_weights: one per token, finite, not negative, 0 where untrained, the recorded weighting's."""
    w_len, weights = list_parts(batch.column("loss_weights"))
    bad_len = flat.rows[w_len != flat.row_len]
    totals.fail("loss_weights", bad_len, first_row)
    if len(bad_len) == 0:
        bad = ~np.isfinite(weights) | (weights < 0) | ((weights != 0) & ~labelled)
        totals.fail("loss_weights", flat.token_rows(bad), first_row)
        seq_lengths = flat.seq_lengths
        if expect.loss_weighting in WEIGHTING_RULES and (row_sums == flat.row_len).all() and (seq_lengths > 0).all():
            # Each segment's weights as the writer computes them, from its labels (padding segments: 0).
            want = loss_weights(flat.labels, seq_lengths, expect.loss_weighting)
            if not np.array_equal(weights, want):  # the writer's own values are equal bit for bit
                wrong = ~np.isclose(weights, want, rtol=WEIGHT_RTOL, atol=0.0) & ~bad
                totals.fail("loss_weights_values", flat.token_rows(wrong), first_row)


def _check_positions(
    flat: _FlatRows,
    labelled: np.ndarray,
    pad: np.ndarray,
    seg_row: np.ndarray,
    tiled: np.ndarray,
    trees: bool,
    totals: ShardTotals,
    first_row: int,
) -> None:
    """Check position_ids, first labels and padding labels in the rows whose segments tile them."""
    rows, row_len, segs, positions, seq_lengths = flat.rows, flat.row_len, flat.segs, flat.positions, flat.seq_lengths
    row_end = flat.row_end
    if not tiled.all():
        # Positions and first labels can be placed only in rows whose segments tile the row.
        keep_tokens = np.repeat(tiled, row_len)
        keep_segments = np.repeat(tiled, segs)
        rows, row_len, segs = rows[tiled], row_len[tiled], segs[tiled]
        positions, labelled = positions[keep_tokens], labelled[keep_tokens]
        seq_lengths, pad = seq_lengths[keep_segments], pad[keep_segments]
        row_end = np.cumsum(row_len)
        seg_row = np.repeat(rows, segs)
    seg_start = np.cumsum(seq_lengths) - seq_lengths
    # position_ids are 0 at every segment start and grow by one everywhere else.
    starts = np.zeros(len(positions), dtype=bool)
    starts[seg_start] = True
    bad_position = np.zeros(len(positions), dtype=bool)
    bad_position[seg_start] = positions[seg_start] != 0
    if len(positions) > 1:
        bad_position[1:] |= ~starts[1:] & (np.diff(positions) != 1)
    if not trees:  # tree rows' positions follow the tree (checked above)
        totals.fail("positions", rows[_rows_of(row_end, bad_position)], first_row)
    totals.fail("first_label", seg_row[labelled[seg_start]], first_row)
    if pad.any():
        totals.fail("padding_labels", rows[_rows_of(row_end, np.repeat(pad, seq_lengths) & labelled)], first_row)


def _check_source(
    batch: pa.RecordBatch,
    segs: np.ndarray,
    index: np.ndarray,
    pad: np.ndarray,
    seg_row: np.ndarray,
    expect: Expected,
    totals: ShardTotals,
    first_row: int,
) -> None:
    """--mix: one source per sample, the manifest's source of its sample_index, -1 on padding."""
    src_len, source = list_parts(batch.column("source"))
    bad_len = np.flatnonzero(src_len != segs)
    if len(bad_len):
        totals.fail("source", bad_len, first_row)
        return
    want = np.full(len(index), -1, dtype=np.int64)
    if expect.mix_inputs is not None and len(expect.mix_inputs[0]):
        firsts, owners = expect.mix_inputs
        at = np.searchsorted(firsts, index[~pad], side="right") - 1
        want[~pad] = np.where(at >= 0, owners[np.clip(at, 0, None)], -2)
    totals.fail("source", seg_row[source.astype(np.int64) != want], first_row)


def _check_roles(
    batch: pa.RecordBatch,
    segs: np.ndarray,
    index: np.ndarray,
    piece: np.ndarray,
    pad: np.ndarray,
    seg_row: np.ndarray,
    expect: Expected,
    totals: ShardTotals,
    first_row: int,
) -> None:
    """Check sample_role: one per sample, the task's values, and every pair whole and in order in its row."""
    r_len, role = list_parts(batch.column("sample_role"))
    if (r_len != segs).any():
        totals.fail("sample_role", np.flatnonzero(r_len != segs), first_row)
        return
    role = role.astype(np.int64)
    allowed = {"preference": (1, 2), "kto": (3, 4)}.get(expect.task, (0,))
    bad = np.where(pad, role != 0, ~np.isin(role, allowed))
    totals.fail("sample_role", seg_row[bad], first_row)
    if expect.task == "kto":
        totals.fail("pairs", seg_row[~pad & (piece != 0)], first_row)
    if expect.task != "preference":
        return
    chosen, rejected = role == 1, role == 2
    nxt = np.zeros(len(role), dtype=bool)  # the next segment is this chosen sample's rejected one
    nxt[:-1] = (
        rejected[1:] & (seg_row[1:] == seg_row[:-1]) & (index[1:] == index[:-1]) & (piece[:-1] == 0) & (piece[1:] == 1)
    )
    prev = np.zeros(len(role), dtype=bool)
    prev[1:] = nxt[:-1] & chosen[:-1]
    totals.fail("pairs", seg_row[(chosen & ~nxt) | (rejected & ~prev)], first_row)


def _check_unpadded(
    batch: pa.RecordBatch,
    segs: np.ndarray,
    seq_lengths: np.ndarray,
    pad: np.ndarray,
    tiled: np.ndarray,
    labelled: np.ndarray,
    expect: Expected,
    totals: ShardTotals,
    first_row: int,
) -> int:
    """Check seq_lengths_unpadded and the samples' alignment padding; return the padding tokens."""
    rows = np.arange(batch.num_rows)
    u_len, unpadded = list_parts(batch.column("seq_lengths_unpadded"))
    if (u_len != segs).any():
        totals.fail("segment_columns", rows[u_len != segs], first_row)
        return 0
    unpadded = unpadded.astype(np.int64)
    seg_row = np.repeat(rows, segs)
    wrong = (unpadded < 0) | (unpadded > seq_lengths) | ((unpadded == 0) != pad)
    totals.fail("unpadded", seg_row[wrong], first_row)
    if expect.pad_multiple > 1:
        aligned = pad_lengths(np.maximum(unpadded, 1), expect.pad_multiple, expect.pad_offset) == seq_lengths
        totals.fail("alignment", seg_row[~pad & ~aligned], first_row)
    if tiled.all() and not wrong.any():
        within = np.arange(int(seq_lengths.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(seq_lengths) - seq_lengths, seq_lengths
        )
        in_padding = within >= np.repeat(np.where(pad, seq_lengths, unpadded), seq_lengths)
        token_row = np.repeat(seg_row, seq_lengths)
        totals.fail("alignment_labels", token_row[in_padding & labelled], first_row)
    return int((seq_lengths[~pad] - unpadded[~pad]).sum())


def check_images(batch: pa.RecordBatch, first_row: int, checker: ImageChecker, totals: ShardTotals) -> None:
    """Check the images of a batch of image-text rows; count them in ``totals``.

    Rows without images are checked with numpy (no image token may stand in them); each row with
    images goes through ``checker`` (the collator's checks, the processor's rule, the files).
    """
    n = batch.num_rows
    row_len, ids = list_parts(batch.column("input_ids"))
    _, labels = list_parts(batch.column("labels"))
    segs, seq_lengths = list_parts(batch.column("seq_lengths"))
    _, index = list_parts(batch.column("sample_index"))
    counts = batch.column("image_refs").value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    token_row = np.repeat(np.arange(n), row_len)
    held = np.bincount(token_row[ids == checker.image_token_id], minlength=n)
    totals.fail("image_stray", np.flatnonzero((counts == 0) & (held > 0)), first_row)
    # What the rows hold, counted from the columns alone (the manifest's figures are compared with them).
    refs = batch.column("image_refs").flatten()
    sample_of = batch.column("image_sample").flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    if len(sample_of) == len(refs):
        image_row = np.repeat(np.arange(n), counts)
        totals.images += len(refs)
        totals.embedded_images += refs.null_count
        totals.image_samples += len(np.unique(image_row * (int(segs.max(initial=0)) + 1) + sample_of))
    totals.image_tokens += int(pc.sum(batch.column("image_tokens").flatten()).as_py() or 0)
    with_images = np.flatnonzero(counts > 0)
    if not len(with_images):
        return
    names = [name for name in (*IMAGE_COLUMNS, "image_bytes", "image_spans") if name in batch.schema.names]
    picked = batch.select(names).take(pa.array(with_images)).to_pylist()
    row_end, seg_end = np.cumsum(row_len), np.cumsum(segs)
    for r, images in zip(with_images.tolist(), picked, strict=True):
        a, b = int(row_end[r] - row_len[r]), int(row_end[r])
        s0, s1 = int(seg_end[r] - segs[r]), int(seg_end[r])
        row = {
            **images,
            "input_ids": ids[a:b],
            "labels": labels[a:b],
            "seq_lengths": seq_lengths[s0:s1],
            "sample_index": index[s0:s1],
        }
        problems = checker.problems(row, first_row + r)
        for check, message in problems:
            if check not in totals.failures:
                totals.first_problem[check] = message
        for check in {check for check, _ in problems}:  # a row counts once per check
            totals.fail(check, np.array([r]), first_row)
