"""The row checks of ``verify`` for prefix-tree rows (the tree columns): one batch at a time, with numpy.

A tree row's nodes tile each of its samples, each parent is an earlier node of the same sample (or -1
for a root), ``position_ids`` follow the tree (a root's run from 0, every other node's from its
parent's last position plus one, growing by one inside a node) and no node but a root trains its
first token (the next-token shift would score it from the end of a sibling's subtree).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pyarrow as pa

from packcli.contract import TREE_COLUMNS
from packcli.output.columns import list_parts

TREE_CHECKS = {
    "tree_nodes": "have tree_node_lengths and tree_node_parents that do not tile every sample with nodes whose "
    "parent is an earlier node of the same sample (or -1)",
    "tree_positions": "have position_ids that do not follow the tree (from 0 at a root, from the parent's last "
    "position plus one at any other node, growing by one inside a node)",
    "tree_first_label": "have a tree node, not a root, whose first label is not -100",
}


class Failures(Protocol):
    def fail(self, check: str, bad_rows: np.ndarray, first_row: int) -> None: ...


def check_tree_rows(
    batch: pa.RecordBatch,
    row_len: np.ndarray,
    segs: np.ndarray,
    seq_lengths: np.ndarray,
    positions: np.ndarray,
    labelled: np.ndarray,
    totals: Failures,
    first_row: int,
) -> None:
    """Check the tree columns of a batch whose samples tile its rows; record failing rows in ``totals``."""
    rows = np.arange(batch.num_rows)
    if not all(name in batch.schema.names for name in TREE_COLUMNS):
        totals.fail("tree_nodes", rows, first_row)  # one tree column without the other
        return
    count, node_lengths = list_parts(batch.column(TREE_COLUMNS[0]))
    parent_count, parents = list_parts(batch.column(TREE_COLUMNS[1]))
    node_lengths, parents = node_lengths.astype(np.int64), parents.astype(np.int64)
    node_row = np.repeat(rows, count)
    sums = np.bincount(node_row, weights=node_lengths, minlength=len(rows)).astype(np.int64)
    bad = (count != parent_count) | (sums != row_len)
    if len(node_lengths):
        bad |= np.bincount(node_row[node_lengths < 1], minlength=len(rows)) > 0
    if bad.any():
        totals.fail("tree_nodes", rows[bad], first_row)
        return
    node_end = np.cumsum(node_lengths)
    node_start = node_end - node_lengths
    sample_end = np.cumsum(seq_lengths)
    # Every sample ends where a node ends; a node's sample is the first whose end is past its start.
    tiles = np.isin(sample_end, node_end)
    sample_of = np.searchsorted(sample_end, node_start, side="right")
    local = np.arange(len(parents)) - np.repeat(np.cumsum(count) - count, count)
    root = parents == -1
    parent = np.where(root, 0, parents + (np.arange(len(parents)) - local))  # the parent's index in the batch
    wrong = ~root & ((parents < 0) | (parents >= local))
    wrong |= ~root & ~wrong & (sample_of[np.where(wrong, 0, parent)] != sample_of)
    if not tiles.all():
        totals.fail("tree_nodes", np.repeat(rows, segs)[~tiles], first_row)
        return
    totals.fail("tree_nodes", node_row[wrong], first_row)
    if wrong.any():
        return
    want_start = np.where(root, 0, positions[node_end[parent] - 1] + 1)
    bad_position = np.zeros(len(positions), dtype=bool)
    bad_position[node_start] = positions[node_start] != want_start
    is_start = np.zeros(len(positions), dtype=bool)
    is_start[node_start] = True
    if len(positions) > 1:
        bad_position[1:] |= ~is_start[1:] & (np.diff(positions) != 1)
    token_row = np.repeat(rows, row_len)
    totals.fail("tree_positions", token_row[bad_position], first_row)
    totals.fail("tree_first_label", node_row[~root & labelled[node_start]], first_row)
