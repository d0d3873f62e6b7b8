"""Stage 2: the plan, from sample lengths alone: what is dropped or cut, the rows (FFD/BFD), their order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packcli import packing
from packcli.cache import (
    TokenStore,
)
from packcli.config import PackConfig
from packcli.errors import InputError
from packcli.worker import where


@dataclass
class Plan:
    """Which samples go in which row, and in what order rows are written."""

    store_rows: np.ndarray  # kept samples' store rows, grouped by row, ascending sample_index in a row
    lengths: np.ndarray  # their lengths in the row (truncated where needed)
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
    """Apply the overflow policy and compute the bin plan from the sample lengths alone."""
    lengths = store.lengths.astype(np.int64)
    # With --pad-to-multiple-of, a sample fits when its padded length does: at most sample_limit tokens.
    max_len = config.sample_limit
    drop_rows: dict[str, np.ndarray] = {}
    too_long = lengths > max_len
    keep = ~too_long
    eff = np.minimum(lengths, max_len)
    truncated = 0
    if config.overflow == "error" and too_long.any():
        k = int(np.flatnonzero(too_long)[0])
        source, unit = source_of(store, int(store.sample_index[k]))
        raise InputError(
            f"{where(source, unit, int(store.positions[k]))}: the sample has {lengths[k]} tokens, "
            f"more than {_limit_text(config)}; raise --max-len or pass --overflow drop or truncate"
        )
    if config.overflow == "truncate":
        nothing = too_long & (store.first_trained >= max_len)
        keep = ~nothing
        truncated = int((too_long & ~nothing).sum())
        if nothing.any():
            drop_rows["nothing_to_train_after_truncation"] = np.flatnonzero(nothing)
    elif too_long.any():
        drop_rows["too_long"] = np.flatnonzero(too_long)
    kept = np.flatnonzero(keep)
    if len(kept) == 0:
        if len(lengths):
            raise InputError(
                f"no sample left to pack: all {len(lengths)} tokenized samples are longer than "
                f"{_limit_text(config)} or have nothing to train on; raise --max-len"
            )
        reasons = ", ".join(f"{k}: {v}" for k, v in store.meta["dropped"].items())
        raise InputError(
            f"no sample left to pack: all {store.meta['records_read']} records were dropped ({reasons}); "
            "list them with --on-error skip --rejects FILE"
        )
    kept_len = eff[kept]
    # Rows are planned on the lengths as written: each sample padded to a multiple of --pad-to-multiple-of.
    padded_len = packing.pad_lengths(kept_len, config.pad_multiple, config.pad_offset)
    bins = packing.plan_rows(padded_len, config.max_len, config.algorithm)
    by_row = np.argsort(bins, kind="stable")
    store_rows = kept[by_row]
    row_lengths = kept_len[by_row]
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
    trainable_per_sample = _trainable_in_rows(store, kept, eff)
    trainable = int(trainable_per_sample[kept].sum() - trainable_per_sample[dropped_samples].sum())
    return Plan(
        store_rows=store_rows,
        lengths=row_lengths,
        row_start=row_start,
        order=order,
        drop_rows=drop_rows,
        truncated=truncated,
        tokens=int(kept_len.sum()),
        trainable=trainable,
        n_rows=len(counts),
        bound_l1=packing.lower_bound_l1(padded_len, config.max_len),
        bound_l2=packing.lower_bound_l2(padded_len, config.max_len),
        alignment_padding=int(padded_len.sum() - kept_len.sum()),
    )


def _limit_text(config: PackConfig) -> str:
    if config.sample_limit == config.max_len:
        return f"--max-len {config.max_len}"
    return (
        f"{config.sample_limit}, the most that fits in --max-len {config.max_len} once padded to a multiple of "
        f"{config.pad_multiple}"
    )


def _trainable_in_rows(store: TokenStore, kept: np.ndarray, eff: np.ndarray) -> np.ndarray:
    """Return each sample's labelled tokens as written (reads only the labels cut off by truncation)."""
    trainable = store.trainable.astype(np.int64)
    cut = kept[eff[kept] < store.lengths[kept]]
    if len(cut):
        cut_off = store.lengths[cut] - eff[cut]
        with store.open_tokens() as reader:
            _, tails = reader.gather(store.starts[cut] + eff[cut], cut_off)
        owner = np.repeat(np.arange(len(cut)), cut_off)
        trainable[cut] -= np.bincount(owner, weights=tails != -100, minlength=len(cut)).astype(np.int64)
    return trainable


def source_of(store: TokenStore, sample_index: int) -> tuple[str, str]:
    """Return (source path, position unit: line or record) of a sample."""
    sources = store.meta["sources"]
    k = int(np.searchsorted(np.asarray(store.meta["source_starts"]), sample_index, side="right")) - 1
    return sources[max(k, 0)]["path"], sources[max(k, 0)]["unit"]
