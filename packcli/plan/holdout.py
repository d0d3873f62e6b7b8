"""The eval split (``--eval-fraction F``, ``--eval-records N``): whole records held out into ``OUT/eval/``.

The records are chosen from the token store after ``--dedup`` (a duplicate reaches neither side) and
before ``--mix`` (the mix is of the training records only), so a new split re-packs from the cache.
The unit is a record (``sample_index``): all pieces of a record split by ``--overflow split`` are on one
side. Only records that can be packed are held out (under ``--overflow drop`` or ``error``, a record
with a sample longer than ``--max-len`` stays with the training records, whose plan drops it or stops).

Per source (each input, or each ``--mix`` source) of ``n`` such records:

- ``--eval-fraction F``: ``round(F * n)`` records, halves rounded up, at least 1 and at most ``n - 1``
  (a source with one record holds out none);
- ``--eval-records N``: N records shared by the sources in proportion to their records: each source
  gets the whole part of ``N * n / total``, and the records left over go one each to the sources with
  the largest fractional parts (the earlier source on a tie); no source gives all its records (what
  it cannot give goes to the next source by the same order).

Each source's records are taken in a seeded order (a permutation by ``--seed`` and the source's
position), so the same seed holds out the same records.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from packcli.errors import InputError
from packcli.plan.mix import store_view
from packcli.results import Split, StoreMeta
from packcli.store.tokens import TokenStore

STREAM = 0xE5A1  # the seed stream of the eval split, apart from the mix's
PATH = "eval"  # the eval output, inside the output directory


@dataclass
class Holdout:
    """The store's records on each side of the split, and what each source gave."""

    train: TokenStore
    eval: TokenStore
    names: list[str]  # the sources (inputs, or --mix sources)
    records: list[int]  # per source: records held out

    def by_source(self) -> dict[str, int]:
        return dict(zip(self.names, self.records, strict=True))


@dataclass(frozen=True)
class HoldoutOptions:
    """The eval split's options (``run.options.holdout_options``): --eval-fraction or --eval-records, and
    what decides which records can be packed (--overflow, the most tokens a sample holds) and drawn (--seed)."""

    fraction: float | None = None
    records: int | None = None
    overflow: str = "drop"
    sample_limit: int = 4096
    seed: int = 0


def split_counts(options: HoldoutOptions, have: list[int]) -> list[int]:
    """The records each source holds out, given the records ``have`` it can pack (see the module)."""
    if options.fraction is not None:
        f = options.fraction
        counts = [min(max(math.floor(f * n + 0.5), 1), n - 1) if n >= 2 else 0 for n in have]
        if not sum(counts):
            raise InputError(
                f"{f:g} holds out no record: each source needs at least 2 records that can be "
                "packed; give more records or leave out the eval split",
                option="eval_fraction",
            )
        return counts
    want = int(options.records or 0)
    total = sum(have)
    room = [max(n - 1, 0) for n in have]
    if want >= total or want > sum(room):
        raise InputError(
            f"{want}: the sources have {total} records that can be packed and each keeps at least "
            f"one, so at most {sum(room)} can be held out; ask for fewer",
            option="eval_records",
        )
    quota = [want * n / total for n in have]
    counts = [min(math.floor(q), r) for q, r in zip(quota, room, strict=True)]
    order = sorted(range(len(have)), key=lambda s: (-(quota[s] - math.floor(quota[s])), s))
    while sum(counts) < want:
        for s in order:
            if sum(counts) < want and counts[s] < room[s]:
                counts[s] += 1
    return counts


def hold_out(options: HoldoutOptions, store: TokenStore, of_inputs: list[int], names: list[str]) -> Holdout:
    """Split the store's records into training and eval records; ``of_inputs``: each input's source."""
    if len(of_inputs) != len(store.meta.source_starts):
        raise InputError("the inputs changed while the eval split was made (files came or went); run again")
    index = store.sample_index.astype(np.int64)
    new = np.ones(len(index), dtype=bool)
    new[1:] = index[1:] != index[:-1]
    first = np.flatnonzero(new)
    size = np.diff(np.append(first, len(index)))
    starts = np.asarray(store.meta.source_starts, dtype=np.int64)
    of_input = np.asarray(of_inputs, dtype=np.int64)
    unit_src = of_input[np.searchsorted(starts, index[first], side="right") - 1] if len(first) else first
    eligible = np.ones(len(first), dtype=bool)
    if options.overflow in ("drop", "error"):
        too_long = store.lengths.astype(np.int64) > options.sample_limit
        eligible = np.bincount(np.cumsum(new) - 1, weights=too_long, minlength=len(first)) == 0
    have = [int((eligible & (unit_src == s)).sum()) for s in range(len(names))]
    counts = split_counts(options, have)
    held = np.zeros(len(first), dtype=bool)
    for s, k in enumerate(counts):
        units = np.flatnonzero(eligible & (unit_src == s))
        rng = np.random.default_rng([options.seed, STREAM, s])
        held[units[rng.permutation(len(units))[:k]]] = True
    rows = np.repeat(held, size)
    train = store_view(store, np.flatnonzero(~rows))
    evals = store_view(store, np.flatnonzero(rows))
    evals.meta = eval_meta(store.meta, int(held.sum()), held, size, store.piece_index[first])
    return Holdout(train=train, eval=evals, names=names, records=counts)


def eval_meta(meta: StoreMeta, records: int, held: np.ndarray, size: np.ndarray, first_piece: np.ndarray) -> StoreMeta:
    """The eval view's store metadata: its records as those read, nothing dropped before the plan.

    Records dropped before tokenizing, the pieces the workers left out, the turns fixed, the empty
    answers and the reasoning left out are the whole run's, counted in the training output's summary;
    ``split`` counts the eval records that have more than one piece, and their pieces.
    """
    split = None
    if meta.split is not None:
        pieced = held & ((size > 1) | (first_piece > 0))
        split = Split(pieces=int(size[pieced].sum()), pieces_left_out={}, records_split=int(pieced.sum()))
    return dataclasses.replace(
        meta,
        records_read=records,
        dropped={},
        turns_fixed=None,
        empty_answers=None,
        leading_answers=None,
        tools_left_out=None,
        reasoning=None,
        expanded=None,
        trees=None,
        split=split,
    )
