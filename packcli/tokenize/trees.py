"""Prefix trees: the samples expanded from one record (one per round) as one tree sample.

Expanding a conversation into one sample per round repeats, in round j's sample, everything before
round j: the system prompt, the tools and the earlier rounds. A tree stores that shared prefix once
and each round's own continuation as a branch that attends only to its ancestors, so that the model
sees, at every token, exactly the context it would see in the expanded sample alone.

The layout (docs/guides/trees.md): a tree sample is a sequence of nodes, each a run of contiguous tokens,
parents before children, depth first (a branch follows its parent's whole earlier subtree).
``node_parents`` gives each node's parent (-1 for a root); ``positions`` gives each token its depth,
its position in its own root-to-leaf path, so a branch's positions continue from its parent's end.
Every root-to-leaf path holds, token for token, the ids and trained mask of one expanded sample.

Two rules keep the loss exact:

- A trained token is never shared: a shared token would be trained once where the expansion trains
  it in each sample, and its prediction would come from one context only. The trie merges only
  untrained tokens.
- A node that is not a root starts with an untrained token. Labels are unshifted (the logit at t is
  scored on the label at t + 1), so a node's first token is scored on the logit of the token just
  before it in the row, which, for every child but the first, is the end of a sibling's subtree: the
  wrong context. Where a branch's first token would be trained, the split moves back one token: the
  branch starts with a copy of the last shared token (untrained, since only untrained tokens are
  shared), whose own logit, computed along the branch's path, then predicts the trained token. Each
  trained token stays trained exactly once, and the copy costs one token per such branch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from packcli.contract import IGNORE_INDEX, tree_attention
from packcli.errors import RecordError
from packcli.store.nodes import TreeNodes

# The summary's trees (--prefix-tree): the records made into trees, the trees, the expanded
# samples they hold, their tokens and the plain expansion's tokens.
TREE_KEYS = ("records", "trees", "samples", "tokens", "expansion_tokens")

__all__ = [
    "RecordTrees",
    "TreeNodes",
    "TreeSample",
    "build_tree",
    "grow_trees",
    "record_trees",
    "tree_attention",
    "tree_labels",
    "tree_paths",
]


@dataclass(frozen=True)
class TreeSample:
    """One tree sample: its tokens in row order and its nodes.

    ``ids`` int32, ``trained`` bool and ``positions`` int32 have one value per token; ``node_lengths``
    and ``node_parents`` (int32) one per node, in node order (a parent's index is below its child's,
    -1 for a root); ``leaves[i]`` is the node where expanded sample i's path ends.
    """

    ids: np.ndarray
    trained: np.ndarray
    positions: np.ndarray
    node_lengths: np.ndarray
    node_parents: np.ndarray
    leaves: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


class _Trie:
    """A token-level trie: vertex v holds one token; vertex 0 is the sentinel above the roots."""

    def __init__(self) -> None:
        self.ids: list[int] = [-1]
        self.trained: list[bool] = [False]
        self.parent: list[int] = [-1]
        self.children: list[list[int]] = [[]]
        # The children another sample may walk into: untrained tokens where no sample ends, by id.
        self.shared: list[dict[int, int]] = [{}]

    def add(self, parent: int, token: int, trained: bool, mergeable: bool, replace: bool = False) -> int:
        """Add vertex ``token`` under ``parent``; ``replace``: later samples walk into it, not its sibling."""
        v = len(self.ids)
        self.ids.append(token)
        self.trained.append(trained)
        self.parent.append(parent)
        self.children.append([])
        self.shared.append({})
        self.children[parent].append(v)
        if mergeable and replace:
            self.shared[parent][token] = v
        elif mergeable:
            self.shared[parent].setdefault(token, v)
        return v

    def insert(self, ids: Sequence[int], trained: Sequence[bool]) -> int:
        """Add one sample's path and return its leaf vertex."""
        n = len(ids)
        cur, i = 0, 0
        # Walk the shared untrained tokens; a sample's last token is always its own (its leaf).
        while i < n - 1 and not trained[i] and ids[i] in self.shared[cur]:
            cur = self.shared[cur][ids[i]]
            i += 1
        copy = False  # whether later samples walk into the copy made here instead of the original
        if cur and (trained[i] or any(self.trained[c] for c in self.children[cur])):
            # A branch never starts with a trained token (see the module docstring), neither the new one
            # nor a sibling already there: start it one token earlier, with a copy of the last shared
            # token beside the original. So a vertex with a trained child has no other child. Where the
            # original leads to a trained token and this sample goes on untrained, the copy is what later
            # samples share (a later round's history runs on through this one's).
            copy = not trained[i] and any(self.trained[c] for c in self.children[cur])
            cur, i = self.parent[cur], i - 1
        for j in range(i, n):
            cur = self.add(cur, ids[j], trained[j], mergeable=not trained[j] and j < n - 1, replace=copy and j == i)
        return cur


