"""Stage 2: the plan, from sample lengths alone: what is dropped or cut, the rows (FFD/BFD), their order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packcli.config import Hint, PackConfig, suggest
from packcli.contract import IGNORE_INDEX
from packcli.errors import InputError, Opt, Part
from packcli.plan import packing, pairs
from packcli.store.tokens import (
    TokenStore,
)
from packcli.tokenize.worker import where


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


def make_plan(config: PackConfig, store: TokenStore) -> Plan:
    """Apply the overflow policy and compute the bin plan from the sample lengths alone.

    The samples of a preference or KTO record are one item (``packcli.plan.pairs``): packed in one row,
    dropped or truncated together.
    """
    lengths = store.lengths.astype(np.int64)
    group = pairs.groups(store)
    # With --pad-to-multiple-of, a sample fits when its padded length does: at most sample_limit tokens.
    max_len = config.sample_limit
    drop_rows: dict[str, np.ndarray] = {}
    too_long = lengths > max_len
    keep = ~too_long
    eff = np.minimum(lengths, max_len)
    truncated = 0
    if config.overflow == "error" and too_long.any() and group is None:
        k = int(np.flatnonzero(too_long)[0])
        source, unit = source_of(store, int(store.sample_index[k]))
        raise InputError(
            f"{where(source, unit, int(store.positions[k]))}: the sample has {lengths[k]} tokens, more than ",
            *_limit_parts(config),
            hint=("raise ", Opt("max_len"), " or pass ", Opt("overflow", "split", "truncate", "drop")),
        )
    cut_rows = np.zeros(0, dtype=np.int64)
    trained_in_window = np.zeros(0, dtype=np.int64)
    skip = np.zeros(len(lengths), dtype=np.int64)
    if group is not None:
        # Preference data: whole records fit, are cut (their prompts, from the left) or are dropped.
        fit = pairs.fit(config, store, group)
        keep, eff, skip, truncated = fit.keep, fit.lengths, fit.skips, fit.truncated
        drop_rows.update(fit.drop_rows)
    elif config.overflow in ("truncate", "split"):
        # --overflow split leaves only exchanges that fit in no row on their own too long: they are
        # truncated as --overflow truncate does, from the left unless --truncate-side right is given.
        cut_rows = np.flatnonzero(too_long)
        trained_in_window = _trained_in_windows(store, cut_rows, max_len, config.cut_side)
        nothing = np.zeros(len(lengths), dtype=bool)
        nothing[cut_rows[trained_in_window == 0]] = True
        keep = ~nothing
        truncated = int(len(cut_rows) - nothing.sum())
        if nothing.any():
            drop_rows["nothing_to_train_after_truncation"] = np.flatnonzero(nothing)
    elif too_long.any():
        drop_rows["too_long"] = np.flatnonzero(too_long)
    if config.cut_side == "left" and group is None:
        skip[too_long] = lengths[too_long] - max_len
    kept = np.flatnonzero(keep)
    if len(kept) == 0:
        if len(lengths):
            hints: list[Hint] = [(None, "raise --max-len")]
            if group is not None:  # a record's samples are never split; its prompt may be cut
                hints.append((("overflow", "truncate"), "pass --overflow truncate"))
            else:
                hints.append((("overflow", "split"), "pass --overflow split"))
            if config.overflow != "drop" and group is None:
                hints.append((("cut_side", "left"), "pass --truncate-side left"))
            raise InputError(
                f"no sample left to pack: all {len(lengths)} tokenized samples are longer than "
                f"{_limit_text(config)} or have nothing to train on; {suggest(config, hints)}"
            )
        reasons = ", ".join(f"{k}: {v}" for k, v in store.meta["dropped"].items())
        raise InputError(
            f"no sample left to pack: all {store.meta['records_read']} records were dropped ({reasons}); "
            "list them with --on-error skip --rejects FILE"
        )
    kept_len = eff[kept]
    # Rows are planned on the lengths as written: each sample padded to a multiple of --pad-to-multiple-of.
    padded_len = packing.pad_lengths(kept_len, config.pad_multiple, config.pad_offset)
    items_len = padded_len
    if group is not None:
        # One item per record: its samples' padded lengths summed; each sample goes where its item goes.
        _, item_of = np.unique(group[kept], return_inverse=True)
        items_len = np.bincount(item_of, weights=padded_len).astype(np.int64)
        bins = packing.plan_rows(items_len, config.max_len, config.algorithm)[item_of]
    else:
        bins = packing.plan_rows(padded_len, config.max_len, config.algorithm)
    by_row = np.argsort(bins, kind="stable")
    store_rows = kept[by_row]
    row_lengths = kept_len[by_row]
    row_skips = skip[store_rows]
    counts = np.bincount(bins)
    row_start = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=row_start[1:])
    row_tokens = np.bincount(bins, weights=padded_len).astype(np.int64)
    order = packing.order_rows(row_tokens, config.seed, config.world_size, config.rank_remainder)
    if len(order.order) == 0:
        raise InputError(
            f"no sample left to pack: the {len(counts)} packed rows are fewer than --world-size "
            f"{config.world_size}, and --rank-remainder drop leaves none; lower --world-size or pass "
            "--rank-remainder pad"
        )
    dropped_samples = np.zeros(0, dtype=np.int64)
    if len(order.dropped_rows):
        dropped_samples = np.concatenate([store_rows[row_start[r] : row_start[r + 1]] for r in order.dropped_rows])
        drop_rows["world_size_remainder"] = dropped_samples
    trainable_per_sample = store.trainable.astype(np.int64)
    trainable_per_sample[cut_rows] = trained_in_window
    trainable = int(trainable_per_sample[kept].sum() - trainable_per_sample[dropped_samples].sum())
    return Plan(
        store_rows=store_rows,
        lengths=row_lengths,
        skips=row_skips,
        row_start=row_start,
        order=order,
        drop_rows=drop_rows,
        truncated=truncated,
        tokens=int(kept_len.sum()),
        trainable=trainable,
        n_rows=len(counts),
        bound_l1=packing.lower_bound_l1(items_len, config.max_len),
        bound_l2=packing.lower_bound_l2(items_len, config.max_len),
        alignment_padding=int(padded_len.sum() - kept_len.sum()),
    )


def _limit_parts(config: PackConfig) -> tuple[Part, ...]:
    """The most tokens a sample may have, as message parts (``_limit_text``'s words)."""
    if config.sample_limit == config.max_len:
        return (Opt("max_len"), f" {config.max_len}")
    return (
        f"{config.sample_limit}, the most that fits in ",
        Opt("max_len"),
        f" {config.max_len} once padded to a multiple of {config.pad_multiple}",
    )


def _limit_text(config: PackConfig) -> str:
    if config.sample_limit == config.max_len:
        return f"--max-len {config.max_len}"
    return (
        f"{config.sample_limit}, the most that fits in --max-len {config.max_len} once padded to a multiple of "
        f"{config.pad_multiple}"
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


def source_of(store: TokenStore, sample_index: int) -> tuple[str, str]:
    """Return (source path, position unit: line or record) of a sample."""
    sources = store.meta["sources"]
    k = int(np.searchsorted(np.asarray(store.meta["source_starts"]), sample_index, side="right")) - 1
    return sources[max(k, 0)]["path"], sources[max(k, 0)]["unit"]
