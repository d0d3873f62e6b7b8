"""Bin packing of sample lengths into fixed-capacity rows, lower bounds, and rank-balanced row order.

Pure numpy: no I/O, no printing. Every function is deterministic; randomness comes only from an
explicit seed.

Packing works per distinct size rather than per item. Sizes are visited in decreasing order; for a
run of ``c`` items of size ``s``, textbook first-fit (or best-fit) decreasing fills the bins that
currently have room for ``s`` ("eligible" bins) one after another, each bin ``j`` taking
``residual_j // s`` items, until the run is placed, then opens new bins holding ``capacity // s``
items each. A bin that is filled this way drops below ``s`` and leaves the eligible set; it comes
back when the current size falls to its residual. Bins waiting to come back are kept in a calendar
keyed by the step (distinct-size index) at which they become eligible again, so each step costs
time proportional to the bins it touches, not to the number of open bins. Finally the per-bin
counts are expanded to per-item bin ids over the stable size-sorted item order.
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


def _size_groups(x: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (distinct sizes descending, their counts, stable item order by decreasing size)."""
    if capacity <= max(_HISTOGRAM_LIMIT, 4 * x.size):
        hist = np.bincount(x, minlength=capacity + 1)
        sizes = np.flatnonzero(hist)[::-1]
        counts = hist[sizes]
        rank = np.zeros(capacity + 1, dtype=np.int64)
        rank[sizes] = np.arange(sizes.size)
        key = rank[x]
    else:
        asc, inverse, counts_asc = np.unique(x, return_inverse=True, return_counts=True)
        sizes = asc[::-1]
        counts = counts_asc[::-1]
        key = (asc.size - 1) - inverse.reshape(-1)
    # A narrow key lets numpy use its radix sort for the stable argsort.
    if sizes.size <= 1 << 8:
        key = key.astype(np.uint8)
    elif sizes.size <= 1 << 16:
        key = key.astype(np.uint16)
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

    Each push stores one batch of entries sorted by target step; an entry is a range of bin ids
    (``start``, ``length``) sharing one target. Every batch keeps a cursor and the target under it,
    so a pop finds the batches due at a step with one vectorised comparison and takes each one's
    run of entries for that step.
    """

    def __init__(self, nsteps: int) -> None:
        self._start = np.empty(256, dtype=np.int64)
        self._length = np.empty(256, dtype=np.int64)
        self._target = np.empty(256, dtype=np.int64)
        self._run_end = np.empty(256, dtype=np.int64)
        self._used = 0
        self._cursor = np.zeros(nsteps + 1, dtype=np.int64)
        self._end = np.zeros(nsteps + 1, dtype=np.int64)
        self._next = np.full(nsteps + 1, _NEVER, dtype=np.int64)
        self._batches = 0
        self._finished = 0

    def _reserve(self, extra: int) -> None:
        need = self._used + extra
        if need <= self._start.size:
            return
        size = max(need, 2 * self._start.size)
        for name in ("_start", "_length", "_target", "_run_end"):
            old = getattr(self, name)
            new = np.empty(size, dtype=np.int64)
            new[: self._used] = old[: self._used]
            setattr(self, name, new)

    def push(self, starts: np.ndarray, lengths: np.ndarray, targets: np.ndarray) -> None:
        """Store bin ranges ``[start, start + length)`` to be released at their target steps."""
        m = targets.size
        if m == 0:
            return
        if m > 1:
            by_target = np.argsort(targets, kind="stable")
            starts, lengths, targets = starts[by_target], lengths[by_target], targets[by_target]
        base = self._used
        self._reserve(m)
        self._start[base : base + m] = starts
        self._length[base : base + m] = lengths
        self._target[base : base + m] = targets
        self._run_end[base : base + m] = np.searchsorted(targets, targets, side="right") + base
        self._used = base + m
        b = self._batches
        self._cursor[b] = base
        self._end[b] = base + m
        self._next[b] = targets[0]
        self._batches = b + 1

    def pop(self, step: int) -> np.ndarray:
        """Return (unsorted) the bin ids whose target is ``step``; targets must be popped in order."""
        hits = np.flatnonzero(self._next[: self._batches] == step)
        if hits.size == 0:
            return _EMPTY
        starts = self._cursor[hits]
        ends = self._run_end[starts]
        entries = _expand_ranges(starts, ends - starts)
        bins = _expand_ranges(self._start[entries], self._length[entries])
        self._cursor[hits] = ends
        remaining = ends < self._end[hits]
        upcoming = np.full(hits.size, _NEVER, dtype=np.int64)
        upcoming[remaining] = self._target[ends[remaining]]
        self._next[hits] = upcoming
        self._finished += int(hits.size - np.count_nonzero(remaining))
        if self._finished > 64 and 2 * self._finished > self._batches:
            self._compact()
        return bins

    def _compact(self) -> None:
        live = np.flatnonzero(self._next[: self._batches] != _NEVER)
        n = live.size
        self._cursor[:n] = self._cursor[live]
        self._end[:n] = self._end[live]
        self._next[:n] = self._next[live]
        self._next[n : self._batches] = _NEVER
        self._batches = n
        self._finished = 0


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
    # Eligible bins: first fit keeps them by bin id, best fit by (residual, bin id).
    eligible = _EMPTY
    opened = 0
    out_bins: list[np.ndarray] = []
    out_counts: list[np.ndarray] = []

    for step in range(nsteps):
        s = int(sizes[step])
        c = int(counts[step])
        back = calendar.pop(step)
        if back.size:
            if best_fit:
                # Bins coming back have less room than every bin still eligible: they go in front.
                back = back[np.lexsort((back, residual[back]))]
                eligible = np.concatenate((back, eligible))
            elif eligible.size:
                eligible = np.sort(np.concatenate((eligible, back)))
            else:
                eligible = np.sort(back)

        placed = 0
        ret_starts = _EMPTY
        if eligible.size:
            head = eligible[:c]
            fits = residual[head] // s
            cum = np.cumsum(fits)
            if int(cum[-1]) >= c:
                k = int(np.searchsorted(cum, c)) + 1
                take = fits[:k]
                take[-1] -= int(cum[k - 1]) - c
                placed = c
            else:
                k = head.size
                take = fits
                placed = int(cum[-1])
            touched = head[:k]
            residual[touched] -= take * s
            eligible = eligible[k:]
            out_bins.append(touched)
            out_counts.append(take)
            ret_starts = touched

        ret_lengths = np.ones(ret_starts.size, dtype=np.int64)
        rest = c - placed
        if rest:
            per_bin = cap // s
            full, last = divmod(rest, per_bin)
            new = full + (1 if last else 0)
            residual[opened : opened + full] = cap - per_bin * s
            new_counts = np.full(new, per_bin, dtype=np.int64)
            extra_starts = []
            extra_lengths = []
            if full:
                extra_starts.append(opened)
                extra_lengths.append(full)
            if last:
                residual[opened + full] = cap - last * s
                new_counts[-1] = last
                extra_starts.append(opened + full)
                extra_lengths.append(1)
            out_bins.append(np.arange(opened, opened + new, dtype=np.int64))
            out_counts.append(new_counts)
            ret_starts = np.concatenate((ret_starts, np.asarray(extra_starts, dtype=np.int64)))
            ret_lengths = np.concatenate((ret_lengths, np.asarray(extra_lengths, dtype=np.int64)))
            opened += new

        if ret_starts.size and step + 1 < nsteps:
            room = residual[ret_starts]
            # First step whose size fits in the room left; sizes at or before this step are done.
            target = nsteps - np.searchsorted(sizes_asc, room, side="right")
            target = np.maximum(target, step + 1)
            due = target < nsteps
            if not due.all():
                ret_starts, ret_lengths, target = ret_starts[due], ret_lengths[due], target[due]
            calendar.push(ret_starts, ret_lengths, target)

    per_sorted_item = np.repeat(np.concatenate(out_bins), np.concatenate(out_counts))
    bins = np.empty(n, dtype=np.int64)
    bins[order] = per_sorted_item
    return bins


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
    ``|J1| + |J2| + max(0, ceil((sum(J3) - (|J2| * C - sum(J2))) / C))``. All thresholds are
    evaluated at once from cumulative sums of the size histogram, in O(n + C).
    """
    x, cap = _check_lengths(lengths, capacity)
    if x.size == 0:
        return 0
    hist = np.bincount(x, minlength=cap + 1)
    weight = hist * np.arange(cap + 1, dtype=np.int64)
    # count_ge[v] / sum_ge[v]: number / total size of items with size >= v, for v in [0, cap + 1].
    count_ge = np.zeros(cap + 2, dtype=np.int64)
    sum_ge = np.zeros(cap + 2, dtype=np.int64)
    count_ge[:-1] = np.cumsum(hist[::-1])[::-1]
    sum_ge[:-1] = np.cumsum(weight[::-1])[::-1]
    half = cap // 2  # an integer size w is "> C / 2" exactly when w > half
    k = np.arange(half + 1, dtype=np.int64)
    big = cap - k + 1  # J1: sizes >= big
    n_big_and_mid = count_ge[half + 1]  # |J1| + |J2|
    n_mid = n_big_and_mid - count_ge[big]
    sum_mid = sum_ge[half + 1] - sum_ge[big]
    sum_small = sum_ge[k] - sum_ge[half + 1]
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


