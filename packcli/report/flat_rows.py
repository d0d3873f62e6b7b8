"""A batch of shard rows as flat numpy arrays (``FlatRows``): each list column's values and per-row
lengths, and the rows of flagged tokens and segments; and which rows hold a null (``rows_with_nulls``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from packcli.output.columns import list_parts, values_hold_null


def rows_of(ends: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Return the row of each set element of a flat ``mask``, given the rows' cumulative ends in it."""
    return np.searchsorted(ends, np.flatnonzero(mask), side="right")


@dataclass
class FlatRows:
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
    def of(cls, cols: dict[str, pa.Array], n: int) -> FlatRows:
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
        return rows_of(self.row_end, mask)

    def segment_rows(self, mask: np.ndarray) -> np.ndarray:
        """Return the row of each segment set in ``mask``."""
        return rows_of(self.seg_end, mask)


def rows_with_nulls(cols: dict[str, pa.Array], n: int) -> np.ndarray:
    """Return which of the ``n`` rows hold a null, as a row or as a value in one of their lists."""
    null_rows = np.zeros(n, dtype=bool)
    for col in cols.values():
        if col.null_count:
            null_rows |= col.is_null().to_numpy(zero_copy_only=False)
        if values_hold_null(col):
            seg_lengths, _ = list_parts(col)
            nulls = col.flatten().is_null().to_numpy(zero_copy_only=False)
            null_rows[np.repeat(np.arange(n), seg_lengths)[nulls]] = True
    return null_rows
