"""Time first-fit / best-fit decreasing against np.argsort on lognormal sample lengths.

Usage:
    python benchmarks/bench_packing.py                  # 10M and 1M lengths at capacity 4096
    python benchmarks/bench_packing.py --n 2000000 --repeat 5

Lengths are lognormal (median ~400 tokens, sigma 1.0), rounded and clipped to [1, capacity], as
int64. Each time is the best of ``--repeat`` runs (the machine may be shared). Targets: packing at
most 5x np.argsort on the same array, and n vs n/10 packing time ratio at most 12.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packcli.plan.packing import (
    best_fit_decreasing,
    first_fit_decreasing,
    lower_bound_l1,
    lower_bound_l2,
)


def lognormal_lengths(n: int, capacity: int, seed: int, median: float = 400.0, sigma: float = 1.0) -> np.ndarray:
    """Return ``n`` int64 lognormal lengths with the given median, clipped to [1, capacity]."""
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(np.log(median), sigma, n)
    return np.clip(np.round(raw), 1, capacity).astype(np.int64)


def best_time(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """Return the fastest wall time of ``repeat`` calls and the last result."""
    best = float("inf")
    result: object = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def measure(n: int, capacity: int, seed: int, repeat: int) -> dict[str, float]:
    """Return timings and bin counts for one (n, capacity) case."""
    lengths = lognormal_lengths(n, capacity, seed)
    t_sort, _ = best_time(lambda: np.argsort(lengths), repeat)
    t_ffd, ffd = best_time(lambda: first_fit_decreasing(lengths, capacity), repeat)
    t_bfd, bfd = best_time(lambda: best_fit_decreasing(lengths, capacity), repeat)
    assert isinstance(ffd, np.ndarray) and isinstance(bfd, np.ndarray)
    l2 = lower_bound_l2(lengths, capacity)
    return {
        "n": n,
        "capacity": capacity,
        "argsort": t_sort,
        "ffd": t_ffd,
        "bfd": t_bfd,
        "ffd_bins": int(ffd.max()) + 1,
        "bfd_bins": int(bfd.max()) + 1,
        "l1": lower_bound_l1(lengths, capacity),
        "l2": l2,
    }


def print_table(rows: list[dict[str, float]]) -> None:
    """Print one aligned table of the measured rows."""
    header = (
        f"{'n':>11} {'cap':>5} {'argsort s':>9} {'ffd s':>7} {'ffd/sort':>8} {'bfd s':>7} "
        f"{'bfd/sort':>8} {'ffd bins':>9} {'bfd bins':>9} {'L1':>9} {'L2':>9} {'over L2':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        over = 100.0 * (r["ffd_bins"] - r["l2"]) / r["l2"]
        print(
            f"{r['n']:>11,} {r['capacity']:>5} {r['argsort']:>9.3f} {r['ffd']:>7.3f} "
            f"{r['ffd'] / r['argsort']:>7.2f}x {r['bfd']:>7.3f} {r['bfd'] / r['argsort']:>7.2f}x "
            f"{r['ffd_bins']:>9,} {r['bfd_bins']:>9,} {r['l1']:>9,} {r['l2']:>9,} {over:>7.3f}%"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000_000, help="number of lengths (default 10M)")
    parser.add_argument("--capacity", type=int, default=4096, help="row capacity in tokens")
    parser.add_argument("--seed", type=int, default=0, help="seed for the lengths")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing; the fastest is kept")
    args = parser.parse_args()

    small = max(1, args.n // 10)
    rows = [measure(args.n, args.capacity, args.seed, args.repeat)]
    rows.append(measure(small, args.capacity, args.seed, args.repeat))
    for capacity in (2048, 8192):
        if capacity != args.capacity:
            rows.append(measure(small, capacity, args.seed, args.repeat))
    print(f"lognormal lengths, median 400, sigma 1.0, int64; best of {args.repeat} runs")
    print_table(rows)
    big, little = rows[0], rows[1]
    print()
    print(f"time ratio n={big['n']:,} vs n={little['n']:,} (target <= 12 for packing):")
    for key in ("argsort", "ffd", "bfd"):
        print(f"  {key:>7}: {big[key] / little[key]:.2f}")


if __name__ == "__main__":
    main()
