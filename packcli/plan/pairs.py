"""The plan's rule for preference data: a record's samples are one item, never apart.

A preference record's chosen and rejected samples (and a KTO record's one sample) are an item whose
length is the sum of its samples' padded lengths. An item fits when that sum fits in ``--max-len``.
One that does not follows ``--overflow``: ``drop`` leaves the record out (``too_long``), ``error``
stops the run naming it, and ``truncate`` cuts the same number of tokens from the left of every
sample of the record (the start of the shared prompt), as few as make the item fit, never a trained
token: a record whose completions alone do not fit is dropped as ``too_long``. ``--overflow split``
does not apply (the pipeline refuses it before tokenizing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packcli.contract import CHOSEN, REJECTED
from packcli.errors import InputError, Opt, where
from packcli.plan import packing
from packcli.plan.options import PlanOptions
from packcli.store.tokens import TokenStore


@dataclass
class Fit:
    """What the overflow policy makes of every sample of a grouped store."""

    keep: np.ndarray  # bool per store row
    lengths: np.ndarray  # int64: the length each sample keeps
    skips: np.ndarray  # int64: tokens cut from its start
    truncated: int  # records cut
    drop_rows: dict[str, np.ndarray]


def groups(store: TokenStore) -> np.ndarray | None:
    """Return each store row's item id when the store holds preference or KTO samples, else None.

    A rejected sample joins the chosen sample just before it (the same record); every other sample is
    an item of its own.
    """
    role = store.sample_role
    if role is None or not role.any():
        return None
    joins = np.zeros(len(role), dtype=bool)
    joins[1:] = (role[1:] == REJECTED) & (role[:-1] == CHOSEN) & (store.sample_index[1:] == store.sample_index[:-1])
    return np.cumsum(~joins) - 1


def fit(options: PlanOptions, store: TokenStore, group: np.ndarray) -> Fit:
    """Apply --overflow to every item of ``group`` (see the module docstring)."""
    lengths = store.lengths.astype(np.int64)
    padded = packing.pad_lengths(lengths, options.pad_multiple, options.pad_offset)
    item_len = np.bincount(group, weights=padded).astype(np.int64)
    member_over = np.bincount(group, weights=lengths > options.sample_limit).astype(bool)
    over = np.flatnonzero((item_len > options.max_len) | member_over)
    keep = np.ones(len(lengths), dtype=bool)
    skips = np.zeros(len(lengths), dtype=np.int64)
    drop_rows: dict[str, np.ndarray] = {}
    truncated = 0
    if not len(over):
        return Fit(keep, lengths, skips, 0, drop_rows)
    first_row = np.searchsorted(group, over)
    if options.overflow == "error":
        k = int(first_row[0])
        source, unit = store.source_of(int(store.sample_index[k]))
        pair = int(np.count_nonzero(group == over[0])) > 1
        what = "the pair's samples have" if pair else "the sample has"
        raise InputError(
            f"{where(source, unit, int(store.positions[k]))}: {what} {item_len[over[0]]} tokens"
            f"{' together' if pair else ''}, more than ",
            Opt("max_len"),
            f" {options.max_len}{' (a pair is packed whole)' if pair else ''}",
            hint=(
                "raise ",
                Opt("max_len"),
                " or pass ",
                Opt("overflow", "truncate"),
                " (cuts the prompt from the left) or drop",
            ),
        )
    dropped = []
    end_row = np.searchsorted(group, over, side="right")
    for a, b in zip(first_row.tolist(), end_row.tolist(), strict=True):
        cut = _prompt_cut(options, lengths[a:b], store.first_trained[a:b]) if options.overflow == "truncate" else None
        if cut is None:
            dropped.append(np.arange(a, b))
            continue
        skips[a:b] = cut
        truncated += 1
    gone = np.concatenate(dropped) if dropped else np.zeros(0, np.int64)
    keep[gone] = False
    if len(gone):
        drop_rows["too_long"] = gone
    return Fit(keep, lengths - skips, skips, truncated, drop_rows)


def _prompt_cut(options: PlanOptions, lengths: np.ndarray, first_trained: np.ndarray) -> int | None:
    """Return the fewest tokens to cut from the left of every sample so that they fit together, or None.

    At most up to each sample's first trained token, less one: the token before it stays, so every
    trained token keeps the context it is predicted from.
    """
    most = int(first_trained.min()) - 1
    n = len(lengths)
    cut = max(0, -(-(int(lengths.sum()) - options.max_len) // n))
    while cut <= most:
        kept = lengths - cut
        padded = packing.pad_lengths(kept, options.pad_multiple, options.pad_offset)
        if int(padded.sum()) <= options.max_len and int(kept.max()) <= options.sample_limit:
            return cut
        cut += 1
    return None
