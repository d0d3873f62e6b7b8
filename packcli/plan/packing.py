"""Bin packing of sample lengths into fixed-capacity rows, lower bounds, and rank-balanced row order.

Pure numpy: no I/O, no printing. Every function is deterministic; randomness comes only from an
explicit seed.

Packing works per distinct size rather than per item. Sizes are visited in decreasing order; for a
run of ``c`` items of size ``s``, textbook first-fit (or best-fit) decreasing fills the bins that
currently have room for ``s`` ("eligible" bins) one after another, each bin ``j`` taking
``residual_j // s`` items, until the run is placed, then opens new bins holding ``capacity // s``
items each. A bin that is filled this way drops below ``s`` and leaves the eligible set; it comes
back when the current size falls to its residual. Bins waiting to come back are kept in a calendar
keyed by the step (distinct-size index) at which they become eligible again, so a step costs
(amortised, up to log factors) time in proportion to the bins it touches and releases, not to
the number of open bins. Items larger than half the capacity never share a bin and are placed in
one vectorised pass first. Finally the per-bin counts are expanded to per-item bin ids over the
stable size-sorted item order.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

__all__ = [
    "RowOrder",
    "best_fit_decreasing",
    "first_fit_decreasing",
    "lower_bound_l1",
    "lower_bound_l2",
    "order_rows",
    "pad_lengths",
    "plan_rows",
    "rank_token_spread",
]

_NEVER = np.iinfo(np.int64).max
_EMPTY = np.zeros(0, dtype=np.int64)
# Above this capacity (and above a few times the item count) distinct sizes are found by sorting
# instead of a histogram of length capacity + 1.
_HISTOGRAM_LIMIT = 1 << 22


def _check_capacity(capacity: int) -> int:
    """Return ``capacity`` as a Python int; raise ValueError unless it is an integer >= 1."""
    if isinstance(capacity, bool | np.bool_):
        raise ValueError(f"capacity must be an integer, got {capacity!r}")
    try:
        cap = operator.index(capacity)
    except TypeError:
        raise ValueError(f"capacity must be an integer, got {capacity!r}") from None
    if cap < 1:
        raise ValueError(f"capacity must be >= 1, got {cap}")
    return cap


def _check_lengths(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, int]:
    """Return the lengths as a 1-D int64 array and the capacity as an int, or raise ValueError."""
    cap = _check_capacity(capacity)
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be a 1-D array, got shape {arr.shape}")
    if arr.size == 0:
        return _EMPTY.copy(), cap
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"lengths must have an integer dtype, got {arr.dtype}")
    lo = int(arr.min())
    hi = int(arr.max())
    if lo < 1:
        raise ValueError(f"every length must be >= 1, found {lo}")
    if hi > cap:
        raise ValueError(f"every length must be <= capacity {cap}, found {hi}")
    return arr.astype(np.int64, copy=False), cap


def _narrow_dtype(distinct: int) -> type[np.unsignedinteger]:
    """Return the smallest unsigned dtype that can hold ``distinct`` different ranks."""
    if distinct <= 1 << 8:
        return np.uint8
    if distinct <= 1 << 16:
        return np.uint16
    if distinct <= 1 << 32:
        return np.uint32
    return np.uint64


def _size_groups(x: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (distinct sizes descending, their counts, stable item order by decreasing size)."""
    if capacity <= max(_HISTOGRAM_LIMIT, 4 * x.size):
        hist = np.bincount(x, minlength=capacity + 1)
        sizes = np.flatnonzero(hist)[::-1]
        counts = hist[sizes]
        # A narrow key lets numpy use its radix sort for the stable argsort.
        rank = np.zeros(capacity + 1, dtype=_narrow_dtype(sizes.size))
        rank[sizes] = np.arange(sizes.size)
        key = rank[x]
    else:
        asc, inverse, counts_asc = np.unique(x, return_inverse=True, return_counts=True)
        sizes = asc[::-1]
        counts = counts_asc[::-1]
        key = ((asc.size - 1) - inverse.reshape(-1)).astype(_narrow_dtype(sizes.size))
    order = np.argsort(key, kind="stable")
    return sizes.astype(np.int64), counts.astype(np.int64), order