def _rank_assignment(tokens_desc: np.ndarray, world_size: int) -> np.ndarray:
    """Return the rank of each row of a descending-token sequence whose length is a multiple of N.

    Rows form steps of N consecutive rows; within a step the largest row goes to the rank with
    the fewest tokens so far, the next largest to the next poorest rank, and so on.
    """
    steps = tokens_desc.size // world_size
    values = tokens_desc.reshape(steps, world_size).tolist()
    totals = [0] * world_size
    ranks_by_total = list(range(world_size))
    ranks: list[int] = []
    for row_values in values:
        ranks_by_total.sort(key=totals.__getitem__)
        ranks.extend(ranks_by_total)
        for rank, value in zip(ranks_by_total, row_values, strict=True):
            totals[rank] += value
    return np.asarray(ranks, dtype=np.int64)


def order_rows(
    row_tokens: np.ndarray, seed: int, world_size: int = 1, remainder: str = "drop"
) -> RowOrder:
    """Return the seeded write order of packed rows, balanced across ``world_size`` ranks.

    With one rank the order is a random permutation of all rows. With ``N > 1`` ranks the written
    order is a sequence of steps of N rows, rank ``r`` reading the ``r``-th row of each step (the
    split a non-shuffling distributed sampler makes). If the row count is not a multiple of N,
    ``remainder="drop"`` leaves out the rows with the fewest tokens, and ``"pad"`` writes the
    rows with the fewest tokens a second time (cycling if more pads than rows are needed), so
    every rank reads the same number of rows. Steps are cut from the rows sorted by tokens, each
    step's rows assigned so running per-rank token totals stay balanced, then the steps are
    shuffled. Raises ValueError for ``world_size < 1``, an unknown remainder, or a row token
    array that is not 1-D integers >= 0.
    """
    if isinstance(world_size, bool | np.bool_):
        raise ValueError(f"world_size must be an integer, got {world_size!r}")
    try:
        ranks = operator.index(world_size)
    except TypeError:
        raise ValueError(f"world_size must be an integer, got {world_size!r}") from None
    if ranks < 1:
        raise ValueError(f"world_size must be >= 1, got {ranks}")
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

    if ranks == 1:
        return RowOrder(
            order=rng.permutation(n).astype(np.int64),
            dropped_rows=_EMPTY.copy(),
            padded_rows=_EMPTY.copy(),
            rank_tokens=np.array([int(tokens.sum())], dtype=np.int64),
        )

    ascending = np.argsort(tokens, kind="stable")
    extra = n % ranks
    dropped = _EMPTY
    padded = _EMPTY
    kept = np.arange(n, dtype=np.int64)
    if extra and remainder == "drop":
        dropped = np.sort(ascending[:extra])
        kept = np.sort(ascending[extra:])
    elif extra and remainder == "pad" and n:
        padded = np.resize(ascending, ranks - extra).astype(np.int64)
    rows = np.concatenate((kept, padded))
    rows = rows[np.argsort(-tokens[rows], kind="stable")]
    steps = rows.size // ranks
    rank_of = _rank_assignment(tokens[rows], ranks)
    # Slot (step, rank) -> row; then shuffle whole steps, keeping each row on its rank.
    grid = np.empty((steps, ranks), dtype=np.int64)
    grid[np.repeat(np.arange(steps), ranks), rank_of] = rows
    grid = grid[rng.permutation(steps)]
    rank_tokens = tokens[grid].sum(axis=0) if steps else np.zeros(ranks, dtype=np.int64)
    return RowOrder(
        order=grid.reshape(-1),
        dropped_rows=dropped,
        padded_rows=padded,
        rank_tokens=rank_tokens.astype(np.int64),
    )


def rank_token_spread(rank_tokens: np.ndarray) -> float:
    """Return ``(max - min) / mean`` of per-rank token totals (0.0 for one rank or all zero)."""
    totals = np.asarray(rank_tokens, dtype=np.float64)
    if totals.size <= 1:
        return 0.0
    mean = float(totals.mean())
    if mean == 0.0:
        return 0.0
    return float((totals.max() - totals.min()) / mean)
