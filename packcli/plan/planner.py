"""Stage 2: the plan, from sample lengths alone: what is dropped or cut, the rows (FFD/BFD), their order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packcli.config import Hint, suggest
from packcli.contract import IGNORE_INDEX
from packcli.errors import InputError, Opt, Part, where
from packcli.plan import balance, packing, pairs
from packcli.plan.options import PlanOptions
from packcli.store.tokens import TokenStore


@dataclass
class Plan:
    """Which samples go in which row, and in what order rows are written."""

    store_rows: np.ndarray  # kept samples' store rows, grouped by row, ascending sample_index in a row
    lengths: np.ndarray  # their lengths in the row (truncated where needed)
    skips: np.ndarray  # tokens left out at their start (--truncate-side left), 0 for the others
    row_start: np.ndarray  # start of each row in store_rows (len rows + 1)
    order: packing.RowOrder
    drop_rows: dict[str, np.ndarray]  # store rows of the samples the plan leaves out, by reason
    truncated: int
    tokens: int
    trainable: int
    n_rows: int
    bound_l1: int
    bound_l2: int
    alignment_padding: int = 0  # tokens added by --pad-to-multiple-of (all kept samples)


def make_plan(options: PlanOptions, store: TokenStore) -> Plan:
    """Apply the overflow policy and compute the bin plan from the sample lengths alone.

    The samples of a preference or KTO record are one item (``packcli.plan.pairs``): packed in one row,
    dropped or truncated together.
    """
    group = pairs.groups(store)
    over = _apply_overflow(options, store, group)
    kept = np.flatnonzero(over.keep)
    if len(kept) == 0:
        _refuse_nothing_kept(options, store, group, len(store.lengths))
    kept_len = over.lengths[kept]
    skip, drop_rows = over.skips, over.drop_rows
    # The plan holds a few arrays per kept sample: every temporary as long as the store goes as soon as
    # it has served (10M samples: 80 MB each).
    cut_rows, trained_in_window, truncated = over.cut_rows, over.trained_in_window, over.truncated
    del over
    bins, padded_len, items_len = _plan_bins(options, group, kept, kept_len)
    counts = np.bincount(bins)
    row_tokens = np.bincount(bins, weights=padded_len).astype(np.int64)
    by_row = np.argsort(bins, kind="stable")
    del bins
    store_rows = kept[by_row]
    row_lengths = kept_len[by_row]
    row_padded = padded_len[by_row] if options.balance == "compute" else None  # what rows' costs weigh
    del by_row
    row_skips = skip[store_rows]
    del skip
    row_start = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=row_start[1:])
    costs = None if row_padded is None else balance.balance_costs(options, row_padded, row_start)
    del row_padded
    order = packing.order_rows(row_tokens, options.seed, options.world_size, options.rank_remainder, costs)
    if len(order.order) == 0:
        raise InputError(
            f"no sample left to pack: the {len(counts)} packed rows are fewer than ",
            Opt("world_size"),
            f" {options.world_size}, and ",
            Opt("rank_remainder", "drop"),
            " leaves none",
            hint=("lower ", Opt("world_size"), " or pass ", Opt("rank_remainder", "pad")),
        )
    dropped_samples = np.zeros(0, dtype=np.int64)
    if len(order.dropped_rows):
        dropped_samples = np.concatenate([store_rows[row_start[r] : row_start[r + 1]] for r in order.dropped_rows])
        drop_rows["world_size_remainder"] = dropped_samples
    trainable = _trainable(store.trainable, kept, cut_rows, trained_in_window, dropped_samples)
    tokens = int(kept_len.sum())
    del kept, kept_len
    return Plan(
        store_rows=store_rows,
        lengths=row_lengths,
        skips=row_skips,
        row_start=row_start,
        order=order,
        drop_rows=drop_rows,
        truncated=truncated,
        tokens=tokens,
        trainable=trainable,
        n_rows=len(counts),
        bound_l1=packing.lower_bound_l1(items_len, options.max_len),
        bound_l2=packing.lower_bound_l2(items_len, options.max_len),
        alignment_padding=int(padded_len.sum()) - tokens,
    )


@dataclass
class _Overflow:
    """What the overflow policy makes of every sample of the store: kept or not, its length, its cut."""

    keep: np.ndarray  # the samples the plan packs
    lengths: np.ndarray  # each sample's length in its row (at most the sample limit)
    skips: np.ndarray  # tokens left out at its start (--truncate-side left)
    truncated: int
    drop_rows: dict[str, np.ndarray]  # store rows of the samples left out, by reason
    cut_rows: np.ndarray  # store rows of the samples cut to the limit
    trained_in_window: np.ndarray  # the trained tokens each cut sample keeps


def _apply_overflow(options: PlanOptions, store: TokenStore, group: np.ndarray | None) -> _Overflow:
    """Return what --overflow (or, for preference records, their fit) makes of each sample; refuse with error."""
    lengths = store.lengths.astype(np.int64)
    # With --pad-to-multiple-of, a sample fits when its padded length does: at most sample_limit tokens.
    max_len = options.sample_limit
    drop_rows: dict[str, np.ndarray] = {}
    too_long = lengths > max_len
    keep = ~too_long
    eff = np.minimum(lengths, max_len)
    truncated = 0
    if options.overflow == "error" and too_long.any() and group is None:
        k = int(np.flatnonzero(too_long)[0])
        source, unit = store.source_of(int(store.sample_index[k]))
        raise InputError(
            f"{where(source, unit, int(store.positions[k]))}: the sample has {lengths[k]} tokens, more than ",
            *_limit_parts(options),
            hint=("raise ", Opt("max_len"), " or pass ", Opt("overflow", "split", "truncate", "drop")),
        )
    cut_rows = np.zeros(0, dtype=np.int64)
    trained_in_window = np.zeros(0, dtype=np.int64)
    skip = np.zeros(len(lengths), dtype=np.int64)
    if group is not None:
        # Preference data: whole records fit, are cut (their prompts, from the left) or are dropped.
        fit = pairs.fit(options, store, group)
        keep, eff, skip, truncated = fit.keep, fit.lengths, fit.skips, fit.truncated
        drop_rows.update(fit.drop_rows)
    elif options.overflow in ("truncate", "split"):
        # --overflow split leaves only exchanges that fit in no row on their own too long: they are
        # truncated as --overflow truncate does, from the left unless --truncate-side right is given.
        cut_rows = np.flatnonzero(too_long)
        trained_in_window = _trained_in_windows(store, cut_rows, max_len, options.cut_side)
        nothing = np.zeros(len(lengths), dtype=bool)
        nothing[cut_rows[trained_in_window == 0]] = True
        keep = ~nothing
        truncated = int(len(cut_rows) - nothing.sum())
        if nothing.any():
            drop_rows["nothing_to_train_after_truncation"] = np.flatnonzero(nothing)
    elif too_long.any():
        drop_rows["too_long"] = np.flatnonzero(too_long)
    if options.cut_side == "left" and group is None:
        skip[too_long] = lengths[too_long] - max_len
    return _Overflow(keep, eff, skip, truncated, drop_rows, cut_rows, trained_in_window)


def _refuse_nothing_kept(options: PlanOptions, store: TokenStore, group: np.ndarray | None, samples: int) -> None:
    """Raise the error of a plan with no sample left, saying why and what would keep some."""
    if samples:
        hints: list[Hint] = [(None, ("raise ", Opt("max_len")))]
        if group is not None:  # a record's samples are never split; its prompt may be cut
            hints.append((("overflow", "truncate"), ("pass ", Opt("overflow", "truncate"))))
        else:
            hints.append((("overflow", "split"), ("pass ", Opt("overflow", "split"))))
        if options.overflow != "drop" and group is None:
            hints.append((("cut_side", "left"), ("pass ", Opt("truncate_side", "left"))))
        raise InputError(
            f"no sample left to pack: all {samples} tokenized samples are longer than ",
            *_limit_parts(options),
            " or have nothing to train on",
            hint=suggest(options, hints),
        )
    reasons = ", ".join(f"{k}: {v}" for k, v in store.meta.dropped.items())
    raise InputError(
        f"no sample left to pack: all {store.meta.records_read} records were dropped ({reasons})",
        hint=("list them with ", Opt("on_error", "skip"), " ", Opt("rejects"), " FILE"),
    )


def _plan_bins(
    options: PlanOptions, group: np.ndarray | None, kept: np.ndarray, kept_len: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return each kept sample's row, its padded length, and the lengths of the items packed (a record's, summed)."""
    # Rows are planned on the lengths as written: each sample padded to a multiple of --pad-to-multiple-of.
    padded_len = (
        kept_len
        if options.pad_multiple <= 1
        else packing.pad_lengths(kept_len, options.pad_multiple, options.pad_offset)
    )
    if group is None:
        return packing.plan_rows(padded_len, options.max_len, options.algorithm), padded_len, padded_len
    # One item per record: its samples' padded lengths summed; each sample goes where its item goes.
    _, item_of = np.unique(group[kept], return_inverse=True)
    items_len = np.bincount(item_of, weights=padded_len).astype(np.int64)
    bins = packing.plan_rows(items_len, options.max_len, options.algorithm)[item_of]
    return bins, padded_len, items_len


