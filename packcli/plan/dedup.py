"""``--dedup exact``: records whose normalised content repeats an earlier record's are left out.

The workers key every record by its normalised content (``packcli.records.dedup``) and the token store
keeps the key beside each sample, so the decision is made here, from the store alone, without
tokenizing again. Across all inputs, in input order (``sample_index``), the first record of each
content is kept and every later one is dropped as ``duplicate``, all of its samples (the pieces of a
split record) with it. The dropped records are counted per input and, with ``--rejects``, each entry's
detail names the first occurrence (its input, position and sample_index).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from packcli.errors import Opt, RecordError, UsageError, where
from packcli.plan.mix import store_view
from packcli.results import DedupSummary
from packcli.store.tokens import TokenStore

REASON = "duplicate"


@dataclass
class Dedup:
    """The store without its duplicate records, and what was left out."""

    view: TokenStore
    by_source: dict[str, int]  # input -> records dropped as duplicates
    rejects: list[tuple[int, int, RecordError]]  # (sample_index, position, error naming the first occurrence)


def drop_duplicates(store: TokenStore) -> Dedup:
    """Return the store's records but those whose content repeats an earlier record's (see the module)."""
    keys = store.content_key
    if keys is None or len(keys) != len(store.lengths):
        raise UsageError(
            Opt("dedup", "exact"),
            " needs the records' content keys, which this token store lacks",
            hint=("pass ", Opt("cache", False)),
        )
    index = store.sample_index.astype(np.int64)
    first_row = np.ones(len(index), dtype=bool)
    first_row[1:] = index[1:] != index[:-1]
    rows = np.flatnonzero(first_row)
    record_keys = np.ascontiguousarray(keys[rows]).view([("a", "<u8"), ("b", "<u8")]).ravel()
    _, first, inverse = np.unique(record_keys, return_index=True, return_inverse=True)
    original = rows[first[inverse.ravel()]]  # per record: the store row of the first record with its content
    duplicate = original != rows
    dropped_rows = np.repeat(duplicate, np.diff(np.append(rows, len(index))))
    view = store_view(store, np.flatnonzero(~dropped_rows))
    n = int(duplicate.sum())
    if n:
        dropped = {**store.meta.dropped, REASON: int(store.meta.dropped.get(REASON, 0)) + n}
        view.meta = dataclasses.replace(view.meta, dropped=dropped)
    by_source: dict[str, int] = {}
    rejects = []
    for r, o in zip(rows[duplicate].tolist(), original[duplicate].tolist(), strict=True):
        source, _ = store.source_of(int(index[r]))
        by_source[source] = by_source.get(source, 0) + 1
        first_source, unit = store.source_of(int(index[o]))
        detail = (
            f"the same content as {where(first_source, unit, int(store.positions[o]))} (sample_index {int(index[o])})"
        )
        rejects.append((int(index[r]), int(store.positions[r]), RecordError(REASON, detail)))
    return Dedup(view=view, by_source=dict(sorted(by_source.items())), rejects=rejects)


def summary(result: Dedup) -> DedupSummary:
    """The summary's ``dedup``: the records dropped as duplicates, in all and per input."""
    return DedupSummary(mode="exact", duplicates=sum(result.by_source.values()), by_source=result.by_source)
