"""Repeats of a mix in the plan: copies of a record that share a row are swapped with samples of other
rows (``part_repeats``, as ``packcli.plan.mix`` describes), and the warning for those that stay
(``same_row_warning``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from packcli.errors import Message, Opt
from packcli.plan import balance, packing
from packcli.plan.mix_types import Mix
from packcli.plan.options import PlanOptions
from packcli.plan.planner import Plan

SEARCH = 4096  # most samples looked at to part one repeated copy from its twin


def part_repeats(options: PlanOptions, mix: Mix, plan: Plan) -> None:
    """Part copies of a record that share a row (see the module docstring); count those that stay."""
    view = mix.view
    keys = view.sample_index.astype(np.int64) * (1 << 24) + view.piece_index.astype(np.int64)
    pos_key = keys[plan.store_rows]
    counts = np.diff(plan.row_start)
    row_of = np.repeat(np.arange(len(counts)), counts)
    # Is any key twice in one row? (rows hold ascending view rows, so twins are neighbours)
    twin = np.zeros(len(pos_key), dtype=bool)
    twin[1:] = (pos_key[1:] == pos_key[:-1]) & (row_of[1:] == row_of[:-1])
    conflicts = np.flatnonzero(twin)
    if not len(conflicts):
        return
    padded = packing.pad_lengths(plan.lengths.astype(np.int64), options.pad_multiple, options.pad_offset)
    row_tokens = np.bincount(row_of, weights=padded, minlength=len(counts)).astype(np.int64)
    fixed = set(plan.order.dropped_rows.tolist())
    movable = np.flatnonzero(~np.isin(row_of, list(fixed))) if fixed else np.arange(len(pos_key))
    by_length: dict[int, list[int]] = {}
    for p in movable.tolist():
        by_length.setdefault(int(padded[p]), []).append(p)
    lengths_known = np.array(sorted(by_length), dtype=np.int64)
    row_keys: dict[int, dict[int, int]] = {}

    def keys_of(r: int) -> dict[int, int]:
        if r not in row_keys:
            found: dict[int, int] = {}
            for k in pos_key[plan.row_start[r] : plan.row_start[r + 1]].tolist():
                found[k] = found.get(k, 0) + 1
            row_keys[r] = found
        return row_keys[r]

    touched: set[int] = set()
    stuck = 0
    # Rows may change lengths when the row order can be made again without changing what is written: one
    # rank, or no rows left out by --world-size (then the order is made again from the new row lengths).
    free = options.world_size == 1 or not len(plan.order.dropped_rows)
    resized = False
    for p in conflicts.tolist():
        a = int(row_of[p])
        if a in fixed:  # a row --world-size leaves out: not written
            continue
        kp, lp = int(pos_key[p]), int(padded[p])
        if keys_of(a).get(kp, 0) < 2:  # parted already (this position took another sample in a swap)
            continue
        room_a = options.max_len - int(row_tokens[a])
        # Same padded length first, then (one rank only) the nearest lengths that fit row a.
        tries = _lengths_to_try(lp, room_a, lengths_known if free else None)
        done = False
        looked = 0
        for length in tries:
            for q in by_length.get(length, []):
                looked += 1
                if looked > SEARCH:
                    break
                b = int(row_of[q])
                kq = int(pos_key[q])
                if b == a or kp in keys_of(b) or kq in keys_of(a):
                    continue
                if options.max_len - int(row_tokens[b]) < lp - length:
                    continue
                _swap(plan, p, q)
                pos_key[p], pos_key[q] = kq, kp
                padded[p], padded[q] = length, lp
                row_of_keys_a, row_of_keys_b = keys_of(a), keys_of(b)
                row_of_keys_a[kp] -= 1
                row_of_keys_a[kq] = row_of_keys_a.get(kq, 0) + 1
                row_of_keys_b[kq] -= 1
                if not row_of_keys_b[kq]:
                    del row_of_keys_b[kq]
                row_of_keys_b[kp] = 1
                row_tokens[a] += length - lp
                row_tokens[b] += lp - length
                resized = resized or length != lp
                by_length[length].remove(q)
                by_length[length].append(p)
                by_length[lp].remove(p)
                by_length[lp].append(q)
                touched.update((a, b))
                done = True
                break
            if done or looked > SEARCH:
                break
        if not done:
            stuck += 1
    for r in sorted(touched):  # a row's samples ascend (by view row: sample_index, then piece)
        lo, hi = int(plan.row_start[r]), int(plan.row_start[r + 1])
        order = np.argsort(plan.store_rows[lo:hi], kind="stable") + lo
        plan.store_rows[lo:hi] = plan.store_rows[order]
        plan.lengths[lo:hi] = plan.lengths[order]
        plan.skips[lo:hi] = plan.skips[order]
    if resized and options.world_size > 1:  # the ranks' balance, from the rows' new lengths
        costs = balance.balance_costs(options, padded, plan.row_start)
        plan.order = packing.order_rows(row_tokens, options.seed, options.world_size, options.rank_remainder, costs)
    mix.repeats_in_same_row = stuck


def _lengths_to_try(length: int, room: int, known: np.ndarray | None) -> Iterator[int]:
    """The padded lengths to look for a swap partner in: ``length``, then the nearest others that fit."""
    yield length
    if known is None:
        return
    near = np.argsort(np.abs(known - length), kind="stable")
    for i in near.tolist():
        other = int(known[i])
        if other != length and other - length <= room:
            yield other


def _swap(plan: Plan, p: int, q: int) -> None:
    for arr in (plan.store_rows, plan.lengths, plan.skips):
        arr[p], arr[q] = arr[q], arr[p]


def same_row_warning(n: int) -> Message:
    """The warning for repeated copies that share a row with their twin (no swap could part them)."""
    copies = "copy of a repeated record shares" if n == 1 else "copies of repeated records share"
    return Message(
        f"{n} {copies} a row with another copy (no sample of another row could take its place); "
        "lower the repeats or raise ",
        Opt("max_len"),
    )