def _trainable(
    per_sample: np.ndarray, kept: np.ndarray, cut: np.ndarray, in_window: np.ndarray, dropped: np.ndarray
) -> int:
    """Return the trained tokens of the kept samples less those of ``dropped``; a cut sample (store rows
    ``cut``, all kept or dropped by the plan) counts the trained tokens of its window (``in_window``).

    Summed from the int32 counts without an int64 copy of them (numpy sums int32 in int64).
    """
    trainable = int(per_sample[kept].sum()) - int(per_sample[dropped].sum())
    if len(cut):
        change = np.zeros(len(per_sample), dtype=np.int64)  # rare: truncated samples only
        change[cut] = in_window.astype(np.int64) - per_sample[cut]
        trainable += int(change[kept].sum()) - int(change[dropped].sum())
    return trainable


def _limit_parts(options: PlanOptions) -> tuple[Part, ...]:
    """The most tokens a sample may have, as message parts."""
    if options.sample_limit == options.max_len:
        return (Opt("max_len"), f" {options.max_len}")
    return (
        f"{options.sample_limit}, the most that fits in ",
        Opt("max_len"),
        f" {options.max_len} once padded to a multiple of {options.pad_multiple}",
    )


WINDOW_TOKENS = 1 << 24  # tokens of cut samples' windows read at once


def _trained_in_windows(store: TokenStore, rows: np.ndarray, max_len: int, side: str) -> np.ndarray:
    """Return the trained tokens each cut sample keeps in its ``max_len`` window (``side`` right: its head).

    The window's first token takes no loss (it is a sample's first token), so it is not counted. Only
    the windows are read, a batch of samples at a time.
    """
    out = np.zeros(len(rows), dtype=np.int64)
    if not len(rows):
        return out
    with store.open_tokens() as reader:
        per = max(1, WINDOW_TOKENS // max_len)
        for b in range(0, len(rows), per):
            part = rows[b : b + per]
            skip = store.lengths[part].astype(np.int64) - max_len if side == "left" else np.zeros(len(part), np.int64)
            _, labels = reader.gather(store.starts[part] + skip, np.full(len(part), max_len, dtype=np.int64))
            trained = (labels != IGNORE_INDEX).reshape(len(part), max_len)[:, 1:]
            out[b : b + len(part)] = trained.sum(axis=1)
    return out
