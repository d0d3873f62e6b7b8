"""The tree nodes of stored samples (--prefix-tree; the layout: docs/guides/trees.md).

A tree sample is a run of nodes, parents before children; a plain sample is one node. The store keeps
every sample's nodes flat, and the row builder turns them into the rows' ``tree_node_lengths``,
``tree_node_parents`` and ``position_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TreeNodes:
    """The nodes of several samples, flat: per sample its number of nodes, per node its length and parent.

    A plain sample is one node (its length, parent -1). Parents are sample-local node indices.
    """

    counts: np.ndarray  # int32 per sample
    lengths: np.ndarray  # int32 per node
    parents: np.ndarray  # int32 per node

    @staticmethod
    def of(nodes: Sequence[tuple[np.ndarray, np.ndarray] | None], sample_lengths: np.ndarray) -> TreeNodes:
        """Flatten per-sample ``(node_lengths, node_parents)``; None stands for a plain sample of its length."""
        counts = np.ones(len(nodes), dtype=np.int32)
        lengths: list[np.ndarray] = []
        parents: list[np.ndarray] = []
        for k, item in enumerate(nodes):
            if item is None:
                lengths.append(np.asarray([sample_lengths[k]], dtype=np.int32))
                parents.append(np.asarray([-1], dtype=np.int32))
            else:
                counts[k] = len(item[0])
                lengths.append(np.asarray(item[0], dtype=np.int32))
                parents.append(np.asarray(item[1], dtype=np.int32))
        empty = np.zeros(0, np.int32)
        return TreeNodes(
            counts,
            np.concatenate(lengths) if lengths else empty,
            np.concatenate(parents) if parents else empty,
        )

    @staticmethod
    def stored(arrays: dict[str, np.ndarray]) -> TreeNodes | None:
        """Return the nodes a token store saved (``tree_node_counts``, ``_lengths``, ``_parents``), or None."""
        if not arrays:
            return None
        return TreeNodes(arrays["tree_node_counts"], arrays["tree_node_lengths"], arrays["tree_node_parents"])

    @staticmethod
    def plain(sample_lengths: np.ndarray) -> TreeNodes:
        """The nodes of plain samples: one each."""
        n = len(sample_lengths)
        return TreeNodes(np.ones(n, np.int32), np.asarray(sample_lengths, np.int32), np.full(n, -1, np.int32))

    def select(self, samples: np.ndarray) -> TreeNodes:
        """Return the nodes of the samples numbered ``samples`` (in that order)."""
        starts = np.zeros(len(self.counts) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=starts[1:])
        counts = self.counts[samples]
        first = np.cumsum(counts) - counts
        pick = np.repeat(starts[samples], counts) + (
            np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(first, counts)
        )
        return TreeNodes(counts.astype(np.int32), self.lengths[pick], self.parents[pick])

    def positions(self) -> np.ndarray:
        """Each token's position in its root-to-leaf path (its depth), for the samples' tokens in order."""
        n = len(self.lengths)
        first_node = np.zeros(len(self.counts) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=first_node[1:])
        base = np.repeat(first_node[:-1], self.counts)  # each node's sample's first node
        starts = np.zeros(n, dtype=np.int64)  # each node's first position
        lengths = self.lengths.tolist()
        parents = self.parents.tolist()
        for v, (parent, offset) in enumerate(zip(parents, base.tolist(), strict=True)):
            if parent >= 0:
                p = offset + parent
                starts[v] = starts[p] + lengths[p]
        token_starts = np.cumsum(self.lengths, dtype=np.int64) - self.lengths
        total = int(self.lengths.sum())
        shift = np.repeat(starts - token_starts, self.lengths)
        return (np.arange(total, dtype=np.int64) + shift).astype(np.int32)

    def row_parents(self, samples_per_row: np.ndarray) -> np.ndarray:
        """Each node's parent as a node index of its row (-1 for a root), samples laid ``samples_per_row``."""
        first_node = np.zeros(len(self.counts) + 1, dtype=np.int64)  # each sample's first node, overall
        np.cumsum(self.counts, out=first_node[1:])
        sample_starts = np.cumsum(samples_per_row, dtype=np.int64) - samples_per_row
        row_first = np.repeat(first_node[sample_starts], samples_per_row)
        first_node = first_node[:-1]
        offset = np.repeat(first_node - row_first, self.counts)  # each node's sample's first node, in its row
        return np.where(self.parents >= 0, self.parents + offset, -1).astype(np.int32)
