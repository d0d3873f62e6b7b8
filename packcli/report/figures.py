"""The figures both ``stats`` report: histograms, length distributions, padding what-ifs and row bounds.

Pure functions of sample and row lengths (numpy arrays); reading them is ``stats`` (a packed
output) and ``raw`` (raw input, tokenized as ``packcli pack`` does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise
from typing import TypedDict

import numpy as np

from packcli.config import option_problem
from packcli.errors import UsageError
from packcli.plan import packing
from packcli.results import BinCounts, Distribution

# Row fill bins in percent, right-closed: (0, 50], (50, 75], ... (99, 100]. Fine at the top, where
# packed rows are; a uniform 10% grid would put nearly every row in one bin.
FILL_EDGES_PERCENT = (0, 50, 75, 90, 95, 98, 99, 100)
LENGTH_BINS_TARGET = 24


# -- histograms ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Histogram:
    """Counts over right-closed bins ``(edges[i], edges[i + 1]]`` with a label per bin."""

    title: str
    unit: str
    edges: list[float]
    labels: list[str]
    counts: list[int]

    def bins(self) -> BinCounts:
        """The histogram as a stats result holds it: its bins without title and unit."""
        return BinCounts(edges=self.edges, labels=self.labels, counts=self.counts)


def length_histogram(lengths: np.ndarray, upper: int, title: str = "sample length (tokens)") -> Histogram:
    """Return a histogram of token lengths over (0, upper] in power-of-two wide bins (about 16 of them)."""
    upper = max(int(upper), 1)
    width = 1 << max(0, math.ceil(math.log2(upper / LENGTH_BINS_TARGET))) if upper > LENGTH_BINS_TARGET else 1
    n_bins = -(-upper // width)
    edges = np.arange(n_bins + 1, dtype=np.int64) * width
    longest = int(np.max(lengths)) if len(lengths) else 0
    if longest > edges[-1]:  # longer samples share one last bin, labelled with their real range
        edges = np.append(edges, longest)
    counts = _right_closed_counts(np.asarray(lengths, dtype=np.int64), edges)
    labels = [f"{int(a) + 1}-{int(b)}" if b - a > 1 else f"{int(b)}" for a, b in pairwise(edges)]
    return Histogram(title, "samples", [int(e) for e in edges], labels, counts)


def fill_histogram(row_tokens: np.ndarray, max_len: int, title: str = "row fill") -> Histogram:
    """Return a histogram of row fill (tokens / max_len) over FILL_EDGES_PERCENT."""
    edges = np.asarray(FILL_EDGES_PERCENT, dtype=np.int64)
    # Compare in integers: tokens * 100 against edge * max_len, so 95% of 1000 is exactly 950.
    scaled = np.asarray(row_tokens, dtype=np.int64) * 100
    counts = _right_closed_counts(scaled, edges * int(max_len))
    labels = [f"{a}-{b}%" for a, b in pairwise(edges)]
    return Histogram(title, "rows", [e / 100 for e in FILL_EDGES_PERCENT], labels, counts)


def _right_closed_counts(values: np.ndarray, edges: np.ndarray) -> list[int]:
    # Bin i holds edges[i] < v <= edges[i + 1]; values at or below edges[0] go to the first bin.
    bins = np.clip(np.searchsorted(edges, values, side="left") - 1, 0, len(edges) - 2)
    return [int(c) for c in np.bincount(bins, minlength=len(edges) - 1)]


def distribution(values: np.ndarray) -> Distribution:
    """Return the min, mean, median, 90th percentile and max of ``values`` (zeros when there are none)."""
    if len(values) == 0:
        return Distribution(min=0, mean=0.0, median=0.0, p90=0.0, max=0)
    v = np.asarray(values, dtype=np.int64)
    return Distribution(
        min=int(v.min()),
        mean=round(float(v.mean()), 3),
        median=float(np.median(v)),
        p90=float(np.percentile(v, 90)),
        max=int(v.max()),
    )


# -- padding what-ifs ------------------------------------------------------------------------------


def batch_padding(lengths_in_order: np.ndarray, batch_size: int) -> int:
    """Return the padding tokens when consecutive samples form batches padded to their longest sample."""
    x = np.asarray(lengths_in_order, dtype=np.int64)
    if len(x) == 0:
        return 0
    starts = np.arange(0, len(x), batch_size)
    longest = np.maximum.reduceat(x, starts)
    sizes = np.diff(np.append(starts, len(x)))
    return int((longest * sizes).sum() - x.sum())


class RowBounds(TypedDict):
    """The row-count bounds of a stats result (keys of OutputStats and RawLine, spliced in)."""

    lower_bound_l1: int
    lower_bound_l2: int
    rows_over_l2: int
    rows_over_l2_fraction: float


def row_bounds(lengths: np.ndarray, max_len: int, rows: int) -> RowBounds:
    """Return the L1 and L2 lower bounds on the rows ``lengths`` need, and how far ``rows`` is above L2."""
    l1 = packing.lower_bound_l1(lengths, max_len)
    l2 = packing.lower_bound_l2(lengths, max_len)
    return {
        "lower_bound_l1": l1,
        "lower_bound_l2": l2,
        "rows_over_l2": rows - l2,
        "rows_over_l2_fraction": round(rows / l2 - 1, 6) if l2 else 0.0,
    }


def check_batch_size(batch_size: int) -> None:
    """Raise UsageError when ``batch_size`` breaks the rule of ``--batch-size``."""
    problem = option_problem("batch_size", batch_size)  # the rule of the command line and the library
    if problem:
        raise UsageError(problem, option="batch_size")