def build_tree(samples: Sequence[tuple[np.ndarray, np.ndarray]]) -> TreeSample:
    """Return the tree sample of one record's expanded samples, each ``(ids, trained)`` (int, bool arrays).

    Every sample is one root-to-leaf path, with its ids and trained mask; each trained token is in one
    path only; the tree holds at most the samples' total number of tokens. Raises RecordError when a
    sample is empty, its arrays differ in length, or its first token is trained (nothing precedes it
    to predict it from).
    """
    if not samples:
        raise RecordError("prefix_tree", "no samples to build a prefix tree of")
    trie = _Trie()
    leaves: list[int] = []
    for k, (ids, trained) in enumerate(samples):
        id_list = np.asarray(ids).reshape(-1).tolist()
        mask = np.asarray(trained, dtype=bool).reshape(-1).tolist()
        if not id_list or len(id_list) != len(mask):
            raise RecordError("prefix_tree", f"expanded sample {k} has {len(id_list)} ids and {len(mask)} mask values")
        if mask[0]:
            raise RecordError(
                "prefix_tree",
                f"expanded sample {k} trains its first token, which nothing precedes to predict it from",
            )
        leaves.append(trie.insert(id_list, mask))
    return _flatten(trie, leaves)


def grow_trees(samples: Sequence[tuple[np.ndarray, np.ndarray]], max_len: int) -> list[TreeSample]:
    """Return the trees of one record's expanded samples (``(ids, labels)``), each at most ``max_len`` tokens.

    One tree holds them all where it fits in ``max_len``; else the samples are taken in order, each
    tree growing by the next sample while it fits (a sample too long alone is a tree of its own, as
    long as the sample).
    """
    pairs = [(np.asarray(ids), np.asarray(labels) != IGNORE_INDEX) for ids, labels in samples]
    whole = build_tree(pairs)
    if len(whole) <= max_len or len(pairs) == 1:
        return [whole]
    out: list[TreeSample] = []
    start = 0
    current = build_tree(pairs[:1])
    for end in range(2, len(pairs) + 1):
        grown = build_tree(pairs[start:end])
        if len(grown) <= max_len:
            current = grown
            continue
        out.append(current)
        start = end - 1
        current = build_tree(pairs[start:end])
    out.append(current)
    return out


@dataclass(frozen=True)
class RecordTrees:
    """A record's rounds as trees (--prefix-tree): each tree's ids and labels, its nodes, and the counts
    the summary's ``trees`` adds up (TREE_KEYS)."""

    samples: list[tuple[np.ndarray, np.ndarray]]
    nodes: list[tuple[np.ndarray, np.ndarray]]
    counts: dict[str, int]


def record_trees(rounds: Sequence[tuple[np.ndarray, np.ndarray]], max_len: int) -> RecordTrees:
    """Return one expanded record's rounds (``(ids, labels)``) grown into trees of at most ``max_len`` tokens."""
    grown = grow_trees(rounds, max_len)
    counts = {
        "records": 1,
        "trees": len(grown),
        "samples": len(rounds),
        "tokens": sum(len(tree) for tree in grown),
        "expansion_tokens": sum(len(ids) for ids, _ in rounds),
    }
    return RecordTrees(
        [(tree.ids, tree_labels(tree)) for tree in grown],
        [(tree.node_lengths, tree.node_parents) for tree in grown],
        counts,
    )


def tree_labels(tree: TreeSample) -> np.ndarray:
    """Return a tree's labels (unshifted, as the rows carry them): its id where trained, else IGNORE_INDEX."""
    return np.where(tree.trained, tree.ids, IGNORE_INDEX).astype(np.int32)


def _flatten(trie: _Trie, leaves: list[int]) -> TreeSample:
    """Lay the trie out depth first, chains of single children as one node each."""
    ids: list[int] = []
    trained: list[bool] = []
    positions: list[int] = []
    lengths: list[int] = []
    parents: list[int] = []
    node_of_leaf: dict[int, int] = {}
    # (vertex starting a node, parent node, depth); reversed pushes keep the children's order.
    stack = [(v, -1, 0) for v in reversed(trie.children[0])]
    while stack:
        v, parent, depth = stack.pop()
        node = len(lengths)
        parents.append(parent)
        start = len(ids)
        while True:
            ids.append(trie.ids[v])
            trained.append(trie.trained[v])
            positions.append(depth)
            depth += 1
            if len(trie.children[v]) != 1:
                break
            v = trie.children[v][0]
        lengths.append(len(ids) - start)
        if not trie.children[v]:
            node_of_leaf[v] = node
        stack.extend((c, node, depth) for c in reversed(trie.children[v]))
    return TreeSample(
        ids=np.asarray(ids, dtype=np.int32),
        trained=np.asarray(trained, dtype=bool),
        positions=np.asarray(positions, dtype=np.int32),
        node_lengths=np.asarray(lengths, dtype=np.int32),
        node_parents=np.asarray(parents, dtype=np.int32),
        leaves=np.asarray([node_of_leaf[v] for v in leaves], dtype=np.int32),
    )


def tree_paths(tree: TreeSample) -> list[tuple[np.ndarray, np.ndarray]]:
    """Return, for each leaf in ``tree.leaves``, the ids and trained mask along its root-to-leaf path."""
    starts = np.concatenate([[0], np.cumsum(tree.node_lengths)]).astype(np.int64)
    paths = []
    for leaf in tree.leaves.tolist():
        chain = []
        node = leaf
        while node != -1:
            chain.append(node)
            node = int(tree.node_parents[node])
        index = np.concatenate([np.arange(starts[n], starts[n + 1]) for n in reversed(chain)])
        paths.append((tree.ids[index], tree.trained[index]))
    return paths