def _expand_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Return the concatenation of ``arange(s, s + n)`` for each start ``s`` and length ``n >= 1``."""
    if starts.size == 0:
        return _EMPTY
    total = int(lengths.sum())
    if total == starts.size:
        return starts
    steps = np.ones(total, dtype=np.int64)
    steps[0] = starts[0]
    heads = np.cumsum(lengths)[:-1]
    steps[heads] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    return np.cumsum(steps)


class _Calendar:
    """Bins waiting to become eligible again, keyed by the step at which that happens.

    Entries are ranges of bin ids (``start``, ``length``) sharing one target step. They live in
    one log, grouped in batches sorted by target; each batch keeps a cursor and the target under
    it, so a pop finds the batches due at a step with one vectorised comparison and takes each
    one's run of entries for that step. Every ``_FANOUT`` batches of one level at the top of the
    stack are merged into one batch of the next level, which keeps the number of live batches
    logarithmic in the number of steps; dead log space is reclaimed when the log would grow.
    """

    _FANOUT = 16

    def __init__(self, nsteps: int) -> None:
        self._start = np.empty(256, dtype=np.int64)
        self._length = np.empty(256, dtype=np.int64)
        self._target = np.empty(256, dtype=np.int64)
        self._run_end = np.empty(256, dtype=np.int64)
        self._used = 0
        self._cursor = np.zeros(nsteps + 1, dtype=np.int64)
        self._end = np.zeros(nsteps + 1, dtype=np.int64)
        self._next = np.full(nsteps + 1, _NEVER, dtype=np.int64)
        self._level = np.zeros(nsteps + 1, dtype=np.int64)
        self._batches = 0

    def push(self, starts: np.ndarray, lengths: np.ndarray, targets: np.ndarray) -> None:
        """Store bin ranges ``[start, start + length)`` to be released at their target steps."""
        if targets.size == 0:
            return
        self._append_batch(starts, lengths, targets, level=0)
        fan = self._FANOUT
        while self._batches >= fan:
            top = self._batches
            levels = self._level[top - fan : top]
            if int(levels.min()) != int(levels.max()):
                break
            self._merge_top(fan, int(levels[0]) + 1)

    def pop(self, step: int) -> np.ndarray:
        """Return (unsorted) the bin ids whose target is ``step``; steps must be popped in order."""
        nb = self._batches
        hits = (self._next[:nb] == step).nonzero()[0]
        if hits.size == 0:
            return _EMPTY
        starts = self._cursor[hits]
        ends = self._run_end[starts]
        entries = _expand_ranges(starts, ends - starts)
        bins = _expand_ranges(self._start[entries], self._length[entries])
        self._cursor[hits] = ends
        remaining = ends < self._end[hits]
        if remaining.all():
            self._next[hits] = self._target[ends]
        else:
            upcoming = np.full(hits.size, _NEVER, dtype=np.int64)
            upcoming[remaining] = self._target[ends[remaining]]
            self._next[hits] = upcoming
            live = np.flatnonzero(self._next[:nb] != _NEVER)
            self._keep_batches(live)
        return bins

    def _keep_batches(self, keep: np.ndarray) -> None:
        """Keep only the batches at positions ``keep`` (ascending), preserving their stack order."""
        n = keep.size
        for arr in (self._cursor, self._end, self._next, self._level):
            arr[:n] = arr[keep]
        self._next[n : self._batches] = _NEVER
        self._batches = n

    def _append_batch(self, starts: np.ndarray, lengths: np.ndarray, targets: np.ndarray, level: int) -> None:
        """Write entries to the log sorted by target and register them as the top batch."""
        m = targets.size
        if m > 1:
            by_target = np.argsort(targets, kind="stable")
            starts, lengths, targets = starts[by_target], lengths[by_target], targets[by_target]
        if self._used + m > self._start.size:
            self._compact_log(m)
        base = self._used
        self._start[base : base + m] = starts
        self._length[base : base + m] = lengths
        self._target[base : base + m] = targets
        self._run_end[base : base + m] = np.searchsorted(targets, targets, side="right") + base
        self._used = base + m
        b = self._batches
        self._cursor[b] = base
        self._end[b] = base + m
        self._next[b] = targets[0]
        self._level[b] = level
        self._batches = b + 1

    def _merge_top(self, count: int, level: int) -> None:
        """Replace the top ``count`` batches by one batch of ``level`` holding their live entries."""
        first = self._batches - count
        cursors = self._cursor[first : self._batches]
        pos = _expand_ranges(cursors, self._end[first : self._batches] - cursors)
        starts, lengths, targets = self._start[pos], self._length[pos], self._target[pos]
        self._next[first : self._batches] = _NEVER
        self._batches = first
        self._append_batch(starts, lengths, targets, level)

    def _compact_log(self, extra: int) -> None:
        """Make room for ``extra`` entries: drop consumed entries, growing the log if needed."""
        nb = self._batches
        cursors = self._cursor[:nb].copy()
        sizes = self._end[:nb] - cursors
        live = int(sizes.sum())
        capacity = self._start.size
        if live + extra > capacity // 2:
            capacity = max(2 * capacity, 2 * (live + extra))
        pos = _expand_ranges(cursors, sizes)
        new_base = np.cumsum(sizes) - sizes
        shift = np.repeat(new_base - cursors, sizes)
        for name in ("_start", "_length", "_target", "_run_end"):
            new = np.empty(capacity, dtype=np.int64)
            new[:live] = getattr(self, name)[pos]
            setattr(self, name, new)
        self._run_end[:live] += shift
        self._cursor[:nb] = new_base
        self._end[:nb] = new_base + sizes
        self._used = live


class _FirstFitQueue:
    """Eligible bins in bin-id order, held as sorted runs merged like a binary counter."""

    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []
        self.size = 0

    def add(self, bins: np.ndarray, residual: np.ndarray) -> None:
        """Insert bins (any order) that have just become eligible."""
        self._push(np.sort(bins))

    def give_back(self, head_rest: np.ndarray) -> None:
        """Return the untouched tail of the last :meth:`take` to the front of the queue."""
        if head_rest.size:
            self._push(head_rest)

    def _push(self, run: np.ndarray) -> None:
        """Add a sorted run, merging it with the runs below while they are under twice its size."""
        runs = self._runs
        self.size += run.size
        while runs and 2 * run.size >= runs[-1].size:
            run = np.sort(np.concatenate((runs.pop(), run)))
        runs.append(run)

    def take(self, count: int) -> np.ndarray:
        """Remove and return the first ``count`` bins in fill order (all of them if fewer)."""
        runs = self._runs
        if self.size <= count:
            head = runs[0] if len(runs) == 1 else np.sort(np.concatenate(runs))
            runs.clear()
            self.size = 0
            return head
        if len(runs) == 1:
            head = runs[0][:count]
            runs[0] = runs[0][count:]
            self.size -= count
            return head
        candidates = np.concatenate([run[:count] for run in runs])
        cut = np.partition(candidates, count - 1)[count - 1]
        parts: list[np.ndarray] = []
        kept: list[np.ndarray] = []
        for run in runs:
            n = int(np.searchsorted(run, cut, side="right"))
            if n:
                parts.append(run[:n])
            if n < run.size:
                kept.append(run[n:])
        self._runs = kept
        self.size -= count
        return np.sort(np.concatenate(parts))


class _BestFitQueue:
    """Eligible bins in (residual, bin id) order, held as a stack of sorted chunks.

    Bins that become eligible at a step have less room than every bin already eligible (those
    had room for the previous, larger size and were not touched), so they always go in front.
    """

    def __init__(self) -> None:
        self._stack: list[np.ndarray] = []
        self.size = 0

    def add(self, bins: np.ndarray, residual: np.ndarray) -> None:
        """Insert bins (any order) that have just become eligible."""
        if bins.size > 1:
            bins = bins[np.lexsort((bins, residual[bins]))]
        self._stack.append(bins)
        self.size += bins.size

    def give_back(self, head_rest: np.ndarray) -> None:
        """Return the untouched tail of the last :meth:`take` to the front of the queue."""
        if head_rest.size:
            self._stack.append(head_rest)
            self.size += head_rest.size

    def take(self, count: int) -> np.ndarray:
        """Remove and return the first ``count`` bins in fill order (all of them if fewer)."""
        stack = self._stack
        parts: list[np.ndarray] = []
        need = min(count, self.size)
        self.size -= need
        while need:
            top = stack.pop()
            if top.size > need:
                parts.append(top[:need])
                stack.append(top[need:])
                break
            parts.append(top)
            need -= top.size
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _pack_decreasing(lengths: np.ndarray, capacity: int, best_fit: bool) -> np.ndarray:
    """Return per-item bin ids from first-fit (``best_fit=False``) or best-fit decreasing."""
    x, cap = _check_lengths(lengths, capacity)
    n = x.size
    if n == 0:
        return _EMPTY.copy()
    sizes, counts, order = _size_groups(x, cap)
    nsteps = sizes.size
    sizes_asc = sizes[::-1].copy()
    # Any-fit packing leaves at most one bin at most half full, so bins <= 2 * sum / cap + 1.
    max_bins = min(n, 2 * (int(x.sum()) // cap) + 3)
    residual = np.zeros(max_bins, dtype=np.int64)
    calendar = _Calendar(nsteps)
    eligible: _FirstFitQueue | _BestFitQueue = _BestFitQueue() if best_fit else _FirstFitQueue()

    # Items larger than half the capacity never share a bin: each opens its own, in sorted order.
    big = int(np.searchsorted(-sizes, -(cap // 2), side="left"))
    opened = int(counts[:big].sum())
    out_bins: list[np.ndarray] = [np.arange(opened, dtype=np.int64)]
    out_counts: list[np.ndarray] = [np.ones(opened, dtype=np.int64)]
    if big < nsteps and opened:
        _schedule_big_bins(sizes[:big], counts[:big], cap, sizes_asc, residual, calendar)

    sizes_list = sizes.tolist()
    counts_list = counts.tolist()
    for step in range(big, nsteps):
        s = sizes_list[step]
        c = counts_list[step]
        back = calendar.pop(step)
        if back.size:
            eligible.add(back, residual)

        rest = c
        touched = _EMPTY
        if eligible.size:
            touched, take, rest = _fill_eligible(eligible, residual, s, c)
            out_bins.append(touched)
            out_counts.append(take)

        if rest:
            new_counts, new_starts, new_lengths = _open_bins(residual, opened, rest, s, cap)
            out_bins.append(np.arange(opened, opened + new_counts.size, dtype=np.int64))
            out_counts.append(new_counts)
            opened += new_counts.size
            if touched.size:
                ret_starts = np.concatenate((touched, new_starts))
                ret_lengths = np.concatenate((np.ones(touched.size, dtype=np.int64), new_lengths))
            else:
                ret_starts, ret_lengths = new_starts, new_lengths
        elif touched.size:
            ret_starts = touched
            ret_lengths = np.ones(touched.size, dtype=np.int64)
        else:
            continue

        if step + 1 < nsteps:
            _book_return(calendar, residual, sizes_asc, ret_starts, ret_lengths, step + 1)

    per_sorted_item = np.repeat(np.concatenate(out_bins), np.concatenate(out_counts))
    bins = np.empty(n, dtype=np.int64)
    bins[order] = per_sorted_item
    return bins


def _book_return(
    calendar: _Calendar,
    residual: np.ndarray,
    sizes_asc: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    next_step: int,
) -> None:
    """Book the bin runs (``starts``, ``lengths``) in the calendar at the step they have room again, if any."""
    nsteps = sizes_asc.size
    # Step at which each bin gets room again: the first whose size fits the room left,
    # but never before the next step.
    target = nsteps - np.searchsorted(sizes_asc, residual[starts], side="right")
    np.maximum(target, next_step, out=target)
    due = target < nsteps
    if not due.all():
        starts, lengths, target = starts[due], lengths[due], target[due]
    calendar.push(starts, lengths, target)


def _schedule_big_bins(
    sizes: np.ndarray, counts: np.ndarray, cap: int, sizes_asc: np.ndarray, residual: np.ndarray, calendar: _Calendar
) -> None:
    """Set the room left in the bins of the items over half the capacity, and book when each is eligible again."""
    nsteps = sizes_asc.size
    opened = int(counts.sum())
    room = cap - sizes
    residual[:opened] = np.repeat(room, counts)
    target = nsteps - np.searchsorted(sizes_asc, room, side="right")
    due = target < nsteps
    first_bins = np.cumsum(counts) - counts
    calendar.push(first_bins[due], counts[due], target[due])


def _fill_eligible(
    eligible: _FirstFitQueue | _BestFitQueue, residual: np.ndarray, s: int, c: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Put up to ``c`` items of size ``s`` into the eligible bins; return (bins filled, items each, items left)."""
    head = eligible.take(c)
    fits = residual[head] // s
    cum = np.cumsum(fits)
    if cum[-1] >= c:
        k = int(np.searchsorted(cum, c)) + 1
        eligible.give_back(head[k:])
        touched = head[:k]
        take = fits[:k]
        take[-1] -= cum[k - 1] - c
        rest = 0
    else:
        touched = head
        take = fits
        rest = c - int(cum[-1])
    residual[touched] -= take * s
    return touched, take, rest


