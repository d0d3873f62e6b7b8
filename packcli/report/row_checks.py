"""The row contract's checks of ``verify``: one batch of a shard's rows at a time, with numpy.

Each check has a key in ``CHECKS`` and the message for the rows that fail it; ``check_batch`` records
the failing rows (shard row numbers) and the shard's totals in a ``ShardTotals``, against what the
manifest says the rows must be (``Expected``). Which files are checked, and the checks across shards,
are ``report.verify``'s. The keys and those types are ``row_contract``'s (re-exported here), the checks
of one concern each ``column_checks``', the flat arrays they read ``flat_rows``'.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from packcli.contract import IGNORE_INDEX, TREE_COLUMNS
from packcli.output.columns import list_parts
from packcli.report.column_checks import (
    check_loss_weights,
    check_positions,
    check_roles,
    check_segments,
    check_shapes,
    check_source,
    check_unpadded,
)
from packcli.report.flat_rows import FlatRows, rows_with_nulls
from packcli.report.images import IMAGE_COLUMNS, ImageChecker
from packcli.report.row_contract import (
    CHECKS as CHECKS,
    WEIGHT_RTOL as WEIGHT_RTOL,
    WEIGHTING_RULES as WEIGHTING_RULES,
    Expected as Expected,
    ShardTotals as ShardTotals,
)
from packcli.report.trees import check_tree_rows


def check_batch(batch: pa.RecordBatch, first_row: int, expect: Expected, totals: ShardTotals) -> None:
    """Run the row checks on one batch of rows; record failing rows (shard row numbers) in ``totals``.

    Token-sized work is a handful of comparisons over the flat columns; failing tokens and segments
    are mapped back to their rows only when there are any.
    """
    cols = {name: batch.column(name) for name in expect.columns}
    null_rows = rows_with_nulls(cols, batch.num_rows)
    if null_rows.any():
        totals.fail("nulls", np.flatnonzero(null_rows), first_row)
        return
    flat = FlatRows.of(cols, batch.num_rows)
    totals.tokens += int(flat.row_len.sum())
    if len(flat.ids):
        totals.max_id = max(int(flat.ids.max()), totals.max_id if totals.max_id is not None else -1)
    if not check_shapes(flat, expect, totals, first_row):
        return  # the columns do not line up; the checks below would only repeat this
    labelled = flat.labels != IGNORE_INDEX
    totals.trainable += int(np.count_nonzero(labelled))
    seg_row, row_sums, pad = check_segments(flat, labelled, expect, totals, first_row)
    row_len, segs, seq_lengths, index, piece = flat.row_len, flat.segs, flat.seq_lengths, flat.index, flat.piece
    totals.sample_tokens += int(row_len.sum()) - int(seq_lengths[pad].sum())
    if "seq_lengths_unpadded" in batch.schema.names:
        alignment = check_unpadded(
            batch, segs, seq_lengths, pad, row_sums == row_len, labelled, expect, totals, first_row
        )
        totals.sample_tokens -= alignment
        totals.alignment += alignment
    if "loss_weights" in batch.schema.names:
        check_loss_weights(batch, flat, labelled, row_sums, expect, totals, first_row)
    if "source" in batch.schema.names:
        check_source(batch, segs, index, pad, seg_row, expect, totals, first_row)
    if "sample_role" in batch.schema.names:
        check_roles(batch, segs, index, piece, pad, seg_row, expect, totals, first_row)
    totals.index.append(index[~pad])
    totals.pieces.append(piece[~pad])
    tiled = (row_sums == row_len) & (np.bincount(seg_row[seq_lengths < 1], minlength=flat.n) == 0)
    trees = any(name in batch.schema.names for name in TREE_COLUMNS)
    if trees and tiled.all():  # (rows whose samples do not tile them fail seq_lengths_sum already)
        check_tree_rows(batch, row_len, segs, seq_lengths, flat.positions, labelled, totals, first_row)
    check_positions(flat, labelled, pad, seg_row, tiled, trees, totals, first_row)


def check_images(batch: pa.RecordBatch, first_row: int, checker: ImageChecker, totals: ShardTotals) -> None:
    """Check the images of a batch of image-text rows; count them in ``totals``.

    Rows without images are checked with numpy (no image token may stand in them); each row with
    images goes through ``checker`` (the collator's checks, the processor's rule, the files).
    """
    import pyarrow.compute as pc  # here, not for every output: 26 ms to import

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
