"""Tests for packcli.plan.packing: exact FFD/BFD against plain per-item references, bounds, row order."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from packcli.plan.packing import (
    RowOrder,
    best_fit_decreasing,
    first_fit_decreasing,
    lower_bound_l1,
    lower_bound_l2,
    order_rows,
    plan_rows,
    rank_token_spread,
)

PACKERS = [first_fit_decreasing, best_fit_decreasing]
FAST = settings(max_examples=150, deadline=None, database=None)


# ----------------------------------------------------------------------------------------------
# Plain references: one Python loop iteration per item, exactly as the textbook states them.


def _decreasing_order(lengths: list[int]) -> list[int]:
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def reference_ffd(lengths: list[int], capacity: int) -> list[int]:
    room: list[int] = []
    bins = [0] * len(lengths)
    for i in _decreasing_order(lengths):
        size = lengths[i]
        b = 0
        while b < len(room) and room[b] < size:
            b += 1
        if b == len(room):
            room.append(capacity)
        room[b] -= size
        bins[i] = b
    return bins


def reference_bfd(lengths: list[int], capacity: int) -> list[int]:
    room: list[int] = []
    bins = [0] * len(lengths)
    for i in _decreasing_order(lengths):
        size = lengths[i]
        best = -1
        for b, free in enumerate(room):
            if free >= size and (best < 0 or free < room[best]):
                best = b
        if best < 0:
            room.append(capacity)
            best = len(room) - 1
        room[best] -= size
        bins[i] = best
    return bins


REFERENCES = {first_fit_decreasing: reference_ffd, best_fit_decreasing: reference_bfd}


def reference_l2(lengths: list[int], capacity: int) -> int:
    """Martello-Toth L2 straight from its definition, one threshold at a time."""
    best = 0
    for k in range(capacity // 2 + 1):
        j1 = [w for w in lengths if w > capacity - k]
        j2 = [w for w in lengths if capacity - k >= w and 2 * w > capacity]
        j3 = [w for w in lengths if 2 * w <= capacity and w >= k]
        spill = sum(j3) - (len(j2) * capacity - sum(j2))
        best = max(best, len(j1) + len(j2) + max(0, -(-spill // capacity)))
    return best


def optimal_bins(lengths: list[int], capacity: int) -> int:
    """Minimum bin count by exhaustive search (tiny inputs only)."""
    items = sorted(lengths, reverse=True)
    best = len(items)

    def place(i: int, room: list[int]) -> None:
        nonlocal best
        if len(room) >= best:
            return
        if i == len(items):
            best = len(room)
            return
        tried: set[int] = set()
        for b, free in enumerate(room):
            if free >= items[i] and free not in tried:
                tried.add(free)
                room[b] -= items[i]
                place(i + 1, room)
                room[b] += items[i]
        room.append(capacity - items[i])
        place(i + 1, room)
        room.pop()

    place(0, [])
    return best


# ----------------------------------------------------------------------------------------------
# Input strategies: small and awkward capacities, heavy duplication.


@st.composite
def packing_inputs(draw: st.DrawFn, max_items: int = 120) -> tuple[np.ndarray, int]:
    capacity = draw(
        st.one_of(
            st.integers(1, 12),
            st.sampled_from([2**k + 1 for k in range(1, 12)]),
            st.integers(13, 5000),
        )
    )
    pool = draw(st.lists(st.integers(1, capacity), min_size=1, max_size=6))
    pool += [capacity, capacity // 2 + 1, max(1, capacity // 2), max(1, capacity // 3)]
    mode = draw(st.sampled_from(["pool", "any", "mixed"]))
    if mode == "pool":
        elements = st.sampled_from(pool)
    elif mode == "any":
        elements = st.integers(1, capacity)
    else:
        elements = st.one_of(st.sampled_from(pool), st.integers(1, capacity))
    lengths = draw(st.lists(elements, min_size=0, max_size=max_items))
    return np.array(lengths, dtype=np.int64), capacity


def assert_valid_packing(bins: np.ndarray, lengths: np.ndarray, capacity: int) -> None:
    assert bins.dtype == np.int64
    assert bins.shape == lengths.shape
    if lengths.size == 0:
        return
    count = int(bins.max()) + 1
    assert set(bins.tolist()) == set(range(count))
    assert np.bincount(bins, weights=lengths, minlength=count).max() <= capacity
    # Bins are numbered in opening order: first use, in decreasing-size order, is 0, 1, 2, ...
    in_order = bins[_decreasing_order(lengths.tolist())]
    _, first_use = np.unique(in_order, return_index=True)
    assert np.all(np.diff(first_use) > 0)


@pytest.mark.parametrize("pack", PACKERS)
@FAST
@given(data=packing_inputs())
def test_matches_textbook_reference(pack, data: tuple[np.ndarray, int]) -> None:
    lengths, capacity = data
    bins = pack(lengths, capacity)
    assert bins.tolist() == REFERENCES[pack](lengths.tolist(), capacity)
    assert_valid_packing(bins, lengths, capacity)


@pytest.mark.parametrize("pack", PACKERS)
@pytest.mark.parametrize(
    ("seed", "capacity", "n"),
    [(1, 100_000, 1500), (2, 4096, 2500), (3, 4097, 2000), (4, 257, 3000)],
)
def test_matches_reference_on_many_distinct_sizes(pack, seed: int, capacity: int, n: int) -> None:
    # Hundreds to thousands of distinct sizes: bins leave and rejoin the eligible set many times.
    rng = np.random.default_rng(seed)
    lengths = np.concatenate(
        [
            rng.integers(1, capacity + 1, n // 2),
            np.clip(np.round(rng.lognormal(np.log(capacity / 8), 1.0, n - n // 2)), 1, capacity),
        ]
    ).astype(np.int64)
    rng.shuffle(lengths)
    bins = pack(lengths, capacity)
    assert bins.tolist() == REFERENCES[pack](lengths.tolist(), capacity)
    assert_valid_packing(bins, lengths, capacity)


def test_ffd_and_bfd_differ_where_the_textbook_says_so() -> None:
    # Capacity 7: the 5 opens bin 0 (room 2); the 3s open bin 1 and fill it to room 1. The 1 goes
    # to bin 0 under first fit (lowest number) but to bin 1 under best fit (least room).
    lengths = np.array([3, 1, 5, 3])
    assert first_fit_decreasing(lengths, 7).tolist() == [1, 0, 0, 1]
    assert best_fit_decreasing(lengths, 7).tolist() == [1, 1, 0, 1]


# ----------------------------------------------------------------------------------------------
# Edge cases.


@pytest.mark.parametrize("pack", PACKERS)
def test_empty_input(pack) -> None:
    for empty in (np.array([], dtype=np.int64), np.array([], dtype=np.int32), []):
        bins = pack(empty, 4096)
        assert bins.dtype == np.int64
        assert bins.shape == (0,)


@pytest.mark.parametrize("pack", PACKERS)
def test_one_item(pack) -> None:
    assert pack(np.array([7]), 7).tolist() == [0]
    assert pack(np.array([1]), 4096).tolist() == [0]


@pytest.mark.parametrize("pack", PACKERS)
def test_items_equal_to_capacity_each_get_a_bin_in_input_order(pack) -> None:
    lengths = np.array([50, 10, 50, 50, 40])
    # The 50s open bins 0, 1, 2 in input order; the 40 opens bin 3; the 10 joins it.
    assert pack(lengths, 50).tolist() == [0, 3, 1, 2, 3]


@pytest.mark.parametrize("pack", PACKERS)
def test_all_items_equal(pack) -> None:
    lengths = np.full(25, 7)
    # 100 // 7 = 14 per bin, filled in input order.
    assert pack(lengths, 100).tolist() == [i // 14 for i in range(25)]


@pytest.mark.parametrize("pack", PACKERS)
def test_capacity_one(pack) -> None:
    assert pack(np.ones(9, dtype=np.int64), 1).tolist() == list(range(9))


@pytest.mark.parametrize("pack", PACKERS)
def test_capacity_power_of_two_plus_one(pack) -> None:
    # 4097: each 2049 opens its own bin and then fits exactly one 2048; leftover 2048s pair up.
    lengths = np.array([2048, 2049, 2048, 2049, 2048, 2048, 2049, 2048, 2048])
    bins = pack(lengths, 4097)
    assert bins.tolist() == [0, 0, 1, 1, 2, 3, 2, 3, 4]
    assert bins.tolist() == REFERENCES[pack](lengths.tolist(), 4097)


@pytest.mark.parametrize("pack", PACKERS)
def test_large_duplicated_input_matches_reference(pack) -> None:
    rng = np.random.default_rng(7)
    lengths = rng.choice(np.array([2049, 2048, 1025, 1024, 683, 682, 3, 1]), size=3000)
    bins = pack(lengths, 4097)
    assert bins.tolist() == REFERENCES[pack](lengths.tolist(), 4097)


@pytest.mark.parametrize("pack", PACKERS)
def test_other_integer_dtypes_and_lists_give_the_same_bins(pack) -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 300, 200)
    expected = pack(lengths, 300)
    for converted in (lengths.astype(np.int32), lengths.astype(np.uint16), lengths.tolist()):
        assert pack(converted, 300).tolist() == expected.tolist()
    assert pack(lengths, np.int64(300)).tolist() == expected.tolist()


@pytest.mark.parametrize("pack", PACKERS)
@pytest.mark.parametrize(
    ("lengths", "capacity"),
    [
        ([5, 11], 10),
        ([0, 3], 10),
        ([-1], 10),
        ([1], 0),
        ([1], -5),
        ([], 0),
        ([1.0, 2.0], 10),
        ([[1, 2], [3, 4]], 10),
        ([1, 2], 2.5),
        ([1, 2], True),
    ],
)
def test_invalid_input_raises(pack, lengths, capacity) -> None:
    with pytest.raises(ValueError):
        pack(np.asarray(lengths), capacity)


def test_plan_rows_dispatches() -> None:
    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 500, 400)
    assert plan_rows(lengths, 512).tolist() == first_fit_decreasing(lengths, 512).tolist()
    assert plan_rows(lengths, 512, "ffd").tolist() == first_fit_decreasing(lengths, 512).tolist()
    assert plan_rows(lengths, 512, "bfd").tolist() == best_fit_decreasing(lengths, 512).tolist()
    with pytest.raises(ValueError):
        plan_rows(lengths, 512, "nfd")
    with pytest.raises(ValueError):
        plan_rows(np.array([600]), 512, "bfd")


# ----------------------------------------------------------------------------------------------
# Lower bounds.


@FAST
@given(data=packing_inputs(max_items=60))
def test_bounds_are_ordered_and_l2_matches_its_definition(data: tuple[np.ndarray, int]) -> None:
    lengths, capacity = data
    l1 = lower_bound_l1(lengths, capacity)
    l2 = lower_bound_l2(lengths, capacity)
    assert l1 == -(-int(lengths.sum()) // capacity)
    assert l2 == reference_l2(lengths.tolist(), capacity)
    assert l1 <= l2
    used = int(first_fit_decreasing(lengths, capacity).max()) + 1 if lengths.size else 0
    assert l2 <= used
    used_bfd = int(best_fit_decreasing(lengths, capacity).max()) + 1 if lengths.size else 0
    assert l2 <= used_bfd


@FAST
@given(
    capacity=st.integers(1, 30),
    data=st.data(),
)
def test_l2_never_exceeds_the_optimum(capacity: int, data: st.DataObject) -> None:
    lengths = data.draw(st.lists(st.integers(1, capacity), min_size=0, max_size=7))
    assert lower_bound_l2(np.array(lengths, dtype=np.int64), capacity) <= optimal_bins(lengths, capacity)


@pytest.mark.parametrize(
    ("lengths", "capacity", "l1", "l2"),
    [
        ([6, 6, 6], 10, 2, 3),  # three items of 0.6 C: no two share a bin
        ([7, 7, 7, 4, 4], 10, 3, 4),  # needs a threshold k > 0 (k = 4)
        ([5, 5, 5, 5], 10, 2, 2),
        ([10, 10], 10, 2, 2),
        ([1] * 25, 10, 3, 3),
        ([2049, 2049, 2048, 2048, 2048], 4097, 3, 3),
        ([], 10, 0, 0),
    ],
)
def test_known_bounds(lengths: list[int], capacity: int, l1: int, l2: int) -> None:
    arr = np.array(lengths, dtype=np.int64)
    assert lower_bound_l1(arr, capacity) == l1
    assert lower_bound_l2(arr, capacity) == l2


def test_bounds_validate_input() -> None:
    with pytest.raises(ValueError):
        lower_bound_l1(np.array([11]), 10)
    with pytest.raises(ValueError):
        lower_bound_l2(np.array([0]), 10)
    with pytest.raises(ValueError):
        lower_bound_l2(np.array([1]), 0)


# ----------------------------------------------------------------------------------------------
# Row order.


def test_single_rank_is_a_seeded_permutation() -> None:
    tokens = np.arange(1, 51) * 3
    first = order_rows(tokens, seed=5)
    assert isinstance(first, RowOrder)
    assert first.order.dtype == np.int64
    assert sorted(first.order.tolist()) == list(range(50))
    assert first.dropped_rows.size == 0
    assert first.padded_rows.size == 0
    assert first.rank_tokens.tolist() == [int(tokens.sum())]
    assert order_rows(tokens, seed=5).order.tolist() == first.order.tolist()
    assert order_rows(tokens, seed=6).order.tolist() != first.order.tolist()
    assert first.order.tolist() != list(range(50))


def _rank_rows(result: RowOrder, world: int) -> list[np.ndarray]:
    return [result.order[r::world] for r in range(world)]


@FAST
@given(
    tokens=st.lists(st.integers(0, 5000), min_size=0, max_size=90),
    world=st.integers(2, 9),
    remainder=st.sampled_from(["drop", "pad"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_multi_rank_invariants(tokens: list[int], world: int, remainder: str, seed: int) -> None:
    arr = np.array(tokens, dtype=np.int64)
    n = arr.size
    result = order_rows(arr, seed=seed, world_size=world, remainder=remainder)
    extra = n % world
    assert result.order.size % world == 0
    per_rank = {part.size for part in _rank_rows(result, world)}
    assert len(per_rank) == 1
    counts = np.bincount(result.order, minlength=n)
    if remainder == "drop":
        assert result.dropped_rows.size == extra
        assert result.padded_rows.size == 0
        assert result.order.size == n - extra
        expected = np.ones(n, dtype=np.int64)
        expected[result.dropped_rows] = 0
        assert counts.tolist() == expected.tolist()
        kept = np.flatnonzero(expected)
        if extra and kept.size:
            assert arr[result.dropped_rows].max() <= arr[kept].min()
    else:
        need = (world - extra) % world if n else 0
        assert result.dropped_rows.size == 0
        assert result.padded_rows.size == need
        assert result.order.size == n + need
        expected = np.ones(n, dtype=np.int64)
        np.add.at(expected, result.padded_rows, 1)
        assert counts.tolist() == expected.tolist()
        if 0 < need <= n:
            assert len(set(result.padded_rows.tolist())) == need
            others = np.setdiff1d(np.arange(n), result.padded_rows)
            if others.size:
                assert arr[result.padded_rows].max() <= arr[others].min()
    assert result.rank_tokens.shape == (world,)
    assert result.rank_tokens.tolist() == [int(arr[part].sum()) for part in _rank_rows(result, world)]
    again = order_rows(arr, seed=seed, world_size=world, remainder=remainder)
    assert again.order.tolist() == result.order.tolist()


@pytest.mark.parametrize("remainder", ["drop", "pad"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rank_tokens_are_balanced(remainder: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 4097, 1003)
    result = order_rows(tokens, seed=seed, world_size=8, remainder=remainder)
    assert rank_token_spread(result.rank_tokens) < 0.05
    # Not size-sorted: the per-step largest row is not monotone in written order.
    step_max = tokens[result.order].reshape(-1, 8).max(axis=1)
    assert np.any(np.diff(step_max) > 0)
    assert np.any(np.diff(step_max) < 0)


def test_largest_row_of_a_step_goes_to_the_poorest_rank() -> None:
    # Steps (10, 9), (8, 7), (6, 5), (4, 3), (2, 1). Totals after each step: 10/9, 17/17, 23/22,
    # 26/26, 28/27. Always giving the larger row to one rank would end at 30/25.
    tokens = np.arange(1, 11)
    result = order_rows(tokens, seed=3, world_size=2)
    assert sorted(result.rank_tokens.tolist()) == [27, 28]
    per_rank = [sorted(tokens[part].tolist()) for part in _rank_rows(result, 2)]
    assert sorted(per_rank) == [[1, 4, 5, 8, 9], [2, 3, 6, 7, 10]]


@pytest.mark.parametrize("world", [4, 8, 16])
def test_balance_is_much_tighter_than_always_favouring_one_rank(world: int) -> None:
    rng = np.random.default_rng(world)
    tokens = rng.integers(1, 4097, 1000)
    ours = rank_token_spread(order_rows(tokens, seed=0, world_size=world).rank_tokens)
    desc = np.sort(tokens)[::-1][: tokens.size - tokens.size % world]
    lopsided = desc.reshape(-1, world).sum(axis=0)
    assert ours < 0.002
    assert ours * 10 < rank_token_spread(lopsided)


def test_balance_beats_a_naive_split() -> None:
    # Rows sorted by size and dealt round-robin in blocks would leave rank 0 with the most.
    tokens = np.concatenate([np.full(64, 4000), np.full(64, 100)])
    result = order_rows(tokens, seed=0, world_size=4)
    assert rank_token_spread(result.rank_tokens) == 0.0
    naive = [int(tokens[r * 32 : (r + 1) * 32].sum()) for r in range(4)]
    assert rank_token_spread(np.array(naive)) > 1.0


def test_multi_rank_seed_controls_the_order() -> None:
    tokens = np.random.default_rng(9).integers(1, 4097, 400)
    a = order_rows(tokens, seed=1, world_size=4)
    b = order_rows(tokens, seed=1, world_size=4)
    c = order_rows(tokens, seed=2, world_size=4)
    assert a.order.tolist() == b.order.tolist()
    assert a.order.tolist() != c.order.tolist()
    # The seed only reorders steps: each rank reads the same rows either way.
    for ra, rc in zip(_rank_rows(a, 4), _rank_rows(c, 4), strict=True):
        assert sorted(ra.tolist()) == sorted(rc.tolist())


def test_remainder_counts_on_a_small_case() -> None:
    tokens = np.array([50, 10, 40, 20, 30])
    dropped = order_rows(tokens, seed=0, world_size=2, remainder="drop")
    assert dropped.dropped_rows.tolist() == [1]
    assert sorted(dropped.order.tolist()) == [0, 2, 3, 4]
    padded = order_rows(tokens, seed=0, world_size=2, remainder="pad")
    assert padded.padded_rows.tolist() == [1]
    assert sorted(padded.order.tolist()) == [0, 1, 1, 2, 3, 4]
    short = order_rows(tokens[:2], seed=0, world_size=5, remainder="pad")
    assert short.order.size == 5
    assert sorted(short.padded_rows.tolist()) == [0, 1, 1]
    assert order_rows(tokens[:2], seed=0, world_size=5, remainder="drop").order.size == 0
    assert order_rows(np.array([], dtype=np.int64), seed=0, world_size=3).order.size == 0


@pytest.mark.parametrize(
    ("kwargs"),
    [
        {"world_size": 0},
        {"world_size": -2},
        {"world_size": 2, "remainder": "wrap"},
        {"world_size": 1, "remainder": "keep"},
    ],
)
def test_order_rows_rejects_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        order_rows(np.array([1, 2, 3]), seed=0, **kwargs)


def test_rank_token_spread() -> None:
    assert rank_token_spread(np.array([7])) == 0.0
    assert rank_token_spread(np.array([10, 10, 10])) == 0.0
    assert rank_token_spread(np.array([5, 15])) == pytest.approx(1.0)
    assert rank_token_spread(np.array([0, 0])) == 0.0


def test_the_plan_holds_a_few_arrays_per_sample_at_its_peak() -> None:
    """At 10M samples every int64 array as long as the store is 80 MB: the plan keeps three (store rows,
    lengths, skips) and never more than about eight at once (it held seventeen at its peak)."""
    import tracemalloc
    from pathlib import Path

    from packcli.plan.options import PlanOptions
    from packcli.plan.planner import make_plan

    n = 50_000
    lengths = np.random.default_rng(0).integers(20, 200, n).astype(np.int32)
    store = _lengths_store(Path("unused"), lengths)
    tracemalloc.start()
    try:
        plan = make_plan(PlanOptions(max_len=4096, sample_limit=4096), store)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert plan.n_rows == len(plan.row_start) - 1 and plan.tokens == int(lengths.sum())
    assert held < 28 * n and peak < 64 * n, (held / n, peak / n)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"world_size": 3, "seed": 7},
        {"world_size": 4, "rank_remainder": "pad", "pad_multiple": 8},
        {"algorithm": "bfd", "pad_multiple": 4, "pad_offset": 1},
        {"overflow": "drop", "sample_limit": 150, "max_len": 160},
    ],
)
def test_a_kept_plan_reads_back_as_it_was_made(tmp_path: Path, options: dict[str, Any]) -> None:
    from packcli.plan import kept
    from packcli.plan.options import PlanOptions
    from packcli.plan.planner import make_plan

    n = 3_000
    store = _lengths_store(tmp_path, np.random.default_rng(1).integers(5, 200, n).astype(np.int32))
    chosen = PlanOptions(**{"max_len": 1024, "sample_limit": 1024, **options})
    made = make_plan(chosen, store)
    assert kept.load_plan(tmp_path, chosen, n) is None
    kept.keep_plan(tmp_path, chosen, made)
    loaded = kept.load_plan(tmp_path, chosen, n)
    assert loaded is not None
    for name in ("store_rows", "lengths", "skips", "row_start"):
        assert getattr(loaded, name).dtype == getattr(made, name).dtype
        assert np.array_equal(getattr(loaded, name), getattr(made, name))
    for name in ("order", "dropped_rows", "padded_rows", "rank_tokens"):
        a, b = getattr(loaded.order, name), getattr(made.order, name)
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert list(loaded.drop_rows) == list(made.drop_rows)
    assert all(np.array_equal(loaded.drop_rows[r], made.drop_rows[r]) for r in made.drop_rows)
    scalars = ("truncated", "tokens", "trainable", "n_rows", "bound_l1", "bound_l2", "alignment_padding")
    assert [getattr(loaded, k) for k in scalars] == [getattr(made, k) for k in scalars]
    assert kept.load_plan(tmp_path, replace(chosen, seed=chosen.seed + 1), n) is None  # other options: none
    assert kept.load_plan(tmp_path, chosen, int(made.store_rows.max())) is None  # not this store's: refused
    (path,) = (tmp_path / kept.PLANS_DIR).glob("*.npz")
    path.write_bytes(path.read_bytes()[:-50])  # cut short: made anew, never half read
    assert kept.load_plan(tmp_path, chosen, n) is None


def _lengths_store(path: Path, lengths: np.ndarray) -> Any:
    """A token store of one sample a record with these lengths (no tokens on disk: the plan reads none)."""
    from packcli.results import StoreSource
    from packcli.store.tokens import TokenStore

    from .conftest import bare_meta

    n = len(lengths)
    source = StoreSource(path="a", kind="jsonl", format="messages", unit="line")
    return TokenStore(
        path=path,
        sample_index=np.arange(n, dtype=np.int64),
        piece_index=np.zeros(n, np.int32),
        lengths=lengths,
        trainable=lengths // 2,
        first_trained=np.ones(n, np.int32),
        positions=np.arange(n, dtype=np.int32),
        meta=bare_meta(sources=[source], source_starts=[0], records_read=n),
    )
