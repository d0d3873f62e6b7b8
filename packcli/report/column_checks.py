"""The row checks of ``check_batch``, one concern each: the rows' shapes, their segments, positions,
loss weights, mix sources, sample roles and alignment padding. Each records the rows that fail it in
the shard's ``ShardTotals`` under its key of ``CHECKS``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from packcli.output.columns import list_parts
from packcli.output.rows import loss_weights
from packcli.plan.packing import pad_lengths
from packcli.report.flat_rows import FlatRows, rows_of
from packcli.report.row_contract import WEIGHT_RTOL, WEIGHTING_RULES, Expected, ShardTotals


def check_shapes(flat: FlatRows, expect: Expected, totals: ShardTotals, first_row: int) -> bool:
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


def check_segments(
    flat: FlatRows, labelled: np.ndarray, expect: Expected, totals: ShardTotals, first_row: int
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


def check_loss_weights(
    batch: pa.RecordBatch,
    flat: FlatRows,
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


def check_positions(
    flat: FlatRows,
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
        totals.fail("positions", rows[rows_of(row_end, bad_position)], first_row)
    totals.fail("first_label", seg_row[labelled[seg_start]], first_row)
    if pad.any():
        totals.fail("padding_labels", rows[rows_of(row_end, np.repeat(pad, seq_lengths) & labelled)], first_row)


def check_source(
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


def check_roles(
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


def check_unpadded(
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