def _open_bins(
    residual: np.ndarray, opened: int, rest: int, s: int, cap: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Open new bins from ``opened`` for ``rest`` items of size ``s``, full but the last.

    Returns the items each new bin holds, and the new bins as (first bin, bins) runs of equal room.
    """
    per_bin = cap // s
    full, last = divmod(rest, per_bin)
    new = full + (1 if last else 0)
    new_counts = np.full(new, per_bin, dtype=np.int64)
    residual[opened : opened + full] = cap - per_bin * s
    if last:
        residual[opened + full] = cap - last * s
        new_counts[-1] = last
    if full and last:
        return new_counts, np.array((opened, opened + full), dtype=np.int64), np.array((full, 1), dtype=np.int64)
    return new_counts, np.array((opened,), dtype=np.int64), np.array((new,), dtype=np.int64)


def first_fit_decreasing(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Return the first-fit-decreasing bin id of every item (int64, in input order).

    Items are taken by decreasing size, ties by ascending input index; each goes to the
    lowest-numbered open bin with room for it, or to a new bin when none has room. Bins are
    numbered from 0 in the order they open. The result is identical to the textbook per-item
    algorithm; the work is vectorised per distinct size.

    Raises ValueError if ``capacity < 1``, if ``lengths`` is not a 1-D integer array, or if any
    length is outside ``[1, capacity]``.
    """
    return _pack_decreasing(lengths, capacity, best_fit=False)


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Return the best-fit-decreasing bin id of every item (int64, in input order).

    Items are taken by decreasing size, ties by ascending input index; each goes to the open bin
    with the least room that still fits it (ties: lowest bin number), or to a new bin when none
    fits. Bins are numbered from 0 in the order they open. Same contract and errors as
    :func:`first_fit_decreasing`.
    """
    return _pack_decreasing(lengths, capacity, best_fit=True)


_ALGORITHMS = {"ffd": first_fit_decreasing, "bfd": best_fit_decreasing}


def pad_lengths(lengths: np.ndarray, multiple: int, offset: int = 0) -> np.ndarray:
    """Return each length rounded up so that ``length - offset`` is a multiple of ``multiple``.

    ``offset`` 0 pads a sample of n tokens to ceil(n / m) * m; ``offset`` 1 pads it to
    ceil((n - 1) / m) * m + 1, for layouts that drop one token of every sample when shifting labels
    (the padded sequence the model runs on is then a multiple of m). Lengths must be >= 1.
    """
    arr = np.asarray(lengths, dtype=np.int64)
    if multiple <= 1:
        return arr.copy()
    return (arr - offset + multiple - 1) // multiple * multiple + offset


def plan_rows(lengths: np.ndarray, capacity: int, algorithm: str = "ffd") -> np.ndarray:
    """Return the per-item row (bin) ids from the named packing algorithm, "ffd" or "bfd".

    Raises ValueError for an unknown algorithm, and as the chosen algorithm does otherwise.
    """
    try:
        pack = _ALGORITHMS[algorithm]
    except (KeyError, TypeError):
        raise ValueError(f"unknown packing algorithm {algorithm!r}; expected one of: ffd, bfd") from None
    return pack(lengths, capacity)


def lower_bound_l1(lengths: np.ndarray, capacity: int) -> int:
    """Return the L1 lower bound on the bin count, ``ceil(sum(lengths) / capacity)`` (0 for no items)."""
    x, cap = _check_lengths(lengths, capacity)
    return -(-int(x.sum()) // cap)


def lower_bound_l2(lengths: np.ndarray, capacity: int) -> int:
    """Return the Martello-Toth L2 lower bound on the bin count (0 for no items; always >= L1).

    For every threshold ``k`` in ``[0, capacity // 2]``: J1 holds items larger than ``C - k``, J2
    items in ``(C / 2, C - k]`` and J3 items in ``[k, C / 2]``; the bound for ``k`` is
    ``|J1| + |J2| + max(0, ceil((sum(J3) - (|J2| * C - sum(J2))) / C))``.

    Only thresholds equal to an item size (and 0) need evaluating: between two consecutive small
    sizes J3 stays the same while raising k only moves items from J2 to J1, which lowers
    ``|J2| * C - sum(J2)``, so the bound is largest at the upper end, a size; above the largest
    small size J3 is empty. That is O(n log n) in the items and independent of the capacity, so a
    huge --max-len costs nothing here.
    """
    x, cap = _check_lengths(lengths, capacity)
    if x.size == 0:
        return 0
    x = np.sort(x)
    prefix = np.zeros(x.size + 1, dtype=np.int64)
    np.cumsum(x, out=prefix[1:])
    total = int(prefix[-1])

    def count_ge(v: np.ndarray) -> np.ndarray:
        return x.size - np.searchsorted(x, v, side="left")

    def sum_ge(v: np.ndarray) -> np.ndarray:
        return total - prefix[np.searchsorted(x, v, side="left")]

    half = cap // 2  # an integer size w is "> C / 2" exactly when w > half
    # 0 and the distinct sizes <= half, ascending (sizes are >= 1), from a view of the sorted sizes:
    # no copy of them (a bool per item only).
    small = x[: int(np.searchsorted(x, half, side="right"))]
    first = np.ones(small.size, dtype=bool)
    np.not_equal(small[1:], small[:-1], out=first[1:])
    k = np.concatenate([[0], small[first]]).astype(np.int64)
    del small, first
    big = cap - k + 1  # J1: sizes >= big
    above_half = np.array([half + 1], dtype=np.int64)
    n_big_and_mid = int(count_ge(above_half)[0])  # |J1| + |J2|
    n_mid = n_big_and_mid - count_ge(big)
    sum_mid = int(sum_ge(above_half)[0]) - sum_ge(big)
    sum_small = sum_ge(k) - int(sum_ge(above_half)[0])
    excess = np.maximum(sum_small - (n_mid * cap - sum_mid), 0)
    bound = n_big_and_mid + (-(-excess // cap))
    return int(bound.max())


@dataclass(frozen=True, eq=False)
class RowOrder:
    """The order in which packed rows are written, and how ranks are balanced.

    ``order``: int64 row ids in write order; rank ``r`` of ``N`` reads positions ``r, r + N, ...``.
    ``dropped_rows``: row ids left out. ``padded_rows``: row ids written once more (a row appears
    here as many times as it is repeated). ``rank_tokens``: tokens each rank reads.
    """

    order: np.ndarray
    dropped_rows: np.ndarray
    padded_rows: np.ndarray
    rank_tokens: np.ndarray


_REMAINDERS = ("drop", "pad")


_MAX_BALANCE_BLOCKS = 4096


def _rank_assignment(tokens_desc: np.ndarray, world: int) -> np.ndarray:
    """Return the rank of each row of a descending-token sequence whose length is a multiple of N.

    Rows form steps of N consecutive rows. Steps are grouped into at most ``_MAX_BALANCE_BLOCKS``
    blocks of consecutive steps (one step per block unless there are more steps than that);
    within a block the rows go to N slots in snake order (alternate steps reversed), and the
    slot with the most tokens goes to the rank with the fewest tokens so far, the next to the
    next poorest rank, and so on. With one step per block this is: the largest row of each step
    goes to the rank with the fewest tokens so far.
    """
    steps = tokens_desc.size // world
    per_block = max(1, -(-steps // _MAX_BALANCE_BLOCKS))
    blocks = -(-steps // per_block)
    values = tokens_desc.reshape(steps, world)
    reverse = (np.arange(steps) % per_block) % 2 == 1
    lane = np.arange(world)
    slot = np.where(reverse[:, None], world - 1 - lane, lane)
    by_slot = np.zeros((blocks * per_block, world), dtype=np.int64)
    np.put_along_axis(by_slot[:steps], slot, values, axis=1)
    block_sums = by_slot.reshape(blocks, per_block, world).sum(axis=1)
    slot_rank = np.empty((blocks, world), dtype=np.int64)
    totals = np.zeros(world, dtype=np.int64)
    for block in range(blocks):
        sums = block_sums[block]
        richest_slots = np.argsort(-sums, kind="stable")
        poorest_ranks = np.argsort(totals, kind="stable")
        slot_rank[block, richest_slots] = poorest_ranks
        totals[poorest_ranks] += sums[richest_slots]
    block_of_step = np.arange(steps) // per_block
    return slot_rank[block_of_step[:, None], slot].reshape(-1)


def order_rows(
    row_tokens: np.ndarray,
    seed: int,
    world_size: int = 1,
    remainder: str = "drop",
    row_costs: np.ndarray | None = None,
) -> RowOrder:
    """Return the seeded write order of packed rows, balanced across ``world_size`` ranks.

    With one rank the order is a random permutation of all rows. With ``N > 1`` ranks the written
    order is a sequence of steps of N rows, rank ``r`` reading the ``r``-th row of each step (the
    split a non-shuffling distributed sampler makes). If the row count is not a multiple of N,
    ``remainder="drop"`` leaves out the rows with the fewest tokens, and ``"pad"`` writes the
    rows with the fewest tokens a second time (cycling if more pads than rows are needed), so
    every rank reads the same number of rows. Steps are cut from the rows sorted by tokens, each
    step's rows assigned so running per-rank token totals stay balanced, then the steps are
    shuffled.

    With ``row_costs`` (one finite number per row, ``packcli.plan.balance``), the same rows (the
    same left out or repeated) are cut into steps by cost instead: sorted by cost, largest first
    (ties: by tokens, then row id), N neighbours a step, so that the rows of a step cost about the
    same; in a step, rows go to ranks by tokens as above. No other grouping of these rows into steps
    leaves less of the steps' time idle (the sum of the steps' costliest rows is least when each
    step holds neighbours in cost order).

    Raises ValueError for ``world_size < 1``, an unknown remainder, a row token array that is not
    1-D integers >= 0, or row costs that are not one finite number per row.
    """
    if isinstance(world_size, bool | np.bool_):
        raise ValueError(f"world_size must be an integer, got {world_size!r}")
    try:
        world = operator.index(world_size)
    except TypeError:
        raise ValueError(f"world_size must be an integer, got {world_size!r}") from None
    if world < 1:
        raise ValueError(f"world_size must be >= 1, got {world}")
    if remainder not in _REMAINDERS:
        raise ValueError(f"unknown remainder {remainder!r}; expected one of: drop, pad")
    tokens = np.asarray(row_tokens)
    if tokens.ndim != 1:
        raise ValueError(f"row_tokens must be a 1-D array, got shape {tokens.shape}")
    if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"row_tokens must have an integer dtype, got {tokens.dtype}")
    tokens = tokens.astype(np.int64, copy=False)
    if tokens.size and int(tokens.min()) < 0:
        raise ValueError("row_tokens must be >= 0")
    rng = np.random.default_rng(seed)
    n = tokens.size

    if world == 1:
        return RowOrder(
            order=rng.permutation(n).astype(np.int64),
            dropped_rows=_EMPTY.copy(),
            padded_rows=_EMPTY.copy(),
            rank_tokens=np.array([int(tokens.sum())], dtype=np.int64),
        )

    # Rows by tokens, largest first (ties: lower row id first); the fewest-token rows are last.
    rows = np.argsort(-tokens, kind="stable")
    extra = n % world
    dropped = _EMPTY
    padded = _EMPTY
    if extra and remainder == "drop":
        dropped = np.sort(rows[n - extra :])
        rows = rows[: n - extra]
    elif extra and remainder == "pad" and n:
        need = world - extra
        padded = np.resize(rows[::-1], need).astype(np.int64)
        # The repeats are copies of the smallest rows: re-sort only that tail.
        cut = n - min(need, n)
        tail = np.concatenate((rows[cut:], padded))
        rows = np.concatenate((rows[:cut], tail[np.argsort(-tokens[tail], kind="stable")]))
    steps = rows.size // world
    if row_costs is not None:
        rows = _rows_by_cost(rows, tokens, _check_costs(row_costs, n), world)
    rank_of = _rank_assignment(tokens[rows], world)
    # Slot (step, rank) -> row; then shuffle whole steps, keeping each row on its rank.
    grid = np.empty((steps, world), dtype=np.int64)
    grid[np.repeat(np.arange(steps), world), rank_of] = rows
    grid = grid[rng.permutation(steps)]
    return RowOrder(
        order=grid.reshape(-1),
        dropped_rows=dropped,
        padded_rows=padded,
        rank_tokens=tokens[grid].sum(axis=0, dtype=np.int64),
    )


def _check_costs(row_costs: np.ndarray, n: int) -> np.ndarray:
    """Return the row costs as float64, or raise ValueError unless they are ``n`` finite numbers."""
    costs = np.asarray(row_costs)
    if costs.shape != (n,) or (costs.size and not np.issubdtype(costs.dtype, np.number)):
        raise ValueError(f"row_costs must be one number per row ({n}), got shape {costs.shape}")
    costs = costs.astype(np.float64, copy=False)
    if not np.isfinite(costs).all():
        raise ValueError("row_costs must be finite")
    return costs


def _rows_by_cost(rows: np.ndarray, tokens: np.ndarray, costs: np.ndarray, world: int) -> np.ndarray:
    """Return ``rows`` (by tokens, largest first) sorted by cost, largest first, then each step of ``world``
    neighbours by tokens, largest first, as ``_rank_assignment`` takes them."""
    by_cost = rows[np.argsort(-costs[rows], kind="stable")]
    steps = by_cost.reshape(-1, world)
    within = np.argsort(-tokens[steps], axis=1, kind="stable")
    return np.take_along_axis(steps, within, axis=1).reshape(-1)


def rank_token_spread(rank_tokens: np.ndarray) -> float:
    """Return ``(max - min) / mean`` of per-rank token totals (0.0 for one rank or all zero)."""
    totals = np.asarray(rank_tokens, dtype=np.float64)
    if totals.size <= 1:
        return 0.0
    mean = float(totals.mean())
    if mean == 0.0:
        return 0.0
    return float((totals.max() - totals.min()) / mean)
