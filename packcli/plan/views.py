"""Views of the token store for the plan: chosen rows (repeats allowed) as a store of their own
(``store_view``, as a mix, a dedup and an eval split pick records), and the mix source of each row
(``source_ids``, from the view's ``mix_source_of_input``).
"""

from __future__ import annotations

import numpy as np

from packcli.store.tokens import TokenStore


def store_view(store: TokenStore, rows: np.ndarray) -> TokenStore:
    """The store's rows ``rows`` (repeats allowed) as a store: the same token files, read at their offsets."""
    view = TokenStore(
        path=store.path,
        sample_index=store.sample_index[rows],
        piece_index=store.piece_index[rows],
        lengths=store.lengths[rows],
        trainable=store.trainable[rows],
        first_trained=store.first_trained[rows],
        positions=store.positions[rows],
        meta=store.meta,
        sample_role=None if store.sample_role is None else store.sample_role[rows],
        seconds=store.seconds,
        content_key=None if store.content_key is None else store.content_key[rows],
        tree_nodes=None if store.tree_nodes is None else store.tree_nodes.select(rows),
    )
    view.__dict__["starts"] = store.starts[rows]  # the cached property, set: offsets in the token files
    return view


def source_ids(store: TokenStore, rows: np.ndarray) -> np.ndarray:
    """The mix source (int16) of each of the store's rows ``rows``: the ``source`` column."""
    assert store.meta.mix_source_of_input is not None, "a mix's view of the store"
    of_input = np.asarray(store.meta.mix_source_of_input, dtype=np.int16)
    starts = np.asarray(store.meta.source_starts, dtype=np.int64)
    return of_input[np.searchsorted(starts, store.sample_index[rows], side="right") - 1]
